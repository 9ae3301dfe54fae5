//! Llama-family weights onto the GPU, in bf16. q/k/v are fused into one
//! `[q + k + v, hidden]` matrix and gate/up into one `[2 * intermediate, hidden]` matrix, so a
//! layer runs four GEMMs.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use sgl_kernels::{Dptr, dptr};

use crate::backend::BackendError;
use crate::model::llama::{LlamaTensors, Part};
use crate::model::{Quantization, Tensor};

pub(crate) struct Layer {
    pub input_norm: CudaSlice<bf16>,
    pub qkv: CudaSlice<bf16>,
    pub o: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    pub gate_up: CudaSlice<bf16>,
    pub down: CudaSlice<bf16>,
}

pub(crate) struct Weights {
    pub embed: CudaSlice<bf16>,
    pub layers: Vec<Layer>,
    pub norm: CudaSlice<bf16>,
    /// None when tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
    pub bytes: usize,
}

impl Weights {
    pub fn lm_head_ptr(&self, s: &CudaStream) -> Dptr<bf16> {
        dptr(self.lm_head.as_ref().unwrap_or(&self.embed), s)
    }
}

/// A tensor's values as bf16, the form every GEMM of this backend reads.
fn to_device_form(t: Tensor<'_>, quant: Quantization) -> Result<Vec<bf16>, BackendError> {
    match quant {
        Quantization::AsStored => Ok(t.to_bf16()?),
    }
}

fn upload(s: &Arc<CudaStream>, parts: &[Vec<bf16>]) -> Result<CudaSlice<bf16>, BackendError> {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    let mut d = s.alloc_zeros::<bf16>(n)?;
    let mut off = 0;
    for p in parts {
        let mut view = d.slice_mut(off..off + p.len());
        s.memcpy_htod(p, &mut view)?;
        off += p.len();
    }
    Ok(d)
}

pub(super) fn load(
    src: &LlamaTensors<'_>,
    quant: Quantization,
    s: &Arc<CudaStream>,
) -> Result<Weights, BackendError> {
    let cfg = src.config();
    let mut bytes = 0usize;
    let mut up = |parts: &[Vec<bf16>]| -> Result<CudaSlice<bf16>, BackendError> {
        bytes += parts.iter().map(|p| p.len() * 2).sum::<usize>();
        upload(s, parts)
    };
    let get = |t: Result<Tensor<'_>, crate::model::LoadError>| to_device_form(t?, quant);
    let embed = up(&[get(src.embed())?])?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        if src.has(l, Part::QBias) {
            return Err(BackendError::Unsupported(
                "q/k/v projection biases (Qwen2-style) are not supported by the CUDA backend yet"
                    .into(),
            ));
        }
        let part = |p: Part| get(src.layer(l, p));
        let qkv = up(&[part(Part::Q)?, part(Part::K)?, part(Part::V)?])?;
        let o = up(&[part(Part::O)?])?;
        let gate_up = up(&[part(Part::Gate)?, part(Part::Up)?])?;
        let down = up(&[part(Part::Down)?])?;
        let input_norm = up(&[part(Part::AttnNorm)?])?;
        let post_norm = up(&[part(Part::FfnNorm)?])?;
        layers.push(Layer {
            input_norm,
            qkv,
            o,
            post_norm,
            gate_up,
            down,
        });
    }
    let norm = up(&[get(src.final_norm())?])?;
    let lm_head = if src.has_lm_head() && !cfg.tie_word_embeddings {
        Some(up(&[get(src.lm_head())?])?)
    } else {
        None
    };
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
        bytes,
    })
}
