//! The model as stored, knowing no device: where its files are ([`files`]), its configuration
//! ([`config`]), and its tensors as stored ([`tensors`], one [`TensorSource`] over safetensors
//! and GGUF, memory-mapped), named by part for the Llama family ([`llama`]). Backends build
//! their weights from a [`Model`] (`crate::backend::load`).

pub mod config;
pub mod error;
pub mod files;
pub mod hub;
pub mod llama;
pub mod quant;
pub mod tensors;

use std::path::Path;

use candle_core::quantized::gguf_file::Content;

use crate::error::Result;
use config::ModelConfig;
pub use error::LoadError;
use files::ModelFiles;
use llama::{LlamaTensors, Naming, TensorParallel};
use quant::CheckpointQuant;
pub use tensors::{DType, Quantization, Shard, Tensor, TensorSource};
use tensors::{GgufFile, SafetensorsFiles};

/// An opened checkpoint: files found, configuration read, tensors mapped (not yet read).
pub struct Model {
    pub files: ModelFiles,
    pub config: ModelConfig,
    /// The tensor naming scheme of the files.
    pub naming: Naming,
    /// The quantization the checkpoint brings (`config.json`'s `quantization_config`).
    pub quant: CheckpointQuant,
    source: Source,
}

enum Source {
    Gguf(GgufFile),
    Safetensors(SafetensorsFiles),
}

/// Open a GGUF file or a Hugging Face folder (`config.json` and `*.safetensors`).
pub fn load(path: &Path) -> Result<Model> {
    let files = ModelFiles::detect(path)?;
    match &files {
        ModelFiles::Gguf(p) => {
            let gguf = GgufFile::open(p)?;
            let config = ModelConfig::from_gguf(gguf.content())?;
            Ok(Model {
                files,
                config,
                naming: Naming::Gguf,
                quant: CheckpointQuant::None,
                source: Source::Gguf(gguf),
            })
        }
        ModelFiles::HfDir(dir) => {
            let config = ModelConfig::from_hf_config(&dir.join("config.json"))?;
            let quant = quant::read(&dir.join("config.json"))?;
            let shards = files::safetensors_shards(dir)?;
            let st = SafetensorsFiles::open(&shards)?;
            Ok(Model {
                files,
                config,
                naming: Naming::HuggingFace,
                quant,
                source: Source::Safetensors(st),
            })
        }
    }
}

impl Model {
    pub fn tensors(&self) -> &dyn TensorSource {
        match &self.source {
            Source::Gguf(g) => g,
            Source::Safetensors(s) => s,
        }
    }

    /// The GGUF header (tokenizer vocabulary and chat template live there), for GGUF models.
    pub fn gguf(&self) -> Option<&Content> {
        match &self.source {
            Source::Gguf(g) => Some(g.content()),
            Source::Safetensors(_) => None,
        }
    }

    /// The Llama-family tensors of this rank.
    pub fn llama(&self, tp: TensorParallel) -> LlamaTensors<'_> {
        LlamaTensors::new(self.tensors(), &self.config, self.naming, tp)
            .with_kv_scales_declared(self.quant.kv_scales())
    }
}
