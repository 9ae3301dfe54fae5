//! AVX2 + FMA + F16C kernels on the GGUF block layout.
//!
//! Every function here is compiled with those target features enabled and must only be called
//! after `Isa::detect` has seen them at run time (`Isa::Avx2` or better). Quantized dots use
//! `vpmaddubsw` (unsigned × signed bytes to i16 pairs, then `vpmaddwd` to i32) and one f32 FMA
//! per block; several rows share each activation load.

use std::arch::x86_64::*;

use super::quant::QuantActs;
use super::{BLOCK, Weight, WeightFormat};

/// Rows computed together in one pass over the activation row.
const ROWS: usize = 4;

/// Horizontal sum of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Horizontal sum of 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// One f16 (raw bits) to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Reads a little-endian u16 at `p`.
///
/// # Safety
/// `p..p+2` must be readable.
#[inline(always)]
unsafe fn read_u16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees two readable bytes; unaligned read.
    u16::from_le(unsafe { (p as *const u16).read_unaligned() })
}

/// Quantizes one block of 32 (bit-identical to `quant::quantize_block`); returns
/// `(d, d * sum(q))`.
///
/// # Safety
/// AVX2 and FMA must be available. `x.len() == q.len() == 32`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    assert!(x.len() == BLOCK && q.len() == BLOCK);
    let p = x.as_ptr();
    // SAFETY: `x` holds 32 f32, read as four unaligned 8-lane loads.
    let v = unsafe {
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    };
    let sign = _mm256_set1_ps(-0.0);
    let a = v.map(|v| _mm256_andnot_ps(sign, v));
    let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let amax = _mm_cvtss_f32(m);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mul = _mm256_set1_ps(id);
    let lo = _mm256_set1_epi32(-127);
    let hi = _mm256_set1_epi32(127);
    // Default MXCSR rounding is round-half-to-even, matching the scalar path.
    let r = v.map(|v| {
        _mm256_min_epi32(
            _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, mul)), lo),
            hi,
        )
    });
    let sum = hsum_epi32(_mm256_add_epi32(
        _mm256_add_epi32(r[0], r[1]),
        _mm256_add_epi32(r[2], r[3]),
    ));
    let p16a = _mm256_packs_epi32(r[0], r[1]);
    let p16b = _mm256_packs_epi32(r[2], r[3]);
    let p8 = _mm256_packs_epi16(p16a, p16b);
    let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `q` holds 32 bytes; unaligned store.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, p8) };
    (d, d * sum as f32)
}

/// Expands 16 nibble bytes at `p` to 32 unsigned bytes (low nibbles first, ggml order).
///
/// # Safety
/// AVX2 available; `p..p+16` readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes, unaligned load.
    let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// Sum of unsigned × signed byte products, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// `out[k] = dot(W[rows.start + k], activation row i)` for a block-quantized weight.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_quant(
    w: &Weight,
    rows: std::ops::Range<usize>,
    acts: &QuantActs,
    i: usize,
    out: &mut [f32],
) {
    debug_assert_eq!(out.len(), rows.len());
    let (xq, xd, xs) = (acts.row_qs(i), acts.row_d(i), acts.row_s(i));
    assert_eq!(xq.len(), w.cols());
    let start = rows.start;
    let mut k = 0;
    while k < out.len() {
        let take = (out.len() - k).min(ROWS);
        let mut ptrs = [std::ptr::null::<u8>(); ROWS];
        for (j, p) in ptrs.iter_mut().enumerate() {
            // Rows past the end repeat the last one; their results are dropped.
            *p = w.row_data(start + k + j.min(take - 1)).as_ptr();
        }
        // SAFETY: each pointer is a full row of `w` (cols / 32 blocks in `w.format()`), and the
        // activation slices hold `cols` quants and `cols / 32` scales.
        let res = unsafe {
            match w.format() {
                WeightFormat::Q4_1 => dot_q4_1(ptrs, xq, xd, xs),
                WeightFormat::Q4_0 => dot_q4_0(ptrs, xq, xd, xs),
                WeightFormat::Q8_0 => dot_q8_0(ptrs, xq, xd),
                _ => unreachable!("dot_rows_quant on a float weight"),
            }
        };
        out[k..k + take].copy_from_slice(&res[..take]);
        k += take;
    }
}

/// # Safety
/// AVX2/FMA/F16C available; each row pointer addresses `xd.len()` Q4_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(rows: [*const u8; ROWS], xq: &[i8], xd: &[f32], xs: &[f32]) -> [f32; ROWS] {
    let mut acc = [_mm256_setzero_ps(); ROWS];
    let mut mins = [0.0f32; ROWS];
    for b in 0..xd.len() {
        // SAFETY: `xq` holds `xd.len() * 32` quants.
        let x = unsafe { _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK) as *const __m256i) };
        let (dx, sx) = (xd[b], xs[b]);
        for r in 0..ROWS {
            // SAFETY: block `b` of row `r` is 20 readable bytes (caller contract).
            let (d, m, w) = unsafe {
                let p = rows[r].add(b * 20);
                (
                    f16_to_f32(read_u16(p)),
                    f16_to_f32(read_u16(p.add(2))),
                    unpack_nibbles(p.add(4)),
                )
            };
            let prod = _mm256_cvtepi32_ps(dot_u8_i8(w, x));
            acc[r] = _mm256_fmadd_ps(prod, _mm256_set1_ps(d * dx), acc[r]);
            mins[r] += m * sx;
        }
    }
    std::array::from_fn(|r| hsum_ps(acc[r]) + mins[r])
}

