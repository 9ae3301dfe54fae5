//! Llama-family weights (Llama, Mistral, Qwen2, SmolLM2): loading under GGUF or Hugging Face
//! tensor names. The forward pass over these weights is in `crate::backend::cpu`.

use crate::backend::cpu::kernels::Weight;
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;
use crate::model::loader::TensorSource;

/// Which checkpoint naming scheme the tensors use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// llama.cpp names: `blk.N.attn_q.weight`.
    Gguf,
    /// transformers names: `model.layers.N.self_attn.q_proj.weight`.
    HuggingFace,
}

#[derive(Clone, Copy)]
enum Part {
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

impl Naming {
    fn layer(self, i: usize, part: Part) -> String {
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

    fn embed(self) -> &'static str {
        match self {
            Naming::Gguf => "token_embd.weight",
            Naming::HuggingFace => "model.embed_tokens.weight",
        }
    }

    fn final_norm(self) -> &'static str {
        match self {
            Naming::Gguf => "output_norm.weight",
            Naming::HuggingFace => "model.norm.weight",
        }
    }

    fn lm_head(self) -> &'static str {
        match self {
            Naming::Gguf => "output.weight",
            Naming::HuggingFace => "lm_head.weight",
        }
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
}

pub struct LlamaWeights {
    pub embed: Weight,
    pub layers: Vec<LayerWeights>,
    pub norm: Vec<f32>,
    /// `None` when the output projection is tied to the embedding.
    pub lm_head: Option<Weight>,
}

fn expect_shape(name: &str, w: &Weight, rows: usize, cols: usize) -> Result<()> {
    if w.rows() != rows || w.cols() != cols {
        return Err(EngineError::Load(format!(
            "tensor {name} has shape [{}, {}], expected [{rows}, {cols}]",
            w.rows(),
            w.cols()
        )));
    }
    Ok(())
}

fn expect_len(name: &str, v: &[f32], len: usize) -> Result<()> {
    if v.len() != len {
        return Err(EngineError::Load(format!(
            "tensor {name} has {} values, expected {len}",
            v.len()
        )));
    }
    Ok(())
}

impl LlamaWeights {
    pub fn load(
        src: &mut dyn TensorSource,
        cfg: &ModelConfig,
        naming: Naming,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        let ffn = cfg.intermediate_size;
        let embed = src.matrix(naming.embed())?;
        expect_shape(naming.embed(), &embed, cfg.vocab_size, h)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let mut mat = |part: Part, rows: usize, cols: usize| -> Result<Weight> {
                let name = naming.layer(i, part);
                let w = src.matrix(&name)?;
                expect_shape(&name, &w, rows, cols)?;
                Ok(w)
            };
            let wq = mat(Part::Q, qd, h)?;
            let wk = mat(Part::K, kvd, h)?;
            let wv = mat(Part::V, kvd, h)?;
            let wo = mat(Part::O, h, qd)?;
            let w_gate = mat(Part::Gate, ffn, h)?;
            let w_up = mat(Part::Up, ffn, h)?;
            let w_down = mat(Part::Down, h, ffn)?;
            let has_bias = src.contains(&naming.layer(i, Part::QBias));
            let mut vec = |part: Part, len: usize| -> Result<Vec<f32>> {
                let name = naming.layer(i, part);
                let v = src.vector(&name)?;
                expect_len(&name, &v, len)?;
                Ok(v)
            };
            let attn_norm = vec(Part::AttnNorm, h)?;
            let ffn_norm = vec(Part::FfnNorm, h)?;
            let (bq, bk, bv) = if has_bias {
                (
                    Some(vec(Part::QBias, qd)?),
                    Some(vec(Part::KBias, kvd)?),
                    Some(vec(Part::VBias, kvd)?),
                )
            } else {
                (None, None, None)
            };
            layers.push(LayerWeights {
                attn_norm,
                wq,
                wk,
                wv,
                wo,
                bq,
                bk,
                bv,
                ffn_norm,
                w_gate,
                w_up,
                w_down,
            });
            progress(i + 1, cfg.num_layers);
        }
        let norm = src.vector(naming.final_norm())?;
        expect_len(naming.final_norm(), &norm, h)?;
        let lm_head = if src.contains(naming.lm_head()) {
            let w = src.matrix(naming.lm_head())?;
            expect_shape(naming.lm_head(), &w, cfg.vocab_size, h)?;
            Some(w)
        } else {
            None
        };
        Ok(LlamaWeights {
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    pub fn lm_head(&self) -> &Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    pub fn size_bytes(&self) -> usize {
        let mut n = self.embed.size_bytes() + self.lm_head.as_ref().map_or(0, |w| w.size_bytes());
        for l in &self.layers {
            n += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                .iter()
                .map(|w| w.size_bytes())
                .sum::<usize>();
        }
        n
    }
}
