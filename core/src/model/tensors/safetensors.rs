//! The `*.safetensors` shards of a Hugging Face folder, memory-mapped, with one index from
//! tensor name to (shard, dtype, shape, byte range) built from their headers at open.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::{DType, Shard, Tensor, TensorSource};
use crate::model::error::LoadError;

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the file.
    start: usize,
    end: usize,
}

/// Every tensor of a set of safetensors files.
pub struct SafetensorsFiles {
    maps: Vec<Mmap>,
    index: HashMap<String, Entry>,
}

impl SafetensorsFiles {
    pub fn open(files: &[PathBuf]) -> Result<Self, LoadError> {
        let mut maps = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for (i, p) in files.iter().enumerate() {
            let map = map_file(p)?;
            let (header, meta) =
                SafeTensors::read_metadata(&map).map_err(|source| LoadError::Safetensors {
                    path: p.clone(),
                    source,
                })?;
            // Tensor data follows the 8-byte header length and the header.
            let base = 8 + header;
            for (name, info) in meta.tensors() {
                let (start, end) = info.data_offsets;
                index.insert(
                    name,
                    Entry {
                        file: i,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: base + start,
                        end: base + end,
                    },
                );
            }
            maps.push(map);
        }
        Ok(SafetensorsFiles { maps, index })
    }
}

/// Maps a checkpoint file read-only.
pub(super) fn map_file(p: &Path) -> Result<Mmap, LoadError> {
    let io = |source| LoadError::Io {
        path: p.to_path_buf(),
        source,
    };
    let f = File::open(p).map_err(io)?;
    // SAFETY: the file is opened read-only and model files are not modified while served; a
    // file changed under us gives wrong weights, not memory unsafety beyond what the mapping
    // itself allows.
    unsafe { Mmap::map(&f) }.map_err(io)
}

impl TensorSource for SafetensorsFiles {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn read(&self, name: &str, shard: Shard) -> Result<Tensor<'_>, LoadError> {
        let e = self
            .index
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                name: name.to_string(),
            })?;
        let dtype = match e.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            Dtype::F8_E4M3 => DType::F8E4M3,
            other => {
                return Err(LoadError::Dtype {
                    name: name.to_string(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        // The header was validated against the file's length at open.
        let bytes = &self.maps[e.file][e.start..e.end];
        Tensor::new(name, dtype, e.shape.clone(), bytes)?.shard(shard)
    }
}
