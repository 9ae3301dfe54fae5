//! The FP8 path's fused kernels: RMSNorm (with the residual add and the rescale of an FP8
//! GEMM's unscaled product) and SiLU-mul, each writing e4m3 rows and their scales; the
//! activations' quantization exhaustively; the qkv product's rescale folded into RoPE.

use super::*;
use sgl_kernels::KvScales;

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
        // more rows than blocks resident at once: each block takes several, its next rows' loads
        // in flight
        (600, 4096, 2),
        (700, 4096, 0),
        // rows of more vectors than threads: kept between the passes, or read again
        (3, 16384, 2),
        (2, 40960, 1),
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
        // more rows than blocks resident at once; rows read again
        (300, 14336, true),
        (2, 40000, false),
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
    check_quantize_rows(c)?;
    check_silu_quant_edges(c)?;
    check_act_quant_exhaustive(c)?;
    for kv in [KvDtype::Bf16, KvDtype::Fp8E4m3] {
        check_rope_rescale(c, kv)?;
    }
    Ok(())
}

/// Counts differing bytes of two e4m3 rows with their scales (-0 and +0 differ here).
fn fp8_byte_diffs(q: &[u8], s: &[f32], q2: &[u8], s2: &[f32]) -> usize {
    q.iter().zip(q2).filter(|(a, b)| a != b).count()
        + s.iter()
            .zip(s2)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count()
}

/// quantize_rows_fp8 byte for byte against the host on more rows than its blocks resident at
/// once (each block takes several, the next row's loads in flight) and on rows longer than its
/// registers hold (kept between the passes, or read again).
fn check_quantize_rows(c: &mut Ctx) -> R<()> {
    for (rows, k) in [(2500usize, 4096usize), (700, 14336), (3, 40000), (2, 70016)] {
        let x = bf(&(0..rows * k)
            .map(|i| c.rng.sym() * if i % 61 == 0 { 40.0 } else { 1.0 })
            .collect::<Vec<_>>());
        let (dx, dq, ds) = (
            c.up(&x)?,
            c.up(&vec![0u8; rows * k])?,
            c.up(&vec![0f32; rows])?,
        );
        // SAFETY: rows x k values, bytes and scales as allocated.
        unsafe {
            c.k.quantize_rows_fp8(&c.s, c.p(&dq), c.p(&ds), c.p(&dx), rows, k)?
        };
        c.s.synchronize()?;
        let (gq, gs) = (c.s.clone_dtoh(&dq)?, c.s.clone_dtoh(&ds)?);
        let (wq, ws) = quantize_ref(&x, k);
        let differ = fp8_byte_diffs(&gq, &gs, &wq, &ws);
        c.record(
            &format!("quantize_rows_fp8 {rows}x{k} vs host ({differ} differ)"),
            differ as f64,
            0.0,
        );
    }
    Ok(())
}

/// silu_mul_quant_fp8 against silu_mul_bf16 + quantize_rows_fp8 on gates at the ends of the
/// SiLU's range (where the exponential overflows or vanishes, huge, tiny, zeros of both signs)
/// mixed into ordinary ones: bytes and scales identical.
fn check_silu_quant_edges(c: &mut Ctx) -> R<()> {
    let (t, inter) = (16usize, 4096usize);
    let edge = [
        -120.0f32, -45.0, -44.0, 1e-36, -1e-38, 0.0, -0.0, 3e30, 88.0, -88.0, 1e-30,
    ];
    let gu = bf(&(0..t * 2 * inter)
        .map(|i| {
            let v = 6.0 * c.rng.sym();
            // every 8-value vector of the first rows has one edge gate; the rest ordinary
            if (i / inter).is_multiple_of(2) && i / (2 * inter) < t / 2 && i % 8 == 3 {
                edge[(i / 8) % edge.len()]
            } else {
                v
            }
        })
        .collect::<Vec<_>>());
    let dgu = c.up(&gu)?;
    let (q_f, s_f) = (c.up(&vec![0u8; t * inter])?, c.up(&vec![0f32; t])?);
    let (q_u, s_u) = (c.up(&vec![0u8; t * inter])?, c.up(&vec![0f32; t])?);
    let act = c.poisoned(t * inter)?;
    // SAFETY: every buffer holds the shapes given.
    unsafe {
        c.k.silu_mul_quant_fp8(&c.s, c.p(&q_f), c.p(&s_f), c.p(&dgu), None, t, inter)?;
        c.k.silu_mul(&c.s, c.p(&act), c.p(&dgu), t, inter)?;
        c.k.quantize_rows_fp8(&c.s, c.p(&q_u), c.p(&s_u), c.p(&act), t, inter)?;
    }
    c.s.synchronize()?;
    let (qf, sf) = (c.s.clone_dtoh(&q_f)?, c.s.clone_dtoh(&s_f)?);
    let (qu, su) = (c.s.clone_dtoh(&q_u)?, c.s.clone_dtoh(&s_u)?);
    let differ = fp8_byte_diffs(&qf, &sf, &qu, &su);
    c.record(
        &format!("silu_mul_quant_fp8 {t}x{inter} edge gates vs unfused, bytes ({differ} differ)"),
        differ as f64,
        0.0,
    );
    Ok(())
}

