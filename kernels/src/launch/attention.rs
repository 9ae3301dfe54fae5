//! The attention launchers (`cu/decode_attn.cu`, `cu/decode_attn_tc.cu`, `cu/prefill_attn.cu`):
//! decode attention's plan and its forms (partials and merge, one launch, with RoPE and the K/V
//! store, on tensor cores), and causal prefill attention over the paged pool.

use cudarc::driver::CudaStream;
use half::bf16;

use super::{
    DECODE_TC_MIN_BATCH, DecodeAttnPlan, Kernels, KvDtype, LayerAttn, MAX_DECODE_SPLITS, arg,
    dim_index, group_index,
};
use crate::{Dptr, KernelError, Result};

impl Kernels {
    /// Splits for a decode batch: about two blocks per multiprocessor, at least 32 keys each.
    /// A batch of at least [`DECODE_TC_MIN_BATCH`] sequences that needs no split runs on the
    /// tensor-core kernel, which the FP32 kernel's per-key arithmetic cannot keep up with there.
    pub fn decode_plan(&self, batch: usize, n_kv_heads: usize, max_len: usize) -> DecodeAttnPlan {
        let blocks = (batch * n_kv_heads).max(1);
        let want = (2 * self.num_sms as usize).div_ceil(blocks);
        let by_len = max_len.div_ceil(32).max(1);
        let splits = want.min(by_len).clamp(1, MAX_DECODE_SPLITS as usize) as u32;
        DecodeAttnPlan {
            splits,
            tensor_cores: splits == 1 && batch >= DECODE_TC_MIN_BATCH,
        }
    }

