//! The sampling launchers: a token per row on the device and the logit edits applied before it
//! (penalties, bias) (`cu/sampling.cu`), and the copy of device-sampled tokens into the next
//! pass's inputs (`copy_tokens_i32` in `cu/elementwise.cu`).

use cudarc::driver::CudaStream;
use half::bf16;

use super::{Kernels, LogitEdit, arg};
use crate::{Dptr, KernelError, Result};

impl Kernels {
    /// Sample one token per row of bf16 logits. params: 5 floats per row
    /// (temperature, top_p, top_k, min_p, uniform draw); temperature <= 0 is greedy.
    ///
    /// # Safety
    /// out: rows; logits: rows x vocab; params: 5 rows.
    pub unsafe fn sample(
        &self,
        s: &CudaStream,
        out: Dptr<i32>,
        logits: Dptr<bf16>,
        params: Dptr<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let (o, l, p) = (out.addr(), logits.addr(), params.addr());
        let v = vocab as i32;
        let mut a = [arg(&o), arg(&l), arg(&v), arg(&p)];
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.sample, (rows as u32, 1, 1), 1024, &mut a) }
    }

    /// Apply `n` [`LogitEdit`]s in place to bf16 logits of `rows` x `vocab` (repetition,
    /// frequency and presence penalties, logit bias, min-token masks) before [`Kernels::sample`].
    /// No two edits may name the same (row, token); edits outside the buffer are skipped.
    ///
    /// # Safety
    /// logits: rows x vocab; edits: n entries.
    pub unsafe fn logit_edits(
        &self,
        s: &CudaStream,
        logits: Dptr<bf16>,
        rows: usize,
        vocab: usize,
        edits: Dptr<LogitEdit>,
        n: usize,
    ) -> Result<()> {
        if n == 0 || rows == 0 || vocab == 0 {
            return Ok(());
        }
        if rows > i32::MAX as usize || vocab > i32::MAX as usize || n > i32::MAX as usize {
            return Err(KernelError::Unsupported(format!(
                "logit edits: {n} entries over {rows} x {vocab}"
            )));
        }
        let (l, e) = (logits.addr(), edits.addr());
        let (r, v, ni) = (rows as i32, vocab as i32, n as i32);
        let mut a = [arg(&l), arg(&r), arg(&v), arg(&e), arg(&ni)];
        let blocks = n.div_ceil(256).min(self.num_sms as usize * 8).max(1) as u32;
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.logit_edits, (blocks, 1, 1), 256, &mut a) }
    }

    /// `dst[pairs[2 i]] = src[pairs[2 i + 1]]` for `i < n` (int32 token ids): the next step's
    /// inputs from the previous step's sampled tokens without a host round trip.
    ///
    /// # Safety
    /// pairs: 2 n indices, the even ones inside dst, the odd ones inside src; no dst index
    /// repeats.
    pub unsafe fn copy_tokens(
        &self,
        s: &CudaStream,
        dst: Dptr<i32>,
        src: Dptr<i32>,
        pairs: Dptr<i32>,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n > i32::MAX as usize / 2 {
            return Err(KernelError::Unsupported(format!("copy of {n} tokens")));
        }
        let (d, sr, p) = (dst.addr(), src.addr(), pairs.addr());
        let ni = n as i32;
        let mut a = [arg(&d), arg(&sr), arg(&p), arg(&ni)];
        let blocks = n.div_ceil(256).min(self.num_sms as usize * 8).max(1) as u32;
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.copy_tokens, (blocks, 1, 1), 256, &mut a) }
    }
}
