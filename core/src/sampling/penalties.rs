//! Per-request logit adjustments applied before sampling: repetition, frequency and presence
//! penalties, `logit_bias`, and `min_new_tokens`.
//!
//! State is kept per touched token id only (counts of output tokens, the set of ids seen in
//! the prompt and the output), so one step costs one pass over those ids, never a pass over
//! the vocabulary. The order is: repetition penalty, then frequency and presence penalties,
//! then `logit_bias`, then the `min_new_tokens` mask.

use std::collections::{HashMap, HashSet};

use crate::request::SamplingParams;

/// The adjustments one request asked for, and the token history they depend on.
#[derive(Debug, Clone)]
pub struct LogitProcessor {
    frequency: f32,
    presence: f32,
    repetition: f32,
    /// Times each id occurred in the output (only with frequency or presence penalties).
    counts: HashMap<u32, u32>,
    /// Ids of the prompt and the output (only with a repetition penalty).
    seen: HashSet<u32>,
    bias: Vec<(u32, f32)>,
    min_new_tokens: usize,
    /// Ids masked while fewer than `min_new_tokens` tokens were generated.
    stop_ids: Vec<u32>,
    /// Output tokens observed so far.
    generated: usize,
}

impl LogitProcessor {
    /// `None` when `p` changes no logit. `eos_ids` are the model's end ids (masked by
    /// `min_new_tokens` unless `ignore_eos`).
    pub fn new(p: &SamplingParams, prompt: &[u32], eos_ids: &[u32]) -> Option<Self> {
        if !p.adjusts_logits() {
            return None;
        }
        let seen = if p.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        let mut stop_ids = Vec::new();
        if p.min_new_tokens > 0 {
            stop_ids.extend_from_slice(&p.stop_token_ids);
            if !p.ignore_eos {
                stop_ids.extend_from_slice(eos_ids);
            }
            stop_ids.sort_unstable();
            stop_ids.dedup();
        }
        Some(LogitProcessor {
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
            repetition: p.repetition_penalty,
            counts: HashMap::new(),
            seen,
            bias: p.logit_bias.clone(),
            min_new_tokens: p.min_new_tokens,
            stop_ids,
            generated: 0,
        })
    }

    /// Record a generated token.
    pub fn observe(&mut self, token: u32) {
        self.generated += 1;
        if self.frequency != 0.0 || self.presence != 0.0 {
            *self.counts.entry(token).or_insert(0) += 1;
        }
        if self.repetition != 1.0 {
            self.seen.insert(token);
        }
    }

    /// Adjust `logits` in place for the next token. Ids outside `logits` are ignored.
    /// What [`Self::apply`] does, as one `(token, rep, add)` edit per touched token of a
    /// vocabulary of `vocab` ids (for a sampler on another device; see
    /// [`crate::backend::LogitEdit`]). Sorted by token.
    pub fn edits(&self, vocab: usize) -> Vec<(u32, f32, f32)> {
        let mut m: std::collections::BTreeMap<u32, (f32, f32)> = Default::default();
        const NONE: (f32, f32) = (1.0, 0.0);
        if self.repetition != 1.0 {
            for &id in &self.seen {
                m.entry(id).or_insert(NONE).0 = self.repetition;
            }
        }
        for (&id, &count) in &self.counts {
            m.entry(id).or_insert(NONE).1 -= self.frequency * count as f32 + self.presence;
        }
        for &(id, b) in &self.bias {
            m.entry(id).or_insert(NONE).1 += b;
        }
        if self.generated < self.min_new_tokens {
            for &id in &self.stop_ids {
                m.entry(id).or_insert(NONE).1 = f32::NEG_INFINITY;
            }
        }
        m.into_iter()
            .filter(|&(id, _)| (id as usize) < vocab)
            .map(|(id, (rep, add))| (id, rep, add))
            .collect()
    }

