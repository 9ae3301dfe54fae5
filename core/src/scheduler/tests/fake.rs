//! A deterministic backend that needs no model.
//!
//! Each KV slot holds one 64-bit value: the hash of the token written there, its position and
//! the values in the slots of every position before it, read through the sequence's `kv_slots`
//! as attention reads its keys. The logits row of a position is one-hot at a hash of these, so
//! a greedy request continues its prompt with [`reference`]'s tokens exactly when the scheduler
//! gave every position the right slot and kept every slot it reads intact: a slot handed to
//! two requests, a cached prefix reused for the wrong tokens, a slot overwritten after it was
//! read once, or a placeholder token left in an overlapped pass all change the output.
//!
//! With `shape_dependent_kv` the value stored also depends on how many tokens the sequence ran
//! in that pass, as a real device's rounding does (a prompt token computed in a long prefill
//! and the same token recomputed alone differ in their last bits); the logits of the pass do
//! not. Then two copies of the same token's KV (the radix cache's and a request's recomputed
//! one) are told apart by whatever reads them later.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::backend::{Backend, SeqInput};
use crate::engine::SchedulerStats;
use crate::error::{EngineError, Result};

const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The value written to the KV slot of token `token` at position `pos` after `prev`.
fn mix(prev: u64, token: u32, pos: usize) -> u64 {
    let mut h = prev ^ (u64::from(token) << 32) ^ pos as u64;
    h = h.wrapping_add(SEED);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn next_token(h: u64, vocab: usize) -> u32 {
    (h % vocab as u64) as u32
}

/// Folds the value of one more position into the running digest of a sequence.
fn fold(acc: u64, value: u64) -> u64 {
    mix(acc, (value >> 32) as u32, value as u32 as usize)
}

/// The greedy continuation of `prompt`, `n` tokens long, as the fake model computes it.
pub fn reference(prompt: &[u32], n: usize, vocab: usize) -> Vec<u32> {
    let mut acc = SEED;
    let mut out = Vec::with_capacity(n);
    let mut pos = 0;
    for &t in prompt {
        acc = fold(acc, mix(acc, t, pos));
        pos += 1;
    }
    for _ in 0..n {
        let t = next_token(acc, vocab);
        out.push(t);
        acc = fold(acc, mix(acc, t, pos));
        pos += 1;
    }
    out
}

/// One sequence of one pass, as the backend saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqRecord {
    pub start_pos: usize,
    pub tokens: usize,
    pub num_logits: usize,
    pub prompt: bool,
}

/// Every forward pass the backend ran, shared with the test that owns the scheduler.
pub(super) type PassLog = Arc<Mutex<Vec<Vec<SeqRecord>>>>;

/// The running requests the scheduler had published (`SchedulerStats::num_running_reqs`, what
/// `/metrics` serves) as each pass ran.
pub(super) type RunningSeen = Arc<Mutex<Vec<usize>>>;

pub(super) struct FakeModel {
    vocab: usize,
    kv: Vec<Option<u64>>,
    log: PassLog,
    shape_dependent_kv: bool,
    stats: Arc<SchedulerStats>,
    running_seen: RunningSeen,
}

impl FakeModel {
    pub fn new(
        vocab: usize,
        kv_capacity: usize,
        log: PassLog,
        shape_dependent_kv: bool,
        stats: Arc<SchedulerStats>,
        running_seen: RunningSeen,
    ) -> Self {
        FakeModel {
            vocab,
            kv: vec![None; kv_capacity],
            log,
            shape_dependent_kv,
            stats,
            running_seen,
        }
    }

    fn slot(&self, s: &SeqInput<'_>, pos: usize) -> Result<usize> {
        let slot = *s.kv_slots.get(pos).ok_or_else(|| {
            EngineError::Internal(format!("{} KV slots for position {pos}", s.kv_slots.len()))
        })? as usize;
        if slot >= self.kv.len() {
            return Err(EngineError::Internal(format!(
                "KV slot {slot} out of range"
            )));
        }
        Ok(slot)
    }
}

impl Backend for FakeModel {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        if let Ok(mut seen) = self.running_seen.lock() {
            seen.push(self.stats.num_running_reqs.load(Ordering::Relaxed));
        }
        if let Ok(mut log) = self.log.lock() {
            log.push(
                batch
                    .iter()
                    .map(|s| SeqRecord {
                        start_pos: s.start_pos,
                        tokens: s.tokens.len(),
                        num_logits: s.num_logits,
                        prompt: s.prompt,
                    })
                    .collect(),
            );
        }
        let mut logits = Vec::new();
        for s in batch {
            let mut hashes = Vec::with_capacity(s.tokens.len());
            for (k, &token) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + k;
                // Every earlier position's slot is read, as attention reads every key.
                let mut acc = SEED;
                for i in 0..pos {
                    let slot = self.slot(s, i)?;
                    let v = self.kv[slot].ok_or_else(|| {
                        EngineError::Internal(format!("KV slot {slot} read before it was written"))
                    })?;
                    acc = fold(acc, v);
                }
                let v = mix(acc, token, pos);
                let slot = self.slot(s, pos)?;
                self.kv[slot] = Some(if self.shape_dependent_kv {
                    v ^ (s.tokens.len() as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)
                } else {
                    v
                });
                hashes.push(fold(acc, v));
            }
            let rows = s.num_logits.min(hashes.len());
            for &h in &hashes[hashes.len() - rows..] {
                let mut row = vec![0.0f32; self.vocab];
                row[next_token(h, self.vocab) as usize] = 4.0;
                logits.extend_from_slice(&row);
            }
        }
        Ok(logits)
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn kv_capacity(&self) -> usize {
        self.kv.len()
    }

    fn describe(&self) -> String {
        "fake model".into()
    }
}
