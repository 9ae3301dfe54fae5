//! The engine as the HTTP layer sees it: a cloneable [`EngineHandle`] that submits requests to
//! the scheduler thread and reads their token streams back, and [`launch`], which builds one
//! (model, tokenizer, backend, scheduler).

mod launch;

pub use launch::{check, launch};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::config::ServerArgs;
use crate::error::{EngineError, Result, RetryAfter};
use crate::grammar::GrammarBackend;
use crate::metrics::Metrics;
use crate::request::{GenerateRequest, StreamEvent};
use crate::tokenizer::Tokenizer;

/// What the API reports about the served model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_path: String,
    pub served_model_name: String,
    /// Most tokens (prompt + output) of one request.
    pub context_length: usize,
    pub vocab_size: usize,
    /// KV cache size in tokens.
    pub max_total_tokens: usize,
    pub max_running_requests: usize,
    /// Token ids that end generation unless `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    pub architecture: String,
}

/// Live counters the scheduler publishes (also exported as metrics).
#[derive(Debug, Default)]
pub struct SchedulerStats {
    pub num_running_reqs: AtomicUsize,
    pub num_queue_reqs: AtomicUsize,
    pub num_used_tokens: AtomicUsize,
    /// Set false if the scheduler thread exits.
    pub alive: AtomicBool,
    /// Generated tokens since start.
    pub total_generated: AtomicU64,
    /// Cached prompt tokens / prompt tokens since start, for the cache hit rate.
    pub total_prompt_tokens: AtomicU64,
    pub total_cached_tokens: AtomicU64,
}

/// A request on its way to the scheduler.
pub struct PendingRequest {
    /// Internal id, unique for the life of the server (user rids may repeat).
    pub id: u64,
    pub req: GenerateRequest,
    pub events: tmpsc::UnboundedSender<StreamEvent>,
    pub arrival: Instant,
}

pub enum SchedulerMsg {
    Generate(Box<PendingRequest>),
    Abort(u64),
    /// Reply true when the cache was flushed (only possible while no request runs).
    FlushCache(oneshot::Sender<bool>),
}

struct Inner {
    tx: mpsc::Sender<SchedulerMsg>,
    info: ModelInfo,
    tokenizer: Option<Arc<Tokenizer>>,
    grammar: GrammarAvailability,
    args: ServerArgs,
    metrics: Arc<Metrics>,
    stats: Arc<SchedulerStats>,
    next_id: AtomicU64,
    started: Instant,
    admission: Admission,
}

impl Inner {
    /// Whether the scheduler last reported a request it could not start, or every running
    /// slot taken.
    fn scheduler_full(&self) -> bool {
        let s = &self.stats;
        s.num_queue_reqs.load(Ordering::Relaxed) > 0
            || s.num_running_reqs.load(Ordering::Relaxed) >= self.info.max_running_requests
    }
}

/// What the engine lets wait: requests submitted whose first event has not come yet, counted
/// here at submission (the scheduler's own queue counter lags behind a burst, so a bound on
/// it alone is soft).
///
/// Two hard bounds answer 429 (count and prompt tokens). Beyond them, a request that would
/// not start before the queue deadline is answered 503 at once instead of after waiting the
/// whole deadline: by Little's law its wait is about (requests waiting ahead of it) / (the
/// rate at which waiting requests start). That rate is measured by [`StartRate`].
struct Admission {
    /// Most waiting requests.
    max_requests: usize,
    /// Most prompt tokens of all waiting requests (one request alone always fits).
    max_tokens: usize,
    /// How long a request may wait for its first event; `None`: as long as it takes.
    timeout: Option<Duration>,
    /// `--max-running-requests` as the model settled it.
    max_running: usize,
    queue: Mutex<WaitingQueue>,
    metrics: Arc<Metrics>,
}

/// The waiting requests and how fast they leave, under one lock so that the rate's clock
/// sees every change of the count.
struct WaitingQueue {
    requests: usize,
    tokens: usize,
    rate: StartRate,
}

