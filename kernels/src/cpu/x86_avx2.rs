//! AVX2 + FMA + F16C kernels: activation quantization and float-format (F32, F16, BF16) dots.
//!
//! Every function here is compiled with those target features enabled and must only be called
//! after `Isa::detect` has seen them at run time (`Isa::Avx2` or better). Several rows share
//! each activation load.

use std::arch::x86_64::*;

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

/// Quantizes one block of 32 (bit-identical to `quant::quantize_block`); returns
/// `(d, sum(q))`.
///
/// # Safety
/// AVX2 and FMA must be available. `x.len() == q.len() == 32`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
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
    (d, sum)
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
