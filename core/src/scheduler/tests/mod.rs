//! Scheduler tests on a fake model ([`fake`]): admission, chunked prefill, retraction, the
//! waiting-queue orders (`lpm`, `random`, `lof`, `dfs-weight`) and their age bound, in-batch
//! prefix sharing, the overlap schedule, aborts, shared prefills, the pass statistics.
//!
//! A [`Harness`] drives the scheduler one step at a time, as its thread does, and after every
//! step checks that each KV slot is in exactly one place (the pool's free list, the radix
//! tree, or one running request) and that every running request's slots start with those of
//! the radix node it holds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod aging;
mod fake;
mod pass_stats;
mod scheduling;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::{Scheduler, SchedulerConfig};
use crate::backend::{Backend, HostSampling};
use crate::config::SchedulePolicy;
use crate::engine::{PendingRequest, SchedulerMsg, SchedulerStats};
use crate::metrics::Metrics;
use crate::request::{FinishReason, GenerateRequest, SamplingParams, StreamEvent, Usage};
use fake::{FakeModel, PassLog, RunningSeen, SeqRecord};

use fake::reference;

/// How the fake model samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Logits back to the host; the scheduler samples.
    Plain,
    /// Tokens sampled by the backend, one pass at a time.
    DeviceSampling,
    /// Tokens sampled by the backend, passes overlapped (tokens handed out one pass late, as
    /// a GPU does).
    Overlap,
}

pub(super) struct Setup {
    pub capacity: usize,
    pub vocab: usize,
    pub chunked_prefill_size: Option<usize>,
    pub policy: SchedulePolicy,
    pub mode: Mode,
    pub max_running_requests: usize,
    pub context_length: usize,
    pub disable_radix_cache: bool,
    /// The fake model's stored KV depends on the pass's shape (see [`fake`]).
    pub shape_dependent_kv: bool,
    /// `--random-seed`.
    pub random_seed: u64,
    /// `--queue-timeout-secs`.
    pub queue_timeout: Option<Duration>,
    /// 0 unless a test sets it: most tests count on admission taking whatever fits now.
    pub schedule_conservativeness: f64,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            capacity: 256,
            vocab: 50,
            chunked_prefill_size: None,
            policy: SchedulePolicy::Fcfs,
            mode: Mode::Plain,
            max_running_requests: 16,
            context_length: 200,
            disable_radix_cache: false,
            shape_dependent_kv: false,
            random_seed: 1,
            queue_timeout: None,
            schedule_conservativeness: 0.0,
        }
    }
}

impl Setup {
    pub fn build(self) -> Harness {
        let log = PassLog::default();
        let stats = Arc::new(SchedulerStats::default());
        let running_seen = RunningSeen::default();
        let fake = Box::new(FakeModel::new(
            self.vocab,
            self.capacity,
            log.clone(),
            self.shape_dependent_kv,
            stats.clone(),
            running_seen.clone(),
        ));
        let backend: Box<dyn Backend> = match self.mode {
            Mode::Plain => fake,
            Mode::DeviceSampling => Box::new(HostSampling::new(fake, false)),
            Mode::Overlap => Box::new(HostSampling::new(fake, true)),
        };
        let cfg = SchedulerConfig {
            max_running_requests: self.max_running_requests,
            chunked_prefill_size: self.chunked_prefill_size,
            policy: self.policy,
            context_length: self.context_length,
            eos_token_ids: Vec::new(),
            disable_radix_cache: self.disable_radix_cache,
            random_seed: self.random_seed,
            log_requests: false,
            disable_overlap_schedule: false,
            queue_timeout: self.queue_timeout,
            schedule_conservativeness: self.schedule_conservativeness,
        };
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::new("fake").expect("metrics"));
        let sched = Scheduler::new(backend, rx, None, cfg, metrics, stats);
        Harness {
            sched,
            _tx: tx,
            log,
            running_seen,
            capacity: self.capacity,
            vocab: self.vocab,
            next_id: 1,
            steps: 0,
        }
    }
}

/// Greedy sampling of `n` tokens.
pub(super) fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: n,
        ..SamplingParams::default()
    }
}

/// A prompt of `len` tokens below `vocab`, different for each `salt`.
pub(super) fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7 + salt * 13 + 3) % 50)
        .collect()
}

/// One request as its client sees it.
pub(super) struct Client {
    pub id: u64,
    rx: UnboundedReceiver<StreamEvent>,
    pub tokens: Vec<u32>,
    pub finish: Option<(FinishReason, Usage)>,
    pub error: Option<String>,
}

impl Client {
    /// Read the events sent so far.
    pub fn poll(&mut self) {
        while let Ok(ev) = self.rx.try_recv() {
            match ev {
                StreamEvent::Tokens { ids, .. } => {
                    assert!(self.finish.is_none(), "tokens after the final event");
                    self.tokens.extend(ids);
                }
                StreamEvent::Finished { reason, usage, .. } => {
                    assert!(self.finish.is_none(), "two final events");
                    self.finish = Some((reason, usage));
                }
                StreamEvent::Error { message } => self.error = Some(message),
                StreamEvent::PromptLogprobs { .. } => {}
            }
        }
    }

