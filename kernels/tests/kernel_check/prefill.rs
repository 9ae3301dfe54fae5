//! Prefill attention against the host reference (bf16 and FP8 KV pools, KV-cache scales, cached
//! prefixes; whole and split key ranges) and the row invariance that deterministic inference
//! relies on.

use super::*;
use sgl_kernels::KvScales;

/// Partial slots the checks' work lists may use.
pub(crate) const CHECK_PARTS: usize = 512;

/// Partial buffers of a prefill launch: the slots its work list's split query tiles use (one
/// for a list without splits), for `nh` heads of `hd` dims.
pub(crate) struct PfParts {
    o: CudaSlice<f32>,
    ml: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

impl PfParts {
    pub(crate) fn for_list(c: &Ctx, tiles: &[i32], nh: usize, hd: usize) -> R<Self> {
        // a split entry names its tile's first slot and its run count: slots first .. first + n
        let slots = tiles
            .chunks(PREFILL_ENTRY_INTS)
            .filter(|e| e[2] >> 16 > 1)
            .map(|e| (e[3] + (e[2] >> 16)) as usize)
            .max()
            .unwrap_or(0)
            .max(1);
        let rows = slots * nh * 64;
        Ok(PfParts {
            o: c.s.alloc_zeros(rows * hd)?,
            ml: c.s.alloc_zeros(rows * 2)?,
            counters: c.s.alloc_zeros(slots * nh)?,
        })
    }

    pub(crate) fn get(&self, c: &Ctx) -> PrefillPartials {
        PrefillPartials {
            o: c.p(&self.o),
            ml: c.p(&self.ml),
            counters: c.p(&self.counters),
        }
    }

