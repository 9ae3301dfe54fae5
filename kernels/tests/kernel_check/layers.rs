//! Embedding, RMSNorm, RoPE with the K/V store, SiLU-and-mul.

use super::*;

pub(crate) fn check_embedding(c: &mut Ctx) -> R<()> {
    let (v, h, t) = (1000, 512, 37);
    let table: Vec<f32> = (0..v * h).map(|_| c.rng.sym()).collect();
    let ids: Vec<u32> = (0..t).map(|_| c.rng.below(v) as u32).collect();
    let (dt, di, out) = (c.up(&bf(&table))?, c.up(&ids)?, c.poisoned(t * h)?);
    // SAFETY: shapes as allocated.
    unsafe {
        c.k.embedding(&c.s, c.p(&out), c.p(&dt), c.p(&di), t, h, v)?
    };
    let got = c.down(&out)?;
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * h..][..h].iter().map(|&x| rbf(x)))
        .collect();
    c.record("embedding_gather", rel_err(&got, &want), 0.0);
    Ok(())
}

pub(crate) fn check_rmsnorm(c: &mut Ctx) -> R<()> {
    let (t, h, eps) = (9, 4096, 1e-5f32);
    for with_delta in [false, true] {
        let x = bf(&(0..t * h).map(|_| c.rng.sym() * 3.0).collect::<Vec<_>>());
        let d = bf(&(0..t * h).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let w = bf(&(0..h).map(|_| 1.0 + 0.5 * c.rng.sym()).collect::<Vec<_>>());
        let (dx, dd, dw, out) = (c.up(&x)?, c.up(&d)?, c.up(&w)?, c.poisoned(t * h)?);
        let delta = with_delta.then(|| c.p(&dd));
        // SAFETY: shapes as allocated.
        unsafe {
            c.k.add_rmsnorm(&c.s, c.p(&out), c.p(&dx), delta, c.p(&dw), t, h, eps)?
        };
        let got = c.down(&out)?;
        let got_res = c.down(&dx)?;
        let mut want = vec![0.0; t * h];
        let mut want_res = vec![0.0; t * h];
        for r in 0..t {
            let row: Vec<f32> = (0..h)
                .map(|j| {
                    let v = x[r * h + j].to_f32();
                    if with_delta {
                        rbf(v + d[r * h + j].to_f32())
                    } else {
                        v
                    }
                })
                .collect();
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / h as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for j in 0..h {
                want_res[r * h + j] = row[j];
                want[r * h + j] = rbf(w[j].to_f32() * rbf((row[j] as f64 * inv) as f32));
            }
        }
        let name = if with_delta {
            "add_rmsnorm (residual add)"
        } else {
            "rmsnorm"
        };
        let e = rel_err(&got, &want).max(rel_err(&got_res, &want_res));
        c.record(name, e, 1e-2);
    }
    Ok(())
}

pub(crate) fn llama3_inv_freq(hd: usize) -> Vec<f32> {
    let (theta, factor, lo, hi, old) = (500000.0f32, 8.0f32, 1.0f32, 4.0f32, 8192.0f32);
    (0..hd / 2)
        .map(|i| {
            let f = 1.0 / theta.powf(2.0 * i as f32 / hd as f32);
            let wl = 2.0 * std::f32::consts::PI / f;
            if wl > old / lo {
                f / factor
            } else if wl < old / hi {
                f
            } else {
                let s = (old / wl - lo) / (hi - lo);
                (1.0 - s) * f / factor + s * f
            }
        })
        .collect()
}

pub(crate) fn check_rope(c: &mut Ctx, kv: KvDtype) -> R<()> {
    let (t, nh, nkv, hd) = (11, 32, 8, 128);
    let w = (nh + 2 * nkv) * hd;
    let n_slots = 64;
    let qkv = bf(&(0..t * w).map(|_| c.rng.sym()).collect::<Vec<_>>());
    let pos: Vec<i32> = (0..t).map(|_| c.rng.below(9000) as i32).collect();
    let slots: Vec<i32> = c.rng.perm(n_slots)[..t].iter().map(|&x| x as i32).collect();
    let inv = llama3_inv_freq(hd);
    let (dq, dp, ds, di) = (c.up(&qkv)?, c.up(&pos)?, c.up(&slots)?, c.up(&inv)?);
    // every byte 0xff: NaN in each pool type
    let poison = vec![0xffu8; n_slots * nkv * hd * kv.bytes()];
    let (kc, vc) = (c.up(&poison)?, c.up(&poison)?);
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    };
    // SAFETY: shapes as allocated; slots < n_slots.
    unsafe {
        c.k.rope_kv_store(
            &c.s,
            c.p(&dq),
            c.p(&kc),
            c.p(&vc),
            c.p(&dp),
            c.p(&ds),
            c.p(&di),
            t,
            shape,
        )?
    };
    let gq = c.down(&dq)?;
    c.s.synchronize()?;
    let (gk, gv) = (
        kv_decode(&c.s.clone_dtoh(&kc)?, kv),
        kv_decode(&c.s.clone_dtoh(&vc)?, kv),
    );
    // the pool's rounding of a bf16 result
    let pooled = |x: f32| kv_encode(&[x], kv).1[0];
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let half = hd / 2;
    for r in 0..t {
        for head in 0..nh + nkv {
            for i in 0..half {
                let a = (pos[r] as f64 * inv[i] as f64) as f32;
                let (cs, sn) = (rbf(a.cos()), rbf(a.sin()));
                let x1 = qkv[r * w + head * hd + i].to_f32();
                let x2 = qkv[r * w + head * hd + i + half].to_f32();
                let o1 = rbf(rbf(x1 * cs) + rbf(-x2 * sn));
                let o2 = rbf(rbf(x2 * cs) + rbf(x1 * sn));
                if head < nh {
                    got.extend([gq[r * w + head * hd + i], gq[r * w + head * hd + i + half]]);
                    want.extend([o1, o2]);
                } else {
                    let base = slots[r] as usize * nkv * hd + (head - nh) * hd;
                    got.extend([gk[base + i], gk[base + i + half]]);
                    want.extend([pooled(o1), pooled(o2)]);
                }
            }
        }
        for j in 0..nkv * hd {
            got.push(gv[slots[r] as usize * nkv * hd + j]);
            want.push(pooled(qkv[r * w + (nh + nkv) * hd + j].to_f32()));
        }
    }
    c.record(
        &format!("rope_kv_store (llama3 scaling), {} pool", kv_name(kv)),
        rel_err(&got, &want),
        1e-2,
    );
    Ok(())
}

pub(crate) fn check_silu(c: &mut Ctx) -> R<()> {
    let (t, i) = (5, 14336);
    let gu = bf(&(0..t * 2 * i)
        .map(|_| 4.0 * c.rng.sym())
        .collect::<Vec<_>>());
    let (dg, out) = (c.up(&gu)?, c.poisoned(t * i)?);
    // SAFETY: shapes as allocated.
    unsafe { c.k.silu_mul(&c.s, c.p(&out), c.p(&dg), t, i)? };
    let got = c.down(&out)?;
    let want: Vec<f32> = (0..t * i)
        .map(|x| {
            let (r, j) = (x / i, x % i);
            let g = gu[r * 2 * i + j].to_f32();
            let u = gu[r * 2 * i + i + j].to_f32();
            rbf(rbf(g / (1.0 + (-g).exp())) * u)
        })
        .collect();
    c.record("silu_mul", rel_err(&got, &want), 1e-2);
    Ok(())
}