    pub fn apply(&self, logits: &mut [f32]) {
        if self.repetition != 1.0 {
            for &id in &self.seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / self.repetition
                    } else {
                        *l * self.repetition
                    };
                }
            }
        }
        for (&id, &count) in &self.counts {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= self.frequency * count as f32 + self.presence;
            }
        }
        for &(id, b) in &self.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        if self.generated < self.min_new_tokens {
            for &id in &self.stop_ids {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams::default()
    }

    #[test]
    fn neutral_params_need_no_processor() {
        assert!(LogitProcessor::new(&params(), &[1, 2], &[0]).is_none());
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..params()
        };
        // Prompt has ids 0 and 1; 2 comes from the output; 3 is untouched.
        let mut proc = LogitProcessor::new(&p, &[0, 1, 1], &[]).unwrap();
        proc.observe(2);
        let mut l = vec![3.0, -1.5, 0.5, 4.0];
        proc.apply(&mut l);
        assert_eq!(l, vec![1.5, -3.0, 0.25, 4.0]);
    }

    #[test]
    fn frequency_and_presence_follow_output_counts() {
        let p = SamplingParams {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..params()
        };
        // Prompt tokens do not count for these two.
        let mut proc = LogitProcessor::new(&p, &[3, 3, 3], &[]).unwrap();
        for t in [1, 1, 1, 2] {
            proc.observe(t);
        }
        let mut l = vec![1.0, 1.0, 1.0, 1.0];
        proc.apply(&mut l);
        // id 1: 1 - 0.5*3 - 0.25; id 2: 1 - 0.5 - 0.25.
        assert_eq!(l, vec![1.0, -0.75, 0.25, 1.0]);
        // Negative penalties reward repeats.
        let p = SamplingParams {
            frequency_penalty: -1.0,
            ..params()
        };
        let mut proc = LogitProcessor::new(&p, &[], &[]).unwrap();
        proc.observe(0);
        proc.observe(0);
        let mut l = vec![0.0, 0.0];
        proc.apply(&mut l);
        assert_eq!(l, vec![2.0, 0.0]);
    }

    #[test]
    fn penalties_combine_in_order() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 1.0,
            presence_penalty: 0.5,
            logit_bias: vec![(0, 10.0)],
            ..params()
        };
        let mut proc = LogitProcessor::new(&p, &[], &[]).unwrap();
        proc.observe(1);
        let mut l = vec![1.0, 4.0];
        proc.apply(&mut l);
        // id 1: 4 / 2 - 1 - 0.5.
        assert_eq!(l, vec![11.0, 0.5]);
    }

    #[test]
    fn edits_do_what_apply_does() {
        let p = SamplingParams {
            repetition_penalty: 1.5,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            logit_bias: vec![(0, 3.0), (4, -2.0), (99, 1.0)],
            min_new_tokens: 3,
            stop_token_ids: vec![5],
            ..params()
        };
        let mut proc = LogitProcessor::new(&p, &[1, 2, 2], &[6]).unwrap();
        for t in [2, 3, 3] {
            proc.observe(t);
        }
        let base = vec![1.0, -2.0, 3.0, 0.5, -0.25, 2.0, 4.0, 0.0];
        let mut want = base.clone();
        proc.apply(&mut want);
        let mut got = base.clone();
        for (id, rep, add) in proc.edits(base.len()) {
            let e = crate::backend::LogitEdit {
                seq: 0,
                token: id,
                rep,
                add,
            };
            got[id as usize] = e.apply(got[id as usize]);
        }
        for (g, w) in got.iter().zip(&want) {
            assert!(g == w || (g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        // Past min_new_tokens the stop ids are no longer masked.
        proc.observe(7);
        assert!(proc.edits(8).iter().all(|e| e.2.is_finite()));
    }

    #[test]
    fn logit_bias_adds_and_ignores_out_of_range_ids() {
        let p = SamplingParams {
            logit_bias: vec![(1, 100.0), (2, -100.0), (99, 5.0)],
            ..params()
        };
        let proc = LogitProcessor::new(&p, &[], &[]).unwrap();
        let mut l = vec![0.5, 0.5, 0.5];
        proc.apply(&mut l);
        assert_eq!(l, vec![0.5, 100.5, -99.5]);
    }

    #[test]
    fn min_new_tokens_masks_stop_ids_until_reached() {
        let p = SamplingParams {
            min_new_tokens: 2,
            stop_token_ids: vec![3],
            ..params()
        };
        let mut proc = LogitProcessor::new(&p, &[], &[0]).unwrap();
        let mut l = vec![5.0, 1.0, 1.0, 4.0];
        proc.apply(&mut l);
        assert_eq!(l, vec![f32::NEG_INFINITY, 1.0, 1.0, f32::NEG_INFINITY]);
        proc.observe(1);
        let mut l = vec![5.0, 1.0, 1.0, 4.0];
        proc.apply(&mut l);
        assert!(l[0].is_infinite() && l[3].is_infinite());
        proc.observe(2);
        let mut l = vec![5.0, 1.0, 1.0, 4.0];
        proc.apply(&mut l);
        assert_eq!(l, vec![5.0, 1.0, 1.0, 4.0]);
        // With ignore_eos the EOS id is not a stop, so it is not masked.
        let p = SamplingParams {
            min_new_tokens: 1,
            ignore_eos: true,
            ..params()
        };
        let proc = LogitProcessor::new(&p, &[], &[0]).unwrap();
        let mut l = vec![5.0, 1.0];
        proc.apply(&mut l);
        assert_eq!(l, vec![5.0, 1.0]);
    }
}
