//! Why a checkpoint could not be found or read. Causes from the file system and the format
//! readers stay attached as typed sources.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{} does not exist", path.display())]
    NotFound { path: PathBuf },
    /// A path that holds no model in a form we read; `why` says what was expected.
    #[error("{}: {why}", path.display())]
    NotAModel { path: PathBuf, why: &'static str },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{} is not a valid GGUF file: {source}", path.display())]
    Gguf {
        path: PathBuf,
        #[source]
        source: candle_core::Error,
    },
    #[error("tensor {name} is missing from the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor {name}: dtype {dtype} is not supported")]
    Dtype { name: String, dtype: String },
    /// Tensor bytes that do not fit the file or the shape.
    #[error("tensor {name}: {why}")]
    Layout { name: String, why: String },
    #[error("tensor {name}: {source}")]
    Dequantize {
        name: String,
        #[source]
        source: candle_core::Error,
    },
}
