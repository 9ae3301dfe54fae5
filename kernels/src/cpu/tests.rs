//! Kernel tests against a plain f64 reference on weights dequantized by candle.
//!
//! Tolerances: a quantized product differs from the exact product of the dequantized weights
//! with the f32 activations only by the activation quantization (each activation moves by at
//! most half a step, `amax(block) / 254`) plus f32 rounding. So each output must lie within
//! `sum_blocks amax_x(block) / 254 * sum_block |w|` (the exact worst case, times 1.001) plus
//! `2e-5 * sum |w x|` for f32 summation. Float formats get only the rounding term. Two
//! instruction sets quantize activations identically, so they must agree to the rounding term.

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::dispatch::matmul_with;
use super::*;

const FORMATS: [WeightFormat; 6] = [
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::BF16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
];

fn random_vec(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-scale..scale)).collect()
}

/// A weight in `format` made from random values, and its exact dequantized values.
fn random_weight(format: WeightFormat, rows: usize, cols: usize, seed: u64) -> (Weight, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let values = random_vec(&mut rng, rows * cols, 0.5);
    let (bytes, exact): (Vec<u8>, Vec<f32>) = match format {
        WeightFormat::F32 => (
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            values.clone(),
        ),
        WeightFormat::F16 => {
            let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        WeightFormat::BF16 => {
            let h: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
            let dtype = match format {
                WeightFormat::Q8_0 => GgmlDType::Q8_0,
                WeightFormat::Q4_0 => GgmlDType::Q4_0,
                _ => GgmlDType::Q4_1,
            };
            let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&t, dtype).expect("quantize");
            let exact = q
                .dequantize(&Device::Cpu)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .expect("dequantize");
            (q.data().expect("data").into_owned(), exact)
        }
    };
    let w = Weight::from_raw(format, rows, cols, bytes).expect("from_raw");
    (w, exact)
}

/// Checks `got` against the exact product of `exact` weights and `x`, with the bound in the
/// module docs.
fn check_product(
    format: WeightFormat,
    exact: &[f32],
    x: &[f32],
    n: usize,
    got: &[f32],
    what: &str,
) {
    let cols = x.len() / n;
    let rows = exact.len() / cols;
    for i in 0..n {
        let xi = &x[i * cols..(i + 1) * cols];
        for r in 0..rows {
            let wr = &exact[r * cols..(r + 1) * cols];
            let reference: f64 = wr.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
            let magnitude: f64 = wr
                .iter()
                .zip(xi)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let mut bound = 2e-5 * magnitude + 1e-6;
            if format.is_quantized() {
                for (wb, xb) in wr.chunks(BLOCK).zip(xi.chunks(BLOCK)) {
                    let amax = xb.iter().fold(0.0f64, |m, &v| m.max(v.abs() as f64));
                    let wsum: f64 = wb.iter().map(|&v| v.abs() as f64).sum();
                    bound += 1.001 * amax / 254.0 * wsum;
                }
            }
            let g = got[i * rows + r] as f64;
            assert!(
                (g - reference).abs() <= bound,
                "{what}: {format} out[{i}, {r}] = {g}, reference {reference}, bound {bound}"
            );
        }
    }
}

#[test]
fn every_format_and_isa_matches_reference() {
    let mut seed = 1;
    for format in FORMATS {
        for &(rows, cols) in &[(1, 32), (7, 96), (37, 576), (65, 160)] {
            let (w, exact) = random_weight(format, rows, cols, seed);
            for n in [1, 3, 17] {
                seed += 1;
                let mut rng = StdRng::seed_from_u64(seed);
                let x = random_vec(&mut rng, n * cols, 2.0);
                let mut results = Vec::new();
                for isa in Isa::all_supported() {
                    let mut out = vec![f32::NAN; n * rows];
                    matmul_with(isa, &w, &x, n, &mut out);
                    let what = format!("{isa:?} {rows}x{cols} n={n}");
                    check_product(format, &exact, &x, n, &out, &what);
                    results.push((isa, out));
                }
                // Same activation quantization on every ISA: only summation order differs.
                let (_, base) = &results[0];
                for (isa, out) in &results[1..] {
                    for (k, (a, b)) in base.iter().zip(out).enumerate() {
                        let tol = 1e-4 * a.abs().max(1.0);
                        assert!(
                            (a - b).abs() <= tol,
                            "{isa:?} vs scalar {format} [{k}]: {b} vs {a}"
                        );
                    }
                }
            }
        }
    }
}

