//! Checks every kernel against a CPU reference on fresh random inputs (seeded from the clock,
//! printed), with outputs poisoned (NaN) before each launch. Needs a GPU. Exit code 1 on any
//! failure. Usage: `kernel-check` (prints one line per check and a summary table),
//! `kernel-check bench-gemv` (decode GEMV vs cuBLASLt vs copy bandwidth on Llama-3.1-8B shapes)
//! or `kernel-check bench-decode` (one batch-1 Llama-3.1-8B decode step in a CUDA graph, PDL on
//! and off, fused and separate norms, against the copy-bandwidth floor of its weights).
//! Launches use PDL unless `SGL_DISABLE_PDL=1`; the PDL check and bench-decode switch it
//! themselves.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream};
use half::bf16;
use sgl_kernels::{
    AttnShape, Dptr, Gemm, GemvEpilogue, GemvWorkspace, Kernels, KvDtype, LogitEdit, WeightRef,
    dptr, prefill_tiles,
};

type R<T> = Result<T, Box<dyn std::error::Error>>;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn sym(&mut self) -> f32 {
        2.0 * self.f() - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i + 1));
        }
        v
    }
}

fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}
fn unbf(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}
fn rbf(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// ‖a − b‖ / ‖b‖; NaN anywhere fails.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() {
            return f64::INFINITY;
        }
        num += ((x - y) as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

struct Ctx {
    s: Arc<CudaStream>,
    k: Kernels,
    gemm: Gemm,
    gemv_ws: GemvWorkspace,
    rng: Rng,
    results: Vec<(String, f64, f64, bool)>,
}

impl Ctx {
    fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> R<CudaSlice<T>> {
        Ok(self.s.clone_htod(v)?)
    }
    fn poisoned(&self, n: usize) -> R<CudaSlice<bf16>> {
        Ok(self.s.clone_htod(&vec![bf16::NAN; n])?)
    }
    fn down(&self, d: &CudaSlice<bf16>) -> R<Vec<f32>> {
        self.s.synchronize()?;
        Ok(unbf(&self.s.clone_dtoh(d)?))
    }
    fn p<T>(&self, d: &CudaSlice<T>) -> Dptr<T> {
        dptr(d, &self.s)
    }
    fn record(&mut self, name: &str, err: f64, tol: f64) {
        let ok = err <= tol;
        println!(
            "{} {name}: rel err {err:.2e} (tol {tol:.0e})",
            if ok { "PASS" } else { "FAIL" }
        );
        self.results.push((name.to_string(), err, tol, ok));
    }
}

fn check_embedding(c: &mut Ctx) -> R<()> {
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

fn check_rmsnorm(c: &mut Ctx) -> R<()> {
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

fn llama3_inv_freq(hd: usize) -> Vec<f32> {
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

fn check_rope(c: &mut Ctx, kv: KvDtype) -> R<()> {
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

fn check_silu(c: &mut Ctx) -> R<()> {
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

/// CPU attention of one query row over keys 0..=limit of a sequence's slots.
#[allow(clippy::too_many_arguments)]
fn attn_ref(
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

/// Random K and V pools of `kv` elements: the values they hold, and the pools on the device.
#[allow(clippy::type_complexity)]
fn random_cache(
    c: &mut Ctx,
    n_slots: usize,
    nkv: usize,
    hd: usize,
    kv: KvDtype,
) -> R<(Vec<f32>, Vec<f32>, CudaSlice<u8>, CudaSlice<u8>)> {
    let k: Vec<f32> = (0..n_slots * nkv * hd).map(|_| c.rng.sym() * 2.0).collect();
    let v: Vec<f32> = (0..n_slots * nkv * hd).map(|_| c.rng.sym()).collect();
    let ((kb, k), (vb, v)) = (kv_encode(&k, kv), kv_encode(&v, kv));
    let (dk, dv) = (c.up(&kb)?, c.up(&vb)?);
    Ok((k, v, dk, dv))
}

fn kv_name(kv: KvDtype) -> &'static str {
    match kv {
        KvDtype::Bf16 => "bf16",
        KvDtype::Fp8E4m3 => "fp8_e4m3",
        KvDtype::Fp8E5m2 => "fp8_e5m2",
    }
}

fn check_decode(c: &mut Ctx, hd: usize, nh: usize, nkv: usize, kv: KvDtype) -> R<()> {
    let lens = [1usize, 17, 300, 1029, 2500];
    let b = lens.len();
    let total: usize = lens.iter().sum();
    let n_slots = total + 100;
    let (k, v, dk, dv) = random_cache(c, n_slots, nkv, hd, kv)?;
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
    };
    let max_len = *lens.iter().max().unwrap_or(&1);
    for plan in [
        c.k.decode_plan(b, nkv, max_len),
        sgl_kernels::DecodeAttnPlan { splits: 1 },
        sgl_kernels::DecodeAttnPlan { splits: 7 },
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
            "decode_attn d{hd} {nh}/{nkv} heads, {} splits, {} pool",
            plan.splits,
            kv_name(kv)
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
fn check_decode_fused(
    c: &mut Ctx,
    hd: usize,
    nh: usize,
    nkv: usize,
    lens: &[usize],
    kv: KvDtype,
) -> R<()> {
    let b = lens.len();
    let total: usize = lens.iter().sum();
    let n_slots = total + 16;
    let row = (nh + 2 * nkv) * hd;
    let kv_row = nkv * hd;
    let (mut k, mut v, _, _) = random_cache(c, n_slots, nkv, hd, kv)?;
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
    };
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
        sgl_kernels::DecodeAttnPlan { splits: 1 },
        sgl_kernels::DecodeAttnPlan { splits: 3 },
        sgl_kernels::DecodeAttnPlan { splits: 7 },
        sgl_kernels::DecodeAttnPlan {
            splits: sgl_kernels::MAX_DECODE_SPLITS,
        },
    ] {
        splits.push(plan.splits);
        let parts = b * nh * plan.splits as usize;
        let po = c.s.alloc_zeros::<f32>(parts * hd)?;
        let pml = c.s.alloc_zeros::<f32>(parts * 2)?;
        // unfused: rope_kv_store, then decode_attn + merge
        let pool = |x: &[f32]| kv_encode(x, kv).0;
        let (dq1, dk1, dv1) = (c.up(&qkv)?, c.up(&pool(&k))?, c.up(&pool(&v))?);
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
        let (dq3, dk3, dv3) = (c.up(&qkv)?, c.up(&pool(&k))?, c.up(&pool(&v))?);
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
            "decode_attn_merged / decode_attn_rope d{hd} {nh}/{nkv} heads, {} pool, lens {lens:?}, splits {splits:?}: bits vs rope_kv_store + decode_attn + merge ({differ} of {compared} differ, {nonfinite} reference outputs not finite)",
            kv_name(kv)
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

fn check_prefill(c: &mut Ctx, hd: usize, nh: usize, nkv: usize, kv: KvDtype) -> R<()> {
    // (prefix already cached, new query tokens)
    let seqs = [(0usize, 1usize), (0, 70), (150, 200), (37, 64), (0, 513)];
    let total_kv: usize = seqs.iter().map(|(p, q)| p + q).sum();
    let n_slots = total_kv + 50;
    let (k, v, dk, dv) = random_cache(c, n_slots, nkv, hd, kv)?;
    let perm = c.rng.perm(n_slots);
    let (mut q_indptr, mut kv_indptr, mut prefix, mut idx) =
        (vec![0i32], vec![0i32], Vec::new(), Vec::new());
    let mut seq_slots = Vec::new();
    let mut t = 0;
    for &(p, q) in &seqs {
        let s: Vec<usize> = perm[idx.len()..idx.len() + p + q].to_vec();
        idx.extend(s.iter().map(|&x| x as i32));
        kv_indptr.push(idx.len() as i32);
        t += q;
        q_indptr.push(t as i32);
        prefix.push(p as i32);
        seq_slots.push(s);
    }
    let q_stride = (nh + 2 * nkv) * hd;
    let qkv: Vec<f32> = (0..t * q_stride).map(|_| rbf(c.rng.sym())).collect();
    let tiles = prefill_tiles(&seqs.iter().map(|s| s.1).collect::<Vec<_>>());
    let (dq, dt, dqi, dki, dix, dp) = (
        c.up(&bf(&qkv))?,
        c.up(&tiles)?,
        c.up(&q_indptr)?,
        c.up(&kv_indptr)?,
        c.up(&idx)?,
        c.up(&prefix)?,
    );
    let out = c.poisoned(t * nh * hd)?;
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    };
    // SAFETY: shapes as allocated.
    unsafe {
        c.k.prefill_attn(
            &c.s,
            c.p(&out),
            nh * hd,
            c.p(&dq),
            q_stride,
            c.p(&dk),
            c.p(&dv),
            c.p(&dt),
            tiles.len() / 2,
            c.p(&dqi),
            c.p(&dki),
            c.p(&dix),
            c.p(&dp),
            shape,
        )?
    };
    let got = c.down(&out)?;
    let mut want = Vec::new();
    let mut row = 0;
    for (si, &(p, q)) in seqs.iter().enumerate() {
        for i in 0..q {
            for h in 0..nh {
                let qr = &qkv[row * q_stride + h * hd..][..hd];
                want.extend(attn_ref(
                    qr,
                    &k,
                    &v,
                    &seq_slots[si],
                    h / (nh / nkv),
                    nkv,
                    hd,
                    p + i,
                ));
            }
            row += 1;
        }
    }
    c.record(
        &format!(
            "prefill_attn d{hd} {nh}/{nkv} heads, cached prefixes, {} pool",
            kv_name(kv)
        ),
        rel_err(&got, &want),
        1e-2,
    );
    Ok(())
}

fn check_gemm(c: &mut Ctx) -> R<()> {
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
fn epilogue_ref(acc: &[f64], y0: &[bf16], epi: GemvEpilogue, m: usize, n: usize) -> Vec<f32> {
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
fn matmul_ref(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
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
fn check_gemv(c: &mut Ctx) -> R<()> {
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

/// e4m3 (no infinities, 448 the largest) of `f`, rounded to nearest even and saturated: the
/// rounding `quantize_rows_fp8` writes out on the device.
fn f2e4m3(f: f32) -> u8 {
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

fn e4m3_value(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
    if e == 0 {
        s * m / 512.0
    } else {
        s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

/// e5m2 of `f`, rounded to nearest even and saturated to +-57344 (`f2e5m2` of kv.cuh).
fn f2e5m2(f: f32) -> u8 {
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

fn e5m2_value(b: u8) -> f64 {
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
fn kv_encode(vals: &[f32], kv: KvDtype) -> (Vec<u8>, Vec<f32>) {
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
fn kv_decode(bytes: &[u8], kv: KvDtype) -> Vec<f32> {
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
fn quantize_ref(x: &[bf16], k: usize) -> (Vec<u8>, Vec<f32>) {
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

fn dequantize_ref(q: &[u8], scales: &[f32], k: usize) -> Vec<f32> {
    q.chunks(k)
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&b| (e4m3_value(b) * s as f64) as f32))
        .collect()
}

/// Random weights as a checkpoint has them: most near zero, some large, a row of zeros.
fn fp8_test_weights(c: &mut Ctx, n: usize, k: usize) -> Vec<bf16> {
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
fn check_fp8(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    // every bf16 that lands in each e4m3 bucket edge: a sweep across the whole range
    let sweep: Vec<bf16> = (0..4096)
        .map(|i| {
            bf16::from_f32((i as f32 - 2048.0) / 2048.0 * 470.0 * (1.0 + (i % 7) as f32 * 1e-3))
        })
        .chain([0.0, 1e-8, -2e-3, 1.9e-3, 448.0, -464.0, 465.0, 1e30].map(bf16::from_f32))
        .chain(std::iter::repeat_n(bf16::ZERO, 2052)) // a row of zeros: scale 1
        .collect();
    let rows = 3;
    let k = sweep.len() / rows;
    let (dx, dq, ds) = (
        c.up(&sweep)?,
        c.up(&vec![0u8; sweep.len()])?,
        c.up(&vec![0f32; rows])?,
    );
    // SAFETY: rows x k values, bytes and scales as allocated.
    unsafe {
        c.k.quantize_rows_fp8(&c.s, c.p(&dq), c.p(&ds), c.p(&dx), rows, k)?
    };
    c.s.synchronize()?;
    let (gq, gs) = (c.s.clone_dtoh(&dq)?, c.s.clone_dtoh(&ds)?);
    let (wq, ws) = quantize_ref(&sweep, k);
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
    c.record("dequantize_rows_fp8 vs host", rel_err(&got, &want), 0.0);
    // quantization error itself: within e4m3's half step (2^-4 relative) of each large value
    let qerr = rel_err(&dequantize_ref(&wq, &ws, k), &unbf(&sweep));
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

/// CPU RMSNorm as `add_rmsnorm_bf16` rounds it: `bf16(g * bf16(x * inv))`, inv in f32.
fn rmsnorm_ref(x: &[bf16], g: &[bf16], m: usize, k: usize, eps: f32) -> Vec<f32> {
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
fn check_gemv_rmsnorm(c: &mut Ctx) -> R<()> {
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

/// In-place logit edits against the CPU on random logits (Llama-3's vocabulary): repetition
/// penalties both ways, additive terms, -inf masks, no-op entries and entries outside the
/// buffer (skipped). Every logit, edited or not, must match bit for bit.
fn check_logit_edits(c: &mut Ctx) -> R<()> {
    let (rows, vocab) = (6usize, 128256usize);
    let logits = bf(&(0..rows * vocab)
        .map(|_| 8.0 * c.rng.sym())
        .collect::<Vec<_>>());
    let mut edits = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while edits.len() < 3000 {
        let (row, token) = (c.rng.below(rows) as u32, c.rng.below(vocab) as u32);
        if !seen.insert((row, token)) {
            continue;
        }
        let rep = match c.rng.below(4) {
            0 | 1 => 1.0,
            2 => 1.0 + c.rng.f(),
            _ => 0.5 + 0.5 * c.rng.f(),
        };
        let add = match c.rng.below(5) {
            0 | 1 => 0.0,
            2 => f32::NEG_INFINITY,
            _ => 2.0 * c.rng.sym(),
        };
        edits.push(LogitEdit {
            row,
            token,
            rep,
            add,
        });
    }
    // outside the buffer: skipped (a NaN would show if one were applied)
    for (row, token) in [(rows as u32, 0u32), (0, vocab as u32), (u32::MAX, u32::MAX)] {
        edits.push(LogitEdit {
            row,
            token,
            rep: 2.0,
            add: f32::NAN,
        });
    }
    let mut want = logits.clone();
    for e in &edits {
        if e.row as usize >= rows || e.token as usize >= vocab {
            continue;
        }
        let i = e.row as usize * vocab + e.token as usize;
        let mut l = want[i].to_f32();
        if e.rep != 1.0 {
            l = if l > 0.0 { l / e.rep } else { l * e.rep };
        }
        want[i] = bf16::from_f32(l + e.add);
    }
    let (dl, de) = (c.up(&logits)?, c.up(&edits)?);
    // SAFETY: shapes as allocated.
    unsafe {
        c.k.logit_edits(&c.s, c.p(&dl), rows, vocab, c.p(&de), edits.len())?
    };
    c.s.synchronize()?;
    let got = c.s.clone_dtoh(&dl)?;
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    c.record(
        &format!(
            "logit_edits ({} edits over {rows} x {vocab}; {differ} logits differ)",
            edits.len()
        ),
        differ as f64 / want.len() as f64,
        0.0,
    );
    Ok(())
}

/// Device-side token copy: scattered destinations (the rest keep their poison), repeated
/// sources.
fn check_copy_tokens(c: &mut Ctx) -> R<()> {
    let (n_dst, n_src, n) = (300usize, 77usize, 200usize);
    let src: Vec<i32> = (0..n_src).map(|_| c.rng.below(128256) as i32).collect();
    let dsts = c.rng.perm(n_dst);
    let mut pairs = Vec::new();
    let mut want = vec![-7i32; n_dst];
    for &d in &dsts[..n] {
        let sidx = c.rng.below(n_src);
        pairs.extend([d as i32, sidx as i32]);
        want[d] = src[sidx];
    }
    let (ds, dp) = (c.up(&src)?, c.up(&pairs)?);
    let dd = c.up(&vec![-7i32; n_dst])?;
    // SAFETY: shapes as allocated; pairs index inside dst and src.
    unsafe { c.k.copy_tokens(&c.s, c.p(&dd), c.p(&ds), c.p(&dp), n)? };
    c.s.synchronize()?;
    let got = c.s.clone_dtoh(&dd)?;
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    c.record(
        &format!("copy_tokens_i32 ({n} of {n_dst} slots; {differ} differ)"),
        differ as f64 / n_dst as f64,
        0.0,
    );
    Ok(())
}

/// Median time in µs of `f` over `iters` launches after a warm-up (CUDA events on `s`).
fn time_on(s: &CudaStream, iters: usize, mut f: impl FnMut(usize) -> R<()>) -> R<f64> {
    use cudarc::driver::sys::CUevent_flags;
    for i in 0..3 {
        f(i)?;
    }
    let ctx = s.context();
    let mut per = Vec::new();
    for rep in 0..5 {
        let e0 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let e1 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e0.record(s)?;
        for i in 0..iters {
            f(rep * iters + i)?;
        }
        e1.record(s)?;
        per.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / iters as f64);
    }
    per.sort_by(f64::total_cmp);
    Ok(per[per.len() / 2])
}

/// Median time in µs of `f` over `iters` launches on the check stream.
fn time_us(c: &Ctx, iters: usize, f: impl FnMut(usize) -> R<()>) -> R<f64> {
    time_on(&c.s, iters, f)
}

/// Device-to-device copy bandwidth (read + write) in bytes per second, over 1 GiB.
fn copy_bandwidth(c: &Ctx) -> R<f64> {
    let s = c.s.clone();
    let n_copy = 1usize << 30;
    let (src, dst) = (s.alloc_zeros::<u8>(n_copy)?, s.alloc_zeros::<u8>(n_copy)?);
    let (sa, da) = (dptr(&src, &s).addr(), dptr(&dst, &s).addr());
    let copy_us = time_us(c, 5, |_| {
        // SAFETY: both buffers hold n_copy bytes.
        unsafe { cudarc::driver::result::memcpy_dtod_async(da, sa, n_copy, s.cu_stream())? };
        Ok(())
    });
    drop((src, dst));
    let copy_bw = 2.0 * n_copy as f64 / (copy_us? * 1e-6);
    println!(
        "device copy bandwidth (read + write): {:.0} GB/s",
        copy_bw / 1e9
    );
    Ok(copy_bw)
}

/// GEMV vs cuBLASLt on the decode GEMMs of Llama-3.1-8B (weights cycled through enough copies
/// that none is still in L2), against device-to-device copy bandwidth (read + write).
/// The FP8-weight GEMV on the 8B decode shapes: µs, GB/s of FP8 weights, share of the copy
/// bandwidth; and the sum over one decode step's layer GEMMs.
fn bench_gemv_fp8(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let s = c.s.clone();
    let copy_bw = copy_bandwidth(c)?;
    let shapes = [
        ("qkv", 4096usize, 6144usize, Store),
        ("o", 4096, 4096, Store),
        ("gate_up", 4096, 28672, SwiGlu),
        ("down", 14336, 4096, Store),
    ];
    println!("\n| FP8 shape | k | n | tokens | plan | µs | GB/s | of copy |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut step = std::collections::BTreeMap::<usize, (f64, f64)>::new();
    for (name, k, n, epi) in shapes {
        let bytes = n * k;
        let copies = (256usize << 20).div_ceil(bytes).max(1);
        let host: Vec<u8> = (0..n * k).map(|i| (i % 251) as u8 & 0x77).collect();
        let scale = c.up(&vec![1e-3f32; n])?;
        let ws: Vec<CudaSlice<u8>> = (0..copies)
            .map(|_| s.clone_htod(&host))
            .collect::<Result<_, _>>()?;
        drop(host);
        let xh = bf(&(0..8 * k).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let x = c.up(&xh)?;
        let y = s.alloc_zeros::<bf16>(8 * n)?;
        let iters = (4usize << 30).div_ceil(bytes).clamp(10, 400);
        for m in [1usize, 8] {
            let plan = c.k.gemv_plan(k, n, epi);
            let us = time_us(c, iters, |i| {
                let w = WeightRef::Fp8 {
                    w: dptr(&ws[i % copies], &s),
                    scale: dptr(&scale, &s),
                };
                // SAFETY: shapes as allocated.
                unsafe {
                    c.k.gemv(&s, dptr(&y, &s), dptr(&x, &s), w, m, k, n, epi, &c.gemv_ws)?
                };
                Ok(())
            })?;
            let bw = bytes as f64 / (us * 1e-6);
            println!(
                "| {name} | {k} | {n} | {m} | {}r x {} x {} | {us:.1} | {:.0} | {:.1}% |",
                plan.rows_per_block,
                plan.tiles,
                plan.splits,
                bw / 1e9,
                100.0 * bw / copy_bw
            );
            let e = step.entry(m).or_default();
            e.0 += us * 32.0;
            e.1 += (bytes * 32) as f64;
        }
    }
    for (m, (us, bytes)) in step {
        let floor = bytes / copy_bw * 1e6;
        println!(
            "FP8 layer GEMVs of one decode step, {m} tokens: {:.3} ms, copy-rate floor {:.3} ms ({:.1}%)",
            us / 1e3,
            floor / 1e3,
            100.0 * floor / us
        );
    }
    Ok(())
}

fn bench_gemv(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let s = c.s.clone();
    let copy_bw = copy_bandwidth(c)?;
    // (name, k, n, epilogue, per decode step: 32 layers or once)
    let shapes = [
        ("qkv", 4096usize, 6144usize, Store, 32usize),
        ("o", 4096, 4096, Store, 32),
        ("gate_up", 4096, 28672, SwiGlu, 32),
        ("down", 14336, 4096, Store, 32),
        ("lm_head", 4096, 128256, Store, 1),
    ];
    println!(
        "\n| shape | k | n | tokens | plan | GEMV µs | GEMV GB/s | cuBLASLt µs | cuBLASLt GB/s | GEMV / copy | cuBLASLt / copy |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut step = std::collections::BTreeMap::<usize, (f64, f64, f64)>::new();
    for (name, k, n, epi, per_step) in shapes {
        let bytes = n * k * 2;
        let copies = (256usize << 20).div_ceil(bytes).max(1);
        // non-zero weights (a pattern: cheap to make for 1 GB)
        let host = bf(&(0..n * k)
            .map(|i| ((i % 251) as f32 - 125.0) * 1e-3)
            .collect::<Vec<_>>());
        let ws: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&host))
            .collect::<Result<_, _>>()?;
        drop(host);
        let xh = bf(&(0..8 * k).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let x = c.up(&xh)?;
        let y = s.alloc_zeros::<bf16>(8 * n)?;
        let iters = (4usize << 30).div_ceil(bytes).clamp(10, 200);
        for m in [1usize, 4, 8] {
            let plan = c.k.gemv_plan(k, n, epi);
            let gemv = time_us(c, iters, |i| {
                let w = dptr(&ws[i % copies], &s);
                // SAFETY: shapes as allocated.
                unsafe {
                    c.k.gemv(&s, dptr(&y, &s), dptr(&x, &s), w, m, k, n, epi, &c.gemv_ws)?
                };
                Ok(())
            })?;
            let blas = time_us(c, iters, |i| {
                let w = dptr(&ws[i % copies], &s);
                // SAFETY: shapes as allocated.
                unsafe {
                    c.gemm
                        .linear(dptr(&x, &s), w, dptr(&y, &s), m, k, n, false)?
                };
                Ok(())
            })?;
            let (gbw, bbw) = (bytes as f64 / (gemv * 1e-6), bytes as f64 / (blas * 1e-6));
            println!(
                "| {name} | {k} | {n} | {m} | {}r x {} x {} | {gemv:.1} | {:.0} | {blas:.1} | {:.0} | {:.1}% | {:.1}% |",
                plan.rows_per_block,
                plan.tiles,
                plan.splits,
                gbw / 1e9,
                bbw / 1e9,
                100.0 * gbw / copy_bw,
                100.0 * bbw / copy_bw
            );
            let e = step.entry(m).or_default();
            e.0 += gemv * per_step as f64;
            e.1 += blas * per_step as f64;
            e.2 += (bytes * per_step) as f64;
        }
    }
    println!(
        "\nGEMMs of one decode step (32 layers + LM head; cuBLASLt runs gate_up without the fused SwiGLU):"
    );
    println!(
        "| tokens | weight GB | GEMV ms | cuBLASLt ms | copy-rate floor ms | GEMV of floor | cuBLASLt of floor |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (m, (g, b, bytes)) in step {
        let floor = bytes / copy_bw * 1e3;
        println!(
            "| {m} | {:.2} | {:.3} | {:.3} | {floor:.3} | {:.1}% | {:.1}% |",
            bytes / 1e9,
            g / 1e3,
            b / 1e3,
            100.0 * floor / (g / 1e3),
            100.0 * floor / (b / 1e3)
        );
    }
    Ok(())
}

/// One batch-1 decode step of a Llama-3.1-8B-shaped model on the device, for the PDL check and
/// `bench-decode`: per layer the RMSNorm-fused qkv GEMV, rope_kv_store, decode attention over
/// `ctx` cached keys (+ merge), the o GEMV adding into the residual, the RMSNorm-fused gate_up
/// GEMV with SwiGLU, the down GEMV adding into the residual; then the final norm and the LM
/// head. `fused: false` runs each norm as its own `add_rmsnorm` before a plain GEMV instead.
struct DecodeModel {
    layers: usize,
    vocab: usize,
    shape: AttnShape,
    plan: sgl_kernels::DecodeAttnPlan,
    qkv_w: CudaSlice<bf16>,
    o_w: CudaSlice<bf16>,
    gate_up_w: CudaSlice<bf16>,
    down_w: CudaSlice<bf16>,
    lm_head: CudaSlice<bf16>,
    /// 2 per layer (input, post-attention), then the final norm; hidden each
    norms: CudaSlice<bf16>,
    k_cache: CudaSlice<bf16>,
    v_cache: CudaSlice<bf16>,
    /// the residual stream the step starts from, and the one it updates
    x0: CudaSlice<bf16>,
    x: CudaSlice<bf16>,
    normed: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
    logits: CudaSlice<bf16>,
    positions: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    inv_freq: CudaSlice<f32>,
    kv_indptr: CudaSlice<i32>,
    kv_indices: CudaSlice<i32>,
    partial_o: CudaSlice<f32>,
    partial_ml: CudaSlice<f32>,
    counters: CudaSlice<u32>,
    ws: GemvWorkspace,
}

/// How a decode step's attention runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum AttnForm {
    /// rope_kv_store, decode_attn, attn_merge_splits
    Separate,
    /// rope_kv_store, decode_attn_merged
    Merged,
    /// decode_attn_rope (RoPE, K/V store, attention and merge in one launch)
    Rope,
    /// left out (ablation)
    Skip,
}

/// Which parts of a decode step run: the full step, or an ablation of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Variant {
    /// norms fused into the GEMVs, else add_rmsnorm before a plain GEMV
    fused: bool,
    /// without fused norms: leave the add_rmsnorm launches out (ablation)
    norms: bool,
    attn: AttnForm,
    /// the layers' GEMVs
    gemvs: bool,
    lm_head: bool,
}

impl Variant {
    const FULL: Variant = Variant {
        fused: true,
        norms: true,
        attn: AttnForm::Separate,
        gemvs: true,
        lm_head: true,
    };
    fn with_attn(self, attn: AttnForm) -> Self {
        Variant { attn, ..self }
    }
    fn separate_norms(self) -> Self {
        Variant {
            fused: false,
            ..self
        }
    }
    fn without_norms(self) -> Self {
        Variant {
            norms: false,
            ..self
        }
    }
    fn without_lm_head(self) -> Self {
        Variant {
            lm_head: false,
            ..self
        }
    }
    fn without_layer_gemvs(self) -> Self {
        Variant {
            gemvs: false,
            ..self
        }
    }
}

const HIDDEN: usize = 4096;
const INTER: usize = 14336;
const EPS: f32 = 1e-5;

impl DecodeModel {
    /// Weights tiled from a random pattern of 8 Mi + 13 elements (so rows differ), norms near
    /// 1, a random KV cache of `ctx` tokens whose last slot the step writes.
    fn new(
        k: &Kernels,
        s: &Arc<CudaStream>,
        rng: &mut Rng,
        layers: usize,
        vocab: usize,
        ctx: usize,
    ) -> R<Self> {
        let shape = AttnShape {
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 128,
            kv: KvDtype::Bf16,
        };
        let qkv_n = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim;
        let kv_row = shape.n_kv_heads * shape.head_dim;
        let pattern = s.clone_htod(&bf(&(0..(8usize << 20) + 13)
            .map(|_| 0.03 * rng.sym())
            .collect::<Vec<_>>()))?;
        let filled = |n: usize| -> R<CudaSlice<bf16>> {
            let d = s.alloc_zeros::<bf16>(n)?;
            let (base, src) = (dptr(&d, s), dptr(&pattern, s));
            let mut off = 0;
            while off < n {
                let len = pattern.len().min(n - off);
                // SAFETY: both ranges lie inside their allocations.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        base.add(off).addr(),
                        src.addr(),
                        len * 2,
                        s.cu_stream(),
                    )?
                };
                off += len;
            }
            Ok(d)
        };
        let norms = s.clone_htod(&bf(&(0..(2 * layers + 1) * HIDDEN)
            .map(|_| 1.0 + 0.2 * rng.sym())
            .collect::<Vec<_>>()))?;
        let kv = |rng: &mut Rng| -> R<CudaSlice<bf16>> {
            Ok(s.clone_htod(&bf(&(0..layers * ctx * kv_row)
                .map(|_| rng.sym())
                .collect::<Vec<_>>()))?)
        };
        let (k_cache, v_cache) = (kv(rng)?, kv(rng)?);
        let plan = k.decode_plan(1, shape.n_kv_heads, ctx);
        let parts = shape.n_heads * plan.splits as usize;
        let x0_host = bf(&(0..HIDDEN).map(|_| rng.sym()).collect::<Vec<_>>());
        Ok(DecodeModel {
            layers,
            vocab,
            shape,
            plan,
            qkv_w: filled(layers * qkv_n * HIDDEN)?,
            o_w: filled(layers * HIDDEN * HIDDEN)?,
            gate_up_w: filled(layers * 2 * INTER * HIDDEN)?,
            down_w: filled(layers * HIDDEN * INTER)?,
            lm_head: filled(vocab * HIDDEN)?,
            norms,
            k_cache,
            v_cache,
            x: s.clone_htod(&x0_host)?,
            x0: s.clone_htod(&x0_host)?,
            normed: s.alloc_zeros::<bf16>(HIDDEN)?,
            qkv: s.alloc_zeros::<bf16>(qkv_n)?,
            attn: s.alloc_zeros::<bf16>(HIDDEN)?,
            act: s.alloc_zeros::<bf16>(INTER)?,
            logits: s.alloc_zeros::<bf16>(vocab)?,
            positions: s.clone_htod(&[ctx as i32 - 1])?,
            slots: s.clone_htod(&[ctx as i32 - 1])?,
            inv_freq: s.clone_htod(&llama3_inv_freq(shape.head_dim))?,
            kv_indptr: s.clone_htod(&[0, ctx as i32])?,
            kv_indices: s.clone_htod(&(0..ctx as i32).collect::<Vec<_>>())?,
            partial_o: s.alloc_zeros::<f32>(parts * shape.head_dim)?,
            partial_ml: s.alloc_zeros::<f32>(parts * 2)?,
            counters: s.alloc_zeros::<u32>(shape.n_kv_heads)?,
            ws: k.gemv_workspace(s)?,
        })
    }

    /// Weight bytes one step streams (the GEMVs' matrices).
    fn weight_bytes(&self) -> usize {
        2 * (self.qkv_w.len()
            + self.o_w.len()
            + self.gate_up_w.len()
            + self.down_w.len()
            + self.lm_head.len())
    }

    /// Reset the residual stream to the step's input (a device copy, outside any graph).
    fn reset(&self, s: &CudaStream) -> R<()> {
        // SAFETY: x and x0 both hold HIDDEN elements.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dptr(&self.x, s).addr(),
                dptr(&self.x0, s).addr(),
                HIDDEN * 2,
                s.cu_stream(),
            )?
        };
        Ok(())
    }

    /// `y = norm(x) · wᵀ`, fused or as add_rmsnorm then the GEMV (the norm left out where
    /// `v.norms` is off). Returns the launches made.
    ///
    /// # Safety
    /// y, w, norm and the scratch buffers cover the shapes (all of this model).
    #[allow(clippy::too_many_arguments)]
    unsafe fn norm_gemv(
        &self,
        k: &Kernels,
        s: &CudaStream,
        v: Variant,
        y: Dptr<bf16>,
        norm: Dptr<bf16>,
        w: Dptr<bf16>,
        n: usize,
        epi: GemvEpilogue,
    ) -> R<usize> {
        let x = dptr(&self.x, s);
        // SAFETY: as the caller guarantees.
        unsafe {
            if v.fused {
                k.gemv_rmsnorm(s, y, x, norm, EPS, w, 1, HIDDEN, n, epi, &self.ws)?;
                Ok(1)
            } else {
                let normed = dptr(&self.normed, s);
                if v.norms {
                    k.add_rmsnorm(s, normed, x, None, norm, 1, HIDDEN, EPS)?;
                }
                k.gemv(s, y, normed, w, 1, HIDDEN, n, epi, &self.ws)?;
                Ok(1 + usize::from(v.norms))
            }
        }
    }

    /// Launch one decode step (or the parts of it `v` keeps) on `s` (which may be capturing).
    /// Returns the launches made.
    fn step(&self, k: &Kernels, s: &CudaStream, v: Variant) -> R<usize> {
        use GemvEpilogue::*;
        let sh = self.shape;
        let qkv_n = (sh.n_heads + 2 * sh.n_kv_heads) * sh.head_dim;
        let kv_layer = self.k_cache.len() / self.layers;
        let q_dim = sh.n_heads * sh.head_dim;
        let (x, qkv, attn, act) = (
            dptr(&self.x, s),
            dptr(&self.qkv, s),
            dptr(&self.attn, s),
            dptr(&self.act, s),
        );
        let norms = dptr(&self.norms, s);
        let (positions, slots, inv_freq) = (
            dptr(&self.positions, s),
            dptr(&self.slots, s),
            dptr(&self.inv_freq, s),
        );
        let (ip, ix) = (dptr(&self.kv_indptr, s), dptr(&self.kv_indices, s));
        let (po, pml, cnt) = (
            dptr(&self.partial_o, s),
            dptr(&self.partial_ml, s),
            dptr(&self.counters, s),
        );
        let mut launches = 0;
        for l in 0..self.layers {
            let kc = dptr(&self.k_cache, s).add(l * kv_layer).cast::<u8>();
            let vc = dptr(&self.v_cache, s).add(l * kv_layer).cast::<u8>();
            let wq = dptr(&self.qkv_w, s).add(l * qkv_n * HIDDEN);
            let wo = dptr(&self.o_w, s).add(l * HIDDEN * q_dim);
            let wgu = dptr(&self.gate_up_w, s).add(l * 2 * INTER * HIDDEN);
            let wd = dptr(&self.down_w, s).add(l * HIDDEN * INTER);
            // SAFETY: every buffer was allocated for these shapes in `new`.
            unsafe {
                if v.gemvs {
                    let input = norms.add(2 * l * HIDDEN);
                    launches += self.norm_gemv(k, s, v, qkv, input, wq, qkv_n, Store)?;
                }
                if matches!(v.attn, AttnForm::Separate | AttnForm::Merged) {
                    k.rope_kv_store(s, qkv, kc, vc, positions, slots, inv_freq, 1, sh)?;
                    launches += 1;
                }
                match v.attn {
                    AttnForm::Separate => {
                        k.decode_attn(
                            s, self.plan, attn, q_dim, qkv, qkv_n, kc, vc, ip, ix, po, pml, 1, sh,
                        )?;
                        launches += 2;
                    }
                    AttnForm::Merged => {
                        k.decode_attn_merged(
                            s, self.plan, attn, q_dim, qkv, qkv_n, kc, vc, ip, ix, po, pml, cnt, 1,
                            sh,
                        )?;
                        launches += 1;
                    }
                    AttnForm::Rope => {
                        k.decode_attn_rope(
                            s, self.plan, attn, q_dim, qkv, kc, vc, positions, inv_freq, ip, ix,
                            po, pml, cnt, 1, sh,
                        )?;
                        launches += 1;
                    }
                    AttnForm::Skip => {}
                }
                if v.gemvs {
                    k.gemv(s, x, attn, wo, 1, q_dim, HIDDEN, Accumulate, &self.ws)?;
                    let post = norms.add((2 * l + 1) * HIDDEN);
                    launches += 1 + self.norm_gemv(k, s, v, act, post, wgu, 2 * INTER, SwiGlu)?;
                    k.gemv(s, x, act, wd, 1, INTER, HIDDEN, Accumulate, &self.ws)?;
                    launches += 1;
                }
            }
        }
        if v.lm_head {
            let logits = dptr(&self.logits, s);
            let final_norm = norms.add(2 * self.layers * HIDDEN);
            let lm = dptr(&self.lm_head, s);
            // SAFETY: as above.
            launches +=
                unsafe { self.norm_gemv(k, s, v, logits, final_norm, lm, self.vocab, Store)? };
        }
        Ok(launches)
    }

    /// The step captured into a CUDA graph on `s` (not the legacy default stream), and its
    /// launch count.
    fn capture(&self, k: &Kernels, s: &Arc<CudaStream>, v: Variant) -> R<(CudaGraph, usize)> {
        use cudarc::driver::sys;
        s.synchronize()?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let body = self.step(k, s, v);
        let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
        let launches = body?;
        Ok((graph?.ok_or("empty decode graph")?, launches))
    }

    /// The step's outputs: logits and the final residual stream, as bf16 bit patterns.
    fn outputs(&self, s: &Arc<CudaStream>) -> R<Vec<u16>> {
        s.synchronize()?;
        let mut v: Vec<u16> = s
            .clone_dtoh(&self.logits)?
            .iter()
            .map(|x| x.to_bits())
            .collect();
        v.extend(s.clone_dtoh(&self.x)?.iter().map(|x| x.to_bits()));
        Ok(v)
    }
}

/// Programmatic dependent launch against plain launches: a 3-layer decode step (Llama-3.1-8B
/// layer shapes, 32000-token head, 300 cached keys) run eagerly without PDL is the reference
/// (one with fused norms, one with separate ones); eager with PDL, and CUDA graphs with and
/// without PDL (PDL with the trigger at the end of each block's work and right after the
/// wait; each graph replayed 8 times, GEMVs prefetching their whole weight slices into L2)
/// must give bit-identical logits and residual stream, for every attention form (rope_kv_store
/// then decode_attn and its merge, or decode_attn_merged; or decode_attn_rope). A kernel that
/// touched its predecessor's data before `griddepcontrol.wait` would show here as a difference.
fn check_pdl_decode(c: &mut Ctx) -> R<()> {
    let s = c.s.context().new_stream()?;
    let m = DecodeModel::new(&c.k, &s, &mut c.rng, 3, 32000, 300)?;
    let pdl_default = c.k.pdl();
    let early_default = c.k.pdl_early_trigger();
    c.k.set_pdl(true);
    let pdl_note = if c.k.pdl() {
        "PDL supported"
    } else {
        "no PDL before sm_90: plain launches only"
    };
    let mut want = Vec::new();
    for v in [Variant::FULL, Variant::FULL.separate_norms()] {
        c.k.set_pdl(false);
        m.reset(&s)?;
        m.step(&c.k, &s, v)?;
        want.push(m.outputs(&s)?);
    }
    for v in [
        Variant::FULL,
        Variant::FULL.separate_norms(),
        Variant::FULL.with_attn(AttnForm::Merged),
        Variant::FULL.with_attn(AttnForm::Rope),
        Variant::FULL.separate_norms().with_attn(AttnForm::Rope),
    ] {
        let want = &want[usize::from(!v.fused)];
        let finite = want
            .iter()
            .filter(|&&b| bf16::from_bits(b).is_finite())
            .count();
        let mut differ = 0usize;
        let mut runs = 0usize;
        for (pdl, early) in [(true, false), (true, true), (false, false)] {
            c.k.set_pdl(pdl);
            c.k.set_pdl_early_trigger(early, &s)?;
            if pdl {
                m.reset(&s)?;
                m.step(&c.k, &s, v)?;
                differ += diff_bits(&m.outputs(&s)?, want);
                runs += 1;
            }
            // graphs prefetch whole weight slices (results must not depend on it)
            let pf_default = c.k.gemv_prefetch();
            c.k.set_gemv_prefetch(u32::MAX);
            let g = m.capture(&c.k, &s, v);
            c.k.set_gemv_prefetch(pf_default);
            let (g, _) = g?;
            for _ in 0..8 {
                m.reset(&s)?;
                g.launch()?;
                differ += diff_bits(&m.outputs(&s)?, want);
                runs += 1;
            }
        }
        c.record(
            &format!(
                "decode step, {} norms, attention {:?}: eager/graph x PDL on (end/early trigger)/off vs eager without PDL, separate attention ({runs} runs, {differ} values differ, {finite} of {} finite; {pdl_note})",
                if v.fused { "fused" } else { "separate" },
                v.attn,
                want.len()
            ),
            if finite == want.len() {
                differ as f64 / want.len() as f64
            } else {
                f64::INFINITY
            },
            0.0,
        );
    }
    c.k.set_pdl(pdl_default);
    c.k.set_pdl_early_trigger(early_default, &s)?;
    Ok(())
}

fn diff_bits(a: &[u16], b: &[u16]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// One batch-1 decode step of Llama-3.1-8B (32 layers, 128256-token head, 256 cached keys)
/// captured in a CUDA graph: fused or separate norms, PDL on or off (trigger at the end of each
/// block's work, or right after the wait), a sweep of the GEMV's L2 prefetch depth before its
/// wait, the three attention forms, and ablations (the same graph without attention, without
/// the LM head, without norms, attention alone) that show each kernel family's marginal cost in
/// the graph. Prints ms per step, launches, and the copy-bandwidth floor of the weight bytes
/// the variant streams over its step time.
fn bench_decode(c: &mut Ctx) -> R<()> {
    let copy_bw = copy_bandwidth(c)?;
    let s = c.s.context().new_stream()?;
    let t0 = std::time::Instant::now();
    let m = DecodeModel::new(&c.k, &s, &mut c.rng, 32, 128256, 256)?;
    s.synchronize()?;
    let bytes = m.weight_bytes() as f64;
    let lm_bytes = 2.0 * m.lm_head.len() as f64;
    let floor_ms = bytes / copy_bw * 1e3;
    println!(
        "decode model ready in {:.1}s: {:.2} GB of weights, copy-rate floor {floor_ms:.3} ms/step, attention {} splits",
        t0.elapsed().as_secs_f64(),
        bytes / 1e9,
        m.plan.splits
    );
    let (pdl_default, pf_default) = (c.k.pdl(), c.k.gemv_prefetch());
    let early_default = c.k.pdl_early_trigger();
    println!(
        "\n| step | norms | attention | PDL | GEMV L2 prefetch steps | launches | ms / step | of floor |\n|---|---|---|---|---|---|---|---|"
    );
    use AttnForm::*;
    let full = Variant::FULL;
    let no_attn = full.with_attn(Skip);
    let attn_only = Variant {
        gemvs: false,
        lm_head: false,
        ..full
    };
    // (name, variant, PDL, early trigger, prefetch steps)
    let mut configs = vec![
        ("full", full, true, false, pf_default),
        ("full", full, true, true, pf_default),
        ("full", full, false, false, pf_default),
    ];
    for pf in [0, 2, 4, u32::MAX] {
        configs.push(("full", full, true, false, pf));
    }
    for attn in [Merged, Rope] {
        configs.push(("full", full.with_attn(attn), true, false, pf_default));
        configs.push(("full", full.with_attn(attn), true, true, pf_default));
        configs.push(("full", full.with_attn(attn), false, false, pf_default));
    }
    configs.extend([
        ("full", full.separate_norms(), true, false, pf_default),
        ("full", full.separate_norms(), false, false, pf_default),
        (
            "no attention (GEMVs only)",
            no_attn,
            true,
            false,
            pf_default,
        ),
        ("no attention (GEMVs only)", no_attn, true, true, pf_default),
        (
            "no attention (GEMVs only)",
            no_attn,
            false,
            false,
            pf_default,
        ),
        (
            "GEMVs only, norms left out",
            no_attn.separate_norms().without_norms(),
            true,
            false,
            pf_default,
        ),
        (
            "no LM head",
            full.without_lm_head(),
            true,
            false,
            pf_default,
        ),
        (
            "no LM head",
            full.with_attn(Rope).without_lm_head(),
            true,
            false,
            pf_default,
        ),
        (
            "LM head only",
            no_attn.without_layer_gemvs(),
            true,
            false,
            pf_default,
        ),
        ("attention only", attn_only, true, false, pf_default),
        ("attention only", attn_only, false, false, pf_default),
        (
            "attention only",
            attn_only.with_attn(Merged),
            true,
            false,
            pf_default,
        ),
        (
            "attention only",
            attn_only.with_attn(Rope),
            true,
            false,
            pf_default,
        ),
        (
            "attention only",
            attn_only.with_attn(Rope),
            false,
            false,
            pf_default,
        ),
    ]);
    for (name, v, pdl, early, pf) in configs {
        c.k.set_pdl(pdl);
        c.k.set_pdl_early_trigger(early, &s)?;
        c.k.set_gemv_prefetch(pf);
        if pdl && !c.k.pdl() {
            println!("(PDL needs sm_90: skipped)");
            continue;
        }
        let (g, launches) = m.capture(&c.k, &s, v)?;
        let us = time_on(&s, 20, |_| Ok(g.launch()?))?;
        let var_bytes = if v.gemvs {
            bytes - if v.lm_head { 0.0 } else { lm_bytes }
        } else if v.lm_head {
            lm_bytes
        } else {
            0.0
        };
        let of_floor = if var_bytes > 0.0 {
            format!("{:.1}%", 100.0 * var_bytes / copy_bw / (us * 1e-6))
        } else {
            "-".to_string()
        };
        println!(
            "| {name} | {} | {:?} | {} | {} | {launches} | {:.3} | {of_floor} |",
            if v.fused {
                "fused"
            } else if v.norms {
                "add_rmsnorm"
            } else {
                "none"
            },
            v.attn,
            match (pdl, early) {
                (false, _) => "off",
                (true, false) => "on, end trigger",
                (true, true) => "on, early trigger",
            },
            if pf == u32::MAX {
                "all".to_string()
            } else {
                pf.to_string()
            },
            us / 1e3,
        );
    }
    c.k.set_pdl(pdl_default);
    c.k.set_pdl_early_trigger(early_default, &s)?;
    c.k.set_gemv_prefetch(pf_default);
    Ok(())
}

fn check_sampling(c: &mut Ctx) -> R<()> {
    let (rows, vocab) = (64, 32000);
    let logits: Vec<f32> = (0..rows * vocab).map(|_| rbf(c.rng.sym() * 8.0)).collect();
    let mut params = Vec::new();
    for r in 0..rows {
        let temp = if r % 4 == 0 { 0.0 } else { 0.5 + c.rng.f() };
        let top_p = if r % 3 == 0 {
            1.0
        } else {
            0.5 + 0.5 * c.rng.f()
        };
        let top_k = if r % 5 == 0 {
            0.0
        } else {
            (1 + c.rng.below(100)) as f32
        };
        let min_p = if r % 2 == 0 { 0.0 } else { 0.05 * c.rng.f() };
        params.extend([temp, top_p, top_k, min_p, c.rng.f()]);
    }
    let (dl, dp) = (c.up(&bf(&logits))?, c.up(&params)?);
    let out = c.s.clone_htod(&vec![-1i32; rows])?;
    // SAFETY: shapes as allocated.
    unsafe {
        c.k.sample(&c.s, c.p(&out), c.p(&dl), c.p(&dp), rows, vocab)?
    };
    c.s.synchronize()?;
    let got = c.s.clone_dtoh(&out)?;
    let (mut in_set, mut exact) = (0, 0);
    for r in 0..rows {
        let row = &logits[r * vocab..][..vocab];
        let p = &params[r * 5..][..5];
        let (temp, top_p, top_k, min_p, u) = (p[0], p[1], p[2] as usize, p[3], p[4]);
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let want_set: Vec<usize>;
        let want_tok: usize;
        if temp <= 0.0 {
            want_tok = row.iter().position(|&x| x == mx).unwrap_or(0);
            want_set = vec![want_tok];
        } else {
            let e: Vec<f64> = row
                .iter()
                .map(|&x| (((x - mx) / temp) as f64).exp())
                .collect();
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
            // tie-inclusive thresholds, like the kernel: every token tied with the cut stays
            let keep_k = if top_k > 0 && top_k < vocab {
                top_k
            } else {
                vocab
            };
            let t_k = e[order[keep_k - 1]];
            let mass_k: f64 = e.iter().filter(|&&x| x >= t_k).sum();
            let mut t_p = t_k;
            if top_p < 1.0 {
                let mut acc = 0.0;
                for &i in &order {
                    acc += e[i];
                    if acc >= top_p as f64 * mass_k {
                        t_p = e[i];
                        break;
                    }
                }
            }
            let tau = t_k.max(t_p).max(min_p as f64);
            let mut set: Vec<usize> = (0..vocab).filter(|&i| e[i] >= tau).collect();
            set.sort();
            let total: f64 = set.iter().map(|&i| e[i]).sum();
            let mut acc = 0.0;
            let mut tok = set[0];
            for &i in &set {
                acc += e[i];
                tok = i;
                if acc > u as f64 * total {
                    break;
                }
            }
            want_tok = tok;
            want_set = set;
        }
        let g = got[r] as usize;
        if want_set.binary_search(&g).is_ok() || (want_set.len() == 1 && want_set[0] == g) {
            in_set += 1;
        }
        if g == want_tok {
            exact += 1;
        }
    }
    let miss = 1.0 - in_set as f64 / rows as f64;
    c.record(
        "sample (kept-set membership, greedy/temp/top-k/top-p/min-p)",
        miss,
        0.02,
    );
    let miss_exact = 1.0 - exact as f64 / rows as f64;
    c.record("sample (same token as CPU inverse CDF)", miss_exact, 0.1);
    Ok(())
}

/// Every attention check on a pool of `kv` elements: the RoPE store, decode attention at
/// `decode` shapes (head_dim, heads, KV heads), the one-launch forms at `fused` shapes for each
/// batch of sequence lengths in `lens`, and prefill attention.
fn check_attention(
    c: &mut Ctx,
    kv: KvDtype,
    decode: &[(usize, usize, usize)],
    fused: &[(usize, usize, usize)],
    lens: &[&[usize]],
) -> R<()> {
    check_rope(c, kv)?;
    for &(hd, nh, nkv) in decode {
        check_decode(c, hd, nh, nkv, kv)?;
    }
    for &(hd, nh, nkv) in fused {
        for l in lens {
            check_decode_fused(c, hd, nh, nkv, l, kv)?;
        }
    }
    check_prefill(c, 128, 32, 8, kv)?;
    check_prefill(c, 64, 8, 4, kv)
}

fn main() -> R<()> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    println!("kernel-check seed {seed}");
    let ctx = CudaContext::new(0)?;
    // SAFETY: each stream's buffers are used on that stream only (the decode-step check and
    // bench make their own), so no cross-stream events are needed.
    unsafe { ctx.disable_event_tracking() };
    // a stream of its own, as the engine uses (not the legacy default stream)
    let s = ctx.new_stream()?;
    let t0 = std::time::Instant::now();
    let k = Kernels::load(&ctx)?;
    println!(
        "kernels compiled and loaded in {:.2}s on {}",
        t0.elapsed().as_secs_f64(),
        ctx.name()?
    );
    let gemm = Gemm::new(s.clone())?;
    let gemv_ws = k.gemv_workspace(&s)?;
    let mut c = Ctx {
        s,
        k,
        gemm,
        gemv_ws,
        rng: Rng(seed),
        results: Vec::new(),
    };
    if std::env::args().nth(1).as_deref() == Some("bench-gemv-fp8") {
        return bench_gemv_fp8(&mut c);
    }
    if std::env::args().nth(1).as_deref() == Some("bench-decode") {
        return bench_decode(&mut c);
    }
    let only_fp8 = std::env::args().nth(1).as_deref() == Some("fp8");
    let only_kv = std::env::args().nth(1).as_deref() == Some("kv");
    // FP8 KV pools: the store, the decode forms and prefill attention on e4m3 and e5m2 bytes
    // (`kv`: these alone)
    if !only_fp8 {
        for kv in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
            check_attention(
                &mut c,
                kv,
                &[(128, 32, 8), (64, 16, 2)],
                &[(128, 32, 8), (128, 64, 8), (64, 16, 4)],
                &[&[300], &[2, 17, 33, 300, 1029, 2500, 64, 129]],
            )?;
        }
    }
    let only_fp8 = only_fp8 || only_kv;
    if !only_fp8 {
        check_embedding(&mut c)?;
        check_rmsnorm(&mut c)?;
        check_silu(&mut c)?;
        check_attention(
            &mut c,
            KvDtype::Bf16,
            &[(128, 32, 8), (128, 8, 8), (64, 16, 2), (128, 16, 8)],
            &[
                (128, 32, 8),
                (128, 8, 8),
                (128, 16, 8),
                (128, 16, 2),
                (64, 8, 8),
                (64, 16, 8),
                (64, 16, 4),
                (64, 32, 4),
            ],
            &[
                &[300],
                &[1, 130, 257],
                &[2, 17, 33, 300, 1029, 2500, 64, 129],
            ],
        )?;
        if std::env::args().nth(1).as_deref() == Some("bench-gemv") {
            return bench_gemv(&mut c);
        }
        check_gemm(&mut c)?;
        check_gemv(&mut c)?;
        check_gemv_rmsnorm(&mut c)?;
    }
    if !only_kv {
        check_fp8(&mut c)?;
    }
    if !only_fp8 {
        check_logit_edits(&mut c)?;
        check_copy_tokens(&mut c)?;
        check_pdl_decode(&mut c)?;
        check_sampling(&mut c)?;
    }
    println!("\n| kernel check | rel err | tol | result |\n|---|---|---|---|");
    for (n, e, t, ok) in &c.results {
        println!(
            "| {n} | {e:.2e} | {t:.0e} | {} |",
            if *ok { "pass" } else { "FAIL" }
        );
    }
    let failed = c.results.iter().filter(|r| !r.3).count();
    println!("{} checks, {failed} failed", c.results.len());
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
