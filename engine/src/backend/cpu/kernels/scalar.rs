//! Portable scalar kernels: the reference for the SIMD paths and the code used on CPUs
//! without them.

use super::quant::QuantActs;
use super::{BLOCK, Weight, WeightFormat};
use half::{bf16, f16};

#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

#[inline]
fn bf16_at(bytes: &[u8], at: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

#[inline]
fn f32_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Element `c` of a row of a float format.
#[inline]
pub(crate) fn float_elem(format: WeightFormat, row: &[u8], c: usize) -> f32 {
    match format {
        WeightFormat::F32 => f32_at(row, 4 * c),
        WeightFormat::F16 => f16_at(row, 2 * c),
        WeightFormat::BF16 => bf16_at(row, 2 * c),
        _ => unreachable!("float_elem on a quantized weight"),
    }
}

/// Dequantizes one row in GGUF layout (`row.len()` = the format's row bytes for `out.len()`).
pub(crate) fn dequantize_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
    let bb = format.block_bytes();
    match format {
        WeightFormat::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32_at(b, 0);
            }
        }
        WeightFormat::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16_at(b, 0);
            }
        }
        WeightFormat::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16_at(b, 0);
            }
        }
        WeightFormat::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(row.chunks_exact(bb)) {
                let d = f16_at(b, 0);
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = d * (q as i8) as f32;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(row.chunks_exact(bb)) {
                let d = f16_at(b, 0);
                let (lo, hi) = o.split_at_mut(BLOCK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[2..]) {
                    *l = d * ((q & 0x0f) as i32 - 8) as f32;
                    *h = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(BLOCK).zip(row.chunks_exact(bb)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let (lo, hi) = o.split_at_mut(BLOCK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[4..]) {
                    *l = d * (q & 0x0f) as f32 + m;
                    *h = d * (q >> 4) as f32 + m;
                }
            }
        }
    }
}

/// `out[k] = dot(W[rows.start + k], activation row i)` for a block-quantized weight.
pub(crate) fn dot_rows_quant(
    w: &Weight,
    rows: std::ops::Range<usize>,
    acts: &QuantActs,
    i: usize,
    out: &mut [f32],
) {
    let (xq, xd, xs) = (acts.row_qs(i), acts.row_d(i), acts.row_s(i));
    let bb = w.format().block_bytes();
    for (o, r) in out.iter_mut().zip(rows) {
        let row = w.row_data(r);
        let mut acc = 0.0f32;
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let x = &xq[b * BLOCK..(b + 1) * BLOCK];
            acc += match w.format() {
                WeightFormat::Q8_0 => {
                    let isum: i32 = blk[2..]
                        .iter()
                        .zip(x)
                        .map(|(&q, &x)| (q as i8) as i32 * x as i32)
                        .sum();
                    f16_at(blk, 0) * xd[b] * isum as f32
                }
                WeightFormat::Q4_0 => {
                    let isum = nibble_dot(&blk[2..], x);
                    f16_at(blk, 0) * (xd[b] * isum as f32 - 8.0 * xs[b])
                }
                WeightFormat::Q4_1 => {
                    let isum = nibble_dot(&blk[4..], x);
                    f16_at(blk, 0) * xd[b] * isum as f32 + f16_at(blk, 2) * xs[b]
                }
                _ => unreachable!("dot_rows_quant on a float weight"),
            };
        }
        *o = acc;
    }
}

/// Integer dot of 16 nibble bytes (unsigned 0..15, ggml order) with 32 quants.
#[inline]
fn nibble_dot(qs: &[u8], x: &[i8]) -> i32 {
    let (xl, xh) = x.split_at(BLOCK / 2);
    qs.iter()
        .zip(xl.iter().zip(xh))
        .map(|(&q, (&l, &h))| (q & 0x0f) as i32 * l as i32 + (q >> 4) as i32 * h as i32)
        .sum()
}

/// `out[k] = dot(W[rows.start + k], x)` for a float weight.
pub(crate) fn dot_rows_float(
    w: &Weight,
    rows: std::ops::Range<usize>,
    x: &[f32],
    out: &mut [f32],
) {
    for (o, r) in out.iter_mut().zip(rows) {
        let row = w.row_data(r);
        *o = match w.format() {
            WeightFormat::F32 => row
                .chunks_exact(4)
                .zip(x)
                .map(|(b, &x)| f32_at(b, 0) * x)
                .sum(),
            WeightFormat::F16 => row
                .chunks_exact(2)
                .zip(x)
                .map(|(b, &x)| f16_at(b, 0) * x)
                .sum(),
            WeightFormat::BF16 => row
                .chunks_exact(2)
                .zip(x)
                .map(|(b, &x)| bf16_at(b, 0) * x)
                .sum(),
            _ => unreachable!("dot_rows_float on a quantized weight"),
        };
    }
}
