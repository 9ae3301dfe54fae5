//! x86-64 kernels on packed quantized weights (layout in `packed.rs`): one row group of 16 rows
//! against `T` activation rows (1..=[`MAX_T`]), all blocks.
//!
//! Each chunk of a block group holds 4 weight bytes of each of the 16 rows; the matching 4
//! activation bytes are broadcast to all lanes, so the byte dot product sums into lane r =
//! row r. The f32 work per block (convert, scale by `d_w * d_x`, add) is then one vector op
//! for 16 (AVX-512) or 8 (AVX2) rows. Weight bytes are loaded and their nibbles unpacked once
//! per block for the whole tile of activation rows, which is what makes batches cheaper per
//! row than single rows. Two variants: AVX2 on the two 8-row halves of a group (`vpmaddubsw`,
//! accumulating nibble products in i16, which cannot overflow: 8 × 2 × 15 × 127 < 32767; at
//! most 4 activation rows per pass, 16 vector registers) and AVX-512 VNNI on 512-bit vectors
//! (`vpdpbusd`, all 16 rows per instruction, up to 8 activation rows per pass in 32 registers).

use std::arch::x86_64::*;

use super::packed::{CHUNK, GROUP, block_group_bytes, header_bytes, int_offset};
use super::quant::QuantActs;
use super::{BLOCK, Isa, WeightFormat};

/// Most activation rows one call handles.
pub(crate) const MAX_T: usize = 8;

/// Most activation rows one pass of the AVX2 kernels handles (register budget).
const AVX2_T: usize = 4;

/// Results of one call: `out[k]` = the 16 rows against activation row `i0 + k`.
pub(crate) type TileOut = [[f32; GROUP]; MAX_T];

/// Activation rows `i0..i0 + t` (`1 <= t <= MAX_T`) of one tile, resolved to row pointers
/// once (per task and tile) rather than once per row group.
#[derive(Clone, Copy)]
pub(crate) struct TileActs {
    /// Rows from `i0` and, for the AVX2 kernels' second pass of [`AVX2_T`] rows, from
    /// `i0 + AVX2_T` (a copy of the first when `t <= AVX2_T`).
    x: [Acts; 2],
    t: usize,
    nb: usize,
}

impl TileActs {
    /// Panics unless `1 <= t <= MAX_T` and the rows exist.
    pub(crate) fn new(acts: &QuantActs, i0: usize, t: usize) -> TileActs {
        assert!((1..=MAX_T).contains(&t) && i0 + t <= acts.qs.len() / (acts.nb * BLOCK).max(1));
        let first = Acts::new(acts, i0);
        let second = if t > AVX2_T {
            Acts::new(acts, i0 + AVX2_T)
        } else {
            first
        };
        TileActs {
            x: [first, second],
            t,
            nb: acts.nb,
        }
    }
}

/// The 16 rows of one packed row group (`group`: `nb` block groups) against the activation
/// rows of `tile`, into `out[..tile.t]`.
///
/// # Safety
/// `isa` must have been detected on this CPU (AVX2+FMA+F16C for `Avx2`, plus AVX-512
/// F/BW/VL/VNNI for `Avx512Vnni`). `group` must hold `nb` block groups of `format`, and the
/// tile's rows `nb` blocks.
pub(crate) unsafe fn group_tile(
    isa: Isa,
    format: WeightFormat,
    group: &[u8],
    nb: usize,
    tile: &TileActs,
    out: &mut TileOut,
) {
    assert!(group.len() >= nb * block_group_bytes(format) && tile.nb == nb);
    let t = tile.t;
    let g = group.as_ptr();
    if isa == Isa::Avx512Vnni {
        let x = &tile.x[0];
        // SAFETY: the caller guarantees the ISA; sizes were checked above.
        unsafe {
            match t {
                1 => vnni::<1>(format, g, nb, x, out),
                2 => vnni::<2>(format, g, nb, x, out),
                3 => vnni::<3>(format, g, nb, x, out),
                4 => vnni::<4>(format, g, nb, x, out),
                5 => vnni::<5>(format, g, nb, x, out),
                6 => vnni::<6>(format, g, nb, x, out),
                7 => vnni::<7>(format, g, nb, x, out),
                _ => vnni::<8>(format, g, nb, x, out),
            }
        }
        return;
    }
    for (pass, k0) in (0..t).step_by(AVX2_T).enumerate() {
        let x = &tile.x[pass];
        let out = &mut out[k0..];
        for half in 0..2 {
            macro_rules! go {
                ($f:ident) => {
                    match (t - k0).min(AVX2_T) {
                        1 => $f::<1>(format, g, nb, x, half, out),
                        2 => $f::<2>(format, g, nb, x, half, out),
                        3 => $f::<3>(format, g, nb, x, half, out),
                        _ => $f::<4>(format, g, nb, x, half, out),
                    }
                };
            }
            // SAFETY: the caller guarantees the ISA; sizes were checked above, and `out` has
            // at least `min(t - k0, AVX2_T)` rows.
            unsafe {
                match format {
                    WeightFormat::Q8_0 => go!(q8_avx2),
                    WeightFormat::Q4_1 => go!(q41_avx2),
                    _ => go!(q40_avx2),
                }
            }
        }
    }
}