    /// Whether every arrival counter is back at zero.
    pub(crate) fn counters_zero(&self, c: &Ctx) -> R<bool> {
        c.s.synchronize()?;
        Ok(c.s.clone_dtoh(&self.counters)?.iter().all(|&x| x == 0))
    }
}

/// The work list of a launch over `seqs` (prefix, new queries): whole query tiles, or with
/// `split` the planner's list for a device of `split` slots (a huge count cuts every query
/// tile of more than two key tiles).
pub(crate) fn work_list(seqs: &[(usize, usize)], nh: usize, split: Option<usize>) -> Vec<i32> {
    match split {
        None => prefill_tiles(&seqs.iter().map(|s| s.1).collect::<Vec<_>>()),
        Some(slots) => {
            let pf: Vec<PrefillSeq> = seqs
                .iter()
                .map(|&(prefix, q_len)| PrefillSeq { q_len, prefix })
                .collect();
            prefill_work(&pf, nh, slots, CHECK_PARTS)
        }
    }
}

/// Slots that make the planner cut every query tile of more than two key tiles.
pub(crate) const SPLIT_ALL: usize = 1 << 24;

pub(crate) fn check_prefill(
    c: &mut Ctx,
    hd: usize,
    nh: usize,
    nkv: usize,
    kv: KvDtype,
    scales: KvScales,
) -> R<()> {
    // (prefix already cached, new query tokens)
    let seqs = [(0usize, 1usize), (0, 70), (150, 200), (37, 64), (0, 513)];
    let total_kv: usize = seqs.iter().map(|(p, q)| p + q).sum();
    let n_slots = total_kv + 50;
    let (k, v, dk, dv) = random_cache(c, n_slots, nkv, hd, kv, scales)?;
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
    let (dq, dqi, dki, dix, dp) = (
        c.up(&bf(&qkv))?,
        c.up(&q_indptr)?,
        c.up(&kv_indptr)?,
        c.up(&idx)?,
        c.up(&prefix)?,
    );
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    }
    .with_scales(scales);
    // whole query tiles; every query tile of more than two key tiles split, launched twice
    // (the second time on the counters the first left); over an FP8 pool with an even group
    // also two heads a block, on whole tiles in batch order and on the planner's list for that
    // form (one slot: nothing split, longest last)
    let mut lists: Vec<(Vec<i32>, bool)> = [None, Some(SPLIT_ALL), Some(SPLIT_ALL)]
        .map(|split| (work_list(&seqs, nh, split), false))
        .into();
    let paired = Kernels::prefill_pairs(kv, nh, nkv);
    if paired {
        let pf: Vec<PrefillSeq> = seqs
            .iter()
            .map(|&(prefix, q_len)| PrefillSeq { q_len, prefix })
            .collect();
        lists.push((lists[0].0.clone(), true));
        lists.push((prefill_work(&pf, nh / 2, 1, usize::MAX), true));
    }
    let parts = PfParts::for_list(c, &lists[1].0, nh, hd)?;
    let mut outs = Vec::new();
    for (tiles, pairs) in &lists {
        let form = if *pairs {
            PrefillForm::Paired
        } else {
            PrefillForm::OneHead(parts.get(c))
        };
        let dt = c.up(tiles)?;
        let out = c.poisoned(t * nh * hd)?;
        // SAFETY: shapes as allocated; the work list is this batch's (none split for the
        // paired form).
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
                tiles.len() / PREFILL_ENTRY_INTS,
                c.p(&dqi),
                c.p(&dki),
                c.p(&dix),
                c.p(&dp),
                form,
                shape,
            )?
        };
        outs.push(c.down(&out)?);
    }
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
    let name = format!(
        "prefill_attn d{hd} {nh}/{nkv} heads, cached prefixes, {} pool{}",
        kv_name(kv),
        scales_name(scales)
    );
    c.record(&name, rel_err(&outs[0], &want), 1e-2);
    c.record(
        &format!("{name}, key ranges split"),
        rel_err(&outs[1], &want),
        1e-2,
    );
    let differ = outs[1]
        .iter()
        .zip(&outs[2])
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    let zero = parts.counters_zero(c)?;
    c.record(
        &format!(
            "{name}, key ranges split: a second launch the same bits ({differ} differ), counters left at zero ({zero})"
        ),
        if zero { differ as f64 } else { 1.0 },
        0.0,
    );
    if paired {
        for (form, got) in ["whole tiles", "planned"].iter().zip(&outs[3..]) {
            let differ = got
                .iter()
                .zip(&outs[0])
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            c.record(
                &format!(
                    "{name}, two heads a block ({form}): bits vs one head a block ({differ} of {} differ)",
                    got.len()
                ),
                differ as f64,
                0.0,
            );
        }
    }
    Ok(())
}

/// One sequence of a prefill launch: `prefix` keys already cached, then one new token per row
/// of `q` (rows of the fused qkv width); `slots` holds the pool slots of all its keys.
struct PfSeq<'a> {
    prefix: usize,
    slots: &'a [usize],
    q: &'a [bf16],
}

/// The output bits (one row of nh * head_dim per new token, in batch order) of one
/// `prefill_attn` launch over `seqs`, with whole query tiles or (`split`) the work list
/// [`work_list`] plans.
fn prefill_bits(
    c: &Ctx,
    seqs: &[PfSeq],
    (dk, dv): (&CudaSlice<u8>, &CudaSlice<u8>),
    shape: AttnShape,
    split: Option<usize>,
) -> R<Vec<u16>> {
    let q_stride = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim;
    let (mut q_indptr, mut kv_indptr, mut prefix, mut idx, mut qkv) =
        (vec![0i32], vec![0i32], Vec::new(), Vec::new(), Vec::new());
    let mut lens = Vec::new();
    for s in seqs {
        let n = s.q.len() / q_stride;
        assert_eq!(s.slots.len(), s.prefix + n);
        lens.push((s.prefix, n));
        qkv.extend_from_slice(s.q);
        q_indptr.push(qkv.len() as i32 / q_stride as i32);
        idx.extend(s.slots.iter().map(|&x| x as i32));
        kv_indptr.push(idx.len() as i32);
        prefix.push(s.prefix as i32);
    }
    let t: usize = lens.iter().map(|l| l.1).sum();
    let tiles = work_list(&lens, shape.n_heads, split);
    let (dq, dqi, dki, dix, dp) = (
        c.up(&qkv)?,
        c.up(&q_indptr)?,
        c.up(&kv_indptr)?,
        c.up(&idx)?,
        c.up(&prefix)?,
    );
    let (k, v) = (c.p(dk), c.p(dv));
    let index = [c.p(&dqi), c.p(&dki), c.p(&dix), c.p(&dp)];
    // SAFETY: the buffers were made for this batch (slots within the pools).
    unsafe { launch_bits(c, (c.p(&dq), q_stride), (k, v), &tiles, index, t, shape) }
}

