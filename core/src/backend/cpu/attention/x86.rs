//! AVX2 + FMA + F16C versions. Every function must only run after those features were
//! detected (`Isa::detect` returned a SIMD ISA).

use std::arch::x86_64::*;

use half::f16;

use super::Span;

/// Converts `src` to f16 into `dst` (same length), round to nearest even.
///
/// # Safety
/// AVX2 and F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    let body = n / 8 * 8;
    for i in (0..body).step_by(8) {
        // SAFETY: `i + 8 <= n` for both slices; unaligned loads and stores.
        unsafe {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        }
    }
    for i in body..n {
        dst[i] = f16::from_f32(src[i]);
    }
}

/// `exp(x)` on 8 lanes: Cephes' `expf` (range reduction by `ln 2` in two parts, a degree-5
/// polynomial); relative error about 1e-7 for `x` in [-87.3, 88]. Below that range
/// (including −∞) gives 0; above, `x` is clamped to 88.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu) fn exp_ps(x: __m256) -> __m256 {
    let lo = _mm256_set1_ps(-87.336_54);
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
    let x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0)), lo);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)))
}

/// Sums of each of 4 vectors: `[sum a0, sum a1, sum a2, sum a3]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum4(a: [__m256; 4]) -> __m128 {
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t = _mm256_hadd_ps(t0, t1);
    _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 8 f16 values at `p` as f32.
///
/// # Safety
/// F16C available; 8 values readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(p: *const f16) -> __m256 {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
}

/// Same contract as `attend_span_scalar`. `wide`: the score and `P·V` passes run on
/// 512-bit vectors.
///
/// # Safety
/// AVX2, FMA and F16C available; `sp.head_dim` a multiple of 8; with `wide`, AVX-512
/// F/BW/VL available and `sp.head_dim` a multiple of 16; every slot's row lies within both
/// caches; `scores` holds `sp.nh × sp.slots.len()` rounded up to 8; `o` holds
/// `sp.nh × head_dim`; `max` and `sum` hold `sp.nh`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_span(
    sp: &Span<'_>,
    wide: bool,
    scores: &mut [f32],
    o: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    let (hd, n, nh) = (sp.head_dim, sp.slots.len(), sp.nh);
    let stride = n.next_multiple_of(8);
    assert!(scores.len() >= nh * stride && o.len() >= nh * hd && max.len() >= nh);
    assert!(sum.len() >= nh && sp.q.len() >= nh * hd && hd.is_multiple_of(8));
    if n == 0 {
        o[..nh * hd].fill(0.0);
        max[..nh].fill(f32::NEG_INFINITY);
        sum[..nh].fill(0.0);
        return;
    }
    // Pass 1: scores, up to 3 heads at a time.
    let mut h0 = 0;
    while h0 < nh {
        let run = (nh - h0).min(3);
        // SAFETY: the caller's contract covers the rows and buffers read and written, and
        // the AVX-512 features when `wide`.
        unsafe {
            match (wide, run) {
                (false, 1) => scores_run::<1>(sp, h0, scores, stride),
                (false, 2) => scores_run::<2>(sp, h0, scores, stride),
                (false, _) => scores_run::<3>(sp, h0, scores, stride),
                (true, 1) => scores_run_512::<1>(sp, h0, scores, stride),
                (true, 2) => scores_run_512::<2>(sp, h0, scores, stride),
                (true, _) => scores_run_512::<3>(sp, h0, scores, stride),
            }
        }
        h0 += run;
    }
    // Pass 2: per head, maximum, then probabilities and their sum. Padding past `n` is −∞
    // (probability 0).
    for g in 0..nh {
        let row = &mut scores[g * stride..(g + 1) * stride];
        row[n..].fill(f32::NEG_INFINITY);
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for c in row.chunks_exact(8) {
            // SAFETY: `c` holds 8 f32.
            m = _mm256_max_ps(m, unsafe { _mm256_loadu_ps(c.as_ptr()) });
        }
        let mx = hmax(m);
        let mv = _mm256_set1_ps(mx);
        let mut total = _mm256_setzero_ps();
        for c in row.chunks_exact_mut(8) {
            // SAFETY: `c` holds 8 f32.
            unsafe {
                let p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
                _mm256_storeu_ps(c.as_mut_ptr(), p);
                total = _mm256_add_ps(total, p);
            }
        }
        max[g] = mx;
        sum[g] = hsum(total);
    }
    // Pass 3: P·V, up to 3 heads and 32 dimensions (64 when `wide`) at a time.
    let mut h0 = 0;
    while wide && h0 < nh {
        let run = (nh - h0).min(3);
        let mut d0 = 0;
        while d0 < hd {
            let width = if hd - d0 >= 64 { 4 } else { 1 };
            // SAFETY: as for pass 1; `d0 + 16 * width <= hd`.
            unsafe {
                match (run, width) {
                    (1, 4) => pv_run_512::<1, 4>(sp, h0, d0, scores, stride, o),
                    (2, 4) => pv_run_512::<2, 4>(sp, h0, d0, scores, stride, o),
                    (_, 4) => pv_run_512::<3, 4>(sp, h0, d0, scores, stride, o),
                    (1, _) => pv_run_512::<1, 1>(sp, h0, d0, scores, stride, o),
                    (2, _) => pv_run_512::<2, 1>(sp, h0, d0, scores, stride, o),
                    _ => pv_run_512::<3, 1>(sp, h0, d0, scores, stride, o),
                }
            }
            d0 += 16 * width;
        }
        h0 += run;
    }
    while !wide && h0 < nh {
        let run = (nh - h0).min(3);
        let mut d0 = 0;
        while d0 < hd {
            let width = if hd - d0 >= 32 { 4 } else { 1 };
            // SAFETY: the caller's contract covers the rows and buffers read and written;
            // `d0 + 8 * width <= hd`.
            unsafe {
                match (run, width) {
                    (1, 4) => pv_run::<1, 4>(sp, h0, d0, scores, stride, o),
                    (2, 4) => pv_run::<2, 4>(sp, h0, d0, scores, stride, o),
                    (_, 4) => pv_run::<3, 4>(sp, h0, d0, scores, stride, o),
                    (1, _) => pv_run::<1, 1>(sp, h0, d0, scores, stride, o),
                    (2, _) => pv_run::<2, 1>(sp, h0, d0, scores, stride, o),
                    _ => pv_run::<3, 1>(sp, h0, d0, scores, stride, o),
                }
            }
            d0 += 8 * width;
        }
        h0 += run;
    }
}

