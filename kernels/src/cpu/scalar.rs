//! Portable scalar kernels: the reference for the SIMD paths and the code used on CPUs
//! without them.

use super::{Weight, WeightFormat};
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
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn float_elem(format: WeightFormat, row: &[u8], c: usize) -> f32 {
    match format {
        WeightFormat::F32 => f32_at(row, 4 * c),
        WeightFormat::F16 => f16_at(row, 2 * c),
        WeightFormat::BF16 => bf16_at(row, 2 * c),
        _ => unreachable!("float_elem on a quantized weight"),
    }
}

/// Converts one row of a float format to f32.
pub(crate) fn dequantize_float_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
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
        _ => unreachable!("dequantize_float_row on a quantized format"),
    }
}

/// `out[k] = dot(W[rows.start + k], x)` for a float weight.
pub(crate) fn dot_rows_float(w: &Weight, rows: std::ops::Range<usize>, x: &[f32], out: &mut [f32]) {
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