/// Every activation-row count from 1 to 17 (all tile sizes and their splits) on row counts
/// that are not multiples of the row group, against the exact product and across ISAs.
#[test]
fn every_tile_size_matches_reference() {
    let mut seed = 1000;
    for format in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
        for &(rows, cols) in &[(23, 64), (49, 96)] {
            let (w, exact) = random_weight(format, rows, cols, seed);
            for n in 1..=17 {
                seed += 1;
                let mut rng = StdRng::seed_from_u64(seed);
                let x = random_vec(&mut rng, n * cols, 2.0);
                let mut base: Option<Vec<f32>> = None;
                for isa in Isa::all_supported() {
                    let mut out = vec![f32::NAN; n * rows];
                    matmul_with(isa, &w, &x, n, &mut out);
                    let what = format!("{isa:?} {rows}x{cols} n={n}");
                    check_product(format, &exact, &x, n, &out, &what);
                    match &base {
                        None => base = Some(out),
                        Some(base) => {
                            for (k, (a, b)) in base.iter().zip(&out).enumerate() {
                                let tol = 1e-4 * a.abs().max(1.0);
                                assert!((a - b).abs() <= tol, "{what} vs scalar [{k}]: {b} vs {a}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn float_formats_handle_columns_not_multiple_of_eight() {
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for cols in [1, 13, 41] {
            let (w, exact) = random_weight(format, 9, cols, 99 + cols as u64);
            let mut rng = StdRng::seed_from_u64(7);
            let x = random_vec(&mut rng, 3 * cols, 1.0);
            for isa in Isa::all_supported() {
                let mut out = vec![f32::NAN; 3 * 9];
                matmul_with(isa, &w, &x, 3, &mut out);
                check_product(format, &exact, &x, 3, &out, &format!("{isa:?} cols={cols}"));
            }
        }
    }
}

#[test]
fn large_matrix_uses_threads_and_matches() {
    // Enough rows for several chunks per thread; n = 70 spans two passes of 64 rows.
    let (rows, cols) = (1000, 256);
    for (format, n) in [
        (WeightFormat::Q4_1, 5),
        (WeightFormat::Q8_0, 5),
        (WeightFormat::F16, 5),
        (WeightFormat::Q4_0, 70),
    ] {
        let (w, exact) = random_weight(format, rows, cols, 5);
        let mut rng = StdRng::seed_from_u64(6);
        let x = random_vec(&mut rng, n * cols, 1.0);
        let mut out = vec![f32::NAN; n * rows];
        matmul(&w, &x, n, &mut out);
        check_product(format, &exact, &x, n, &out, "matmul");
    }
}

#[test]
fn matmul_multi_matches_separate_products() {
    let cols = 192;
    let shapes = [
        (64, WeightFormat::Q4_1),
        (24, WeightFormat::Q8_0),
        (37, WeightFormat::Q4_0),
    ];
    let ws: Vec<Weight> = shapes
        .iter()
        .enumerate()
        .map(|(k, &(rows, f))| random_weight(f, rows, cols, 70 + k as u64).0)
        .collect();
    let refs: Vec<&Weight> = ws.iter().collect();
    for n in [1, 6] {
        let mut rng = StdRng::seed_from_u64(71);
        let x = random_vec(&mut rng, n * cols, 1.0);
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
        let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_multi(&refs, &x, n, &mut slices);
        for (w, got) in ws.iter().zip(&outs) {
            let mut want = vec![0.0; n * w.rows()];
            matmul(w, &x, n, &mut want);
            assert_eq!(got, &want, "{} n={n}", w.format());
        }
    }
    // Float weights take the unfused path.
    let (f, _) = random_weight(WeightFormat::F32, 5, cols, 80);
    let x = vec![0.5; cols];
    let mut out = vec![f32::NAN; 5];
    matmul_multi(&[&f], &x, 1, &mut [out.as_mut_slice()]);
    let mut want = vec![0.0; 5];
    matmul(&f, &x, 1, &mut want);
    assert_eq!(out, want);
}

#[test]
fn concurrent_callers_get_correct_results() {
    let (rows, cols, n) = (512, 128, 3);
    let (w, exact) = random_weight(WeightFormat::Q4_0, rows, cols, 21);
    let mut rng = StdRng::seed_from_u64(22);
    let x = random_vec(&mut rng, n * cols, 1.0);
    let mut want = vec![0.0; n * rows];
    matmul(&w, &x, n, &mut want);
    check_product(WeightFormat::Q4_0, &exact, &x, n, &want, "single caller");
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..50 {
                    let mut out = vec![0.0; n * rows];
                    matmul(&w, &x, n, &mut out);
                    assert_eq!(out, want);
                }
            });
        }
    });
}

#[test]
fn dequantize_row_matches_candle() {
    for format in FORMATS {
        let (w, exact) = random_weight(format, 5, 64, 42);
        let mut row = vec![0.0; 64];
        for r in 0..5 {
            w.dequantize_row(r, &mut row);
            assert_eq!(row, exact[r * 64..(r + 1) * 64], "{format} row {r}");
        }
    }
}

#[test]
fn activation_quantization_is_identical_across_isas() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut x = random_vec(&mut rng, 32 * 40, 3.0);
    // Exact ties and zeros.
    x[..32].fill(0.0);
    for (k, v) in x[32..64].iter_mut().enumerate() {
        *v = k as f32 - 15.5;
    }
    let base = quant::QuantActs::new(Isa::Scalar, &x, 40, 32);
    for isa in Isa::all_supported() {
        let q = quant::QuantActs::new(isa, &x, 40, 32);
        assert_eq!(q.qs, base.qs, "{isa:?}");
        assert_eq!(q.d, base.d, "{isa:?}");
        assert_eq!(q.s, base.s, "{isa:?}");
        assert_eq!(q.sq, base.sq, "{isa:?}");
    }
}

