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
    /// The weight scales of the FP8 GEMM that left it unscaled (with the scratch's row
    /// scales).
    pub scales: Option<Dptr<f32>>,
    /// This rank's share of a row-parallel product, not yet all-reduced.
    pub reduce: bool,
    /// It sits in this rank's pull area (scaled), for the norm to all-reduce as it reads it.
    pub pulled: bool,
    /// Which pull area (see [`Area`]).
    pub area: usize,
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
    /// [`PULL_MIN_ELEMS`] and the set's size, rows the fused kernel takes. The same answer on every rank (shapes and process-wide
    /// settings only).
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
    ) -> Dptr<bf16> {
        match (self.pull_set(tokens, n), area) {
            (Some(pull), Some(a)) => pull.own_area(a as usize),
            _ => delta,
        }
    }

    /// The state of the product a row-parallel GEMM left at `at` (with `scales`, FP8 weight
    /// scales still to apply): in the pull area, scaled now and left for the next norm;
    /// otherwise all-reduced now under tensor parallelism (after its scales), or on one GPU
    /// left for the next norm to scale.
    pub(super) fn row_parallel_pending(
        &self,
        at: Dptr<bf16>,
        delta: Dptr<bf16>,
        scales: Option<Dptr<f32>>,
        tokens: usize,
        n: usize,
    ) -> Result<Pending> {
        let p = Pending {
            scales,
            reduce: self.comm.is_some(),
            ..Pending::default()
        };
        if let Some(pull) = self.pull_set(tokens, n)
            && let Some(area) = (0..2).find(|&a| pull.own_area(a).addr() == at.addr())
        {
            if let Some(ws) = scales {
                self.rescale_delta(at, ws, tokens, n)?;
            }
            return Ok(Pending {
                scales: None,
                reduce: true,
                pulled: true,
                area,
            });
        }
        if p.reduce {
            self.settle(delta, p, tokens, n)?;
            return Ok(Pending::default());
        }
        Ok(p)
    }

    /// Leaves `delta` as the plain bf16 sum: its scales applied and, where pending, its
    /// all-reduce done (a pulled product is never pending at the end of the layers: the last
    /// layer's GEMM writes `delta`).
    pub(super) fn settle(
        &self,
        delta: Dptr<bf16>,
        p: Pending,
        tokens: usize,
        n: usize,
    ) -> Result<()> {
        if let Some(ws) = p.scales {
            self.rescale_delta(delta, ws, tokens, n)?;
        }
        if p.reduce && !p.pulled {
            self.all_reduce(delta, tokens * n)?;
        }
        Ok(())
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
        if p.pulled {
            return self.pull_add_norm(x, p.area, norm_w, to, tokens, k);
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
        area: usize,
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
                &pull.peers[area & 1],
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
