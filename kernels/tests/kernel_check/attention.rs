//! Decode attention (every form, bf16 and FP8 KV pools) against a host reference, with KV-cache
//! scales of 1 and other (an FP8 pool stores k / k_scale and v / v_scale; attention reads them
//! times the scales; a bf16 pool ignores the scales); the host references and pools that the
//! prefill checks (prefill.rs) share.

use super::*;
use sgl_kernels::KvScales;

/// A decode attention plan of `splits` parts, on tensor cores or not.
fn attn_plan(splits: u32, tensor_cores: bool) -> sgl_kernels::DecodeAttnPlan {
    sgl_kernels::DecodeAttnPlan {
        splits,
        tensor_cores,
    }
}

/// `vals` as a KV pool of `kv` elements with the layer's `scale`: the bytes to upload (each
/// value rounded to bf16 first, as the kernels store bf16 results, then times `1 / scale` in
/// f32, then rounded to the pool's FP8 type) and the values attention reads from them (stored
/// value times `scale`). A bf16 pool ignores the scale.
pub(crate) fn kv_encode_scaled(vals: &[f32], kv: KvDtype, scale: f32) -> (Vec<u8>, Vec<f32>) {
    if kv == KvDtype::Bf16 {
        return kv_encode(vals, kv);
    }
    let inv = 1.0f32 / scale;
    let mut bytes = Vec::with_capacity(vals.len());
    let mut back = Vec::with_capacity(vals.len());
    for &x in vals {
        let stored = bf16::from_f32(x).to_f32() * inv;
        let (q, value) = match kv {
            KvDtype::Fp8E5m2 => {
                let q = f2e5m2(stored);
                (q, e5m2_value(q))
            }
            _ => {
                let q = f2e4m3(stored);
                (
                    q,
                    if q & 0x7f == 0x7f {
                        f64::NAN
                    } else {
                        e4m3_value(q)
                    },
                )
            }
        };
        bytes.push(q);
        back.push((value * scale as f64) as f32);
    }
    (bytes, back)
}

/// ", k_scale x v_scale y" for scales other than 1, for check names.
pub(crate) fn scales_name(scales: KvScales) -> String {
    if scales == KvScales::ONE {
        String::new()
    } else {
        format!(", k_scale {} v_scale {}", scales.k, scales.v)
    }
}

/// The scales used by the scaled checks: a small K scale (stored keys 20x the values) and a
/// large V scale, then the other way round.
pub(crate) const SCALES: [KvScales; 2] =
    [KvScales { k: 0.05, v: 3.0 }, KvScales { k: 3.0, v: 0.05 }];

/// Rotate-half RoPE of one head (`x`, head_dim values) at `pos` on the host, rounded as the
/// kernels round it (cos/sin to bf16, each product and the result to bf16).
fn rope_head(x: &[bf16], pos: i32, inv: &[f32]) -> Vec<f32> {
    let half = x.len() / 2;
    let mut out = vec![0.0f32; x.len()];
    for i in 0..half {
        let a = (pos as f64 * inv[i] as f64) as f32;
        let (cs, sn) = (rbf(a.cos()), rbf(a.sin()));
        let (x1, x2) = (x[i].to_f32(), x[i + half].to_f32());
        out[i] = rbf(rbf(x1 * cs) + rbf(-x2 * sn));
        out[i + half] = rbf(rbf(x2 * cs) + rbf(x1 * sn));
    }
    out
}

