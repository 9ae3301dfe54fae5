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
mod x86 {
    //! AVX2 + FMA + F16C versions. Every function must only run after those features were
    //! detected (`Isa::detect` returned a SIMD ISA).

    use std::arch::x86_64::*;

    use half::f16;

    use super::Span;

    /// Converts `src` to f16 into `dst` (same length), round to nearest even.
    ///
    /// # Safety
    /// AVX2 and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let body = n / 8 * 8;
        for i in (0..body).step_by(8) {
            // SAFETY: `i + 8 <= n` for both slices; unaligned loads and stores.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
        }
        for i in body..n {
            dst[i] = f16::from_f32(src[i]);
        }
    }

    /// `exp(x)` on 8 lanes: Cephes' `expf` (range reduction by `ln 2` in two parts, a degree-5
    /// polynomial); relative error about 1e-7 for `x` in [-87.3, 88]. Below that range
    /// (including −∞) gives 0; above, `x` is clamped to 88.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::backend::cpu) fn exp_ps(x: __m256) -> __m256 {
        let lo = _mm256_set1_ps(-87.336_54);
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, lo);
        let x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0)), lo);
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)))
    }

    /// Sums of each of 4 vectors: `[sum a0, sum a1, sum a2, sum a3]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum4(a: [__m256; 4]) -> __m128 {
        let t0 = _mm256_hadd_ps(a[0], a[1]);
        let t1 = _mm256_hadd_ps(a[2], a[3]);
        let t = _mm256_hadd_ps(t0, t1);
        _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hmax(v: __m256) -> f32 {
        let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_max_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// 8 f16 values at `p` as f32.
    ///
    /// # Safety
    /// F16C available; 8 values readable at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes at `p`.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }

    /// Same contract as `attend_span_scalar`. `wide`: the score and `P·V` passes run on
    /// 512-bit vectors.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `sp.head_dim` a multiple of 8; with `wide`, AVX-512
    /// F/BW/VL available and `sp.head_dim` a multiple of 16; every slot's row lies within both
    /// caches; `scores` holds `sp.nh × sp.slots.len()` rounded up to 8; `o` holds
    /// `sp.nh × head_dim`; `max` and `sum` hold `sp.nh`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_span(
        sp: &Span<'_>,
        wide: bool,
        scores: &mut [f32],
        o: &mut [f32],
        max: &mut [f32],
        sum: &mut [f32],
    ) {
        let (hd, n, nh) = (sp.head_dim, sp.slots.len(), sp.nh);
        let stride = n.next_multiple_of(8);
        assert!(scores.len() >= nh * stride && o.len() >= nh * hd && max.len() >= nh);
        assert!(sum.len() >= nh && sp.q.len() >= nh * hd && hd.is_multiple_of(8));
        if n == 0 {
            o[..nh * hd].fill(0.0);
            max[..nh].fill(f32::NEG_INFINITY);
            sum[..nh].fill(0.0);
            return;
        }
        // Pass 1: scores, up to 3 heads at a time.
        let mut h0 = 0;
        while h0 < nh {
            let run = (nh - h0).min(3);
            // SAFETY: the caller's contract covers the rows and buffers read and written, and
            // the AVX-512 features when `wide`.
            unsafe {
                match (wide, run) {
                    (false, 1) => scores_run::<1>(sp, h0, scores, stride),
                    (false, 2) => scores_run::<2>(sp, h0, scores, stride),
                    (false, _) => scores_run::<3>(sp, h0, scores, stride),
                    (true, 1) => scores_run_512::<1>(sp, h0, scores, stride),
                    (true, 2) => scores_run_512::<2>(sp, h0, scores, stride),
                    (true, _) => scores_run_512::<3>(sp, h0, scores, stride),
                }
            }
            h0 += run;
        }
        // Pass 2: per head, maximum, then probabilities and their sum. Padding past `n` is −∞
        // (probability 0).
        for g in 0..nh {
            let row = &mut scores[g * stride..(g + 1) * stride];
            row[n..].fill(f32::NEG_INFINITY);
            let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
            for c in row.chunks_exact(8) {
                // SAFETY: `c` holds 8 f32.
                m = _mm256_max_ps(m, unsafe { _mm256_loadu_ps(c.as_ptr()) });
            }
            let mx = hmax(m);
            let mv = _mm256_set1_ps(mx);
            let mut total = _mm256_setzero_ps();
            for c in row.chunks_exact_mut(8) {
                // SAFETY: `c` holds 8 f32.
                unsafe {
                    let p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
                    _mm256_storeu_ps(c.as_mut_ptr(), p);
                    total = _mm256_add_ps(total, p);
                }
            }
            max[g] = mx;
            sum[g] = hsum(total);
        }
        // Pass 3: P·V, up to 3 heads and 32 dimensions (64 when `wide`) at a time.
        let mut h0 = 0;
        while wide && h0 < nh {
            let run = (nh - h0).min(3);
            let mut d0 = 0;
            while d0 < hd {
                let width = if hd - d0 >= 64 { 4 } else { 1 };
                // SAFETY: as for pass 1; `d0 + 16 * width <= hd`.
                unsafe {
                    match (run, width) {
                        (1, 4) => pv_run_512::<1, 4>(sp, h0, d0, scores, stride, o),
                        (2, 4) => pv_run_512::<2, 4>(sp, h0, d0, scores, stride, o),
                        (_, 4) => pv_run_512::<3, 4>(sp, h0, d0, scores, stride, o),
                        (1, _) => pv_run_512::<1, 1>(sp, h0, d0, scores, stride, o),
                        (2, _) => pv_run_512::<2, 1>(sp, h0, d0, scores, stride, o),
                        _ => pv_run_512::<3, 1>(sp, h0, d0, scores, stride, o),
                    }
                }
                d0 += 16 * width;
            }
            h0 += run;
        }
        while !wide && h0 < nh {
            let run = (nh - h0).min(3);
            let mut d0 = 0;
            while d0 < hd {
                let width = if hd - d0 >= 32 { 4 } else { 1 };
                // SAFETY: the caller's contract covers the rows and buffers read and written;
                // `d0 + 8 * width <= hd`.
                unsafe {
                    match (run, width) {
                        (1, 4) => pv_run::<1, 4>(sp, h0, d0, scores, stride, o),
                        (2, 4) => pv_run::<2, 4>(sp, h0, d0, scores, stride, o),
                        (_, 4) => pv_run::<3, 4>(sp, h0, d0, scores, stride, o),
                        (1, _) => pv_run::<1, 1>(sp, h0, d0, scores, stride, o),
                        (2, _) => pv_run::<2, 1>(sp, h0, d0, scores, stride, o),
                        _ => pv_run::<3, 1>(sp, h0, d0, scores, stride, o),
                    }
                }
                d0 += 8 * width;
            }
            h0 += run;
        }
    }

    /// How many keys ahead of the one in use the score pass prefetches its key and value rows
    /// (about a DRAM latency's worth of score work).
    const PREFETCH_KEYS: usize = 32;

    /// Prefetches the key row (into L1) and the value row (into L2, for pass 3) of key `j` of
    /// the span, if it has one. The cache rows are scattered over memory that the weights
    /// streamed through since the last step, so nearly every row comes from DRAM.
    #[inline(always)]
    fn prefetch_key(sp: &Span<'_>, j: usize) {
        let Some(&slot) = sp.slots.get(j) else {
            return;
        };
        let at = slot as usize * sp.stride + sp.offset;
        let k = sp.k_cache.as_ptr().wrapping_add(at) as *const i8;
        let v = sp.v_cache.as_ptr().wrapping_add(at) as *const i8;
        for off in (0..sp.head_dim * std::mem::size_of::<f16>()).step_by(64) {
            // SAFETY: SSE is part of x86-64; a prefetch is only a hint and never faults, and
            // the addresses are formed with wrapping arithmetic and never dereferenced.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(k.wrapping_add(off));
                _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(off));
            }
        }
    }

    /// How many keys ahead of the one in use the `P·V` pass pulls value rows from L2 (where
    /// the score pass put them) into L1: a sequence's decode-time slots are scattered among
    /// the batch's, so the hardware prefetchers cannot guess the next row.
    const PV_PREFETCH_KEYS: usize = 8;

    /// Prefetches (into L1) values `d0..d0 + n` of key `j`'s value row, if the span has key `j`.
    #[inline(always)]
    fn prefetch_value_l1(sp: &Span<'_>, j: usize, d0: usize, n: usize) {
        let Some(&slot) = sp.slots.get(j) else {
            return;
        };
        let at = slot as usize * sp.stride + sp.offset + d0;
        let v = sp.v_cache.as_ptr().wrapping_add(at) as *const i8;
        for off in (0..n * std::mem::size_of::<f16>()).step_by(64) {
            // SAFETY: SSE is part of x86-64; a prefetch is only a hint and never faults, and
            // the address is formed with wrapping arithmetic and never dereferenced.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(v.wrapping_add(off)) };
        }
    }

    /// Scaled scores of heads `h0..h0 + H` against every key of the span, 4 keys at a time.
    ///
    /// # Safety
    /// As `attend_span`, with `h0 + H <= sp.nh`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_run<const H: usize>(
        sp: &Span<'_>,
        h0: usize,
        scores: &mut [f32],
        stride: usize,
    ) {
        let (hd, n) = (sp.head_dim, sp.slots.len());
        let q = sp.q[h0 * hd..(h0 + H) * hd].as_ptr();
        let kc = sp.k_cache.as_ptr();
        let scale = _mm_set1_ps(sp.scale);
        (0..PREFETCH_KEYS.min(n)).for_each(|j| prefetch_key(sp, j));
        let mut j = 0;
        while j < n {
            (j + PREFETCH_KEYS..j + PREFETCH_KEYS + 4).for_each(|j| prefetch_key(sp, j));
            // Rows of keys j..j + 4; past the end, repeat the last key (results dropped).
            let rows: [*const f16; 4] = std::array::from_fn(|i| {
                let slot = sp.slots[(j + i).min(n - 1)] as usize;
                // SAFETY: the caller guarantees this slot's row lies within the cache.
                unsafe { kc.add(slot * sp.stride + sp.offset) }
            });
            let mut acc = [[_mm256_setzero_ps(); 4]; H];
            for c in (0..hd).step_by(8) {
                // SAFETY: `c + 8 <= hd` within each key row and each query head.
                unsafe {
                    let k: [__m256; 4] = std::array::from_fn(|i| load8(rows[i].add(c)));
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let qv = _mm256_loadu_ps(q.add(h * hd + c));
                        for i in 0..4 {
                            acc[i] = _mm256_fmadd_ps(qv, k[i], acc[i]);
                        }
                    }
                }
            }
            let valid = (n - j).min(4);
            for (h, acc) in acc.iter().enumerate() {
                let s = _mm_mul_ps(hsum4(*acc), scale);
                let dst = &mut scores[(h0 + h) * stride + j..];
                if valid == 4 {
                    // SAFETY: `j + 4 <= n <= stride`, so 4 floats fit in `dst`.
                    unsafe { _mm_storeu_ps(dst.as_mut_ptr(), s) };
                } else {
                    let mut tmp = [0f32; 4];
                    // SAFETY: `tmp` holds 4 floats.
                    unsafe { _mm_storeu_ps(tmp.as_mut_ptr(), s) };
                    dst[..valid].copy_from_slice(&tmp[..valid]);
                }
            }
            j += 4;
        }
    }

    /// Sums of each of 4 vectors of 16: `[sum a0, sum a1, sum a2, sum a3]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    fn hsum4_512(a: [__m512; 4]) -> __m128 {
        let half = |v: __m512| {
            _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            )
        };
        hsum4([half(a[0]), half(a[1]), half(a[2]), half(a[3])])
    }

    /// 16 f16 values at `p` as f32.
    ///
    /// # Safety
    /// AVX-512 F available; 16 values readable at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller guarantees 32 readable bytes at `p`.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }

    /// `scores_run` on 512-bit vectors: per block of 4 keys, one 16-lane accumulator per
    /// (key, head), 12 of them for 3 heads, which 32 registers hold with the key rows.
    ///
    /// # Safety
    /// As `attend_span` with `wide`, with `h0 + H <= sp.nh`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn scores_run_512<const H: usize>(
        sp: &Span<'_>,
        h0: usize,
        scores: &mut [f32],
        stride: usize,
    ) {
        let (hd, n) = (sp.head_dim, sp.slots.len());
        let q = sp.q[h0 * hd..(h0 + H) * hd].as_ptr();
        let kc = sp.k_cache.as_ptr();
        let scale = _mm_set1_ps(sp.scale);
        (0..PREFETCH_KEYS.min(n)).for_each(|j| prefetch_key(sp, j));
        let mut j = 0;
        while j < n {
            (j + PREFETCH_KEYS..j + PREFETCH_KEYS + 4).for_each(|j| prefetch_key(sp, j));
            // Rows of keys j..j + 4; past the end, repeat the last key (results dropped).
            let rows: [*const f16; 4] = std::array::from_fn(|i| {
                let slot = sp.slots[(j + i).min(n - 1)] as usize;
                // SAFETY: the caller guarantees this slot's row lies within the cache.
                unsafe { kc.add(slot * sp.stride + sp.offset) }
            });
            let mut acc = [[_mm512_setzero_ps(); 4]; H];
            for c in (0..hd).step_by(16) {
                // SAFETY: `c + 16 <= hd` within each key row and each query head.
                unsafe {
                    let k: [__m512; 4] = std::array::from_fn(|i| load16(rows[i].add(c)));
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let qv = _mm512_loadu_ps(q.add(h * hd + c));
                        for i in 0..4 {
                            acc[i] = _mm512_fmadd_ps(qv, k[i], acc[i]);
                        }
                    }
                }
            }
            let valid = (n - j).min(4);
            for (h, acc) in acc.iter().enumerate() {
                let s = _mm_mul_ps(hsum4_512(*acc), scale);
                let dst = &mut scores[(h0 + h) * stride + j..];
                if valid == 4 {
                    // SAFETY: `j + 4 <= n <= stride`, so 4 floats fit in `dst`.
                    unsafe { _mm_storeu_ps(dst.as_mut_ptr(), s) };
                } else {
                    let mut tmp = [0f32; 4];
                    // SAFETY: `tmp` holds 4 floats.
                    unsafe { _mm_storeu_ps(tmp.as_mut_ptr(), s) };
                    dst[..valid].copy_from_slice(&tmp[..valid]);
                }
            }
            j += 4;
        }
    }

    /// `pv_run` on 512-bit vectors: `o[h][d0..d0 + 16W] = sum_j p[h][j] v_j[d0..d0 + 16W]`
    /// for heads `h0..h0 + H`.
    ///
    /// # Safety
    /// As `attend_span` with `wide`, with `h0 + H <= sp.nh` and `d0 + 16 * W <= head_dim`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    // Index loops keep the accumulators in registers: one value vector feeds every head.
    #[allow(clippy::needless_range_loop)]
    unsafe fn pv_run_512<const H: usize, const W: usize>(
        sp: &Span<'_>,
        h0: usize,
        d0: usize,
        probs: &[f32],
        stride: usize,
        o: &mut [f32],
    ) {
        let hd = sp.head_dim;
        let vc = sp.v_cache.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); W]; H];
        for (j, &slot) in sp.slots.iter().enumerate() {
            prefetch_value_l1(sp, j + PV_PREFETCH_KEYS, d0, 16 * W);
            // SAFETY: the slot's row lies within the cache and `d0 + 16W <= head_dim`; `j` is
            // within each head's row of `probs`.
            unsafe {
                let row = vc.add(slot as usize * sp.stride + sp.offset + d0);
                let p: [__m512; H] = std::array::from_fn(|h| {
                    _mm512_set1_ps(*probs.get_unchecked((h0 + h) * stride + j))
                });
                for w in 0..W {
                    let v = load16(row.add(16 * w));
                    for h in 0..H {
                        acc[h][w] = _mm512_fmadd_ps(p[h], v, acc[h][w]);
                    }
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (w, a) in acc.iter().enumerate() {
                let dst = &mut o[(h0 + h) * hd + d0 + 16 * w..][..16];
                // SAFETY: `dst` holds 16 floats.
                unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *a) };
            }
        }
    }

    /// `o[h][d0..d0 + 8W] = sum_j p[h][j] v_j[d0..d0 + 8W]` for heads `h0..h0 + H`.
    ///
    /// # Safety
    /// As `attend_span`, with `h0 + H <= sp.nh` and `d0 + 8 * W <= head_dim`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    // Index loops keep the accumulators in registers: one value vector feeds every head.
    #[allow(clippy::needless_range_loop)]
    unsafe fn pv_run<const H: usize, const W: usize>(
        sp: &Span<'_>,
        h0: usize,
        d0: usize,
        probs: &[f32],
        stride: usize,
        o: &mut [f32],
    ) {
        let hd = sp.head_dim;
        let vc = sp.v_cache.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); W]; H];
        for (j, &slot) in sp.slots.iter().enumerate() {
            prefetch_value_l1(sp, j + PV_PREFETCH_KEYS, d0, 8 * W);
            // SAFETY: the slot's row lies within the cache and `d0 + 8W <= head_dim`; `j` is
            // within each head's row of `probs`.
            unsafe {
                let row = vc.add(slot as usize * sp.stride + sp.offset + d0);
                let p: [__m256; H] = std::array::from_fn(|h| {
                    _mm256_set1_ps(*probs.get_unchecked((h0 + h) * stride + j))
                });
                for w in 0..W {
                    let v = load8(row.add(8 * w));
                    for h in 0..H {
                        acc[h][w] = _mm256_fmadd_ps(p[h], v, acc[h][w]);
                    }
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (w, a) in acc.iter().enumerate() {
                let dst = &mut o[(h0 + h) * hd + d0 + 8 * w..][..8];
                // SAFETY: `dst` holds 8 floats.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), *a) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_key_returns_its_value() {
        let q = [1.0f32, 0.0];
        let k = [f16::from_f32(0.5), f16::from_f32(0.5)];
        let v = [f16::from_f32(7.0), f16::from_f32(-3.0)];
        let toks = [1u32];
        let slots = [0u32];
        let batch = [SeqInput {
            tokens: &toks,
            start_pos: 0,
            kv_slots: &slots,
            num_logits: 1,
            prompt: true,
        }];
        let mut out = [0f32; 2];
        attention(&q, &k, &v, &batch, 1, 1, 2, &mut out, 1);
        assert_eq!(out, [7.0, -3.0]);
    }

    /// Plain softmax attention in f64, one query head at a time, for comparison.
    fn naive(
        q: &[f32],
        k: &[f16],
        v: &[f16],
        batch: &[SeqInput<'_>],
        heads: usize,
        kv_heads: usize,
        hd: usize,
    ) -> Vec<f32> {
        let mut out = Vec::new();
        for s in batch {
            for i in 0..s.tokens.len() {
                let t = out.len() / (heads * hd);
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let qh = &q[t * heads * hd + h * hd..][..hd];
                    let slots = &s.kv_slots[..=s.start_pos + i];
                    let cap = k.len() / (kv_heads * hd);
                    let at = |sl: u32, d: usize| cache_row(kvh, sl as usize, cap, hd) + d;
                    let scores: Vec<f64> = slots
                        .iter()
                        .map(|&sl| {
                            (0..hd)
                                .map(|d| qh[d] as f64 * k[at(sl, d)].to_f64())
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let w: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = w.iter().sum();
                    for d in 0..hd {
                        let acc: f64 = slots
                            .iter()
                            .zip(&w)
                            .map(|(&sl, wi)| wi * v[at(sl, d)].to_f64())
                            .sum();
                        out.push((acc / z) as f32);
                    }
                }
            }
        }
        out
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }

    /// Attention of `heads`/`kv_heads`/`hd` on a prompt of 3 tokens from scratch and `new`
    /// tokens after `cached` ones on scattered slots, against `naive`.
    fn check(heads: usize, kv_heads: usize, hd: usize, cached: usize, new: usize, amp: f32) {
        check_on(heads, kv_heads, hd, cached, new, amp, 1);
    }

    fn check_on(
        heads: usize,
        kv_heads: usize,
        hd: usize,
        cached: usize,
        new: usize,
        amp: f32,
        threads: usize,
    ) {
        let mut rng = Rng(12345 + (heads * 1000 + hd * 10 + cached) as u64);
        let slots_cap = cached + new + 3 + 7;
        let kv = |rng: &mut Rng| -> Vec<f16> {
            (0..slots_cap * kv_heads * hd)
                .map(|_| f16::from_f32(amp * rng.next()))
                .collect()
        };
        let k = kv(&mut rng);
        let v = kv(&mut rng);
        let toks_a = [1u32, 2, 3];
        let slots_a = [7u32, 3, (slots_cap - 1) as u32];
        let toks_b = vec![4u32; new];
        // A scattered permutation of the remaining slots.
        let slots_b: Vec<u32> = (0..slots_cap as u32)
            .filter(|s| !slots_a.contains(s))
            .map(|s| (s * 7919) % slots_cap as u32)
            .filter(|s| !slots_a.contains(s))
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .rev()
            .take(cached + new)
            .collect();
        assert_eq!(slots_b.len(), cached + new);
        let batch = [
            SeqInput {
                tokens: &toks_a,
                start_pos: 0,
                kv_slots: &slots_a,
                num_logits: 1,
                prompt: true,
            },
            SeqInput {
                tokens: &toks_b,
                start_pos: cached,
                kv_slots: &slots_b,
                num_logits: 1,
                prompt: true,
            },
        ];
        let q: Vec<f32> = (0..(3 + new) * heads * hd)
            .map(|_| amp * rng.next())
            .collect();
        let want = naive(&q, &k, &v, &batch, heads, kv_heads, hd);
        let mut out = vec![f32::NAN; q.len()];
        attention(&q, &k, &v, &batch, heads, kv_heads, hd, &mut out, threads);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5 * amp.max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn grouped_attention_matches_plain_softmax() {
        check(6, 2, 8, 5, 2, 1.0);
        check(9, 3, 64, 37, 3, 1.0);
        // Group of 4 (a run of 3 heads and one of 1), head_dim 40 (a 32-wide and an 8-wide
        // chunk), large scores.
        check(8, 2, 40, 20, 1, 4.0);
        // A group beyond MAX_GROUP (two runs).
        check(18, 1, 16, 9, 2, 1.0);
        // Head dimension not a multiple of 8 (portable path).
        check(4, 2, 6, 11, 1, 1.0);
    }

    #[test]
    fn key_prefetch_shares_cover_every_row_once() {
        let toks = [1u32; 2];
        let a: Vec<u32> = vec![5, 6, 7, 20, 21, 9, 0, 0];
        let b: Vec<u32> = vec![40, 41, 42, 43, 44, 45, 46, 47, 3, 4];
        let batch = [
            SeqInput {
                tokens: &toks,
                start_pos: 6,
                kv_slots: &a,
                num_logits: 1,
                prompt: true,
            },
            SeqInput {
                tokens: &toks,
                start_pos: 8,
                kv_slots: &b,
                num_logits: 1,
                prompt: true,
            },
        ];
        let runs = KvRuns::new(&batch);
        let mut want: Vec<(usize, usize)> = (0..3)
            .flat_map(|h| a[..6].iter().chain(&b[..8]).map(move |&s| (h, s as usize)))
            .collect();
        want.sort_unstable();
        for of in [1, 2, 5, 7, 100] {
            let mut got = Vec::new();
            for i in 0..of {
                runs.share(3, i, of, |h, first, n| {
                    got.extend((first..first + n).map(|s| (h, s)))
                });
            }
            got.sort_unstable();
            assert_eq!(got, want, "{of} shares");
        }
    }

    #[test]
    fn split_contexts_match_plain_softmax() {
        // Few tasks: contexts are split into spans when there are several threads (also the
        // prompt's, into empty spans beyond its 3 keys).
        check_on(3, 1, 64, 700, 1, 2.0, 2);
        check_on(9, 3, 64, 300, 1, 1.0, 2);
        check_on(9, 3, 64, 300, 1, 1.0, 16);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_is_accurate() {
        if Isa::detect() == Isa::Scalar {
            return;
        }
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 87.8 {
            let xs: [f32; 8] = std::array::from_fn(|i| x + i as f32 * 0.0137);
            let mut got = [0f32; 8];
            // SAFETY: a SIMD ISA implies AVX2 and FMA; `got` holds 8 floats.
            unsafe {
                use std::arch::x86_64::*;
                let v = _mm256_loadu_ps(xs.as_ptr());
                _mm256_storeu_ps(got.as_mut_ptr(), x86::exp_ps(v));
            }
            for (&xi, &g) in xs.iter().zip(&got) {
                let want = (xi as f64).exp();
                worst = worst.max(((g as f64 - want) / want).abs());
            }
            x += 0.1;
        }
        assert!(worst < 1e-6, "relative error {worst}");
        let mut got = [1f32; 8];
        // SAFETY: as above.
        unsafe {
            use std::arch::x86_64::*;
            let v = _mm256_set1_ps(f32::NEG_INFINITY);
            _mm256_storeu_ps(got.as_mut_ptr(), x86::exp_ps(v));
        }
        assert_eq!(got, [0.0; 8]);
    }
}
