//! cuBLASLt GEMMs, the decode GEMV and the GEMV with RMSNorm fused into its input.

use super::*;

pub(crate) fn check_gemm(c: &mut Ctx) -> R<()> {
    for (t, i, o) in [
        (1usize, 4096usize, 6144usize),
        (37, 512, 1000),
        (300, 1024, 2048),
    ] {
        let x = bf(&(0..t * i).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let w = bf(&(0..o * i).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let (dx, dw, y) = (c.up(&x)?, c.up(&w)?, c.poisoned(t * o)?);
        // SAFETY: shapes as allocated.
        unsafe { c.gemm.linear(c.p(&dx), c.p(&dw), c.p(&y), t, i, o, false)? };
        let got = c.down(&y)?;
        let mut want = vec![0.0f32; t * o];
        for r in 0..t {
            for n in 0..o {
                want[r * o + n] = (0..i)
                    .map(|j| x[r * i + j].to_f32() as f64 * w[n * i + j].to_f32() as f64)
                    .sum::<f64>() as f32;
            }
        }
        c.record(
            &format!("gemm bf16 {t}x{i} -> {o}"),
            rel_err(&got, &want),
            1e-2,
        );
    }
    Ok(())
}

/// What a GEMV's epilogue makes of the f64 products `acc` (m x n): stored, added to `y0`, or
/// SwiGLU of `[gate; up]` rounded as `silu_mul_bf16` after a bf16 GEMM.
pub(crate) fn epilogue_ref(
    acc: &[f64],
    y0: &[bf16],
    epi: GemvEpilogue,
    m: usize,
    n: usize,
) -> Vec<f32> {
    match epi {
        GemvEpilogue::Store => acc.iter().map(|&v| v as f32).collect(),
        GemvEpilogue::Accumulate => acc
            .iter()
            .zip(y0)
            .map(|(&v, &o)| (v + o.to_f32() as f64) as f32)
            .collect(),
        GemvEpilogue::SwiGlu => {
            let out_w = n / 2;
            (0..m * out_w)
                .map(|i| {
                    let (t, r) = (i / out_w, i % out_w);
                    let g = rbf(acc[t * n + r] as f32);
                    let u = rbf(acc[t * n + out_w + r] as f32);
                    rbf(rbf(g / (1.0 + (-g).exp())) * u)
                })
                .collect()
        }
    }
}

/// `x · wᵀ` in f64 for tokens x k activations and n x k weights (threads over rows of w).
pub(crate) fn matmul_ref(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let threads = std::thread::available_parallelism()
        .map_or(4, |t| t.get())
        .min(32);
    let rows_per = n.div_ceil(threads);
    let mut out = vec![0.0f64; m * n];
    let parts: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|ti| {
                sc.spawn(move || {
                    let (r0, r1) = ((ti * rows_per).min(n), ((ti + 1) * rows_per).min(n));
                    let mut v = vec![0.0f64; m * (r1 - r0)];
                    for r in r0..r1 {
                        let wr = &w[r * k..][..k];
                        for t in 0..m {
                            let xr = &x[t * k..][..k];
                            v[(r - r0) * m + t] =
                                xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        }
                    }
                    v
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    for (ti, v) in parts.iter().enumerate() {
        let r0 = ti * rows_per;
        for (i, &val) in v.iter().enumerate() {
            let (r, t) = (r0 + i / m, i % m);
            out[t * n + r] = val;
        }
    }
    out
}

/// The decode GEMV against an f64 reference: Llama-3.1-8B shapes, odd n, a k that is not a
/// multiple of the kernel's step, the k-split path (few row tiles), the accumulate and SwiGLU
/// epilogues. Each case runs twice (the second run also proves the split counters were reset)
/// and both runs must agree bit for bit.
pub(crate) fn check_gemv(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let cases = [
        (1usize, 4096usize, 6144usize, Store),
        (3, 4096, 6144, Store),
        (8, 4096, 6144, Store),
        (1, 14336, 4096, Store),
        (3, 14336, 4096, Store),
        (8, 14336, 4096, Store),
        (5, 4104, 1001, Store),
        (2, 4096, 70001, Store),
        (4, 1032, 777, Accumulate),
        (8, 4096, 8192, Accumulate),
        (3, 4096, 28672, SwiGlu),
        (7, 4096, 2000, SwiGlu),
    ];
    for (m, k, n, epi) in cases {
        let x = bf(&(0..m * k).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let w = bf(&(0..n * k).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let out_w = if epi == SwiGlu { n / 2 } else { n };
        let y0 = bf(&(0..m * out_w)
            .map(|_| 4.0 * c.rng.sym())
            .collect::<Vec<_>>());
        let (dx, dw) = (c.up(&x)?, c.up(&w)?);
        let acc = matmul_ref(&unbf(&x), &unbf(&w), m, k, n);
        let want = epilogue_ref(&acc, &y0, epi, m, n);
        let mut runs = Vec::new();
        for _ in 0..2 {
            let y = if epi == Accumulate {
                c.up(&y0)?
            } else {
                c.poisoned(m * out_w)?
            };
            // SAFETY: shapes as allocated; the workspace belongs to this device and stream.
            unsafe {
                c.k.gemv(&c.s, c.p(&y), c.p(&dx), c.p(&dw), m, k, n, epi, &c.gemv_ws)?
            };
            runs.push(c.down(&y)?);
        }
        let same = runs[0]
            .iter()
            .zip(&runs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let plan = c.k.gemv_plan(k, n, epi);
        let err = rel_err(&runs[0], &want).max(rel_err(&runs[1], &want));
        let name = format!(
            "gemv {m}x{k} -> {n} {epi:?} ({} rows/block, {} tiles x {} splits){}",
            plan.rows_per_block,
            plan.tiles,
            plan.splits,
            if same { "" } else { " RUNS DIFFER" }
        );
        c.record(&name, if same { err } else { f64::INFINITY }, 1e-2);
    }
    Ok(())
}

/// CPU RMSNorm as `add_rmsnorm_bf16` rounds it: `bf16(g * bf16(x * inv))`, inv in f32.
pub(crate) fn rmsnorm_ref(x: &[bf16], g: &[bf16], m: usize, k: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; m * k];
    for r in 0..m {
        let row = &x[r * k..][..k];
        let ss: f64 = row.iter().map(|v| (v.to_f32() as f64).powi(2)).sum();
        let inv = (1.0 / (ss / k as f64 + eps as f64).sqrt()) as f32;
        for j in 0..k {
            out[r * k + j] = rbf(g[j].to_f32() * rbf(row[j].to_f32() * inv));
        }
    }
    out
}

/// The GEMV with RMSNorm fused into its input against the CPU's norm then GEMV (f64 sums):
/// Llama-3.1-8B's qkv (32-row tiles) and gate_up (SwiGLU) at 1, 3, 8 tokens, an LM-head-like
/// n (many waves of 32-row tiles), split-k plans, odd n and k, the accumulate epilogue. Each case runs twice (bit-identical),
/// and is compared with `add_rmsnorm` followed by the plain GEMV on the device, which may
/// differ only where the two sums of squares round 1 / rms differently.
pub(crate) fn check_gemv_rmsnorm(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let eps = 1e-5f32;
    let cases = [
        (1usize, 4096usize, 6144usize, Store),
        (3, 4096, 6144, Store),
        (8, 4096, 6144, Store),
        (1, 4096, 28672, SwiGlu),
        (3, 4096, 28672, SwiGlu),
        (8, 4096, 28672, SwiGlu),
        (1, 4096, 70001, Store),
        (1, 4096, 1024, Store),
        (3, 8192, 1024, Store),
        (8, 4096, 2000, SwiGlu),
        (5, 4104, 1001, Store),
        (2, 4096, 4096, Accumulate),
    ];
    for (m, k, n, epi) in cases {
        // rows of different scales, so each token's 1 / rms differs
        let x: Vec<bf16> = (0..m)
            .flat_map(|_| {
                let scale = 0.05 + 4.0 * c.rng.f();
                (0..k)
                    .map(|_| bf16::from_f32(scale * c.rng.sym()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let g = bf(&(0..k).map(|_| 1.0 + 0.5 * c.rng.sym()).collect::<Vec<_>>());
        let w = bf(&(0..n * k).map(|_| 0.1 * c.rng.sym()).collect::<Vec<_>>());
        let out_w = if epi == SwiGlu { n / 2 } else { n };
        let y0 = bf(&(0..m * out_w)
            .map(|_| 4.0 * c.rng.sym())
            .collect::<Vec<_>>());
        let (dx, dg, dw) = (c.up(&x)?, c.up(&g)?, c.up(&w)?);
        let xn = rmsnorm_ref(&x, &g, m, k, eps);
        let acc = matmul_ref(&xn, &unbf(&w), m, k, n);
        let want = epilogue_ref(&acc, &y0, epi, m, n);
        let fresh_y = |c: &Ctx| -> R<CudaSlice<bf16>> {
            if epi == Accumulate {
                c.up(&y0)
            } else {
                c.poisoned(m * out_w)
            }
        };
        let mut runs = Vec::new();
        for _ in 0..2 {
            let y = fresh_y(c)?;
            // SAFETY: shapes as allocated; the workspace belongs to this device and stream.
            unsafe {
                c.k.gemv_rmsnorm(
                    &c.s,
                    c.p(&y),
                    c.p(&dx),
                    c.p(&dg),
                    eps,
                    c.p(&dw),
                    m,
                    k,
                    n,
                    epi,
                    &c.gemv_ws,
                )?
            };
            runs.push(c.down(&y)?);
        }
        // the unfused pair on the device: add_rmsnorm (no residual add), then the GEMV
        let normed = c.poisoned(m * k)?;
        let y = fresh_y(c)?;
        // SAFETY: shapes as allocated.
        unsafe {
            c.k.add_rmsnorm(&c.s, c.p(&normed), c.p(&dx), None, c.p(&dg), m, k, eps)?;
            c.k.gemv(
                &c.s,
                c.p(&y),
                c.p(&normed),
                c.p(&dw),
                m,
                k,
                n,
                epi,
                &c.gemv_ws,
            )?;
        }
        let unfused = c.down(&y)?;
        let same = runs[0]
            .iter()
            .zip(&runs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let plan = c.k.gemv_plan(k, n, epi);
        let err = rel_err(&runs[0], &want).max(rel_err(&runs[1], &want));
        let name = format!(
            "gemv_rmsnorm {m}x{k} -> {n} {epi:?} ({} rows/block, {} tiles x {} splits){}",
            plan.rows_per_block,
            plan.tiles,
            plan.splits,
            if same { "" } else { " RUNS DIFFER" }
        );
        c.record(&name, if same { err } else { f64::INFINITY }, 1e-2);
        let differ = runs[0]
            .iter()
            .zip(&unfused)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        c.record(
            &format!(
                "gemv_rmsnorm {m}x{k} -> {n} {epi:?} vs add_rmsnorm + gemv ({differ} of {} differ)",
                unfused.len()
            ),
            rel_err(&runs[0], &unfused),
            1e-3,
        );
    }
    Ok(())
}