#[test]
fn batched_activation_quantization_matches_row_by_row() {
    // Enough blocks (37 rows x 10) for the pool to split the rows; an odd row count so the
    // last task is shorter.
    let mut rng = StdRng::seed_from_u64(4);
    let (n, cols) = (37, 320);
    let x = random_vec(&mut rng, n * cols, 2.0);
    for isa in Isa::all_supported() {
        let all = quant::QuantActs::new(isa, &x, n, cols);
        for r in 0..n {
            let one = quant::QuantActs::new(isa, &x[r * cols..(r + 1) * cols], 1, cols);
            assert_eq!(all.row_qs(r), &one.qs[..], "{isa:?} row {r}");
            assert_eq!(all.row_d(r), &one.d[..], "{isa:?} row {r}");
            assert_eq!(all.row_s(r), &one.s[..], "{isa:?} row {r}");
            assert_eq!(all.row_sq(r), &one.sq[..], "{isa:?} row {r}");
        }
    }
}

#[test]
fn from_raw_rejects_bad_shapes() {
    assert!(matches!(
        Weight::from_raw(WeightFormat::Q4_1, 2, 48, vec![0; 60]),
        Err(KernelError::ColsNotBlockAligned { .. })
    ));
    assert!(matches!(
        Weight::from_raw(WeightFormat::Q4_0, 2, 64, vec![0; 71]),
        Err(KernelError::SizeMismatch {
            expected: 72,
            got: 71,
            ..
        })
    ));
    assert!(matches!(
        Weight::from_f32(2, 3, vec![0.0; 5]),
        Err(KernelError::SizeMismatch { .. })
    ));
    let w = Weight::from_raw(WeightFormat::Q8_0, 3, 64, vec![0; 3 * 68]).expect("valid");
    // Packed in groups of 16 rows: padded to 16 rows.
    assert_eq!((w.rows(), w.cols(), w.size_bytes()), (3, 64, 16 * 68));
    assert_eq!(w.format(), WeightFormat::Q8_0);
}

