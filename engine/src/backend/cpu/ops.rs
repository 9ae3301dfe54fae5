//! Small CPU operations of the forward pass: RMSNorm, RoPE, SiLU-and-mul, and attention over
//! the slot-indexed KV cache.

use super::kernels::parallel_for;
use crate::backend::SeqInput;

/// A raw pointer that tasks of one `parallel_for` use to write disjoint parts of a buffer.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: each task writes a region no other task touches (see the use below).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// A method (not field access) so closures capture the whole `Sync` wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out[r] = x[r] / rms(x[r]) * w` for each row of `dim` values.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = xv * scale * wv;
        }
    }
}

pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bv) in row.iter_mut().zip(b) {
            *v += bv;
        }
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Precomputed cos/sin of RoPE angles for positions `0..max_positions`.
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    max_positions: usize,
}

impl RopeTable {
    pub fn new(inv_freq: &[f32], max_positions: usize) -> Self {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in inv_freq {
                let a = p as f64 * f as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeTable {
            half,
            cos,
            sin,
            max_positions,
        }
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotate every head of every token row of `x` (`heads × head_dim` per row) by its position.
    /// `interleaved`: pairs are (2i, 2i+1) (GGUF layout); else (i, i + head_dim/2) (HF layout).
    pub fn apply(
        &self,
        x: &mut [f32],
        positions: &[usize],
        heads: usize,
        head_dim: usize,
        interleaved: bool,
    ) {
        let half = self.half;
        let row = heads * head_dim;
        for (xr, &p) in x.chunks_exact_mut(row).zip(positions) {
            let c = &self.cos[p * half..(p + 1) * half];
            let s = &self.sin[p * half..(p + 1) * half];
            for head in xr.chunks_exact_mut(head_dim) {
                if interleaved {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * c[i] - b * s[i];
                        head[2 * i + 1] = a * s[i] + b * c[i];
                    }
                } else {
                    for i in 0..half {
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * c[i] - b * s[i];
                        head[i + half] = a * s[i] + b * c[i];
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, ar) = a.split_at(a.len() / 16 * 16);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(16).zip(bc.chunks_exact(16)) {
        for k in 0..16 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[inline(always)]
fn axpy(out: &mut [f32], a: f32, x: &[f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// Causal attention of each new token over its sequence's cached keys/values.
///
/// `q` holds `heads × head_dim` per new token (tokens of all sequences, in batch order); the KV
/// caches hold `kv_heads × head_dim` per slot. Query head `h` reads KV head `h / (heads /
/// kv_heads)`. Writes `out` in `q`'s layout.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    batch: &[SeqInput<'_>],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    let group = heads / kv_heads;
    let qd = heads * head_dim;
    let kvd = kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // (sequence index, position) of each new token.
    let mut owners = Vec::with_capacity(q.len() / qd);
    for (si, s) in batch.iter().enumerate() {
        for i in 0..s.tokens.len() {
            owners.push((si, s.start_pos + i));
        }
    }
    let out_ptr = SharedMut(out.as_mut_ptr());
    // One task per (token, KV head, run of at most MAX_GROUP query heads sharing that KV head):
    // each K/V row is loaded once for all of them.
    let runs = group.div_ceil(MAX_GROUP);
    let n_tasks = owners.len() * kv_heads * runs;
    #[cfg(target_arch = "x86_64")]
    let fast =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    let job = AttnJob {
        q,
        k_cache,
        v_cache,
        batch,
        owners: &owners,
        kv_heads,
        group,
        qd,
        kvd,
        head_dim,
        scale,
        out: out_ptr,
    };
    parallel_for(n_tasks, |task| {
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: AVX2 and FMA were detected at run time just above.
            unsafe { attend_avx2(&job, task) };
            return;
        }
        let _ = fast;
        attend(&job, task);
    });
}

#[derive(Clone, Copy)]
struct AttnJob<'a, 'b> {
    q: &'a [f32],
    k_cache: &'a [f32],
    v_cache: &'a [f32],
    batch: &'a [SeqInput<'b>],
    owners: &'a [(usize, usize)],
    kv_heads: usize,
    group: usize,
    qd: usize,
    kvd: usize,
    head_dim: usize,
    scale: f32,
    out: SharedMut,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(job: &AttnJob<'_, '_>, task: usize) {
    attend(job, task)
}

/// Query heads handled together against one KV head.
const MAX_GROUP: usize = 16;

/// One (new token, KV head, run of query heads): softmax(q·K) V over the token's causal context,
/// with a running maximum per query head (online softmax, no score buffer).
#[inline(always)]
fn attend(job: &AttnJob<'_, '_>, task: usize) {
    let AttnJob {
        q,
        k_cache,
        v_cache,
        batch,
        owners,
        kv_heads,
        group,
        qd,
        kvd,
        head_dim,
        scale,
        out,
    } = *job;
    let runs = group.div_ceil(MAX_GROUP);
    let (t, rest) = (task / (kv_heads * runs), task % (kv_heads * runs));
    let (kvh, run) = (rest / runs, rest % runs);
    let h0 = kvh * group + run * MAX_GROUP;
    let nh = (group - run * MAX_GROUP).min(MAX_GROUP);
    let (si, pos) = owners[t];
    let slots = &batch[si].kv_slots[..=pos];
    let qs = &q[t * qd + h0 * head_dim..t * qd + (h0 + nh) * head_dim];
    // SAFETY: this task alone writes the `nh` heads from `h0` of token `t`, and `out` outlives
    // the parallel_for call.
    let o = unsafe {
        std::slice::from_raw_parts_mut(out.get().add(t * qd + h0 * head_dim), nh * head_dim)
    };
    o.fill(0.0);
    let mut max = [f32::NEG_INFINITY; MAX_GROUP];
    let mut sum = [0f32; MAX_GROUP];
    let mut p = [0f32; MAX_GROUP];
    for &slot in slots {
        let base = slot as usize * kvd + kvh * head_dim;
        let k = &k_cache[base..base + head_dim];
        for g in 0..nh {
            let s = dot(&qs[g * head_dim..(g + 1) * head_dim], k) * scale;
            if s > max[g] {
                let r = (max[g] - s).exp();
                sum[g] *= r;
                for v in o[g * head_dim..(g + 1) * head_dim].iter_mut() {
                    *v *= r;
                }
                max[g] = s;
            }
            p[g] = (s - max[g]).exp();
            sum[g] += p[g];
        }
        let v = &v_cache[base..base + head_dim];
        for g in 0..nh {
            axpy(&mut o[g * head_dim..(g + 1) * head_dim], p[g], v);
        }
    }
    for g in 0..nh {
        let inv = 1.0 / sum[g];
        for v in o[g * head_dim..(g + 1) * head_dim].iter_mut() {
            *v *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0];
        let w = [1.0, 2.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &w, 0.0, 2, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6);
        assert!((out[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_layouts_agree_after_permutation() {
        // Interleaved layout of a head equals the half-split layout after permuting pairs.
        let inv = [1.0f32, 0.1];
        let table = RopeTable::new(&inv, 8);
        let half_split = [1.0f32, 2.0, 3.0, 4.0];
        let interleaved = [1.0f32, 3.0, 2.0, 4.0];
        let mut a = half_split;
        let mut b = interleaved;
        table.apply(&mut a, &[5], 1, 4, false);
        table.apply(&mut b, &[5], 1, 4, true);
        assert!((a[0] - b[0]).abs() < 1e-6 && (a[2] - b[1]).abs() < 1e-6);
        assert!((a[1] - b[2]).abs() < 1e-6 && (a[3] - b[3]).abs() < 1e-6);
    }

    #[test]
    fn attention_single_key_returns_its_value() {
        let q = [1.0f32, 0.0];
        let k = [0.5f32, 0.5];
        let v = [7.0f32, -3.0];
        let toks = [1u32];
        let slots = [0u32];
        let batch = [SeqInput {
            tokens: &toks,
            start_pos: 0,
            kv_slots: &slots,
            num_logits: 1,
        }];
        let mut out = [0f32; 2];
        attention(&q, &k, &v, &batch, 1, 1, 2, &mut out);
        assert_eq!(out, [7.0, -3.0]);
    }

    /// Plain softmax attention, one query head at a time, for comparison.
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
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
                    let scores: Vec<f64> = slots
                        .iter()
                        .map(|&sl| {
                            let kr = &k[sl as usize * kv_heads * hd + kvh * hd..][..hd];
                            qh.iter()
                                .zip(kr)
                                .map(|(a, b)| (*a as f64) * (*b as f64))
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
                            .map(|(&sl, wi)| {
                                wi * v[sl as usize * kv_heads * hd + kvh * hd + d] as f64
                            })
                            .sum();
                        out.push((acc / z) as f32);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn grouped_attention_matches_plain_softmax() {
        let (heads, kv_heads, hd) = (6, 2, 8);
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let slots_cap = 40;
        let k: Vec<f32> = (0..slots_cap * kv_heads * hd).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..slots_cap * kv_heads * hd).map(|_| rnd()).collect();
        // A prompt of 3 tokens from scratch, and 2 new tokens after 5 cached ones, on scattered slots.
        let toks_a = [1u32, 2, 3];
        let slots_a = [7u32, 3, 30];
        let toks_b = [4u32, 5];
        let slots_b = [0u32, 9, 12, 25, 2, 39, 17];
        let batch = [
            SeqInput {
                tokens: &toks_a,
                start_pos: 0,
                kv_slots: &slots_a,
                num_logits: 1,
            },
            SeqInput {
                tokens: &toks_b,
                start_pos: 5,
                kv_slots: &slots_b,
                num_logits: 1,
            },
        ];
        let q: Vec<f32> = (0..5 * heads * hd).map(|_| rnd()).collect();
        let mut out = vec![f32::NAN; q.len()];
        attention(&q, &k, &v, &batch, heads, kv_heads, hd, &mut out);
        let want = naive(&q, &k, &v, &batch, heads, kv_heads, hd);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
