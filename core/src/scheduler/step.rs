//! One scheduler step: plan a batch, give it KV slots, run it, and process what it returns.
//!
//! A step runs in one of two ways.
//!
//! - **Synchronous**: the pass runs and its logits (or device-sampled tokens) are processed at
//!   once. Every request that needs logits on the host (logprobs, grammar masks) goes this way,
//!   and so does every step on a backend that cannot overlap.
//! - **Overlapped** (SGLang's overlap schedule): on a backend whose passes run asynchronously
//!   (a GPU), while every running and waiting request needs nothing but a sampled token, the
//!   scheduler launches pass N+1 before it processes pass N's tokens. The GPU never waits for
//!   the host's bookkeeping (streaming, stop strings, the radix cache, the next plan). A
//!   request whose token of pass N is not yet known decodes in pass N+1 with that token taken
//!   on the device from pass N's output (`DeviceSampling::prev`). A request that finishes
//!   with pass N (EOS, stop string) has run one extra token in pass N+1, which is dropped; its
//!   slot is freed (the pass writes it before any later pass can be given it, as passes run
//!   in order on the device). A pass's prompt tokens go to the radix cache when it is
//!   launched, not when it lands, so that pass N+1 reads the same KV slots as after a
//!   synchronous step (where the cache held a recomputed token already, its copy).
//!
//! Passes refer to requests by id and admission number, so a request aborted or retracted
//! while its pass is in flight is simply skipped when the pass lands.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::pass_stats::PassRecord;
use super::req::{GrammarState, Req};
use super::{Planned, Scheduler};
use crate::backend::{DeviceSampling, LogitEdit, SampleInput, SeqInput};
use crate::cache::{KvPool, RadixCache};
use crate::error::{EngineError, Result};
use crate::request::FinishReason;

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

/// One sequence's share of a pass.
struct Entry {
    id: u64,
    admission: u64,
    /// Position of the pass's first token of this sequence, and how many it ran.
    start: usize,
    n: usize,
    completes: bool,
    prefill: bool,
    /// Logits rows of this sequence in the pass's output.
    nrows: usize,
}

/// Counts for the "Prefill batch" log line.
#[derive(Default, Clone, Copy)]
struct PrefillStats {
    new_seqs: usize,
    new_tokens: usize,
    cached: usize,
}

/// A pass launched on an overlapping backend whose tokens are not yet processed.
pub(super) struct Flight {
    pass: u64,
    entries: Vec<Entry>,
    stats: PrefillStats,
    started: Instant,
    /// Launched while the pass before it was still in flight.
    overlapped: bool,
}

/// When a pass ran (see [`PassRecord`]).
#[derive(Clone, Copy)]
struct Timing {
    launched: Instant,
    completed: Instant,
    overlapped: bool,
}

/// A planned batch with its slots and inputs.
struct Prepared {
    entries: Vec<Entry>,
    tokens: Vec<Vec<u32>>,
    /// Per sequence: its token is the `j`-th sampled by the pass in flight.
    prev: Vec<Option<u32>>,
    stats: PrefillStats,
}

impl Scheduler {
    /// Whether the next pass may be launched before the one in flight is processed: the
    /// backend overlaps and no running or waiting request needs logits on the host or logits
    /// edits that depend on the token still being sampled.
    fn overlap_ready(&mut self) -> bool {
        !self.cfg.disable_overlap_schedule
            && self.backend.overlap().is_some()
            && self
                .running
                .iter()
                .chain(self.waiting.iter())
                .all(|r| r.samples_anywhere())
    }

