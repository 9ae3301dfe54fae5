//! Admission: which submitted requests may wait for the scheduler, and which are refused at
//! once (429 at the hard bounds, 503 when they would not start before the queue deadline).
//!
//! A waiting request is one submitted whose first event has not come yet, counted here at
//! submission (the scheduler's own queue counter lags behind a burst, so a bound on it alone
//! is soft). Two hard bounds answer 429 (count and prompt tokens). Beyond them, a request
//! that would not start before the queue deadline is answered 503 at once instead of after
//! waiting the whole deadline: by Little's law its wait is about (requests waiting ahead of
//! it) / (the rate at which waiting requests start). That rate is measured by [`StartRate`].
//!
//! The engine can slow down while requests wait (other processes take its CPU, longer
//! requests fill the batch). Two rules keep that from turning into requests that wait out
//! the deadline:
//!
//! - The rate reacts within seconds to a fall: it is the lower of a slow average (20 s) and a
//!   fast one (about one request's run time, 5 s at least) of the starts (see
//!   [`StartRate`]), so that arrivals stop being admitted at the old speed as soon as the
//!   starts slow down.
//! - A request already waiting is refused as soon as its predicted start is past its
//!   deadline (its age + the requests still ahead of it / the rate): what was admitted at the
//!   old speed gets its 503 then, not at the deadline, and leaves its place to requests that
//!   can still be served in time (see [`Admission::shed_late`]).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::ServerArgs;
use crate::error::{EngineError, Result, RetryAfter};
use crate::metrics::Metrics;

use super::ModelInfo;

/// The bounds and the estimate of the waiting requests (see the module's doc).
pub(super) struct Admission {
    /// Most waiting requests.
    pub(super) max_requests: usize,
    /// Most prompt tokens of all waiting requests (one request alone always fits).
    pub(super) max_tokens: usize,
    /// How long a request may wait for its first event; `None`: as long as it takes.
    pub(super) timeout: Option<Duration>,
    /// `--max-running-requests` as the model settled it.
    max_running: usize,
    queue: Mutex<WaitingQueue>,
    metrics: Arc<Metrics>,
}

/// A request's place among the waiting ones, from [`Admission::enter`].
pub(super) struct Ticket {
    /// Its rank in arrival order (the estimate assumes requests start in this order).
    pub(super) seq: u64,
    /// Set if the admission refuses it while it waits.
    pub(super) shed: Arc<Shed>,
}

/// The refusal of a request that was admitted but would not start before its deadline: the
/// 503's message and `Retry-After`, and a wake-up for the request's stream.
#[derive(Default)]
pub(super) struct Shed {
    refusal: OnceLock<(String, RetryAfter)>,
    notify: Notify,
}

impl Shed {
    fn refuse(&self, message: String, retry_after: RetryAfter) {
        if self.refusal.set((message, retry_after)).is_ok() {
            // Keeps a permit if the stream is not waiting right now.
            self.notify.notify_one();
        }
    }

    /// Waits until the request is refused; its message and `Retry-After`.
    pub(super) async fn refused(&self) -> (String, RetryAfter) {
        loop {
            if let Some(r) = self.refusal.get() {
                return r.clone();
            }
            self.notify.notified().await;
        }
    }
}

/// The waiting requests and how fast they leave, under one lock so that the rate's clock
/// sees every change of the count.
struct WaitingQueue {
    /// By arrival rank.
    entries: BTreeMap<u64, Entry>,
    tokens: usize,
    next_seq: u64,
    rate: StartRate,
    /// When [`Admission::shed_late`] last checked the waiting requests.
    shed_checked: Instant,
}

struct Entry {
    tokens: usize,
    since: Instant,
    shed: Arc<Shed>,
}