    /// Decode attention (one query per sequence) over the paged pool, then the split merge.
    /// `kv_indptr[b]..kv_indptr[b+1]` index `kv_indices`, the slots of sequence b's keys.
    ///
    /// # Safety
    /// q rows of q_stride for batch sequences; out rows of out_stride; caches hold every slot;
    /// partial_o: batch x n_heads x splits x head_dim f32; partial_ml: batch x n_heads x splits x 2.
    pub unsafe fn decode_attn(
        &self,
        s: &CudaStream,
        plan: DecodeAttnPlan,
        out: Dptr<bf16>,
        out_stride: usize,
        q: Dptr<bf16>,
        q_stride: usize,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
        partial_o: Dptr<f32>,
        partial_ml: Dptr<f32>,
        batch: usize,
        shape: impl Into<LayerAttn>,
    ) -> Result<()> {
        if batch == 0 {
            return Ok(());
        }
        let (shape, scales, scale_log2) = shape.into().resolve()?;
        let group = shape.n_heads / shape.n_kv_heads;
        let (di, gi) = (dim_index(shape.head_dim)?, group_index(group)?);
        let kvs = (shape.n_kv_heads * shape.head_dim) as i32;
        if plan.tensor_cores {
            if plan.splits != 1 {
                return Err(KernelError::Unsupported(format!(
                    "tensor-core decode attention: {} splits (it takes one)",
                    plan.splits
                )));
            }
            let f = &self.decode_tc[shape.kv.index()][di][gi];
            let (o, os, qa, qs) = (out.addr(), out_stride as i32, q.addr(), q_stride as i32);
            let (kc, vc, ip, ix) = (
                k_cache.addr(),
                v_cache.addr(),
                kv_indptr.addr(),
                kv_indices.addr(),
            );
            let mut a = [
                arg(&o),
                arg(&os),
                arg(&qa),
                arg(&qs),
                arg(&kc),
                arg(&vc),
                arg(&kvs),
                arg(&ip),
                arg(&ix),
                arg(&scale_log2),
                arg(&scales.v),
            ];
            // heads along x: a sequence's heads run side by side (see decode_attn_tc.cu)
            if batch > 65535 {
                return Err(KernelError::Unsupported(format!(
                    "tensor-core decode attention of {batch} sequences (grid y holds 65535)"
                )));
            }
            let grid = (shape.n_kv_heads as u32, batch as u32, 1);
            // SAFETY: argument types match the kernel; the caller guarantees the extents.
            return unsafe { self.launch(s, f, grid, 128, &mut a) };
        }
        let f = &self.decode[shape.kv.index()][di][gi];
        let (po, pml, qa, kc, vc, ip, ix) = (
            partial_o.addr(),
            partial_ml.addr(),
            q.addr(),
            k_cache.addr(),
            v_cache.addr(),
            kv_indptr.addr(),
            kv_indices.addr(),
        );
        let qs = q_stride as i32;
        let nh = shape.n_heads as i32;
        let mut a = [
            arg(&po),
            arg(&pml),
            arg(&qa),
            arg(&qs),
            arg(&kc),
            arg(&vc),
            arg(&kvs),
            arg(&ip),
            arg(&ix),
            arg(&nh),
            arg(&scale_log2),
            arg(&scales.v),
        ];
        let grid = (batch as u32, shape.n_kv_heads as u32, plan.splits);
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, f, grid, 128, &mut a) }?;

        let (o, os) = (out.addr(), out_stride as i32);
        let ns = plan.splits as i32;
        let hd = shape.head_dim as i32;
        let mut a = [
            arg(&o),
            arg(&os),
            arg(&po),
            arg(&pml),
            arg(&nh),
            arg(&ns),
            arg(&hd),
        ];
        let grid = (batch as u32, shape.n_heads as u32, 1);
        // SAFETY: as above.
        unsafe { self.launch(s, &self.merge, grid, shape.head_dim as u32, &mut a) }
    }

    /// [`Kernels::decode_attn`] in one launch: the last split block of each (sequence, KV head)
    /// to finish merges the splits (in split order, so the output equals the two-launch form
    /// bit for bit whatever the timing). `counters`: `batch * n_kv_heads` u32, zero before the
    /// first launch; every launch leaves them at zero. Launches on one stream may share the
    /// counters and partial buffers (as the GEMV workspace).
    ///
    /// # Safety
    /// As [`Kernels::decode_attn`]; counters: batch x n_kv_heads, used by no other stream.
    pub unsafe fn decode_attn_merged(
        &self,
        s: &CudaStream,
        plan: DecodeAttnPlan,
        out: Dptr<bf16>,
        out_stride: usize,
        q: Dptr<bf16>,
        q_stride: usize,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
        partial_o: Dptr<f32>,
        partial_ml: Dptr<f32>,
        counters: Dptr<u32>,
        batch: usize,
        shape: impl Into<LayerAttn>,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees, passed on.
        unsafe {
            self.decode_attn_one_launch(
                s,
                plan,
                out,
                out_stride,
                q,
                q_stride,
                k_cache,
                v_cache,
                kv_indptr,
                kv_indices,
                None,
                partial_o,
                partial_ml,
                counters,
                batch,
                shape.into(),
            )
        }
    }

    /// A decode pass's RoPE, K/V store and attention in one launch: replaces
    /// [`Kernels::rope_kv_store`] followed by [`Kernels::decode_attn_merged`] (same results bit
    /// for bit, the pool included) when every sequence of the batch adds one token. `qkv`: the
    /// raw fused rows `[q heads | k heads | v heads]` x head_dim of the batch's new tokens
    /// (q and k not rotated; not modified). `positions[b]`: the new token's position;
    /// `kv_indptr`/`kv_indices` list each sequence's slots with the new token's slot last, and
    /// its k (rotated) and v are written there. `inv_freq`: head_dim / 2, as for
    /// [`Kernels::rope_kv_store`]. Counters as for [`Kernels::decode_attn_merged`].
    ///
    /// # Safety
    /// qkv: batch rows of (n_heads + 2 n_kv_heads) x head_dim; positions: batch; the rest as
    /// [`Kernels::decode_attn_merged`]; every sequence at least one key.
    pub unsafe fn decode_attn_rope(
        &self,
        s: &CudaStream,
        plan: DecodeAttnPlan,
        out: Dptr<bf16>,
        out_stride: usize,
        qkv: Dptr<bf16>,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        positions: Dptr<i32>,
        inv_freq: Dptr<f32>,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
        partial_o: Dptr<f32>,
        partial_ml: Dptr<f32>,
        counters: Dptr<u32>,
        batch: usize,
        shape: impl Into<LayerAttn>,
    ) -> Result<()> {
        let shape = shape.into();
        let g = shape.shape;
        let q_stride = (g.n_heads + 2 * g.n_kv_heads) * g.head_dim;
        // SAFETY: the caller's guarantees, passed on.
        unsafe {
            self.decode_attn_one_launch(
                s,
                plan,
                out,
                out_stride,
                qkv,
                q_stride,
                k_cache,
                v_cache,
                kv_indptr,
                kv_indices,
                Some((positions, inv_freq)),
                partial_o,
                partial_ml,
                counters,
                batch,
                shape,
            )
        }
    }

    /// # Safety
    /// As [`Kernels::decode_attn_rope`] with `rope`, else as [`Kernels::decode_attn_merged`].
    unsafe fn decode_attn_one_launch(
        &self,
        s: &CudaStream,
        plan: DecodeAttnPlan,
        out: Dptr<bf16>,
        out_stride: usize,
        q: Dptr<bf16>,
        q_stride: usize,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
        rope: Option<(Dptr<i32>, Dptr<f32>)>,
        partial_o: Dptr<f32>,
        partial_ml: Dptr<f32>,
        counters: Dptr<u32>,
        batch: usize,
        shape: LayerAttn,
    ) -> Result<()> {
        if batch == 0 {
            return Ok(());
        }
        let (shape, scales, scale_log2) = shape.resolve()?;
        if plan.tensor_cores {
            return Err(KernelError::Unsupported(
                "one-launch decode attention with a tensor-core plan (that kernel is decode_attn's)"
                    .into(),
            ));
        }
        if !(1..=MAX_DECODE_SPLITS).contains(&plan.splits) {
            return Err(KernelError::Unsupported(format!(
                "one-launch decode attention: {} splits (1 to {MAX_DECODE_SPLITS})",
                plan.splits
            )));
        }
        let group = shape.n_heads / shape.n_kv_heads;
        let (di, gi) = (dim_index(shape.head_dim)?, group_index(group)?);
        let (o, po, pml, ca, qa, kc, vc, ip, ix) = (
            out.addr(),
            partial_o.addr(),
            partial_ml.addr(),
            counters.addr(),
            q.addr(),
            k_cache.addr(),
            v_cache.addr(),
            kv_indptr.addr(),
            kv_indices.addr(),
        );
        let (os, qs) = (out_stride as i32, q_stride as i32);
        let kvs = (shape.n_kv_heads * shape.head_dim) as i32;
        let nh = shape.n_heads as i32;
        let grid = (batch as u32, shape.n_kv_heads as u32, plan.splits);
        match rope {
            None => {
                let mut a = [
                    arg(&o),
                    arg(&os),
                    arg(&po),
                    arg(&pml),
                    arg(&ca),
                    arg(&qa),
                    arg(&qs),
                    arg(&kc),
                    arg(&vc),
                    arg(&kvs),
                    arg(&ip),
                    arg(&ix),
                    arg(&nh),
                    arg(&scale_log2),
                    arg(&scales.v),
                ];
                let f = &self.decode_merged[shape.kv.index()][di][gi];
                // SAFETY: argument types match the kernel; the caller guarantees the extents.
                unsafe { self.launch(s, f, grid, 128, &mut a) }
            }
            Some((positions, inv_freq)) => {
                let (pa, fa) = (positions.addr(), inv_freq.addr());
                let (k_inv, v_inv) = (1.0 / scales.k, 1.0 / scales.v);
                let mut a = [
                    arg(&o),
                    arg(&os),
                    arg(&po),
                    arg(&pml),
                    arg(&ca),
                    arg(&qa),
                    arg(&qs),
                    arg(&kc),
                    arg(&vc),
                    arg(&kvs),
                    arg(&ip),
                    arg(&ix),
                    arg(&pa),
                    arg(&fa),
                    arg(&nh),
                    arg(&scale_log2),
                    arg(&scales.v),
                    arg(&k_inv),
                    arg(&v_inv),
                ];
                let f = &self.decode_rope[shape.kv.index()][di][gi];
                // SAFETY: as above.
                unsafe { self.launch(s, f, grid, 128, &mut a) }
            }
        }
    }

    /// Whether [`PrefillForm::Paired`] serves a pool of `kv` with these heads.
    pub fn prefill_pairs(kv: KvDtype, n_heads: usize, n_kv_heads: usize) -> bool {
        kv != KvDtype::Bf16 && n_kv_heads > 0 && (n_heads / n_kv_heads).is_multiple_of(2)
    }

    /// Causal prefill attention for a packed variable-length batch whose queries may start
    /// after a cached prefix. `tiles` holds the work list, [`PREFILL_ENTRY_INTS`] per block
    /// column (see [`prefill_tiles`] and [`prefill_work`]); q rows come from the fused qkv
    /// buffer (rows of q_stride). `form` picks the kernel ([`PrefillForm`]).
    ///
    /// # Safety
    /// Every index array matches the batch: q_indptr, kv_indptr: batch + 1; prefix_lens: batch;
    /// kv_indices: kv_indptr[batch]; tiles: n_tiles entries made for this batch's sequences
    /// (prefix + q_len keys each); out rows of out_stride for every token. One head a block:
    /// its partial buffers hold the partial slots the entries name (none for a list without
    /// splits), used by no other stream, counters at zero. Paired: no entry is split.
    pub unsafe fn prefill_attn(
        &self,
        s: &CudaStream,
        out: Dptr<bf16>,
        out_stride: usize,
        qkv: Dptr<bf16>,
        q_stride: usize,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        tiles: Dptr<i32>,
        n_tiles: usize,
        q_indptr: Dptr<i32>,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
        prefix_lens: Dptr<i32>,
        form: PrefillForm,
        shape: impl Into<LayerAttn>,
    ) -> Result<()> {
        if n_tiles == 0 {
            return Ok(());
        }
        let layer = shape.into();
        let sh = layer.shape;
        let d = dim_index(sh.head_dim)?;
        let (f, grid_y, threads, parts) = match form {
            PrefillForm::OneHead(parts) => {
                (&self.prefill[sh.kv.index()][d], sh.n_heads, 128, parts)
            }
            PrefillForm::Paired => {
                if !Self::prefill_pairs(sh.kv, sh.n_heads, sh.n_kv_heads) {
                    return Err(KernelError::Unsupported(format!(
                        "paired-head prefill attention needs an FP8 pool and an even number of \
                         query heads per KV head (pool {:?}, {} / {} heads)",
                        sh.kv, sh.n_heads, sh.n_kv_heads
                    )));
                }
                // an unsplit list never touches the partial buffers
                let none = PrefillPartials {
                    o: Dptr::null(),
                    ml: Dptr::null(),
                    counters: Dptr::null(),
                };
                (
                    &self.prefill_h2[sh.kv.index() - 1][d],
                    sh.n_heads / 2,
                    256,
                    none,
                )
            }
        };
        let (shape, scales, scale_log2) = layer.resolve()?;
        let (o, qa, kc, vc, t, qi, ki, kx, pl) = (
            out.addr(),
            qkv.addr(),
            k_cache.addr(),
            v_cache.addr(),
            tiles.addr(),
            q_indptr.addr(),
            kv_indptr.addr(),
            kv_indices.addr(),
            prefix_lens.addr(),
        );
        let (po, pml, pc) = (parts.o.addr(), parts.ml.addr(), parts.counters.addr());
        let (os, qs) = (out_stride as i32, q_stride as i32);
        let kvs = (shape.n_kv_heads * shape.head_dim) as i32;
        let group = (shape.n_heads / shape.n_kv_heads) as i32;
        let mut a = [
            arg(&o),
            arg(&os),
            arg(&qa),
            arg(&qs),
            arg(&kc),
            arg(&vc),
            arg(&kvs),
            arg(&t),
            arg(&qi),
            arg(&ki),
            arg(&kx),
            arg(&pl),
            arg(&group),
            arg(&scale_log2),
            arg(&scales.v),
            arg(&po),
            arg(&pml),
            arg(&pc),
        ];
        let grid = (n_tiles as u32, grid_y as u32, 1);
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, f, grid, threads, &mut a) }
    }
}

