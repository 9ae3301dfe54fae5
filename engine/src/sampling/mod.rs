//! Turning logits into the next token: temperature, top-k, top-p, min-p, greedy.

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
    pub fn sample(&mut self, logits: &mut [f32], p: &SamplingParams) -> u32 {
        if p.is_greedy() {
            return argmax(logits);
        }
        let u: f32 = self.rng.random();
        sample_with(logits, p, u)
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// Sample with a given uniform draw `u` in [0, 1): deterministic for a given draw.
pub fn sample_with(logits: &[f32], p: &SamplingParams, u: f32) -> u32 {
    let t = p.temperature.max(1e-5);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Candidates sorted by logit, descending; top-k bounds how many we sort.
    let mut idx: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    if idx.is_empty() {
        return argmax(logits);
    }
    let k = if p.top_k > 0 {
        (p.top_k as usize).min(idx.len())
    } else {
        idx.len()
    };
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, by_logit);
        idx.truncate(k);
    }
    idx.sort_unstable_by(by_logit);
    let mut probs: Vec<f32> = idx
        .iter()
        .map(|&i| ((logits[i as usize] - max) / t).exp())
        .collect();
    let total: f32 = probs.iter().sum();
    for q in probs.iter_mut() {
        *q /= total;
    }
    // min-p: drop tokens below min_p × the top probability.
    let mut keep = probs.len();
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p;
        keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
    }
    // top-p: smallest prefix whose mass reaches top_p.
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let mut n = 0;
        for &q in &probs[..keep] {
            cum += q;
            n += 1;
            if cum >= p.top_p {
                break;
            }
        }
        keep = n.max(1);
    }
    let mass: f32 = probs[..keep].iter().sum();
    let target = u * mass;
    let mut cum = 0.0;
    for (j, &q) in probs[..keep].iter().enumerate() {
        cum += q;
        if target < cum {
            return idx[j];
        }
    }
    idx[keep - 1]
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
