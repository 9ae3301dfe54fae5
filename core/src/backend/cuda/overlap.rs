//! Asynchronous passes for the overlap schedule: uploads through pinned staging memory (a
//! copy from pageable memory may wait for the stream, which would serialize the host with the
//! GPU), sampled tokens kept on the device for the next pass's inputs, and their copy to
//! pinned host memory signalled by an event.
//!
//! Two passes may be uncollected at once (the scheduler launches pass N+1, then collects pass
//! N), so staging, device outputs and host outputs are double-buffered by pass parity: pass
//! N+2 reuses pass N's buffers, and pass N was collected (its event passed, so its copies are
//! done) before pass N+2 is launched.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, PinnedHostSlice, result as dres,
};
use sgl_kernels::{Dptr, LogitEdit as KernelEdit, dptr};

use super::{CudaBackend, cuda_err, split_mixed};
use crate::backend::{DeviceSampling, LogitEdit, SampleInput, SeqInput};
use crate::error::{EngineError, Result};

/// Most logits edits of one sampling group (penalised tokens of every penalised request).
const MAX_EDITS: usize = 1 << 18;

/// Bytes of pinned staging memory per parity.
const STAGING_BYTES: usize = 32 << 20;

/// Pinned host memory that uploads are copied through; one bump arena per parity.
pub(super) struct Staging {
    bufs: [PinnedHostSlice<u8>; 2],
    base: [*mut u8; 2],
    parity: Cell<usize>,
    used: Cell<usize>,
}

// SAFETY: the raw pointers point into the pinned allocations owned by `bufs`, which live as
// long as the struct; the backend (and so this struct) is used from one thread at a time.
unsafe impl Send for Staging {}

impl Staging {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        // SAFETY: plain page-locked allocations (cached, readable by the host), written only
        // through `base` before the copies that read them are queued.
        let mut a =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGING_BYTES, 0) }.map_err(cuda_err)?;
        let mut b =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(STAGING_BYTES, 0) }.map_err(cuda_err)?;
        let base = [
            a.as_mut_ptr().map_err(cuda_err)?,
            b.as_mut_ptr().map_err(cuda_err)?,
        ];
        Ok(Staging {
            bufs: [a, b],
            base,
            parity: Cell::new(0),
            used: Cell::new(0),
        })
    }

    /// Start a pass's uploads in the other arena.
    pub fn flip(&self) {
        self.parity.set(1 - self.parity.get());
        self.used.set(0);
    }

    /// Copy `src` into the current arena; `None` when it is full.
    fn stage(&self, src: &[i32]) -> Option<*const i32> {
        let bytes = std::mem::size_of_val(src);
        let at = self.used.get().next_multiple_of(16);
        let p = self.parity.get();
        if at + bytes > self.bufs[p].len() {
            return None;
        }
        // SAFETY: `at + bytes` lies inside arena `p`; no queued copy reads this range (the
        // arena's previous pass was collected before this one was started, see the module).
        unsafe {
            let dst = self.base[p].add(at) as *mut i32;
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
            self.used.set(at + bytes);
            Some(dst)
        }
    }
}

/// Sampled tokens of launched passes: on the device (inputs of the next pass) and their copy
/// on the host.
pub(super) struct PassOutputs {
    device: [CudaSlice<i32>; 2],
    host: [PinnedHostSlice<i32>; 2],
    host_ptr: [*const i32; 2],
    /// Index pairs for the token copies.
    pairs: CudaSlice<i32>,
    /// Logits edits of a sampling group.
    edits: CudaSlice<KernelEdit>,
    /// Launched, not yet collected: (parity, tokens, the event after their copy).
    queue: VecDeque<(usize, usize, CudaEvent)>,
    /// Parity of the next launched pass.
    next: usize,
}

// SAFETY: as for `Staging`: pointers into owned pinned allocations, one thread at a time.
unsafe impl Send for PassOutputs {}