/// i32s per entry of prefill attention's work list: sequence, query offset, split + (splits
/// << 16), first partial slot of the query tile's splits.
pub const PREFILL_ENTRY_INTS: usize = 4;
/// Most runs one query tile's keys are cut into (`PF_MAX_SPLITS` in `cu/prefill_attn.cu`).
pub const PREFILL_MAX_SPLITS: usize = 16;
/// Fewest key tiles (of 64 keys) in a run of a split query tile: a split costs its partial
/// rows' round trip and the merge, about a tile's work.
const PREFILL_MIN_RUN: usize = 2;
const PREFILL_TILE: usize = 64;

/// Where the blocks of split query tiles leave their partial rows: slot p of head h is rows
/// (p * n_heads + h) * 64 .. + 64 of `o` (head_dim f32 each) and `ml` (2 f32 each); `counters`
/// holds n_heads per slot group (indexed by its first slot), at zero between launches.
#[derive(Clone, Copy, Debug)]
pub struct PrefillPartials {
    pub o: Dptr<f32>,
    pub ml: Dptr<f32>,
    pub counters: Dptr<u32>,
}

/// Which prefill attention kernel a launch runs.
#[derive(Clone, Copy, Debug)]
pub enum PrefillForm {
    /// One query head a block (`prefill_attn_d*`); split entries leave their partial rows in
    /// these buffers.
    OneHead(PrefillPartials),
    /// Two query heads of one KV group a block (the `_h2` entries), so an FP8 pool's K/V tiles
    /// are fetched and widened once for both: the same bits. For FP8 pools and groups of an
    /// even number of query heads ([`Kernels::prefill_pairs`]), and work lists without splits
    /// (made with half the heads and [`Kernels::prefill_paired_slots`]).
    Paired,
}

