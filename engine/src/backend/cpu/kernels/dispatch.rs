//! Run-time choice of the instruction set, and the split of a product over threads and tiles.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use super::packed::{self, GROUP};
use super::pool::{num_threads, parallel_for};
use super::quant::QuantActs;
use super::{Weight, scalar};

#[cfg(target_arch = "x86_64")]
use super::x86_quant::MAX_T;
#[cfg(not(target_arch = "x86_64"))]
const MAX_T: usize = 4;

/// Instruction set the kernels use, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust; every architecture.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX2 + FMA + F16C and AVX-512 F/BW/VL/VNNI (`vpdpbusd` on 512-bit vectors).
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU supports, detected once. The environment variable
    /// `SGL_CPU_ISA` (`scalar`, `avx2`, `avx512`) caps it, for debugging and comparisons.
    pub fn detect() -> Isa {
        static CACHE: AtomicU8 = AtomicU8::new(u8::MAX);
        let cached = CACHE.load(Ordering::Relaxed);
        if let Some(isa) = Isa::from_u8(cached) {
            return isa;
        }
        let mut isa = Isa::best_supported();
        if let Ok(cap) = std::env::var("SGL_CPU_ISA") {
            let cap = match cap.to_ascii_lowercase().as_str() {
                "scalar" => Isa::Scalar,
                "avx2" => Isa::Avx2,
                _ => Isa::Avx512Vnni,
            };
            isa = isa.min(cap);
        }
        CACHE.store(isa as u8, Ordering::Relaxed);
        isa
    }

    fn from_u8(v: u8) -> Option<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .find(|i| *i as u8 == v)
    }

    /// Every instruction set this CPU can run (for tests and benchmarks).
    pub fn all_supported() -> Vec<Isa> {
        let best = Isa::best_supported();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| *i <= best)
            .collect()
    }

    fn best_supported() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                    return Isa::Avx512Vnni;
                }
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }
}

