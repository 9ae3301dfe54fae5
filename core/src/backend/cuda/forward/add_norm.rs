//! The residual add and RMSNorm between a layer's GEMMs, for passes through the GEMMs (prefill,
//! batches above the GEMV's). Under tensor parallelism (tp 2) the row-parallel GEMM before it
//! (o_proj, down_proj) writes its product into this rank's area of peer memory, and the norm's
//! launch all-reduces the areas as it reads them (`allreduce_pull_add_rmsnorm`): one launch
//! instead of two, the transfer overlapped with the add and the norm, the same bits.

use half::bf16;
use sgl_kernels::{Dptr, NormOut, dptr};

use super::super::tp::PullSet;
use super::super::{CudaBackend, cuda_err};
use crate::error::Result;

/// Smallest product (elements) the pull kernel takes: 64 rows of a 4096-wide model (2 x H100,
/// `bench-all-reduce`, one-shot + norm against fused: 64 rows 11.4 / 9.8 µs, FP8 out 13.1 /
/// 11.9; 16 rows 8.0 / 9.1).
const PULL_MIN_ELEMS: usize = 64 * 4096;

/// What the product of the last row-parallel GEMM still needs when the next norm adds it into
/// the residual stream.
#[derive(Clone, Copy, Default)]
pub(in crate::backend::cuda) struct Pending {
    /// The weight scales of the FP8 GEMM that left it unscaled in `delta` (with the scratch's
    /// row scales; one GPU only).
    pub scales: Option<Dptr<f32>>,
    /// It sits in this rank's pull area (scaled), for the norm to all-reduce as it reads it.
    pub pulled: Option<Area>,
}

/// Where a row-parallel GEMM writes its product (see [`CudaBackend::row_parallel_out`]).
#[derive(Clone, Copy)]
pub(in crate::backend::cuda) struct RowOut {
    pub at: Dptr<bf16>,
    /// The pull area `at` is, or `None` for `delta`.
    pub area: Option<Area>,
}

/// The pull areas: o_proj writes one, down_proj the other, so no GEMM overwrites an area the
/// other rank may still be reading (see `tp::PullSet`).
#[derive(Clone, Copy)]
pub(in crate::backend::cuda) enum Area {
    /// o_proj's product.
    Attn = 0,
    /// down_proj's product (of every layer but the last, whose product stays in `delta`).
    Mlp = 1,
}

/// Where a norm writes the normalised rows.
#[derive(Clone, Copy)]
pub(in crate::backend::cuda) enum NormTo {
    /// bf16 rows (the input of a bf16 GEMM).
    Bf16(Dptr<bf16>),
    /// The FP8 scratch's e4m3 rows and scales (the input of an FP8 GEMM).
    Fp8,
}

impl CudaBackend {
    /// The pull set, when the next norm will all-reduce a row-parallel product of `tokens` x
    /// `n` from it: tensor parallelism with the set, fusion on, the message between
    /// [`PULL_MIN_ELEMS`] and the set's size, rows the fused kernel takes. The same answer on
    /// every rank (shapes and process-wide settings only).
    fn pull_set(&self, tokens: usize, n: usize) -> Option<&PullSet> {
        let pull = self.custom_ar.as_ref()?.pull.as_ref()?;
        let m = tokens * n;
        let fits =
            (PULL_MIN_ELEMS..=pull.half_elems).contains(&m) && n <= 4096 && n.is_multiple_of(8);
        (self.comm.is_some() && self.ar_norm_fusion && !self.skip_all_reduce && fits)
            .then_some(pull)
    }

    /// Where a row-parallel GEMM of `tokens` x `n` writes its product: this rank's pull area
    /// `area` when the next norm takes it from there (`None`: no norm of this pass's layers
    /// follows, so `delta` it is), else `delta`.
    pub(super) fn row_parallel_out(
        &self,
        delta: Dptr<bf16>,
        tokens: usize,
        n: usize,
        area: Option<Area>,
    ) -> RowOut {
        match (self.pull_set(tokens, n), area) {
            (Some(pull), Some(a)) => RowOut {
                at: pull.own_area(a as usize),
                area: Some(a),
            },
            _ => RowOut {
                at: delta,
                area: None,
            },
        }
    }