/// CPU attention of one query row over keys 0..=limit of a sequence's slots.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attn_ref(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    slots: &[usize],
    kvh: usize,
    nkv: usize,
    hd: usize,
    limit: usize,
) -> Vec<f32> {
    let scale = 1.0 / (hd as f64).sqrt();
    let sc: Vec<f64> = slots[..=limit]
        .iter()
        .map(|&s| {
            let k = &kc[(s * nkv + kvh) * hd..][..hd];
            q.iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
    let l: f64 = p.iter().sum();
    let mut o = vec![0.0f64; hd];
    for (j, &s) in slots[..=limit].iter().enumerate() {
        let v = &vc[(s * nkv + kvh) * hd..][..hd];
        for d in 0..hd {
            o[d] += p[j] * v[d] as f64;
        }
    }
    o.iter().map(|x| (x / l) as f32).collect()
}

/// Random K and V pools of `kv` elements stored with `scales`: the values attention reads from
/// them, and the pools on the device.
#[allow(clippy::type_complexity)]
pub(crate) fn random_cache(
    c: &mut Ctx,
    n_slots: usize,
    nkv: usize,
    hd: usize,
    kv: KvDtype,
    scales: KvScales,
) -> R<(Vec<f32>, Vec<f32>, CudaSlice<u8>, CudaSlice<u8>)> {
    let k: Vec<f32> = (0..n_slots * nkv * hd).map(|_| c.rng.sym() * 2.0).collect();
    let v: Vec<f32> = (0..n_slots * nkv * hd).map(|_| c.rng.sym()).collect();
    let ((kb, k), (vb, v)) = (
        kv_encode_scaled(&k, kv, scales.k),
        kv_encode_scaled(&v, kv, scales.v),
    );
    let (dk, dv) = (c.up(&kb)?, c.up(&vb)?);
    Ok((k, v, dk, dv))
}

pub(crate) fn kv_name(kv: KvDtype) -> &'static str {
    match kv {
        KvDtype::Bf16 => "bf16",
        KvDtype::Fp8E4m3 => "fp8_e4m3",
        KvDtype::Fp8E5m2 => "fp8_e5m2",
    }
}

pub(crate) fn check_decode(
    c: &mut Ctx,
    hd: usize,
    nh: usize,
    nkv: usize,
    kv: KvDtype,
    scales: KvScales,
) -> R<()> {
    let lens = [1usize, 17, 300, 1029, 2500];
    let b = lens.len();
    let total: usize = lens.iter().sum();
    let n_slots = total + 100;
    let (k, v, dk, dv) = random_cache(c, n_slots, nkv, hd, kv, scales)?;
    let perm = c.rng.perm(n_slots);
    let mut indptr = vec![0i32];
    let mut idx = Vec::new();
    let mut seq_slots = Vec::new();
    for &l in &lens {
        let s: Vec<usize> = perm[idx.len()..idx.len() + l].to_vec();
        idx.extend(s.iter().map(|&x| x as i32));
        indptr.push(idx.len() as i32);
        seq_slots.push(s);
    }
    let q_stride = (nh + 2 * nkv) * hd;
    let q: Vec<f32> = (0..b * q_stride).map(|_| rbf(c.rng.sym())).collect();
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    }
    .with_scales(scales);
    let max_len = *lens.iter().max().unwrap_or(&1);
    for plan in [
        c.k.decode_plan(b, nkv, max_len),
        attn_plan(1, false),
        attn_plan(7, false),
        attn_plan(1, true),
    ] {
        let rows = b * nh * plan.splits as usize;
        let po = c.s.alloc_zeros::<f32>(rows * hd)?;
        let pml = c.s.alloc_zeros::<f32>(rows * 2)?;
        let (dq, dip, dix) = (c.up(&bf(&q))?, c.up(&indptr)?, c.up(&idx)?);
        let out = c.poisoned(b * nh * hd)?;
        // SAFETY: shapes as allocated.
        unsafe {
            c.k.decode_attn(
                &c.s,
                plan,
                c.p(&out),
                nh * hd,
                c.p(&dq),
                q_stride,
                c.p(&dk),
                c.p(&dv),
                c.p(&dip),
                c.p(&dix),
                c.p(&po),
                c.p(&pml),
                b,
                shape,
            )?
        };
        let got = c.down(&out)?;
        let mut want = Vec::new();
        for (si, s) in seq_slots.iter().enumerate() {
            for h in 0..nh {
                let qr = &q[si * q_stride + h * hd..][..hd];
                want.extend(attn_ref(
                    qr,
                    &k,
                    &v,
                    s,
                    h / (nh / nkv),
                    nkv,
                    hd,
                    s.len() - 1,
                ));
            }
        }
        let name = format!(
            "decode_attn{} d{hd} {nh}/{nkv} heads, {} splits, {} pool{}",
            if plan.tensor_cores {
                " (tensor cores)"
            } else {
                ""
            },
            plan.splits,
            kv_name(kv),
            scales_name(scales)
        );
        c.record(&name, rel_err(&got, &want), 1e-2);
    }
    Ok(())
}