    pub(super) fn step(&mut self) -> Result<()> {
        let overlap = self.overlap_ready();
        if !overlap && let Some(f) = self.flight.take() {
            self.land(f)?;
        }
        let admissions = self.admissions;
        let plan = self.plan();
        if self.admissions != admissions {
            // Requests just admitted show as running for the whole pass, not only after it:
            // a long prefill would otherwise read as an idle engine with a waiting request
            // (the autoscaler's busy share samples these gauges).
            self.publish_stats();
        }
        if plan.is_empty() {
            if let Some(f) = self.flight.take() {
                return self.land(f);
            }
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
        let Some(prep) = self.prepare(&plan) else {
            return Ok(());
        };
        if overlap {
            self.launch(prep)
        } else {
            self.run_sync(prep)
        }
    }

    /// Slots and input tokens for the planned sequences. `None` (the step undone) if the pool
    /// cannot provide the planned slots, which would be a bookkeeping bug.
    fn prepare(&mut self, plan: &[Planned]) -> Option<Prepared> {
        let mut entries = Vec::with_capacity(plan.len());
        let mut tokens: Vec<Vec<u32>> = Vec::with_capacity(plan.len());
        let mut prev = Vec::with_capacity(plan.len());
        let mut stats = PrefillStats::default();
        for p in plan {
            let Some(new) = self.alloc(p.n) else {
                tracing::error!("KV pool could not provide {} planned slots", p.n);
                for e in &entries {
                    let e: &Entry = e;
                    if let Some(r) = self.running.iter_mut().find(|r| r.id == e.id)
                        && let Err(err) = r.kv.shrink(e.start, &mut self.pool)
                    {
                        tracing::error!("{err}");
                    }
                }
                return None;
            };
            let r = &mut self.running[p.idx];
            let start = r.kv.len();
            match r.inflight {
                // The token is being sampled by the pass in flight.
                Some((_, j)) if !p.prefill => {
                    tokens.push(vec![0]);
                    prev.push(Some(j));
                }
                _ => {
                    tokens.push((start..start + p.n).map(|i| r.token_at(i)).collect());
                    prev.push(None);
                }
            }
            if p.prefill {
                stats.new_tokens += p.n;
                if start == r.cached_tokens {
                    stats.new_seqs += 1;
                    stats.cached += r.cached_tokens;
                }
            }
            r.kv.grow(&new);
            entries.push(Entry {
                id: r.id,
                admission: r.admission,
                start,
                n: p.n,
                completes: p.completes,
                prefill: p.prefill,
                nrows: r.logit_rows(start, p.n, p.completes),
            });
        }
        Some(Prepared {
            entries,
            tokens,
            prev,
            stats,
        })
    }

    /// Index in `running` of each request by id.
    fn running_index(&self) -> HashMap<u64, usize> {
        self.running
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, i))
            .collect()
    }

    /// The backend's view of the pass (the requests' slots, borrowed from `running`).
    fn inputs<'a>(
        running: &'a [Req],
        prep: &'a Prepared,
        at: &HashMap<u64, usize>,
    ) -> Vec<SeqInput<'a>> {
        prep.entries
            .iter()
            .zip(&prep.tokens)
            .filter_map(|(e, t)| {
                let r = &running[*at.get(&e.id)?];
                Some(SeqInput {
                    tokens: t,
                    start_pos: e.start,
                    kv_slots: r.kv.slots(),
                    num_logits: e.nrows,
                    prompt: e.prefill,
                })
            })
            .collect()
    }

    /// Per-row parameters and logits edits for sampling on the backend's device, when the
    /// backend can and no sequence of the pass needs its logits on the host (logprobs,
    /// grammar). Draws the sampling requests' random numbers only when it returns `Some`.
    fn device_sampling(
        &mut self,
        entries: &[Entry],
        at: &HashMap<u64, usize>,
    ) -> Option<(Vec<SampleInput>, Vec<LogitEdit>)> {
        self.backend.device_sampler()?;
        let eligible = entries.iter().all(|e| {
            e.nrows == usize::from(e.completes)
                && (!e.completes
                    || at
                        .get(&e.id)
                        .is_some_and(|&i| self.running[i].samples_with_edits()))
        });
        if !eligible {
            return None;
        }
        let vocab = self.backend.vocab_size();
        let mut params = Vec::new();
        let mut edits = Vec::new();
        for e in entries.iter().filter(|e| e.completes) {
            let &i = at.get(&e.id)?;
            let r = &mut self.running[i];
            let seq = params.len() as u32;
            params.push(r.device_sample_input());
            edits.extend(
                r.logit_edits(vocab)
                    .into_iter()
                    .map(|(token, rep, add)| LogitEdit {
                        seq,
                        token,
                        rep,
                        add,
                    }),
            );
        }
        Some((params, edits))
    }

    /// Launch the pass, then process the one before it (if any) while this one runs.
    fn launch(&mut self, prep: Prepared) -> Result<()> {
        let at = self.running_index();
        let Some((params, edits)) = self.device_sampling(&prep.entries, &at) else {
            return Err(EngineError::Internal(
                "an overlapped pass must sample on the device".into(),
            ));
        };
        let started = Instant::now();
        let inputs = Self::inputs(&self.running, &prep, &at);
        let sampling = DeviceSampling {
            params: &params,
            edits: &edits,
            prev: &prep.prev,
        };
        let Some(overlap) = self.backend.overlap() else {
            return Err(EngineError::Internal(
                "an overlapped pass needs a backend that overlaps".into(),
            ));
        };
        overlap.launch_sample(&inputs, sampling)?;
        drop(inputs);
        // The pass's prompt tokens go to the radix cache now, as a synchronous step's do once
        // it ran, so that the next pass (prepared before this one lands) reads the same slots
        // as it would after a synchronous step: where the cache already held some of these
        // tokens (a request recomputing the last token of a cached prompt, for its logits),
        // its copies replace the request's own. The device runs passes in order, so every
        // pass that can read these slots, or be given the duplicates freed here, runs after
        // this one has written them.
        for e in prep.entries.iter().filter(|e| e.prefill) {
            if let Some(&i) = at.get(&e.id) {
                Self::cache_prompt(&mut self.running[i], e, &mut self.cache, &mut self.pool);
            }
        }
        self.passes += 1;
        let pass = self.passes;
        for (j, e) in prep.entries.iter().filter(|e| e.completes).enumerate() {
            if let Some(&i) = at.get(&e.id) {
                self.running[i].inflight = Some((pass, j as u32));
            }
        }
        let flight = Flight {
            pass,
            entries: prep.entries,
            stats: prep.stats,
            started,
            overlapped: self.flight.is_some(),
        };
        match self.flight.replace(flight) {
            Some(prev) => self.land(prev),
            None => Ok(()),
        }
    }

    /// Hand the KV of a request's tokens up to the end of its prompt work in pass entry `e` to
    /// the radix cache (see [`super::lease::KvLease::cache_computed`]). Slots past them belong
    /// to a later pass and stay as they are.
    fn cache_prompt(r: &mut Req, e: &Entry, cache: &mut RadixCache, pool: &mut KvPool) {
        let n = e.start + e.n;
        let toks: Vec<u32> = (0..n).map(|i| r.token_at(i)).collect();
        if let Err(err) = r.kv.cache_computed(&toks, cache, pool) {
            tracing::error!("caching request {}: {err}", r.id);
        }
    }

    /// Collect the tokens of the oldest pass in flight and process them.
    fn land(&mut self, f: Flight) -> Result<()> {
        let Some(overlap) = self.backend.overlap() else {
            return Err(EngineError::Internal(
                "a pass in flight on a backend that does not overlap".into(),
            ));
        };
        let tokens = overlap.collect()?;
        let timing = Timing {
            launched: f.started,
            completed: Instant::now(),
            overlapped: f.overlapped,
        };
        self.process(
            &f.entries,
            Sampled::Tokens(tokens),
            Some(f.pass),
            f.stats,
            timing,
        );
        Ok(())
    }

    /// Run the pass and process it at once.
    fn run_sync(&mut self, prep: Prepared) -> Result<()> {
        let at = self.running_index();
        // Grammar states of the requests that sample this step; their masks are computed
        // while the forward pass runs.
        let vocab = self.backend.vocab_size();
        let mut grammar_jobs: Vec<(u64, GrammarState)> = Vec::new();
        for e in &prep.entries {
            let Some(&i) = at.get(&e.id) else { continue };
            let r = &mut self.running[i];
            let samples = e.completes && !(r.output.is_empty() && r.params.max_new_tokens == 0);
            if samples && let Some(g) = r.grammar.take() {
                grammar_jobs.push((e.id, g));
            }
        }
        let device = if grammar_jobs.is_empty() {
            self.device_sampling(&prep.entries, &at)
        } else {
            None
        };
        let started = Instant::now();
        let inputs = Self::inputs(&self.running, &prep, &at);
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
            let forward = match &device {
                Some((params, edits)) => match backend.device_sampler() {
                    Some(sampler) => sampler
                        .forward_sample(
                            &inputs,
                            DeviceSampling {
                                params,
                                edits,
                                prev: &[],
                            },
                        )
                        .map(Sampled::Tokens),
                    None => Err(EngineError::Internal(
                        "device sampling on a backend without a device sampler".into(),
                    )),
                },
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
        let completed = Instant::now();
        drop(inputs);
        for (id, g) in grammar_jobs {
            if let Some(&i) = at.get(&id) {
                self.running[i].grammar = Some(g);
            }
        }
        let result = forward?;
        let timing = Timing {
            launched: started,
            completed,
            overlapped: false,
        };
        self.process(&prep.entries, result, None, prep.stats, timing);
        Ok(())
    }

    /// Process a pass's output: prompt logprob rows, sampled tokens, finished requests, the
    /// radix cache for computed prompts, metrics and log lines. `pass` is set for an
    /// overlapped pass (whose requests may have left or been re-admitted meanwhile).
    fn process(
        &mut self,
        entries: &[Entry],
        result: Sampled,
        pass: Option<u64>,
        stats: PrefillStats,
        timing: Timing,
    ) {
        let at = self.running_index();
        let (running, queued) = (self.running.len(), self.waiting.len());
        let vocab = self.backend.vocab_size();
        let (mut logits, device_tokens) = match result {
            Sampled::Logits(l) => (l, None),
            Sampled::Tokens(t) => (Vec::new(), Some(t)),
        };
        let mut sampled_row = 0;
        let mut finished = Vec::new();
        let mut row = 0;
        let mut generated = 0u64;
        for e in entries {
            let first_row = row;
            row += e.nrows;
            let device_token = device_tokens.as_ref().map(|t| t.get(sampled_row).copied());
            if e.completes {
                sampled_row += 1;
            }
            let Some(&idx) = at.get(&e.id) else { continue };
            if self.running[idx].admission != e.admission {
                continue;
            }
            let r = &mut self.running[idx];
            if let Some(p) = pass
                && r.inflight.is_some_and(|(q, _)| q == p)
            {
                r.inflight = None;
            }
            if e.prefill && pass.is_none() {
                // Make the computed prompt shareable right away (also for chunks). An
                // overlapped pass's prompt went to the cache when it was launched.
                Self::cache_prompt(r, e, &mut self.cache, &mut self.pool);
            }
            // This sequence's rows are those of positions `end - nrows .. end`; all but a
            // completing pass's last row are prompt rows (prompt logprobs).
            let end = e.start + e.n;
            let prompt_rows = if e.completes {
                e.nrows.saturating_sub(1)
            } else {
                e.nrows
            };
            for k in 0..prompt_rows {
                let at = (first_row + k) * vocab;
                match logits.get(at..at + vocab) {
                    Some(l) => {
                        r.take_prompt_row(end - e.nrows + k, l);
                    }
                    None => tracing::error!("backend returned too few logits"),
                }
            }
            if !e.completes {
                continue;
            }
            r.send_prompt_logprobs();
            if r.output.is_empty() && r.params.max_new_tokens == 0 {
                // Prefill only: the prompt is now computed (and cached) and nothing is sampled.
                finished.push((idx, Outcome::Finished(FinishReason::Length { length: 0 })));
                continue;
            }
            if r.params.grammar.is_some() && r.grammar.is_none() {
                finished.push((
                    idx,
                    Outcome::Failed("the request's grammar state was lost".into()),
                ));
                continue;
            }
            let sampled = match device_token {
                Some(Some(token)) => Ok((token, None)),
                Some(None) => {
                    finished.push((
                        idx,
                        Outcome::Failed("the backend sampled too few tokens".into()),
                    ));
                    continue;
                }
                None => {
                    let at = (first_row + e.nrows.saturating_sub(1)) * vocab;
                    let Some(l) = logits.get_mut(at..at + vocab) else {
                        finished.push((
                            idx,
                            Outcome::Failed("the backend returned too few logits".into()),
                        ));
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
                    finished.push((idx, Outcome::Failed(message)));
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
                finished.push((idx, Outcome::Finished(reason)));
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
        if !logits.is_empty() {
            self.backend.recycle_logits(logits);
        }

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
        self.record_pass(entries, timing, generated, running, queued);
        let step_secs = timing
            .completed
            .saturating_duration_since(timing.launched)
            .as_secs_f64();
        self.log_step(stats, step_secs);
    }

    /// Account for a processed pass in the pass statistics.
    fn record_pass(
        &mut self,
        entries: &[Entry],
        timing: Timing,
        sampled: u64,
        running: usize,
        queued: usize,
    ) {
        let mut p = PassRecord {
            launched: timing.launched,
            completed: timing.completed,
            overlapped: timing.overlapped,
            decode_seqs: 0,
            prefill_tokens: 0,
            prefill_seqs: 0,
            sampled_tokens: sampled,
            running: running as u64,
            queued: queued as u64,
        };
        for e in entries {
            if e.prefill {
                p.prefill_tokens += e.n as u64;
                p.prefill_seqs += 1;
            } else {
                p.decode_seqs += 1;
            }
        }
        self.pass_stats.record(&p);
    }

    fn log_step(&mut self, stats: PrefillStats, step_secs: f64) {
        if stats.new_tokens > 0 {
            tracing::info!(
                "Prefill batch. #new-seq: {}, #new-token: {}, #cached-token: {}, token usage: {:.2}, #running-req: {}, #queue-req: {} ({:.1} ms)",
                stats.new_seqs,
                stats.new_tokens,
                stats.cached,
                self.token_usage(),
                self.running.len(),
                self.waiting.len(),
                step_secs * 1e3
            );
            return;
        }
        self.decode_steps += 1;
        self.token_ratio.decayed();
        if self.decode_steps.is_multiple_of(super::DECODE_LOG_INTERVAL) {
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
}
