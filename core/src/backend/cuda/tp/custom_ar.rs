//! The all-reduce over peer memory between the ranks of a group (`cu/allreduce.cu`): the
//! one-shot sets (decode messages and, at tp 2, prefill's), the low-latency set for small
//! messages, the pull areas the row-parallel GEMMs write into at tp 2, and their set-up.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
use half::bf16;
use sgl_kernels::{AR_BLOCKS, AR_LARGE_BLOCKS, AR_MAX_RANKS, ArPeers, Dptr, Kernels, dptr};

use super::Join;
use crate::backend::cuda::cuda_err;
use crate::error::Result;

/// The one-shot all-reduce over peer memory (see `cu/allreduce.cu`): a set of buffers for
/// decode messages and, at tp 2, one for prefill's.
pub(in crate::backend::cuda) struct CustomAllReduce {
    pub small: OneShot,
    pub large: Option<OneShot>,
    /// At tp 2, the areas the row-parallel GEMMs of passes through the GEMMs write their
    /// products into for the norm after them to all-reduce as it reads them
    /// (`allreduce_pull_add_rmsnorm`; up to the prefill set's size).
    pub pull: Option<PullSet>,
    /// The low-latency one-shot all-reduce's buffers (`allreduce_ll_bf16`): messages up to
    /// `ll_max_bytes`, at tp 2 the decode batches of up to 64 rows of a 4096-wide model (those
    /// of 64 rows and more take the pull set), at tp 4 up to 8 rows.
    pub ll: Option<LowLatency>,
}

impl CustomAllReduce {
    /// The low-latency set when it takes a message of `n` elements (the same bits as the
    /// one-shot kernel, so deterministic mode takes it too).
    pub fn pick_ll(&self, n: usize) -> Option<&LowLatency> {
        self.ll
            .as_ref()
            .filter(|ll| n.is_multiple_of(4) && 2 * n <= ll.half_elems)
    }

    /// The buffers a message of `n` elements goes through: the decode set up to its size,
    /// then the prefill set where there is one, up to its size (beyond, NCCL is as fast: on
    /// 2 x H200 one 8 MB launch took 35 µs against NCCL's 46, 32 MB in pieces 140 µs against
    /// 135); `None` for NCCL. Deterministic: every message goes through one-shot launches, in
    /// pieces of `half_elems` where larger, so every element is a rank-ordered sum whatever
    /// the message's size (NCCL's order follows the size).
    pub fn pick(&self, n: usize, deterministic: bool) -> Option<&OneShot> {
        if !n.is_multiple_of(8) {
            return None;
        }
        if n <= self.small.half_elems {
            return Some(&self.small);
        }
        match &self.large {
            Some(l) if n <= l.half_elems || deterministic => Some(l),
            _ => deterministic.then_some(&self.small),
        }
    }
}

/// One set of one-shot buffers on one rank and every rank's addresses: messages up to
/// `half_elems` per launch of `blocks` blocks.
pub(in crate::backend::cuda) struct OneShot {
    pub peers: ArPeers,
    pub half_elems: usize,
    pub blocks: usize,
    pub epochs: CudaSlice<u32>,
    _staging: PeerMemory,
    _flags: PeerMemory,
}

impl OneShot {
    /// One launch of the one-shot kernel: `x[..n]` summed across the ranks in place.
    ///
    /// # Safety
    /// Every rank of the group makes the same calls on its own set; `x` holds `n` elements on
    /// `s`'s device; `n <= half_elems`, `n % 8 == 0`.
    pub unsafe fn all_reduce(
        &self,
        k: &Kernels,
        s: &Arc<CudaStream>,
        x: Dptr<bf16>,
        n: usize,
        rank: usize,
    ) -> Result<()> {
        let e = dptr(&self.epochs, s);
        // SAFETY: the buffers were set up for this group (custom_all_reduce); the caller
        // guarantees the rest.
        unsafe { k.allreduce_oneshot(s, &self.peers, x, e, n, rank, self.half_elems, self.blocks) }
            .map_err(cuda_err)
    }
}