/// The one-launch decode attention forms against the unfused kernels, bit for bit: for a batch
/// of sequences of `lens` keys each (the last the new token), random raw qkv rows and
/// positions, and several split counts: `decode_attn_merged` on rotated q against
/// `decode_attn` + `attn_merge_splits`, and `decode_attn_rope` on the raw rows against
/// `rope_kv_store` + `decode_attn` + merge: outputs, the K and V pools (the new tokens' slots
/// NaN before), the qkv rows left unmodified, and the arrival counters back at zero; each
/// fused launch runs twice, into NaN-poisoned outputs.
pub(crate) fn check_decode_fused(
    c: &mut Ctx,
    hd: usize,
    nh: usize,
    nkv: usize,
    lens: &[usize],
    kv: KvDtype,
    scales: KvScales,
) -> R<()> {
    let b = lens.len();
    let total: usize = lens.iter().sum();
    let n_slots = total + 16;
    let row = (nh + 2 * nkv) * hd;
    let kv_row = nkv * hd;
    let (mut k, mut v, _, _) = random_cache(c, n_slots, nkv, hd, kv, scales)?;
    let perm = c.rng.perm(n_slots);
    let mut indptr = vec![0i32];
    let mut idx: Vec<i32> = Vec::new();
    let mut new_slots = Vec::new();
    for &l in lens {
        idx.extend(perm[idx.len()..idx.len() + l].iter().map(|&x| x as i32));
        indptr.push(idx.len() as i32);
        new_slots.push(*idx.last().unwrap_or(&0));
    }
    for &sl in &new_slots {
        for j in 0..kv_row {
            k[sl as usize * kv_row + j] = f32::NAN;
            v[sl as usize * kv_row + j] = f32::NAN;
        }
    }
    let qkv = bf(&(0..b * row).map(|_| c.rng.sym()).collect::<Vec<_>>());
    let positions: Vec<i32> = lens
        .iter()
        .map(|&l| (l - 1 + c.rng.below(5000)) as i32)
        .collect();
    let inv = llama3_inv_freq(hd);
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    }
    .with_scales(scales);
    let (dip, dix, dpos, dsl, dinv) = (
        c.up(&indptr)?,
        c.up(&idx)?,
        c.up(&positions)?,
        c.up(&new_slots)?,
        c.up(&inv)?,
    );
    let counters = c.s.alloc_zeros::<u32>(b * nkv)?;
    let max_len = *lens.iter().max().unwrap_or(&1);
    let (mut differ, mut compared, mut nonfinite) = (0usize, 0usize, 0usize);
    let mut splits = Vec::new();
    for plan in [
        c.k.decode_plan(b, nkv, max_len),
        attn_plan(1, false),
        attn_plan(3, false),
        attn_plan(7, false),
        sgl_kernels::DecodeAttnPlan {
            splits: sgl_kernels::MAX_DECODE_SPLITS,
            tensor_cores: false,
        },
    ] {
        splits.push(plan.splits);
        let parts = b * nh * plan.splits as usize;
        let po = c.s.alloc_zeros::<f32>(parts * hd)?;
        let pml = c.s.alloc_zeros::<f32>(parts * 2)?;
        // unfused: rope_kv_store, then decode_attn + merge (the pools hold the values as
        // stored: k and v are what attention reads, so they are stored divided by the scales)
        let pool = |x: &[f32], scale: f32| kv_encode_scaled(x, kv, scale).0;
        let (dq1, dk1, dv1) = (
            c.up(&qkv)?,
            c.up(&pool(&k, scales.k))?,
            c.up(&pool(&v, scales.v))?,
        );
        let out1 = c.poisoned(b * nh * hd)?;
        // SAFETY: shapes as allocated; new_slots inside the pool.
        unsafe {
            c.k.rope_kv_store(
                &c.s,
                c.p(&dq1),
                c.p(&dk1),
                c.p(&dv1),
                c.p(&dpos),
                c.p(&dsl),
                c.p(&dinv),
                b,
                shape,
            )?;
            c.k.decode_attn(
                &c.s,
                plan,
                c.p(&out1),
                nh * hd,
                c.p(&dq1),
                row,
                c.p(&dk1),
                c.p(&dv1),
                c.p(&dip),
                c.p(&dix),
                c.p(&po),
                c.p(&pml),
                b,
                shape,
            )?;
        }
        let want = c.down(&out1)?;
        nonfinite += want.iter().filter(|x| !x.is_finite()).count();
        if scales != KvScales::ONE && splits.len() == 1 {
            // with scales, the unfused result (which the fused forms must equal bit for bit)
            // against the host too: q and the new k rotated, the new k and v stored with the
            // scales and read back times them
            let host = host_decode_step(
                (nh, nkv, hd),
                &qkv,
                &k,
                &v,
                &indptr,
                &idx,
                &positions,
                &inv,
                kv,
                scales,
            );
            let err = rel_err(&want, &host);
            c.record(
                &format!(
                    "decode_attn_rope d{hd} {nh}/{nkv} heads, {} pool{}, lens {lens:?}: rope_kv_store + decode_attn vs host",
                    kv_name(kv),
                    scales_name(scales)
                ),
                err,
                1e-2,
            );
        }
        let bits = |d: &CudaSlice<bf16>| -> R<Vec<u16>> {
            c.s.synchronize()?;
            Ok(c.s.clone_dtoh(d)?.iter().map(|x| x.to_bits()).collect())
        };
        let bytes = |d: &CudaSlice<u8>| -> R<Vec<u16>> {
            c.s.synchronize()?;
            Ok(c.s.clone_dtoh(d)?.iter().map(|&x| x as u16).collect())
        };
        let (want_o, want_k, want_v) = (bits(&out1)?, bytes(&dk1)?, bytes(&dv1)?);
        for _ in 0..2 {
            // merged, on the rotated rows
            let out2 = c.poisoned(b * nh * hd)?;
            // SAFETY: as above; counters: b x nkv, zero.
            unsafe {
                c.k.decode_attn_merged(
                    &c.s,
                    plan,
                    c.p(&out2),
                    nh * hd,
                    c.p(&dq1),
                    row,
                    c.p(&dk1),
                    c.p(&dv1),
                    c.p(&dip),
                    c.p(&dix),
                    c.p(&po),
                    c.p(&pml),
                    c.p(&counters),
                    b,
                    shape,
                )?
            };
            differ += diff_bits(&bits(&out2)?, &want_o);
            compared += want_o.len();
        }
        // rope form on the raw rows and a pool whose new slots are still NaN
        let (dq3, dk3, dv3) = (
            c.up(&qkv)?,
            c.up(&pool(&k, scales.k))?,
            c.up(&pool(&v, scales.v))?,
        );
        for _ in 0..2 {
            let out3 = c.poisoned(b * nh * hd)?;
            // SAFETY: as above.
            unsafe {
                c.k.decode_attn_rope(
                    &c.s,
                    plan,
                    c.p(&out3),
                    nh * hd,
                    c.p(&dq3),
                    c.p(&dk3),
                    c.p(&dv3),
                    c.p(&dpos),
                    c.p(&dinv),
                    c.p(&dip),
                    c.p(&dix),
                    c.p(&po),
                    c.p(&pml),
                    c.p(&counters),
                    b,
                    shape,
                )?
            };
            differ += diff_bits(&bits(&out3)?, &want_o);
            differ += diff_bits(&bytes(&dk3)?, &want_k);
            differ += diff_bits(&bytes(&dv3)?, &want_v);
            compared += want_o.len() + want_k.len() + want_v.len();
        }
        let raw: Vec<u16> = qkv.iter().map(|x| x.to_bits()).collect();
        differ += diff_bits(&bits(&dq3)?, &raw);
        compared += raw.len();
        c.s.synchronize()?;
        let left = c.s.clone_dtoh(&counters)?;
        differ += left.iter().filter(|&&x| x != 0).count();
        compared += left.len();
    }
    c.record(
        &format!(
            "decode_attn_merged / decode_attn_rope d{hd} {nh}/{nkv} heads, {} pool{}, lens {lens:?}, splits {splits:?}: bits vs rope_kv_store + decode_attn + merge ({differ} of {compared} differ, {nonfinite} reference outputs not finite)",
            kv_name(kv),
            scales_name(scales)
        ),
        if nonfinite == 0 {
            differ as f64 / compared as f64
        } else {
            f64::INFINITY
        },
        0.0,
    );
    Ok(())
}