/// The activations' quantization (a division by the row's scale through its reciprocal) against
/// the host's IEEE division, byte for byte, over every bf16 mantissa of a value against every
/// bf16 mantissa of its row's maximum, 14 binades below the maximum (the e4m3 range and the
/// values that round to zero), signed zeros, and row maxima at 2^0, 2^+-40 (through the
/// reciprocal) and 2^+-100 (the division kept). Through silu_mul_quant_fp8 with gates of 16,
/// whose SiLU rounds to 16, so its outputs are 16 times the up values, exactly.
fn check_act_quant_exhaustive(c: &mut Ctx) -> R<()> {
    let inter = 3600usize;
    let mut up: Vec<f32> = Vec::new();
    let mut rows = 0usize;
    for e in [0i32, 40, -40, 100, -100] {
        let p2 = |k: i32| 2f32.powi(e - k);
        for m in 0..128 {
            let a = (1.0 + m as f32 / 128.0) * p2(0);
            let mut row = vec![a, -a];
            for k in 1..=13 {
                for mm in 0..128 {
                    let v = (1.0 + mm as f32 / 128.0) * p2(k);
                    row.extend([v, -v]);
                }
            }
            for mm in 0..=m {
                let v = (1.0 + mm as f32 / 128.0) * p2(0);
                row.extend([v, -v]);
            }
            row.extend([
                0.0,
                -0.0,
                p2(20),
                -p2(30),
                p2(24) * 1.5,
                -p2(11) * 1.0078125,
            ]);
            row.resize(inter, if m % 2 == 0 { 0.0 } else { -0.0 });
            up.extend(row);
            rows += 1;
        }
    }
    let mut gu = Vec::with_capacity(rows * 2 * inter);
    for r in 0..rows {
        gu.extend(std::iter::repeat_n(16.0f32, inter));
        gu.extend_from_slice(&up[r * inter..(r + 1) * inter]);
    }
    let gu = bf(&gu);
    let dgu = c.up(&gu)?;
    let (dq, ds) = (c.up(&vec![0u8; rows * inter])?, c.up(&vec![0f32; rows])?);
    // SAFETY: every buffer holds the shapes given.
    unsafe {
        c.k.silu_mul_quant_fp8(&c.s, c.p(&dq), c.p(&ds), c.p(&dgu), None, rows, inter)?;
    }
    c.s.synchronize()?;
    let (gq, gs) = (c.s.clone_dtoh(&dq)?, c.s.clone_dtoh(&ds)?);
    let silu16 = rbf(16.0 / (1.0 + (-16.0f32).exp()));
    let act: Vec<f32> = (0..rows * inter)
        .map(|i| rbf(silu16 * gu[(i / inter) * 2 * inter + inter + i % inter].to_f32()))
        .collect();
    let (wq, ws) = quantize_ref(&bf(&act), inter);
    let differ = fp8_byte_diffs(&gq, &gs, &wq, &ws);
    c.record(
        &format!(
            "activation quantization, every bf16 pair, {rows}x{inter} vs host ({differ} differ)"
        ),
        differ as f64,
        0.0,
    );
    Ok(())
}

