//! A small persistent thread pool for the kernels.
//!
//! The model calls a kernel a few hundred times per decode step, each call lasting tens of
//! microseconds, so spawning threads per call (tens of microseconds each) would cost as much as
//! the work. Workers here wait for the next job by spinning briefly (a job usually follows within
//! microseconds during a forward pass), then park until woken. A job is a borrowed closure and a
//! task count; the caller and the workers take task indices from a shared counter. A worker
//! joins a job before touching it and the caller closes the job once it has run out of tasks,
//! so a worker the OS descheduled (2 shared cores) delays at most the task it is running,
//! never a job it has not joined.
//!
//! One job runs at a time. A call made while the pool is busy (from another thread, or from
//! inside a task) runs its tasks serially on the calling thread instead of waiting.

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Upper bound on threads (caller included).
const MAX_THREADS: usize = 256;
/// How long an idle worker spins before it parks.
const SPIN_FOR: Duration = Duration::from_micros(200);

/// Jobs a helper joined, per verdict on whether helping pays (see [`Ledger`]).
const WINDOW_JOBS: u32 = 64;
/// This many jobs in a row that no helper joined (the caller ran out of tasks first), though
/// none had to be woken for them, mean the helpers are not getting CPU time: the cores are
/// oversubscribed, and a helper spinning for work only takes CPU time from the caller.
const MAX_MISSES: u32 = 16;
/// Jobs shorter than this (the caller's share) are not counted as misses.
const MISS_MIN_WORK: Duration = Duration::from_micros(10);
/// Consecutive jobs no helper joined.
static MISSES: AtomicU32 = AtomicU32::new(0);
/// When helping stops paying (or too many misses), jobs run on the calling thread alone for
/// this long, then helpers are tried again. On cores busy with other work a helper that the
/// OS preempts holds its task for a whole time slice (milliseconds), which costs more than the
/// parallelism gains.
const BACKOFF: Duration = Duration::from_millis(100);

/// What the helpers were worth over the current window of jobs, kept by the dispatching thread
/// (one at a time: it holds the dispatch lock). Each job a helper joined adds the time the
/// helpers' tasks would have cost the caller (their count × the caller's average task) and
/// subtracts the time the caller waited for helpers after running out of tasks. A helper the OS
/// preempts mid-task shows up as a long wait; an occasional one (a client thread or the HTTP
/// runtime taking a core for a moment) costs far less than the helpers save, and only a window
/// where the waits outweigh the help means the cores are oversubscribed.
struct Ledger {
    /// Nanoseconds saved minus nanoseconds waited, this window.
    net_ns: AtomicI64,
    /// Jobs a helper joined, this window.
    jobs: AtomicU32,
}

static LEDGER: Ledger = Ledger {
    net_ns: AtomicI64::new(0),
    jobs: AtomicU32::new(0),
};

impl Ledger {
    /// Records one job a helper joined; returns true when a window just closed with the
    /// helpers costing more than they saved.
    fn record(&self, saved: Duration, waited: Duration) -> bool {
        let net = self.net_ns.load(Ordering::Relaxed) + saved.as_nanos() as i64
            - waited.as_nanos() as i64;
        let jobs = self.jobs.load(Ordering::Relaxed) + 1;
        if jobs < WINDOW_JOBS {
            self.net_ns.store(net, Ordering::Relaxed);
            self.jobs.store(jobs, Ordering::Relaxed);
            return false;
        }
        self.reset();
        net < 0
    }

    fn reset(&self) {
        self.net_ns.store(0, Ordering::Relaxed);
        self.jobs.store(0, Ordering::Relaxed);
    }
}

/// Configured thread count; 0 = not set yet (use available parallelism).
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set while this thread runs pool tasks; nested calls then run serially.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// Sets how many threads (the caller included) kernels use. Clamped to 1..=256.
pub fn set_num_threads(n: usize) {
    THREADS.store(n.clamp(1, MAX_THREADS), Ordering::Relaxed);
}