/// Requests that a full engine starts per second, measured over time when requests waited
/// and the scheduler was full (a request it could not start, or every running slot taken).
///
/// The clock runs only then. Idle time says nothing about how fast the engine starts
/// requests (a quiet minute would otherwise read as a slow engine and refuse the next burst),
/// and neither does time with free slots, when a request starts right after its prefill (a
/// batch filling up would read as a fast engine and admit far too many behind it). A full
/// engine starts a request each time the batch frees a slot, which is what a waiting request
/// waits for, and only a full engine has the estimate applied (see [`Admission::enter`]).
///
/// Two exponentially weighted averages of the same starts: over [`RATE_WINDOW`] (steady, but
/// after a fall in speed it reads the old speed for tens of seconds: by then a deadline's
/// worth of requests is admitted that the slower engine cannot start in time) and over
/// about one request's run time, `batch / rate` by Little's law, within [`FAST_RATE_WINDOW`]
/// and [`RATE_WINDOW`] (follows a fall within seconds, but noisy: the batch frees slots in
/// bunches, and requests that started together finish together, so that a window shorter
/// than a run can see no start at all). A request is admitted by the lower of the two
/// ([`StartRate::per_sec`]): reading a rate too low only refuses more arrivals while the
/// queue still holds work for most of the deadline, so the engine keeps its pace; reading it
/// too high admits requests that then miss the deadline. When the engine speeds up again,
/// the slow average lags upwards, which shortens the queue for a while but, the queue being
/// longer than the speed-up takes to drain, costs no throughput. A waiting request is
/// refused by the higher of the two ([`StartRate::shed_per_sec`]).
struct StartRate {
    slow: Average,
    fast: Average,
    /// Requests that run at once (`--max-running-requests`): by Little's law, a request runs
    /// for about `batch / rate` seconds.
    batch: f64,
    /// Starts seen since the process started (fewer than [`MIN_STARTS`]: no estimate).
    seen: u64,
    /// When the averages were last brought up to date.
    updated: Instant,
}

/// Starts and seconds of waiting time, each weighted by exp(-age / window).
struct Average {
    window: f64,
    starts: f64,
    waited: f64,
}

/// Time constant of [`StartRate`]'s slow average (waiting time, not wall time).
const RATE_WINDOW: f64 = 20.0;
/// Shortest time constant of its fast average (which is about one request's run time): a
/// fall in speed shows within a few seconds.
const FAST_RATE_WINDOW: f64 = 5.0;
/// Starts of a full engine measured before the rate is trusted; until then only the hard
/// bounds apply.
const MIN_STARTS: u64 = 4;
/// A request whose estimated wait is past this fraction of the deadline is refused at once:
/// the estimate is a mean, and the margin keeps most accepted requests clear of the deadline
/// despite its spread (Poisson arrivals, the batch freeing slots in bunches). A request that
/// already waits is refused only once its predicted start is past the whole deadline; the
/// band between the two keeps the noise of the rate from refusing what it just admitted.
const SHED_AT: f64 = 0.75;
/// How often the waiting requests are checked for ones that would miss their deadline.
const SHED_CHECK_EVERY: Duration = Duration::from_millis(100);
/// Fewest requests the default bound lets wait.
const MIN_QUEUE: usize = 64;

impl Average {
    fn new(window: f64) -> Average {
        Average {
            window,
            starts: 0.0,
            waited: 0.0,
        }
    }

    /// Adds `dt` seconds of waiting time.
    fn advance(&mut self, dt: f64) {
        let keep = (-dt / self.window).exp();
        self.starts *= keep;
        // The weighted integral of the waiting time over the last dt seconds.
        self.waited = self.waited * keep + self.window * (1.0 - keep);
    }

    fn per_sec(&self) -> Option<f64> {
        (self.waited > 0.0).then(|| self.starts / self.waited)
    }
}

impl StartRate {
    fn new(now: Instant, batch: usize) -> StartRate {
        StartRate {
            slow: Average::new(RATE_WINDOW),
            fast: Average::new(FAST_RATE_WINDOW),
            batch: batch as f64,
            seen: 0,
            updated: now,
        }
    }

    /// Brings the averages up to `now`; `counts` says whether the time since the last update
    /// was full and had requests waiting (the count changes only under the queue's lock,
    /// which calls this first; fullness is the scheduler's last report).
    fn advance(&mut self, now: Instant, counts: bool) {
        let dt = now.saturating_duration_since(self.updated).as_secs_f64();
        self.updated = self.updated.max(now);
        if counts && dt > 0.0 {
            if let Some(slow) = self.slow.per_sec()
                && slow > 0.0
            {
                self.fast.window = (self.batch / slow).clamp(FAST_RATE_WINDOW, RATE_WINDOW);
            }
            self.slow.advance(dt);
            self.fast.advance(dt);
        }
    }

    fn started(&mut self) {
        self.slow.starts += 1.0;
        self.fast.starts += 1.0;
        self.seen += 1;
    }

    /// Starts per second for admitting a request: the lower average; `None` until enough
    /// were measured.
    fn per_sec(&self) -> Option<f64> {
        let (slow, fast) = self.both()?;
        Some(slow.min(fast))
    }

