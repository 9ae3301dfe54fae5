//! The scheduler thread: owns the KV pool, the radix cache and the backend, and runs the
//! continuous-batching loop.
//!
//! Each step (1) takes new requests and aborts from the channel, (2) drops requests whose
//! client went away, (3) plans a batch: one token for every decoding request, then pieces of
//! prompts being prefilled and newly admitted requests, within `--chunked-prefill-size` prompt
//! tokens and the pool's free slots, (4) runs one forward pass, samples, streams, and finishes
//! requests, handing their KV to the radix cache. When a decoding request finds no free slot,
//! the newest running request is retracted: its KV goes to the radix cache and it waits again
//! (it is never dropped).
//!
//! A sequence asks the backend for one logits row when its pass reaches its end, plus the rows
//! of the prompt positions its prompt logprobs still need (see [`req`]). A request with
//! `max_new_tokens` 0 finishes as soon as its prompt is computed (and cached), without
//! sampling: this is how prompts are scored and how parallel samples share one prefill.
//!
//! Requests with a grammar (structured output) need the mask of allowed tokens before they
//! sample. The masks of the step's sampling requests are computed on a worker thread while
//! the forward pass runs: their grammar states are taken out of the requests for the pass and
//! put back before sampling (see [`req`]).
//!
//! The scheduler keeps an account of its forward passes and of the time with none running,
//! which [`crate::engine::EngineHandle::pass_stats`] reads (see [`PassStats`]).

mod lease;
mod order;
mod pass_stats;
mod req;
mod step;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::backend::Backend;
use crate::cache::{KvPool, RadixCache};
use crate::config::SchedulePolicy;
use crate::engine::{PendingRequest, SchedulerMsg, SchedulerStats};
use crate::metrics::Metrics;
use crate::request::FinishReason;
use crate::tokenizer::Tokenizer;
use pass_stats::PassRecorder;
pub use pass_stats::{PassKindStats, PassStats, TimelineRow};
use req::Req;
use step::Flight;

/// Scheduling limits, resolved from the server arguments and the model.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_running_requests: usize,
    /// Most prompt tokens per step (`None`: unbounded).
    pub chunked_prefill_size: Option<usize>,
    pub policy: SchedulePolicy,
    pub context_length: usize,
    pub eos_token_ids: Vec<u32>,
    pub disable_radix_cache: bool,
    pub random_seed: u64,
    pub log_requests: bool,
    /// Run every step synchronously even on a backend that can overlap.
    pub disable_overlap_schedule: bool,
    /// `--queue-timeout-secs` (`None`: no timeout); bounds how long a reordering policy
    /// keeps a request waiting behind newer ones (see [`order::age_limit`]).
    pub queue_timeout: Option<Duration>,
    /// `--schedule-conservativeness`: how much of the running requests' future output
    /// admission keeps room for (see [`TokenRatio`]); 0 admits whatever fits now.
    pub schedule_conservativeness: f64,
}

/// Waiting queues longer than this are served first-come-first-served even under `lpm` and
/// `dfs-weight` (ordering by prefix match costs a tree walk per request).
const LPM_MAX_QUEUE: usize = 128;

/// Shared prompt tokens a waiting request waits for a running request to compute rather than
/// computing them itself (see `Scheduler::prefix_in_progress`; SGLang's threshold).
const IN_BATCH_PREFIX_MIN: usize = 32;

/// Mixed into `--random-seed` for the generator of the `random` policy.
const ORDER_SEED_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// Admission's estimate of the output a request will still generate, as a fraction of what
/// it may (SGLang's new-token ratio). A request is admitted when its uncached prompt plus its
/// own estimate fits beside the running requests' estimates, so the KV cache keeps room for
/// the tokens they are about to decode instead of filling with prompts and then retracting
/// requests (whose KV is lost to later prompts and computed again when they resume). The
/// ratio starts at 0.7 x conservativeness, falls by steps over [`RATIO_DECAY_STEPS`] decode
/// steps to 0.1 x conservativeness (requests often stop early), and after a retraction
/// rises to the share the running requests have already used of their `max_new_tokens`.
struct TokenRatio {
    now: f64,
    min: f64,
    decay: f64,
}