/// One sequence of a prefill launch: `q_len` new queries after `prefix` cached positions; its
/// keys are all `prefix + q_len` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillSeq {
    pub q_len: usize,
    pub prefix: usize,
}

/// One entry per 64 queries, none split, in batch order: the work list of a launch whose
/// results must not depend on the rest of the batch (deterministic inference).
pub fn prefill_tiles(q_lens: &[usize]) -> Vec<i32> {
    let mut t = Vec::new();
    for (i, &n) in q_lens.iter().enumerate() {
        for off in (0..n).step_by(PREFILL_TILE) {
            t.extend_from_slice(&[i as i32, off as i32, 1 << 16, 0]);
        }
    }
    t
}

/// The work list of a launch over `seqs` with `n_heads` query heads on a device that runs
/// `slots` blocks at once, using at most `max_parts` partial slots. A launch takes about as
/// long as the larger of its longest query tile (its key tiles are read one after another)
/// and its work spread over the slots; where the longest tiles set the pace (a lone prompt of
/// a thousand tokens, or one query row after a long prefix) their key ranges are cut into
/// runs of about the work per slot (at least [`PREFILL_MIN_RUN`] key tiles, at most
/// [`PREFILL_MAX_SPLITS`] runs), merged by the kernel. Entries are ordered by their key tiles,
/// fewest first: the kernel dispatches the last entries first.
pub fn prefill_work(
    seqs: &[PrefillSeq],
    n_heads: usize,
    slots: usize,
    max_parts: usize,
) -> Vec<i32> {
    // (key tiles, sequence, query offset) of every query tile
    let mut tiles = Vec::new();
    for (i, q) in seqs.iter().enumerate() {
        for off in (0..q.q_len).step_by(PREFILL_TILE) {
            let kv_end = q.prefix + q.q_len.min(off + PREFILL_TILE);
            tiles.push((kv_end.div_ceil(PREFILL_TILE), i, off));
        }
    }
    let work = tiles.iter().map(|t| t.0).sum::<usize>() * n_heads.max(1);
    let longest = tiles.iter().map(|t| t.0).max().unwrap_or(0);
    let runs_of = |units: usize, run: usize| {
        // runs of at least `run` tiles, at most PREFILL_MAX_SPLITS of them (each non-empty)
        units.div_ceil(run.max(units.div_ceil(PREFILL_MAX_SPLITS)))
    };
    let parts = |run: usize| -> usize {
        tiles
            .iter()
            .filter(|t| t.0 > run)
            .map(|t| runs_of(t.0, run))
            .sum()
    };
    // the shortest run from the work per slot up whose splits fit the partial slots (the
    // slots needed fall as the run grows; at `longest` none is split)
    let (mut run, mut hi) = (work.div_ceil(slots.max(1)).max(PREFILL_MIN_RUN), longest);
    if run < hi && parts(run) > max_parts {
        while run + 1 < hi {
            let mid = run + (hi - run) / 2;
            if parts(mid) > max_parts {
                run = mid;
            } else {
                hi = mid;
            }
        }
        run = hi;
    }
    // (key tiles of the entry, the entry)
    let mut entries: Vec<(usize, [i32; PREFILL_ENTRY_INTS])> = Vec::new();
    let mut next_part = 0;
    for &(units, seq, off) in &tiles {
        if units <= run {
            entries.push((units, [seq as i32, off as i32, 1 << 16, 0]));
            continue;
        }
        let n = runs_of(units, run);
        let per = units.div_ceil(n);
        for split in 0..n {
            let len = per.min(units - split * per);
            let code = (split | n << 16) as i32;
            entries.push((len, [seq as i32, off as i32, code, next_part as i32]));
        }
        next_part += n;
    }
    entries.sort_by_key(|e| e.0);
    entries.into_iter().flat_map(|e| e.1).collect()
}