/// Pointers to the activation rows `i0..i0 + MAX_T` (rows past the end alias row `i0`).
#[derive(Clone, Copy)]
struct Acts {
    q: [*const i8; MAX_T],
    d: [*const f32; MAX_T],
    s: [*const f32; MAX_T],
    sq: [*const i32; MAX_T],
}

impl Acts {
    fn new(acts: &QuantActs, i0: usize) -> Acts {
        let n = acts.d.len() / acts.nb.max(1);
        let row = |k: usize| if i0 + k < n { i0 + k } else { i0 };
        Acts {
            q: std::array::from_fn(|k| acts.row_qs(row(k)).as_ptr()),
            d: std::array::from_fn(|k| acts.row_d(row(k)).as_ptr()),
            s: std::array::from_fn(|k| acts.row_s(row(k)).as_ptr()),
            sq: std::array::from_fn(|k| acts.row_sq(row(k)).as_ptr()),
        }
    }

    /// The 4 activation bytes at `at` of row `k` as one i32.
    ///
    /// # Safety
    /// `at + 4` within the row.
    #[inline(always)]
    unsafe fn word(&self, k: usize, at: usize) -> i32 {
        // SAFETY: in bounds by the caller's contract; unaligned read of 4 bytes.
        unsafe { (self.q[k].add(at) as *const i32).read_unaligned() }
    }

    /// The 4 activation bytes at `at` of row `k`, broadcast to every 32-bit lane.
    ///
    /// # Safety
    /// AVX2 available; `at + 4` within the row.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bcast(&self, k: usize, at: usize) -> __m256i {
        // SAFETY: in bounds by the caller's contract.
        unsafe { _mm256_set1_epi32(self.word(k, at)) }
    }
}

/// How far ahead of the block group in use the batched kernel prefetches weights. With
/// several activation rows the kernel spends long enough on each cache line that the hardware
/// prefetchers fall behind and weights arrive late from memory; 4 KiB ahead (about half a row
/// group of the model's matrices) measured best. Single rows stream at full memory bandwidth
/// without it (and slower with it), so they do not prefetch.
const PREFETCH_BYTES: usize = 4096;

/// Prefetches (into L1) the `bg` bytes `PREFETCH_BYTES` past `blk`.
#[inline(always)]
fn prefetch_ahead(blk: *const u8, bg: usize) {
    let p = blk.wrapping_add(PREFETCH_BYTES);
    for off in (0..bg).step_by(64) {
        // SAFETY: a prefetch is only a hint and never faults, whatever the address; the
        // pointer is formed with wrapping arithmetic and never dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8) };
    }
}

