//! Tensor parallelism (`--tp-size N`): one engine on N GPUs of one node, as SGLang runs it.
//!
//! **A thread per GPU, in one process.** Rank 0 is the backend the scheduler drives; ranks
//! 1..N are worker threads, each with its own CUDA context, stream, kernels, weight shards,
//! KV pool (its share of the KV heads), scratch buffers and decode graphs. Threads rather than
//! processes because everything the ranks share is host-side and small (each pass's batch
//! plan), so a channel replaces SGLang's ZMQ broadcast, one loaded checkpoint mapping serves
//! every rank's reads, and a rank's failure is an error value in the same process instead of
//! a lost child. The GPUs talk through NCCL and, where every pair has peer access, through
//! the one-shot all-reduce over peer memory (`cu/allreduce.cu`): every decode message, and at
//! tp 2 prefill's up to 8 MB (1024 tokens of a 4096-wide model); NCCL takes the rest.
//!
//! **Each pass.** Rank 0 sends the batch to every worker, then runs it; every rank runs the
//! same code on the same batch ([`CudaBackend::run`]), so each makes the same choice of CUDA
//! graph or eager pass and queues the same collectives in the same order: the input token ids
//! broadcast from rank 0 (under the overlap schedule they exist only on rank 0's GPU, taken
//! from the previous pass's samples), and per layer one all-reduce after o_proj and one after
//! down_proj (row-parallel: each rank multiplies its share of the inputs). q/k/v and gate/up
//! are column-parallel (each rank computes its heads and its part of the MLP width), the KV
//! heads are split (or replicated on several ranks when there are more ranks than heads). The
//! embedding and the final norm are whole on every rank. The LM head is split by vocabulary
//! when the ranks divide it: each rank computes its share of every logits row, places it in
//! zeroed rows and one all-reduce sums them (adding zeros is exact, so the logits are the
//! bits one rank would compute); rank 0 alone samples. Otherwise rank 0 computes every logit
//! with the whole head. Splitting cuts the weights rank 0 reads per decode step by
//! (tp - 1) / tp of the head (a 1 GB head at tp 2 is 0.5 GB less per token).
//!
//! **Capacity.** Each rank sizes its KV pool from its own free memory; the ranks agree on the
//! smallest before allocating, since a KV slot index names the same token on every rank.
//!
//! **Failure.** A worker that fails records its error and aborts its communicator; rank 0
//! checks for that before each pass and while it waits for the GPU, aborts its own
//! communicator (so nothing waits forever on a collective), and returns the worker's error,
//! which stops the engine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, sys};
use half::bf16;
use sgl_kernels::nccl::{self, UniqueId};
use sgl_kernels::{AR_BLOCKS, AR_LARGE_BLOCKS, AR_MAX_RANKS, ArPeers, Dptr, Kernels, dptr};

use super::{CudaBackend, CudaOptions, cuda_err};
use crate::backend::{BackendError, SeqInput};
use crate::error::{EngineError, Result};
use crate::model::Model;

/// What the ranks of a group being loaded share: the NCCL id and a rendezvous to agree on
/// values (the KV capacity, then that every rank is ready for NCCL).
pub(super) struct Join {
    pub id: UniqueId,
    pub size: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Option<std::result::Result<usize, String>>>>,
    table: Mutex<Vec<[u64; EXCHANGE_WORDS]>>,
}

impl Join {
    pub fn new(id: UniqueId, size: usize) -> Self {
        Join {
            id,
            size,
            barrier: Barrier::new(size),
            slots: Mutex::new(vec![None; size]),
            table: Mutex::new(vec![[0; EXCHANGE_WORDS]; size]),
        }
    }

    /// Every rank calls this with its value (or why it has none); all get the smallest value,
    /// or the first rank's error. A failing rank still calls it, so no rank waits forever.
    pub fn agree(
        &self,
        rank: usize,
        mine: std::result::Result<usize, String>,
    ) -> std::result::Result<usize, String> {
        if let Ok(mut s) = self.slots.lock() {
            s[rank] = Some(mine);
        }
        self.barrier.wait();
        let out = match self.slots.lock() {
            Ok(s) => {
                let mut min = usize::MAX;
                let mut err = None;
                for (r, v) in s.iter().enumerate() {
                    match v {
                        Some(Ok(v)) => min = min.min(*v),
                        Some(Err(e)) if err.is_none() => err = Some(format!("rank {r}: {e}")),
                        Some(Err(_)) => {}
                        None => err = err.or(Some(format!("rank {r} gave no value"))),
                    }
                }
                err.map_or(Ok(min), Err)
            }
            Err(_) => Err("a rank panicked while loading".into()),
        };
        // Everyone has read the round before anyone writes the next.
        self.barrier.wait();
        out
    }
}