/// The work list of the paired-head form ([`PrefillForm::Paired`]) over `seqs`, where it
/// applies: an FP8 pool, an even group ([`Kernels::prefill_pairs`]), and a list planned for it
/// (`n_heads / 2` block columns of twice the work over `slots` paired blocks) that needs no
/// split. `None` where the one-head form with its own list is to run (a prompt at tp 2 or a
/// row after a long prefix, whose longest tiles the one-head list splits).
pub fn prefill_paired_work(
    seqs: &[PrefillSeq],
    kv: KvDtype,
    n_heads: usize,
    n_kv_heads: usize,
    slots: usize,
) -> Option<Vec<i32>> {
    if !Kernels::prefill_pairs(kv, n_heads, n_kv_heads) {
        return None;
    }
    // planned without a bound on partial slots, to see whether it would split
    let list = prefill_work(seqs, n_heads / 2, slots, usize::MAX);
    let split = list.chunks(PREFILL_ENTRY_INTS).any(|e| e[2] >> 16 > 1);
    (!split).then_some(list)
}

#[cfg(test)]
mod tests {
    use super::{
        KvDtype, PREFILL_ENTRY_INTS, PREFILL_MAX_SPLITS, PrefillSeq, prefill_paired_work,
        prefill_tiles, prefill_work,
    };
    use std::collections::BTreeMap;