/// Requests that a full engine starts per second: an exponentially weighted average over the
/// last [`RATE_WINDOW`] of time when requests waited and the scheduler was full (a request it
/// could not start, or every running slot taken).
///
/// The clock runs only then. Idle time says nothing about how fast the engine starts
/// requests (a quiet minute would otherwise read as a slow engine and refuse the next burst),
/// and neither does time with free slots, when a request starts right after its prefill (a
/// batch filling up would read as a fast engine and admit far too many behind it). A full
/// engine starts a request each time the batch frees a slot, which is what a waiting request
/// waits for, and only a full engine has the estimate applied (see [`Admission::enter`]).
struct StartRate {
    /// Starts and seconds of waiting time, each weighted by exp(-age / RATE_WINDOW).
    starts: f64,
    waited: f64,
    /// Starts seen since the process started (fewer than [`MIN_STARTS`]: no estimate).
    seen: u64,
    /// When `starts` and `waited` were last brought up to date.
    updated: Instant,
}

/// Time constant of [`StartRate`]'s average (waiting time, not wall time).
const RATE_WINDOW: f64 = 20.0;
/// Starts of a full engine measured before the rate is trusted; until then only the hard
/// bounds apply.
const MIN_STARTS: u64 = 4;
/// A request whose estimated wait is past this fraction of the deadline is refused at once:
/// the estimate is a mean, and the margin keeps most accepted requests clear of the deadline
/// despite its spread (Poisson arrivals, the batch freeing slots in bunches).
const SHED_AT: f64 = 0.75;

impl StartRate {
    fn new(now: Instant) -> StartRate {
        StartRate {
            starts: 0.0,
            waited: 0.0,
            seen: 0,
            updated: now,
        }
    }

    /// Brings the average up to `now`; `counts` says whether the time since the last update
    /// was full and had requests waiting (the count changes only under the queue's lock,
    /// which calls this first; fullness is the scheduler's last report).
    fn advance(&mut self, now: Instant, counts: bool) {
        let dt = now.saturating_duration_since(self.updated).as_secs_f64();
        self.updated = now;
        if counts && dt > 0.0 {
            let keep = (-dt / RATE_WINDOW).exp();
            self.starts *= keep;
            // The weighted integral of the waiting time over the last dt seconds.
            self.waited = self.waited * keep + RATE_WINDOW * (1.0 - keep);
        }
    }

    fn started(&mut self) {
        self.starts += 1.0;
        self.seen += 1;
    }

    /// Starts per second, `None` until enough were measured.
    fn per_sec(&self) -> Option<f64> {
        (self.seen >= MIN_STARTS && self.waited > 0.0).then(|| self.starts / self.waited)
    }
}

impl WaitingQueue {
    /// Expected wait of a request that arrives now behind `self.requests` others: `None` when
    /// nothing is measured yet, zero when none wait.
    fn expected_wait(&self) -> Option<f64> {
        if self.requests == 0 {
            return Some(0.0);
        }
        let rate = self.rate.per_sec()?;
        Some(if rate > 0.0 {
            self.requests as f64 / rate
        } else {
            f64::INFINITY
        })
    }

    /// `Retry-After` for a request refused now: the wait of one arriving now (by then the
    /// requests ahead have started), or `default` before the rate is measured.
    fn retry_after(&self, default: RetryAfter) -> RetryAfter {
        self.expected_wait().map_or(default, RetryAfter::from_wait)
    }
}

impl Admission {
    /// `--max-queued-requests N` bounds the count alone. Without it the bound follows the KV
    /// cache: waiting prompts may hold up to twice the cache's tokens (more would wait through
    /// several turnovers of the cache), and at most 4 × `--max-running-requests` of them (64
    /// at least, for a client's burst).
    fn new(args: &ServerArgs, info: &ModelInfo, metrics: Arc<Metrics>) -> Admission {
        let (max_requests, max_tokens) = match args.max_queued_requests {
            Some(n) => (n, usize::MAX),
            None => (
                (4 * info.max_running_requests).max(MIN_QUEUE),
                2 * info.max_total_tokens.max(1),
            ),
        };
        Admission {
            max_requests,
            max_tokens,
            timeout: (args.queue_timeout_secs > 0)
                .then(|| Duration::from_secs(args.queue_timeout_secs)),
            max_running: info.max_running_requests.max(1),
            queue: Mutex::new(WaitingQueue {
                requests: 0,
                tokens: 0,
                rate: StartRate::new(Instant::now()),
            }),
            metrics,
        }
    }