    /// Starts per second for refusing a request that already waits: the higher average, so
    /// that it is refused only when both say it would miss. The rate of a busy machine
    /// swings for seconds at a time (a dip of the fast average, a gap between bunches of
    /// starts) and comes back: a dip refuses arrivals for a moment, which costs nothing while
    /// the queue holds most of a deadline's work, but it must not refuse requests admitted a
    /// moment before, which the engine would serve. (Capping this at the fast average plus
    /// three standard deviations of its Poisson noise refused the tail of a sudden fall
    /// sooner in the simulation, but on the CPU model, under other processes' load, it
    /// refused 318 waiting requests where the 20 s average alone let 78 wait out the
    /// deadline: the dips are the machine's, not the count's noise.) After a lasting fall
    /// the slow average comes down within tens of seconds, well inside the deadline.
    fn shed_per_sec(&self) -> Option<f64> {
        let (slow, fast) = self.both()?;
        Some(slow.max(fast))
    }

    fn both(&self) -> Option<(f64, f64)> {
        if self.seen < MIN_STARTS {
            return None;
        }
        Some((self.slow.per_sec()?, self.fast.per_sec()?))
    }
}

impl WaitingQueue {
    fn requests(&self) -> usize {
        self.entries.len()
    }

    /// Expected wait of a request that arrives now behind `self.requests()` others: `None`
    /// when nothing is measured yet, zero when none wait.
    fn expected_wait(&self) -> Option<f64> {
        wait_behind(self.requests(), self.rate.per_sec())
    }

    /// `Retry-After` for a request refused now: the wait of one arriving now (by then the
    /// requests ahead have started), or `default` before the rate is measured.
    fn retry_after(&self, default: RetryAfter) -> RetryAfter {
        self.expected_wait().map_or(default, RetryAfter::from_wait)
    }
}

/// The wait behind `ahead` requests at `rate` starts per second (`None`: not measured).
fn wait_behind(ahead: usize, rate: Option<f64>) -> Option<f64> {
    if ahead == 0 {
        return Some(0.0);
    }
    let rate = rate?;
    Some(if rate > 0.0 {
        ahead as f64 / rate
    } else {
        f64::INFINITY
    })
}

impl Admission {
    /// `--max-queued-requests N` bounds the count alone. Without it the bound follows the KV
    /// cache: waiting prompts may hold up to twice the cache's tokens (more would wait through
    /// several turnovers of the cache), and at most 4 × `--max-running-requests` of them (64
    /// at least, for a client's burst).
    pub(super) fn new(args: &ServerArgs, info: &ModelInfo, metrics: Arc<Metrics>) -> Admission {
        let (max_requests, max_tokens) = match args.max_queued_requests {
            Some(n) => (n, usize::MAX),
            None => (
                (4 * info.max_running_requests).max(MIN_QUEUE),
                2 * info.max_total_tokens.max(1),
            ),
        };
        let timeout =
            (args.queue_timeout_secs > 0).then(|| Duration::from_secs(args.queue_timeout_secs));
        Admission::with_bounds(
            max_requests,
            max_tokens,
            timeout,
            info.max_running_requests,
            metrics,
            Instant::now(),
        )
    }

