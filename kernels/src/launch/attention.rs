//! The attention launchers (`cu/decode_attn.cu`, `cu/decode_attn_tc.cu`, `cu/prefill_attn.cu`):
//! decode attention's plan and its forms (partials and merge, one launch, with RoPE and the K/V
//! store, on tensor cores), and causal prefill attention over the paged pool.

use cudarc::driver::CudaStream;
use half::bf16;

use super::{
    DECODE_TC_MIN_BATCH, DecodeAttnPlan, Kernels, LayerAttn, MAX_DECODE_SPLITS, arg, dim_index,
    group_index,
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

    /// Causal prefill attention for a packed variable-length batch whose queries may start
    /// after a cached prefix. `tiles` holds (sequence, query offset) pairs, one per 64 queries
    /// (see [`prefill_tiles`]); q rows come from the fused qkv buffer (rows of q_stride).
    ///
    /// # Safety
    /// Every index array matches the batch: q_indptr, kv_indptr: batch + 1; prefix_lens: batch;
    /// kv_indices: kv_indptr[batch]; tiles: 2 n_tiles; out rows of out_stride for every token.
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
        shape: impl Into<LayerAttn>,
    ) -> Result<()> {
        if n_tiles == 0 {
            return Ok(());
        }
        let (shape, scales, scale_log2) = shape.into().resolve()?;
        let f = &self.prefill[shape.kv.index()][dim_index(shape.head_dim)?];
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
        ];
        let grid = (n_tiles as u32, shape.n_heads as u32, 1);
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, f, grid, 128, &mut a) }
    }
}

/// (sequence, query offset) pairs, one per 64 queries, for [`Kernels::prefill_attn`].
pub fn prefill_tiles(q_lens: &[usize]) -> Vec<i32> {
    let mut t = Vec::new();
    for (i, &n) in q_lens.iter().enumerate() {
        for off in (0..n).step_by(64) {
            t.push(i as i32);
            t.push(off as i32);
        }
    }
    t
}