/// The host's decode step over raw qkv rows: each sequence's query rotated at its position,
/// its keys those of `k` / `v` (attention's values) with the new token's (the sequence's last
/// slot) rotated and stored with `scales`: every sequence's output rows.
#[allow(clippy::too_many_arguments)]
fn host_decode_step(
    (nh, nkv, hd): (usize, usize, usize),
    qkv: &[bf16],
    k: &[f32],
    v: &[f32],
    indptr: &[i32],
    idx: &[i32],
    positions: &[i32],
    inv: &[f32],
    kv: KvDtype,
    scales: KvScales,
) -> Vec<f32> {
    let row = (nh + 2 * nkv) * hd;
    let (mut kf, mut vf) = (k.to_vec(), v.to_vec());
    let mut out = Vec::new();
    for (b, &pos) in positions.iter().enumerate() {
        let r = &qkv[b * row..(b + 1) * row];
        let slots: Vec<usize> = idx[indptr[b] as usize..indptr[b + 1] as usize]
            .iter()
            .map(|&x| x as usize)
            .collect();
        let new = *slots.last().unwrap_or(&0);
        for h in 0..nkv {
            let kr = rope_head(&r[(nh + h) * hd..(nh + h + 1) * hd], pos, inv);
            let vr: Vec<f32> = r[(nh + nkv + h) * hd..(nh + nkv + h + 1) * hd]
                .iter()
                .map(|x| x.to_f32())
                .collect();
            let at = (new * nkv + h) * hd;
            kf[at..at + hd].copy_from_slice(&kv_encode_scaled(&kr, kv, scales.k).1);
            vf[at..at + hd].copy_from_slice(&kv_encode_scaled(&vr, kv, scales.v).1);
        }
        for h in 0..nh {
            let q = rope_head(&r[h * hd..(h + 1) * hd], pos, inv);
            let kvh = h / (nh / nkv);
            out.extend(attn_ref(
                &q,
                &kf,
                &vf,
                &slots,
                kvh,
                nkv,
                hd,
                slots.len() - 1,
            ));
        }
    }
    out
}