impl LowLatency {
    /// One launch of the low-latency kernel: `x[..n]` summed across the ranks in place.
    ///
    /// # Safety
    /// Every rank of the group makes the same calls on its own set; `x` holds `n` elements on
    /// `s`'s device; `2 n <= half_elems`, `n % 4 == 0` (see [`CustomAllReduce::pick_ll`]).
    pub unsafe fn all_reduce(
        &self,
        k: &Kernels,
        s: &Arc<CudaStream>,
        x: Dptr<bf16>,
        n: usize,
        rank: usize,
    ) -> Result<()> {
        let e = dptr(&self.epochs, s);
        // SAFETY: the buffers were set up for this group (custom_all_reduce) and serve these
        // calls alone; the caller guarantees the rest.
        unsafe { k.allreduce_ll(s, &self.peers, x, e, n, rank, self.half_elems, self.blocks) }
            .map_err(cuda_err)
    }
}

/// The low-latency all-reduce's buffers on one rank and every rank's addresses: slots of
/// `half_elems` bf16 (messages up to half of that: each line carries its epoch beside the data),
/// taken by `allreduce_ll_bf16` alone, always with `blocks` blocks.
pub(in crate::backend::cuda) struct LowLatency {
    pub peers: ArPeers,
    pub half_elems: usize,
    pub blocks: usize,
    pub epochs: CudaSlice<u32>,
    _staging: PeerMemory,
}

/// The pull all-reduce's buffers on one rank (see `cu/allreduce.cu`): two areas of
/// `half_elems` bf16, o_proj's products in area 0 and down_proj's in area 1, so a GEMM never
/// writes an area the other rank may still be reading (between two uses of an area comes the
/// other area's all-reduce, whose handshake the other rank passes only once its earlier reads
/// are done), and one handshake flag per block and source rank.
pub(in crate::backend::cuda) struct PullSet {
    /// Every rank's area 0 and area 1, each with the flags, as the kernel takes them.
    pub peers: [ArPeers; 2],
    pub half_elems: usize,
    pub blocks: usize,
    pub epochs: CudaSlice<u32>,
    areas: PeerMemory,
    _flags: PeerMemory,
}

impl PullSet {
    /// This rank's area `a` (0 or 1).
    pub fn own_area(&self, a: usize) -> Dptr<bf16> {
        // SAFETY: the allocation (2 areas) lives as long as `self`, which the backend keeps
        // while it launches work on it.
        unsafe { Dptr::<bf16>::from_raw(self.areas.addr()).add((a & 1) * self.half_elems) }
    }
}

/// Device memory other GPUs of the process read and write (peer access). Allocated with
/// `cuMemAlloc`, not from the stream-ordered pool that `CudaStream::alloc` uses: pool memory
/// is not reachable through peer access.
pub(in crate::backend::cuda) struct PeerMemory {
    ptr: u64,
    ctx: Arc<CudaContext>,
}

impl PeerMemory {
    /// `bytes` of zeroed device memory on `ctx`'s GPU.
    pub fn zeroed(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(cuda_err)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer; freed in Drop with the same context current.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }
            .result()
            .map_err(cuda_err)?;
        let mem = PeerMemory {
            ptr,
            ctx: ctx.clone(),
        };
        // SAFETY: the allocation holds `bytes` bytes.
        unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes) }
            .result()
            .map_err(cuda_err)?;
        Ok(mem)
    }

    pub fn addr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for PeerMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context; no queued work uses it any more
            // (the backend's streams are done when it is dropped).
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// Bytes of the largest message the decode set of one-shot buffers takes in one launch (a
/// decode batch of 256 rows of a 4096-wide model); its staging holds two of them per rank.
const CUSTOM_AR_MAX_BYTES: usize = 2 << 20;
/// Words each rank publishes when the all-reduce buffers are set up: the decode set's staging
/// and flags, its context, the prefill set's staging and flags, the pull set's areas and flags,
/// the low-latency set's staging.
pub(super) const EXCHANGE_WORDS: usize = 8;
/// The same for the prefill set (1024 tokens of a 4096-wide model), used at tp 2 only: there
/// each rank sends its whole message to the other once, as a ring or two-shot all-reduce
/// would; with more ranks the one-shot kernel sends (ranks - 1) times the message and NCCL
/// takes large messages. `SGL_DISABLE_ONESHOT_PREFILL=1` leaves them to NCCL at tp 2 too.
const CUSTOM_AR_LARGE_BYTES: usize = 8 << 20;
/// The largest message the low-latency set takes at `ranks` GPUs (`SGL_DISABLE_LL_ALLREDUCE=1`:
/// none); its slots hold twice that (the epochs beside the data). Each rank sends every peer
/// twice the message, so the flagged kernel overtakes it sooner with more ranks: against it on
/// 2 x H200, 512 KB tie; on 4 x H200, 64 KB 4.6 against 5.9 µs, 128 KB 7.5 against 6.5. Eight
/// ranks are not measured: half of four's.
fn ll_max_bytes(ranks: usize) -> usize {
    match ranks {
        0..=2 => 512 << 10,
        3..=4 => 64 << 10,
        _ => 32 << 10,
    }
}

