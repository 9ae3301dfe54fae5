//! The launchers of the row and element kernels (`cu/elementwise.cu`): the embedding gather,
//! the residual add with RMSNorm, RoPE with the K/V store (the FP8 qkv product's rescale folded
//! in or not), SiLU-mul and the row gather.

use cudarc::driver::CudaStream;
use half::bf16;

use super::{Kernels, LayerAttn, arg};
use crate::{Dptr, KernelError, Result};

impl Kernels {
    /// `out[t] = table[ids[t]]`, rows of `hidden` (a multiple of 8); ids >= vocab give zeros.
    ///
    /// # Safety
    /// out: n_tokens x hidden; table: vocab x hidden; ids: n_tokens.
    pub unsafe fn embedding(
        &self,
        s: &CudaStream,
        out: Dptr<bf16>,
        table: Dptr<bf16>,
        ids: Dptr<u32>,
        n_tokens: usize,
        hidden: usize,
        vocab: usize,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let (o, t, i) = (out.addr(), table.addr(), ids.addr());
        let (h, v) = (hidden as i32, vocab as i32);
        let mut a = [arg(&o), arg(&t), arg(&i), arg(&h), arg(&v)];
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.embedding, (n_tokens as u32, 1, 1), 256, &mut a) }
    }

    /// With `delta`: `residual += delta` (rounded to bf16); then `out = rmsnorm(residual) * w`.
    ///
    /// # Safety
    /// out, residual, delta: n_tokens x hidden; weight: hidden.
    pub unsafe fn add_rmsnorm(
        &self,
        s: &CudaStream,
        out: Dptr<bf16>,
        residual: Dptr<bf16>,
        delta: Option<Dptr<bf16>>,
        weight: Dptr<bf16>,
        n_tokens: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let (o, r, d, w) = (
            out.addr(),
            residual.addr(),
            delta.unwrap_or(Dptr::null()).addr(),
            weight.addr(),
        );
        let h = hidden as i32;
        let mut a = [arg(&o), arg(&r), arg(&d), arg(&w), arg(&h), arg(&eps)];
        let threads = (hidden / 8).clamp(32, 1024).next_multiple_of(32) as u32;
        let grid = (n_tokens as u32, 1, 1);
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.add_rmsnorm, grid, threads, &mut a) }
    }

    /// Rotate q (in place) and k of each fused qkv row; store k and v at the token's pool slot
    /// (an FP8 pool: divided by the layer's K and V scales).
    ///
    /// # Safety
    /// qkv: n_tokens x (n_heads + 2 n_kv_heads) x head_dim; caches: slots x n_kv_heads x
    /// head_dim covering every slot; positions, slots: n_tokens; inv_freq: head_dim / 2.
    pub unsafe fn rope_kv_store(
        &self,
        s: &CudaStream,
        qkv: Dptr<bf16>,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        positions: Dptr<i32>,
        slots: Dptr<i32>,
        inv_freq: Dptr<f32>,
        n_tokens: usize,
        shape: impl Into<LayerAttn>,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees.
        unsafe {
            self.rope_kv_store_with(
                s, qkv, k_cache, v_cache, positions, slots, inv_freq, n_tokens, shape, None, false,
            )
        }
    }

    /// [`Kernels::fp8_rescale`] of an FP8 GEMM's unscaled qkv product (`xs` per token, `ws`
    /// per column) and [`Kernels::rope_kv_store`] in one kernel, with the same results: the
    /// q heads end up in `qkv` scaled and rotated, k and v in the pool; the k and v parts of
    /// `qkv` stay unscaled. `ws` must be 16-byte aligned.
    ///
    /// # Safety
    /// As [`Kernels::rope_kv_store`]; xs: n_tokens; ws: (n_heads + 2 n_kv_heads) x head_dim.
    pub unsafe fn rope_kv_store_rescale(
        &self,
        s: &CudaStream,
        qkv: Dptr<bf16>,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        positions: Dptr<i32>,
        slots: Dptr<i32>,
        inv_freq: Dptr<f32>,
        n_tokens: usize,
        shape: impl Into<LayerAttn>,
        xs: Dptr<f32>,
        ws: Dptr<f32>,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees.
        unsafe {
            self.rope_kv_store_with(
                s,
                qkv,
                k_cache,
                v_cache,
                positions,
                slots,
                inv_freq,
                n_tokens,
                shape,
                Some((xs, ws)),
                false,
            )
        }
    }

    /// [`Kernels::rope_kv_store`], with `scales` [`Kernels::rope_kv_store_rescale`]; with `keep`
    /// k (rotated) and v (scaled) are also written back into `qkv` as bf16, the values a bf16
    /// pool would hold, for prefill attention over a fresh prompt's rows (token row r's K and V
    /// are then pool slot r x (group + 2) of `qkv` offset by the q heads, and by the q and k
    /// heads, at the pool's row stride).
    ///
    /// # Safety
    /// As those two.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rope_kv_store_with(
        &self,
        s: &CudaStream,
        qkv: Dptr<bf16>,
        k_cache: Dptr<u8>,
        v_cache: Dptr<u8>,
        positions: Dptr<i32>,
        slots: Dptr<i32>,
        inv_freq: Dptr<f32>,
        n_tokens: usize,
        shape: impl Into<LayerAttn>,
        scales: Option<(Dptr<f32>, Dptr<f32>)>,
        keep: bool,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let (shape, kv_scales, _) = shape.into().resolve()?;
        if !shape.head_dim.is_multiple_of(8) || shape.head_dim > 512 {
            return Err(KernelError::Unsupported(format!(
                "rope_kv_store: head_dim {} (must be a multiple of 8, at most 512)",
                shape.head_dim
            )));
        }
        let (xs, ws) = scales.unwrap_or((Dptr::null(), Dptr::null()));
        if !ws.addr().is_multiple_of(16) {
            return Err(KernelError::Unsupported(format!(
                "rope_kv_store_rescale: column scales at {ws:?} (must be 16-byte aligned)"
            )));
        }
        let (q, k, v, p, sl, f) = (
            qkv.addr(),
            k_cache.addr(),
            v_cache.addr(),
            positions.addr(),
            slots.addr(),
            inv_freq.addr(),
        );
        let (nh, nkv, hd) = (
            shape.n_heads as i32,
            shape.n_kv_heads as i32,
            shape.head_dim as i32,
        );
        let (k_inv, v_inv) = (1.0 / kv_scales.k, 1.0 / kv_scales.v);
        let (xa, wa) = (xs.addr(), ws.addr());
        let kp = i32::from(keep);
        let mut a = [
            arg(&q),
            arg(&k),
            arg(&v),
            arg(&p),
            arg(&sl),
            arg(&f),
            arg(&nh),
            arg(&nkv),
            arg(&hd),
            arg(&k_inv),
            arg(&v_inv),
            arg(&xa),
            arg(&wa),
            arg(&kp),
        ];
        let grid = (n_tokens as u32, 1, 1);
        let fun = match scales {
            Some(_) => &self.rope_kv_store_rescale[shape.kv.index()],
            None => &self.rope_kv_store[shape.kv.index()],
        };
        // SAFETY: argument types match the kernel (the plain form ignores the scales); the
        // caller guarantees the extents.
        unsafe { self.launch(s, fun, grid, 256, &mut a) }
    }

    /// `out = silu(gate) * up` with `gate_up` rows `[gate | up]` of 2 x inter.
    ///
    /// # Safety
    /// out: n_tokens x inter; gate_up: n_tokens x 2 inter.
    pub unsafe fn silu_mul(
        &self,
        s: &CudaStream,
        out: Dptr<bf16>,
        gate_up: Dptr<bf16>,
        n_tokens: usize,
        inter: usize,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let (o, g) = (out.addr(), gate_up.addr());
        let (n, i) = (n_tokens as i32, inter as i32);
        let vecs = n_tokens * inter / 8;
        let blocks = vecs.div_ceil(256).clamp(1, self.num_sms as usize * 8) as u32;
        let mut a = [arg(&o), arg(&g), arg(&n), arg(&i)];
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.silu_mul, (blocks, 1, 1), 256, &mut a) }
    }

    /// `out[i] = src[rows[i]]` for rows of `width` bf16.
    ///
    /// # Safety
    /// out: n x width; rows: n indices into src.
    pub unsafe fn gather_rows(
        &self,
        s: &CudaStream,
        out: Dptr<bf16>,
        src: Dptr<bf16>,
        rows: Dptr<i32>,
        n: usize,
        width: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let (o, sr, r) = (out.addr(), src.addr(), rows.addr());
        let w = width as i32;
        let mut a = [arg(&o), arg(&sr), arg(&r), arg(&w)];
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.gather_rows, (n as u32, 1, 1), 256, &mut a) }
    }
}