/// `rope_kv_store` with KV-cache `scales` against the host: q rotated in place, and the pool
/// holding the rotated k and v (each rounded to bf16) times `1 / scale`, rounded to the pool's
/// type, read back times the scale (a bf16 pool ignores the scales). Two records: the values
/// against the host's RoPE (whose cos/sin may round differently in the last place, as in
/// `check_rope`), and the pool's bytes bit for bit against the host's encoding of what the same
/// launch on a bf16 pool stored (the arithmetic of the scaled store alone).
pub(crate) fn check_rope_scaled(c: &mut Ctx, kv: KvDtype, scales: KvScales) -> R<()> {
    let (t, nh, nkv, hd) = (11, 32, 8, 128);
    let w = (nh + 2 * nkv) * hd;
    let kv_row = nkv * hd;
    let n_slots = 64;
    // keys and values up to 2: a stored key up to 40 with k_scale 0.05
    let qkv = bf(&(0..t * w).map(|_| 2.0 * c.rng.sym()).collect::<Vec<_>>());
    let pos: Vec<i32> = (0..t).map(|_| c.rng.below(9000) as i32).collect();
    let slots: Vec<i32> = c.rng.perm(n_slots)[..t].iter().map(|&x| x as i32).collect();
    let inv = llama3_inv_freq(hd);
    let (dp, ds, di) = (c.up(&pos)?, c.up(&slots)?, c.up(&inv)?);
    let shape = |kv| {
        AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            kv,
        }
        .with_scales(scales)
    };
    // the launch on `pool`'s type into a pool of NaN bytes: (rotated qkv, K pool, V pool bytes)
    let store = |c: &mut Ctx, pool: KvDtype| -> R<(Vec<f32>, Vec<u8>, Vec<u8>)> {
        let dq = c.up(&qkv)?;
        let poison = vec![0xffu8; n_slots * kv_row * pool.bytes()];
        let (kc, vc) = (c.up(&poison)?, c.up(&poison)?);
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
                shape(pool),
            )?
        };
        let gq = c.down(&dq)?;
        c.s.synchronize()?;
        Ok((gq, c.s.clone_dtoh(&kc)?, c.s.clone_dtoh(&vc)?))
    };
    let (gq, gk, gv) = store(c, kv)?;
    let read = |bytes: &[u8], scale: f32| -> Vec<f32> {
        let s = if kv == KvDtype::Bf16 { 1.0 } else { scale };
        kv_decode(bytes, kv).iter().map(|x| x * s).collect()
    };
    let (gk, gv, gk_bytes, gv_bytes) = (read(&gk, scales.k), read(&gv, scales.v), gk, gv);
    let pooled = |x: f32, scale: f32| kv_encode_scaled(&[x], kv, scale).1[0];
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for r in 0..t {
        for head in 0..nh + nkv {
            let at = r * w + head * hd;
            let rotated = rope_head(&qkv[at..at + hd], pos[r], &inv);
            if head < nh {
                got.extend(&gq[at..at + hd]);
                want.extend(rotated);
            } else {
                let base = slots[r] as usize * kv_row + (head - nh) * hd;
                got.extend(&gk[base..base + hd]);
                want.extend(rotated.iter().map(|&x| pooled(x, scales.k)));
            }
        }
        for j in 0..kv_row {
            got.push(gv[slots[r] as usize * kv_row + j]);
            want.push(pooled(qkv[r * w + (nh + nkv) * hd + j].to_f32(), scales.v));
        }
    }
    c.record(
        &format!(
            "rope_kv_store (llama3 scaling), {} pool{}",
            kv_name(kv),
            scales_name(scales)
        ),
        rel_err(&got, &want),
        1e-2,
    );
    if kv != KvDtype::Bf16 {
        // the same launch on a bf16 pool keeps the rotated k and v exactly (scales ignored)
        let (_, bk, bv) = store(c, KvDtype::Bf16)?;
        let (bk, bv) = (kv_decode(&bk, KvDtype::Bf16), kv_decode(&bv, KvDtype::Bf16));
        let (mut differ, mut compared) = (0usize, 0usize);
        for &slot in &slots {
            let row = slot as usize * kv_row..(slot as usize + 1) * kv_row;
            for (pool, bf16_pool, scale) in [(&gk_bytes, &bk, scales.k), (&gv_bytes, &bv, scales.v)]
            {
                let want = kv_encode_scaled(&bf16_pool[row.clone()], kv, scale).0;
                differ += want
                    .iter()
                    .zip(&pool[row.clone()])
                    .filter(|(a, b)| a != b)
                    .count();
                compared += want.len();
            }
        }
        c.record(
            &format!(
                "rope_kv_store {} pool{}: bytes vs the bf16 pool's values divided on the host ({differ} of {compared} differ)",
                kv_name(kv),
                scales_name(scales)
            ),
            differ as f64 / compared as f64,
            0.0,
        );
    }
    Ok(())
}