    /// The output of a request that finished.
    pub fn output(&mut self) -> Vec<u32> {
        self.poll();
        assert!(self.error.is_none(), "request failed: {:?}", self.error);
        assert!(self.finish.is_some(), "request {} did not finish", self.id);
        self.tokens.clone()
    }

    pub fn usage(&mut self) -> Usage {
        self.poll();
        self.finish.as_ref().expect("finished").1.clone()
    }

    pub fn reason(&mut self) -> FinishReason {
        self.poll();
        self.finish.as_ref().expect("finished").0.clone()
    }
}

pub(super) struct Harness {
    pub sched: Scheduler,
    _tx: mpsc::Sender<SchedulerMsg>,
    log: PassLog,
    running_seen: RunningSeen,
    pub capacity: usize,
    pub vocab: usize,
    next_id: u64,
    pub steps: usize,
}

/// Steps after which a test that has not gone idle is stuck.
const MAX_STEPS: usize = 10_000;

impl Harness {
    pub fn submit(&mut self, prompt: Vec<u32>, sampling: SamplingParams) -> Client {
        let id = self.next_id;
        self.next_id += 1;
        let (events, rx) = unbounded_channel();
        let req = GenerateRequest {
            rid: format!("r{id}"),
            input_ids: prompt,
            sampling,
            detokenize: false,
            logprobs: None,
        };
        self.sched
            .handle(SchedulerMsg::Generate(Box::new(PendingRequest {
                id,
                req,
                events,
                arrival: Instant::now(),
            })));
        Client {
            id,
            rx,
            tokens: Vec::new(),
            finish: None,
            error: None,
        }
    }

    pub fn abort(&mut self, id: u64) {
        self.sched.handle(SchedulerMsg::Abort(id));
    }

    /// One turn of the scheduler loop, then the bookkeeping checks.
    pub fn step(&mut self) {
        self.sched.tick();
        self.steps += 1;
        self.check_slots();
    }

    pub fn idle(&self) -> bool {
        self.sched.waiting.is_empty()
            && self.sched.running.is_empty()
            && self.sched.flight.is_none()
    }

    /// Step until no request is left.
    pub fn run_to_idle(&mut self) {
        let start = self.steps;
        while !self.idle() {
            assert!(
                self.steps - start < MAX_STEPS,
                "the scheduler made no progress"
            );
            self.step();
        }
    }

    /// Make `dt` pass for the scheduler's view of how long requests have waited: every
    /// request's arrival moves `dt` back (the test's clock, so that seconds of waiting take
    /// no time).
    pub fn let_time_pass(&mut self, dt: Duration) {
        let s = &mut self.sched;
        for r in s.waiting.iter_mut().chain(s.running.iter_mut()) {
            r.arrival = r.arrival.checked_sub(dt).expect("a clock that far back");
        }
    }

    pub fn running_ids(&self) -> Vec<u64> {
        self.sched.running.iter().map(|r| r.id).collect()
    }

    pub fn waiting_ids(&self) -> Vec<u64> {
        self.sched.waiting.iter().map(|r| r.id).collect()
    }

    /// Every forward pass run so far.
    fn passes(&self) -> Vec<Vec<SeqRecord>> {
        self.log.lock().unwrap().clone()
    }

    /// The running requests the scheduler had published as each pass ran.
    fn running_seen(&self) -> Vec<usize> {
        self.running_seen.lock().unwrap().clone()
    }

    /// Every KV slot is in exactly one place: the pool's free list, the radix tree, or the
    /// slots of one running request beyond the prefix its locked node holds.
    pub fn check_slots(&self) {
        let s = &self.sched;
        let mut owned = HashSet::new();
        let mut private = 0;
        for r in &s.running {
            let held = s.cache.node_prefix_len(r.kv.node()).expect("locked node");
            let tree = s.cache.node_slots(r.kv.node()).expect("locked node");
            assert_eq!(
                &r.kv.slots()[..held],
                &tree[..],
                "request {}: slots differ from its radix node's",
                r.id
            );
            for &slot in &r.kv.slots()[held..] {
                assert!(
                    !s.pool.is_free(slot),
                    "request {} holds free slot {slot}",
                    r.id
                );
                assert!(owned.insert(slot), "slot {slot} held twice");
            }
            private += r.kv.len() - held;
        }
        for r in &s.waiting {
            assert!(r.kv.is_empty(), "waiting request {} holds slots", r.id);
            assert_eq!(
                r.kv.node(),
                s.cache.root(),
                "waiting request {} holds a node",
                r.id
            );
            assert!(r.inflight.is_none());
        }
        assert_eq!(
            s.pool.available() + s.cache.total_size() + private,
            self.capacity,
            "KV slots lost or counted twice"
        );
    }

    /// Nothing runs and nothing is held: no radix node is locked, and flushing the cache
    /// gives every slot back to the pool.
    pub fn assert_everything_released(&mut self) {
        assert!(self.idle());
        assert_eq!(
            self.sched.cache.protected_size(),
            0,
            "radix nodes still locked"
        );
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        self.sched.handle(SchedulerMsg::FlushCache(tx));
        assert_eq!(rx.try_recv(), Ok(true), "flush refused");
        assert_eq!(self.sched.pool.available(), self.capacity);
    }
}
