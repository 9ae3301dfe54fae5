//! The packed layout of block-quantized weights, and the portable kernel on it.
//!
//! GGUF stores each row as consecutive blocks. For SIMD it pays to interleave [`GROUP`] = 16
//! rows: one 64-byte load then holds 4 bytes of each of the 16 rows, a byte-dot instruction
//! against 4 activation bytes broadcast to every lane accumulates all 16 rows at once (lane r =
//! row r), and the per-block f32 work (convert, scale, add) is done once for 16 rows instead of
//! once per row. 256-bit kernels take the group as two halves of 8 rows (the first and second
//! 32 bytes of every chunk, the first and second 8 scales). Padding rows (when
//! `rows % 16 != 0`) are zero and never written out.
//!
//! Per group of 16 rows, per block index `b`, a "block group" of:
//! - `d[16]` f16 scales (row r at `2r`), then for Q4_1 `m[16]` f16 mins;
//! - Q4_0 / Q4_1: 256 bytes of nibbles: chunk `t in 0..4` is [`CHUNK`] = 64 bytes, row r's
//!   bytes `4t..4t+4` at `64t + 4r` (ggml order: low nibble = element `j`, high = element
//!   `j + 16`, so chunk t covers elements `4t..4t+4` (low) and `16+4t..20+4t` (high));
//! - Q8_0: 512 bytes, chunk `t in 0..8` holds row r's elements `4t..4t+4` at `64t + 4r`,
//!   stored as unsigned `q + 128` (so every kernel multiplies unsigned weight bytes by signed
//!   activation bytes; the `128 * sum(x)` this adds is subtracted per block).
//!
//! The block groups of one row group are consecutive, row groups follow each other.

use super::buffer::HugeBytes;
use super::quant::QuantActs;
use super::scalar::f16_at;
use super::{BLOCK, WeightFormat};

/// Rows interleaved in one group.
pub(crate) const GROUP: usize = 16;

/// Bytes of one chunk: 4 quant bytes of each row of a group.
pub(crate) const CHUNK: usize = 4 * GROUP;

/// Byte offset of the quants inside a block group.
pub(crate) fn header_bytes(format: WeightFormat) -> usize {
    match format {
        WeightFormat::Q4_1 => 4 * GROUP,
        _ => 2 * GROUP,
    }
}

/// Bytes of one block group (16 rows × one block).
pub(crate) fn block_group_bytes(format: WeightFormat) -> usize {
    header_bytes(format)
        + match format {
            WeightFormat::Q8_0 => GROUP * BLOCK,
            _ => GROUP * BLOCK / 2,
        }
}

/// Packed weights are unsigned; the integer dot of a block is corrected by subtracting
/// `offset * sum(x quants)` (Q4_0: 8, Q8_0: 128; Q4_1 adds its f32 min term instead).
pub(crate) fn int_offset(format: WeightFormat) -> i32 {
    match format {
        WeightFormat::Q4_0 => 8,
        WeightFormat::Q8_0 => 128,
        _ => 0,
    }
}

/// Packs GGUF rows (`rows` × `nb` blocks) into the layout above.
pub(crate) fn pack(format: WeightFormat, rows: usize, nb: usize, gguf: &[u8]) -> HugeBytes {
    let bb = format.block_bytes();
    let bg = block_group_bytes(format);
    let hdr = header_bytes(format);
    let groups = rows.div_ceil(GROUP);
    let mut out = HugeBytes::zeroed(groups * nb * bg);
    for r in 0..rows {
        let (g, lane) = (r / GROUP, r % GROUP);
        for b in 0..nb {
            let src = &gguf[(r * nb + b) * bb..(r * nb + b + 1) * bb];
            let dst = &mut out[(g * nb + b) * bg..(g * nb + b + 1) * bg];
            dst[2 * lane..2 * lane + 2].copy_from_slice(&src[..2]);
            let qs = match format {
                WeightFormat::Q4_1 => {
                    dst[2 * GROUP + 2 * lane..2 * GROUP + 2 * lane + 2].copy_from_slice(&src[2..4]);
                    &src[4..]
                }
                _ => &src[2..],
            };
            for (t, chunk) in qs.chunks_exact(4).enumerate() {
                let at = hdr + CHUNK * t + 4 * lane;
                for (d, &s) in dst[at..at + 4].iter_mut().zip(chunk) {
                    *d = if format == WeightFormat::Q8_0 {
                        s ^ 0x80
                    } else {
                        s
                    };
                }
            }
        }
    }
    out
}

