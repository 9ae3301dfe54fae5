//! A layer's GEMMs as the forward pass calls them: the GEMV for decode-sized batches (with
//! RMSNorm folded into its input where it can), cuBLASLt otherwise, the accumulating and
//! row-parallel forms, gate/up with its activation, and the all-reduce between ranks.

use half::bf16;
use sgl_kernels::{GEMV_MAX_TOKENS, GemvEpilogue, KernelError, WeightRef, dptr};

use super::super::{CudaBackend, cuda_err};
use crate::error::{EngineError, Result};
use sgl_kernels::Dptr;

impl CudaBackend {
    /// Tensor parallelism: `buf[..n] = sum over ranks` (nothing on one GPU).
    pub(super) fn all_reduce(&self, buf: Dptr<bf16>, n: usize) -> Result<()> {
        let Some(c) = &self.comm else {
            return Ok(());
        };
        if self.skip_all_reduce {
            return Ok(());
        }
        if let Some(ll) = self.custom_ar.as_ref().and_then(|ar| ar.pick_ll(n)) {
            // SAFETY: every rank runs the same layer loop, so the calls match; pick_ll took n.
            return unsafe { ll.all_reduce(&self.kernels, &self.stream, buf, n, c.rank()) };
        }
        if let Some(ar) = self
            .custom_ar
            .as_ref()
            .and_then(|ar| ar.pick(n, self.opts.deterministic))
        {
            // Messages beyond one launch (deterministic mode only) go in pieces.
            let mut done = 0;
            while done < n {
                let len = (n - done).min(ar.half_elems);
                // SAFETY: every rank runs the same layer loop, so the calls match; len % 8 == 0
                // since n and half_elems are multiples of 8 (pick).
                unsafe {
                    ar.all_reduce(&self.kernels, &self.stream, buf.add(done), len, c.rank())
                }?;
                done += len;
            }
            return Ok(());
        }
        // SAFETY: buf holds n elements on this rank's device; every rank runs the same layer
        // loop, so the collectives match.
        unsafe { c.all_reduce_sum(buf, n, &self.stream) }
            .map_err(|e| EngineError::from(crate::backend::BackendError::Nccl(e)))
    }

    /// `x += inp · wᵀ` for a row-parallel weight (o_proj, down_proj): on one GPU the
    /// accumulating GEMM; with tensor parallelism rank 0 accumulates its partial product into
    /// `x`, the other ranks store theirs there, and the all-reduce leaves the sum on every rank.
    pub(super) fn row_parallel_add(
        &self,
        inp: Dptr<bf16>,
        w: WeightRef,
        x: Dptr<bf16>,
        tokens: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        if self.comm.is_none() || self.rank() == 0 {
            self.linear_add(inp, w, x, tokens, k, n)?;
        } else {
            self.linear(inp, w, x, tokens, k, n)?;
        }
        self.all_reduce(x, tokens * n)
    }

    /// Whether a GEMM of `tokens` rows takes the GEMV kernel.
    pub(super) fn gemv_for(&self, tokens: usize) -> bool {
        self.use_gemv && tokens <= GEMV_MAX_TOKENS
    }

    /// Whether a pass of `tokens` rows runs the decode layer form: RMSNorm inside the qkv and
    /// gate/up GEMVs, o_proj and down added straight into the residual stream `x` (so no
    /// separate norm launches and no `delta`). `SGL_DISABLE_GEMV_NORM=1` turns it off.
    pub(in crate::backend::cuda) fn fused_norm(&self, tokens: usize) -> bool {
        self.fuse_norm && self.gemv_for(tokens)
    }

