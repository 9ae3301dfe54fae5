//! FP8: host e4m3/e5m2 encodings, the quantization kernels, FP8 GEMMs and the FP8-weight GEMV.

use super::*;

/// e4m3 (no infinities, 448 the largest) of `f`, rounded to nearest even and saturated: the
/// rounding `quantize_rows_fp8` writes out on the device.
pub(crate) fn f2e4m3(f: f32) -> u8 {
    let sign = ((f.to_bits() >> 24) & 0x80) as u8;
    let a = f.abs();
    if a.is_nan() {
        return sign | 0x7f;
    }
    if a < 0.015625 {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let u = a
        .to_bits()
        .wrapping_add(0x7ffff + ((a.to_bits() >> 20) & 1));
    let e = (u >> 23) as i32 - 127;
    let m = ((u >> 20) & 7) as u8;
    if e > 8 || (e == 8 && m > 6) {
        return sign | 0x7e;
    }
    sign | (((e + 7) as u8) << 3) | m
}

pub(crate) fn e4m3_value(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
    if e == 0 {
        s * m / 512.0
    } else {
        s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

/// e5m2 of `f`, rounded to nearest even and saturated to +-57344 (`f2e5m2` of kv.cuh).
pub(crate) fn f2e5m2(f: f32) -> u8 {
    let sign = ((f.to_bits() >> 24) & 0x80) as u8;
    let a = f.abs();
    if a.is_nan() {
        return sign | 0x7f;
    }
    if a < 6.103_515_6e-5 {
        return sign | (a * 65536.0).round_ties_even() as u8;
    }
    let u = a
        .to_bits()
        .wrapping_add(0xfffff + ((a.to_bits() >> 21) & 1));
    let e = (u >> 23) as i32 - 127;
    let m = ((u >> 21) & 3) as u8;
    if e > 15 {
        return sign | 0x7b;
    }
    sign | (((e + 15) as u8) << 2) | m
}

pub(crate) fn e5m2_value(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((b >> 2) & 31) as i32, (b & 3) as f64);
    if e == 31 {
        return f64::NAN;
    }
    if e == 0 {
        s * m / 65536.0
    } else {
        s * (1.0 + m / 4.0) * 2f64.powi(e - 15)
    }
}

/// `vals` as a KV pool of `kv` elements: the bytes to upload (each value rounded to bf16 first,
/// as the kernels store bf16 results) and the values those bytes stand for.
pub(crate) fn kv_encode(vals: &[f32], kv: KvDtype) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::with_capacity(vals.len() * kv.bytes());
    let mut back = Vec::with_capacity(vals.len());
    for &v in vals {
        let b = bf16::from_f32(v);
        match kv {
            KvDtype::Bf16 => {
                bytes.extend(b.to_bits().to_le_bytes());
                back.push(b.to_f32());
            }
            KvDtype::Fp8E4m3 => {
                let q = f2e4m3(b.to_f32());
                bytes.push(q);
                back.push(if q & 0x7f == 0x7f {
                    f32::NAN
                } else {
                    e4m3_value(q) as f32
                });
            }
            KvDtype::Fp8E5m2 => {
                let q = f2e5m2(b.to_f32());
                bytes.push(q);
                back.push(e5m2_value(q) as f32);
            }
        }
    }
    (bytes, back)
}

/// The values of a pool's bytes.
pub(crate) fn kv_decode(bytes: &[u8], kv: KvDtype) -> Vec<f32> {
    match kv {
        KvDtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        KvDtype::Fp8E4m3 => bytes
            .iter()
            .map(|&q| {
                if q & 0x7f == 0x7f {
                    f32::NAN
                } else {
                    e4m3_value(q) as f32
                }
            })
            .collect(),
        KvDtype::Fp8E5m2 => bytes.iter().map(|&q| e5m2_value(q) as f32).collect(),
    }
}

/// Host quantization of rows of `k` values: (e4m3 bytes, one scale per row).
pub(crate) fn quantize_ref(x: &[bf16], k: usize) -> (Vec<u8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut scales = Vec::new();
    for row in x.chunks(k) {
        let amax = row.iter().fold(0.0f32, |a, v| a.max(v.to_f32().abs()));
        let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
        q.extend(row.iter().map(|v| f2e4m3(v.to_f32() / s)));
        scales.push(s);
    }
    (q, scales)
}

pub(crate) fn dequantize_ref(q: &[u8], scales: &[f32], k: usize) -> Vec<f32> {
    q.chunks(k)
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&b| (e4m3_value(b) * s as f64) as f32))
        .collect()
}

