//! Causal attention of new tokens over the slot-indexed KV cache, which holds keys and values
//! as f16 (like llama.cpp's default cache): half the memory traffic of f32, and at batched
//! decode the cache, not the weights, is most of what a step reads. Each cache is head-major,
//! `[KV head][slot][head_dim]`: a task reads one KV head's rows, and a sequence's slots are
//! mostly consecutive, so those rows are mostly one contiguous run of memory that streams at
//! full bandwidth (slot-major rows would interleave the other heads' bytes, which the hardware
//! prefetchers fetch too).
//!
//! One task is one (new token, KV head, run of query heads sharing it, span of the context).
//! It runs in two passes over the span:
//! 1. scores: blocks of 4 keys against up to 3 query heads at once, with one 8-lane FMA
//!    accumulator per (key, head) summed over the head dimension and reduced across lanes only
//!    once per block (a `hadd` tree turns 4 accumulators into 4 scores), each key row converted
//!    from f16 once for all heads of the run;
//! 2. per head, the maximum, then `exp(score - max)` 8 lanes at a time (a polynomial, see
//!    [`exp_ps`]) and the sum; then `P·V` with the probabilities broadcast against each value
//!    row, again one conversion of the row for all heads.
//!
//! A context is cut into chunks of [`KV_CHUNK`] keys from its first position, whatever else is
//! in the batch; each chunk gives a partial result (unnormalized output, maximum and sum per
//! head), and the partials are folded into the output in chunk order ([`Fold`]). Every bit of
//! a token's output therefore depends on its own context alone, not on the batch, the chunks
//! its prompt was computed in or the thread count: greedy decoding is batch-invariant. When
//! there are fewer tasks than threads can share evenly (batch-1 decode: one task per KV head),
//! the chunks run as tasks of their own and are folded at the end, as in split-K "flash
//! decoding"; otherwise one task folds its chunks as it goes. Scores live in a small per-thread
//! buffer (heads × chunk).
//!
//! The score pass prefetches each key row into L1 and its value row into L2 32 keys ahead:
//! between two steps the weights stream through the caches, so cache rows come from DRAM.
//!
//! The AVX2 + FMA + F16C path is chosen at run time ([`Isa::detect`], so `SGL_CPU_ISA=scalar`
//! turns it off); with AVX-512 (and `head_dim` a multiple of 16) the score and `P·V` passes use
//! 16-lane accumulators, whose 32 registers hold a block's accumulators without spilling (the
//! 8-lane versions spill with 3 heads). The scalar path computes the same quantities with
//! `f32::exp`.

use std::cell::RefCell;

use half::f16;

use crate::backend::SeqInput;
use sgl_kernels::cpu::{Isa, SharedMut, parallel_for};

/// Query heads one task handles against one KV head.
const MAX_GROUP: usize = 16;
/// Keys per context chunk (see the module documentation). Contexts up to this long take one
/// pass, exactly as without chunks; beyond it, folding a chunk costs one rescale of the
/// output per head (under 1% of the chunk's work at head dimension 64).
pub const KV_CHUNK: usize = 128;
/// Most floats of partial results a split call keeps (4 MiB); beyond it each task folds its
/// own chunks, which gives the same bits.
const MAX_PARTIAL: usize = 1 << 20;

/// Converts `src` to f16 (round to nearest even) into `dst` (same length).
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if Isa::detect() != Isa::Scalar {
        // SAFETY: `Isa::detect` returns a SIMD ISA only after detecting AVX2, FMA and F16C.
        unsafe { x86::f32_to_f16(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s);
    }
}

/// Offset of KV head `kv_head`'s row of slot `slot` in a cache of `capacity` slots.
pub fn cache_row(kv_head: usize, slot: usize, capacity: usize, head_dim: usize) -> usize {
    (kv_head * capacity + slot) * head_dim
}

/// The cached rows a batch's attention reads (the slots of every sequence's positions before
/// its new tokens), as runs of consecutive slots, for prefetching one layer's key rows while
/// the previous layer's batched products run: those are compute-bound, while attention over a
/// batch is bound by reading the rows from DRAM. (The score pass itself prefetches each value
/// row while it reads the key row; prefetching values here too measured no better, the extra
/// traffic slowing the products down.)
pub struct KvRuns {
    /// `(first slot, slots)`.
    runs: Vec<(usize, usize)>,
    /// Rows before each run.
    before: Vec<usize>,
    rows: usize,
}