/// Final f32 accumulation of one block for activation row `k`: `acc += d_w * d_x * isum`
/// (after the integer offset) plus, for Q4_1, `m_w * s_x`.
///
/// # Safety
/// AVX2/FMA available; `b` a valid block of the rows in `x`.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn finish_block(
    acc: __m256,
    isum: __m256i,
    dw: __m256,
    mw: Option<__m256>,
    offset: i32,
    x: &Acts,
    k: usize,
    b: usize,
) -> __m256 {
    // SAFETY: block `b` exists in row `k` (caller contract).
    unsafe {
        let isum = if offset != 0 {
            _mm256_sub_epi32(isum, _mm256_set1_epi32(offset * *x.sq[k].add(b)))
        } else {
            isum
        };
        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*x.d[k].add(b)));
        let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
        match mw {
            Some(mw) => _mm256_fmadd_ps(mw, _mm256_set1_ps(*x.s[k].add(b)), acc),
            None => acc,
        }
    }
}

macro_rules! q4_avx2 {
    ($name:ident, $q41:expr) => {
        /// Half `half` (rows `8 * half..8 * half + 8`) of a Q4 row group against `T` rows.
        ///
        /// # Safety
        /// AVX2/FMA/F16C available; `g` holds `nb` block groups; `x` rows hold `nb` blocks;
        /// `out` has at least `T` rows.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const T: usize>(
            format: WeightFormat,
            g: *const u8,
            nb: usize,
            x: &Acts,
            half: usize,
            out: &mut [[f32; GROUP]],
        ) {
            let (bg, hdr, offset) = (
                block_group_bytes(format),
                header_bytes(format),
                int_offset(format),
            );
            let m4 = _mm256_set1_epi8(0x0f);
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                // SAFETY: block group `b` is within `g` (caller contract), and every
                // activation offset below is inside block `b` of its row.
                unsafe {
                    let blk = g.add(b * bg);
                    if T > 1 && half == 0 {
                        prefetch_ahead(blk, bg);
                    }
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i));
                    let mw = if $q41 {
                        Some(_mm256_cvtph_ps(_mm_loadu_si128(
                            blk.add(2 * GROUP + 16 * half) as *const __m128i,
                        )))
                    } else {
                        None
                    };
                    let q = blk.add(hdr + 32 * half);
                    let mut isum = [_mm256_setzero_si256(); T];
                    for t in 0..4 {
                        let v = _mm256_loadu_si256(q.add(CHUNK * t) as *const __m256i);
                        let lo = _mm256_and_si256(v, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                        for k in 0..T {
                            let at = b * BLOCK + 4 * t;
                            let p = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo, x.bcast(k, at)),
                                _mm256_maddubs_epi16(hi, x.bcast(k, at + 16)),
                            );
                            isum[k] = _mm256_add_epi16(isum[k], p);
                        }
                    }
                    for k in 0..T {
                        let s32 = _mm256_madd_epi16(isum[k], ones);
                        acc[k] = finish_block(acc[k], s32, dw, mw, offset, x, k, b);
                    }
                }
            }
            for k in 0..T {
                // SAFETY: `out[k]` holds 16 f32; this half is its 8 at `8 * half`.
                unsafe { _mm256_storeu_ps(out[k].as_mut_ptr().add(8 * half), acc[k]) };
            }
        }
    };
}

q4_avx2!(q41_avx2, true);
q4_avx2!(q40_avx2, false);

/// Half `half` (rows `8 * half..8 * half + 8`) of a Q8_0 row group against `T` rows.
///
/// # Safety
/// AVX2/FMA/F16C available; `g` holds `nb` Q8_0 block groups; `x` rows hold `nb` blocks; `out`
/// has at least `T` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_avx2<const T: usize>(
    format: WeightFormat,
    g: *const u8,
    nb: usize,
    x: &Acts,
    half: usize,
    out: &mut [[f32; GROUP]],
) {
    let (bg, hdr) = (block_group_bytes(format), header_bytes(format));
    let bias = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        // SAFETY: block group `b` is within `g`, activation offsets inside block `b`.
        unsafe {
            let blk = g.add(b * bg);
            if T > 1 && half == 0 {
                prefetch_ahead(blk, bg);
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i));
            let q = blk.add(hdr + 32 * half);
            let mut isum = [_mm256_setzero_si256(); T];
            for t in 0..8 {
                // Undo the +128 bias: signed weights, then |w| × (x with w's sign) keeps the
                // operands of vpmaddubsw unsigned × signed without i16 overflow.
                let v = _mm256_loadu_si256(q.add(CHUNK * t) as *const __m256i);
                let w = _mm256_xor_si256(v, bias);
                let aw = _mm256_sign_epi8(w, w);
                for (k, isum) in isum.iter_mut().enumerate() {
                    let xs = _mm256_sign_epi8(x.bcast(k, b * BLOCK + 4 * t), w);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones);
                    *isum = _mm256_add_epi32(*isum, p);
                }
            }
            for k in 0..T {
                acc[k] = finish_block(acc[k], isum[k], dw, None, 0, x, k, b);
            }
        }
    }
    for k in 0..T {
        // SAFETY: `out[k]` holds 16 f32; this half is its 8 at `8 * half`.
        unsafe { _mm256_storeu_ps(out[k].as_mut_ptr().add(8 * half), acc[k]) };
    }
}

