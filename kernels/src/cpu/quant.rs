//! Activation quantization: f32 rows to 8-bit blocks of 32 with one f32 scale per block.
//!
//! Every ISA produces bit-identical blocks (same scale, same round-half-to-even), so the
//! kernels differ only in f32 summation order.

use super::BLOCK;
use super::dispatch::Isa;
use super::pool::{SharedMut, num_threads, parallel_chunks_mut};

/// `n` activation rows of `nb` blocks each, structure-of-arrays.
pub(crate) struct QuantActs {
    pub nb: usize,
    /// `n * nb * 32` quants.
    pub qs: Vec<i8>,
    /// Per block: scale `d` (value ≈ d * q).
    pub d: Vec<f32>,
    /// Per block: `d * sum(q)` (for Q4_1's min).
    pub s: Vec<f32>,
    /// Per block: `sum(q)` (for the offsets of Q4_0 and packed Q8_0).
    pub sq: Vec<i32>,
}

thread_local! {
    /// Buffers of this thread's last [`QuantActs`], handed back by [`QuantActs::recycle`]: a
    /// decode step quantizes activations a few hundred times, each time the same sizes.
    static SPARE: std::cell::Cell<Option<QuantActs>> = const { std::cell::Cell::new(None) };
}

impl QuantActs {
    /// Quantizes `n` rows of `cols` values (`cols` a multiple of 32). Batches (from
    /// [`PARALLEL_BLOCKS`] blocks) are split by rows over the kernel pool. Reuses the buffers
    /// this thread last [`recycle`](QuantActs::recycle)d (every value is overwritten).
    pub fn new(isa: Isa, x: &[f32], n: usize, cols: usize) -> QuantActs {
        debug_assert!(cols.is_multiple_of(BLOCK));
        debug_assert_eq!(x.len(), n * cols);
        let nb = cols / BLOCK;
        let mut acts = SPARE.take().unwrap_or(QuantActs {
            nb,
            qs: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            sq: Vec::new(),
        });
        acts.nb = nb;
        acts.qs.resize(n * cols, 0);
        acts.d.resize(n * nb, 0.0);
        acts.s.resize(n * nb, 0.0);
        acts.sq.resize(n * nb, 0);
        let rows_per_task = if n * nb >= PARALLEL_BLOCKS {
            n.div_ceil(2 * num_threads()).max(1)
        } else {
            n.max(1)
        };
        let per_task = rows_per_task * nb;
        let (d, sq, s) = (
            SharedMut::new(&mut acts.d),
            SharedMut::new(&mut acts.sq),
            SharedMut::new(&mut acts.s),
        );
        let total = n * nb;
        parallel_chunks_mut(&mut acts.qs, (per_task * BLOCK).max(1), |t, qs| {
            let at = t * per_task;
            let len = per_task.min(total - at);
            // SAFETY: task `t` alone covers blocks `at..at + len` (its rows) of `d`, `sq`, `s`.
            let (d, sq, s) = unsafe { (d.slice(at, len), sq.slice(at, len), s.slice(at, len)) };
            quantize_rows(isa, &x[at * BLOCK..(at + len) * BLOCK], qs, d, sq, s);
        });
        acts
    }

    /// Hands the buffers back for this thread's next [`QuantActs::new`]. Large ones (a long
    /// prompt's) are dropped instead.
    pub fn recycle(self) {
        if self.qs.len() <= SPARE_MAX_QUANTS {
            SPARE.set(Some(self));
        }
    }

    /// Quants of row `i`.
    pub fn row_qs(&self, i: usize) -> &[i8] {
        &self.qs[i * self.nb * BLOCK..(i + 1) * self.nb * BLOCK]
    }

    /// Scales of row `i`.
    pub fn row_d(&self, i: usize) -> &[f32] {
        &self.d[i * self.nb..(i + 1) * self.nb]
    }

    /// `d * sum(q)` of row `i`.
    pub fn row_s(&self, i: usize) -> &[f32] {
        &self.s[i * self.nb..(i + 1) * self.nb]
    }

    /// `sum(q)` of row `i`.
    pub fn row_sq(&self, i: usize) -> &[i32] {
        &self.sq[i * self.nb..(i + 1) * self.nb]
    }
}

/// Largest activations (quants) kept by [`QuantActs::recycle`]: 64 rows of 8192 values.
const SPARE_MAX_QUANTS: usize = 64 * 8192;

/// Blocks per call from which [`QuantActs::new`] runs on the kernel pool (a batch of a few
/// rows; one row stays on the calling thread).
const PARALLEL_BLOCKS: usize = 256;

/// Quantizes the blocks of `x` into `qs`, with their scales `d`, sums `sq` and `s = d * sq`.
fn quantize_rows(isa: Isa, x: &[f32], qs: &mut [i8], d: &mut [f32], sq: &mut [i32], s: &mut [f32]) {
    let blocks = x
        .chunks_exact(BLOCK)
        .zip(qs.chunks_exact_mut(BLOCK))
        .zip(d.iter_mut().zip(sq.iter_mut()));
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => {
            for ((x, q), (d, s)) in blocks {
                // SAFETY: `Isa::Avx2`/`Avx512Vnni` are only produced after run-time detection
                // of AVX2 and FMA (see `Isa::detect`); slices are exactly one block.
                (*d, *s) = unsafe { super::x86_avx2::quantize_block(x, q) };
            }
        }
        _ => {
            for ((x, q), (d, s)) in blocks {
                (*d, *s) = quantize_block(x, q);
            }
        }
    }
    for ((s, &d), &sq) in s.iter_mut().zip(d.iter()).zip(sq.iter()) {
        *s = d * sq as f32;
    }
}

/// Quantizes one block of 32; returns `(d, sum(q))`.
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        let r = r.clamp(-127, 127);
        *q = r as i8;
        sum += r;
    }
    (d, sum)
}