/// The output bits of one one-head-a-block `prefill_attn` launch of the work list `tiles` over
/// `t` query rows: queries from `q` (rows of its stride), K and V from `kv` through `index`
/// (q_indptr, kv_indptr, kv_indices, prefix_lens, on the device).
///
/// # Safety
/// As [`sgl_kernels::Kernels::prefill_attn`] for these buffers.
unsafe fn launch_bits(
    c: &Ctx,
    (q, q_stride): (Dptr<bf16>, usize),
    (k, v): (Dptr<u8>, Dptr<u8>),
    tiles: &[i32],
    [q_indptr, kv_indptr, kv_indices, prefix]: [Dptr<i32>; 4],
    t: usize,
    shape: AttnShape,
) -> R<Vec<u16>> {
    let parts = PfParts::for_list(c, tiles, shape.n_heads, shape.head_dim)?;
    let dt = c.up(tiles)?;
    let width = shape.n_heads * shape.head_dim;
    let out = c.poisoned(t * width)?;
    // SAFETY: the caller's guarantees; the partial buffers were made for `tiles`.
    unsafe {
        c.k.prefill_attn(
            &c.s,
            c.p(&out),
            width,
            q,
            q_stride,
            k,
            v,
            c.p(&dt),
            tiles.len() / PREFILL_ENTRY_INTS,
            q_indptr,
            kv_indptr,
            kv_indices,
            prefix,
            PrefillForm::OneHead(parts.get(c)),
            shape,
        )?
    };
    c.s.synchronize()?;
    Ok(c.s.clone_dtoh(&out)?.iter().map(|x| x.to_bits()).collect())
}

