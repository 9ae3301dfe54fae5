//! The tensors of a Llama-family checkpoint (Llama, Mistral, Qwen2, SmolLM2) under GGUF or
//! Hugging Face names, with their expected shapes and how tensor parallelism splits them.
//! Each backend lays them out for its device (`backend::cpu::weights`, `backend::cuda::weights`).

use super::config::ModelConfig;
use super::error::LoadError;
use super::tensors::{Shard, Tensor, TensorSource};

/// Which checkpoint naming scheme the tensors use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// llama.cpp names: `blk.N.attn_q.weight`.
    Gguf,
    /// transformers names: `model.layers.N.self_attn.q_proj.weight`.
    HuggingFace,
}

/// One tensor of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QBias,
    KBias,
    VBias,
    FfnNorm,
    Gate,
    Up,
    Down,
}

impl Part {
    /// How tensor parallelism splits this part: q, k, v, gate, up (and the biases) by output
    /// rows, o and down by input columns; the norms stay whole.
    fn shard(self, tp: TensorParallel) -> Shard {
        if tp.size <= 1 {
            return Shard::Whole;
        }
        let (rank, parts) = (tp.rank, tp.size);
        match self {
            Part::Q
            | Part::K
            | Part::V
            | Part::QBias
            | Part::KBias
            | Part::VBias
            | Part::Gate
            | Part::Up => Shard::Rows { rank, parts },
            Part::O | Part::Down => Shard::Cols { rank, parts },
            Part::AttnNorm | Part::FfnNorm => Shard::Whole,
        }
    }
}

impl Naming {
    pub fn layer(self, i: usize, part: Part) -> String {
        match self {
            Naming::Gguf => {
                let p = match part {
                    Part::AttnNorm => "attn_norm.weight",
                    Part::Q => "attn_q.weight",
                    Part::K => "attn_k.weight",
                    Part::V => "attn_v.weight",
                    Part::O => "attn_output.weight",
                    Part::QBias => "attn_q.bias",
                    Part::KBias => "attn_k.bias",
                    Part::VBias => "attn_v.bias",
                    Part::FfnNorm => "ffn_norm.weight",
                    Part::Gate => "ffn_gate.weight",
                    Part::Up => "ffn_up.weight",
                    Part::Down => "ffn_down.weight",
                };
                format!("blk.{i}.{p}")
            }
            Naming::HuggingFace => {
                let p = match part {
                    Part::AttnNorm => "input_layernorm.weight",
                    Part::Q => "self_attn.q_proj.weight",
                    Part::K => "self_attn.k_proj.weight",
                    Part::V => "self_attn.v_proj.weight",
                    Part::O => "self_attn.o_proj.weight",
                    Part::QBias => "self_attn.q_proj.bias",
                    Part::KBias => "self_attn.k_proj.bias",
                    Part::VBias => "self_attn.v_proj.bias",
                    Part::FfnNorm => "post_attention_layernorm.weight",
                    Part::Gate => "mlp.gate_proj.weight",
                    Part::Up => "mlp.up_proj.weight",
                    Part::Down => "mlp.down_proj.weight",
                };
                format!("model.layers.{i}.{p}")
            }
        }
    }

    pub fn embed(self) -> &'static str {
        match self {
            Naming::Gguf => "token_embd.weight",
            Naming::HuggingFace => "model.embed_tokens.weight",
        }
    }

    pub fn final_norm(self) -> &'static str {
        match self {
            Naming::Gguf => "output_norm.weight",
            Naming::HuggingFace => "model.norm.weight",
        }
    }

    pub fn lm_head(self) -> &'static str {
        match self {
            Naming::Gguf => "output.weight",
            Naming::HuggingFace => "lm_head.weight",
        }
    }
}

/// This process's place in a tensor-parallel group (`--tp-size`): rank `rank` of `size`.
/// `size` 1 reads every tensor whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorParallel {
    pub rank: usize,
    pub size: usize,
}

impl Default for TensorParallel {
    fn default() -> Self {
        TensorParallel { rank: 0, size: 1 }
    }
}

/// A Llama-family checkpoint's tensors, read by part with their shapes checked against the
/// config (the shapes of this rank's shards).
pub struct LlamaTensors<'a> {
    src: &'a dyn TensorSource,
    cfg: &'a ModelConfig,
    naming: Naming,
    tp: TensorParallel,
}

impl<'a> LlamaTensors<'a> {
    pub fn new(
        src: &'a dyn TensorSource,
        cfg: &'a ModelConfig,
        naming: Naming,
        tp: TensorParallel,
    ) -> Self {
        LlamaTensors {
            src,
            cfg,
            naming,
            tp,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        self.cfg
    }

    pub fn naming(&self) -> Naming {
        self.naming
    }

    /// The full shape of a layer part.
    fn shape(&self, part: Part) -> Vec<usize> {
        let c = self.cfg;
        let h = c.hidden_size;
        let qd = c.num_heads * c.head_dim;
        let kvd = c.num_kv_heads * c.head_dim;
        let ffn = c.intermediate_size;
        match part {
            Part::AttnNorm | Part::FfnNorm => vec![h],
            Part::Q => vec![qd, h],
            Part::K | Part::V => vec![kvd, h],
            Part::O => vec![h, qd],
            Part::QBias => vec![qd],
            Part::KBias | Part::VBias => vec![kvd],
            Part::Gate | Part::Up => vec![ffn, h],
            Part::Down => vec![h, ffn],
        }
    }

    /// Whether layer `i` has the part (the q/k/v biases are optional).
    pub fn has(&self, i: usize, part: Part) -> bool {
        self.src.contains(&self.naming.layer(i, part))
    }

    /// Layer `i`'s part: this rank's shard, shape checked.
    pub fn layer(&self, i: usize, part: Part) -> Result<Tensor<'a>, LoadError> {
        let name = self.naming.layer(i, part);
        let shape = self.shape(part);
        let t = self.src.read(&name, Shard::Whole)?.expect_shape(&shape)?;
        t.shard(part.shard(self.tp))
    }

    /// The token embedding `[vocab, hidden]` (every rank holds it whole).
    pub fn embed(&self) -> Result<Tensor<'a>, LoadError> {
        let shape = [self.cfg.vocab_size, self.cfg.hidden_size];
        self.src
            .read(self.naming.embed(), Shard::Whole)?
            .expect_shape(&shape)
    }

    /// The final RMSNorm weight `[hidden]`.
    pub fn final_norm(&self) -> Result<Tensor<'a>, LoadError> {
        self.src
            .read(self.naming.final_norm(), Shard::Whole)?
            .expect_shape(&[self.cfg.hidden_size])
    }

    /// Whether the checkpoint has its own output projection (else it is tied to the embedding).
    pub fn has_lm_head(&self) -> bool {
        self.src.contains(self.naming.lm_head())
    }

    /// The output projection `[vocab, hidden]`.
    pub fn lm_head(&self) -> Result<Tensor<'a>, LoadError> {
        let shape = [self.cfg.vocab_size, self.cfg.hidden_size];
        self.src
            .read(self.naming.lm_head(), Shard::Whole)?
            .expect_shape(&shape)
    }
}
