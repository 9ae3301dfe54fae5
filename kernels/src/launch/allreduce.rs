//! The all-reduce launchers (`cu/allreduce.cu`) for tensor parallelism among the GPUs of one
//! process: the one-shot sum over peer memory, and the sum read from where the GEMMs wrote it,
//! fused with the residual add and the next RMSNorm.

use cudarc::driver::{CudaFunction, CudaStream};
use half::bf16;

use super::{AR_MAX_RANKS, ArPeers, Kernels, arg};
use crate::{Dptr, KernelError, Result};

/// Where [`Kernels::allreduce_add_rmsnorm`] writes the normalised rows.
#[derive(Debug, Clone, Copy)]
pub enum NormOut {
    /// bf16 rows, as `add_rmsnorm` writes them.
    Bf16(Dptr<bf16>),
    /// e4m3 rows and one scale per row, as `add_rmsnorm_quant_fp8` writes them.
    Fp8 { q: Dptr<u8>, scale: Dptr<f32> },
}

/// The shared extent checks of the all-reduce kernels: `n` a multiple of `align`, and at most
/// `cap` elements (what a slot of `half_elems` takes).
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    peers: &ArPeers,
    n: usize,
    rank: usize,
    half_elems: usize,
    blocks: usize,
    align: usize,
    cap: usize,
) -> Result<()> {
    let ranks = peers.ranks;
    if !n.is_multiple_of(align)
        || n > cap
        || half_elems > i32::MAX as usize
        || rank >= ranks
        || ranks > AR_MAX_RANKS
        || blocks == 0
        || blocks > 1024
    {
        return Err(KernelError::Unsupported(format!(
            "{what} all-reduce of {n} elements (slots of {half_elems}, rank {rank} of {ranks})"
        )));
    }
    Ok(())
}