    /// Decodes a work list as the kernel does and checks that every query tile of `seqs` has
    /// each of its key tiles in exactly one entry, that a split tile's entries share one group
    /// of distinct partial slots below `max_parts`, and that entries come fewest key tiles
    /// first. Returns the largest entry (in key tiles) and the splits of each query tile.
    fn check(seqs: &[PrefillSeq], list: &[i32], max_parts: usize) -> (usize, Vec<usize>) {
        assert_eq!(list.len() % PREFILL_ENTRY_INTS, 0);
        // (seq, qoff) -> (nsplit, first slot, key tiles seen)
        let mut seen: BTreeMap<(usize, usize), (usize, i32, Vec<usize>)> = BTreeMap::new();
        let mut lens = Vec::new();
        let mut slots = Vec::new();
        for e in list.chunks(PREFILL_ENTRY_INTS) {
            let (seq, qoff) = (e[0] as usize, e[1] as usize);
            let (split, nsplit) = ((e[2] & 0xffff) as usize, (e[2] >> 16) as usize);
            assert!((1..=PREFILL_MAX_SPLITS).contains(&nsplit) && split < nsplit);
            let q = seqs[seq];
            let kv_end = q.prefix + q.q_len.min(qoff + 64);
            let n_kt = kv_end.div_ceil(64);
            let per = n_kt.div_ceil(nsplit);
            let (lo, hi) = ((split * per).min(n_kt), ((split + 1) * per).min(n_kt));
            assert!(
                lo < hi,
                "split {split} of {nsplit} over {n_kt} key tiles is empty"
            );
            lens.push(hi - lo);
            if nsplit > 1 {
                let slot = e[3] as usize + split;
                assert!(slot < max_parts);
                slots.push(slot);
            }
            let t = seen
                .entry((seq, qoff))
                .or_insert((nsplit, e[3], Vec::new()));
            assert_eq!((t.0, t.1), (nsplit, e[3]), "one query tile, one group");
            t.2.extend(lo..hi);
        }
        let mut tiles = 0;
        for (i, q) in seqs.iter().enumerate() {
            for off in (0..q.q_len).step_by(64) {
                tiles += 1;
                let mut got = seen[&(i, off)].2.clone();
                got.sort_unstable();
                let n_kt = (q.prefix + q.q_len.min(off + 64)).div_ceil(64);
                assert_eq!(
                    got,
                    (0..n_kt).collect::<Vec<_>>(),
                    "key tiles of ({i}, {off})"
                );
            }
        }
        assert_eq!(seen.len(), tiles);
        let n = slots.len();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), n, "partial slots are distinct");
        assert!(
            lens.windows(2).all(|w| w[0] <= w[1]),
            "fewest key tiles first"
        );
        let splits = seen.values().map(|t| t.0).collect();
        (lens.into_iter().max().unwrap_or(0), splits)
    }

    fn seq(q_len: usize, prefix: usize) -> PrefillSeq {
        PrefillSeq { q_len, prefix }
    }

    #[test]
    fn a_lone_prompt_has_its_longest_tiles_split_to_the_work_per_slot() {
        // 1024 tokens, 32 heads, 132 x 3 slots: 136 key tiles x 32 heads / 396 = 11 a slot
        let s = [seq(1024, 0)];
        let list = prefill_work(&s, 32, 396, 1000);
        let (longest, splits) = check(&s, &list, 1000);
        assert_eq!(longest, 11);
        assert_eq!(
            splits.iter().filter(|&&n| n > 1).count(),
            5,
            "tiles of 12..16"
        );
        // tp 2's 16 heads: 6 a slot
        let list = prefill_work(&s, 16, 396, 1000);
        assert_eq!(check(&s, &list, 1000).0, 6);
    }

    #[test]
    fn a_work_bound_launch_or_no_partial_room_splits_nothing() {
        let s = [seq(8192, 0)];
        let list = prefill_work(&s, 32, 396, 1000);
        let (_, splits) = check(&s, &list, 1000);
        assert!(splits.iter().all(|&n| n == 1));
        let s = [seq(1024, 0)];
        let list = prefill_work(&s, 32, 396, 0);
        assert_eq!(check(&s, &list, 0).0, 16);
        // room for 3 slots: the run grows until the split tiles need no more
        let list = prefill_work(&s, 32, 396, 3);
        let (longest, splits) = check(&s, &list, 3);
        assert_eq!(splits.iter().filter(|&&n| n > 1).sum::<usize>(), 2);
        // a run of 15: the 16-tile query tile alone is split (in two), the 15-tile one not
        assert_eq!(longest, 15);
    }

    #[test]
    fn one_row_after_a_long_prefix_is_cut_into_short_runs_at_most_the_split_limit() {
        // the last layer's logit row of a 1024-token prompt: 16 key tiles, 32 blocks
        let s = [seq(1, 1023)];
        let list = prefill_work(&s, 32, 396, 1000);
        let (longest, splits) = check(&s, &list, 1000);
        assert_eq!((longest, splits[0]), (2, 8));
        // 1563 key tiles: at most PREFILL_MAX_SPLITS runs
        let s = [seq(1, 100_000)];
        let list = prefill_work(&s, 32, 1 << 24, 1000);
        let (_, splits) = check(&s, &list, 1000);
        assert_eq!(splits[0], PREFILL_MAX_SPLITS);
        // several sequences and prefixes
        let s = [
            seq(300, 0),
            seq(70, 150),
            seq(1, 513),
            seq(0, 5),
            seq(640, 37),
        ];
        let list = prefill_work(&s, 8, 1 << 24, 1000);
        check(&s, &list, 1000);
    }

    #[test]
    fn whole_tiles_are_in_batch_order() {
        let s = [seq(70, 0), seq(1, 9)];
        let list = prefill_tiles(&[70, 1]);
        let (_, splits) = check(&s[..1], &list[..8], 0);
        assert_eq!(splits, vec![1, 1]);
        assert_eq!(
            list,
            vec![0, 0, 1 << 16, 0, 0, 64, 1 << 16, 0, 1, 0, 1 << 16, 0]
        );
    }

    /// The paired form takes a lone 1024-token prompt at 32/8 heads over an FP8 pool on 132
    /// paired blocks (every key tile once, nothing split, longest last), and leaves to the
    /// one-head form a bf16 pool, an odd group, tp 2's 16/4 heads and one row after a long
    /// prefix (whose lists would split).
    #[test]
    fn paired_work_where_it_applies() {
        let e4m3 = KvDtype::Fp8E4m3;
        let prompt = [PrefillSeq {
            q_len: 1024,
            prefix: 0,
        }];
        let list = prefill_paired_work(&prompt, e4m3, 32, 8, 132).expect("paired at 32/8 heads");
        let (longest, splits) = check(&prompt, &list, 0);
        assert_eq!(longest, 16);
        assert!(splits.iter().all(|&n| n == 1));
        assert_eq!(list.len() / PREFILL_ENTRY_INTS, 16);
        assert!(prefill_paired_work(&prompt, KvDtype::Fp8E5m2, 32, 8, 132).is_some());
        assert!(prefill_paired_work(&prompt, KvDtype::Bf16, 32, 8, 132).is_none());
        assert!(prefill_paired_work(&prompt, e4m3, 24, 8, 132).is_none());
        assert!(prefill_paired_work(&prompt, e4m3, 16, 4, 132).is_none());
        let tail = [PrefillSeq {
            q_len: 1,
            prefix: 1023,
        }];
        assert!(prefill_paired_work(&tail, e4m3, 32, 8, 132).is_none());
    }
}
