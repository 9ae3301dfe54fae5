//! The tensors of a checkpoint as stored, whatever the file format: name, dtype, shape and the
//! bytes, borrowed from the memory-mapped files. Every backend builds its weights from a
//! [`TensorSource`]; converting to the device's layout is the backend's business.
//!
//! Two hooks for what changes how weights are read: a [`Shard`] on every read (tensor
//! parallelism: a rank reads only its rows or columns of a tensor) and the [`Quantization`]
//! a backend applies while converting (FP8 at load).

mod gguf;
mod safetensors;

use std::borrow::Cow;

use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

use super::error::LoadError;

pub use gguf::GgufFile;
pub use safetensors::SafetensorsFiles;

/// How a tensor's elements are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// FP8 e4m3 (the "fn" variant: no infinities, ±448 the largest values), the weights of
    /// an FP8 checkpoint; its scales are separate tensors (`model::quant`).
    F8E4M3,
    /// A ggml block format (Q8_0, Q4_0, Q4_1, the k-quants, ...): each row is a run of
    /// blocks of `block_elems` values in `block_bytes` bytes.
    Ggml(GgmlDType),
}

impl DType {
    pub fn from_ggml(t: GgmlDType) -> Self {
        match t {
            GgmlDType::F32 => DType::F32,
            GgmlDType::F16 => DType::F16,
            GgmlDType::BF16 => DType::BF16,
            other => DType::Ggml(other),
        }
    }

    /// Values per block (1 for the float formats).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 => 1,
            DType::Ggml(t) => t.block_size(),
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 => 1,
            DType::Ggml(t) => t.type_size(),
        }
    }

    /// Bytes of `n` values (`n` a multiple of the block size).
    fn bytes_of(self, n: usize) -> usize {
        n / self.block_elems() * self.block_bytes()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DType::F32 => f.write_str("F32"),
            DType::F16 => f.write_str("F16"),
            DType::BF16 => f.write_str("BF16"),
            DType::F8E4M3 => f.write_str("F8_E4M3"),
            DType::Ggml(t) => write!(f, "{t:?}"),
        }
    }
}

/// Which part of a tensor a reader takes. Rows are the first dimension (a weight's output
/// features), columns the last (its input features).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shard {
    /// The whole tensor (one device, or a tensor every rank holds).
    #[default]
    Whole,
    /// Rows `rank * n / parts .. (rank + 1) * n / parts`: a column-parallel weight (q, k, v,
    /// gate, up) or its bias. Borrowed from the mapping, since a row run is contiguous.
    Rows { rank: usize, parts: usize },
    /// The same share of every row's columns: a row-parallel weight (o, down). Copied out.
    Cols { rank: usize, parts: usize },
}

/// The form a backend stores weights in, chosen at load (`--quantization`). Each backend's
/// conversion matches on it; FP8 plugs in here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantization {
    /// As the checkpoint stores them (converted to the backend's own float or block format).
    #[default]
    AsStored,
    /// `--quantization fp8`: the linear layers as FP8 (e4m3) with one scale per output row,
    /// quantized at load from a bf16/f16/f32 checkpoint (CUDA only).
    Fp8,
}

/// One tensor (or one shard of it) as stored.
#[derive(Debug, Clone)]
pub struct Tensor<'a> {
    pub name: String,
    pub dtype: DType,
    /// Outermost dimension first: a weight is `[out features, in features]`.
    pub shape: Vec<usize>,
    /// Row-major, little-endian; borrowed from the memory-mapped file unless sharded by columns.
    pub bytes: Cow<'a, [u8]>,
}

/// A checkpoint's tensors by name.
pub trait TensorSource: Send + Sync {
    fn contains(&self, name: &str) -> bool;

    /// The tensor `name`, or the part of it that `shard` says.
    fn read(&self, name: &str, shard: Shard) -> Result<Tensor<'_>, LoadError>;
}

impl<'a> Tensor<'a> {
    /// Checks a stored tensor's byte count against its dtype and shape.
    pub(crate) fn new(
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        bytes: &'a [u8],
    ) -> Result<Self, LoadError> {
        let elems: usize = shape.iter().product();
        let layout = |why: String| LoadError::Layout {
            name: name.to_string(),
            why,
        };
        let last = shape.last().copied().unwrap_or(1);
        if !last.is_multiple_of(dtype.block_elems()) {
            return Err(layout(format!(
                "rows of {last} values are not whole {dtype} blocks of {}",
                dtype.block_elems()
            )));
        }
        if bytes.len() != dtype.bytes_of(elems) {
            return Err(layout(format!(
                "{} bytes for {dtype} of shape {shape:?}",
                bytes.len()
            )));
        }
        Ok(Tensor {
            name: name.to_string(),
            dtype,
            shape,
            bytes: Cow::Borrowed(bytes),
        })
    }

    /// An error unless the shape is `expected`.
    pub fn expect_shape(self, expected: &[usize]) -> Result<Self, LoadError> {
        if self.shape != expected {
            return Err(LoadError::Shape {
                name: self.name,
                found: self.shape,
                expected: expected.to_vec(),
            });
        }
        Ok(self)
    }