    fn with_bounds(
        max_requests: usize,
        max_tokens: usize,
        timeout: Option<Duration>,
        max_running: usize,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> Admission {
        Admission {
            max_requests,
            max_tokens,
            timeout,
            max_running: max_running.max(1),
            queue: Mutex::new(WaitingQueue {
                entries: BTreeMap::new(),
                tokens: 0,
                next_seq: 0,
                rate: StartRate::new(now, max_running.max(1)),
                shed_checked: now,
            }),
            metrics,
        }
    }

    /// Whether the estimate applies: the scheduler last reported a request it could not start
    /// or every running slot taken (`scheduler_full`), or more requests wait than can run at
    /// once (a burst gets there before the scheduler reports). Before that, whatever arrives
    /// starts in the next steps, however slow the measured rate (it may come from long
    /// requests of an earlier burst).
    fn armed(&self, q: &WaitingQueue, scheduler_full: bool) -> bool {
        scheduler_full || q.requests() >= self.max_running
    }

    /// Takes a place at `now` for a request of `tokens` prompt tokens, or says why there is
    /// none. The estimate refuses nothing while the engine has room for what arrives (see
    /// [`Admission::armed`]).
    pub(super) fn enter(
        &self,
        now: Instant,
        tokens: usize,
        scheduler_full: bool,
    ) -> Result<Ticket> {
        let mut q = self.queue.lock();
        let counts = q.requests() > 0 && scheduler_full;
        q.rate.advance(now, counts);
        if self.armed(&q, scheduler_full) {
            self.shed_late(&mut q, now);
        }
        if q.requests() >= self.max_requests {
            return Err(EngineError::Overloaded {
                message: format!(
                    "too many waiting requests ({}, --max-queued-requests); retry later",
                    self.max_requests
                ),
                retry_after: q.retry_after(RetryAfter::OVERLOADED),
            });
        }
        if q.requests() > 0 && q.tokens.saturating_add(tokens) > self.max_tokens {
            return Err(EngineError::Overloaded {
                message: format!(
                    "the waiting requests already hold {} prompt tokens (bound: {}, twice the \
                     KV cache); retry later",
                    q.tokens, self.max_tokens
                ),
                retry_after: q.retry_after(RetryAfter::OVERLOADED),
            });
        }
        if let Some(timeout) = self.timeout
            && self.armed(&q, scheduler_full)
            && let Some(wait) = q.expected_wait()
            && wait > SHED_AT * timeout.as_secs_f64()
        {
            self.publish(&q);
            return Err(EngineError::Unavailable {
                message: format!(
                    "the request would wait about {wait:.0} s before it starts ({} requests \
                     ahead, starting at {:.2}/s), past --queue-timeout-secs {}; retry later",
                    q.requests(),
                    q.rate.per_sec().unwrap_or(0.0),
                    timeout.as_secs()
                ),
                retry_after: RetryAfter::from_wait(wait),
            });
        }
        let seq = q.next_seq;
        q.next_seq += 1;
        let shed = Arc::new(Shed::default());
        q.entries.insert(
            seq,
            Entry {
                tokens,
                since: now,
                shed: shed.clone(),
            },
        );
        q.tokens += tokens;
        self.publish(&q);
        Ok(Ticket { seq, shed })
    }

    /// Gives back at `now` the place of request `seq` (nothing if it was refused while it
    /// waited); `started`: it left because it started running; `scheduler_full` as for
    /// [`Admission::armed`].
    pub(super) fn leave(&self, now: Instant, seq: u64, started: bool, scheduler_full: bool) {
        let mut q = self.queue.lock();
        let counts = q.requests() > 0 && scheduler_full;
        q.rate.advance(now, counts);
        if started && scheduler_full {
            q.rate.started();
        }
        if let Some(e) = q.entries.remove(&seq) {
            q.tokens = q.tokens.saturating_sub(e.tokens);
        }
        if self.armed(&q, scheduler_full) {
            self.shed_late(&mut q, now);
        }
        self.publish(&q);
    }

    /// Refuses the waiting requests whose predicted start is past their deadline: the
    /// request with `ahead` requests still waiting before it, which has waited `w`, starts
    /// in about `w + ahead / rate`. The oldest (none ahead) is refused here only once past
    /// its deadline, which its stream's timer answers anyway. Every waiting request is
    /// checked, at most every [`SHED_CHECK_EVERY`]: after a fall in speed the ones that miss
    /// are those admitted at the old speed, and requests admitted since, behind them, can
    /// fit.
    ///
    /// A request admitted at the old speed before the engine slowed down gets its 503 as
    /// soon as the rate shows it would miss, instead of at the deadline, and no longer counts
    /// ahead of the arrivals, which are then admitted as far as the slower engine can start
    /// them in time.
    fn shed_late(&self, q: &mut WaitingQueue, now: Instant) {
        let (Some(timeout), Some(rate)) = (self.timeout, q.rate.shed_per_sec()) else {
            return;
        };
        if now.saturating_duration_since(q.shed_checked) < SHED_CHECK_EVERY {
            return;
        }
        q.shed_checked = now;
        let deadline = timeout.as_secs_f64();
        let mut ahead = 0usize;
        let mut late = Vec::new();
        for (&seq, e) in &q.entries {
            let waited = now.saturating_duration_since(e.since).as_secs_f64();
            let more = wait_behind(ahead, Some(rate)).unwrap_or(0.0);
            if waited + more > deadline {
                late.push((seq, waited, ahead, more));
            } else {
                ahead += 1;
            }
        }
        for (seq, waited, ahead, more) in late {
            let Some(e) = q.entries.remove(&seq) else {
                continue;
            };
            q.tokens = q.tokens.saturating_sub(e.tokens);
            let message = format!(
                "the request waited {waited:.1} s in the queue; with {ahead} requests ahead of \
                 it, starting at {rate:.2}/s, it would start only in about {more:.0} s, past \
                 --queue-timeout-secs {}; retry later",
                timeout.as_secs()
            );
            e.shed
                .refuse(message, q.retry_after(RetryAfter::UNAVAILABLE));
        }
    }

    /// `Retry-After` for a request refused now (see [`WaitingQueue::retry_after`]).
    pub(super) fn retry_after(&self, default: RetryAfter) -> RetryAfter {
        self.queue.lock().retry_after(default)
    }

    /// The estimated wait of a request arriving now, as a metric (0 while none is measured).
    fn publish(&self, q: &WaitingQueue) {
        self.metrics
            .estimated_queue_time
            .with_label_values(&self.metrics.label())
            .set(q.expected_wait().unwrap_or(0.0));
    }
}

#[cfg(test)]
mod tests;