    /// What the product a row-parallel GEMM left at `out` (with `scales`, FP8 weight scales
    /// still to apply) needs from the next norm: in a pull area, scaled now and all-reduced by
    /// the norm; in `delta` under tensor parallelism, scaled and all-reduced now; on one GPU,
    /// its scales.
    pub(super) fn row_parallel_pending(
        &self,
        out: RowOut,
        scales: Option<Dptr<f32>>,
        tokens: usize,
        n: usize,
    ) -> Result<Pending> {
        if out.area.is_none() && self.comm.is_none() {
            return Ok(Pending {
                scales,
                pulled: None,
            });
        }
        if let Some(ws) = scales {
            self.rescale_delta(out.at, ws, tokens, n)?;
        }
        if out.area.is_none() {
            self.all_reduce(out.at, tokens * n)?;
        }
        Ok(Pending {
            scales: None,
            pulled: out.area,
        })
    }

    /// `x += delta` (what `p` says done first), then RMSNorm of `x` with `norm_w` into `to`; a
    /// pulled product is all-reduced by the same launch as it is read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_norm(
        &self,
        x: Dptr<bf16>,
        delta: Option<Dptr<bf16>>,
        p: Pending,
        norm_w: Dptr<bf16>,
        to: NormTo,
        tokens: usize,
        k: usize,
    ) -> Result<()> {
        let s = &self.stream;
        if let Some(area) = p.pulled {
            return self.pull_add_norm(x, area, norm_w, to, tokens, k);
        }
        match to {
            NormTo::Fp8 => self.add_norm_quant(x, delta, p.scales, norm_w, tokens, k),
            NormTo::Bf16(normed) => {
                if let (Some(d), Some(ws)) = (delta, p.scales) {
                    self.rescale_delta(d, ws, tokens, k)?;
                }
                // SAFETY: x, delta, normed: tokens x k; norm_w: k.
                unsafe {
                    self.kernels.add_rmsnorm(
                        s,
                        normed,
                        x,
                        delta,
                        norm_w,
                        tokens,
                        k,
                        self.cfg.rms_norm_eps,
                    )
                }
                .map_err(cuda_err)
            }
        }
    }

    /// The all-reduce of the pull areas, the add and the norm of [`Self::add_norm`] as one
    /// launch.
    fn pull_add_norm(
        &self,
        x: Dptr<bf16>,
        area: Area,
        norm_w: Dptr<bf16>,
        to: NormTo,
        tokens: usize,
        k: usize,
    ) -> Result<()> {
        let (Some(c), Some(pull)) = (&self.comm, self.pull_set(tokens, k)) else {
            return Err(crate::error::EngineError::Internal(
                "a pulled product without the pull set".into(),
            ));
        };
        let s = &self.stream;
        let out = match to {
            NormTo::Bf16(normed) => NormOut::Bf16(normed),
            NormTo::Fp8 => {
                let (q, scale) = self.fp8_rows(tokens, k)?;
                NormOut::Fp8 { q, scale }
            }
        };
        // SAFETY: every rank runs the same layer loop and pulls for the same calls (pull_set
        // depends on shapes and process-wide settings only); the pull set's buffers were set
        // up for this group; every rank's GEMM wrote its product into its area
        // (row_parallel_out), and o_proj and down_proj alternate the areas, so an area is
        // written again only after a call on the other one; x: tokens x k; the FP8 scratch
        // holds tokens x k.
        unsafe {
            self.kernels.allreduce_pull_add_rmsnorm(
                s,
                &pull.peers[area as usize],
                dptr(&pull.epochs, s),
                (c.rank(), pull.half_elems, pull.blocks),
                x,
                out,
                norm_w,
                (tokens, k),
                self.cfg.rms_norm_eps,
            )
        }
        .map_err(cuda_err)
    }
}