/// How many keys ahead of the one in use the score pass prefetches its key and value rows
/// (about a DRAM latency's worth of score work).
const PREFETCH_KEYS: usize = 32;

/// Prefetches the key row (into L1) and the value row (into L2, for pass 3) of key `j` of
/// the span, if it has one. The cache rows are scattered over memory that the weights
/// streamed through since the last step, so nearly every row comes from DRAM.
#[inline(always)]
fn prefetch_key(sp: &Span<'_>, j: usize) {
    let Some(&slot) = sp.slots.get(j) else {
        return;
    };
    let at = slot as usize * sp.stride + sp.offset;
    let k = sp.k_cache.as_ptr().wrapping_add(at) as *const i8;
    let v = sp.v_cache.as_ptr().wrapping_add(at) as *const i8;
    for off in (0..sp.head_dim * std::mem::size_of::<f16>()).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch is only a hint and never faults, and
        // the addresses are formed with wrapping arithmetic and never dereferenced.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(k.wrapping_add(off));
            _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(off));
        }
    }
}

/// How many keys ahead of the one in use the `P·V` pass pulls value rows from L2 (where
/// the score pass put them) into L1: a sequence's decode-time slots are scattered among
/// the batch's, so the hardware prefetchers cannot guess the next row.
const PV_PREFETCH_KEYS: usize = 8;

/// Prefetches (into L1) values `d0..d0 + n` of key `j`'s value row, if the span has key `j`.
#[inline(always)]
fn prefetch_value_l1(sp: &Span<'_>, j: usize, d0: usize, n: usize) {
    let Some(&slot) = sp.slots.get(j) else {
        return;
    };
    let at = slot as usize * sp.stride + sp.offset + d0;
    let v = sp.v_cache.as_ptr().wrapping_add(at) as *const i8;
    for off in (0..n * std::mem::size_of::<f16>()).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch is only a hint and never faults, and
        // the address is formed with wrapping arithmetic and never dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(v.wrapping_add(off)) };
    }
}

