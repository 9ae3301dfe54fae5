//! Turning logits into the next token: temperature, top-k, top-p, min-p, greedy; the logit
//! adjustments applied before that ([`LogitProcessor`]: penalties, `logit_bias`,
//! `min_new_tokens`); and logprobs (log-softmax of the raw logits, with top-k alternatives).

mod penalties;

pub use penalties::LogitProcessor;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::request::SamplingParams;

/// Per-request sampling state: the parameters and the request's own random generator.
pub struct Sampler {
    rng: StdRng,
}

impl Sampler {
    pub fn new(seed: u64) -> Self {
        Sampler {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Pick a token from `logits` (modified in place).
    /// A fresh uniform draw in [0, 1) (for a sampler that runs elsewhere, e.g. on a GPU).
    pub fn uniform(&mut self) -> f32 {
        self.rng.random()
    }

    pub fn sample(&mut self, logits: &mut [f32], p: &SamplingParams) -> u32 {
        if p.is_greedy() {
            return argmax(logits);
        }
        let u: f32 = self.rng.random();
        sample_with(logits, p, u)
    }
}

/// Index of the largest logit (the first of equal ones; 0 when none is above -inf or the row is
/// empty). NaNs are never chosen. A row is ~50-150K logits and a greedy batch runs this once
/// per sequence per step, so the maximum is found lane-wise over chunks (which the compiler
/// vectorizes), then its first position.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // `v > m` is false for NaN, so NaNs never become the maximum.
            *m = if v > *m { v } else { *m };
        }
    }
    let mut best_v = lanes
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
    for &v in chunks.remainder() {
        if v > best_v {
            best_v = v;
        }
    }
    if best_v == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == best_v).unwrap_or(0) as u32
}

/// Log-softmax normalizer of a logits row: `logprob(i) = logits[i] - log_sum_exp(logits)`.
/// Non-finite logits (masked tokens) contribute nothing.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return f32::NEG_INFINITY;
    }
    let sum: f64 = logits
        .iter()
        .filter(|v| v.is_finite())
        .map(|&v| f64::from(v - max).exp())
        .sum();
    max + sum.ln() as f32
}

/// The logprob of `id` in a row whose normalizer is `lse` (`-inf` for an id outside the row).
pub fn token_logprob(logits: &[f32], id: u32, lse: f32) -> f32 {
    logits
        .get(id as usize)
        .map_or(f32::NEG_INFINITY, |&v| v - lse)
}

/// The `k` most likely ids of a row with their logprobs, best first (ties: lower id first).
pub fn top_logprobs(logits: &[f32], k: usize, lse: f32) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_logit);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_logit);
    idx.into_iter()
        .map(|i| (i, logits[i as usize] - lse))
        .collect()
}