/// Decode steps over which the new-token ratio falls from its start to its floor.
const RATIO_DECAY_STEPS: f64 = 600.0;
/// A request's remaining output counts at most this much in the estimate (a request asking
/// for the whole context would otherwise hold back every admission).
const RATIO_CLIP_NEW_TOKENS: usize = 4096;
/// Decode steps a retraction's new ratio adds for each running request.
const RATIO_RETRACT_STEPS: usize = 20;

impl TokenRatio {
    fn new(conservativeness: f64) -> Self {
        // (the flag is checked at startup; NaN turns to 0 here, infinity to a ratio of 1)
        let c = conservativeness.max(0.0);
        let init = (0.7 * c).min(1.0);
        let min = (0.1 * c).min(init);
        TokenRatio {
            now: init,
            min,
            decay: (init - min) / RATIO_DECAY_STEPS,
        }
    }

    /// Tokens admission keeps free for a request that may still generate `remaining`.
    fn reserve(&self, remaining: usize) -> usize {
        (remaining.min(RATIO_CLIP_NEW_TOKENS) as f64 * self.now).ceil() as usize
    }

    fn decayed(&mut self) {
        self.now = (self.now - self.decay).max(self.min);
    }
}

/// Decode steps between two "Decode batch" log lines.
const DECODE_LOG_INTERVAL: u64 = 40;

pub struct Scheduler {
    backend: Box<dyn Backend>,
    pool: KvPool,
    cache: RadixCache,
    waiting: VecDeque<Req>,
    running: Vec<Req>,
    rx: Receiver<SchedulerMsg>,
    tokenizer: Option<Arc<Tokenizer>>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    stats: Arc<SchedulerStats>,
    rng: StdRng,
    /// Shuffles the waiting queue under `--schedule-policy random`; apart from `rng` so that
    /// the policy leaves the requests' sampling seeds as they are.
    order_rng: StdRng,
    decode_steps: u64,
    log_tokens: u64,
    log_since: Instant,
    /// The pass launched on an overlapping backend whose tokens are not yet processed.
    flight: Option<Flight>,
    /// Serial numbers of launched passes and of admissions.
    passes: u64,
    admissions: u64,
    pass_stats: PassRecorder,
    token_ratio: TokenRatio,
}

/// Tokens of `r` the radix cache holds now (what admission would match).
fn cached_prefix_len(cache: &RadixCache, r: &Req) -> usize {
    let toks = r.all_tokens();
    cache.peek_prefix_len(&toks[..r.match_key_len()])
}

/// One sequence's share of a step.
struct Planned {
    /// Index into `running`.
    idx: usize,
    /// Tokens computed this step.
    n: usize,
    /// Whether these tokens reach the end of what the request has (so logits are needed).
    completes: bool,
    /// True for prompt work (prefill / chunk), false for a decode token.
    prefill: bool,
}

impl Scheduler {
    pub fn new(
        backend: Box<dyn Backend>,
        rx: Receiver<SchedulerMsg>,
        tokenizer: Option<Arc<Tokenizer>>,
        cfg: SchedulerConfig,
        metrics: Arc<Metrics>,
        stats: Arc<SchedulerStats>,
    ) -> Self {
        let capacity = backend.kv_capacity();
        let token_ratio = TokenRatio::new(cfg.schedule_conservativeness);
        Scheduler {
            pool: KvPool::new(capacity),
            cache: RadixCache::new(cfg.disable_radix_cache),
            waiting: VecDeque::new(),
            running: Vec::new(),
            rng: StdRng::seed_from_u64(cfg.random_seed),
            order_rng: StdRng::seed_from_u64(cfg.random_seed ^ ORDER_SEED_MIX),
            backend,
            rx,
            tokenizer,
            cfg,
            metrics,
            stats,
            decode_steps: 0,
            log_tokens: 0,
            log_since: Instant::now(),
            flight: None,
            passes: 0,
            admissions: 0,
            pass_stats: PassRecorder::new(Instant::now()),
            token_ratio,
        }
    }