/// Scaled scores of heads `h0..h0 + H` against every key of the span, 4 keys at a time.
///
/// # Safety
/// As `attend_span`, with `h0 + H <= sp.nh`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_run<const H: usize>(sp: &Span<'_>, h0: usize, scores: &mut [f32], stride: usize) {
    let (hd, n) = (sp.head_dim, sp.slots.len());
    let q = sp.q[h0 * hd..(h0 + H) * hd].as_ptr();
    let kc = sp.k_cache.as_ptr();
    let scale = _mm_set1_ps(sp.scale);
    (0..PREFETCH_KEYS.min(n)).for_each(|j| prefetch_key(sp, j));
    let mut j = 0;
    while j < n {
        (j + PREFETCH_KEYS..j + PREFETCH_KEYS + 4).for_each(|j| prefetch_key(sp, j));
        // Rows of keys j..j + 4; past the end, repeat the last key (results dropped).
        let rows: [*const f16; 4] = std::array::from_fn(|i| {
            let slot = sp.slots[(j + i).min(n - 1)] as usize;
            // SAFETY: the caller guarantees this slot's row lies within the cache.
            unsafe { kc.add(slot * sp.stride + sp.offset) }
        });
        let mut acc = [[_mm256_setzero_ps(); 4]; H];
        for c in (0..hd).step_by(8) {
            // SAFETY: `c + 8 <= hd` within each key row and each query head.
            unsafe {
                let k: [__m256; 4] = std::array::from_fn(|i| load8(rows[i].add(c)));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(q.add(h * hd + c));
                    for i in 0..4 {
                        acc[i] = _mm256_fmadd_ps(qv, k[i], acc[i]);
                    }
                }
            }
        }
        let valid = (n - j).min(4);
        for (h, acc) in acc.iter().enumerate() {
            let s = _mm_mul_ps(hsum4(*acc), scale);
            let dst = &mut scores[(h0 + h) * stride + j..];
            if valid == 4 {
                // SAFETY: `j + 4 <= n <= stride`, so 4 floats fit in `dst`.
                unsafe { _mm_storeu_ps(dst.as_mut_ptr(), s) };
            } else {
                let mut tmp = [0f32; 4];
                // SAFETY: `tmp` holds 4 floats.
                unsafe { _mm_storeu_ps(tmp.as_mut_ptr(), s) };
                dst[..valid].copy_from_slice(&tmp[..valid]);
            }
        }
        j += 4;
    }
}

/// Sums of each of 4 vectors of 16: `[sum a0, sum a1, sum a2, sum a3]`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
fn hsum4_512(a: [__m512; 4]) -> __m128 {
    let half = |v: __m512| {
        _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        )
    };
    hsum4([half(a[0]), half(a[1]), half(a[2]), half(a[3])])
}

/// 16 f16 values at `p` as f32.
///
/// # Safety
/// AVX-512 F available; 16 values readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn load16(p: *const f16) -> __m512 {
    // SAFETY: the caller guarantees 32 readable bytes at `p`.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

/// `scores_run` on 512-bit vectors: per block of 4 keys, one 16-lane accumulator per
/// (key, head), 12 of them for 3 heads, which 32 registers hold with the key rows.
///
/// # Safety
/// As `attend_span` with `wide`, with `h0 + H <= sp.nh`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn scores_run_512<const H: usize>(
    sp: &Span<'_>,
    h0: usize,
    scores: &mut [f32],
    stride: usize,
) {
    let (hd, n) = (sp.head_dim, sp.slots.len());
    let q = sp.q[h0 * hd..(h0 + H) * hd].as_ptr();
    let kc = sp.k_cache.as_ptr();
    let scale = _mm_set1_ps(sp.scale);
    (0..PREFETCH_KEYS.min(n)).for_each(|j| prefetch_key(sp, j));
    let mut j = 0;
    while j < n {
        (j + PREFETCH_KEYS..j + PREFETCH_KEYS + 4).for_each(|j| prefetch_key(sp, j));
        // Rows of keys j..j + 4; past the end, repeat the last key (results dropped).
        let rows: [*const f16; 4] = std::array::from_fn(|i| {
            let slot = sp.slots[(j + i).min(n - 1)] as usize;
            // SAFETY: the caller guarantees this slot's row lies within the cache.
            unsafe { kc.add(slot * sp.stride + sp.offset) }
        });
        let mut acc = [[_mm512_setzero_ps(); 4]; H];
        for c in (0..hd).step_by(16) {
            // SAFETY: `c + 16 <= hd` within each key row and each query head.
            unsafe {
                let k: [__m512; 4] = std::array::from_fn(|i| load16(rows[i].add(c)));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm512_loadu_ps(q.add(h * hd + c));
                    for i in 0..4 {
                        acc[i] = _mm512_fmadd_ps(qv, k[i], acc[i]);
                    }
                }
            }
        }
        let valid = (n - j).min(4);
        for (h, acc) in acc.iter().enumerate() {
            let s = _mm_mul_ps(hsum4_512(*acc), scale);
            let dst = &mut scores[(h0 + h) * stride + j..];
            if valid == 4 {
                // SAFETY: `j + 4 <= n <= stride`, so 4 floats fit in `dst`.
                unsafe { _mm_storeu_ps(dst.as_mut_ptr(), s) };
            } else {
                let mut tmp = [0f32; 4];
                // SAFETY: `tmp` holds 4 floats.
                unsafe { _mm_storeu_ps(tmp.as_mut_ptr(), s) };
                dst[..valid].copy_from_slice(&tmp[..valid]);
            }
        }
        j += 4;
    }
}

