//! The tensors of a Llama-family checkpoint (Llama, Mistral, Qwen2, SmolLM2) under GGUF or
//! Hugging Face names, with their expected shapes and how tensor parallelism splits them.
//! Each backend lays them out for its device (`backend::cpu::weights`, `backend::cuda::weights`).

use super::config::ModelConfig;
use super::error::LoadError;
use super::tensors::{DType, Shard, Tensor, TensorSource};

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
    /// rows, o and down by input columns; the norms stay whole. With more ranks than KV heads,
    /// k and v are split by head and each head is replicated on `size / kv_heads` ranks.
    fn shard(self, tp: TensorParallel, kv_heads: usize) -> Shard {
        if tp.size <= 1 {
            return Shard::Whole;
        }
        let (rank, parts) = (tp.rank, tp.size);
        match self {
            Part::K | Part::V | Part::KBias | Part::VBias if parts > kv_heads => Shard::Rows {
                rank: rank * kv_heads / parts,
                parts: kv_heads,
            },
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

/// Most ranks of one tensor-parallel group (one node).
pub const MAX_TP_SIZE: usize = 8;

impl TensorParallel {
    /// Whether `size` ranks can split `cfg`: a power of two up to [`MAX_TP_SIZE`] that divides
    /// the attention heads and the MLP width, and either divides the KV heads or is a multiple
    /// of them (each KV head then lives on several ranks).
    pub fn check(size: usize, cfg: &ModelConfig) -> Result<(), String> {
        if size == 0 || !size.is_power_of_two() || size > MAX_TP_SIZE {
            return Err(format!(
                "--tp-size {size}: expected 1, 2, 4 or 8 (GPUs of one node)"
            ));
        }
        let kv = cfg.num_kv_heads;
        let why = if !cfg.num_heads.is_multiple_of(size) {
            format!("its {} attention heads", cfg.num_heads)
        } else if !cfg.intermediate_size.is_multiple_of(size) {
            format!("its MLP width {}", cfg.intermediate_size)
        } else if !(kv.is_multiple_of(size) || size.is_multiple_of(kv)) {
            format!("its {kv} KV heads (neither divides the other)")
        } else {
            return Ok(());
        };
        Err(format!(
            "--tp-size {size} does not split this model: {size} ranks cannot share {why}"
        ))
    }

    /// The shapes one rank computes with: its share of the attention heads, KV heads (at least
    /// one) and MLP width; hidden size and vocabulary stay whole.
    pub fn local_config(size: usize, cfg: &ModelConfig) -> ModelConfig {
        let mut c = cfg.clone();
        c.num_heads = cfg.num_heads / size;
        c.num_kv_heads = (cfg.num_kv_heads / size).max(1);
        c.intermediate_size = cfg.intermediate_size / size;
        c
    }
}

/// A Llama-family checkpoint's tensors, read by part with their shapes checked against the
/// config (the shapes of this rank's shards).
pub struct LlamaTensors<'a> {
    src: &'a dyn TensorSource,
    cfg: &'a ModelConfig,
    naming: Naming,
    tp: TensorParallel,
    /// The checkpoint declares KV-cache scales (`kv_cache_scheme`): every layer must have them.
    kv_scales_declared: bool,
}

/// One attention layer's KV-cache scales, as the checkpoint stores them (see
/// [`LlamaTensors::kv_scales`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerKvScales {
    pub k: f32,
    pub v: f32,
}

