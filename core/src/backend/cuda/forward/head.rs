//! The end of a pass: the final norm and the LM head on the rows that need logits (split by
//! vocabulary across the ranks when they divide it), and the logits to the host or sampled on
//! the device.

use cudarc::driver::{result as dres, sys};
use half::bf16;
use sgl_kernels::{Dptr, dptr};

use super::CudaBackend;
use crate::backend::SampleInput;
use crate::backend::cuda::cuda_err;
use crate::error::Result;

impl CudaBackend {
    /// Whether this rank runs the LM head: rank 0, and every rank when the vocabulary is split.
    pub(super) fn computes_logits(&self) -> bool {
        self.rank() == 0 || self.w.vocab_parts > 1
    }

    /// Final norm (with the last residual add, unless the layers already added every delta
    /// into `x`) and LM head for `rows` rows into logits row `at`.
    pub(super) fn head(
        &self,
        x: Dptr<bf16>,
        d: Option<Dptr<bf16>>,
        normed: Dptr<bf16>,
        rows: usize,
        at: usize,
    ) -> Result<()> {
        let s = &self.stream;
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let logits = dptr(&self.scratch.logits, s).add(at * v);
        // SAFETY: buffers hold `rows` rows of the stated widths.
        unsafe {
            self.kernels
                .add_rmsnorm(
                    s,
                    normed,
                    x,
                    d,
                    dptr(&self.w.norm, s),
                    rows,
                    h,
                    self.cfg.rms_norm_eps,
                )
                .map_err(cuda_err)?;
        }
        if self.w.vocab_parts == 1 {
            return self.linear(normed, self.w.lm_head_ptr(s).into(), logits, rows, h, v);
        }
        // Vocabulary-parallel: this rank's logits columns, placed into zeroed rows and summed
        // across the ranks (adding zeros is exact), so every rank ends with the whole rows.
        let vp = v / self.w.vocab_parts;
        let part = dptr(&self.scratch.logits_part, s);
        self.linear(normed, self.w.lm_head_ptr(s).into(), part, rows, h, vp)?;
        let elem = std::mem::size_of::<bf16>();
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: part.addr(),
            srcArray: std::ptr::null_mut(),
            srcPitch: vp * elem,
            dstXInBytes: self.w.vocab_rank * vp * elem,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: logits.addr(),
            dstArray: std::ptr::null_mut(),
            dstPitch: v * elem,
            WidthInBytes: vp * elem,
            Height: rows,
        };
        // SAFETY: `logits` holds `rows` rows of v values from row `at` and `part` rows of vp
        // values (the scratch buffers are sized for LOGIT_ROWS rows); both on this stream.
        unsafe {
            sys::cuMemsetD16Async(logits.addr(), 0, rows * v, s.cu_stream())
                .result()
                .map_err(cuda_err)?;
            sys::cuMemcpy2DAsync_v2(&copy, s.cu_stream())
                .result()
                .map_err(cuda_err)?;
        }
        self.all_reduce(logits, rows * v)
    }

    pub(in crate::backend::cuda) fn logits_to_host(&self, rows: Vec<usize>) -> Result<Vec<f32>> {
        let v = self.cfg.vocab_size;
        let mut out = Vec::with_capacity(rows.len() * v);
        let mut buf = vec![bf16::ZERO; v];
        let base = dptr(&self.scratch.logits, &self.stream);
        // contiguous runs of rows in one copy
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            buf.resize((j - i) * v, bf16::ZERO);
            // SAFETY: rows lie inside the logits buffer; buf holds exactly (j - i) rows.
            unsafe {
                dres::memcpy_dtoh_async(
                    &mut buf,
                    base.add(rows[i] * v).addr(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(cuda_err)?;
            self.wait_stream()?;
            out.extend(buf.iter().map(|x| x.to_f32()));
            i = j;
        }
        Ok(out)
    }

    /// Sample one token from each logits row in `rows` with `params[i]` for `rows[i]`.
    pub(in crate::backend::cuda) fn sample_device(
        &self,
        rows: &[usize],
        params: &[SampleInput],
    ) -> Result<Vec<u32>> {
        let s = &self.stream;
        let n = rows.iter().max().map_or(0, |m| m + 1);
        if n == 0 {
            return Ok(Vec::new());
        }
        let out = self.sample_rows(rows, params)?;
        let mut host = vec![0i32; n];
        // SAFETY: host holds n ints.
        unsafe { dres::memcpy_dtoh_async(&mut host, out.addr(), s.cu_stream()) }
            .map_err(cuda_err)?;
        self.wait_stream()?;
        Ok(rows.iter().map(|&r| host[r] as u32).collect())
    }

    /// Queue the sampling of each logits row in `rows` with `params[i]` for `rows[i]`; returns
    /// the device buffer whose entry `r` receives row `r`'s token (rows nobody samples from
    /// are sampled greedily).
    pub(in crate::backend::cuda) fn sample_rows(
        &self,
        rows: &[usize],
        params: &[SampleInput],
    ) -> Result<Dptr<i32>> {
        let s = &self.stream;
        let v = self.cfg.vocab_size;
        let n = rows.iter().max().map_or(0, |m| m + 1);
        let out = dptr(&self.scratch.sampled, s);
        if n == 0 {
            return Ok(out);
        }
        // Rows this pass computed but nobody samples from get greedy parameters.
        let mut table = vec![[0.0f32, 1.0, 0.0, 0.0, 0.0]; n];
        for (&r, p) in rows.iter().zip(params) {
            table[r] = [
                p.temperature.max(0.0),
                p.top_p,
                p.top_k.max(0) as f32,
                p.min_p,
                p.uniform,
            ];
        }
        let words: Vec<i32> = table
            .into_iter()
            .flatten()
            .map(|x| x.to_bits() as i32)
            .collect();
        let p = dptr(&self.scratch.params, s);
        // SAFETY: the parameter buffer holds floats, uploaded as their bit patterns.
        let p_words = unsafe { Dptr::<i32>::from_raw(p.addr()) };
        self.upload(p_words, &words)?;
        // SAFETY: n rows of logits were written by this pass; params holds 5 floats per row.
        unsafe {
            self.kernels
                .sample(s, out, dptr(&self.scratch.logits, s), p, n, v)
        }
        .map_err(cuda_err)?;
        Ok(out)
    }
}
