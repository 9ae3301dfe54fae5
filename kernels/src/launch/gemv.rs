//! The decode GEMV's launchers (`cu/gemv.cu`): how a launch divides a weight into row tiles
//! and blocks along k, the split-k workspace, and the plain, norm-fused and planned launches
//! for bf16 and FP8 weights.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::{Kernels, WeightRef, arg};
use crate::{Dptr, KernelError, Result, dptr};

/// Most token rows of one GEMV launch (the MMA's 8 columns).
pub const GEMV_MAX_TOKENS: usize = 8;
/// Most blocks along k for one GEMV row tile.
pub const GEMV_MAX_SPLITS: usize = 8;
/// Warps per GEMV block (`GV_WARPS` in gemv.cu).
const GEMV_WARPS: usize = 8;
/// Steps (beyond the first) of weights each GEMV warp prefetches into L2 before it waits for
/// the kernel before it, unless `SGL_GEMV_PREFETCH` says otherwise.
pub const GEMV_PREFETCH_STEPS: u32 = 1;

/// What a GEMV does with `x · wᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemvEpilogue {
    /// `y = x · wᵀ`, y: tokens x n.
    Store,
    /// `y += x · wᵀ` (sum in f32, rounded once), y: tokens x n.
    Accumulate,
    /// w is `[gate; up]` with n = 2 inter rows; `y = bf16(silu(gate)) * up`, y: tokens x inter,
    /// rounded as the unfused GEMM followed by `silu_mul` rounds.
    SwiGlu,
}

/// How a GEMV launch divides the work: row tiles of 16 or 32 rows, and blocks along k per tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvPlan {
    pub rows_per_block: u32,
    pub tiles: u32,
    pub splits: u32,
}

impl GemvPlan {
    /// Tiles of `rows_per_block` weight rows (16 or 32; SwiGLU tiles hold half as many output
    /// features) over w's `n` rows, `splits` blocks along k each.
    pub fn tiled(n: usize, epilogue: GemvEpilogue, rows_per_block: u32, splits: u32) -> Self {
        let (units, per) = if epilogue == GemvEpilogue::SwiGlu {
            (n / 2, rows_per_block / 2)
        } else {
            (n, rows_per_block)
        };
        GemvPlan {
            rows_per_block,
            tiles: units.div_ceil(per.max(1) as usize) as u32,
            splits,
        }
    }
}

/// Split-k partial sums and per-tile arrival counters of the GEMV (one per stream: launches
/// on one stream run one after another, so they share it). Counters start at zero and every
/// split launch leaves them at zero.
pub struct GemvWorkspace {
    partials: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}
impl Kernels {
    /// Partial-sum buffers for every [`Kernels::gemv_plan`] on this device.
    pub fn gemv_workspace(&self, s: &Arc<CudaStream>) -> Result<GemvWorkspace> {
        // split plans only arise with fewer tiles than multiprocessors (see gemv_plan)
        self.gemv_workspace_for(s, self.num_sms as usize)
    }

    /// Partial-sum buffers for split plans of up to `tiles` row tiles (32 rows) of
    /// [`GEMV_MAX_SPLITS`] splits: for [`Kernels::gemv_with_plan`] with plans of its own.
    pub fn gemv_workspace_for(&self, s: &Arc<CudaStream>, tiles: usize) -> Result<GemvWorkspace> {
        Ok(GemvWorkspace {
            partials: s.alloc_zeros::<f32>(tiles.max(1) * GEMV_MAX_SPLITS * 2 * 128)?,
            counters: s.alloc_zeros::<u32>(tiles.max(1))?,
        })
    }

    /// Row tiling and k splits for `x · wᵀ` with w of `n` rows of `k`. Independent of the
    /// token count, so every token row gets the same result whatever the batch.
    ///
    /// A kernel's weight stream runs at full rate while enough blocks are resident; a last,
    /// partial wave of blocks leaves the memory system under-used. So: 16-row tiles when they
    /// all fit in one wave (two blocks per multiprocessor), else 32-row tiles when those do,
    /// else 32-row tiles when there are many waves anyway, else 16-row tiles (finer waves).
    /// SwiGLU tiles hold 8 (16-row kernel) or 16 (32-row kernel) output features.
    /// FP8 weights take the same plan: a warp step covers the same elements.
    pub fn gemv_plan(&self, k: usize, n: usize, epilogue: GemvEpilogue) -> GemvPlan {
        let sms = self.num_sms.max(1) as usize;
        let wave = 2 * sms;
        let t16 = GemvPlan::tiled(n, epilogue, 16, 1).tiles as usize;
        let t32 = GemvPlan::tiled(n, epilogue, 32, 1).tiles as usize;
        let (rows, tiles) = if t16 <= wave || (t32 > wave && t32 < 8 * wave) {
            (16, t16)
        } else {
            (32, t32)
        };
        let mut splits = 1;
        if tiles < sms {
            // aim at two blocks per multiprocessor, keeping two steps per warp's k slice
            let chunks_per_step = if rows == 32 { 8 } else { 16 };
            let steps = (k / 8).div_ceil(chunks_per_step);
            let by_k = (steps / (2 * GEMV_WARPS)).max(1);
            splits = wave.div_ceil(tiles).min(by_k).min(GEMV_MAX_SPLITS);
        }
        GemvPlan {
            rows_per_block: rows,
            tiles: tiles as u32,
            splits: splits as u32,
        }
    }