/// `pv_run` on 512-bit vectors: `o[h][d0..d0 + 16W] = sum_j p[h][j] v_j[d0..d0 + 16W]`
/// for heads `h0..h0 + H`.
///
/// # Safety
/// As `attend_span` with `wide`, with `h0 + H <= sp.nh` and `d0 + 16 * W <= head_dim`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
// Index loops keep the accumulators in registers: one value vector feeds every head.
#[allow(clippy::needless_range_loop)]
unsafe fn pv_run_512<const H: usize, const W: usize>(
    sp: &Span<'_>,
    h0: usize,
    d0: usize,
    probs: &[f32],
    stride: usize,
    o: &mut [f32],
) {
    let hd = sp.head_dim;
    let vc = sp.v_cache.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); W]; H];
    for (j, &slot) in sp.slots.iter().enumerate() {
        prefetch_value_l1(sp, j + PV_PREFETCH_KEYS, d0, 16 * W);
        // SAFETY: the slot's row lies within the cache and `d0 + 16W <= head_dim`; `j` is
        // within each head's row of `probs`.
        unsafe {
            let row = vc.add(slot as usize * sp.stride + sp.offset + d0);
            let p: [__m512; H] = std::array::from_fn(|h| {
                _mm512_set1_ps(*probs.get_unchecked((h0 + h) * stride + j))
            });
            for w in 0..W {
                let v = load16(row.add(16 * w));
                for h in 0..H {
                    acc[h][w] = _mm512_fmadd_ps(p[h], v, acc[h][w]);
                }
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (w, a) in acc.iter().enumerate() {
            let dst = &mut o[(h0 + h) * hd + d0 + 16 * w..][..16];
            // SAFETY: `dst` holds 16 floats.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *a) };
        }
    }
}

/// `o[h][d0..d0 + 8W] = sum_j p[h][j] v_j[d0..d0 + 8W]` for heads `h0..h0 + H`.
///
/// # Safety
/// As `attend_span`, with `h0 + H <= sp.nh` and `d0 + 8 * W <= head_dim`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
// Index loops keep the accumulators in registers: one value vector feeds every head.
#[allow(clippy::needless_range_loop)]
unsafe fn pv_run<const H: usize, const W: usize>(
    sp: &Span<'_>,
    h0: usize,
    d0: usize,
    probs: &[f32],
    stride: usize,
    o: &mut [f32],
) {
    let hd = sp.head_dim;
    let vc = sp.v_cache.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); W]; H];
    for (j, &slot) in sp.slots.iter().enumerate() {
        prefetch_value_l1(sp, j + PV_PREFETCH_KEYS, d0, 8 * W);
        // SAFETY: the slot's row lies within the cache and `d0 + 8W <= head_dim`; `j` is
        // within each head's row of `probs`.
        unsafe {
            let row = vc.add(slot as usize * sp.stride + sp.offset + d0);
            let p: [__m256; H] = std::array::from_fn(|h| {
                _mm256_set1_ps(*probs.get_unchecked((h0 + h) * stride + j))
            });
            for w in 0..W {
                let v = load8(row.add(8 * w));
                for h in 0..H {
                    acc[h][w] = _mm256_fmadd_ps(p[h], v, acc[h][w]);
                }
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (w, a) in acc.iter().enumerate() {
            let dst = &mut o[(h0 + h) * hd + d0 + 8 * w..][..8];
            // SAFETY: `dst` holds 8 floats.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), *a) };
        }
    }
}
