//! The FP8 path's fused kernels: RMSNorm (with the residual add and the rescale of an FP8
//! GEMM's unscaled product) and SiLU-mul, each writing e4m3 rows and their scales.

use super::*;

/// Counts the places where two e4m3 rows with their scales stand for different values (+0 and
/// -0 are the same value; the GEMM after them cannot tell them apart).
fn fp8_value_diffs(q: &[u8], s: &[f32], q2: &[u8], s2: &[f32], k: usize) -> usize {
    let a = dequantize_ref(q, s, k);
    let b = dequantize_ref(q2, s2, k);
    a.iter().zip(&b).filter(|(x, y)| x != y).count()
        + s.iter()
            .zip(s2)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count()
}

/// Host values (already bf16) through the host's per-row e4m3 quantization and back.
fn quantized_ref(v: &[f32], k: usize) -> Vec<f32> {
    let (q, s) = quantize_ref(&bf(v), k);
    dequantize_ref(&q, &s, k)
}

/// Counts bf16 values that differ (+0 and -0 equal).
fn value_diffs(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// Each fused kernel against the unfused kernels it replaces, run on the same device (the
/// values must be identical: the FP8 path gives the same tokens fused or not), and against
/// the host's arithmetic quantized by the host (rel err <= 1e-2, the tolerance of the other
/// FP8 checks; the host sums squares in another order and has its own exp, so a few values
/// may round to the neighbouring e4m3 value).
pub(crate) fn check_fp8_fused(c: &mut Ctx) -> R<()> {
    let eps = 1e-5f32;
    // (tokens, hidden, delta: 0 none, 1 bf16, 2 an FP8 GEMM's unscaled product)
    for (t, h, form) in [
        (37usize, 4096usize, 0u8),
        (37, 4096, 1),
        (37, 4096, 2),
        (5, 8192, 2),
        (3, 4112, 2),
        (64, 1024, 1),
    ] {
        let x = bf(&(0..t * h).map(|_| 2.0 * c.rng.sym()).collect::<Vec<_>>());
        let g = bf(&(0..h).map(|_| 1.0 + 0.5 * c.rng.sym()).collect::<Vec<_>>());
        // an unscaled product is large (sums of e4m3 products); its scales bring it back
        let dscale = if form == 2 { 3000.0 } else { 1.0 };
        let d = bf(&(0..t * h).map(|_| dscale * c.rng.sym()).collect::<Vec<_>>());
        let xs_in: Vec<f32> = (0..t).map(|_| 1e-2 * (1.0 + c.rng.f())).collect();
        let ws: Vec<f32> = (0..h).map(|_| 3e-2 * (1.0 + c.rng.f())).collect();
        let (dg, dd, dws) = (c.up(&g)?, c.up(&d)?, c.up(&ws)?);
        // fused: the row scales in the same buffer the kernel writes its own into
        let (res_f, q_f, s_f) = (c.up(&x)?, c.up(&vec![0u8; t * h])?, c.up(&xs_in)?);
        // unfused: rescale into a copy, add_rmsnorm into bf16, quantize_rows_fp8
        let (res_u, q_u, s_u) = (c.up(&x)?, c.up(&vec![0u8; t * h])?, c.up(&vec![0f32; t])?);
        let (xs_u, scaled, normed) = (c.up(&xs_in)?, c.poisoned(t * h)?, c.poisoned(t * h)?);
        let delta = (form > 0).then(|| c.p(&dd));
        // SAFETY: every buffer holds the shapes given.
        unsafe {
            c.k.add_rmsnorm_quant_fp8(
                &c.s,
                c.p(&q_f),
                c.p(&s_f),
                c.p(&res_f),
                delta,
                (form == 2).then(|| (c.p(&s_f), c.p(&dws))),
                c.p(&dg),
                t,
                h,
                eps,
            )?;
            let du = if form == 2 {
                c.k.fp8_rescale(
                    &c.s,
                    c.p(&scaled),
                    c.p(&dd),
                    c.p(&xs_u),
                    c.p(&dws),
                    t,
                    h,
                    false,
                )?;
                Some(c.p(&scaled))
            } else {
                delta
            };
            c.k.add_rmsnorm(&c.s, c.p(&normed), c.p(&res_u), du, c.p(&dg), t, h, eps)?;
            c.k.quantize_rows_fp8(&c.s, c.p(&q_u), c.p(&s_u), c.p(&normed), t, h)?;
        }
        let (rf, ru) = (c.down(&res_f)?, c.down(&res_u)?);
        let (qf, sf) = (c.s.clone_dtoh(&q_f)?, c.s.clone_dtoh(&s_f)?);
        let (qu, su) = (c.s.clone_dtoh(&q_u)?, c.s.clone_dtoh(&s_u)?);
        let differ = value_diffs(&rf, &ru) + fp8_value_diffs(&qf, &sf, &qu, &su, h);
        let name = format!(
            "add_rmsnorm_quant_fp8 {t}x{h} {} vs unfused ({differ} differ)",
            ["no delta", "delta", "unscaled delta"][form as usize]
        );
        c.record(&name, differ as f64, 0.0);
        // host: the same steps in f32/f64
        let mut res_h = unbf(&x);
        if form > 0 {
            for (i, r) in res_h.iter_mut().enumerate() {
                let dv = d[i].to_f32();
                let dv = if form == 2 {
                    rbf(dv * xs_in[i / h] * ws[i % h])
                } else {
                    dv
                };
                *r = rbf(*r + dv);
            }
        }
        let want = quantized_ref(&rmsnorm_ref(&bf(&res_h), &g, t, h, eps), h);
        let got = dequantize_ref(&qf, &sf, h);
        c.record(
            &format!("add_rmsnorm_quant_fp8 {t}x{h} form {form} vs host"),
            rel_err(&rf, &res_h).max(rel_err(&got, &want)),
            1e-2,
        );
    }

    for (t, inter, scaled) in [
        (37usize, 14336usize, true),
        (37, 14336, false),
        (9, 7168, true),
        (64, 1000, true),
        (2, 28672, true),
    ] {
        let dscale = if scaled { 2000.0 } else { 2.0 };
        let gu = bf(&(0..t * 2 * inter)
            .map(|_| dscale * c.rng.sym())
            .collect::<Vec<_>>());
        let xs_in: Vec<f32> = (0..t).map(|_| 1e-2 * (1.0 + c.rng.f())).collect();
        let ws: Vec<f32> = (0..2 * inter).map(|_| 1e-1 * (1.0 + c.rng.f())).collect();
        let (dgu, dws) = (c.up(&gu)?, c.up(&ws)?);
        let (q_f, s_f) = (c.up(&vec![0u8; t * inter])?, c.up(&xs_in)?);
        let (q_u, s_u, xs_u) = (
            c.up(&vec![0u8; t * inter])?,
            c.up(&vec![0f32; t])?,
            c.up(&xs_in)?,
        );
        let (resc, act) = (c.poisoned(t * 2 * inter)?, c.poisoned(t * inter)?);
        // SAFETY: every buffer holds the shapes given.
        unsafe {
            c.k.silu_mul_quant_fp8(
                &c.s,
                c.p(&q_f),
                c.p(&s_f),
                c.p(&dgu),
                scaled.then(|| (c.p(&s_f), c.p(&dws))),
                t,
                inter,
            )?;
            let src = if scaled {
                c.k.fp8_rescale(
                    &c.s,
                    c.p(&resc),
                    c.p(&dgu),
                    c.p(&xs_u),
                    c.p(&dws),
                    t,
                    2 * inter,
                    false,
                )?;
                c.p(&resc)
            } else {
                c.p(&dgu)
            };
            c.k.silu_mul(&c.s, c.p(&act), src, t, inter)?;
            c.k.quantize_rows_fp8(&c.s, c.p(&q_u), c.p(&s_u), c.p(&act), t, inter)?;
        }
        c.s.synchronize()?;
        let (qf, sf) = (c.s.clone_dtoh(&q_f)?, c.s.clone_dtoh(&s_f)?);
        let (qu, su) = (c.s.clone_dtoh(&q_u)?, c.s.clone_dtoh(&s_u)?);
        let differ = fp8_value_diffs(&qf, &sf, &qu, &su, inter);
        c.record(
            &format!(
                "silu_mul_quant_fp8 {t}x{inter}{} vs unfused ({differ} differ)",
                if scaled { " unscaled input" } else { "" }
            ),
            differ as f64,
            0.0,
        );
        let mut want = Vec::with_capacity(t * inter);
        for r in 0..t {
            for i in 0..inter {
                let v = |j: usize| {
                    let raw = gu[r * 2 * inter + j].to_f32();
                    if scaled {
                        rbf(raw * xs_in[r] * ws[j])
                    } else {
                        raw
                    }
                };
                let (gv, uv) = (v(i), v(inter + i));
                want.push(rbf(rbf(gv / (1.0 + (-gv).exp())) * uv));
            }
        }
        let want = quantized_ref(&want, inter);
        let got = dequantize_ref(&qf, &sf, inter);
        c.record(
            &format!("silu_mul_quant_fp8 {t}x{inter} vs host"),
            rel_err(&got, &want),
            1e-2,
        );
    }
    Ok(())
}