/// Threads (the caller included) kernels use: [`set_num_threads`], else the available parallelism.
pub fn num_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => {
            // `available_parallelism` reads cgroup files on every call: ask once.
            let n = thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(MAX_THREADS);
            THREADS.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Runs `f(i)` for every `i in 0..n_tasks` on the pool (the calling thread helps) and returns
/// when all are done. Tasks may run in any order and concurrently. A panic in a task is
/// re-raised on the caller after all tasks have stopped.
pub fn parallel_for<F: Fn(usize) + Sync>(n_tasks: usize, f: F) {
    let threads = num_threads().min(n_tasks);
    if threads <= 1 || IN_POOL.with(Cell::get) || backing_off() {
        (0..n_tasks).for_each(f);
        return;
    }
    let pool = pool();
    let Ok(mut workers) = pool.dispatch.try_lock() else {
        // Busy with another caller's job: do this one here rather than wait.
        (0..n_tasks).for_each(f);
        return;
    };
    let generation = pool.state.load(Ordering::Relaxed) >> 32;
    while workers.len() < threads - 1 {
        let index = workers.len();
        match spawn_worker(pool, index, generation) {
            Some(handle) => workers.push(handle),
            None => break,
        }
    }
    let helpers = workers.len().min(threads - 1);
    if helpers == 0 {
        (0..n_tasks).for_each(f);
        return;
    }

    let job = Job {
        data: &f as *const F as *const (),
        call: call_task::<F>,
        n_tasks,
        next: AtomicUsize::new(0),
        joined: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    pool.job
        .store(&job as *const Job as *mut Job, Ordering::SeqCst);
    pool.helpers.store(helpers, Ordering::SeqCst);
    let generation = (pool.state.load(Ordering::Relaxed) >> 32) + 1;
    pool.state
        .store((generation << 32) | OPEN, Ordering::SeqCst);
    // Whether a helper had to be woken: it may then legitimately miss the job.
    let mut woke = false;
    for (worker, thread) in workers.iter().take(helpers).enumerate() {
        if pool.sleeping[worker].load(Ordering::SeqCst) {
            thread.unpark();
            woke = true;
        }
    }

    let started = Instant::now();
    IN_POOL.with(|c| c.set(true));
    let own_tasks = job.run_tasks();
    IN_POOL.with(|c| c.set(false));
    let own_work = started.elapsed();

    // Close the job to late helpers (a descheduled worker must not hold us up), then wait
    // for those that joined: the job lives on this stack frame.
    pool.state.fetch_and(!OPEN, Ordering::AcqRel);
    let mut spins = 0u32;
    while pool.state.load(Ordering::Acquire) & JOINED != 0 {
        spins += 1;
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
    let waited = started.elapsed() - own_work;
    let joined = job.joined.load(Ordering::Relaxed) != 0;
    let misses = if joined {
        MISSES.store(0, Ordering::Relaxed);
        0
    } else if own_work > MISS_MIN_WORK && !woke {
        MISSES.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        // Too short to tell, or a helper was parked: a just-woken helper may legitimately
        // miss it.
        0
    };
    // The helpers' tasks, at the caller's average task time, are what running the job alone
    // would have added (no estimate when the helpers took every task).
    let helped = n_tasks.saturating_sub(own_tasks) as u32;
    let saved = own_work / own_tasks.max(1) as u32 * helped;
    let losing = joined && own_tasks > 0 && LEDGER.record(saved, waited);
    if losing || misses >= MAX_MISSES {
        MISSES.store(0, Ordering::Relaxed);
        LEDGER.reset();
        start_backoff();
    }
    pool.job.store(std::ptr::null_mut(), Ordering::Relaxed);
    drop(workers);
    let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// `Pool::state` bit: the current job accepts helpers.
const OPEN: u64 = 1 << 31;
/// `Pool::state` bits: helpers inside the current job.
const JOINED: u64 = OPEN - 1;

/// Runs `f(i, chunk)` for each `chunk_len`-element chunk of `data` (the last may be shorter),
/// `i` being the chunk index, on the pool: a safe way for tasks to write disjoint outputs.
pub fn parallel_chunks_mut<T: Send, F: Fn(usize, &mut [T]) + Sync>(
    data: &mut [T],
    chunk_len: usize,
    f: F,
) {
    assert!(
        chunk_len > 0,
        "parallel_chunks_mut: chunk_len must be positive"
    );
    let len = data.len();
    let base = SharedMut::new(data);
    parallel_for(len.div_ceil(chunk_len), |i| {
        let start = i * chunk_len;
        let n = chunk_len.min(len - start);
        // SAFETY: chunk `i` is `start..start + n`, disjoint from every other chunk, and each
        // index runs once.
        f(i, unsafe { base.slice(start, n) });
    });
}

/// A mutable buffer that the tasks of one pool job write in disjoint ranges, each taking its
/// own with [`SharedMut::slice`]. It borrows the buffer mutably for as long as it lives.
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _buf: PhantomData<&'a mut [T]>,
}

// SAFETY: tasks reach the buffer only through `slice`, whose contract keeps their ranges
// disjoint, and `T: Send` lets another thread write the elements.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    #[inline]
    pub fn new(buf: &'a mut [T]) -> Self {
        SharedMut {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: PhantomData,
        }
    }

    /// The buffer's address, for prefetch hints (reading through it would race the tasks).
    #[inline]
    pub fn as_ptr(&self) -> *const T {
        self.ptr
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `buf[at..at + len]`; panics if that is out of bounds.
    ///
    /// # Safety
    /// No other live slice from this `SharedMut` may overlap the range.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub unsafe fn slice(&self, at: usize, len: usize) -> &mut [T] {
        assert!(
            at <= self.len && len <= self.len - at,
            "shared buffer range {at}..{} out of bounds ({})",
            at + len,
            self.len
        );
        // SAFETY: in bounds (checked above) of a buffer borrowed for `'a`, and exclusive by the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

/// Nanoseconds since `epoch()` until which jobs run serially (see [`BACKOFF`]).
static BACKOFF_UNTIL: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn backing_off() -> bool {
    let until = BACKOFF_UNTIL.load(Ordering::Relaxed);
    until != 0 && (epoch().elapsed().as_nanos() as u64) < until
}

fn start_backoff() {
    let until = (epoch().elapsed() + BACKOFF).as_nanos() as u64;
    BACKOFF_UNTIL.store(until, Ordering::Relaxed);
    tracing::debug!(
        "kernel pool: helpers cost more than they save; running single-threaded for {BACKOFF:?}"
    );
}

struct Pool {
    /// `generation << 32 | OPEN | joined`: the generation is bumped once per job; a worker
    /// joins (increments `joined`, only while `OPEN`) before touching the job and leaves
    /// (decrements) when done with it.
    state: AtomicU64,
    /// Workers `0..helpers` may join the current job.
    helpers: AtomicUsize,
    /// The current job; valid while it is open or has helpers inside.
    job: AtomicPtr<Job>,
    /// Per worker: parked (or about to park) and needs an unpark.
    sleeping: Vec<AtomicBool>,
    /// Held by the thread dispatching a job; holds the workers' handles.
    dispatch: Mutex<Vec<Thread>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: AtomicU64::new(0),
        helpers: AtomicUsize::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        sleeping: (0..MAX_THREADS).map(|_| AtomicBool::new(false)).collect(),
        dispatch: Mutex::new(Vec::new()),
    })
}

/// Starts worker `index`; `generation` is the last one published before it exists.
fn spawn_worker(pool: &'static Pool, index: usize, generation: u64) -> Option<Thread> {
    let handle = thread::Builder::new()
        .name(format!("sgl-kernel-{index}"))
        .spawn(move || worker_loop(pool, index, generation))
        .ok()?;
    Some(handle.thread().clone())
}

struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize),
    n_tasks: usize,
    next: AtomicUsize,
    /// Helpers that joined (for the contention heuristic).
    joined: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Calls the closure behind `data` with task index `i`.
///
/// # Safety
/// `data` must point to a live `F`.
unsafe fn call_task<F: Fn(usize) + Sync>(data: *const (), i: usize) {
    // SAFETY: the caller guarantees `data` came from `&F` and the closure is still alive
    // (`parallel_for` waits for every helper before returning).
    let f = unsafe { &*(data as *const F) };
    f(i);
}

impl Job {
    /// Runs tasks until none are left; returns how many this thread ran.
    fn run_tasks(&self) -> usize {
        let mut ran = 0;
        let result = catch_unwind(AssertUnwindSafe(|| {
            loop {
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                if i >= self.n_tasks {
                    break;
                }
                ran += 1;
                // SAFETY: `data` points to the `F` that `call` was instantiated for, alive until
                // `parallel_for` returns, which waits for this helper.
                unsafe { (self.call)(self.data, i) };
            }
        }));
        if let Err(payload) = result {
            // Stop the other threads taking new tasks, keep the first panic.
            self.next.store(self.n_tasks, Ordering::Relaxed);
            let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(payload);
        }
        ran
    }
}

fn worker_loop(pool: &'static Pool, index: usize, mut seen: u64) {
    IN_POOL.with(|c| c.set(true));
    loop {
        let mut state = wait_for_new_generation(pool, index, seen);
        seen = state >> 32;
        if index >= pool.helpers.load(Ordering::Relaxed) {
            continue;
        }
        // Join unless the dispatcher already closed this job (or started another).
        let joined = loop {
            if state >> 32 != seen || state & OPEN == 0 {
                break false;
            }
            match pool.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break true,
                Err(now) => state = now,
            }
        };
        if !joined {
            continue;
        }
        let job = pool.job.load(Ordering::Acquire);
        // SAFETY: the dispatcher stored a pointer to a live job before opening this generation,
        // and keeps the job alive until no helper is joined (we joined above and leave below).
        let job = unsafe { &*job };
        job.joined.fetch_add(1, Ordering::Relaxed);
        let _ = job.run_tasks();
        pool.state.fetch_sub(1, Ordering::Release);
    }
}

/// Waits until the pool's generation differs from `seen`; returns the new state.
fn wait_for_new_generation(pool: &Pool, index: usize, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let state = pool.state.load(Ordering::Acquire);
        if state >> 32 != seen {
            return state;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(256) || start.elapsed() < SPIN_FOR {
            std::hint::spin_loop();
            continue;
        }
        // Park: announce it, then re-check so a dispatcher either sees the flag or we see its
        // generation (both SeqCst).
        pool.sleeping[index].store(true, Ordering::SeqCst);
        loop {
            let state = pool.state.load(Ordering::SeqCst);
            if state >> 32 != seen {
                pool.sleeping[index].store(false, Ordering::SeqCst);
                return state;
            }
            thread::park();
        }
    }
}