impl Kernels {
    /// One-shot all-reduce (sum) of `x[..n]` across the ranks of `peers`, in place, on every
    /// rank at once (each rank launches it on its own stream); see `cu/allreduce.cu`.
    ///
    /// # Safety
    /// Every rank of the group launches the same sequence of these calls with the same `n`;
    /// `peers` holds every rank's receive buffer (2 × ranks × `half_elems` bf16) and flags
    /// (`blocks` × [`AR_MAX_RANKS`] u32, zeroed at first), all reachable from this device
    /// (peer access on); `epochs` is this rank's `blocks` counters (zeroed at first); the
    /// same `peers` always take the same `blocks`; `x` holds `n` elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn allreduce_oneshot(
        &self,
        s: &CudaStream,
        peers: &ArPeers,
        x: Dptr<bf16>,
        epochs: Dptr<u32>,
        n: usize,
        rank: usize,
        half_elems: usize,
        blocks: usize,
    ) -> Result<()> {
        check(
            "one-shot", peers, n, rank, half_elems, blocks, 8, half_elems,
        )?;
        // SAFETY: checked above; the caller guarantees the rest.
        unsafe {
            self.launch_peers(
                &self.allreduce,
                s,
                peers,
                x,
                epochs,
                n,
                rank,
                half_elems,
                blocks,
            )
        }
    }

    /// `f`, a kernel taking (peers, x, epochs, n, rank, ranks, half_elems), as `blocks` blocks
    /// of 512 threads.
    ///
    /// # Safety
    /// As the kernel's launcher, its extents checked.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_peers(
        &self,
        f: &CudaFunction,
        s: &CudaStream,
        peers: &ArPeers,
        x: Dptr<bf16>,
        epochs: Dptr<u32>,
        n: usize,
        rank: usize,
        half_elems: usize,
        blocks: usize,
    ) -> Result<()> {
        let table = peers.table;
        let (xa, ea) = (x.addr(), epochs.addr());
        let (ni, ri, rs, hi) = (n as i32, rank as i32, peers.ranks as i32, half_elems as i32);
        let mut a = [
            arg(&table),
            arg(&xa),
            arg(&ea),
            arg(&ni),
            arg(&ri),
            arg(&rs),
            arg(&hi),
        ];
        // SAFETY: argument types match the kernel; the caller guarantees the rest.
        unsafe { self.launch(s, f, (blocks as u32, 1, 1), 512, &mut a) }
    }

    /// [`Self::allreduce_oneshot`] for small messages, with the same bits: the data goes out in
    /// lines that carry the call's epoch beside it, so no flags are raised or waited for (see
    /// `allreduce_ll_bf16` in `cu/allreduce.cu`). A slot of `half_elems` takes messages up to
    /// `half_elems / 2` elements.
    ///
    /// # Safety
    /// As [`Self::allreduce_oneshot`], with `peers`' receive buffers and `epochs` taken by these
    /// calls alone, always with the same `blocks`; `n % 4 == 0`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn allreduce_ll(
        &self,
        s: &CudaStream,
        peers: &ArPeers,
        x: Dptr<bf16>,
        epochs: Dptr<u32>,
        n: usize,
        rank: usize,
        half_elems: usize,
        blocks: usize,
    ) -> Result<()> {
        check(
            "low-latency",
            peers,
            n,
            rank,
            half_elems,
            blocks,
            4,
            half_elems / 2,
        )?;
        // SAFETY: checked above; the caller guarantees the rest.
        unsafe {
            self.launch_peers(
                &self.allreduce_ll,
                s,
                peers,
                x,
                epochs,
                n,
                rank,
                half_elems,
                blocks,
            )
        }
    }

    /// The all-reduce of a row-parallel GEMM's product, then `residual += sum` and RMSNorm of
    /// `residual` with `weight` into `out`, in one launch, with the same values as
    /// [`Self::allreduce_oneshot`] followed by [`Self::add_rmsnorm`] (bf16 out) or
    /// [`Self::add_rmsnorm_quant_fp8`] (FP8 out). Each rank's product (tokens x hidden bf16)
    /// must already be in its own area of `peers`' receive buffers, where its GEMM wrote it
    /// (the kernel reads the peers' areas in place; see `cu/allreduce.cu`). Two ranks, rows of
    /// up to 4096 values (`Unsupported` otherwise).
    ///
    /// # Safety
    /// Every rank of the group launches the same sequence of these calls with the same shape;
    /// `peers` holds every rank's area (`half_elems` bf16) and flags (`blocks` ×
    /// [`AR_MAX_RANKS`] u32, zeroed at first), reachable from this device (peer access on);
    /// `epochs` is this rank's `blocks` counters (zeroed at first); the same flags always take
    /// the same `blocks`; no rank writes an area again before it has passed the handshake of a
    /// later call on another area (so the peers are done reading it); `residual`: tokens x
    /// hidden; `weight`: hidden; `out`: tokens x hidden values and tokens scales.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn allreduce_pull_add_rmsnorm(
        &self,
        s: &CudaStream,
        peers: &ArPeers,
        epochs: Dptr<u32>,
        (rank, half_elems, blocks): (usize, usize, usize),
        residual: Dptr<bf16>,
        out: NormOut,
        weight: Dptr<bf16>,
        (tokens, hidden): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        let n = tokens
            .checked_mul(hidden)
            .ok_or_else(|| KernelError::Unsupported(format!("{tokens} x {hidden} rows")))?;
        check("fused", peers, n, rank, half_elems, blocks, 8, half_elems)?;
        if peers.ranks > 2 {
            return Err(KernelError::Unsupported(format!(
                "fused all-reduce and RMSNorm over {} ranks (2 at most)",
                peers.ranks
            )));
        }
        // one vector of 8 per thread, blocks of at most 512 threads (the kernel's bound)
        if !hidden.is_multiple_of(8) || hidden > 8 * 512 {
            return Err(KernelError::Unsupported(format!(
                "fused all-reduce and RMSNorm of rows of {hidden}"
            )));
        }
        let table = peers.table;
        let (o, q, qs) = match out {
            NormOut::Bf16(o) => (o.addr(), 0u64, 0u64),
            NormOut::Fp8 { q, scale } => (0u64, q.addr(), scale.addr()),
        };
        let (r, w, ea) = (residual.addr(), weight.addr(), epochs.addr());
        let (hi, rows) = (hidden as i32, tokens as u32);
        let (ri, rs) = (rank as i32, peers.ranks as i32);
        let mut a = [
            arg(&table),
            arg(&r),
            arg(&o),
            arg(&q),
            arg(&qs),
            arg(&w),
            arg(&ea),
            arg(&hi),
            arg(&rows),
            arg(&ri),
            arg(&rs),
            arg(&eps),
        ];
        // add_rmsnorm's block size, so the sums of squares add in the same order
        let threads = (hidden / 8).clamp(32, 1024).next_multiple_of(32) as u32;
        // SAFETY: argument types match the kernel; the caller guarantees the rest.
        unsafe {
            self.launch(
                s,
                &self.allreduce_pull,
                (blocks as u32, 1, 1),
                threads,
                &mut a,
            )
        }
    }
}