    /// `x · wᵀ` for at most [`GEMV_MAX_TOKENS`] token rows (see [`GemvEpilogue`]); bf16 x and
    /// y, bf16 or FP8 weights ([`WeightRef`]), f32 sums. Needs k % 8 == 0 (k % 16 == 0 for
    /// FP8) and 16-byte aligned x and w; `Unsupported` (before any
    /// launch) otherwise, so the caller can take the GEMM instead. No host synchronisation:
    /// graph capture records one launch.
    ///
    /// # Safety
    /// x: tokens x k; w: n x k; y: tokens x n (tokens x n / 2 for SwiGlu), not overlapping x
    /// or w; `ws` made by this device's [`Kernels::gemv_workspace`], used by no other stream.
    pub unsafe fn gemv(
        &self,
        s: &CudaStream,
        y: Dptr<bf16>,
        x: Dptr<bf16>,
        w: impl Into<WeightRef>,
        tokens: usize,
        k: usize,
        n: usize,
        epilogue: GemvEpilogue,
        ws: &GemvWorkspace,
    ) -> Result<()> {
        let plan = self.gemv_plan(k, n, epilogue);
        // SAFETY: the caller's guarantees, passed on.
        unsafe { self.gemv_inner(s, y, x, w.into(), None, tokens, k, n, epilogue, plan, ws) }
    }

    /// [`Kernels::gemv`] with a plan of the caller's (benchmarks comparing plans): 16 or 32
    /// rows per block, and a workspace large enough for a split plan's tiles
    /// ([`Kernels::gemv_workspace_for`]); `Unsupported` otherwise.
    ///
    /// # Safety
    /// As [`Kernels::gemv`].
    pub unsafe fn gemv_with_plan(
        &self,
        s: &CudaStream,
        y: Dptr<bf16>,
        x: Dptr<bf16>,
        w: impl Into<WeightRef>,
        tokens: usize,
        k: usize,
        n: usize,
        epilogue: GemvEpilogue,
        plan: GemvPlan,
        ws: &GemvWorkspace,
    ) -> Result<()> {
        if !matches!(plan.rows_per_block, 16 | 32)
            || !(1..=GEMV_MAX_SPLITS).contains(&(plan.splits as usize))
            || plan != GemvPlan::tiled(n, epilogue, plan.rows_per_block, plan.splits)
        {
            return Err(KernelError::Unsupported(format!(
                "GEMV plan {plan:?} for n {n}"
            )));
        }
        // SAFETY: the caller's guarantees, passed on.
        unsafe { self.gemv_inner(s, y, x, w.into(), None, tokens, k, n, epilogue, plan, ws) }
    }

    /// [`Kernels::gemv`] of `rmsnorm(x) · wᵀ`: x is the raw residual stream (tokens x k) and
    /// each element is normalised as [`Kernels::add_rmsnorm`] without `delta` would write it
    /// (`bf16(norm_w * bf16(x / rms(x)))`, rms with `eps`), so this replaces that launch and
    /// the GEMV after it; x is not modified. Same plan, limits and `Unsupported` cases as
    /// [`Kernels::gemv`], and norm_w must be 16-byte aligned.
    ///
    /// # Safety
    /// As [`Kernels::gemv`]; norm_w: k.
    pub unsafe fn gemv_rmsnorm(
        &self,
        s: &CudaStream,
        y: Dptr<bf16>,
        x: Dptr<bf16>,
        norm_w: Dptr<bf16>,
        eps: f32,
        w: impl Into<WeightRef>,
        tokens: usize,
        k: usize,
        n: usize,
        epilogue: GemvEpilogue,
        ws: &GemvWorkspace,
    ) -> Result<()> {
        let w = w.into();
        let plan = self.gemv_plan(k, n, epilogue);
        // SAFETY: the caller's guarantees, passed on.
        unsafe {
            self.gemv_inner(
                s,
                y,
                x,
                w,
                Some((norm_w, eps)),
                tokens,
                k,
                n,
                epilogue,
                plan,
                ws,
            )
        }
    }