/// Where checkpoints keep a layer's K and V scales, under `model.layers.N.self_attn.`:
/// compressed-tensors' names first, then the names SGLang and vLLM remap from (the
/// `output_scale` of k_proj/v_proj in older compressed-tensors and Quark files, ModelOpt's
/// scales under the projections).
const K_SCALE_NAMES: [&str; 3] = ["k_scale", "k_proj.output_scale", "k_proj.k_scale"];
const V_SCALE_NAMES: [&str; 3] = ["v_scale", "v_proj.output_scale", "v_proj.v_scale"];
/// The deprecated single scale of both K and V.
const KV_SCALE_NAME: &str = "kv_scale";

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
            kv_scales_declared: false,
        }
    }

    /// Whether the checkpoint declares KV-cache scales (`kv_cache_scheme`), so that every
    /// layer must bring them ([`LlamaTensors::kv_scales`]).
    pub fn with_kv_scales_declared(mut self, declared: bool) -> Self {
        self.kv_scales_declared = declared;
        self
    }

    pub fn config(&self) -> &ModelConfig {
        self.cfg
    }

    pub fn naming(&self) -> Naming {
        self.naming
    }

    /// This rank's place in its tensor-parallel group.
    pub fn tp(&self) -> TensorParallel {
        self.tp
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
        t.shard(part.shard(self.tp, self.cfg.num_kv_heads))
    }

    /// The scales of layer `i`'s linear part stored as FP8 (`weight_scale` beside the weight):
    /// one per row of this rank's shard of `rows` rows. A per-tensor scale is repeated; a
    /// per-row one is split as the weight's rows are (a weight split by columns keeps all of
    /// its rows, so all of its scales).
    pub fn fp8_scales(&self, i: usize, part: Part, rows: usize) -> Result<Vec<f32>, LoadError> {
        let weight = self.naming.layer(i, part);
        let name = format!("{}_scale", weight);
        let t = self.src.read(&name, Shard::Whole).map_err(|e| match e {
            LoadError::MissingTensor { .. } => LoadError::Layout {
                name: weight.clone(),
                why: format!("stored as {} without its scale {name}", DType::F8E4M3),
            },
            other => other,
        })?;
        let full_rows = self.shape(part)[0];
        let per_tensor = t.shape.iter().product::<usize>() == 1;
        let per_row = matches!(t.shape.as_slice(), [r] | [r, 1] if *r == full_rows);
        if !per_tensor && !per_row {
            return Err(LoadError::Layout {
                name,
                why: format!(
                    "shape {:?}: expected one scale per tensor or one per output row ({full_rows})",
                    t.shape
                ),
            });
        }
        let values = if per_tensor {
            vec![t.to_f32()?[0]; rows]
        } else {
            let shard = match part.shard(self.tp, self.cfg.num_kv_heads) {
                s @ Shard::Rows { .. } => s,
                Shard::Whole | Shard::Cols { .. } => Shard::Whole,
            };
            t.shard(shard)?.to_f32()?
        };
        if values.len() != rows {
            return Err(LoadError::Layout {
                name,
                why: format!("{} scales for {rows} rows", values.len()),
            });
        }
        if let Some(bad) = values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(LoadError::Layout {
                name,
                why: format!("scale {bad} (scales must be positive and finite)"),
            });
        }
        Ok(values)
    }

    /// Layer `i`'s KV-cache scales (one K and one V scale, the same on every rank), or `None`
    /// where the checkpoint has none for the layer (then the scales are 1). Read under
    /// compressed-tensors' names (`self_attn.k_scale` / `v_scale`) or the older ones SGLang and
    /// vLLM also read (`k_proj.output_scale`, `k_proj.k_scale`, a shared `kv_scale`). A
    /// checkpoint that declares KV-cache scales must have both for every layer; one of the
    /// pair alone is an error either way.
    pub fn kv_scales(&self, i: usize) -> Result<Option<LayerKvScales>, LoadError> {
        if self.naming != Naming::HuggingFace {
            return Ok(None);
        }
        let prefix = format!("model.layers.{i}.self_attn");
        let find = |names: &[&str]| {
            names
                .iter()
                .chain([&KV_SCALE_NAME])
                .map(|n| format!("{prefix}.{n}"))
                .find(|n| self.src.contains(n))
        };
        let (k, v) = (find(&K_SCALE_NAMES), find(&V_SCALE_NAMES));
        let missing = |names: &[&str], why: &str| LoadError::Layout {
            name: format!("{prefix}.{}", names[0]),
            why: format!(
                "missing from the checkpoint, {why} (also looked for self_attn.{} and self_attn.{KV_SCALE_NAME})",
                names[1..].join(", self_attn.")
            ),
        };
        match (k, v) {
            (Some(k), Some(v)) => Ok(Some(LayerKvScales {
                k: self.scale(&k)?,
                v: self.scale(&v)?,
            })),
            (None, None) if !self.kv_scales_declared => Ok(None),
            (None, None) => Err(missing(
                &K_SCALE_NAMES,
                "which declares KV-cache scales (kv_cache_scheme)",
            )),
            (Some(_), None) => Err(missing(&V_SCALE_NAMES, "which has the layer's K scale")),
            (None, Some(_)) => Err(missing(&K_SCALE_NAMES, "which has the layer's V scale")),
        }
    }

    /// A single positive, finite scale stored as tensor `name` (any float type, one element).
    fn scale(&self, name: &str) -> Result<f32, LoadError> {
        let t = self.src.read(name, Shard::Whole)?;
        if t.shape.iter().product::<usize>() != 1 {
            return Err(LoadError::Layout {
                name: name.to_string(),
                why: format!("shape {:?}: expected a single scale", t.shape),
            });
        }
        let x = t.to_f32()?[0];
        if !(x.is_finite() && x > 0.0) {
            return Err(LoadError::Layout {
                name: name.to_string(),
                why: format!("scale {x} (scales must be positive and finite)"),
            });
        }
        Ok(x)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(heads: usize, kv: usize, inter: usize) -> ModelConfig {
        ModelConfig {
            architecture: "LlamaForCausalLM".into(),
            hidden_size: 64 * heads,
            intermediate_size: inter,
            num_layers: 2,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim: 64,
            vocab_size: 1000,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            max_position_embeddings: 2048,
            tie_word_embeddings: false,
            attention_bias: false,
            rope_interleaved: false,
        }
    }

    #[test]
    fn tp_sizes_must_split_heads_width_and_kv_heads() {
        let llama8b = cfg(32, 8, 14336);
        for tp in [1, 2, 4, 8] {
            assert!(TensorParallel::check(tp, &llama8b).is_ok(), "tp {tp}");
        }
        for tp in [0, 3, 6, 16] {
            let e = TensorParallel::check(tp, &llama8b).expect_err("refused");
            assert!(e.contains("expected 1, 2, 4 or 8"), "{e}");
        }
        // SmolLM2-135M: 9 attention heads, 3 KV heads.
        let e = TensorParallel::check(2, &cfg(9, 3, 1536)).expect_err("refused");
        assert!(e.contains("9 attention heads"), "{e}");
        let e = TensorParallel::check(4, &cfg(12, 6, 1536)).expect_err("refused");
        assert!(e.contains("6 KV heads"), "{e}");
        // More ranks than KV heads: each KV head lives on several ranks.
        assert!(TensorParallel::check(8, &cfg(32, 2, 14336)).is_ok());
    }

    #[test]
    fn a_rank_computes_its_share_of_heads_and_width() {
        let c = TensorParallel::local_config(4, &cfg(32, 8, 14336));
        assert_eq!(
            (
                c.num_heads,
                c.num_kv_heads,
                c.intermediate_size,
                c.hidden_size
            ),
            (8, 2, 3584, 2048)
        );
        let c = TensorParallel::local_config(8, &cfg(32, 2, 14336));
        assert_eq!((c.num_heads, c.num_kv_heads), (4, 1));
    }

    /// In-memory tensors for the KV-scale lookups.
    struct Scales(Vec<(String, DType, Vec<usize>, Vec<u8>)>);

    impl TensorSource for Scales {
        fn contains(&self, name: &str) -> bool {
            self.0.iter().any(|t| t.0 == name)
        }

        fn read(&self, name: &str, _: Shard) -> Result<Tensor<'_>, LoadError> {
            let (n, d, s, b) = self
                .0
                .iter()
                .find(|t| t.0 == name)
                .ok_or_else(|| LoadError::MissingTensor { name: name.into() })?;
            Tensor::new(n, *d, s.clone(), b)
        }
    }

    #[test]
    fn kv_scales_are_read_under_every_checkpoint_naming() {
        let f32s = |name: &str, shape: Vec<usize>, v: &[f32]| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (format!("model.layers.{name}"), DType::F32, shape, bytes)
        };
        let bf16 = half::bf16::from_f32(2.5).to_le_bytes().to_vec();
        let src = Scales(vec![
            // compressed-tensors: scalar tensors beside the attention module
            f32s("0.self_attn.k_scale", vec![], &[0.5]),
            (
                "model.layers.0.self_attn.v_scale".into(),
                DType::BF16,
                vec![1],
                bf16,
            ),
            // older compressed-tensors and Quark
            f32s("1.self_attn.k_proj.output_scale", vec![1], &[0.25]),
            f32s("1.self_attn.v_proj.output_scale", vec![1], &[4.0]),
            // ModelOpt
            f32s("2.self_attn.k_proj.k_scale", vec![], &[0.125]),
            f32s("2.self_attn.v_proj.v_scale", vec![], &[8.0]),
            // one shared scale (deprecated)
            f32s("3.self_attn.kv_scale", vec![], &[0.75]),
            // layer 4: none; layer 5: K only; layer 6: per-head K; layer 7: a zero scale
            f32s("5.self_attn.k_scale", vec![], &[0.5]),
            f32s("6.self_attn.k_scale", vec![8], &[0.5; 8]),
            f32s("6.self_attn.v_scale", vec![], &[0.5]),
            f32s("7.self_attn.k_scale", vec![], &[0.5]),
            f32s("7.self_attn.v_scale", vec![], &[0.0]),
        ]);
        let c = cfg(4, 2, 512);
        let tp = TensorParallel { rank: 1, size: 2 };
        let plain = LlamaTensors::new(&src, &c, Naming::HuggingFace, tp);
        let declared =
            LlamaTensors::new(&src, &c, Naming::HuggingFace, tp).with_kv_scales_declared(true);
        let s = |k, v| Some(LayerKvScales { k, v });
        for t in [&plain, &declared] {
            assert_eq!(t.kv_scales(0).ok(), Some(s(0.5, 2.5)));
            assert_eq!(t.kv_scales(1).ok(), Some(s(0.25, 4.0)));
            assert_eq!(t.kv_scales(2).ok(), Some(s(0.125, 8.0)));
            assert_eq!(t.kv_scales(3).ok(), Some(s(0.75, 0.75)));
        }
        // no scales: 1.0 unless the checkpoint declares them
        assert_eq!(plain.kv_scales(4).ok(), Some(None));
        let e = declared.kv_scales(4).expect_err("declared").to_string();
        assert!(e.contains("model.layers.4.self_attn.k_scale"), "{e}");
        assert!(e.contains("kv_cache_scheme"), "{e}");
        for t in [&plain, &declared] {
            let e = t.kv_scales(5).expect_err("K alone").to_string();
            assert!(
                e.contains("model.layers.5.self_attn.v_scale: missing"),
                "{e}"
            );
            let e = t.kv_scales(6).expect_err("per head").to_string();
            assert!(e.contains("expected a single scale"), "{e}");
            let e = t.kv_scales(7).expect_err("zero").to_string();
            assert!(
                e.contains("model.layers.7.self_attn.v_scale: scale 0"),
                "{e}"
            );
        }
        // GGUF files bring none
        let gguf = LlamaTensors::new(&src, &c, Naming::Gguf, tp).with_kv_scales_declared(true);
        assert_eq!(gguf.kv_scales(0).ok(), Some(None));
    }

    #[test]
    fn kv_heads_are_split_or_replicated_by_rank() {
        let at = |rank, size, kv| Part::K.shard(TensorParallel { rank, size }, kv);
        assert_eq!(at(0, 1, 8), Shard::Whole);
        assert_eq!(at(3, 4, 8), Shard::Rows { rank: 3, parts: 4 });
        // 8 ranks, 2 KV heads: ranks 0-3 hold head 0, ranks 4-7 head 1
        for rank in 0..8 {
            assert_eq!(
                at(rank, 8, 2),
                Shard::Rows {
                    rank: rank / 4,
                    parts: 2
                }
            );
        }
        // q rows follow the ranks; o and down split their inputs
        let tp = TensorParallel { rank: 5, size: 8 };
        assert_eq!(Part::Q.shard(tp, 2), Shard::Rows { rank: 5, parts: 8 });
        assert_eq!(Part::Down.shard(tp, 2), Shard::Cols { rank: 5, parts: 8 });
        assert_eq!(Part::AttnNorm.shard(tp, 2), Shard::Whole);
    }
}
