//! Llama-family model configuration, read from a Hugging Face `config.json` or GGUF metadata.

use std::path::Path;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::error::{EngineError, Result};

/// Llama-3 style RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// Everything the forward pass needs to know about the architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Qwen2-style biases on the q/k/v projections.
    pub attention_bias: bool,
    /// GGUF checkpoints store q/k rows permuted so RoPE rotates adjacent pairs; Hugging Face
    /// checkpoints rotate the two halves of each head.
    pub rope_interleaved: bool,
}

#[derive(Deserialize)]
struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    rope_scaling: Option<serde_json::Value>,
    /// transformers 5 keeps `rope_theta` and the scaling here instead.
    rope_parameters: Option<serde_json::Value>,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
}

fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10000.0
}
fn default_max_pos() -> usize {
    4096
}

const SUPPORTED_HF: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "SmolLM2ForCausalLM",
];

impl ModelConfig {
    /// Parse a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EngineError::Load(format!("cannot read {}: {e}", path.display())))?;
        let c: HfConfig = serde_json::from_str(&text)
            .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
        let arch = c
            .architectures
            .first()
            .cloned()
            .unwrap_or_else(|| c.model_type.clone());
        if !SUPPORTED_HF.contains(&arch.as_str())
            && !matches!(c.model_type.as_str(), "llama" | "mistral" | "qwen2")
        {
            return Err(EngineError::Load(format!(
                "architecture {arch} is not supported (supported: {})",
                SUPPORTED_HF.join(", ")
            )));
        }
        let mut rope_theta = c.rope_theta;
        let mut scaling = c.rope_scaling.clone();
        if let Some(rp) = c.rope_parameters.as_ref().filter(|v| v.is_object()) {
            if let Some(t) = rp.get("rope_theta").and_then(|t| t.as_f64()) {
                rope_theta = t as f32;
            }
            if scaling.is_none() {
                scaling = Some(rp.clone());
            }
        }
        let rope_scaling = match &scaling {
            Some(v)
                if v.get("rope_type")
                    .or_else(|| v.get("type"))
                    .and_then(|t| t.as_str())
                    == Some("llama3") =>
            {
                Some(serde_json::from_value(v.clone()).map_err(|e| {
                    EngineError::Load(format!("rope_scaling in {}: {e}", path.display()))
                })?)
            }
            Some(v)
                if !v.is_null()
                    && !matches!(
                        v.get("rope_type")
                            .or_else(|| v.get("type"))
                            .and_then(|t| t.as_str()),
                        Some("default") | None
                    ) =>
            {
                return Err(EngineError::Load(format!(
                    "rope_scaling {v} is not supported (only llama3)"
                )));
            }
            _ => None,
        };
        let num_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let cfg = ModelConfig {
            architecture: arch,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads,
            head_dim: c
                .head_dim
                .unwrap_or(c.hidden_size / c.num_attention_heads.max(1)),
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: c.max_position_embeddings,
            tie_word_embeddings: c.tie_word_embeddings,
            attention_bias: c.attention_bias.unwrap_or(c.model_type == "qwen2"),
            rope_interleaved: false,
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// Read the `llama.*` (or `qwen2.*`, `mistral.*`) keys of a GGUF file.
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let arch = md
            .get("general.architecture")
            .and_then(|v| v.to_string().ok().cloned())
            .unwrap_or_else(|| "llama".into());
        if !matches!(arch.as_str(), "llama" | "qwen2" | "mistral") {
            return Err(EngineError::Load(format!(
                "GGUF architecture {arch} is not supported (llama, mistral, qwen2)"
            )));
        }
        let get_u = |k: &str| -> Result<usize> {
            md.get(&format!("{arch}.{k}"))
                .and_then(|v| v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from)))
                .map(|v| v as usize)
                .ok_or_else(|| EngineError::Load(format!("GGUF metadata lacks {arch}.{k}")))
        };
        let get_f = |k: &str| md.get(&format!("{arch}.{k}")).and_then(|v| v.to_f32().ok());
        let hidden_size = get_u("embedding_length")?;
        let num_heads = get_u("attention.head_count")?;
        let num_kv_heads = get_u("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = get_u("attention.key_length")
            .or_else(|_| get_u("rope.dimension_count"))
            .unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match get_u("vocab_size") {
            Ok(v) => v,
            Err(_) => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok().map(|t| t.len()))
                .ok_or_else(|| {
                    EngineError::Load("GGUF metadata lacks the vocabulary size".into())
                })?,
        };
        let rope_scaling = match md
            .get(&format!("{arch}.rope.scaling.type"))
            .and_then(|v| v.to_string().ok().cloned())
        {
            Some(t) if t == "llama3" => Some(Llama3RopeScaling {
                factor: get_f("rope.scaling.factor").unwrap_or(8.0),
                low_freq_factor: get_f("rope.scaling.low_freq_factor").unwrap_or(1.0),
                high_freq_factor: get_f("rope.scaling.high_freq_factor").unwrap_or(4.0),
                original_max_position_embeddings: get_u("rope.scaling.original_context_length")
                    .unwrap_or(8192),
            }),
            _ => None,
        };
        let tie = !content.tensor_infos.contains_key("output.weight");
        let cfg = ModelConfig {
            architecture: arch.clone(),
            hidden_size,
            intermediate_size: get_u("feed_forward_length")?,
            num_layers: get_u("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: get_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_theta: get_f("rope.freq_base").unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: get_u("context_length").unwrap_or(4096),
            tie_word_embeddings: tie,
            attention_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
            // llama.cpp permutes q/k for llama-style GGUFs; qwen2 GGUFs keep the NeoX layout.
            rope_interleaved: arch != "qwen2",
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
            || self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
        {
            return Err(EngineError::Load(format!(
                "inconsistent attention shape: {} heads, {} kv heads, head_dim {}",
                self.num_heads, self.num_kv_heads, self.head_dim
            )));
        }
        Ok(())
    }

    /// Inverse frequencies of RoPE, with Llama-3 scaling applied when configured.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        let mut inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f32 / self.head_dim as f32))
            .collect();
        if let Some(s) = &self.rope_scaling {
            let old = s.original_max_position_embeddings as f32;
            let low_wavelen = old / s.low_freq_factor;
            let high_wavelen = old / s.high_freq_factor;
            for f in inv.iter_mut() {
                let wavelen = 2.0 * std::f32::consts::PI / *f;
                if wavelen > low_wavelen {
                    *f /= s.factor;
                } else if wavelen >= high_wavelen {
                    let smooth = (old / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    *f = (1.0 - smooth) * *f / s.factor + smooth * *f;
                }
            }
        }
        inv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> ModelConfig {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("config.json");
        std::fs::write(&p, json).expect("write");
        ModelConfig::from_hf_config(&p).expect("parse")
    }

    const BASE: &str = r#""architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072"#;

    #[test]
    fn llama3_scaling_from_rope_scaling_and_rope_parameters() {
        let old = parse(&format!(
            r#"{{{BASE}, "rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
        ));
        let new = parse(&format!(
            r#"{{{BASE}, "rope_parameters": {{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
        ));
        assert_eq!(old, new);
        assert_eq!(new.rope_theta, 500000.0);
        assert_eq!(new.head_dim, 128);
        let inv = new.rope_inv_freq();
        // Highest frequencies are untouched, the lowest divided by the factor.
        assert!((inv[0] - 1.0).abs() < 1e-6);
        let plain = 1.0 / 500000f32.powf(126.0 / 128.0);
        assert!((inv[63] - plain / 8.0).abs() / plain < 1e-4);
    }

    #[test]
    fn default_rope_type_means_no_scaling() {
        let c = parse(&format!(
            r#"{{{BASE}, "rope_parameters": {{"rope_type": "default", "rope_theta": 10000.0}}}}"#
        ));
        assert_eq!(c.rope_scaling, None);
        assert!(!c.rope_interleaved);
    }

    #[test]
    fn unsupported_architecture_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("config.json");
        std::fs::write(&p, r#"{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 8}"#)
            .expect("write");
        let err = ModelConfig::from_hf_config(&p).expect_err("gpt2 is not llama-family");
        assert!(err.to_string().contains("not supported"), "{err}");
    }
}