/// `matmul` on a given instruction set (which must be one of [`Isa::all_supported`]).
pub(crate) fn matmul_with(isa: Isa, w: &Weight, x: &[f32], n: usize, out: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(
        x.len(),
        n * cols,
        "matmul: x has {} values, expected n ({n}) x cols ({cols})",
        x.len()
    );
    assert_eq!(
        out.len(),
        n * rows,
        "matmul: out has {} values, expected n ({n}) x rows ({rows})",
        out.len()
    );
    assert!(
        isa <= Isa::best_supported(),
        "matmul: {isa:?} not supported"
    );
    if n == 0 || rows == 0 {
        return;
    }
    if cols == 0 {
        out.fill(0.0);
        return;
    }
    let out = OutPtr {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    if w.format().is_quantized() {
        let acts = QuantActs::new(isa, x, n, cols);
        matmul_packed(isa, w, &acts, n, &out);
    } else {
        for_row_tiles(rows, n, w.size_bytes() * n, |tile, i| {
            // SAFETY: tiles are disjoint row ranges and each (tile, i) pair is visited once, so
            // no two calls get overlapping output.
            let o = unsafe { out.slice(i * rows + tile.start, tile.len()) };
            dot_rows_float(isa, w, tile, &x[i * cols..(i + 1) * cols], o);
        });
    }
}

/// Activation rows per pass over a chunk of row groups: their quants stay in L2 while the
/// chunk's weights are reused from L1/L2 for each tile of `MAX_T` rows.
const TOKENS_PER_PASS: usize = 64;
/// Upper bound on the packed weight bytes of one task (so they stay in L2 across passes).
const CHUNK_BYTES: usize = 256 << 10;

/// Products smaller than this (weight bytes × activation rows) run on the calling thread only:
/// waking a helper costs about as much as the work (1-2 µs).
const SERIAL_BELOW: usize = 24 << 10;

/// Block-quantized product on packed weights: tasks are chunks of row groups.
fn matmul_packed(isa: Isa, w: &Weight, acts: &QuantActs, n: usize, out: &OutPtr) {
    let chunks = group_chunks(w, n, 1.0);
    parallel_for(chunks.len(), |c| {
        run_group_chunk(isa, w, acts, n, chunks[c].clone(), out)
    });
}

/// Several block-quantized weights with the same columns against the same activations: one
/// activation quantization and one pool job for all of them.
pub(crate) fn matmul_packed_multi(
    isa: Isa,
    ws: &[&Weight],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
) {
    let cols = ws[0].cols();
    let acts = QuantActs::new(isa, x, n, cols);
    let outs: Vec<OutPtr> = outs
        .iter_mut()
        .map(|o| OutPtr {
            ptr: o.as_mut_ptr(),
            len: o.len(),
        })
        .collect();
    let total_bytes: usize = ws.iter().map(|w| w.size_bytes()).sum();
    let tasks: Vec<(usize, Range<usize>)> = ws
        .iter()
        .enumerate()
        .flat_map(|(k, w)| {
            // Each weight's share of about four chunks per thread.
            let share = w.size_bytes() as f64 / total_bytes.max(1) as f64;
            group_chunks(w, n, share).into_iter().map(move |c| (k, c))
        })
        .collect();
    parallel_for(tasks.len(), |t| {
        let (k, ref chunk) = tasks[t];
        run_group_chunk(isa, ws[k], &acts, n, chunk.clone(), &outs[k]);
    });
}

/// Chunks of row groups of `w` for `n` activation rows; `share` is the fraction of the
/// call's work this weight is (for splitting several weights in one job).
fn group_chunks(w: &Weight, n: usize, share: f64) -> Vec<Range<usize>> {
    let groups = w.rows().div_ceil(GROUP);
    let group_bytes = w.group_data(0).len().max(1);
    let threads = if w.size_bytes() * n < SERIAL_BELOW {
        1
    } else {
        num_threads()
    };
    // About four chunks per thread, so a thread that loses its core does not hold up the call.
    let target = ((threads * 4) as f64 * share).ceil().max(1.0) as usize;
    let mut chunk = if threads <= 1 {
        groups
    } else {
        groups.div_ceil(target)
    }
    .max(1);
    if n > 1 {
        chunk = chunk.min((CHUNK_BYTES / group_bytes).max(1));
    }
    (0..groups.div_ceil(chunk))
        .map(|c| c * chunk..((c + 1) * chunk).min(groups))
        .collect()
}

/// Row groups `chunk` of `w` against all `n` activation rows, into `out`.
fn run_group_chunk(
    isa: Isa,
    w: &Weight,
    acts: &QuantActs,
    n: usize,
    chunk: Range<usize>,
    out: &OutPtr,
) {
    let rows = w.rows();
    let mut tile = [[0.0f32; GROUP]; MAX_T];
    for pass in (0..n).step_by(TOKENS_PER_PASS) {
        let pass_end = (pass + TOKENS_PER_PASS).min(n);
        for g in chunk.clone() {
            let r0 = g * GROUP;
            let valid = GROUP.min(rows - r0);
            // Tiles of near-equal size (e.g. 9 rows: 5 + 4, not 8 + 1).
            let len = pass_end - pass;
            let tiles = len.div_ceil(MAX_T);
            let mut i = pass;
            for j in 0..tiles {
                let t = len / tiles + usize::from(j < len % tiles);
                group_tile(isa, w, g, acts, i, t, &mut tile);
                for (k, res) in tile[..t].iter().enumerate() {
                    // SAFETY: each row group of `w` belongs to one task only and (i + k) is
                    // visited once per group, so output ranges never overlap.
                    let o = unsafe { out.slice((i + k) * rows + r0, valid) };
                    o.copy_from_slice(&res[..valid]);
                }
                i += t;
            }
        }
    }
}

/// Row group `g` of `w` against activation rows `i..i + t`.
fn group_tile(
    isa: Isa,
    w: &Weight,
    g: usize,
    acts: &QuantActs,
    i: usize,
    t: usize,
    tile: &mut [[f32; GROUP]; MAX_T],
) {
    let group = w.group_data(g);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul_with` checked that this ISA is supported; `group` and `acts` come
        // from the same weight and activation rows of `w.cols()` values.
        Isa::Avx2 | Isa::Avx512Vnni => unsafe {
            super::x86_quant::group_tile(isa, w.format(), group, acts.nb, acts, i, t, tile)
        },
        _ => {
            for (k, res) in tile[..t].iter_mut().enumerate() {
                packed::dot_group(w.format(), group, acts, i + k, res);
            }
        }
    }
}

fn dot_rows_float(isa: Isa, w: &Weight, rows: Range<usize>, x: &[f32], out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul_with` checked that this ISA is supported (AVX2, FMA, F16C detected).
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { super::x86_avx2::dot_rows_float(w, rows, x, out) },
        _ => scalar::dot_rows_float(w, rows, x, out),
    }
}

/// Rows per tile when several activation rows share it: small enough that the tile's weights
/// stay in L1/L2 while every activation row passes over them.
const TILE_ROWS: usize = 16;

/// Calls `f(tile, i)` for every row tile and activation row `i in 0..n`, chunks of rows spread
/// over the pool.
fn for_row_tiles(rows: usize, n: usize, work_bytes: usize, f: impl Fn(Range<usize>, usize) + Sync) {
    let threads = num_threads();
    let chunk = if threads <= 1 || work_bytes < SERIAL_BELOW {
        rows
    } else {
        // About four chunks per thread so a descheduled thread does not hold up the call.
        rows.div_ceil(threads * 4)
            .next_multiple_of(TILE_ROWS)
            .max(TILE_ROWS)
    };
    let n_chunks = rows.div_ceil(chunk);
    parallel_for(n_chunks, |c| {
        let chunk = c * chunk..((c + 1) * chunk).min(rows);
        if n == 1 {
            f(chunk, 0);
            return;
        }
        let mut start = chunk.start;
        while start < chunk.end {
            let tile = start..(start + TILE_ROWS).min(chunk.end);
            for i in 0..n {
                f(tile.clone(), i);
            }
            start = tile.end;
        }
    });
}

/// The output buffer, shared by tasks that write disjoint parts of it.
struct OutPtr {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: tasks only write disjoint ranges (see `slice`), so sharing the pointer is sound.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// `out[start..start + len]`.
    ///
    /// # Safety
    /// No other live slice from this `OutPtr` may overlap the range.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "output range out of bounds");
        // SAFETY: in bounds (checked above), exclusive by the caller's contract, and the
        // buffer outlives the tasks (`parallel_for` returns only when they are done).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