impl KvRuns {
    pub fn new(batch: &[SeqInput<'_>]) -> KvRuns {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for s in batch {
            for &slot in &s.kv_slots[..s.start_pos.min(s.kv_slots.len())] {
                let slot = slot as usize;
                match runs.last_mut() {
                    Some((first, len)) if *first + *len == slot => *len += 1,
                    _ => runs.push((slot, 1)),
                }
            }
        }
        let mut before = Vec::with_capacity(runs.len());
        let mut rows = 0;
        for &(_, len) in &runs {
            before.push(rows);
            rows += len;
        }
        KvRuns { runs, before, rows }
    }

    /// Prefetches (into L2) share `i` of `of` of the key rows of one layer's cache
    /// (`kv_heads × capacity × head_dim`, see [`cache_row`]). The shares cover every row of
    /// every KV head once.
    pub fn prefetch_keys(
        &self,
        k_cache: CacheAddress,
        kv_heads: usize,
        head_dim: usize,
        i: usize,
        of: usize,
    ) {
        if kv_heads == 0 || head_dim == 0 {
            return;
        }
        let capacity = k_cache.len / (kv_heads * head_dim);
        let row_bytes = head_dim * std::mem::size_of::<f16>();
        self.share(kv_heads, i, of, |head, first, n| {
            let at = cache_row(head, first, capacity, head_dim);
            let start = k_cache.ptr.wrapping_add(at) as *const u8;
            for off in (0..n * row_bytes).step_by(64) {
                prefetch_l2(start.wrapping_add(off));
            }
        });
    }

    /// Calls `f(kv_head, first slot, slots)` for the runs of share `i` of `of` of the rows of
    /// all `kv_heads` heads (rows `u % rows` of head `u / rows` for `u` in the share's range).
    fn share(&self, kv_heads: usize, i: usize, of: usize, mut f: impl FnMut(usize, usize, usize)) {
        let units = kv_heads * self.rows;
        if units == 0 || of == 0 {
            return;
        }
        let (from, to) = (i * units / of, ((i + 1) * units / of).min(units));
        let mut u = from;
        while u < to {
            let head = u / self.rows;
            let (r0, r1) = (u % self.rows, (to - head * self.rows).min(self.rows));
            let mut run = self.before.partition_point(|&b| b <= r0).saturating_sub(1);
            let mut r = r0;
            while r < r1 {
                let (first, len) = self.runs[run];
                let in_run = r - self.before[run];
                let n = (len - in_run).min(r1 - r);
                f(head, first + in_run, n);
                r += n;
                run += 1;
            }
            u = head * self.rows + r1;
        }
    }
}

/// Where one layer's cache lies, for prefetches only: never read through, so it may be held
/// while other threads write the cache.
#[derive(Clone, Copy)]
pub struct CacheAddress {
    ptr: *const f16,
    len: usize,
}

// SAFETY: the address is only used for prefetch hints, never dereferenced.
unsafe impl Send for CacheAddress {}
// SAFETY: as above.
unsafe impl Sync for CacheAddress {}

impl CacheAddress {
    pub fn of(cache: &[f16]) -> CacheAddress {
        CacheAddress {
            ptr: cache.as_ptr(),
            len: cache.len(),
        }
    }

    pub(super) fn of_shared(cache: &SharedMut<'_, f16>) -> CacheAddress {
        CacheAddress {
            ptr: cache.as_ptr(),
            len: cache.len(),
        }
    }
}

/// Prefetches the cache line at `p` into L2 (a no-op off x86-64).
#[inline(always)]
fn prefetch_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a prefetch is only a hint and never faults, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The shapes one call works on.
#[derive(Clone, Copy)]
struct Dims {
    kv_heads: usize,
    /// Query heads per KV head.
    group: usize,
    /// Runs of at most `MAX_GROUP` query heads per KV head.
    runs: usize,
    /// Tasks per (token, KV head, run): one per chunk of the longest context, or 1.
    splits: usize,
    qd: usize,
    head_dim: usize,
    scale: f32,
}