impl PassOutputs {
    pub fn new(ctx: &Arc<CudaContext>, s: &Arc<CudaStream>, max_tokens: usize) -> Result<Self> {
        let n = max_tokens.max(1);
        let mut host = Vec::with_capacity(2);
        let mut host_ptr = [std::ptr::null(); 2];
        for p in &mut host_ptr {
            // SAFETY: page-locked host memory, read only after the event of the copy into it.
            let h = unsafe { ctx.alloc_pinned_with_flags::<i32>(n, 0) }.map_err(cuda_err)?;
            *p = h.as_ptr().map_err(cuda_err)?;
            host.push(h);
        }
        let host: [PinnedHostSlice<i32>; 2] = host
            .try_into()
            .map_err(|_| EngineError::Internal("pinned output buffers".into()))?;
        Ok(PassOutputs {
            device: [
                s.alloc_zeros::<i32>(n).map_err(cuda_err)?,
                s.alloc_zeros::<i32>(n).map_err(cuda_err)?,
            ],
            host,
            host_ptr,
            pairs: s.alloc_zeros::<i32>(2 * n).map_err(cuda_err)?,
            // SAFETY: a group's edits are uploaded before the kernel reads them.
            edits: unsafe { s.alloc::<KernelEdit>(MAX_EDITS) }.map_err(cuda_err)?,
            queue: VecDeque::new(),
            next: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.host[0].len()
    }
}

impl CudaBackend {
    /// Drop the launched passes not yet collected (the stream was synchronized).
    pub(super) fn discard_passes(&mut self) {
        self.outputs.queue.clear();
    }

    /// Whether no launched pass is waiting to be collected.
    pub(super) fn outputs_idle(&self) -> bool {
        self.outputs.queue.is_empty()
    }
}

impl CudaBackend {
    /// Upload `src` to `dst` on the stream, through pinned staging memory when it fits.
    pub(super) fn upload(&self, dst: Dptr<i32>, src: &[i32]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let s = &self.stream;
        match self.staging.stage(src) {
            Some(p) => {
                // SAFETY: `p` holds `src.len()` staged ints that stay untouched until this
                // pass is collected; dst was sized by the caller to hold them.
                unsafe {
                    cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                        dst.addr(),
                        p as *const std::ffi::c_void,
                        std::mem::size_of_val(src),
                        s.cu_stream(),
                    )
                }
                .result()
                .map_err(cuda_err)
            }
            None => {
                // SAFETY: as above, from pageable memory (the driver stages it before return).
                unsafe { dres::memcpy_htod_async(dst.addr(), src, s.cu_stream()) }.map_err(cuda_err)
            }
        }
    }

    /// Logits edits for the rows of one sampling group, uploaded; returns their count.
    /// `row_of[k]` is the logits row of the group's k-th sampling sequence.
    fn upload_edits(&self, edits: &[LogitEdit], row_of: &[usize]) -> Result<usize> {
        let mut words: Vec<i32> = Vec::with_capacity(4 * edits.len());
        for e in edits {
            let Some(&row) = row_of.get(e.seq as usize) else {
                continue;
            };
            words.extend([
                row as i32,
                e.token as i32,
                e.rep.to_bits() as i32,
                e.add.to_bits() as i32,
            ]);
        }
        let n = words.len() / 4;
        if n > self.outputs.edits.len() {
            return Err(EngineError::Internal(format!(
                "{n} logits edits in one pass; at most {} supported",
                self.outputs.edits.len()
            )));
        }
        // SAFETY: an edit is four 4-byte words (row, token, rep bits, add bits), uploaded as
        // ints into the edits buffer of at least n entries.
        let dst = unsafe { Dptr::<i32>::from_raw(dptr(&self.outputs.edits, &self.stream).addr()) };
        self.upload(dst, &words)?;
        Ok(n)
    }

    /// Where the next pass's sequences take their input tokens from the pass before
    /// (`(sequence index, sampled index)`), set while that pass is being launched.
    pub(super) fn apply_prev(&self, ids: Dptr<i32>, token_of_seq: &[usize]) -> Result<()> {
        let prev = self.pending_prev.take();
        if prev.is_empty() {
            return Ok(());
        }
        let Some((parity, _, _)) = self.outputs.queue.back() else {
            return Err(EngineError::Internal(
                "a pass takes tokens from a previous pass that was not launched".into(),
            ));
        };
        let src = dptr(&self.outputs.device[*parity], &self.stream);
        let mut pairs = Vec::with_capacity(2 * prev.len());
        for (seq, j) in prev {
            let Some(&t) = token_of_seq.get(seq) else {
                return Err(EngineError::Internal(format!(
                    "sequence {seq} is not in the pass"
                )));
            };
            pairs.extend([t as i32, j as i32]);
        }
        // SAFETY: pairs index the ids of this pass (< its tokens) and the previous pass's
        // sampled tokens (< their count, checked by the launch).
        unsafe { self.copy_tokens(ids, src, &pairs) }
    }

    /// `dst[pairs[2 i]] = src[pairs[2 i + 1]]` on the stream (pairs uploaded first).
    ///
    /// # Safety
    /// Every even pair entry indexes `dst`, every odd one `src`.
    unsafe fn copy_tokens(&self, dst: Dptr<i32>, src: Dptr<i32>, pairs: &[i32]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let p = dptr(&self.outputs.pairs, &self.stream);
        self.upload(p, pairs)?;
        // SAFETY: the caller's guarantee; the pairs buffer holds the uploaded pairs.
        unsafe {
            self.kernels
                .copy_tokens(&self.stream, dst, src, p, pairs.len() / 2)
        }
        .map_err(cuda_err)
    }

    /// Run one group of a pass and sample its rows on the device; the sampled tokens are
    /// copied to `out` at the batch-order indices `dst`.
    fn run_sample_group(
        &mut self,
        sub: &[SeqInput<'_>],
        params: &[SampleInput],
        edits: &[LogitEdit],
        prev: Vec<(usize, u32)>,
        out: Dptr<i32>,
        dst: &[usize],
    ) -> Result<()> {
        self.pending_prev.set(prev);
        let rows = self.run(sub)?;
        if rows.len() != params.len() {
            return Err(EngineError::Internal(format!(
                "{} logits rows for {} sampling sequences",
                rows.len(),
                params.len()
            )));
        }
        let n_edits = self.upload_edits(edits, &rows)?;
        if n_edits > 0 {
            let e = dptr(&self.outputs.edits, &self.stream);
            let v = self.cfg.vocab_size;
            let n_rows = rows.iter().max().map_or(0, |m| m + 1);
            // SAFETY: edits name rows this pass wrote (< n_rows) and tokens < vocab (the
            // scheduler filters them); the buffer holds n_edits entries.
            unsafe {
                self.kernels.logit_edits(
                    &self.stream,
                    dptr(&self.scratch.logits, &self.stream),
                    n_rows,
                    v,
                    e,
                    n_edits,
                )
            }
            .map_err(cuda_err)?;
        }
        let sampled = self.sample_rows(&rows, params)?;
        let pairs: Vec<i32> = dst
            .iter()
            .zip(&rows)
            .flat_map(|(&d, &r)| [d as i32, r as i32])
            .collect();
        // SAFETY: `dst` < the pass's sampled count <= the output capacity; rows < sampled rows.
        unsafe { self.copy_tokens(out, sampled, &pairs) }
    }

    /// Launch a pass that samples on the device; see [`crate::backend::Overlap::launch_sample`].
    pub(super) fn launch_pass(
        &mut self,
        batch: &[SeqInput<'_>],
        s: DeviceSampling<'_>,
    ) -> Result<()> {
        self.validate(batch)?;
        if let Some(i) = batch.iter().position(|q| q.num_logits > 1) {
            return Err(EngineError::Internal(format!(
                "sequence {i} asks for {} logits rows; device sampling takes one per sequence",
                batch[i].num_logits
            )));
        }
        let sampling: Vec<usize> = (0..batch.len())
            .filter(|&i| batch[i].num_logits > 0)
            .collect();
        if sampling.len() != s.params.len() {
            return Err(EngineError::Internal(format!(
                "{} sampling parameter sets for {} sequences with logits",
                s.params.len(),
                sampling.len()
            )));
        }
        if sampling.len() > self.outputs.capacity() {
            return Err(EngineError::Internal(format!(
                "{} sampling sequences in one pass; at most {}",
                sampling.len(),
                self.outputs.capacity()
            )));
        }
        if self.outputs.queue.len() >= 2 {
            return Err(EngineError::Internal(
                "two passes are already launched and not collected".into(),
            ));
        }
        let prev_count = self.outputs.queue.back().map_or(0, |q| q.1);
        if let Some(bad) = s.prev.iter().flatten().find(|&&j| j as usize >= prev_count) {
            return Err(EngineError::Internal(format!(
                "a sequence takes token {bad} of a previous pass that sampled {prev_count}"
            )));
        }
        self.staging.flip();
        let parity = self.outputs.next;
        self.outputs.next = 1 - parity;
        let out = dptr(&self.outputs.device[parity], &self.stream);
        // The batch-order sampled index of each sampling sequence.
        let mut sampled_idx = vec![usize::MAX; batch.len()];
        for (k, &i) in sampling.iter().enumerate() {
            sampled_idx[i] = k;
        }
        let groups: Vec<Vec<usize>> = match split_mixed(batch, self.opts.deterministic) {
            Some((decodes, prompts)) => vec![decodes, prompts],
            None => vec![(0..batch.len()).collect()],
        };
        for idx in &groups {
            let sub: Vec<SeqInput<'_>> = idx.iter().map(|&i| batch[i]).collect();
            let members: Vec<usize> = idx
                .iter()
                .copied()
                .filter(|&i| batch[i].num_logits > 0)
                .collect();
            let params: Vec<SampleInput> =
                members.iter().map(|&i| s.params[sampled_idx[i]]).collect();
            // Edits re-indexed to the group's sampling order.
            let mut local = vec![u32::MAX; batch.len()];
            for (k, &i) in members.iter().enumerate() {
                local[sampled_idx[i]] = k as u32;
            }
            let edits: Vec<LogitEdit> = s
                .edits
                .iter()
                .filter_map(|e| {
                    let k = *local.get(e.seq as usize)?;
                    (k != u32::MAX).then_some(LogitEdit { seq: k, ..*e })
                })
                .collect();
            let prev: Vec<(usize, u32)> = idx
                .iter()
                .enumerate()
                .filter_map(|(k, &i)| s.prev.get(i).copied().flatten().map(|j| (k, j)))
                .collect();
            let dst: Vec<usize> = members.iter().map(|&i| sampled_idx[i]).collect();
            self.run_sample_group(&sub, &params, &edits, prev, out, &dst)?;
        }
        let n = sampling.len();
        let host = self.outputs.host_ptr[parity] as *mut i32;
        if n > 0 {
            // SAFETY: `host` is pinned memory of at least n ints, read only after the event;
            // `out` holds the pass's n tokens.
            unsafe {
                cudarc::driver::sys::cuMemcpyDtoHAsync_v2(
                    host as *mut std::ffi::c_void,
                    out.addr(),
                    n * std::mem::size_of::<i32>(),
                    self.stream.cu_stream(),
                )
            }
            .result()
            .map_err(cuda_err)?;
        }
        let event = self.stream.record_event(None).map_err(cuda_err)?;
        self.outputs.queue.push_back((parity, n, event));
        Ok(())
    }

    /// Wait for the oldest launched pass and return its tokens.
    pub(super) fn collect_pass(&mut self) -> Result<Vec<u32>> {
        let Some((parity, n, event)) = self.outputs.queue.pop_front() else {
            return Err(EngineError::Internal("no pass was launched".into()));
        };
        self.wait_event(&event)?;
        // SAFETY: the copy into this pinned buffer finished (event above); it holds n ints.
        let host = unsafe { std::slice::from_raw_parts(self.outputs.host_ptr[parity], n) };
        Ok(host.iter().map(|&t| t as u32).collect())
    }
}
