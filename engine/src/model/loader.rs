//! Reading tensors from a GGUF file or a Hugging Face folder of safetensors files.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::{GgmlDType, gguf_file};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::backend::cpu::kernels::{Weight, WeightFormat};
use crate::error::{EngineError, Result};

/// Where a model lives on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// One GGUF file holding weights, tokenizer and chat template.
    Gguf(PathBuf),
    /// A Hugging Face folder: config.json, *.safetensors, tokenizer.json, tokenizer_config.json.
    HfDir(PathBuf),
}

impl ModelFiles {
    pub fn detect(path: &Path) -> Result<Self> {
        if path.is_file() {
            if path.extension().and_then(|e| e.to_str()) == Some("gguf") {
                return Ok(ModelFiles::Gguf(path.to_path_buf()));
            }
            return Err(EngineError::Load(format!(
                "{} is a file but not a .gguf; pass a GGUF file or a Hugging Face model folder",
                path.display()
            )));
        }
        if path.is_dir() {
            if path.join("config.json").is_file() {
                return Ok(ModelFiles::HfDir(path.to_path_buf()));
            }
            let ggufs: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("gguf"))
                .collect();
            if ggufs.len() == 1 {
                return Ok(ModelFiles::Gguf(ggufs[0].clone()));
            }
            return Err(EngineError::Load(format!(
                "{} has no config.json and not exactly one .gguf file",
                path.display()
            )));
        }
        Err(EngineError::Load(format!(
            "{} does not exist",
            path.display()
        )))
    }
}

/// A source of named tensors, converted to the CPU kernels' formats.
pub trait TensorSource {
    fn contains(&self, name: &str) -> bool;
    /// A 2-D weight `[rows = out features, cols = in features]`.
    fn matrix(&mut self, name: &str) -> Result<Weight>;
    /// A 1-D tensor as f32 (norm weights, biases).
    fn vector(&mut self, name: &str) -> Result<Vec<f32>>;
}

pub struct GgufSource {
    file: File,
    pub content: gguf_file::Content,
    path: PathBuf,
}

impl GgufSource {
    pub fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path)
            .map_err(|e| EngineError::Load(format!("cannot open {}: {e}", path.display())))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| {
            EngineError::Load(format!("{} is not a valid GGUF file: {e}", path.display()))
        })?;
        Ok(GgufSource {
            file,
            content,
            path: path.to_path_buf(),
        })
    }

    fn qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        self.content
            .tensor(&mut self.file, name, &Device::Cpu)
            .map_err(|e| EngineError::Load(format!("{}: tensor {name}: {e}", self.path.display())))
    }
}

fn load_err(name: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Load(format!("tensor {name}: {e}"))
}

impl TensorSource for GgufSource {
    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn matrix(&mut self, name: &str) -> Result<Weight> {
        let qt = self.qtensor(name)?;
        let dims = qt.shape().dims().to_vec();
        let (rows, cols) = match dims.as_slice() {
            [r, c] => (*r, *c),
            other => return Err(load_err(name, format!("expected 2 dims, found {other:?}"))),
        };
        let format = match qt.dtype() {
            GgmlDType::F32 => Some(WeightFormat::F32),
            GgmlDType::F16 => Some(WeightFormat::F16),
            GgmlDType::BF16 => Some(WeightFormat::BF16),
            GgmlDType::Q8_0 => Some(WeightFormat::Q8_0),
            GgmlDType::Q4_0 => Some(WeightFormat::Q4_0),
            GgmlDType::Q4_1 => Some(WeightFormat::Q4_1),
            _ => None,
        };
        match format {
            Some(f) => {
                let bytes = qt.data().map_err(|e| load_err(name, e))?.into_owned();
                Weight::from_raw(f, rows, cols, bytes).map_err(|e| load_err(name, e))
            }
            None => {
                // Formats without a dedicated kernel run as f32.
                let t = qt.dequantize(&Device::Cpu).map_err(|e| load_err(name, e))?;
                let data = t
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(|e| load_err(name, e))?;
                Weight::from_f32(rows, cols, data).map_err(|e| load_err(name, e))
            }
        }
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>> {
        let qt = self.qtensor(name)?;
        let t = qt.dequantize(&Device::Cpu).map_err(|e| load_err(name, e))?;
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| load_err(name, e))
    }
}

/// All `*.safetensors` files of a folder, memory-mapped.
pub struct SafetensorsSource {
    maps: Vec<Mmap>,
    index: HashMap<String, usize>,
}

impl SafetensorsSource {
    pub fn open(dir: &Path) -> Result<Self> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| EngineError::Load(format!("{}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(EngineError::Load(format!(
                "no *.safetensors files in {}",
                dir.display()
            )));
        }
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (i, p) in files.iter().enumerate() {
            let f =
                File::open(p).map_err(|e| EngineError::Load(format!("{}: {e}", p.display())))?;
            // SAFETY: the file is opened read-only and model files are not modified while served.
            let map = unsafe { Mmap::map(&f) }
                .map_err(|e| EngineError::Load(format!("{}: {e}", p.display())))?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| EngineError::Load(format!("{}: {e}", p.display())))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            maps.push(map);
        }
        Ok(SafetensorsSource { maps, index })
    }

    fn raw(&self, name: &str) -> Result<(Dtype, Vec<usize>, Vec<u8>)> {
        let i = *self.index.get(name).ok_or_else(|| {
            EngineError::Load(format!("tensor {name} is missing from the checkpoint"))
        })?;
        let st = SafeTensors::deserialize(&self.maps[i]).map_err(|e| load_err(name, e))?;
        let t = st.tensor(name).map_err(|e| load_err(name, e))?;
        Ok((t.dtype(), t.shape().to_vec(), t.data().to_vec()))
    }
}

fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => return Err(load_err(name, format!("dtype {other:?} is not supported"))),
    })
}

impl TensorSource for SafetensorsSource {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn matrix(&mut self, name: &str) -> Result<Weight> {
        let (dtype, shape, bytes) = self.raw(name)?;
        let (rows, cols) = match shape.as_slice() {
            [r, c] => (*r, *c),
            other => return Err(load_err(name, format!("expected 2 dims, found {other:?}"))),
        };
        let format = match dtype {
            Dtype::F32 => WeightFormat::F32,
            Dtype::F16 => WeightFormat::F16,
            Dtype::BF16 => WeightFormat::BF16,
            other => return Err(load_err(name, format!("dtype {other:?} is not supported"))),
        };
        Weight::from_raw(format, rows, cols, bytes).map_err(|e| load_err(name, e))
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>> {
        let (dtype, _shape, bytes) = self.raw(name)?;
        to_f32(name, dtype, &bytes)
    }
}