impl Dims {
    /// Task `task` as (token, KV head, first query head, query heads, chunk index).
    fn task(&self, task: usize) -> (usize, usize, usize, usize, usize) {
        let split = task % self.splits;
        let rest = task / self.splits;
        let run = rest % self.runs;
        let rest = rest / self.runs;
        let (t, kvh) = (rest / self.kv_heads, rest % self.kv_heads);
        let h0 = kvh * self.group + run * MAX_GROUP;
        let nh = (self.group - run * MAX_GROUP).min(MAX_GROUP);
        (t, kvh, h0, nh, split)
    }

    /// Floats of one task's partial result: per head `head_dim` outputs, the maximum and sum.
    fn partial_len(&self) -> usize {
        self.group.min(MAX_GROUP) * (self.head_dim + 2)
    }
}

thread_local! {
    /// Scores (then probabilities) of the current chunk, `heads × chunk` rounded up, and the
    /// chunk's unnormalized output while it waits to be folded.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Causal attention of each new token over its sequence's cached keys/values.
///
/// `q` holds `heads × head_dim` per new token (tokens of all sequences, in batch order); the KV
/// caches hold `kv_heads × capacity × head_dim` f16 values (KV head `h`, slot `s` at
/// `(h * capacity + s) * head_dim`, see [`cache_row`]). Query head `h` reads KV head
/// `h / (heads / kv_heads)`. Writes `out` in `q`'s layout. Contexts are split into spans when
/// there are too few tasks to keep `threads` threads busy; 1 keeps every context whole.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    batch: &[SeqInput<'_>],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    out: &mut [f32],
    threads: usize,
) {
    assert!(kv_heads > 0 && heads.is_multiple_of(kv_heads) && head_dim > 0);
    let qd = heads * head_dim;
    let kvd = kv_heads * head_dim;
    let capacity = k_cache.len() / kvd;
    assert_eq!(q.len(), out.len(), "attention: q and out differ in length");
    assert!(
        q.len().is_multiple_of(qd),
        "attention: q is not whole tokens"
    );
    assert_eq!(
        k_cache.len(),
        v_cache.len(),
        "attention: K and V caches differ"
    );
    // (sequence index, position) of each new token.
    let mut owners = Vec::with_capacity(q.len() / qd);
    for (si, s) in batch.iter().enumerate() {
        let end = s.start_pos + s.tokens.len();
        assert!(
            s.kv_slots[..end].iter().all(|&x| (x as usize) < capacity),
            "attention: KV slot out of range"
        );
        owners.extend((s.start_pos..end).map(|p| (si, p)));
    }
    assert_eq!(
        owners.len() * qd,
        q.len(),
        "attention: q does not match the batch"
    );
    let group = heads / kv_heads;
    let runs = group.div_ceil(MAX_GROUP);
    let base_tasks = owners.len() * kv_heads * runs;
    let mut dims = Dims {
        kv_heads,
        group,
        runs,
        splits: 1,
        qd,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    // Run chunks as tasks of their own when there are too few tasks to keep every thread busy.
    let longest = owners.iter().map(|&(_, p)| p + 1).max().unwrap_or(0);
    let chunks = longest.div_ceil(KV_CHUNK).max(1);
    if threads > 1
        && base_tasks < 4 * threads
        && chunks > 1
        && base_tasks * chunks * dims.partial_len() <= MAX_PARTIAL
    {
        dims.splits = chunks;
    }
    let fast =
        cfg!(target_arch = "x86_64") && Isa::detect() != Isa::Scalar && head_dim.is_multiple_of(8);
    // 512-bit vectors: 32 registers hold a tile's accumulators without spilling.
    let wide = fast && Isa::detect() == Isa::Avx512Vnni && head_dim.is_multiple_of(16);
    let splits = dims.splits;
    let n_tasks = base_tasks * splits;
    let mut partial = if splits > 1 {
        vec![0f32; n_tasks * dims.partial_len()]
    } else {
        Vec::new()
    };
    let out_sh = SharedMut::new(out);
    let partial_sh = SharedMut::new(&mut partial);
    let owners = &owners;
    parallel_for(n_tasks, |task| {
        let (t, kvh, h0, nh, split) = dims.task(task);
        let (si, pos) = owners[t];
        let slots = &batch[si].kv_slots[..=pos];
        let span = |from: usize| Span {
            q: &q[t * qd + h0 * head_dim..t * qd + (h0 + nh) * head_dim],
            nh,
            slots: &slots[from..(from + KV_CHUNK).min(slots.len())],
            k_cache,
            v_cache,
            offset: cache_row(kvh, 0, capacity, head_dim),
            stride: head_dim,
            head_dim,
            scale: dims.scale,
        };
        let mut max = [0f32; MAX_GROUP];
        let mut sum = [0f32; MAX_GROUP];
        SCRATCH.with_borrow_mut(|(scores, chunk_out)| {
            let need = nh * KV_CHUNK.min(slots.len()).next_multiple_of(8);
            if scores.len() < need {
                scores.resize(need, 0.0);
            }
            if splits > 1 {
                // This task is chunk `split` of the context (empty past its end: sum 0, which
                // the fold skips).
                let from = split * KV_CHUNK;
                if from >= slots.len() {
                    return;
                }
                // SAFETY: this task alone writes partial record `task` (outputs, then stats).
                let (o, st) = unsafe {
                    (
                        partial_sh.slice(task * dims.partial_len(), nh * head_dim),
                        partial_sh.slice(task * dims.partial_len() + nh * head_dim, 2 * nh),
                    )
                };
                attend(&span(from), fast, wide, scores, o, &mut max, &mut sum);
                st[..nh].copy_from_slice(&max[..nh]);
                st[nh..].copy_from_slice(&sum[..nh]);
                return;
            }
            // SAFETY: without splits this task alone writes heads `h0..h0 + nh` of token `t`.
            let o = unsafe { out_sh.slice(t * qd + h0 * head_dim, nh * head_dim) };
            if chunk_out.len() < nh * head_dim {
                chunk_out.resize(nh * head_dim, 0.0);
            }
            let chunk_out = &mut chunk_out[..nh * head_dim];
            let mut fold = Fold::new(nh);
            for from in (0..slots.len()).step_by(KV_CHUNK) {
                attend(
                    &span(from),
                    fast,
                    wide,
                    scores,
                    chunk_out,
                    &mut max,
                    &mut sum,
                );
                fold.add(o, head_dim, chunk_out, &max, &sum);
            }
            fold.finish(o, head_dim);
        });
    });
    if splits > 1 {
        merge_splits(&dims, &partial, base_tasks, out);
    }
}

/// One chunk's unnormalized output, maximum and sum per head (see [`Span`]).
fn attend(
    span: &Span<'_>,
    fast: bool,
    wide: bool,
    scores: &mut [f32],
    o: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` implies AVX2, FMA and F16C were detected (`Isa::detect`) and
        // `head_dim` is a multiple of 8; `wide` that AVX-512 F/BW/VL were too and it is a
        // multiple of 16; slots were checked against the caches by `attention`.
        unsafe { x86::attend_span(span, wide, scores, o, max, sum) };
        return;
    }
    let _ = (fast, wide);
    attend_span_scalar(span, scores, o, max, sum);
}

/// The running combination of a context's chunks, in chunk order, for `nh` heads: the output
/// accumulated so far (held in the caller's buffer), its maximum score and sum per head. The
/// same arithmetic whether the chunks ran in one task or in many, so both give the same bits.
struct Fold {
    nh: usize,
    max: [f32; MAX_GROUP],
    sum: [f32; MAX_GROUP],
}

impl Fold {
    fn new(nh: usize) -> Fold {
        Fold {
            nh,
            max: [f32::NEG_INFINITY; MAX_GROUP],
            sum: [0.0; MAX_GROUP],
        }
    }

    /// Adds a chunk (`o`: `nh × hd` unnormalized outputs, its maxima and sums) into `acc`.
    /// The first chunk is copied as it is, so a one-chunk context gives exactly one pass's
    /// result; later ones rescale both sides to the larger maximum.
    fn add(&mut self, acc: &mut [f32], hd: usize, o: &[f32], max: &[f32], sum: &[f32]) {
        for g in 0..self.nh {
            let (a, b) = (&mut acc[g * hd..(g + 1) * hd], &o[g * hd..(g + 1) * hd]);
            if sum[g] == 0.0 {
                continue;
            }
            if self.sum[g] == 0.0 {
                a.copy_from_slice(b);
                self.max[g] = max[g];
                self.sum[g] = sum[g];
                continue;
            }
            let m = self.max[g].max(max[g]);
            let (wa, wb) = ((self.max[g] - m).exp(), (max[g] - m).exp());
            for (x, &y) in a.iter_mut().zip(b) {
                *x = *x * wa + y * wb;
            }
            self.sum[g] = self.sum[g] * wa + sum[g] * wb;
            self.max[g] = m;
        }
    }

    /// Normalizes `acc` by the sums (a head that saw no keys gives zeros).
    fn finish(&self, acc: &mut [f32], hd: usize) {
        for (g, og) in acc.chunks_exact_mut(hd).take(self.nh).enumerate() {
            if self.sum[g] > 0.0 {
                let inv = 1.0 / self.sum[g];
                og.iter_mut().for_each(|v| *v *= inv);
            } else {
                og.fill(0.0);
            }
        }
    }
}

/// Folds the chunk records of each (token, KV head, run) in order into `out`.
fn merge_splits(dims: &Dims, partial: &[f32], base_tasks: usize, out: &mut [f32]) {
    let hd = dims.head_dim;
    let plen = dims.partial_len();
    let mut max = [0f32; MAX_GROUP];
    let mut sum = [0f32; MAX_GROUP];
    for base in 0..base_tasks {
        let (t, _, h0, nh, _) = dims.task(base * dims.splits);
        let records = &partial[base * dims.splits * plen..(base + 1) * dims.splits * plen];
        let o = &mut out[t * dims.qd + h0 * hd..][..nh * hd];
        let mut fold = Fold::new(nh);
        for r in records.chunks_exact(plen) {
            max[..nh].copy_from_slice(&r[nh * hd..nh * hd + nh]);
            sum[..nh].copy_from_slice(&r[nh * hd + nh..nh * hd + 2 * nh]);
            fold.add(o, hd, &r[..nh * hd], &max, &sum);
        }
        fold.finish(o, hd);
    }
}

/// One task's inputs: `nh` query heads (`q`, `nh × head_dim`) against the keys and values of
/// `slots` for the KV head whose rows start at `offset`, slot `s`'s at `offset + s * stride`.
struct Span<'a> {
    q: &'a [f32],
    nh: usize,
    slots: &'a [u32],
    k_cache: &'a [f16],
    v_cache: &'a [f16],
    offset: usize,
    stride: usize,
    head_dim: usize,
    scale: f32,
}

/// Portable version of the span kernel: writes the unnormalized output `sum_j p_j v_j` of each
/// head to `o`, and each head's maximum score and `sum_j p_j` (`p_j = exp(s_j - max)`) to
/// `max` and `sum`. An empty span gives zeros, maximum −∞ and sum 0.
fn attend_span_scalar(
    sp: &Span<'_>,
    scores: &mut [f32],
    o: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    let (hd, n) = (sp.head_dim, sp.slots.len());
    let stride = n.next_multiple_of(8);
    let mut k = vec![0f32; hd];
    for (j, &slot) in sp.slots.iter().enumerate() {
        let base = slot as usize * sp.stride + sp.offset;
        for (kv, h) in k.iter_mut().zip(&sp.k_cache[base..base + hd]) {
            *kv = h.to_f32();
        }
        for g in 0..sp.nh {
            let qg = &sp.q[g * hd..(g + 1) * hd];
            let s: f32 = qg.iter().zip(&k).map(|(a, b)| a * b).sum();
            scores[g * stride + j] = s * sp.scale;
        }
    }
    for g in 0..sp.nh {
        let row = &mut scores[g * stride..g * stride + n];
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for s in row.iter_mut() {
            *s = (*s - m).exp();
            total += *s;
        }
        max[g] = m;
        sum[g] = total;
    }
    o.fill(0.0);
    for (j, &slot) in sp.slots.iter().enumerate() {
        let base = slot as usize * sp.stride + sp.offset;
        for (kv, h) in k.iter_mut().zip(&sp.v_cache[base..base + hd]) {
            *kv = h.to_f32();
        }
        for g in 0..sp.nh {
            let p = scores[g * stride + j];
            for (a, &v) in o[g * hd..(g + 1) * hd].iter_mut().zip(&k) {
                *a += p * v;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::exp_ps;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