/// Sets up the one-shot all-reduce on this rank when every pair of the group's GPUs has peer
/// access; `None` (NCCL for everything) otherwise or when disabled. Every rank calls it.
pub(in crate::backend::cuda) fn custom_all_reduce(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    join: &Join,
    rank: usize,
    disabled: bool,
) -> Result<Option<CustomAllReduce>> {
    let size = join.size;
    // Whether this rank reaches every other GPU directly.
    let mut ok = !disabled && size <= AR_MAX_RANKS;
    for peer in 0..size {
        if !ok || peer == rank {
            continue;
        }
        let mut can = 0i32;
        // SAFETY: writes one int; device ordinals < the device count (checked at load).
        let r = unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, rank as sys::CUdevice, peer as sys::CUdevice)
        };
        ok = r == sys::CUresult::CUDA_SUCCESS && can == 1;
    }
    let half_elems = CUSTOM_AR_MAX_BYTES / 2;
    let large_elems = CUSTOM_AR_LARGE_BYTES / 2;
    let alloc = |half_elems: usize, blocks: usize| -> Result<_> {
        // [2 parities][size source ranks][half_elems] bf16
        let staging = PeerMemory::zeroed(ctx, 2 * size * half_elems * 2)?;
        let flags = PeerMemory::zeroed(ctx, blocks * AR_MAX_RANKS * 4)?;
        let epochs = stream.alloc_zeros::<u32>(blocks).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        Ok((staging, flags, epochs))
    };
    let bufs = if ok {
        alloc(half_elems, AR_BLOCKS).ok()
    } else {
        None
    };
    let prefill_off = std::env::var("SGL_DISABLE_ONESHOT_PREFILL").as_deref() == Ok("1");
    // Blocks of the prefill set's launches (`SGL_ONESHOT_PREFILL_BLOCKS`, 1..=1024).
    let large_blocks = std::env::var("SGL_ONESHOT_PREFILL_BLOCKS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|b| (1..=1024).contains(b))
        .unwrap_or(AR_LARGE_BLOCKS);
    let large = if bufs.is_some() && size == 2 && !prefill_off {
        alloc(large_elems, large_blocks).ok()
    } else {
        None
    };
    // The pull set: two areas per rank, one flag word per (block, source rank).
    let pull_on = std::env::var("SGL_DISABLE_AR_NORM_FUSION").as_deref() != Ok("1");
    let pull = if bufs.is_some() && size == 2 && pull_on {
        (|| -> Result<_> {
            let area = PeerMemory::zeroed(ctx, 2 * large_elems * 2)?;
            let flags = PeerMemory::zeroed(ctx, AR_LARGE_BLOCKS * AR_MAX_RANKS * 4)?;
            let epochs = stream
                .alloc_zeros::<u32>(AR_LARGE_BLOCKS)
                .map_err(cuda_err)?;
            stream.synchronize().map_err(cuda_err)?;
            Ok((area, flags, epochs))
        })()
        .ok()
    } else {
        None
    };
    // The low-latency set: [2 parities][size source ranks][2 ll_max_bytes / 2] bf16.
    let ll_half_elems = ll_max_bytes(size);
    let ll_on = std::env::var("SGL_DISABLE_LL_ALLREDUCE").as_deref() != Ok("1");
    let ll = if bufs.is_some() && ll_on {
        (|| -> Result<_> {
            let staging = PeerMemory::zeroed(ctx, 2 * size * ll_half_elems * 2)?;
            let epochs = stream.alloc_zeros::<u32>(AR_BLOCKS).map_err(cuda_err)?;
            stream.synchronize().map_err(cuda_err)?;
            Ok((staging, epochs))
        })()
        .ok()
    } else {
        None
    };
    let all = join.exchange(
        rank,
        match &bufs {
            Some((st, fl, _)) => [
                st.addr(),
                fl.addr(),
                ctx.cu_ctx() as u64,
                large.as_ref().map_or(0, |l| l.0.addr()),
                large.as_ref().map_or(0, |l| l.1.addr()),
                pull.as_ref().map_or(0, |l| l.0.addr()),
                pull.as_ref().map_or(0, |l| l.1.addr()),
                ll.as_ref().map_or(0, |l| l.0.addr()),
            ],
            None => [0; EXCHANGE_WORDS],
        },
    );
    let mut ok = bufs.is_some() && all.iter().all(|w| w[..3].iter().all(|&x| x != 0));
    ok = ok && ctx.bind_to_thread().is_ok();
    if ok {
        for (peer, words) in all.iter().enumerate() {
            if peer == rank {
                continue;
            }
            // SAFETY: the peer's context handle, alive for the group's life (the ranks are
            // dropped together); enabling twice reports an error that is ignored.
            let r = unsafe { sys::cuCtxEnablePeerAccess(words[2] as sys::CUcontext, 0) };
            if r != sys::CUresult::CUDA_SUCCESS
                && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            {
                tracing::warn!("tensor parallel rank {rank}: peer access to GPU {peer}: {r:?}");
                ok = false;
            }
        }
    }
    // Every rank must take the same path, or one would wait on flags nobody writes.
    let agreed = join.agree(rank, Ok(usize::from(ok)));
    let (Ok(1), Some((staging, flags, epochs))) = (agreed, bufs) else {
        if rank == 0 {
            tracing::info!(
                "tensor parallel: all-reduce through NCCL only ({})",
                if disabled {
                    "--disable-custom-all-reduce"
                } else {
                    "no peer access between every pair of GPUs"
                }
            );
        }
        return Ok(None);
    };
    let staging_addrs: Vec<u64> = all.iter().map(|w| w[0]).collect();
    let flag_addrs: Vec<u64> = all.iter().map(|w| w[1]).collect();
    let Some(peers) = ArPeers::new(&staging_addrs, &flag_addrs) else {
        return Ok(None);
    };
    let small = OneShot {
        peers,
        half_elems,
        blocks: AR_BLOCKS,
        epochs,
        _staging: staging,
        _flags: flags,
    };
    // The prefill set where every rank made one (each rank sees the same table).
    let large = match large {
        Some((staging, flags, epochs)) if all.iter().all(|w| w[3] != 0 && w[4] != 0) => {
            let st: Vec<u64> = all.iter().map(|w| w[3]).collect();
            let fl: Vec<u64> = all.iter().map(|w| w[4]).collect();
            ArPeers::new(&st, &fl).map(|peers| OneShot {
                peers,
                half_elems: large_elems,
                blocks: large_blocks,
                epochs,
                _staging: staging,
                _flags: flags,
            })
        }
        _ => None,
    };
    let pull = match pull {
        Some((staging, flags, epochs)) if all.iter().all(|w| w[5] != 0 && w[6] != 0) => {
            let st: Vec<u64> = all.iter().map(|w| w[5]).collect();
            let st1: Vec<u64> = st.iter().map(|a| a + 2 * large_elems as u64).collect();
            let fl: Vec<u64> = all.iter().map(|w| w[6]).collect();
            match (ArPeers::new(&st, &fl), ArPeers::new(&st1, &fl)) {
                (Some(p0), Some(p1)) => Some(PullSet {
                    peers: [p0, p1],
                    half_elems: large_elems,
                    blocks: AR_LARGE_BLOCKS,
                    epochs,
                    areas: staging,
                    _flags: flags,
                }),
                _ => None,
            }
        }
        _ => None,
    };
    let ll = match ll {
        Some((staging, epochs)) if all.iter().all(|w| w[7] != 0) => {
            let st: Vec<u64> = all.iter().map(|w| w[7]).collect();
            // the kernel reads no flags: the table's flag words repeat the staging addresses
            ArPeers::new(&st, &st).map(|peers| LowLatency {
                peers,
                half_elems: ll_half_elems,
                blocks: AR_BLOCKS,
                epochs,
                _staging: staging,
            })
        }
        _ => None,
    };
    if rank == 0 {
        if ll.is_some() {
            tracing::info!(
                "tensor parallel: low-latency all-reduce (no flags) up to {} KB",
                ll_max_bytes(size) >> 10
            );
        }
        match &large {
            Some(_) => tracing::info!(
                "tensor parallel: one-shot all-reduce over peer memory up to {} KB for decode and {} KB for prefill, NCCL above",
                CUSTOM_AR_MAX_BYTES >> 10,
                CUSTOM_AR_LARGE_BYTES >> 10
            ),
            None => tracing::info!(
                "tensor parallel: one-shot all-reduce over peer memory up to {} KB, NCCL above",
                CUSTOM_AR_MAX_BYTES >> 10
            ),
        }
    }
    Ok(Some(CustomAllReduce {
        small,
        large,
        pull,
        ll,
    }))
}