    /// `y = rmsnorm(x) · wᵀ` (Store or SwiGlu epilogue): one GEMV that normalises x as it
    /// reads it, or, where the GEMV cannot take the shape, the norm into `normed` and the
    /// unfused path.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_linear(
        &self,
        x: Dptr<bf16>,
        norm_w: Dptr<bf16>,
        w: WeightRef,
        y: Dptr<bf16>,
        scratch: (Dptr<bf16>, Dptr<bf16>),
        tokens: usize,
        k: usize,
        n: usize,
        epilogue: GemvEpilogue,
    ) -> Result<()> {
        let s = &self.stream;
        let eps = self.cfg.rms_norm_eps;
        // SAFETY: x: tokens x k, w: n x k, y sized for the epilogue (Scratch sizes).
        let r = unsafe {
            self.kernels.gemv_rmsnorm(
                s,
                y,
                x,
                norm_w,
                eps,
                w,
                tokens,
                k,
                n,
                epilogue,
                &self.gemv_ws,
            )
        };
        match r {
            Err(KernelError::Unsupported(_)) => {}
            other => return other.map_err(cuda_err),
        }
        let (normed, gate_up) = scratch;
        // SAFETY: normed: tokens x k (Scratch).
        unsafe {
            self.kernels
                .add_rmsnorm(s, normed, x, None, norm_w, tokens, k, eps)
                .map_err(cuda_err)?;
        }
        match epilogue {
            GemvEpilogue::SwiGlu => self.gate_up_act(normed, w, gate_up, y, tokens, k, n / 2),
            _ => self.linear(normed, w, y, tokens, k, n),
        }
    }

    /// `y += x · wᵀ` (the residual add of o_proj and down): the GEMV's accumulate epilogue,
    /// or cuBLASLt with beta 1.
    pub(super) fn linear_add(
        &self,
        x: Dptr<bf16>,
        w: WeightRef,
        y: Dptr<bf16>,
        tokens: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let s = &self.stream;
        // SAFETY: x: tokens x k, w: n x k, y: tokens x n.
        let r = unsafe {
            self.kernels.gemv(
                s,
                y,
                x,
                w,
                tokens,
                k,
                n,
                GemvEpilogue::Accumulate,
                &self.gemv_ws,
            )
        };
        match r {
            Err(KernelError::Unsupported(_)) => {}
            other => return other.map_err(cuda_err),
        }
        self.gemm(x, w, y, tokens, k, n, true)
    }

    /// `y = x · wᵀ` (tokens x k times n x k): the GEMV for decode-sized batches, else cuBLASLt.
    /// Launch parameters depend only on the shape, so either path can be graph-captured.
    ///
    /// Every address must cover its shape (x: tokens x k, w: n x k, y: tokens x n).
    pub(super) fn linear(
        &self,
        x: Dptr<bf16>,
        w: WeightRef,
        y: Dptr<bf16>,
        tokens: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let s = &self.stream;
        if self.gemv_for(tokens) {
            // SAFETY: the caller's buffers cover the shapes; the workspace is this stream's.
            let r = unsafe {
                self.kernels
                    .gemv(s, y, x, w, tokens, k, n, GemvEpilogue::Store, &self.gemv_ws)
            };
            match r {
                Err(KernelError::Unsupported(_)) => {} // nothing launched: take cuBLASLt
                other => return other.map_err(cuda_err),
            }
        }
        self.gemm(x, w, y, tokens, k, n, false)
    }

    /// `y = x · wᵀ` (+ y when `accumulate`) through cuBLASLt: bf16, or for FP8 weights x
    /// quantized per token into the scratch's FP8 rows first.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
        &self,
        x: Dptr<bf16>,
        w: WeightRef,
        y: Dptr<bf16>,
        tokens: usize,
        k: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let s = &self.stream;
        match w {
            // SAFETY: x: tokens x k, w: n x k, y: tokens x n (the callers' shapes).
            WeightRef::Bf16(w) => {
                unsafe { self.gemm.linear(x, w, y, tokens, k, n, accumulate) }.map_err(cuda_err)
            }
            WeightRef::Fp8 { w, scale } => {
                let sc = &self.scratch;
                let (xq, xs) = self.fp8_rows(tokens, k)?;
                // The unscaled product goes to y itself, or beside it when y is added to.
                let d = if accumulate {
                    if sc.fp8_d.len() < tokens * n {
                        return Err(EngineError::Internal(format!(
                            "FP8 accumulate scratch holds {} values, {tokens} x {n} needed",
                            sc.fp8_d.len()
                        )));
                    }
                    dptr(&sc.fp8_d, s)
                } else {
                    y
                };
                // SAFETY: xq, xs, d sized for the shapes (checked above); the rest as above.
                unsafe {
                    self.kernels
                        .quantize_rows_fp8(s, xq, xs, x, tokens, k)
                        .map_err(cuda_err)?;
                    self.gemm
                        .linear_fp8(xq, w, d, tokens, k, n)
                        .map_err(cuda_err)?;
                    self.kernels
                        .fp8_rescale(s, y, d, xs, scale, tokens, n, accumulate)
                        .map_err(cuda_err)
                }
            }
        }
    }

    /// `act = silu(x · gateᵀ) * (x · upᵀ)` with `w_gate_up` = [gate; up] (2 inter x k): one
    /// GEMV with the SwiGLU epilogue for decode-sized batches, else the GEMM into `gate_up`
    /// (tokens x 2 inter) and `silu_mul`. Both round as the unfused bf16 ops do.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gate_up_act(
        &self,
        x: Dptr<bf16>,
        w_gate_up: WeightRef,
        gate_up: Dptr<bf16>,
        act: Dptr<bf16>,
        tokens: usize,
        k: usize,
        inter: usize,
    ) -> Result<()> {
        let s = &self.stream;
        if self.gemv_for(tokens) {
            // SAFETY: x: tokens x k, w: 2 inter x k, act: tokens x inter (Scratch sizes).
            let r = unsafe {
                self.kernels.gemv(
                    s,
                    act,
                    x,
                    w_gate_up,
                    tokens,
                    k,
                    2 * inter,
                    GemvEpilogue::SwiGlu,
                    &self.gemv_ws,
                )
            };
            match r {
                Err(KernelError::Unsupported(_)) => {}
                other => return other.map_err(cuda_err),
            }
        }
        self.linear(x, w_gate_up, gate_up, tokens, k, 2 * inter)?;
        // SAFETY: gate_up: tokens x 2 inter; act: tokens x inter.
        unsafe { self.kernels.silu_mul(s, act, gate_up, tokens, inter) }.map_err(cuda_err)
    }
}