/// # Safety
/// AVX2/FMA/F16C available; each row pointer addresses `xd.len()` Q4_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(rows: [*const u8; ROWS], xq: &[i8], xd: &[f32], xs: &[f32]) -> [f32; ROWS] {
    let mut acc = [_mm256_setzero_ps(); ROWS];
    let mut offs = [0.0f32; ROWS];
    for b in 0..xd.len() {
        // SAFETY: `xq` holds `xd.len() * 32` quants.
        let x = unsafe { _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK) as *const __m256i) };
        let (dx, sx) = (xd[b], xs[b]);
        for r in 0..ROWS {
            // SAFETY: block `b` of row `r` is 18 readable bytes (caller contract).
            let (d, w) = unsafe {
                let p = rows[r].add(b * 18);
                (f16_to_f32(read_u16(p)), unpack_nibbles(p.add(2)))
            };
            let prod = _mm256_cvtepi32_ps(dot_u8_i8(w, x));
            acc[r] = _mm256_fmadd_ps(prod, _mm256_set1_ps(d * dx), acc[r]);
            offs[r] += d * sx;
        }
    }
    std::array::from_fn(|r| hsum_ps(acc[r]) - 8.0 * offs[r])
}

/// # Safety
/// AVX2/FMA/F16C available; each row pointer addresses `xd.len()` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(rows: [*const u8; ROWS], xq: &[i8], xd: &[f32]) -> [f32; ROWS] {
    let mut acc = [_mm256_setzero_ps(); ROWS];
    for b in 0..xd.len() {
        // SAFETY: `xq` holds `xd.len() * 32` quants.
        let x = unsafe { _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK) as *const __m256i) };
        let dx = xd[b];
        for r in 0..ROWS {
            // SAFETY: block `b` of row `r` is 34 readable bytes (caller contract).
            let (d, w) = unsafe {
                let p = rows[r].add(b * 34);
                (
                    f16_to_f32(read_u16(p)),
                    _mm256_loadu_si256(p.add(2) as *const __m256i),
                )
            };
            // |w| × (x with w's sign): unsigned × signed, no i16 overflow for |x| <= 127.
            let prod = dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
            acc[r] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(prod),
                _mm256_set1_ps(d * dx),
                acc[r],
            );
        }
    }
    std::array::from_fn(|r| hsum_ps(acc[r]))
}

/// `out[k] = dot(W[rows.start + k], x)` for a float weight.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows_float(
    w: &Weight,
    rows: std::ops::Range<usize>,
    x: &[f32],
    out: &mut [f32],
) {
    debug_assert_eq!(out.len(), rows.len());
    assert_eq!(x.len(), w.cols());
    let format = w.format();
    let cols = w.cols();
    let vec_cols = cols / 8 * 8;
    let start = rows.start;
    let mut k = 0;
    while k < out.len() {
        let take = (out.len() - k).min(ROWS);
        let row: [&[u8]; ROWS] = std::array::from_fn(|j| w.row_data(start + k + j.min(take - 1)));
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for c in (0..vec_cols).step_by(8) {
            // SAFETY: `c + 8 <= cols`, `x` has `cols` values and each row `cols` elements.
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(c));
                for r in 0..ROWS {
                    let wv = load8(format, row[r].as_ptr(), c);
                    acc[r] = _mm256_fmadd_ps(wv, xv, acc[r]);
                }
            }
        }
        for j in 0..take {
            let tail: f32 = (vec_cols..cols)
                .map(|c| super::scalar::float_elem(format, row[j], c) * x[c])
                .sum();
            let sum = hsum_ps(acc[j]) + tail;
            out[k + j] = sum;
        }
        k += take;
    }
}

/// Loads elements `c..c + 8` of a float row as f32.
///
/// # Safety
/// AVX2/F16C available; elements `c..c + 8` of the row at `p` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(format: WeightFormat, p: *const u8, c: usize) -> __m256 {
    // SAFETY: the caller guarantees the 8 elements are readable; unaligned loads.
    unsafe {
        match format {
            WeightFormat::F32 => _mm256_loadu_ps((p as *const f32).add(c)),
            WeightFormat::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * c) as *const __m128i)),
            WeightFormat::BF16 => {
                let h = _mm_loadu_si128(p.add(2 * c) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
            _ => unreachable!("load8 on a quantized weight"),
        }
    }
}