/// AVX-512 VNNI (512-bit `vpdpbusd`, 16 rows per instruction): every format, since packed
/// weights are unsigned bytes. Per block, each weight chunk is loaded (and its nibbles split)
/// once and multiplied into the integer sums of all `T` activation rows; the activation bytes
/// come as broadcast memory operands. Below 4 activation rows each row keeps two integer sums
/// (low and high nibbles) so enough independent `vpdpbusd` are in flight; from 4 rows on, one.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI available; `g` holds `nb` block groups of `format`;
/// `x` rows hold `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni<const T: usize>(
    format: WeightFormat,
    g: *const u8,
    nb: usize,
    x: &Acts,
    out: &mut TileOut,
) {
    let (bg, hdr, offset) = (
        block_group_bytes(format),
        header_bytes(format),
        int_offset(format),
    );
    let q41 = format == WeightFormat::Q4_1;
    let split = T < 4;
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        // SAFETY: block group `b` is within `g`, activation offsets inside block `b`.
        unsafe {
            let blk = g.add(b * bg);
            if T > 1 {
                prefetch_ahead(blk, bg);
            }
            let q = blk.add(hdr);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let mut s0 = [_mm512_setzero_si512(); T];
            let mut s1 = [_mm512_setzero_si512(); T];
            let at = b * BLOCK;
            let bc = |k: usize, at: usize| _mm512_set1_epi32(x.word(k, at));
            if format == WeightFormat::Q8_0 {
                for t in (0..8).step_by(2) {
                    let v0 = _mm512_loadu_si512(q.add(CHUNK * t) as *const __m512i);
                    let v1 = _mm512_loadu_si512(q.add(CHUNK * t + CHUNK) as *const __m512i);
                    for k in 0..T {
                        s0[k] = _mm512_dpbusd_epi32(s0[k], v0, bc(k, at + 4 * t));
                        let s = if split { &mut s1[k] } else { &mut s0[k] };
                        *s = _mm512_dpbusd_epi32(*s, v1, bc(k, at + 4 * t + 4));
                    }
                }
            } else {
                for t in 0..4 {
                    let v = _mm512_loadu_si512(q.add(CHUNK * t) as *const __m512i);
                    let lo = _mm512_and_si512(v, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    for k in 0..T {
                        s0[k] = _mm512_dpbusd_epi32(s0[k], lo, bc(k, at + 4 * t));
                        let s = if split { &mut s1[k] } else { &mut s0[k] };
                        *s = _mm512_dpbusd_epi32(*s, hi, bc(k, at + 16 + 4 * t));
                    }
                }
            }
            for k in 0..T {
                let mut isum = if split {
                    _mm512_add_epi32(s0[k], s1[k])
                } else {
                    s0[k]
                };
                if offset != 0 {
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(offset * *x.sq[k].add(b)));
                }
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d[k].add(b)));
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[k]);
            }
            if q41 {
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(2 * GROUP) as *const __m256i));
                for (acc, s) in acc.iter_mut().zip(x.s) {
                    *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(*s.add(b)), *acc);
                }
            }
        }
    }
    for k in 0..T {
        // SAFETY: `out[k]` holds 16 f32.
        unsafe { _mm512_storeu_ps(out[k].as_mut_ptr(), acc[k]) };
    }
}