impl Join {
    /// Every rank publishes its words (buffer addresses, its context) and gets every rank's.
    pub fn exchange(&self, rank: usize, mine: [u64; EXCHANGE_WORDS]) -> Vec<[u64; EXCHANGE_WORDS]> {
        if let Ok(mut t) = self.table.lock() {
            t[rank] = mine;
        }
        self.barrier.wait();
        let all = self.table.lock().map(|t| t.clone()).unwrap_or_default();
        self.barrier.wait();
        all
    }
}

/// The one-shot all-reduce over peer memory (see `cu/allreduce.cu`): a set of buffers for
/// decode messages and, at tp 2, one for prefill's.
pub(super) struct CustomAllReduce {
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
pub(super) struct OneShot {
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
pub(super) struct LowLatency {
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
pub(super) struct PullSet {
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
pub(super) struct PeerMemory {
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
const EXCHANGE_WORDS: usize = 8;
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
pub(super) fn custom_all_reduce(
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

/// One sequence of a pass, owned (sent to the worker threads).
struct OwnedSeq {
    tokens: Vec<u32>,
    start_pos: usize,
    kv_slots: Vec<u32>,
    num_logits: usize,
    prompt: bool,
}

enum Cmd {
    Run(Arc<Vec<OwnedSeq>>),
    /// (GEMV, norm fusion, decode attention fusion, PDL); see `set_decode_form`.
    DecodeForm(bool, bool, bool, bool),
    /// See `set_skip_all_reduce`.
    SkipAllReduce(bool),
}

/// The first failure of a worker, seen by rank 0.
#[derive(Default)]
struct Failure {
    failed: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Failure {
    fn set(&self, why: String) {
        if let Ok(mut w) = self.why.lock()
            && w.is_none()
        {
            *w = Some(why);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn get(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        Some(
            self.why
                .lock()
                .ok()
                .and_then(|w| w.clone())
                .unwrap_or_else(|| "a rank failed".into()),
        )
    }
}

/// Rank 0's handles on the worker threads (empty at tp 1).
#[derive(Default)]
pub(super) struct Peers {
    links: Vec<(mpsc::Sender<Cmd>, Option<JoinHandle<()>>)>,
    failure: Arc<Failure>,
}

impl Peers {
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// A worker's failure as this rank's error.
    pub fn check(&self) -> Result<()> {
        match self.failure.get() {
            None => Ok(()),
            Some(why) => Err(EngineError::from(BackendError::Rank(why))),
        }
    }

    fn send(&self, cmd: impl Fn() -> Cmd) -> Result<()> {
        for (r, (tx, _)) in self.links.iter().enumerate() {
            if tx.send(cmd()).is_err() {
                self.check()?;
                return Err(EngineError::from(BackendError::Rank(format!(
                    "rank {} stopped",
                    r + 1
                ))));
            }
        }
        Ok(())
    }

    /// Hands the batch of a pass to every worker.
    pub fn run(&self, batch: &[SeqInput<'_>]) -> Result<()> {
        if self.links.is_empty() {
            return Ok(());
        }
        self.check()?;
        let seqs: Arc<Vec<OwnedSeq>> = Arc::new(
            batch
                .iter()
                .map(|s| OwnedSeq {
                    tokens: s.tokens.to_vec(),
                    start_pos: s.start_pos,
                    kv_slots: s.kv_slots.to_vec(),
                    num_logits: s.num_logits,
                    prompt: s.prompt,
                })
                .collect(),
        );
        self.send(|| Cmd::Run(seqs.clone()))
    }

    pub fn skip_all_reduce(&self, on: bool) -> Result<()> {
        self.send(|| Cmd::SkipAllReduce(on))
    }

    pub fn decode_form(
        &self,
        gemv: bool,
        fuse_norm: bool,
        fuse_attn: bool,
        pdl: bool,
    ) -> Result<()> {
        self.send(|| Cmd::DecodeForm(gemv, fuse_norm, fuse_attn, pdl))
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        // Closing the channels ends the workers' loops once their queued passes are done.
        let handles: Vec<JoinHandle<()>> = self
            .links
            .drain(..)
            .filter_map(|(tx, h)| {
                drop(tx);
                h
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }
}

/// Loads rank 0 here and ranks 1..size on threads of their own (each reads only its shards of
/// the checkpoint), joins them in one NCCL group, and returns rank 0 with the workers running.
pub(super) fn load_group(model: &Model, opts: &CudaOptions) -> Result<CudaBackend> {
    let size = opts.tensor_parallel.size;
    let gpus = match std::panic::catch_unwind(CudaContext::device_count) {
        Ok(Ok(n)) => usize::try_from(n).unwrap_or(0),
        Ok(Err(e)) => return Err(EngineError::from(BackendError::NoDevice(e))),
        Err(_) => {
            return Err(EngineError::from(BackendError::Unsupported(
                "no CUDA driver library (libcuda) on this machine".into(),
            )));
        }
    };
    if gpus < size {
        return Err(EngineError::InvalidArgument(format!(
            "--tp-size {size} needs {size} GPUs; the driver sees {gpus} (check CUDA_VISIBLE_DEVICES and the pod's nvidia.com/gpu limit)"
        )));
    }
    nccl::available().map_err(|e| EngineError::from(BackendError::Nccl(e)))?;
    let version = nccl::version().map_err(|e| EngineError::from(BackendError::Nccl(e)))?;
    tracing::info!("tensor parallel: {size} ranks on GPUs 0..{size}, NCCL {version}");
    let id = UniqueId::new().map_err(|e| EngineError::from(BackendError::Nccl(e)))?;
    let join = Join::new(id, size);
    let t0 = Instant::now();
    let (first, rest) = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..size)
            .map(|rank| {
                let join = &join;
                std::thread::Builder::new()
                    .name(format!("tp-load-{rank}"))
                    .spawn_scoped(scope, move || {
                        CudaBackend::load_rank(model, opts, rank, Some(join))
                    })
            })
            .collect();
        let first = CudaBackend::load_rank(model, opts, 0, Some(&join));
        let rest: Vec<Result<CudaBackend>> = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(EngineError::Internal(
                        "a rank panicked while loading".into(),
                    ))
                }),
                Err(e) => Err(EngineError::Internal(format!("rank thread: {e}"))),
            })
            .collect();
        (first, rest)
    });
    let mut rank0 = first?;
    let mut workers = Vec::with_capacity(size - 1);
    for r in rest {
        workers.push(r?);
    }
    tracing::info!(
        "tensor parallel: {size} ranks loaded in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let failure = Arc::new(Failure::default());
    let mut links = Vec::with_capacity(workers.len());
    for (i, b) in workers.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        let f = failure.clone();
        let h = std::thread::Builder::new()
            .name(format!("tp-rank-{}", i + 1))
            .spawn(move || worker(b, rx, f))
            .map_err(|e| EngineError::Internal(format!("rank thread: {e}")))?;
        links.push((tx, Some(h)));
    }
    rank0.peers = Peers { links, failure };
    Ok(rank0)
}

/// A worker rank: runs each pass rank 0 hands it until the channel closes or a pass fails.
fn worker(mut b: CudaBackend, rx: mpsc::Receiver<Cmd>, failure: Arc<Failure>) {
    let rank = b.rank();
    let mut inflight: std::collections::VecDeque<CudaEvent> = Default::default();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
        // cuBLASLt and the raw driver calls launch into the thread's current context.
        b.ctx.bind_to_thread().map_err(cuda_err)?;
        while let Ok(cmd) = rx.recv() {
            match cmd {
                Cmd::Run(seqs) => {
                    // The staging arena of the pass two back is reused: wait for that pass.
                    if inflight.len() >= 2
                        && let Some(e) = inflight.pop_front()
                    {
                        e.synchronize().map_err(cuda_err)?;
                    }
                    b.staging.flip();
                    let batch: Vec<SeqInput<'_>> = seqs
                        .iter()
                        .map(|s| SeqInput {
                            tokens: &s.tokens,
                            start_pos: s.start_pos,
                            kv_slots: &s.kv_slots,
                            num_logits: s.num_logits,
                            prompt: s.prompt,
                        })
                        .collect();
                    b.run(&batch)?;
                    inflight.push_back(b.stream.record_event(None).map_err(cuda_err)?);
                }
                Cmd::DecodeForm(gemv, norm, attn, pdl) => {
                    b.set_decode_form(gemv, norm, attn, pdl)?;
                }
                Cmd::SkipAllReduce(on) => b.set_skip_all_reduce(on)?,
            }
        }
        b.stream.synchronize().map_err(cuda_err)?;
        Ok(())
    }));
    let why = match r {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "panicked".to_string(),
    };
    tracing::error!("tensor parallel rank {rank}: {why}");
    failure.set(format!("rank {rank}: {why}"));
    if let Some(c) = &b.comm {
        c.abort();
    }
}

impl CudaBackend {
    /// This backend's rank in its tensor-parallel group (0 without one).
    pub fn rank(&self) -> usize {
        self.comm.as_ref().map_or(0, |c| c.rank())
    }

    /// Waits for `event`; with workers, polls it so that a worker's failure ends the wait
    /// (after aborting this rank's communicator) instead of hanging on a collective.
    pub(super) fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        if self.peers.is_empty() {
            return event.synchronize().map_err(cuda_err);
        }
        let start = Instant::now();
        loop {
            if event.try_is_complete().map_err(cuda_err)? {
                return Ok(());
            }
            if let Err(e) = self.peers.check() {
                if let Some(c) = &self.comm {
                    c.abort();
                }
                return Err(e);
            }
            if start.elapsed() < Duration::from_millis(2) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Waits for everything queued on the stream (see [`CudaBackend::wait_event`]).
    pub(super) fn wait_stream(&self) -> Result<()> {
        if self.peers.is_empty() {
            return self.stream.synchronize().map_err(cuda_err);
        }
        let e = self.stream.record_event(None).map_err(cuda_err)?;
        self.wait_event(&e)
    }
}