/// rope_kv_store_rescale (the FP8 qkv product's scales applied inside RoPE and the K/V store)
/// against fp8_rescale_bf16 + rope_kv_store on the same device, bit for bit (q in qkv, both
/// pools), the k and v parts of qkv left unscaled, and against the host (rel err <= 1e-2).
fn check_rope_rescale(c: &mut Ctx, kv: KvDtype) -> R<()> {
    let (t, nh, nkv, hd) = (37usize, 32usize, 8usize, 128usize);
    let w = (nh + 2 * nkv) * hd;
    let n_slots = 64;
    let d = bf(&(0..t * w).map(|_| 3000.0 * c.rng.sym()).collect::<Vec<_>>());
    let xs: Vec<f32> = (0..t).map(|_| 1e-2 * (1.0 + c.rng.f())).collect();
    let ws: Vec<f32> = (0..w).map(|_| 3e-2 * (1.0 + c.rng.f())).collect();
    let pos: Vec<i32> = (0..t).map(|_| c.rng.below(130000) as i32).collect();
    let slots: Vec<i32> = c.rng.perm(n_slots)[..t].iter().map(|&x| x as i32).collect();
    let inv = llama3_inv_freq(hd);
    let (dp, dsl, di, dxs, dws) = (
        c.up(&pos)?,
        c.up(&slots)?,
        c.up(&inv)?,
        c.up(&xs)?,
        c.up(&ws)?,
    );
    let scales = if kv == KvDtype::Bf16 {
        KvScales::ONE
    } else {
        KvScales { k: 0.02, v: 0.01 }
    };
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    }
    .with_scales(scales);
    let poison = vec![0xffu8; n_slots * nkv * hd * kv.bytes()];
    let (qkv_f, kc_f, vc_f) = (c.up(&d)?, c.up(&poison)?, c.up(&poison)?);
    let (qkv_u, kc_u, vc_u) = (c.up(&d)?, c.up(&poison)?, c.up(&poison)?);
    // SAFETY: shapes as allocated; slots < n_slots; ws 16-byte aligned (its own allocation).
    unsafe {
        c.k.rope_kv_store_rescale(
            &c.s,
            c.p(&qkv_f),
            c.p(&kc_f),
            c.p(&vc_f),
            c.p(&dp),
            c.p(&dsl),
            c.p(&di),
            t,
            shape,
            c.p(&dxs),
            c.p(&dws),
        )?;
        let q = c.p(&qkv_u);
        c.k.fp8_rescale(&c.s, q, q, c.p(&dxs), c.p(&dws), t, w, false)?;
        c.k.rope_kv_store(
            &c.s,
            q,
            c.p(&kc_u),
            c.p(&vc_u),
            c.p(&dp),
            c.p(&dsl),
            c.p(&di),
            t,
            shape,
        )?;
    }
    c.s.synchronize()?;
    let (gf, gu) = (c.s.clone_dtoh(&qkv_f)?, c.s.clone_dtoh(&qkv_u)?);
    let (kf, ku) = (c.s.clone_dtoh(&kc_f)?, c.s.clone_dtoh(&kc_u)?);
    let (vf, vu) = (c.s.clone_dtoh(&vc_f)?, c.s.clone_dtoh(&vc_u)?);
    let q_w = nh * hd;
    let mut differ = 0usize;
    for r in 0..t {
        let row = r * w;
        differ += (0..q_w)
            .filter(|&j| gf[row + j].to_bits() != gu[row + j].to_bits())
            .count();
        // k and v of qkv as they were: the unscaled product
        differ += (q_w..w)
            .filter(|&j| gf[row + j].to_bits() != d[row + j].to_bits())
            .count();
    }
    differ += kf.iter().zip(&ku).filter(|(a, b)| a != b).count();
    differ += vf.iter().zip(&vu).filter(|(a, b)| a != b).count();
    c.record(
        &format!(
            "rope_kv_store_rescale, {} pool, vs fp8_rescale_bf16 + rope_kv_store ({differ} differ)",
            kv_name(kv)
        ),
        differ as f64,
        0.0,
    );
    // host: the rescale as fp8_rescale_bf16 rounds it, then RoPE and the pool's rounding
    let scaled: Vec<f32> = (0..t * w)
        .map(|i| rbf(d[i].to_f32() * xs[i / w] * ws[i % w]))
        .collect();
    let (gk, gv) = (kv_decode(&kf, kv), kv_decode(&vf, kv));
    let pooled = |x: f32, sc: f32| kv_encode_scaled(&[x], kv, sc).1[0];
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let half = hd / 2;
    for r in 0..t {
        for head in 0..nh + nkv {
            for i in 0..half {
                let a = (pos[r] as f64 * inv[i] as f64) as f32;
                let (cs, sn) = (rbf(a.cos()), rbf(a.sin()));
                let x1 = scaled[r * w + head * hd + i];
                let x2 = scaled[r * w + head * hd + i + half];
                let o1 = rbf(rbf(x1 * cs) + rbf(-x2 * sn));
                let o2 = rbf(rbf(x2 * cs) + rbf(x1 * sn));
                if head < nh {
                    let (g1, g2) = (gf[r * w + head * hd + i], gf[r * w + head * hd + i + half]);
                    got.extend([g1.to_f32(), g2.to_f32()]);
                    want.extend([o1, o2]);
                } else {
                    let base = slots[r] as usize * nkv * hd + (head - nh) * hd;
                    got.extend([gk[base + i] * scales.k, gk[base + i + half] * scales.k]);
                    want.extend([pooled(o1, scales.k), pooled(o2, scales.k)]);
                }
            }
        }
        for j in 0..nkv * hd {
            got.push(gv[slots[r] as usize * nkv * hd + j] * scales.v);
            want.push(pooled(scaled[r * w + (nh + nkv) * hd + j], scales.v));
        }
    }
    c.record(
        &format!("rope_kv_store_rescale, {} pool, vs host", kv_name(kv)),
        rel_err(&got, &want),
        1e-2,
    );
    Ok(())
}