#[test]
fn empty_products() {
    let w = Weight::from_f32(0, 4, vec![]).expect("valid");
    matmul(&w, &[1.0; 8], 2, &mut []);
    let w = Weight::from_f32(3, 0, vec![]).expect("valid");
    let mut out = [f32::NAN; 6];
    matmul(&w, &[], 2, &mut out);
    assert_eq!(out, [0.0; 6]);
}

#[test]
fn parallel_for_runs_every_task_once() {
    for n in [0, 1, 2, 3, 100, 1000] {
        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        parallel_for(n, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
    }
}

#[test]
fn parallel_chunks_mut_covers_every_element_once() {
    let mut data = vec![0usize; 1003];
    parallel_chunks_mut(&mut data, 10, |i, chunk| {
        for (k, v) in chunk.iter_mut().enumerate() {
            *v += i * 10 + k + 1;
        }
    });
    assert!(data.iter().enumerate().all(|(k, &v)| v == k + 1));
}

#[test]
fn parallel_for_nested_runs_serially() {
    let total = AtomicUsize::new(0);
    parallel_for(4, |_| {
        parallel_for(5, |_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 20);
}

#[test]
fn parallel_for_propagates_panics() {
    let result = std::panic::catch_unwind(|| {
        parallel_for(64, |i| {
            if i == 37 {
                panic!("task 37 failed");
            }
        })
    });
    assert!(result.is_err());
    // The pool still works afterwards.
    let total = AtomicUsize::new(0);
    parallel_for(10, |_| {
        total.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(total.load(Ordering::Relaxed), 10);
}

/// The real model's tensors (when the GGUF has been fetched with `scripts/fetch-model.sh`):
/// our dequantizer against candle's, and one product against the reference.
#[test]
fn real_gguf_tensors() {
    let path = std::env::var("SGL_TEST_GGUF").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        .to_string()
    });
    let Ok(mut file) = std::fs::File::open(&path) else {
        eprintln!("skipping: no GGUF at {path}");
        return;
    };
    let content =
        candle_core::quantized::gguf_file::Content::read(&mut file).expect("read GGUF header");
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.3.ffn_down.weight",
    ] {
        let q = content
            .tensor(&mut file, name, &Device::Cpu)
            .expect("read tensor");
        let (rows, cols) = q.shape().dims2().expect("2-d tensor");
        let format = match q.dtype() {
            GgmlDType::Q8_0 => WeightFormat::Q8_0,
            GgmlDType::Q4_0 => WeightFormat::Q4_0,
            GgmlDType::Q4_1 => WeightFormat::Q4_1,
            GgmlDType::F16 => WeightFormat::F16,
            GgmlDType::F32 => WeightFormat::F32,
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        let w = Weight::from_raw(format, rows, cols, q.data().expect("data").into_owned())
            .expect("from_raw");
        let exact = q
            .dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("dequantize");
        let mut row = vec![0.0; cols];
        for r in [0, rows / 2, rows - 1] {
            w.dequantize_row(r, &mut row);
            assert_eq!(row, exact[r * cols..(r + 1) * cols], "{name} row {r}");
        }
        let mut rng = StdRng::seed_from_u64(11);
        let n = 2;
        let x = random_vec(&mut rng, n * cols, 1.0);
        for isa in Isa::all_supported() {
            let mut out = vec![f32::NAN; n * rows];
            matmul_with(isa, &w, &x, n, &mut out);
            check_product(format, &exact, &x, n, &out, &format!("{isa:?} {name}"));
        }
    }
}

#[test]
fn portable_f16_conversion_matches_half() {
    for bits in 0..=u16::MAX {
        let want = f16::from_bits(bits).to_f32();
        let got = packed::f16_bits_to_f32(&bits.to_le_bytes(), 0);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{bits:#06x}: {got} vs {want}"
        );
    }
}