    /// `[rows, cols]` of a 2-D tensor.
    pub fn matrix_dims(&self) -> Result<(usize, usize), LoadError> {
        match self.shape.as_slice() {
            [r, c] => Ok((*r, *c)),
            other => Err(LoadError::Layout {
                name: self.name.clone(),
                why: format!("expected 2 dims, found {other:?}"),
            }),
        }
    }

    /// The part of the tensor that `shard` says.
    pub fn shard(self, shard: Shard) -> Result<Self, LoadError> {
        let (dim, rank, parts) = match shard {
            Shard::Whole => return Ok(self),
            Shard::Rows { rank, parts } => (0, rank, parts),
            Shard::Cols { rank, parts } => (self.shape.len().saturating_sub(1), rank, parts),
        };
        let n = self.shape.get(dim).copied().unwrap_or(0);
        let cols = self.shape.last().copied().unwrap_or(1);
        let block = self.dtype.block_elems();
        let whole_blocks = dim == 0 || (cols / parts.max(1)).is_multiple_of(block);
        if parts == 0 || rank >= parts || !n.is_multiple_of(parts) || !whole_blocks {
            return Err(LoadError::Layout {
                name: self.name,
                why: format!(
                    "shape {:?} ({}) does not split into {parts} equal parts along dimension {dim} (rank {rank})",
                    self.shape, self.dtype
                ),
            });
        }
        let share = n / parts;
        let mut shape = self.shape.clone();
        shape[dim] = share;
        let bytes = if dim == 0 {
            // Rows are contiguous: a sub-slice, still borrowed when the tensor was.
            let row = self.bytes.len() / n.max(1);
            match self.bytes {
                Cow::Borrowed(b) => Cow::Borrowed(&b[rank * share * row..(rank + 1) * share * row]),
                Cow::Owned(b) => {
                    Cow::Owned(b[rank * share * row..(rank + 1) * share * row].to_vec())
                }
            }
        } else {
            let row = self.dtype.bytes_of(cols).max(1);
            let part = self.dtype.bytes_of(share);
            let rows = self.bytes.len() / row;
            let mut out = vec![0u8; rows * part];
            // Several threads copy (the source is usually a memory-mapped checkpoint, so the
            // reads are page-cache copies that one core cannot keep up with).
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(8)
                .min(rows.div_ceil(64))
                .max(1);
            let per = rows.div_ceil(threads).max(1);
            let src: &[u8] = &self.bytes;
            std::thread::scope(|scope| {
                for (i, chunk) in out.chunks_mut((per * part).max(1)).enumerate() {
                    scope.spawn(move || {
                        for (r, dst) in chunk.chunks_exact_mut(part.max(1)).enumerate() {
                            let at = (i * per + r) * row + rank * part;
                            dst.copy_from_slice(&src[at..at + part]);
                        }
                    });
                }
            });
            Cow::Owned(out)
        };
        Ok(Tensor {
            name: self.name,
            dtype: self.dtype,
            shape,
            bytes,
        })
    }

    /// The values as f32 (ggml block formats dequantized).
    pub fn to_f32(&self) -> Result<Vec<f32>, LoadError> {
        let b = &self.bytes;
        Ok(match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F8E4M3 => b.iter().map(|&v| e4m3_to_f32(v)).collect(),
            DType::Ggml(t) => {
                let err = |source| LoadError::Dequantize {
                    name: self.name.clone(),
                    source,
                };
                let dev = candle_core::Device::Cpu;
                let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                    t,
                    b,
                    self.shape.clone(),
                    &dev,
                )
                .map_err(err)?;
                q.dequantize(&dev)
                    .and_then(|t| t.flatten_all())
                    .and_then(|t| t.to_vec1::<f32>())
                    .map_err(err)?
            }
        })
    }

    /// The values as bf16 (float formats only).
    pub fn to_bf16(&self) -> Result<Vec<bf16>, LoadError> {
        let b = &self.bytes;
        Ok(match self.dtype {
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32()))
                .collect(),
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            // Every e4m3 value is a bf16 value (3 mantissa bits, exponents 2^-9..2^8).
            DType::F8E4M3 => b.iter().map(|&v| bf16::from_f32(e4m3_to_f32(v))).collect(),
            DType::Ggml(_) => {
                return Err(LoadError::Dtype {
                    name: self.name.clone(),
                    dtype: self.dtype.to_string(),
                });
            }
        })
    }
}

/// The value of an e4m3 byte: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0
/// holds the subnormals (multiples of 2^-9), and 0x7f / 0xff are NaN (no infinities).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 3) & 0x0f);
    let m = f32::from(b & 0x07);
    if e == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if e == 0 {
        return sign * m * (2.0f32).powi(-9);
    }
    sign * (1.0 + m / 8.0) * (2.0f32).powi(e - 7)
}

#[cfg(test)]
mod tests;