    /// Run until every handle to the engine is dropped.
    pub fn run(mut self) {
        self.stats.alive.store(true, Ordering::Release);
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                self.publish_stats();
                let idle_from = Instant::now();
                let msg = self.rx.recv();
                self.pass_stats.idle(idle_from, Instant::now());
                match msg {
                    Ok(msg) => self.handle(msg),
                    Err(_) => break,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(msg) => self.handle(msg),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.waiting.is_empty() && self.running.is_empty() {
                            self.stats.alive.store(false, Ordering::Release);
                            return;
                        }
                        break;
                    }
                }
            }
            self.tick();
        }
        self.stats.alive.store(false, Ordering::Release);
    }

    /// One turn of the loop once the channel is drained: drop the requests whose client went
    /// away, run one step, publish the stats. A failed pass fails every running request.
    fn tick(&mut self) {
        self.reap_disconnected();
        if let Err(e) = self.step() {
            tracing::error!("forward pass failed: {e}");
            self.flight = None;
            if let Some(overlap) = self.backend.overlap() {
                overlap.discard_launched();
            }
            let reqs: Vec<Req> = self.running.drain(..).collect();
            for mut r in reqs {
                r.fail(format!("the engine failed to run this request: {e}"));
                self.release(&mut r);
            }
            // The failed passes did not write the KV of the tokens just handed to the radix
            // cache (nor of the prompts an overlapped pass cached at its launch): drop it.
            if let Err(e) = self.cache.reset(&mut self.pool) {
                tracing::error!("dropping the prefix cache after a failed pass: {e}");
            }
        }
        self.publish_stats();
    }

    fn handle(&mut self, msg: SchedulerMsg) {
        match msg {
            SchedulerMsg::Generate(p) => self.enqueue(*p),
            SchedulerMsg::Abort(id) => self.abort(id, "aborted by the client"),
            SchedulerMsg::FlushCache(reply) => {
                let ok = self.waiting.is_empty() && self.running.is_empty() && {
                    match self.cache.reset(&mut self.pool) {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::warn!("flush_cache refused: {e}");
                            false
                        }
                    }
                };
                if ok {
                    tracing::info!("Cache flushed successfully!");
                }
                let _ = reply.send(ok);
            }
            SchedulerMsg::PassStats { reset, reply } => {
                let now = Instant::now();
                let _ = reply.send(self.pass_stats.snapshot(now));
                if reset {
                    self.pass_stats.reset(now);
                }
            }
        }
    }

    fn enqueue(&mut self, p: PendingRequest) {
        let seed: u64 = self.rng.random();
        let req = Req::new(
            p,
            seed,
            &self.cfg.eos_token_ids,
            self.tokenizer.clone(),
            self.cache.root(),
        );
        if req.prompt.is_empty() {
            req.fail("the prompt is empty".into());
            return;
        }
        if req.prompt.len() >= self.cfg.context_length {
            req.fail(format!(
                "the prompt has {} tokens; the context length is {}",
                req.prompt.len(),
                self.cfg.context_length
            ));
            return;
        }
        if let Some(lp) = req.logprobs
            && lp.start_len >= req.prompt.len()
        {
            req.fail(format!(
                "logprob_start_len ({}) must be less than the number of prompt tokens ({})",
                lp.start_len,
                req.prompt.len()
            ));
            return;
        }
        if req.prompt.len() + 1 > self.pool.capacity() {
            req.fail(format!(
                "the prompt has {} tokens but the KV cache holds only {} (--max-total-tokens)",
                req.prompt.len(),
                self.pool.capacity()
            ));
            return;
        }
        if self.cfg.log_requests {
            tracing::info!(rid = %req.rid, prompt_tokens = req.prompt.len(), params = ?req.params, "request received");
        }
        self.waiting.push_back(req);
    }

    fn abort(&mut self, id: u64, why: &str) {
        if let Some(pos) = self.waiting.iter().position(|r| r.id == id) {
            if let Some(mut r) = self.waiting.remove(pos) {
                r.finish(FinishReason::Abort {
                    message: why.into(),
                });
            }
            return;
        }
        if let Some(pos) = self.running.iter().position(|r| r.id == id) {
            let mut r = self.running.remove(pos);
            r.finish(FinishReason::Abort {
                message: why.into(),
            });
            self.release(&mut r);
        }
    }

    fn reap_disconnected(&mut self) {
        let gone: Vec<u64> = self
            .waiting
            .iter()
            .chain(self.running.iter())
            .filter(|r| r.client_gone())
            .map(|r| r.id)
            .collect();
        for id in gone {
            tracing::debug!("request {id}: client disconnected, aborting");
            self.abort(id, "client disconnected");
        }
    }

    /// Give a request's computed KV to the radix cache (or the pool) and drop its lock.
    /// A slot past the known tokens (the KV of a token still being sampled by a pass in
    /// flight) goes straight back to the pool: the pass writes it before any later pass that
    /// could be given it runs.
    fn release(&mut self, r: &mut Req) {
        let tokens: Vec<u32> = (0..r.known_len()).map(|i| r.token_at(i)).collect();
        if let Err(e) = r.kv.release(&tokens, &mut self.cache, &mut self.pool) {
            tracing::error!("releasing request {}: {e}", r.id);
        }
        r.inflight = None;
    }

    /// Free slots, evicting from the radix cache when needed.
    fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n == 0 {
            return Some(Vec::new());
        }
        if self.pool.available() < n {
            self.cache.evict(n - self.pool.available(), &mut self.pool);
        }
        self.pool.alloc(n)
    }

    fn free_capacity(&self) -> usize {
        self.pool.available() + self.cache.evictable_size()
    }

    /// Order the waiting queue by `--schedule-policy` before admission; under the reordering
    /// policies, requests past the age limit go first (see [`order`]).
    fn order_waiting(&mut self) {
        if self.waiting.len() < 2 {
            return;
        }
        match self.cfg.policy {
            SchedulePolicy::Fcfs => {}
            SchedulePolicy::Random => self.waiting.make_contiguous().shuffle(&mut self.order_rng),
            SchedulePolicy::Lof => self
                .waiting
                .make_contiguous()
                .sort_by_key(|r| std::cmp::Reverse(r.params.max_new_tokens)),
            SchedulePolicy::Lpm if self.waiting.len() <= LPM_MAX_QUEUE => {
                let mut v: Vec<(usize, Req)> = self
                    .waiting
                    .drain(..)
                    .map(|r| (cached_prefix_len(&self.cache, &r), r))
                    .collect();
                v.sort_by_key(|e| std::cmp::Reverse(e.0));
                self.waiting = v.into_iter().map(|(_, r)| r).collect();
            }
            SchedulePolicy::DfsWeight if self.waiting.len() <= LPM_MAX_QUEUE => {
                let prefixes: Vec<Vec<u32>> = self
                    .waiting
                    .iter()
                    .map(|r| {
                        let mut toks = r.all_tokens();
                        toks.truncate(cached_prefix_len(&self.cache, r));
                        toks
                    })
                    .collect();
                let refs: Vec<&[u32]> = prefixes.iter().map(Vec::as_slice).collect();
                let order = order::dfs_weight_order(&refs);
                let mut slots: Vec<Option<Req>> = self.waiting.drain(..).map(Some).collect();
                self.waiting = order
                    .into_iter()
                    .filter_map(|i| slots.get_mut(i).and_then(Option::take))
                    .collect();
                // The order names every request once; any it missed would still wait, last.
                self.waiting.extend(slots.into_iter().flatten());
            }
            SchedulePolicy::Lpm | SchedulePolicy::DfsWeight => {}
        }
        if self.cfg.policy != SchedulePolicy::Fcfs {
            order::aged_first(
                &mut self.waiting,
                |r| r.arrival,
                Instant::now(),
                order::age_limit(self.cfg.queue_timeout),
            );
        }
    }

    /// Move the newest running request back to the waiting queue, freeing its slots.
    fn retract_one(&mut self) -> bool {
        let Some(mut r) = self.running.pop() else {
            return false;
        };
        self.release(&mut r);
        // Admission was too hopeful: expect the running requests to use as much of their
        // output as they have so far, and a little more.
        let ctx = self.cfg.context_length;
        let (used, may) = self.running.iter().fold((0usize, 0usize), |(u, m), q| {
            let left = q.remaining_new(ctx).min(RATIO_CLIP_NEW_TOKENS);
            (
                u + q.output.len() + RATIO_RETRACT_STEPS,
                m + q.output.len() + left,
            )
        });
        let before = self.token_ratio.now;
        if may > 0 && self.token_ratio.now > 0.0 {
            let seen = (used as f64 / may as f64).min(1.0);
            self.token_ratio.now = self.token_ratio.now.max(seen);
        }
        tracing::info!(
            "KV cache full: retracting request {} ({} tokens) to the waiting queue; new-token ratio {:.3} -> {:.3}",
            r.id,
            r.total_len(),
            before,
            self.token_ratio.now
        );
        self.waiting.push_front(r);
        true
    }

    /// Admit a waiting request: match its prefix in the radix cache and lock it. The match is
    /// cut short where the request needs logits rows of its prompt (prompt logprobs).
    fn admit(&mut self, mut r: Req) -> Req {
        let first_admission = r.admission == 0;
        self.admissions += 1;
        r.admission = self.admissions;
        let toks = r.all_tokens();
        let matched = r.kv.admit(&mut self.cache, &toks[..r.match_key_len()]);
        if first_admission {
            // The prompt and its cached part counted together, once per request (counted on
            // arrival, a growing queue lowered the hit rate; counted at every admission, a
            // retracted request's readmission counted its prompt again): the Prometheus
            // counters, and the totals of /get_server_info and the lifetime gauge.
            let label = self.metrics.label();
            self.metrics
                .prompt_tokens_total
                .with_label_values(&label)
                .inc_by(r.prompt.len() as u64);
            self.metrics
                .cached_tokens_total
                .with_label_values(&label)
                .inc_by(matched as u64);
            self.stats
                .total_prompt_tokens
                .fetch_add(r.prompt.len() as u64, Ordering::Relaxed);
            self.stats
                .total_cached_tokens
                .fetch_add(matched as u64, Ordering::Relaxed);
        }
        if r.output.is_empty() {
            r.cached_tokens = matched;
        }
        r
    }

    fn plan(&mut self) -> Vec<Planned> {
        // Decodes first: one slot each, retracting the newest requests if the pool is full.
        let ctx = self.cfg.context_length;
        loop {
            let decodes = self.running.iter().filter(|r| r.decodes_next(ctx)).count();
            if self.free_capacity() >= decodes || !self.retract_one() {
                break;
            }
        }
        let mut budget = self.cfg.chunked_prefill_size.unwrap_or(usize::MAX);
        let mut plan = Vec::new();
        for (idx, r) in self.running.iter().enumerate() {
            if r.decodes_next(ctx) {
                plan.push(Planned {
                    idx,
                    n: 1,
                    completes: true,
                    prefill: false,
                });
            }
        }
        // Slots still free for prompt work, keeping one per running request for its next decode.
        let mut avail = self.free_capacity().saturating_sub(plan.len());
        // Requests in the middle of a chunked prefill continue before new ones start.
        for idx in 0..self.running.len() {
            let r = &self.running[idx];
            if r.decodes_next(ctx) || r.inflight.is_some() {
                continue;
            }
            let want = r.pending();
            let n = want.min(budget).min(avail);
            if n == 0 {
                continue;
            }
            budget -= n;
            avail -= n;
            plan.push(Planned {
                idx,
                n,
                completes: n == want,
                prefill: true,
            });
        }
        // New requests, each with room for its estimated output beside the running ones'.
        let ratio_on = self.token_ratio.now > 0.0;
        let mut reserved: usize = if ratio_on {
            self.running
                .iter()
                .map(|r| self.token_ratio.reserve(r.remaining_new(ctx)))
                .sum()
        } else {
            0
        };
        self.order_waiting();
        // Requests that wait for a running request to compute the prompt prefix they share.
        let mut deferred = Vec::new();
        while budget > 0 && self.running.len() < self.cfg.max_running_requests {
            let Some(front) = self.waiting.front() else {
                break;
            };
            // Cheap check before touching the tree: the uncached part must fit, unless it is
            // longer than one chunk anyway (then it starts now and continues as room frees up).
            let toks = front.all_tokens();
            let cached = self.cache.peek_prefix_len(&toks[..front.match_key_len()]);
            if self.cfg.policy == SchedulePolicy::Lpm
                && self.prefix_in_progress(&toks[..front.match_key_len()], cached)
            {
                deferred.extend(self.waiting.pop_front());
                continue;
            }
            let need = toks.len() - cached;
            let room = avail.saturating_sub(1);
            if room == 0 || (need > room && need <= budget) {
                break;
            }
            let future = if ratio_on {
                self.token_ratio.reserve(front.remaining_new(ctx))
            } else {
                0
            };
            if ratio_on && !self.running.is_empty() && need + future + reserved > avail {
                break;
            }
            let Some(r) = self.waiting.pop_front() else {
                break;
            };
            // Locking the matched prefix takes it out of the evictable part of the capacity
            // (a retracted request finds its own KV there): count what is left after that.
            let before = self.free_capacity();
            let mut r = self.admit(r);
            avail = avail.saturating_sub(before.saturating_sub(self.free_capacity()));
            let room = avail.saturating_sub(1);
            let n = r.pending().min(budget).min(room);
            if n == 0 {
                r.kv.unlock(&mut self.cache);
                self.waiting.push_front(r);
                break;
            }
            budget -= n;
            avail -= n + 1;
            reserved += future;
            let completes = n == r.pending();
            self.running.push(r);
            plan.push(Planned {
                idx: self.running.len() - 1,
                n,
                completes,
                prefill: true,
            });
        }
        for r in deferred.into_iter().rev() {
            self.waiting.push_front(r);
        }
        plan
    }

    /// Whether a running request still computing its prompt (admitted earlier or in this
    /// step) shares at least [`IN_BATCH_PREFIX_MIN`] more leading tokens with `toks` than the
    /// `cached` ones. Such a waiting request is better admitted once that prefix is in the
    /// radix cache than now, when it would compute the same tokens a second time (SGLang's
    /// in-batch prefix caching): e.g. the second request of a group sharing a long system
    /// prompt, arriving while the first is halfway through its chunked prefill.
    fn prefix_in_progress(&self, toks: &[u32], cached: usize) -> bool {
        self.running
            .iter()
            .filter(|r| r.output.is_empty() && r.pending() > 0)
            .any(|r| {
                let shared = toks
                    .iter()
                    .zip(&r.prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                shared >= cached + IN_BATCH_PREFIX_MIN
            })
    }

    fn observe_finished(&self, r: &Req) {
        let now = Instant::now();
        let label = self.metrics.label();
        self.metrics
            .num_requests_total
            .with_label_values(&label)
            .inc();
        self.metrics
            .e2e_request_latency
            .with_label_values(&label)
            .observe(now.duration_since(r.arrival).as_secs_f64());
        if let Some(first) = r.first_token_at
            && r.output.len() > 1
        {
            let tpot = now.duration_since(first).as_secs_f64() / (r.output.len() - 1) as f64;
            self.metrics
                .time_per_output_token
                .with_label_values(&label)
                .observe(tpot);
        }
    }

    /// KV slots held by running requests and locked prefixes (not reclaimable by eviction).
    fn used_tokens(&self) -> usize {
        self.pool.used().saturating_sub(self.cache.evictable_size())
    }

    /// Fraction of the KV pool that cannot be reclaimed right now.
    fn token_usage(&self) -> f64 {
        self.used_tokens() as f64 / self.pool.capacity().max(1) as f64
    }

    fn publish_stats(&self) {
        let s = &self.stats;
        s.num_running_reqs
            .store(self.running.len(), Ordering::Relaxed);
        s.num_queue_reqs
            .store(self.waiting.len(), Ordering::Relaxed);
        s.num_used_tokens
            .store(self.used_tokens(), Ordering::Relaxed);
        let label = self.metrics.label();
        let m = &self.metrics;
        m.num_running_reqs
            .with_label_values(&label)
            .set(self.running.len() as f64);
        m.num_queue_reqs
            .with_label_values(&label)
            .set(self.waiting.len() as f64);
        m.num_used_tokens
            .with_label_values(&label)
            .set(self.used_tokens() as f64);
        m.token_usage
            .with_label_values(&label)
            .set(self.token_usage());
        let prompt = s.total_prompt_tokens.load(Ordering::Relaxed);
        let hit = s.total_cached_tokens.load(Ordering::Relaxed);
        m.cache_hit_rate
            .with_label_values(&label)
            .set(if prompt > 0 {
                hit as f64 / prompt as f64
            } else {
                0.0
            });
        if self.running.is_empty() {
            m.gen_throughput.with_label_values(&label).set(0.0);
        }
    }
}