/// Long prompts at Llama-3.1-8B's attention shape (32/8 heads, head_dim 128) and the row
/// invariance that deterministic inference relies on, for a pool of `kv` elements. Prompts of
/// 1024 tokens (nothing cached), 2048 (the first 300 cached) and 127 (the first 37 cached),
/// in one batch: sampled rows against the host; every row's bits against the same sequence
/// launched alone; a prompt's rows after a cached prefix (300 and 1000 of 2048, 37 of 127:
/// not multiples of a tile) against the same rows of the whole prompt computed at once.
pub(crate) fn check_prefill_rows(c: &mut Ctx, kv: KvDtype) -> R<()> {
    let (hd, nh, nkv) = (128usize, 32usize, 8usize);
    let shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv,
    };
    let q_stride = (nh + 2 * nkv) * hd;
    // (whole prompt, cached prefix in the batch)
    let prompts = [(1024usize, 0usize), (2048, 300), (127, 37)];
    let total: usize = prompts.iter().map(|p| p.0).sum();
    let n_slots = total + 20;
    let (k, v, dk, dv) = random_cache(c, n_slots, nkv, hd, kv, KvScales::ONE)?;
    let pools = (&dk, &dv);
    let perm = c.rng.perm(n_slots);
    let mut slots = Vec::new();
    let mut qs = Vec::new();
    let mut at = 0;
    for &(len, _) in &prompts {
        slots.push(perm[at..at + len].to_vec());
        at += len;
        // a query row for every position (the K and V parts of the qkv rows stay zero)
        let mut q = vec![bf16::ZERO; len * q_stride];
        for r in 0..len {
            for x in &mut q[r * q_stride..r * q_stride + nh * hd] {
                *x = bf16::from_f32(c.rng.sym());
            }
        }
        qs.push(q);
    }
    let seq = |i: usize, prefix: usize| PfSeq {
        prefix,
        slots: &slots[i],
        q: &qs[i][prefix * q_stride..],
    };
    let width = nh * hd;
    let batch: Vec<PfSeq> = prompts
        .iter()
        .enumerate()
        .map(|(i, &(_, p))| seq(i, p))
        .collect();
    let got = prefill_bits(c, &batch, pools, shape, None)?;
    let got_split = prefill_bits(c, &batch, pools, shape, Some(SPLIT_ALL))?;
    let name = format!(
        "prefill_attn d{hd} {nh}/{nkv} heads, {} pool, prompts 1024, 300 + 1748, 37 + 90",
        kv_name(kv)
    );

    // sampled rows against the host, whole and split key ranges
    let (mut want, mut have, mut have_split) = (Vec::new(), Vec::new(), Vec::new());
    let mut row0 = 0;
    for (i, &(len, p)) in prompts.iter().enumerate() {
        for r in (p..len).filter(|&r| r % 11 == 0 || r + 1 == len || r == p) {
            let at = (row0 + r - p) * width;
            let row = |bits: &[u16]| -> Vec<f32> {
                bits[at..at + width]
                    .iter()
                    .map(|&b| bf16::from_bits(b).to_f32())
                    .collect()
            };
            have.extend(row(&got));
            have_split.extend(row(&got_split));
            for h in 0..nh {
                let qr: Vec<f32> = qs[i][r * q_stride + h * hd..][..hd]
                    .iter()
                    .map(|x| x.to_f32())
                    .collect();
                want.extend(attn_ref(&qr, &k, &v, &slots[i], h / (nh / nkv), nkv, hd, r));
            }
        }
        row0 += len - p;
    }
    c.record(
        &format!("{name}: sampled rows vs host"),
        rel_err(&have, &want),
        1e-2,
    );
    c.record(
        &format!("{name}: key ranges split, sampled rows vs host"),
        rel_err(&have_split, &want),
        1e-2,
    );

    // each sequence alone, and split at other cached prefixes, against the batch and the
    // whole prompt
    let (mut differ, mut compared) = (0usize, 0usize);
    let mut row0 = 0;
    for (i, &(len, p)) in prompts.iter().enumerate() {
        let alone = prefill_bits(c, &[seq(i, p)], pools, shape, None)?;
        let in_batch = &got[row0 * width..(row0 + len - p) * width];
        differ += diff_bits(&alone, in_batch);
        compared += alone.len();
        row0 += len - p;
    }
    c.record(
        &format!(
            "{name}: bits of each prompt alone vs in the batch ({differ} of {compared} differ)"
        ),
        differ as f64 / compared as f64,
        0.0,
    );
    let (mut differ, mut compared) = (0usize, 0usize);
    for (i, &(len, p)) in prompts.iter().enumerate() {
        let whole = prefill_bits(c, &[seq(i, 0)], pools, shape, None)?;
        let mut splits = vec![p.max(1)];
        if len > 1000 {
            splits.push(1000);
        }
        for split in splits {
            let rest = prefill_bits(c, &[seq(i, split)], pools, shape, None)?;
            differ += diff_bits(&rest, &whole[split * width..]);
            compared += rest.len();
        }
    }
    c.record(
        &format!(
            "{name}: bits after a cached prefix (300, 1000, 37 and 1 tokens) vs the whole prompt ({differ} of {compared} differ)"
        ),
        differ as f64 / compared as f64,
        0.0,
    );

    Ok(())
}

