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

use cudarc::driver::{CudaContext, CudaEvent};
use sgl_kernels::nccl::{self, UniqueId};

use super::{CudaBackend, CudaOptions, cuda_err};
use crate::backend::{BackendError, SeqInput};
use crate::error::{EngineError, Result};
use crate::model::Model;

mod custom_ar;

use custom_ar::EXCHANGE_WORDS;
pub(super) use custom_ar::{CustomAllReduce, OneShot, PeerMemory, PullSet, custom_all_reduce};

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