    /// Takes a place for a request of `tokens` prompt tokens, or says why there is none.
    ///
    /// The estimate refuses nothing while the engine has room for what arrives. It applies
    /// once the scheduler last reported a request it could not start or every running slot
    /// taken (`scheduler_full`), or once more requests wait than can run at once (a burst
    /// gets there before the scheduler reports). Before that, whatever arrives starts in the
    /// next steps, however slow the measured rate (it may come from long requests of an
    /// earlier burst).
    fn enter(&self, tokens: usize, scheduler_full: bool) -> Result<()> {
        let mut q = self.queue.lock();
        let counts = q.requests > 0 && scheduler_full;
        q.rate.advance(Instant::now(), counts);
        if q.requests >= self.max_requests {
            return Err(EngineError::Overloaded {
                message: format!(
                    "too many waiting requests ({}, --max-queued-requests); retry later",
                    self.max_requests
                ),
                retry_after: q.retry_after(RetryAfter::OVERLOADED),
            });
        }
        if q.requests > 0 && q.tokens.saturating_add(tokens) > self.max_tokens {
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
            && (scheduler_full || q.requests >= self.max_running)
            && let Some(wait) = q.expected_wait()
            && wait > SHED_AT * timeout.as_secs_f64()
        {
            self.publish(&q);
            return Err(EngineError::Unavailable {
                message: format!(
                    "the request would wait about {wait:.0} s before it starts ({} requests \
                     ahead, starting at {:.2}/s), past --queue-timeout-secs {}; retry later",
                    q.requests,
                    q.rate.per_sec().unwrap_or(0.0),
                    timeout.as_secs()
                ),
                retry_after: RetryAfter::from_wait(wait),
            });
        }
        q.requests += 1;
        q.tokens += tokens;
        self.publish(&q);
        Ok(())
    }

    /// Gives a place back; `started`: the request left because it started running;
    /// `scheduler_full` as for [`Admission::enter`].
    fn leave(&self, tokens: usize, started: bool, scheduler_full: bool) {
        let mut q = self.queue.lock();
        let counts = q.requests > 0 && scheduler_full;
        q.rate.advance(Instant::now(), counts);
        if started && scheduler_full {
            q.rate.started();
        }
        q.requests = q.requests.saturating_sub(1);
        q.tokens = q.tokens.saturating_sub(tokens);
        self.publish(&q);
    }

    /// `Retry-After` for a request refused now (see [`WaitingQueue::retry_after`]).
    fn retry_after(&self, default: RetryAfter) -> RetryAfter {
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

/// Fewest requests the default bound lets wait.
const MIN_QUEUE: usize = 64;

/// A request's place among the waiting ones, given back when its first event comes or it ends.
struct Waiting {
    inner: Arc<Inner>,
    tokens: usize,
    since: Instant,
    /// Set when it leaves because its first event came (it started running).
    started: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.started {
            let m = &self.inner.metrics;
            m.queue_time
                .with_label_values(&m.label())
                .observe(self.since.elapsed().as_secs_f64());
        }
        let full = self.inner.scheduler_full();
        self.inner.admission.leave(self.tokens, self.started, full);
    }
}

/// Cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

/// Whether structured output can be served, and if not, why.
#[derive(Clone)]
pub enum GrammarAvailability {
    /// The backend that compiles the grammars of requests.
    Ready(Arc<dyn GrammarBackend>),
    /// Structured output is off; the message says why (shown in 400 answers).
    Off(String),
}

/// The parts from which a handle is built (see [`launch`]).
pub struct EngineParts {
    pub tx: mpsc::Sender<SchedulerMsg>,
    pub info: ModelInfo,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub grammar: GrammarAvailability,
    pub args: ServerArgs,
    pub metrics: Arc<Metrics>,
    pub stats: Arc<SchedulerStats>,
}

impl EngineHandle {
    pub fn from_parts(p: EngineParts) -> Self {
        let admission = Admission::new(&p.args, &p.info, p.metrics.clone());
        EngineHandle {
            inner: Arc::new(Inner {
                tx: p.tx,
                info: p.info,
                tokenizer: p.tokenizer,
                grammar: p.grammar,
                args: p.args,
                metrics: p.metrics,
                stats: p.stats,
                next_id: AtomicU64::new(1),
                started: Instant::now(),
                admission,
            }),
        }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    /// `None` with `--skip-tokenizer-init`.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.inner.tokenizer.as_ref()
    }

    /// The structured-output backend, or a 400 saying why structured output is off
    /// (`--grammar-backend none`, `--skip-tokenizer-init`, a vocabulary it cannot read).
    pub fn grammar_backend(&self) -> Result<&Arc<dyn GrammarBackend>> {
        match &self.inner.grammar {
            GrammarAvailability::Ready(b) => Ok(b),
            GrammarAvailability::Off(why) => Err(EngineError::bad_request(why.clone())),
        }
    }

    pub fn args(&self) -> &ServerArgs {
        &self.inner.args
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.inner.stats
    }

    pub fn uptime_secs(&self) -> f64 {
        self.inner.started.elapsed().as_secs_f64()
    }

    /// Most requests that may wait, and most prompt tokens they may hold together.
    pub fn queue_bounds(&self) -> (usize, usize) {
        let a = &self.inner.admission;
        (a.max_requests, a.max_tokens)
    }

    /// Queue a request. Fails with 429 when the waiting requests are at their bound, with 503
    /// when the scheduler is gone or the request would not start before the queue deadline;
    /// the request is then not queued at all.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream> {
        let stats = &self.inner.stats;
        if !stats.alive.load(Ordering::Acquire) {
            return Err(EngineError::unavailable(
                "the engine's scheduler is not running",
            ));
        }
        let tokens = req.input_ids.len();
        self.inner
            .admission
            .enter(tokens, self.inner.scheduler_full())?;
        let waiting = Waiting {
            inner: self.inner.clone(),
            tokens,
            since: Instant::now(),
            started: false,
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = tmpsc::unbounded_channel();
        let pending = PendingRequest {
            id,
            req,
            events,
            arrival: Instant::now(),
        };
        self.inner
            .tx
            .send(SchedulerMsg::Generate(Box::new(pending)))
            .map_err(|_| EngineError::unavailable("the engine is shutting down"))?;
        Ok(RequestStream {
            id,
            rx,
            tx: self.inner.tx.clone(),
            done: false,
            waiting: Some(waiting),
            expired: None,
        })
    }

    /// Drop the radix cache. False when requests are running (SGLang refuses then too).
    pub async fn flush_cache(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.inner.tx.send(SchedulerMsg::FlushCache(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// The events of one request. Dropping it before the final event aborts the request, which
/// frees its KV slots: this is how a client disconnect reaches the scheduler.
pub struct RequestStream {
    id: u64,
    rx: tmpsc::UnboundedReceiver<StreamEvent>,
    tx: mpsc::Sender<SchedulerMsg>,
    done: bool,
    /// Its place among the waiting requests until the first event.
    waiting: Option<Waiting>,
    /// How long it had waited when the queue deadline ended it, and when to come back.
    expired: Option<(Duration, RetryAfter)>,
}

impl RequestStream {
    /// The next event; `None` at the end, also when the request waited past the queue
    /// deadline (`--queue-timeout-secs`, see [`RequestStream::expired`]), which aborts it.
    pub async fn next(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        let deadline = self.waiting.as_ref().and_then(|w| {
            let t = w.inner.admission.timeout?;
            Some(w.since + t)
        });
        let ev = match deadline {
            Some(at) => match tokio::time::timeout_at(at.into(), self.rx.recv()).await {
                Ok(ev) => ev,
                Err(_) => {
                    self.expired = self.waiting.take().map(|w| {
                        let retry = w.inner.admission.retry_after(RetryAfter::UNAVAILABLE);
                        (w.since.elapsed(), retry)
                    });
                    // Not done: dropping the stream aborts the request in the scheduler.
                    let _ = self.tx.send(SchedulerMsg::Abort(self.id));
                    self.done = true;
                    return None;
                }
            },
            None => self.rx.recv().await,
        };
        if let Some(mut w) = self.waiting.take() {
            w.started = matches!(
                ev,
                Some(StreamEvent::Tokens { .. })
                    | Some(StreamEvent::PromptLogprobs { .. })
                    | Some(StreamEvent::Finished { .. })
            );
        }
        match &ev {
            Some(StreamEvent::Finished { .. }) | Some(StreamEvent::Error { .. }) | None => {
                self.done = true
            }
            Some(StreamEvent::Tokens { .. }) | Some(StreamEvent::PromptLogprobs { .. }) => {}
        }
        ev
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The 503 for a request that waited past the queue deadline, if this one did.
    pub fn expired(&self) -> Option<EngineError> {
        self.expired
            .map(|(waited, retry_after)| EngineError::Unavailable {
                message: format!(
                    "the request waited {:.1} s in the queue without starting \
                     (--queue-timeout-secs); retry later",
                    waited.as_secs_f64()
                ),
                retry_after,
            })
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            // The scheduler may already be gone; nothing else to do then.
            let _ = self.tx.send(SchedulerMsg::Abort(self.id));
        }
    }
}