    /// # Safety
    /// As [`Kernels::gemv_rmsnorm`] with `norm`, else as [`Kernels::gemv`].
    unsafe fn gemv_inner(
        &self,
        s: &CudaStream,
        y: Dptr<bf16>,
        x: Dptr<bf16>,
        w: WeightRef,
        norm: Option<(Dptr<bf16>, f32)>,
        tokens: usize,
        k: usize,
        n: usize,
        epilogue: GemvEpilogue,
        plan: GemvPlan,
        ws: &GemvWorkspace,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        if tokens > GEMV_MAX_TOKENS
            || k == 0
            || !k.is_multiple_of(8)
            || (matches!(w, WeightRef::Fp8 { .. }) && !k.is_multiple_of(16))
            || n == 0
            || k > i32::MAX as usize
            || n > i32::MAX as usize
            || (epilogue == GemvEpilogue::SwiGlu && !n.is_multiple_of(2))
            || !x.addr().is_multiple_of(16)
            || !w.addr().is_multiple_of(16)
            || norm.is_some_and(|(nw, _)| !nw.addr().is_multiple_of(16))
        {
            return Err(KernelError::Unsupported(format!(
                "GEMV of {tokens} tokens, k {k}, n {n} ({epilogue:?}) at x {x:?}, w {w:?}, norm {:?}",
                norm.map(|(nw, _)| nw)
            )));
        }
        let per_block = plan.rows_per_block as usize / 16 * 128;
        let (tiles, splits) = (plan.tiles as usize, plan.splits as usize);
        if splits > 1
            && (tiles * splits * per_block > ws.partials.len() || tiles > ws.counters.len())
        {
            return Err(KernelError::Unsupported(format!(
                "GEMV workspace too small for {tiles} tiles x {splits} splits"
            )));
        }
        let r32 = usize::from(plan.rows_per_block == 32);
        let (ya, xa, wa) = (y.addr(), x.addr(), w.addr());
        let scale = match w {
            WeightRef::Fp8 { scale, .. } => Some(scale.addr()),
            WeightRef::Bf16(_) => None,
        };
        let (pa, ca) = (dptr(&ws.partials, s).addr(), dptr(&ws.counters, s).addr());
        let (m, ki, ni) = (tokens as i32, k as i32, n as i32);
        let mode: i32 = match epilogue {
            GemvEpilogue::Store => 0,
            GemvEpilogue::Accumulate => 1,
            GemvEpilogue::SwiGlu => 2,
        };
        let sp = plan.splits as i32;
        let pf = self.gemv_prefetch.min(i32::MAX as u32) as i32;
        let grid = (plan.tiles, plan.splits, 1);
        let threads = (GEMV_WARPS * 32) as u32;
        let (sa, na, eps) = (
            scale.unwrap_or(0),
            norm.map_or(0, |(nw, _)| nw.addr()),
            norm.map_or(0.0f32, |(_, e)| e),
        );
        // The entries' parameters: y, x, w, [scale (FP8)], [norm_w, eps (RMSNorm)], then the
        // shape, epilogue, plan and workspace.
        let mut a = [std::ptr::null_mut(); 14];
        let mut len = 0;
        let scale_arg = scale.map(|_| arg(&sa));
        let norm_args = norm.map(|_| [arg(&na), arg(&eps)]);
        for p in [arg(&ya), arg(&xa), arg(&wa)]
            .into_iter()
            .chain(scale_arg)
            .chain(norm_args.into_iter().flatten())
            .chain([
                arg(&m),
                arg(&ki),
                arg(&ni),
                arg(&mode),
                arg(&sp),
                arg(&pa),
                arg(&ca),
                arg(&pf),
            ])
        {
            a[len] = p;
            len += 1;
        }
        let f = match (scale.is_some(), norm.is_some()) {
            (false, false) => &self.gemv[r32],
            (false, true) => &self.gemv_rms[r32],
            (true, false) => &self.gemv_fp8[r32],
            (true, true) => &self.gemv_rms_fp8[r32],
        };
        // SAFETY: the arguments match the chosen entry's parameters in type and order; the
        // caller guarantees the extents; the plan fits the workspace (checked above).
        unsafe { self.launch(s, f, grid, threads, &mut a[..len]) }
    }
}