/// Random weights as a checkpoint has them: most near zero, some large, a row of zeros.
pub(crate) fn fp8_test_weights(c: &mut Ctx, n: usize, k: usize) -> Vec<bf16> {
    let mut w: Vec<bf16> = (0..n * k)
        .map(|i| {
            let v = c.rng.sym() * if i % 97 == 0 { 3.0 } else { 0.05 };
            bf16::from_f32(if i % 13 == 0 { v * 1e-4 } else { v })
        })
        .collect();
    for v in &mut w[..k] {
        *v = bf16::ZERO;
    }
    w
}

/// FP8: the quantization kernel bit for bit against the host (every e4m3 value, subnormals,
/// saturation, a zero row), the dequantization, the FP8-weight GEMV in every form against an
/// f64 reference with the same dequantized weights, and the cuBLASLt FP8 GEMM (per-token and
/// per-channel scales) against an f64 reference of the same FP8 arithmetic (rel err <= 1e-2).
pub(crate) fn check_fp8(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    // every bf16 that lands in each e4m3 bucket edge: a sweep across the whole range
    let sweep: Vec<bf16> = (0..4096)
        .map(|i| {
            bf16::from_f32((i as f32 - 2048.0) / 2048.0 * 470.0 * (1.0 + (i % 7) as f32 * 1e-3))
        })
        .chain([0.0, 1e-8, -2e-3, 1.9e-3, 448.0, -464.0, 465.0, 1e30].map(bf16::from_f32))
        .chain(std::iter::repeat_n(bf16::ZERO, 2052)) // a row of zeros: scale 1
        .collect();
    // 3 rows of 2052 values (read one at a time) and of 2048 (read as 8-value vectors)
    let rows = 3;
    let mut last = (Vec::new(), Vec::new(), 0usize);
    for k in [sweep.len() / rows, 2048] {
        let sweep = &sweep[..rows * k];
        let (dx, dq, ds) = (
            c.up(sweep)?,
            c.up(&vec![0u8; sweep.len()])?,
            c.up(&vec![0f32; rows])?,
        );
        // SAFETY: rows x k values, bytes and scales as allocated.
        unsafe {
            c.k.quantize_rows_fp8(&c.s, c.p(&dq), c.p(&ds), c.p(&dx), rows, k)?
        };
        c.s.synchronize()?;
        let (gq, gs) = (c.s.clone_dtoh(&dq)?, c.s.clone_dtoh(&ds)?);
        let (wq, ws) = quantize_ref(sweep, k);
        let differ = gq.iter().zip(&wq).filter(|(a, b)| a != b).count()
            + gs.iter()
                .zip(&ws)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
        c.record(
            &format!("quantize_rows_fp8 {rows}x{k} vs host ({differ} differ)"),
            differ as f64,
            0.0,
        );
        let dy = c.poisoned(sweep.len())?;
        // SAFETY: as above; dy holds rows x k.
        unsafe {
            c.k.dequantize_rows_fp8(&c.s, c.p(&dy), c.p(&dq), c.p(&ds), rows, k)?
        };
        let got = c.down(&dy)?;
        let want: Vec<f32> = dequantize_ref(&wq, &ws, k).into_iter().map(rbf).collect();
        c.record(
            &format!("dequantize_rows_fp8 {rows}x{k} vs host"),
            rel_err(&got, &want),
            0.0,
        );
        last = (wq, ws, k);
    }
    let (wq, ws, k) = last;
    let sweep = &sweep[..rows * k];
    // quantization error itself: within e4m3's half step (2^-4 relative) of each large value
    let qerr = rel_err(&dequantize_ref(&wq, &ws, k), &unbf(sweep));
    c.record("e4m3 round trip of the sweep", qerr, 4e-2);

    let cases = [
        (1usize, 4096usize, 6144usize, Store, false),
        (8, 4096, 6144, Store, false),
        (1, 14336, 4096, Accumulate, false),
        (5, 4096, 28672, SwiGlu, false),
        (3, 4112, 1008, Store, false),
        (2, 4096, 70016, Store, false),
        (1, 4096, 6144, Store, true),
        (8, 4096, 28672, SwiGlu, true),
        (3, 4096, 4096, Accumulate, true),
    ];
    let eps = 1e-5f32;
    for (m, k, n, epi, norm) in cases {
        let x = bf(&(0..m * k).map(|_| 2.0 * c.rng.sym()).collect::<Vec<_>>());
        let g = bf(&(0..k).map(|_| 1.0 + 0.5 * c.rng.sym()).collect::<Vec<_>>());
        let w = fp8_test_weights(c, n, k);
        let (q, sc) = quantize_ref(&w, k);
        let deq = dequantize_ref(&q, &sc, k);
        let out_w = if epi == SwiGlu { n / 2 } else { n };
        let y0 = bf(&(0..m * out_w).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let xin = if norm {
            rmsnorm_ref(&x, &g, m, k, eps)
        } else {
            unbf(&x)
        };
        let acc = matmul_ref(&xin, &deq, m, k, n);
        let want = epilogue_ref(&acc, &y0, epi, m, n);
        let (dx, dg, dq, ds) = (c.up(&x)?, c.up(&g)?, c.up(&q)?, c.up(&sc)?);
        let wref = WeightRef::Fp8 {
            w: c.p(&dq),
            scale: c.p(&ds),
        };
        let mut runs = Vec::new();
        for _ in 0..2 {
            let y = if epi == Accumulate {
                c.up(&y0)?
            } else {
                c.poisoned(m * out_w)?
            };
            // SAFETY: shapes as allocated; the workspace belongs to this device and stream.
            unsafe {
                if norm {
                    c.k.gemv_rmsnorm(
                        &c.s,
                        c.p(&y),
                        c.p(&dx),
                        c.p(&dg),
                        eps,
                        wref,
                        m,
                        k,
                        n,
                        epi,
                        &c.gemv_ws,
                    )?
                } else {
                    c.k.gemv(&c.s, c.p(&y), c.p(&dx), wref, m, k, n, epi, &c.gemv_ws)?
                }
            };
            runs.push(c.down(&y)?);
        }
        let same = runs[0]
            .iter()
            .zip(&runs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let plan = c.k.gemv_plan(k, n, epi);
        let err = rel_err(&runs[0], &want);
        let name = format!(
            "gemv fp8{} {m}x{k} -> {n} {epi:?} ({} rows/block, {} tiles x {} splits){}",
            if norm { " rmsnorm" } else { "" },
            plan.rows_per_block,
            plan.tiles,
            plan.splits,
            if same { "" } else { " RUNS DIFFER" }
        );
        c.record(&name, if same { err } else { f64::INFINITY }, 1e-2);
    }

    for (t, i, o, accumulate) in [
        (1usize, 4096usize, 6144usize, false),
        (37, 512, 1008, false),
        (300, 4096, 2048, true),
        (1024, 4096, 14336, false),
    ] {
        let x = bf(&(0..t * i).map(|_| 3.0 * c.rng.sym()).collect::<Vec<_>>());
        let w = fp8_test_weights(c, o, i);
        let y0 = bf(&(0..t * o).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let (wq, wsc) = quantize_ref(&w, i);
        let (dx, dwq, dws) = (c.up(&x)?, c.up(&wq)?, c.up(&wsc)?);
        let (dxq, dxs) = (c.up(&vec![0u8; t * i])?, c.up(&vec![0f32; t])?);
        let y = if accumulate {
            c.up(&y0)?
        } else {
            c.poisoned(t * o)?
        };
        let d = c.poisoned(t * o)?;
        // the product unscaled into d (or y itself), then the scales
        let dst = if accumulate { c.p(&d) } else { c.p(&y) };
        // SAFETY: shapes as allocated.
        let r = unsafe {
            c.k.quantize_rows_fp8(&c.s, c.p(&dxq), c.p(&dxs), c.p(&dx), t, i)?;
            c.gemm
                .linear_fp8(c.p(&dxq), c.p(&dwq), dst, t, i, o)
                .and_then(|()| {
                    c.k.fp8_rescale(&c.s, c.p(&y), dst, c.p(&dxs), c.p(&dws), t, o, accumulate)
                })
        };
        if let Err(e) = r {
            println!("FAIL gemm fp8 {t}x{i} -> {o}: {e}");
            c.record(
                &format!("gemm fp8 {t}x{i} -> {o} (refused)"),
                f64::INFINITY,
                1e-2,
            );
            continue;
        }
        let got = c.down(&y)?;
        let (xq, xsc) = quantize_ref(&x, i);
        let acc = matmul_ref(
            &dequantize_ref(&xq, &xsc, i),
            &dequantize_ref(&wq, &wsc, i),
            t,
            i,
            o,
        );
        let want: Vec<f32> = if accumulate {
            acc.iter()
                .zip(&y0)
                .map(|(&v, &b)| (v + b.to_f32() as f64) as f32)
                .collect()
        } else {
            acc.iter().map(|&v| v as f32).collect()
        };
        c.record(
            &format!(
                "gemm fp8 {t}x{i} -> {o}{}",
                if accumulate { " accumulate" } else { "" }
            ),
            rel_err(&got, &want),
            1e-2,
        );
    }
    Ok(())
}
