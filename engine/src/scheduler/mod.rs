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

mod launch;
mod req;

pub use launch::launch;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::{Backend, SampleInput, SeqInput};
use crate::cache::{KvPool, RadixCache};
use crate::config::SchedulePolicy;
use crate::engine::{PendingRequest, SchedulerMsg, SchedulerStats};
use crate::error::Result;
use crate::metrics::Metrics;
use crate::request::FinishReason;
use crate::tokenizer::Tokenizer;
use req::{GrammarState, Req};

/// What a forward pass returned: logits rows, or tokens sampled on the backend's device.
enum Sampled {
    Logits(Vec<f32>),
    Tokens(Vec<u32>),
}

/// How a request in this step's batch ends.
enum Outcome {
    Finished(FinishReason),
    /// The request failed (its grammar broke); the message goes to the client.
    Failed(String),
}

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
}

/// Waiting queues longer than this are served first-come-first-served even under `lpm`
/// (sorting by prefix match costs a tree walk per request).
const LPM_MAX_QUEUE: usize = 128;
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
    decode_steps: u64,
    log_tokens: u64,
    log_since: Instant,
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
        Scheduler {
            pool: KvPool::new(capacity),
            cache: RadixCache::new(cfg.disable_radix_cache),
            waiting: VecDeque::new(),
            running: Vec::new(),
            rng: StdRng::seed_from_u64(cfg.random_seed),
            backend,
            rx,
            tokenizer,
            cfg,
            metrics,
            stats,
            decode_steps: 0,
            log_tokens: 0,
            log_since: Instant::now(),
        }
    }

    /// Run until every handle to the engine is dropped.
    pub fn run(mut self) {
        self.stats.alive.store(true, Ordering::Release);
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                self.publish_stats();
                match self.rx.recv() {
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
            self.reap_disconnected();
            if let Err(e) = self.step() {
                tracing::error!("forward pass failed: {e}");
                let reqs: Vec<Req> = self.running.drain(..).collect();
                for mut r in reqs {
                    r.fail(format!("the engine failed to run this request: {e}"));
                    self.release(&mut r);
                }
            }
            self.publish_stats();
        }
        self.stats.alive.store(false, Ordering::Release);
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
        }
    }

    fn enqueue(&mut self, p: PendingRequest) {
        let seed: u64 = self.rng.random();
        let req = Req::new(
            p.id,
            p.req.rid,
            p.req.input_ids,
            p.req.sampling,
            p.req.logprobs,
            seed,
            &self.cfg.eos_token_ids,
            p.events,
            p.arrival,
            if p.req.detokenize {
                self.tokenizer.clone()
            } else {
                None
            },
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
        self.metrics
            .prompt_tokens_total
            .with_label_values(&self.metrics.label())
            .inc_by(req.prompt.len() as u64);
        self.stats
            .total_prompt_tokens
            .fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
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
    fn release(&mut self, r: &mut Req) {
        let n = r.slots.len();
        let tokens: Vec<u32> = (0..n).map(|i| r.token_at(i)).collect();
        if let Err(e) =
            self.cache
                .cache_finished_request(&tokens, &r.slots, r.last_node, &mut self.pool)
        {
            tracing::error!("releasing request {}: {e}", r.id);
        }
        r.slots.clear();
        r.last_node = self.cache.root();
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

    fn order_waiting(&mut self) {
        if self.cfg.policy == SchedulePolicy::Lpm
            && self.waiting.len() > 1
            && self.waiting.len() <= LPM_MAX_QUEUE
        {
            let mut v: Vec<(usize, Req)> = self
                .waiting
                .drain(..)
                .map(|r| {
                    let toks = r.all_tokens();
                    (self.cache.peek_prefix_len(&toks[..r.match_key_len()]), r)
                })
                .collect();
            v.sort_by_key(|e| std::cmp::Reverse(e.0));
            self.waiting = v.into_iter().map(|(_, r)| r).collect();
        }
    }

    /// Move the newest running request back to the waiting queue, freeing its slots.
    fn retract_one(&mut self) -> bool {
        let Some(mut r) = self.running.pop() else {
            return false;
        };
        tracing::info!(
            "KV cache full: retracting request {} ({} tokens) to the waiting queue",
            r.id,
            r.total_len()
        );
        self.release(&mut r);
        self.waiting.push_front(r);
        true
    }

    /// Admit a waiting request: match its prefix in the radix cache and lock it. The match is
    /// cut short where the request needs logits rows of its prompt (prompt logprobs).
    fn admit(&mut self, mut r: Req) -> Req {
        let toks = r.all_tokens();
        let m = self.cache.match_prefix(&toks[..r.match_key_len()]);
        self.cache.inc_lock_ref(m.last_node);
        if r.output.is_empty() {
            r.cached_tokens = m.slots.len();
            self.stats
                .total_cached_tokens
                .fetch_add(m.slots.len() as u64, Ordering::Relaxed);
        }
        r.slots = m.slots;
        r.last_node = m.last_node;
        r
    }

    fn plan(&mut self) -> Vec<Planned> {
        // Decodes first: one slot each, retracting the newest requests if the pool is full.
        loop {
            let decodes = self.running.iter().filter(|r| r.pending() == 1).count();
            if self.free_capacity() >= decodes || !self.retract_one() {
                break;
            }
        }
        let mut budget = self.cfg.chunked_prefill_size.unwrap_or(usize::MAX);
        let mut plan = Vec::new();
        for (idx, r) in self.running.iter().enumerate() {
            if r.pending() == 1 && !r.output.is_empty() {
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
            if r.pending() == 1 && !r.output.is_empty() {
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
        // New requests.
        self.order_waiting();
        while budget > 0 && self.running.len() < self.cfg.max_running_requests {
            let Some(front) = self.waiting.front() else {
                break;
            };
            // Cheap check before touching the tree: the uncached part must fit, unless it is
            // longer than one chunk anyway (then it starts now and continues as room frees up).
            let toks = front.all_tokens();
            let need = toks.len() - self.cache.peek_prefix_len(&toks[..front.match_key_len()]);
            let room = avail.saturating_sub(1);
            if room == 0 || (need > room && need <= budget) {
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
                self.cache.dec_lock_ref(r.last_node);
                r.slots.clear();
                r.last_node = self.cache.root();
                self.waiting.push_front(r);
                break;
            }
            budget -= n;
            avail -= n + 1;
            let completes = n == r.pending();
            self.running.push(r);
            plan.push(Planned {
                idx: self.running.len() - 1,
                n,
                completes,
                prefill: true,
            });
        }
        plan
    }

    fn step(&mut self) -> Result<()> {
        let plan = self.plan();
        if plan.is_empty() {
            if !self.running.is_empty() {
                // Prefills stalled on a full cache: let the newest request give way.
                self.retract_one();
            } else if !self.waiting.is_empty() {
                // Nothing fits even with an empty batch: only possible if the cache holds
                // everything locked, which cannot happen with no running request.
                tracing::error!("no request fits in the KV cache; failing the head of the queue");
                if let Some(r) = self.waiting.pop_front() {
                    r.fail("the request does not fit in the KV cache".into());
                }
            }
            return Ok(());
        }
        // Slots for this step's tokens.
        let mut starts = Vec::with_capacity(plan.len());
        let mut tokens: Vec<Vec<u32>> = Vec::with_capacity(plan.len());
        for p in &plan {
            let Some(new) = self.alloc(p.n) else {
                // Planned within free capacity, so this is a bookkeeping bug; undo this step.
                tracing::error!("KV pool could not provide {} planned slots", p.n);
                for (q, &s) in plan.iter().zip(&starts) {
                    let r = &mut self.running[q.idx];
                    let extra = r.slots.split_off(s);
                    if let Err(e) = self.pool.free(&extra) {
                        tracing::error!("{e}");
                    }
                }
                return Ok(());
            };
            let r = &mut self.running[p.idx];
            let start = r.slots.len();
            tokens.push((start..start + p.n).map(|i| r.token_at(i)).collect());
            starts.push(start);
            r.slots.extend_from_slice(&new);
        }
        // Grammar states of the requests that sample this step; their masks are computed
        // while the forward pass runs.
        let vocab = self.backend.vocab_size();
        let mut grammar_jobs: Vec<(usize, GrammarState)> = Vec::new();
        for p in &plan {
            let r = &mut self.running[p.idx];
            let samples = p.completes && !(r.output.is_empty() && r.params.max_new_tokens == 0);
            if samples && let Some(g) = r.grammar.take() {
                grammar_jobs.push((p.idx, g));
            }
        }
        // When every sampling request needs nothing but a token, the backend may sample on its
        // own device and no logits leave it.
        let rows: Vec<usize> = plan
            .iter()
            .zip(&starts)
            .map(|(p, &start)| self.running[p.idx].logit_rows(start, p.n, p.completes))
            .collect();
        let device_params = self.device_sample_params(&plan, &rows, grammar_jobs.is_empty());
        let inputs: Vec<SeqInput<'_>> = plan
            .iter()
            .zip(&tokens)
            .zip(&starts)
            .zip(&rows)
            .map(|(((p, t), &start), &nrows)| {
                let r = &self.running[p.idx];
                SeqInput {
                    tokens: t,
                    start_pos: start,
                    kv_slots: &r.slots,
                    num_logits: nrows,
                }
            })
            .collect();
        let started = Instant::now();
        let backend = &mut self.backend;
        let (forward, grammar_jobs) = std::thread::scope(|scope| {
            let worker = (!grammar_jobs.is_empty()).then(|| {
                let mut jobs = std::mem::take(&mut grammar_jobs);
                scope.spawn(move || {
                    for (_, g) in jobs.iter_mut() {
                        g.fill_mask(vocab);
                    }
                    jobs
                })
            });
            let forward = match &device_params {
                Some(params) => backend.forward_sample(&inputs, params).map(Sampled::Tokens),
                None => backend.forward(&inputs).map(Sampled::Logits),
            };
            let jobs = match worker {
                // `fill_mask` catches panics, so the worker cannot fail; if it did, the
                // states are lost and their requests fail below.
                Some(w) => w.join().unwrap_or_default(),
                None => std::mem::take(&mut grammar_jobs),
            };
            (forward, jobs)
        });
        drop(inputs);
        for (idx, g) in grammar_jobs {
            self.running[idx].grammar = Some(g);
        }
        let (mut logits, device_tokens) = match forward? {
            Sampled::Logits(l) => (l, None),
            Sampled::Tokens(t) => (Vec::new(), Some(t)),
        };
        let mut sampled_row = 0;
        let step_secs = started.elapsed().as_secs_f64();

        let mut finished = Vec::new();
        let mut row = 0;
        let mut generated = 0u64;
        let (mut new_seqs, mut new_tokens, mut cached) = (0usize, 0usize, 0usize);
        for ((p, &start), &nrows) in plan.iter().zip(&starts).zip(&rows) {
            if p.prefill {
                let r = &self.running[p.idx];
                new_tokens += p.n;
                if r.slots.len() == p.n + r.cached_tokens {
                    new_seqs += 1;
                    cached += r.cached_tokens;
                }
            }
            if p.prefill {
                // Make the computed prompt shareable right away (also for chunks).
                let r = &mut self.running[p.idx];
                let n = r.slots.len();
                let toks: Vec<u32> = (0..n).map(|i| r.token_at(i)).collect();
                match self.cache.cache_unfinished_request(
                    &toks,
                    &r.slots,
                    r.last_node,
                    &mut self.pool,
                ) {
                    Ok(m) => {
                        r.slots = m.slots;
                        r.last_node = m.last_node;
                    }
                    Err(e) => tracing::error!("caching request {}: {e}", r.id),
                }
            }
            // This sequence's rows are those of positions `end - nrows .. end`; all but a
            // completing pass's last row are prompt rows (prompt logprobs).
            let first_row = row;
            row += nrows;
            let end = start + p.n;
            let r = &mut self.running[p.idx];
            let prompt_rows = if p.completes {
                nrows.saturating_sub(1)
            } else {
                nrows
            };
            for k in 0..prompt_rows {
                let at = (first_row + k) * vocab;
                match logits.get(at..at + vocab) {
                    Some(l) => {
                        r.take_prompt_row(end - nrows + k, l);
                    }
                    None => tracing::error!("backend returned too few logits"),
                }
            }
            if !p.completes {
                continue;
            }
            r.send_prompt_logprobs();
            let device_token = device_tokens.as_ref().map(|t| t.get(sampled_row).copied());
            sampled_row += 1;
            if r.output.is_empty() && r.params.max_new_tokens == 0 {
                // Prefill only: the prompt is now computed (and cached) and nothing is sampled.
                finished.push((p.idx, Outcome::Finished(FinishReason::Length { length: 0 })));
                continue;
            }
            if r.params.grammar.is_some() && r.grammar.is_none() {
                finished.push((
                    p.idx,
                    Outcome::Failed("the request's grammar state was lost".into()),
                ));
                continue;
            }
            let sampled = match device_token {
                Some(Some(token)) => Ok((token, None)),
                Some(None) => {
                    tracing::error!("backend sampled too few tokens");
                    continue;
                }
                None => {
                    let at = (first_row + nrows.saturating_sub(1)) * vocab;
                    let Some(l) = logits.get_mut(at..at + vocab) else {
                        tracing::error!("backend returned too few logits");
                        continue;
                    };
                    r.sample(l).and_then(|(token, logprob)| {
                        r.accept_grammar(token).map(|()| (token, logprob))
                    })
                }
            };
            let (token, logprob) = match sampled {
                Ok(t) => t,
                Err(message) => {
                    tracing::error!(rid = %r.rid, "{message}");
                    finished.push((p.idx, Outcome::Failed(message)));
                    continue;
                }
            };
            let now = Instant::now();
            if r.first_token_at.is_none() {
                r.first_token_at = Some(now);
                self.metrics
                    .time_to_first_token
                    .with_label_values(&self.metrics.label())
                    .observe(now.duration_since(r.arrival).as_secs_f64());
            }
            generated += 1;
            if let Some(reason) = r.push_token(
                token,
                logprob,
                &self.cfg.eos_token_ids,
                self.cfg.context_length,
            ) {
                finished.push((p.idx, Outcome::Finished(reason)));
            }
        }
        self.metrics
            .generation_tokens_total
            .with_label_values(&self.metrics.label())
            .inc_by(generated);
        self.stats
            .total_generated
            .fetch_add(generated, Ordering::Relaxed);
        self.log_tokens += generated;

        // Remove finished requests (highest index first so indices stay valid).
        finished.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (idx, outcome) in finished {
            let mut r = self.running.remove(idx);
            match outcome {
                Outcome::Finished(reason) => {
                    self.observe_finished(&r);
                    if self.cfg.log_requests {
                        tracing::info!(rid = %r.rid, completion_tokens = r.output.len(), reason = ?reason, "request finished");
                    }
                    r.finish(reason);
                }
                Outcome::Failed(message) => r.fail(message),
            }
            self.release(&mut r);
        }

        if new_tokens > 0 {
            tracing::info!(
                "Prefill batch. #new-seq: {new_seqs}, #new-token: {new_tokens}, #cached-token: {cached}, token usage: {:.2}, #running-req: {}, #queue-req: {} ({:.1} ms)",
                self.token_usage(),
                self.running.len(),
                self.waiting.len(),
                step_secs * 1e3
            );
        } else {
            self.decode_steps += 1;
            if self.decode_steps.is_multiple_of(DECODE_LOG_INTERVAL) {
                let secs = self.log_since.elapsed().as_secs_f64().max(1e-9);
                let tput = self.log_tokens as f64 / secs;
                self.metrics
                    .gen_throughput
                    .with_label_values(&self.metrics.label())
                    .set(tput);
                tracing::info!(
                    "Decode batch. #running-req: {}, #token: {}, token usage: {:.2}, gen throughput (token/s): {:.2}, #queue-req: {}",
                    self.running.len(),
                    self.used_tokens(),
                    self.token_usage(),
                    tput,
                    self.waiting.len()
                );
                self.log_tokens = 0;
                self.log_since = Instant::now();
            }
        }
        Ok(())
    }

    /// Per-row parameters for sampling on the backend's device, when the backend can and no
    /// request of this step needs its logits on the host (logprobs, penalties, bias, grammar).
    /// Draws the sampling requests' random numbers only when it returns `Some`.
    fn device_sample_params(
        &mut self,
        plan: &[Planned],
        rows: &[usize],
        no_grammar: bool,
    ) -> Option<Vec<SampleInput>> {
        if !no_grammar || !self.backend.samples_on_device() {
            return None;
        }
        let eligible = plan.iter().zip(rows).all(|(p, &nrows)| {
            nrows == usize::from(p.completes)
                && (!p.completes || self.running[p.idx].samples_anywhere())
        });
        if !eligible {
            return None;
        }
        Some(
            plan.iter()
                .filter(|p| p.completes)
                .map(|p| self.running[p.idx].device_sample_input())
                .collect(),
        )
    }

    fn observe_finished(&self, r: &Req) {
        let now = Instant::now();
        let label = self.metrics.label();
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