/// Prefill attention alone (`kernel-check prefill`): every case of [`check_attention`] and
/// [`check_attention_scaled`] on each pool type, and on the FP8 pools the fresh prompts' form
/// over the qkv rows ([`check_prefill_kv_rows`]).
pub(crate) fn check_prefill_all(c: &mut Ctx) -> R<()> {
    for kv in [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
        check_prefill(c, 128, 32, 8, kv, KvScales::ONE)?;
        check_prefill(c, 64, 8, 4, kv, KvScales::ONE)?;
        check_prefill_rows(c, kv)?;
        if kv != KvDtype::Bf16 {
            for (heads, rescale) in [((32, 8), false), ((32, 8), true), ((16, 4), true)] {
                check_prefill_kv_rows(c, kv, heads, rescale)?;
            }
            for scales in SCALES {
                check_prefill(c, 128, 32, 8, kv, scales)?;
                check_prefill(c, 64, 8, 4, kv, scales)?;
            }
        }
    }
    Ok(())
}

/// A fresh prompt's prefill over an FP8 pool with K and V read from its qkv rows (the engine's
/// form for fresh prompts): `rope_kv_store_with` keeping the rows leaves in them the q, k and
/// v that `rope_kv_store` (with `rescale`, `rope_kv_store_rescale`) gives a bf16 pool, and stores in
/// the FP8 pool the bytes the plain launch stores; prefill attention over the rows (token r at
/// slot r x (group + 2) of the buffer) gives the bits it gives over that bf16 pool. Prompts of
/// 1024, 300 and 77 tokens in one batch, whole and split key ranges.
pub(crate) fn check_prefill_kv_rows(
    c: &mut Ctx,
    kv: KvDtype,
    (nh, nkv): (usize, usize),
    rescale: bool,
) -> R<()> {
    let hd = 128usize;
    let lens = [1024usize, 300, 77];
    let t: usize = lens.iter().sum();
    let w = (nh + 2 * nkv) * hd;
    let kv_row = nkv * hd;
    let n_slots = t + 16;
    let qkv = bf(&(0..t * w).map(|_| 2.0 * c.rng.sym()).collect::<Vec<_>>());
    let pos: Vec<i32> = lens.iter().flat_map(|&n| 0..n as i32).collect();
    let slots: Vec<i32> = c.rng.perm(n_slots)[..t].iter().map(|&x| x as i32).collect();
    let xs: Vec<f32> = (0..t).map(|_| 1.0 + 0.5 * c.rng.sym()).collect();
    let ws: Vec<f32> = (0..w).map(|_| 1.0 + 0.5 * c.rng.sym()).collect();
    let (dp, ds, di, dxs, dws) = (
        c.up(&pos)?,
        c.up(&slots)?,
        c.up(&llama3_inv_freq(hd))?,
        c.up(&xs)?,
        c.up(&ws)?,
    );
    let scales = SCALES[0];
    let shape = |kv| {
        AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            kv,
        }
        .with_scales(scales)
    };
    // one RoPE launch on a copy of the rows into pools of `pool`'s type (NaN bytes before)
    type Run = (CudaSlice<bf16>, CudaSlice<u8>, CudaSlice<u8>);
    let store = |c: &mut Ctx, pool: KvDtype, rows: bool| -> R<Run> {
        let dq = c.up(&qkv)?;
        let poison = vec![0xffu8; n_slots * kv_row * pool.bytes()];
        let (kc, vc) = (c.up(&poison)?, c.up(&poison)?);
        let sc = rescale.then(|| (c.p(&dxs), c.p(&dws)));
        let (q, k, v) = (c.p(&dq), c.p(&kc), c.p(&vc));
        let (p, s, i) = (c.p(&dp), c.p(&ds), c.p(&di));
        // SAFETY: shapes as allocated; slots < n_slots.
        unsafe {
            c.k.rope_kv_store_with(&c.s, q, k, v, p, s, i, t, shape(pool), sc, rows)?
        };
        Ok((dq, kc, vc))
    };
    let (qa, ka, va) = store(c, KvDtype::Bf16, false)?;
    let (qb, kb, vb) = store(c, kv, true)?;
    let (_, kc8, vc8) = store(c, kv, false)?;
    c.s.synchronize()?;
    let name = format!(
        "prefill over the qkv rows d{hd} {nh}/{nkv} heads, {} pool{}, prompts 1024, 300, 77",
        kv_name(kv),
        if rescale { ", FP8 qkv product" } else { "" }
    );
    // the rows against the bf16 pool's values, the FP8 pool against the plain launch's
    let (ra, rb) = (c.s.clone_dtoh(&qa)?, c.s.clone_dtoh(&qb)?);
    // the bf16 pools' elements as bits
    let bits = |d: &CudaSlice<u8>| -> R<Vec<u16>> {
        Ok(c.s
            .clone_dtoh(d)?
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect())
    };
    let (pk, pv) = (bits(&ka)?, bits(&va)?);
    let (mut differ, mut compared) = (0usize, 0usize);
    for r in 0..t {
        let row = rb[r * w..(r + 1) * w].iter().map(|x| x.to_bits());
        let slot = slots[r] as usize * kv_row;
        let want = ra[r * w..r * w + nh * hd]
            .iter()
            .map(|x| x.to_bits())
            .chain(pk[slot..slot + kv_row].iter().copied())
            .chain(pv[slot..slot + kv_row].iter().copied());
        differ += row.zip(want).filter(|(a, b)| a != b).count();
        compared += w;
    }
    let bytes_differ = [(&kb, &kc8), (&vb, &vc8)]
        .iter()
        .map(|(a, b)| -> R<usize> {
            let (a, b) = (c.s.clone_dtoh(*a)?, c.s.clone_dtoh(*b)?);
            Ok(a.iter().zip(&b).filter(|(x, y)| x != y).count())
        })
        .sum::<R<usize>>()?;
    c.record(
        &format!(
            "{name}: rows vs the bf16 pool's q, k, v ({differ} of {compared} differ), FP8 pool vs rope_kv_store ({bytes_differ} bytes differ)"
        ),
        (differ + bytes_differ) as f64,
        0.0,
    );

    // attention over the rows against attention over the bf16 pool
    let seqs: Vec<(usize, usize)> = lens.iter().map(|&n| (0, n)).collect();
    let mut q_indptr = vec![0i32];
    for &n in &lens {
        q_indptr.push(q_indptr[q_indptr.len() - 1] + n as i32);
    }
    let per = (nh / nkv + 2) as i32;
    let row_slots: Vec<i32> = (0..t as i32).map(|r| r * per).collect();
    let (dqi, dpre, dslots, drows) = (
        c.up(&q_indptr)?,
        c.up(&vec![0i32; lens.len()])?,
        c.up(&slots)?,
        c.up(&row_slots)?,
    );
    let bf_shape = AttnShape {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        kv: KvDtype::Bf16,
    };
    for split in [None, Some(SPLIT_ALL)] {
        let tiles = work_list(&seqs, nh, split);
        let mut outs = Vec::new();
        for rows in [false, true] {
            let (q, kv, idx) = if rows {
                let q = c.p(&qb);
                let kv = (q.add(nh * hd).cast(), q.add((nh + nkv) * hd).cast());
                (q, kv, c.p(&drows))
            } else {
                (c.p(&qa), (c.p(&ka), c.p(&va)), c.p(&dslots))
            };
            let index = [c.p(&dqi), c.p(&dqi), idx, c.p(&dpre)];
            // SAFETY: shapes as allocated; every index is a row (slot) of its buffer (pool).
            outs.push(unsafe { launch_bits(c, (q, w), kv, &tiles, index, t, bf_shape)? });
        }
        let differ = diff_bits(&outs[0], &outs[1]);
        c.record(
            &format!(
                "{name}: attention{} bits vs over the bf16 pool ({differ} of {} differ)",
                if split.is_some() {
                    ", key ranges split"
                } else {
                    ""
                },
                outs[0].len()
            ),
            differ as f64,
            0.0,
        );
    }
    Ok(())
}
