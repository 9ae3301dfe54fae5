//! A deterministic backend that needs no model.
//!
//! Each KV slot holds one 64-bit value: the hash of the token written there, its position and
//! the value in the slot of the position before it, read through the sequence's `kv_slots` as
//! attention reads its keys. The logits row of a position is one-hot at `hash % vocab`, so a
//! greedy request continues its prompt with [`reference`]'s tokens exactly when the scheduler
//! gave every position the right slot and kept every slot it reads intact: a slot handed to
//! two requests, a cached prefix reused for the wrong tokens, or a placeholder token left in
//! an overlapped pass all change the output.

use std::sync::{Arc, Mutex};

use crate::backend::{Backend, SeqInput};
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

/// The greedy continuation of `prompt`, `n` tokens long, as the fake model computes it.
pub fn reference(prompt: &[u32], n: usize, vocab: usize) -> Vec<u32> {
    let mut h = SEED;
    let mut out = Vec::with_capacity(n);
    let mut pos = 0;
    for &t in prompt {
        h = mix(h, t, pos);
        pos += 1;
    }
    for _ in 0..n {
        let t = next_token(h, vocab);
        out.push(t);
        h = mix(h, t, pos);
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
}

/// Every forward pass the backend ran, shared with the test that owns the scheduler.
pub(super) type PassLog = Arc<Mutex<Vec<Vec<SeqRecord>>>>;

pub(super) struct FakeModel {
    vocab: usize,
    kv: Vec<Option<u64>>,
    log: PassLog,
}

impl FakeModel {
    pub fn new(vocab: usize, kv_capacity: usize, log: PassLog) -> Self {
        FakeModel {
            vocab,
            kv: vec![None; kv_capacity],
            log,
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
        if let Ok(mut log) = self.log.lock() {
            log.push(
                batch
                    .iter()
                    .map(|s| SeqRecord {
                        start_pos: s.start_pos,
                        tokens: s.tokens.len(),
                        num_logits: s.num_logits,
                    })
                    .collect(),
            );
        }
        let mut logits = Vec::new();
        for s in batch {
            let mut hashes = Vec::with_capacity(s.tokens.len());
            for (k, &token) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + k;
                let prev = if pos == 0 {
                    SEED
                } else {
                    let slot = self.slot(s, pos - 1)?;
                    self.kv[slot].ok_or_else(|| {
                        EngineError::Internal(format!("KV slot {slot} read before it was written"))
                    })?
                };
                let h = mix(prev, token, pos);
                let slot = self.slot(s, pos)?;
                self.kv[slot] = Some(h);
                hashes.push(h);
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