/// Sample with a given uniform draw `u` in [0, 1): deterministic for a given draw.
///
/// Works on `e = exp((logit - max) / T)` over the candidates (the top-k set, or every finite
/// logit), so the most likely token has `e = 1`: min-p keeps `e >= min_p`, top-p the smallest
/// set of most likely tokens whose mass reaches `top_p` of the candidates' mass. Only top-p
/// needs candidates in order, and only as far as its prefix reaches, so the vocabulary is
/// never sorted whole; without top-p the draw walks the kept tokens in index order.
pub fn sample_with(logits: &[f32], p: &SamplingParams, u: f32) -> u32 {
    let t = p.temperature.max(1e-5);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut idx: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    if idx.is_empty() {
        return argmax(logits);
    }
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if p.top_k > 0 && (p.top_k as usize) < idx.len() {
        let k = p.top_k as usize;
        idx.select_nth_unstable_by(k - 1, by_logit);
        idx.truncate(k);
    }
    let weight = |i: u32| ((logits[i as usize] - max) / t).exp();
    let total: f32 = idx.iter().map(|&i| weight(i)).sum();
    if p.min_p > 0.0 {
        idx.retain(|&i| weight(i) >= p.min_p);
        if idx.is_empty() {
            return argmax(logits);
        }
    }
    if p.top_p < 1.0 {
        let goal = p.top_p * total;
        // Sort a growing prefix of the most likely tokens until its mass reaches the goal.
        let mut m = 64usize;
        let keep = loop {
            if m >= idx.len() {
                idx.sort_unstable_by(by_logit);
            } else {
                idx.select_nth_unstable_by(m - 1, by_logit);
                idx[..m].sort_unstable_by(by_logit);
            }
            let span = m.min(idx.len());
            let mut cum = 0.0;
            let reached = idx[..span].iter().position(|&i| {
                cum += weight(i);
                cum >= goal
            });
            match reached {
                Some(j) => break j + 1,
                None if span == idx.len() => break span,
                None => m *= 4,
            }
        };
        idx.truncate(keep.max(1));
    }
    let weights: Vec<f32> = idx.iter().map(|&i| weight(i)).collect();
    let mass: f32 = weights.iter().sum();
    let target = u * mass;
    let mut cum = 0.0;
    for (j, &w) in weights.iter().enumerate() {
        cum += w;
        if target < cum {
            return idx[j];
        }
    }
    idx[idx.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32, top_p: f32, top_k: i32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_p,
            top_k,
            min_p,
            ..Default::default()
        }
    }

    #[test]
    fn argmax_is_the_first_largest_finite_logit() {
        fn reference(l: &[f32]) -> u32 {
            let mut best = 0usize;
            let mut best_v = f32::NEG_INFINITY;
            for (i, &v) in l.iter().enumerate() {
                if v > best_v {
                    best_v = v;
                    best = i;
                }
            }
            best as u32
        }
        let mut rng = StdRng::seed_from_u64(9);
        for len in [0usize, 1, 5, 15, 16, 17, 33, 1000, 49_152] {
            for case in 0..4 {
                let mut l: Vec<f32> = (0..len)
                    .map(|_| (rng.random_range(0..40) as f32) / 4.0 - 5.0)
                    .collect();
                if case == 1 {
                    l.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                }
                if case == 2 && len > 3 {
                    l[len / 2] = f32::NAN;
                    l[len - 1] = 1e9;
                }
                if case == 3 && len > 0 {
                    l[0] = f32::NAN;
                }
                assert_eq!(argmax(&l), reference(&l), "len {len} case {case}");
            }
        }
    }

    #[test]
    fn greedy_takes_the_max() {
        let mut s = Sampler::new(1);
        let mut l = vec![0.1, 3.0, -1.0, 2.9];
        assert_eq!(s.sample(&mut l, &params(0.0, 1.0, -1, 0.0)), 1);
    }

    #[test]
    fn top_k_one_is_greedy_for_any_draw() {
        let l = vec![0.5, 0.1, 4.0, 3.9];
        for u in [0.0, 0.3, 0.999] {
            assert_eq!(sample_with(&l, &params(1.0, 1.0, 1, 0.0), u), 2);
        }
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // Probabilities ≈ [0.64, 0.24, 0.09, 0.03]: top_p 0.5 keeps only the first.
        let l = vec![2.0, 1.0, 0.0, -1.0];
        for u in [0.0, 0.5, 0.99] {
            assert_eq!(sample_with(&l, &params(1.0, 0.5, -1, 0.0), u), 0);
        }
        // top_p 0.8 keeps two: a high draw lands on the second.
        assert_eq!(sample_with(&l, &params(1.0, 0.8, -1, 0.0), 0.99), 1);
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        let l = vec![2.0, 1.0, 0.0, -1.0];
        // min_p 0.5: keep tokens with p >= 0.32 → only the first.
        assert_eq!(sample_with(&l, &params(1.0, 1.0, -1, 0.5), 0.99), 0);
    }

    /// The same rule over a fully sorted candidate list.
    fn sample_sorted(logits: &[f32], p: &SamplingParams, u: f32) -> u32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        idx.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        let w: Vec<f32> = idx
            .iter()
            .map(|&i| ((logits[i as usize] - max) / p.temperature).exp())
            .collect();
        let total: f32 = w.iter().sum();
        let mut keep = w.iter().take_while(|&&x| x >= p.min_p).count().max(1);
        let mut cum = 0.0;
        for (j, &x) in w[..keep].iter().enumerate() {
            cum += x;
            if cum >= p.top_p * total {
                keep = j + 1;
                break;
            }
        }
        let mass: f32 = w[..keep].iter().sum();
        let mut acc = 0.0;
        for j in 0..keep {
            acc += w[j];
            if u * mass < acc {
                return idx[j];
            }
        }
        idx[keep - 1]
    }

    #[test]
    fn top_p_over_a_large_vocabulary_matches_a_full_sort() {
        let mut rng = StdRng::seed_from_u64(3);
        let logits: Vec<f32> = (0..5000).map(|_| rng.random::<f32>() * 12.0).collect();
        for (top_p, min_p, temp) in [(0.9, 0.0, 1.0), (0.3, 0.0, 0.7), (0.95, 0.01, 1.3)] {
            let p = SamplingParams {
                temperature: temp,
                top_p,
                min_p,
                ..Default::default()
            };
            for k in 0..200 {
                let u = k as f32 / 200.0;
                assert_eq!(
                    sample_with(&logits, &p, u),
                    sample_sorted(&logits, &p, u),
                    "top_p {top_p} min_p {min_p} u {u}"
                );
            }
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let l = vec![0.0f32, (3.0f32).ln()]; // p = [0.25, 0.75]
        let mut s = Sampler::new(7);
        let p = params(1.0, 1.0, -1, 0.0);
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&mut l.clone(), &p) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "frac {frac}");
    }

    #[test]
    fn logprobs_are_a_log_softmax() {
        let l = vec![1.0f32, 3.0, 2.0, f32::NEG_INFINITY];
        let lse = log_sum_exp(&l);
        let want = (1.0f64.exp() + 3.0f64.exp() + 2.0f64.exp()).ln() as f32;
        assert!((lse - want).abs() < 1e-6);
        let total: f32 = (0..3).map(|i| token_logprob(&l, i, lse).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(token_logprob(&l, 3, lse), f32::NEG_INFINITY);
        assert_eq!(token_logprob(&l, 9, lse), f32::NEG_INFINITY);
        let top = top_logprobs(&l, 2, lse);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(top[0].1, token_logprob(&l, 1, lse));
        // The greedy token is the first of the top list, ties going to the lower id.
        let tied = vec![2.0f32, 5.0, 5.0];
        let lse = log_sum_exp(&tied);
        assert_eq!(top_logprobs(&tied, 3, lse)[0].0, argmax(&tied));
        assert_eq!(top_logprobs(&tied, 10, lse).len(), 3);
        assert!(top_logprobs(&tied, 0, lse).is_empty());
    }

    #[test]
    fn same_seed_same_tokens() {
        let l: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = params(0.8, 0.95, 20, 0.0);
        let mut a = Sampler::new(42);
        let mut b = Sampler::new(42);
        for _ in 0..20 {
            assert_eq!(a.sample(&mut l.clone(), &p), b.sample(&mut l.clone(), &p));
        }
    }
}
