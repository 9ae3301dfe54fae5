//! A small persistent thread pool for the kernels.
//!
//! The model calls a kernel a few hundred times per decode step, each call lasting tens of
//! microseconds, so spawning threads per call (tens of microseconds each) would cost as much as
//! the work. Workers here wait for the next job by spinning briefly (a job usually follows within
//! microseconds during a forward pass), then park until woken. A job is a borrowed closure and a
//! task count; the caller and the workers take task indices from a shared counter, so a worker
//! that the OS descheduled only delays its current task.
//!
//! One job runs at a time. A call made while the pool is busy (from another thread, or from
//! inside a task) runs its tasks serially on the calling thread instead of waiting.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Upper bound on threads (caller included).
const MAX_THREADS: usize = 256;
/// How long an idle worker spins before it parks.
const SPIN_FOR: Duration = Duration::from_micros(200);

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
        0 => thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(MAX_THREADS),
        n => n,
    }
}

/// Runs `f(i)` for every `i in 0..n_tasks` on the pool (the calling thread helps) and returns
/// when all are done. Tasks may run in any order and concurrently. A panic in a task is
/// re-raised on the caller after all tasks have stopped.
pub fn parallel_for<F: Fn(usize) + Sync>(n_tasks: usize, f: F) {
    let threads = num_threads().min(n_tasks);
    if threads <= 1 || IN_POOL.with(Cell::get) {
        (0..n_tasks).for_each(f);
        return;
    }
    let pool = pool();
    let Ok(mut workers) = pool.dispatch.try_lock() else {
        // Busy with another caller's job: do this one here rather than wait.
        (0..n_tasks).for_each(f);
        return;
    };
    let epoch = pool.epoch.load(Ordering::Relaxed);
    while workers.len() < threads - 1 {
        let index = workers.len();
        match spawn_worker(pool, index, epoch) {
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
        pending: AtomicUsize::new(helpers),
        panic: Mutex::new(None),
    };
    pool.job.store(&job as *const Job as *mut Job, Ordering::SeqCst);
    let generation = (epoch >> 16) + 1;
    pool.epoch
        .store((generation << 16) | helpers as u64, Ordering::SeqCst);
    for (worker, thread) in workers.iter().take(helpers).enumerate() {
        if pool.sleeping[worker].load(Ordering::SeqCst) {
            thread.unpark();
        }
    }

    IN_POOL.with(|c| c.set(true));
    job.run_tasks();
    IN_POOL.with(|c| c.set(false));

    // The job lives on this stack frame: wait until no helper can touch it any more.
    let mut spins = 0u32;
    while job.pending.load(Ordering::Acquire) != 0 {
        spins += 1;
        if spins < 1 << 14 {
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
    pool.job.store(std::ptr::null_mut(), Ordering::Relaxed);
    drop(workers);
    let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

struct Pool {
    /// `generation << 16 | helpers`: bumped once per job; workers `0..helpers` take part.
    epoch: AtomicU64,
    /// The current job; valid while its participants have not all finished.
    job: AtomicPtr<Job>,
    /// Per worker: parked (or about to park) and needs an unpark.
    sleeping: Vec<AtomicBool>,
    /// Held by the thread dispatching a job; holds the workers' handles.
    dispatch: Mutex<Vec<Thread>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        epoch: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        sleeping: (0..MAX_THREADS).map(|_| AtomicBool::new(false)).collect(),
        dispatch: Mutex::new(Vec::new()),
    })
}

/// Starts worker `index`; `epoch` is the last epoch published before it exists.
fn spawn_worker(pool: &'static Pool, index: usize, epoch: u64) -> Option<Thread> {
    let handle = thread::Builder::new()
        .name(format!("sgl-kernel-{index}"))
        .spawn(move || worker_loop(pool, index, epoch))
        .ok()?;
    Some(handle.thread().clone())
}

struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize),
    n_tasks: usize,
    next: AtomicUsize,
    /// Helpers that have not finished yet.
    pending: AtomicUsize,
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
    fn run_tasks(&self) {
        let result = catch_unwind(AssertUnwindSafe(|| {
            loop {
                let i = self.next.fetch_add(1, Ordering::Relaxed);
                if i >= self.n_tasks {
                    break;
                }
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
    }
}

fn worker_loop(pool: &'static Pool, index: usize, mut seen: u64) {
    IN_POOL.with(|c| c.set(true));
    loop {
        let epoch = wait_for_new_epoch(pool, index, seen);
        seen = epoch;
        let helpers = (epoch & 0xffff) as usize;
        if index >= helpers {
            continue;
        }
        let job = pool.job.load(Ordering::Acquire);
        // SAFETY: the dispatcher stored a pointer to a live job before publishing this epoch
        // (SeqCst store, Acquire/SeqCst load above) and keeps the job alive until every one of
        // the `helpers` workers, this one included, has decremented `pending` below.
        let job = unsafe { &*job };
        job.run_tasks();
        job.pending.fetch_sub(1, Ordering::Release);
    }
}

fn wait_for_new_epoch(pool: &Pool, index: usize, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let epoch = pool.epoch.load(Ordering::Acquire);
        if epoch != seen {
            return epoch;
        }
        spins = spins.wrapping_add(1);
        if spins % 256 != 0 || start.elapsed() < SPIN_FOR {
            std::hint::spin_loop();
            continue;
        }
        // Park: announce it, then re-check so a dispatcher either sees the flag or we see its
        // epoch (both SeqCst).
        pool.sleeping[index].store(true, Ordering::SeqCst);
        loop {
            let epoch = pool.epoch.load(Ordering::SeqCst);
            if epoch != seen {
                pool.sleeping[index].store(false, Ordering::SeqCst);
                return epoch;
            }
            thread::park();
        }
    }
}