/// Every attention check on a pool of `kv` elements: the RoPE store, decode attention at
/// `decode` shapes (head_dim, heads, KV heads), the one-launch forms at `fused` shapes for each
/// batch of sequence lengths in `lens`, and prefill attention; then the same kernels with
/// KV-cache scales other than 1 (on a bf16 pool, which ignores them, fewer of them).
pub(crate) fn check_attention(
    c: &mut Ctx,
    kv: KvDtype,
    decode: &[(usize, usize, usize)],
    fused: &[(usize, usize, usize)],
    lens: &[&[usize]],
) -> R<()> {
    check_rope(c, kv)?;
    for &(hd, nh, nkv) in decode {
        check_decode(c, hd, nh, nkv, kv, KvScales::ONE)?;
    }
    for &(hd, nh, nkv) in fused {
        for l in lens {
            check_decode_fused(c, hd, nh, nkv, l, kv, KvScales::ONE)?;
        }
    }
    check_prefill(c, 128, 32, 8, kv, KvScales::ONE)?;
    check_prefill(c, 64, 8, 4, kv, KvScales::ONE)?;
    check_prefill_rows(c, kv)?;
    check_attention_scaled(c, kv)
}

/// The store, decode (every form) and prefill attention with each of [`SCALES`].
fn check_attention_scaled(c: &mut Ctx, kv: KvDtype) -> R<()> {
    for (i, scales) in SCALES.into_iter().enumerate() {
        check_rope_scaled(c, kv, scales)?;
        check_decode(c, 128, 32, 8, kv, scales)?;
        if kv == KvDtype::Bf16 {
            continue;
        }
        check_decode(c, 64, 16, 2, kv, scales)?;
        let (hd, nh, nkv) = if i == 0 { (128, 32, 8) } else { (64, 16, 4) };
        for l in [&[300usize][..], &[2, 17, 33, 300, 1029, 2500, 64, 129]] {
            check_decode_fused(c, hd, nh, nkv, l, kv, scales)?;
        }
        check_prefill(c, 128, 32, 8, kv, scales)?;
        check_prefill(c, 64, 8, 4, kv, scales)?;
    }
    Ok(())
}
