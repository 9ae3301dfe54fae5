//! Llama-family weights laid out for the CPU kernels: matrices in the kernels' formats (float
//! rows, or ggml blocks repacked into groups of rows), norms and biases as f32.

use crate::backend::BackendError;
use crate::model::llama::{LlamaTensors, Part};
use crate::model::tensors::e4m3_to_f32;
use crate::model::{DType, LoadError, Quantization, Tensor};
use sgl_kernels::cpu::{Weight, WeightFormat};

use candle_core::quantized::GgmlDType;

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

/// A 2-D tensor as a kernel weight: formats with a kernel of their own keep their bytes, the
/// others (k-quants, ...) run as f32.
fn matrix(t: Tensor<'_>) -> Result<Weight, BackendError> {
    let (rows, cols) = t.matrix_dims()?;
    let format = match t.dtype {
        DType::F32 => Some(WeightFormat::F32),
        DType::F16 => Some(WeightFormat::F16),
        DType::BF16 => Some(WeightFormat::BF16),
        DType::Ggml(GgmlDType::Q8_0) => Some(WeightFormat::Q8_0),
        DType::Ggml(GgmlDType::Q4_0) => Some(WeightFormat::Q4_0),
        DType::Ggml(GgmlDType::Q4_1) => Some(WeightFormat::Q4_1),
        DType::Ggml(_) => None,
        DType::F8E4M3 => {
            return Err(LoadError::Layout {
                name: t.name,
                why: "FP8 is read for the linear layers' weights only (with their scales)".into(),
            }
            .into());
        }
    };
    let weight = match format {
        Some(f) => Weight::from_raw(f, rows, cols, t.bytes.to_vec()),
        None => Weight::from_f32(rows, cols, t.to_f32()?),
    };
    weight.map_err(|source| BackendError::Weight {
        name: t.name,
        source,
    })
}

/// A linear layer's weight as the checkpoint stores it; FP8 rows (an FP8 checkpoint) are
/// dequantized with their scales to f32, the exact values the checkpoint means.
fn linear(src: &LlamaTensors<'_>, layer: usize, part: Part) -> Result<Weight, BackendError> {
    let t = src.layer(layer, part)?;
    if t.dtype != DType::F8E4M3 {
        return matrix(t);
    }
    let (rows, cols) = t.matrix_dims()?;
    let scales = src.fp8_scales(layer, part, rows)?;
    let values: Vec<f32> = t
        .bytes
        .chunks_exact(cols.max(1))
        .zip(&scales)
        .flat_map(|(row, &s)| row.iter().map(move |&b| e4m3_to_f32(b) * s))
        .collect();
    Weight::from_f32(rows, cols, values).map_err(|source| BackendError::Weight {
        name: t.name,
        source,
    })
}

fn vector(t: Tensor<'_>) -> Result<Vec<f32>, LoadError> {
    t.to_f32()
}

impl LlamaWeights {
    /// Reads and converts every weight, calling `progress(done, total)` after each layer.
    pub fn load(
        src: &LlamaTensors<'_>,
        quant: Quantization,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Self, BackendError> {
        let n = src.config().num_layers;
        if quant != Quantization::AsStored {
            return Err(BackendError::Unsupported(format!(
                "{quant:?} weights run on the GPU (--device cuda); the CPU backend serves the checkpoint's own format"
            )));
        }
        let embed = matrix(src.embed()?)?;
        let mut layers = Vec::with_capacity(n);
        for i in 0..n {
            let mat = |part: Part| linear(src, i, part);
            let wq = mat(Part::Q)?;
            let wk = mat(Part::K)?;
            let wv = mat(Part::V)?;
            let wo = mat(Part::O)?;
            let w_gate = mat(Part::Gate)?;
            let w_up = mat(Part::Up)?;
            let w_down = mat(Part::Down)?;
            let vec = |part: Part| vector(src.layer(i, part)?);
            let attn_norm = vec(Part::AttnNorm)?;
            let ffn_norm = vec(Part::FfnNorm)?;
            let (bq, bk, bv) = if src.has(i, Part::QBias) {
                (
                    Some(vec(Part::QBias)?),
                    Some(vec(Part::KBias)?),
                    Some(vec(Part::VBias)?),
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
            progress(i + 1, n);
        }
        let norm = vector(src.final_norm()?)?;
        let lm_head = if src.has_lm_head() {
            Some(matrix(src.lm_head()?)?)
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
