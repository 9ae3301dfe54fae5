//! Model configuration, checkpoint loading and the Llama-family weights.

pub mod config;
pub mod llama;
pub mod loader;

use std::path::Path;

use crate::error::Result;
use config::ModelConfig;
use llama::{LlamaWeights, Naming};
use loader::{GgufSource, ModelFiles, SafetensorsSource};

/// A loaded checkpoint for the CPU backend.
pub struct LoadedModel {
    pub config: ModelConfig,
    pub weights: LlamaWeights,
    /// The GGUF header (tokenizer vocabulary and chat template live there), for GGUF models.
    pub gguf: Option<candle_core::quantized::gguf_file::Content>,
}

/// Load a GGUF file or a Hugging Face folder, logging progress per layer.
pub fn load(path: &Path) -> Result<LoadedModel> {
    let files = ModelFiles::detect(path)?;
    let progress = |done: usize, total: usize| {
        if done == total || done.is_multiple_of(8) {
            tracing::info!("loading weights: layer {done}/{total}");
        }
    };
    match files {
        ModelFiles::Gguf(p) => {
            let mut src = GgufSource::open(&p)?;
            let config = ModelConfig::from_gguf(&src.content)?;
            let weights = LlamaWeights::load(&mut src, &config, Naming::Gguf, progress)?;
            Ok(LoadedModel {
                config,
                weights,
                gguf: Some(src.content),
            })
        }
        ModelFiles::HfDir(dir) => {
            let config = ModelConfig::from_hf_config(&dir.join("config.json"))?;
            let mut src = SafetensorsSource::open(&dir)?;
            let weights = LlamaWeights::load(&mut src, &config, Naming::HuggingFace, progress)?;
            Ok(LoadedModel {
                config,
                weights,
                gguf: None,
            })
        }
    }
}
