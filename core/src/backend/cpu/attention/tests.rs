//! Attention against a plain softmax reference, the key prefetch shares, the vector exp.

use super::*;

#[test]
fn single_key_returns_its_value() {
    let q = [1.0f32, 0.0];
    let k = [f16::from_f32(0.5), f16::from_f32(0.5)];
    let v = [f16::from_f32(7.0), f16::from_f32(-3.0)];
    let toks = [1u32];
    let slots = [0u32];
    let batch = [SeqInput {
        tokens: &toks,
        start_pos: 0,
        kv_slots: &slots,
        num_logits: 1,
        prompt: true,
    }];
    let mut out = [0f32; 2];
    attention(&q, &k, &v, &batch, 1, 1, 2, &mut out, 1);
    assert_eq!(out, [7.0, -3.0]);
}

/// Plain softmax attention in f64, one query head at a time, for comparison.
fn naive(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    batch: &[SeqInput<'_>],
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f32> {
    let mut out = Vec::new();
    for s in batch {
        for i in 0..s.tokens.len() {
            let t = out.len() / (heads * hd);
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let qh = &q[t * heads * hd + h * hd..][..hd];
                let slots = &s.kv_slots[..=s.start_pos + i];
                let cap = k.len() / (kv_heads * hd);
                let at = |sl: u32, d: usize| cache_row(kvh, sl as usize, cap, hd) + d;
                let scores: Vec<f64> = slots
                    .iter()
                    .map(|&sl| {
                        (0..hd)
                            .map(|d| qh[d] as f64 * k[at(sl, d)].to_f64())
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = w.iter().sum();
                for d in 0..hd {
                    let acc: f64 = slots
                        .iter()
                        .zip(&w)
                        .map(|(&sl, wi)| wi * v[at(sl, d)].to_f64())
                        .sum();
                    out.push((acc / z) as f32);
                }
            }
        }
    }
    out
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }
}

/// Attention of `heads`/`kv_heads`/`hd` on a prompt of 3 tokens from scratch and `new`
/// tokens after `cached` ones on scattered slots, against `naive`.
fn check(heads: usize, kv_heads: usize, hd: usize, cached: usize, new: usize, amp: f32) {
    check_on(heads, kv_heads, hd, cached, new, amp, 1);
}

fn check_on(
    heads: usize,
    kv_heads: usize,
    hd: usize,
    cached: usize,
    new: usize,
    amp: f32,
    threads: usize,
) {
    let mut rng = Rng(12345 + (heads * 1000 + hd * 10 + cached) as u64);
    let slots_cap = cached + new + 3 + 7;
    let kv = |rng: &mut Rng| -> Vec<f16> {
        (0..slots_cap * kv_heads * hd)
            .map(|_| f16::from_f32(amp * rng.next()))
            .collect()
    };
    let k = kv(&mut rng);
    let v = kv(&mut rng);
    let toks_a = [1u32, 2, 3];
    let slots_a = [7u32, 3, (slots_cap - 1) as u32];
    let toks_b = vec![4u32; new];
    // A scattered permutation of the remaining slots.
    let slots_b: Vec<u32> = (0..slots_cap as u32)
        .filter(|s| !slots_a.contains(s))
        .map(|s| (s * 7919) % slots_cap as u32)
        .filter(|s| !slots_a.contains(s))
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .rev()
        .take(cached + new)
        .collect();
    assert_eq!(slots_b.len(), cached + new);
    let batch = [
        SeqInput {
            tokens: &toks_a,
            start_pos: 0,
            kv_slots: &slots_a,
            num_logits: 1,
            prompt: true,
        },
        SeqInput {
            tokens: &toks_b,
            start_pos: cached,
            kv_slots: &slots_b,
            num_logits: 1,
            prompt: true,
        },
    ];
    let q: Vec<f32> = (0..(3 + new) * heads * hd)
        .map(|_| amp * rng.next())
        .collect();
    let want = naive(&q, &k, &v, &batch, heads, kv_heads, hd);
    let mut out = vec![f32::NAN; q.len()];
    attention(&q, &k, &v, &batch, heads, kv_heads, hd, &mut out, threads);
    for (a, b) in out.iter().zip(&want) {
        assert!((a - b).abs() < 1e-5 * amp.max(1.0), "{a} vs {b}");
    }
}

#[test]
fn grouped_attention_matches_plain_softmax() {
    check(6, 2, 8, 5, 2, 1.0);
    check(9, 3, 64, 37, 3, 1.0);
    // Group of 4 (a run of 3 heads and one of 1), head_dim 40 (a 32-wide and an 8-wide
    // chunk), large scores.
    check(8, 2, 40, 20, 1, 4.0);
    // A group beyond MAX_GROUP (two runs).
    check(18, 1, 16, 9, 2, 1.0);
    // Head dimension not a multiple of 8 (portable path).
    check(4, 2, 6, 11, 1, 1.0);
}

#[test]
fn key_prefetch_shares_cover_every_row_once() {
    let toks = [1u32; 2];
    let a: Vec<u32> = vec![5, 6, 7, 20, 21, 9, 0, 0];
    let b: Vec<u32> = vec![40, 41, 42, 43, 44, 45, 46, 47, 3, 4];
    let batch = [
        SeqInput {
            tokens: &toks,
            start_pos: 6,
            kv_slots: &a,
            num_logits: 1,
            prompt: true,
        },
        SeqInput {
            tokens: &toks,
            start_pos: 8,
            kv_slots: &b,
            num_logits: 1,
            prompt: true,
        },
    ];
    let runs = KvRuns::new(&batch);
    let mut want: Vec<(usize, usize)> = (0..3)
        .flat_map(|h| a[..6].iter().chain(&b[..8]).map(move |&s| (h, s as usize)))
        .collect();
    want.sort_unstable();
    for of in [1, 2, 5, 7, 100] {
        let mut got = Vec::new();
        for i in 0..of {
            runs.share(3, i, of, |h, first, n| {
                got.extend((first..first + n).map(|s| (h, s)))
            });
        }
        got.sort_unstable();
        assert_eq!(got, want, "{of} shares");
    }
}

#[test]
fn split_contexts_match_plain_softmax() {
    // Few tasks: contexts are split into spans when there are several threads (also the
    // prompt's, into empty spans beyond its 3 keys).
    check_on(3, 1, 64, 700, 1, 2.0, 2);
    check_on(9, 3, 64, 300, 1, 1.0, 2);
    check_on(9, 3, 64, 300, 1, 1.0, 16);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_is_accurate() {
    if Isa::detect() == Isa::Scalar {
        return;
    }
    let mut worst = 0f64;
    let mut x = -87.0f32;
    while x < 87.8 {
        let xs: [f32; 8] = std::array::from_fn(|i| x + i as f32 * 0.0137);
        let mut got = [0f32; 8];
        // SAFETY: a SIMD ISA implies AVX2 and FMA; `got` holds 8 floats.
        unsafe {
            use std::arch::x86_64::*;
            let v = _mm256_loadu_ps(xs.as_ptr());
            _mm256_storeu_ps(got.as_mut_ptr(), x86::exp_ps(v));
        }
        for (&xi, &g) in xs.iter().zip(&got) {
            let want = (xi as f64).exp();
            worst = worst.max(((g as f64 - want) / want).abs());
        }
        x += 0.1;
    }
    assert!(worst < 1e-6, "relative error {worst}");
    let mut got = [1f32; 8];
    // SAFETY: as above.
    unsafe {
        use std::arch::x86_64::*;
        let v = _mm256_set1_ps(f32::NEG_INFINITY);
        _mm256_storeu_ps(got.as_mut_ptr(), x86::exp_ps(v));
    }
    assert_eq!(got, [0.0; 8]);
}
