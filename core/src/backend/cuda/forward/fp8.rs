//! The forward pass's FP8 path for passes through the FP8 GEMMs (prefill, batches above the
//! GEMV's): activations quantized inside RMSNorm and SiLU-mul into the scratch's e4m3 rows, each
//! GEMM's product left unscaled where the kernel after it applies the scales.

use half::bf16;
use sgl_kernels::{Dptr, WeightRef, dptr};

use super::super::weights::{Layer, Linear};
use super::super::{CudaBackend, cuda_err};
use crate::error::{EngineError, Result};

/// An FP8 weight (n x k e4m3) and its per-row scales.
#[derive(Clone, Copy)]
pub(super) struct Fp8W {
    pub w: Dptr<u8>,
    pub scale: Dptr<f32>,
}

impl CudaBackend {
    /// A layer's four FP8 weights (qkv, o, gate/up, down) when the fused FP8 path takes a pass
    /// of `tokens` rows: every weight in FP8, the pass too large for the GEMV, fusion on, and
    /// no layer dump (which reads `delta` scaled).
    pub(super) fn fp8_layer(&self, lw: &Layer, tokens: usize) -> Option<[Fp8W; 4]> {
        if !self.fuse_fp8 || self.gemv_for(tokens) || self.dump.is_some() {
            return None;
        }
        let s = &self.stream;
        let f = |l: &Linear| match l.weight(s) {
            WeightRef::Fp8 { w, scale } => Some(Fp8W { w, scale }),
            WeightRef::Bf16(_) => None,
        };
        Some([f(&lw.qkv)?, f(&lw.o)?, f(&lw.gate_up)?, f(&lw.down)?])
    }

    /// The FP8 scratch's quantized rows and their scales, checked to hold `tokens` x `k`.
    pub(super) fn fp8_rows(&self, tokens: usize, k: usize) -> Result<(Dptr<u8>, Dptr<f32>)> {
        let (sc, s) = (&self.scratch, &self.stream);
        if sc.xq.len() < tokens * k || sc.xs.len() < tokens {
            return Err(EngineError::Internal(format!(
                "FP8 activation scratch holds {} bytes, {tokens} x {k} needed",
                sc.xq.len()
            )));
        }
        Ok((dptr(&sc.xq, s), dptr(&sc.xs, s)))
    }

    /// `x += delta` (its FP8 scales `pending` applied first: the weight scales of the GEMM that
    /// left it unscaled, with the scratch's row scales), then RMSNorm of `x` quantized per token
    /// into the FP8 scratch: the input of the next FP8 GEMM.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_norm_quant(
        &self,
        x: Dptr<bf16>,
        delta: Option<Dptr<bf16>>,
        pending: Option<Dptr<f32>>,
        norm_w: Dptr<bf16>,
        tokens: usize,
        k: usize,
    ) -> Result<()> {
        let (xq, xs) = self.fp8_rows(tokens, k)?;
        // SAFETY: x, delta: tokens x k; xq, xs sized (fp8_rows); pending holds k scales.
        unsafe {
            self.kernels.add_rmsnorm_quant_fp8(
                &self.stream,
                xq,
                xs,
                x,
                delta,
                pending.map(|ws| (xs, ws)),
                norm_w,
                tokens,
                k,
                self.cfg.rms_norm_eps,
            )
        }
        .map_err(cuda_err)
    }

    /// `y = xq · wᵀ` from the FP8 scratch's rows (tokens x k), unscaled; scaled in place after
    /// when `rescale`.
    pub(super) fn gemm_fp8_rows(
        &self,
        w: Fp8W,
        y: Dptr<bf16>,
        tokens: usize,
        k: usize,
        n: usize,
        rescale: bool,
    ) -> Result<()> {
        let (xq, xs) = self.fp8_rows(tokens, k)?;
        // SAFETY: xq: tokens x k (fp8_rows), w: n x k, y: tokens x n (the callers' shapes).
        unsafe {
            self.gemm
                .linear_fp8(xq, w.w, y, tokens, k, n)
                .map_err(cuda_err)?;
            if rescale {
                self.kernels
                    .fp8_rescale(&self.stream, y, y, xs, w.scale, tokens, n, false)
                    .map_err(cuda_err)?;
            }
        }
        Ok(())
    }

    /// `delta` scaled in place with the scratch's row scales and `ws`.
    pub(super) fn rescale_delta(
        &self,
        delta: Dptr<bf16>,
        ws: Dptr<f32>,
        tokens: usize,
        n: usize,
    ) -> Result<()> {
        let (_, xs) = self.fp8_rows(tokens, 0)?;
        // SAFETY: delta: tokens x n; xs: tokens; ws: n.
        unsafe {
            self.kernels
                .fp8_rescale(&self.stream, delta, delta, xs, ws, tokens, n, false)
        }
        .map_err(cuda_err)
    }
}
