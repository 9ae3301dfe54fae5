//! The engine as the HTTP layer sees it: a cloneable [`EngineHandle`] that submits requests to
//! the scheduler thread and reads their token streams back, and [`launch`], which builds one
//! (model, tokenizer, backend, scheduler).

mod admission;
mod launch;

pub use launch::{check, launch};

use admission::{Admission, Shed};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::config::ServerArgs;
use crate::error::{EngineError, Result, RetryAfter};
use crate::grammar::GrammarBackend;
use crate::metrics::Metrics;
use crate::request::{GenerateRequest, StreamEvent};
use crate::scheduler::PassStats;
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
    /// Prompt tokens, and the part of them the radix cache held, since start: counted at
    /// each request's first admission (as `sglang:prompt_tokens_total` and
    /// `sglang:cached_tokens_total`), for the cache hit rate.
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
    /// Reply with the forward-pass statistics of the current window; with `reset`, start a
    /// new window right after.
    PassStats {
        reset: bool,
        reply: oneshot::Sender<PassStats>,
    },
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

/// A request's place among the waiting ones, given back when its first event comes or it ends.
struct Waiting {
    inner: Arc<Inner>,
    /// Its rank among the waiting requests ([`admission::Ticket::seq`]).
    seq: u64,
    since: Instant,
    /// Set if the admission refuses it while it waits (its predicted start is past the
    /// deadline).
    shed: Arc<Shed>,
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
        self.inner
            .admission
            .leave(Instant::now(), self.seq, self.started, full);
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
        let now = Instant::now();
        let ticket =
            self.inner
                .admission
                .enter(now, req.input_ids.len(), self.inner.scheduler_full())?;
        let waiting = Waiting {
            inner: self.inner.clone(),
            seq: ticket.seq,
            since: now,
            shed: ticket.shed,
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

    /// Where the scheduler's time went since the engine started or since the last
    /// [`EngineHandle::take_pass_stats`]: its forward passes by kind (decode, prefill, both),
    /// the time with none running, and a timeline (see [`PassStats`]). Answered between two
    /// scheduler steps; `None` when the scheduler is gone.
    pub async fn pass_stats(&self) -> Option<PassStats> {
        self.request_pass_stats(false).await
    }

    /// As [`EngineHandle::pass_stats`], and start a new window: a benchmark calls it before
    /// its measured run so that the warm-up is left out.
    pub async fn take_pass_stats(&self) -> Option<PassStats> {
        self.request_pass_stats(true).await
    }

    async fn request_pass_stats(&self, reset: bool) -> Option<PassStats> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .tx
            .send(SchedulerMsg::PassStats { reset, reply })
            .ok()?;
        rx.await.ok()
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
    /// The 503's message and `Retry-After` if it was refused while it waited: at the queue
    /// deadline, or before it when its predicted start was past it.
    expired: Option<(String, RetryAfter)>,
}

impl RequestStream {
    /// The next event; `None` at the end, also when the request waited past the queue
    /// deadline (`--queue-timeout-secs`) or the admission refused it while it waited because
    /// it would not start before the deadline (see [`RequestStream::expired`]); either aborts
    /// it.
    pub async fn next(&mut self) -> Option<StreamEvent> {
        if self.done {
            return None;
        }
        let ev = match &self.waiting {
            Some(w) => {
                let deadline = w.inner.admission.timeout.map(|t| w.since + t);
                let expiry = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    // An event that is there wins: the request started after all.
                    biased;
                    ev = self.rx.recv() => Ok(ev),
                    refusal = w.shed.refused() => Err(Some(refusal)),
                    () = expiry => Err(None),
                }
            }
            None => Ok(self.rx.recv().await),
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(refusal) => {
                let refusal = refusal.or_else(|| {
                    let w = self.waiting.as_ref()?;
                    let message = format!(
                        "the request waited {:.1} s in the queue without starting \
                         (--queue-timeout-secs); retry later",
                        w.since.elapsed().as_secs_f64()
                    );
                    Some((
                        message,
                        w.inner.admission.retry_after(RetryAfter::UNAVAILABLE),
                    ))
                });
                self.expired = refusal;
                self.waiting = None;
                // Not done: dropping the stream aborts the request in the scheduler.
                let _ = self.tx.send(SchedulerMsg::Abort(self.id));
                self.done = true;
                return None;
            }
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

    /// The 503 for a request that waited past the queue deadline, or that the admission
    /// refused while it waited, if this one was.
    pub fn expired(&self) -> Option<EngineError> {
        self.expired
            .as_ref()
            .map(|(message, retry_after)| EngineError::Unavailable {
                message: message.clone(),
                retry_after: *retry_after,
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