/// Dequantizes row `lane` of one packed row group (`nb` block groups) into `out`.
pub(crate) fn dequantize_row(format: WeightFormat, group: &[u8], lane: usize, out: &mut [f32]) {
    let bg = block_group_bytes(format);
    let hdr = header_bytes(format);
    for (blk, o) in group.chunks_exact(bg).zip(out.chunks_exact_mut(BLOCK)) {
        let d = f16_at(blk, 2 * lane);
        let q = |t: usize, j: usize| blk[hdr + CHUNK * t + 4 * lane + j];
        match format {
            WeightFormat::Q8_0 => {
                for (e, o) in o.iter_mut().enumerate() {
                    *o = d * ((q(e / 4, e % 4) ^ 0x80) as i8) as f32;
                }
            }
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                let (scale, offset) = if format == WeightFormat::Q4_1 {
                    (d, f16_at(blk, 2 * GROUP + 2 * lane))
                } else {
                    (d, -8.0 * d)
                };
                for e in 0..BLOCK / 2 {
                    let byte = q(e / 4, e % 4);
                    o[e] = scale * (byte & 0x0f) as f32 + offset;
                    o[e + BLOCK / 2] = scale * (byte >> 4) as f32 + offset;
                }
            }
            _ => unreachable!("packed dequantize on a float format"),
        }
    }
}

/// Portable kernel: the 16 rows of one packed row group against activation row `i`.
pub(crate) fn dot_group(
    format: WeightFormat,
    group: &[u8],
    acts: &QuantActs,
    i: usize,
    out: &mut [f32; GROUP],
) {
    let bg = block_group_bytes(format);
    let hdr = header_bytes(format);
    let (xq, xd, xs, xsq) = (acts.row_qs(i), acts.row_d(i), acts.row_s(i), acts.row_sq(i));
    let offset = int_offset(format);
    let q41 = format == WeightFormat::Q4_1;
    let mut acc = [0.0f32; GROUP];
    for (b, blk) in group.chunks_exact(bg).enumerate() {
        let x = &xq[b * BLOCK..(b + 1) * BLOCK];
        let qs = &blk[hdr..];
        // Each chunk is 16 rows × 4 bytes, taken as two halves of 8 rows; products are formed
        // over a whole half (which compilers vectorize on any SIMD target; whole chunks
        // measured slower), then summed per row.
        const HALF: usize = CHUNK / 2;
        let mut isum = [-offset * xsq[b]; GROUP];
        let mut add_half = |h: usize, prod: &[i32; HALF]| {
            for (s, p) in isum[h * GROUP / 2..].iter_mut().zip(prod.chunks_exact(4)) {
                *s += p.iter().sum::<i32>();
            }
        };
        if format == WeightFormat::Q8_0 {
            for (chunk, xc) in qs.chunks_exact(CHUNK).zip(x.chunks_exact(4)) {
                for (h, part) in chunk.chunks_exact(HALF).enumerate() {
                    let prod: [i32; HALF] =
                        std::array::from_fn(|k| part[k] as i32 * xc[k % 4] as i32);
                    add_half(h, &prod);
                }
            }
        } else {
            let (xl, xh) = x.split_at(BLOCK / 2);
            for ((chunk, xl), xh) in qs
                .chunks_exact(CHUNK)
                .zip(xl.chunks_exact(4))
                .zip(xh.chunks_exact(4))
            {
                for (h, part) in chunk.chunks_exact(HALF).enumerate() {
                    let prod: [i32; HALF] = std::array::from_fn(|k| {
                        (part[k] & 0x0f) as i32 * xl[k % 4] as i32
                            + (part[k] >> 4) as i32 * xh[k % 4] as i32
                    });
                    add_half(h, &prod);
                }
            }
        }
        let d: [f32; GROUP] = std::array::from_fn(|lane| f16_bits_to_f32(blk, 2 * lane));
        for ((a, &d), &s) in acc.iter_mut().zip(&d).zip(&isum) {
            *a += d * xd[b] * s as f32;
        }
        if q41 {
            let m: [f32; GROUP] =
                std::array::from_fn(|lane| f16_bits_to_f32(blk, 2 * GROUP + 2 * lane));
            for (a, &m) in acc.iter_mut().zip(&m) {
                *a += m * xs[b];
            }
        }
    }
    *out = acc;
}

/// The little-endian f16 at `bytes[at..at + 2]` as f32, in plain integer arithmetic (inlines
/// and vectorizes, unlike a run-time-dispatched conversion).
#[inline]
pub(crate) fn f16_bits_to_f32(bytes: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as u32;
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x3ff;
    let bits = if exp == 0x1f {
        // Inf / NaN.
        sign | 0x7f80_0000 | (man << 13)
    } else if exp != 0 {
        sign | ((exp + 112) << 23) | (man << 13)
    } else {
        // Zero or subnormal: man * 2^-24, exact in f32.
        return f32::from_bits(sign)
            + if sign != 0 { -1.0 } else { 1.0 } * man as f32 * (1.0 / 16_777_216.0);
    };
    f32::from_bits(bits)
}
