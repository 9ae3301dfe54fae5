//! A GGUF file, memory-mapped: its header (metadata with the tokenizer and chat template,
//! tensor infos) read once, tensor bytes borrowed from the mapping.

use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use memmap2::Mmap;

use super::safetensors::map_file;
use super::{DType, Shard, Tensor, TensorSource};
use crate::model::error::LoadError;

pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    content: Content,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let mut file = File::open(path).map_err(|source| LoadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = Content::read(&mut file).map_err(|source| LoadError::Gguf {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map: map_file(path)?,
            content,
        })
    }

    /// The header: metadata and tensor infos.
    pub fn content(&self) -> &Content {
        &self.content
    }
}

impl TensorSource for GgufFile {
    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn read(&self, name: &str, shard: Shard) -> Result<Tensor<'_>, LoadError> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                name: name.to_string(),
            })?;
        let dtype = DType::from_ggml(info.ggml_dtype);
        let shape = info.shape.dims().to_vec();
        let elems: usize = shape.iter().product();
        let len = elems / dtype.block_elems() * dtype.block_bytes();
        let start = self
            .content
            .tensor_data_offset
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok());
        let bytes = start
            .and_then(|s| Some(s..s.checked_add(len)?))
            .and_then(|r| self.map.get(r))
            .ok_or_else(|| LoadError::Layout {
                name: name.to_string(),
                why: format!("its {len} bytes lie outside {}", self.path.display()),
            })?;
        Tensor::new(name, dtype, shape, bytes)?.shard(shard)
    }
}
