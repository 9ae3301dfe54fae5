//! Run-time choice of the instruction set, and the split of a product over threads and tiles.

use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

use super::packed::{self, GROUP};
use super::pool::{SharedMut, num_threads, parallel_for};
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
    let out = SharedMut::new(out);
    if w.format().is_quantized() {
        let acts = QuantActs::new(isa, x, n, cols);
        matmul_packed(isa, w, &acts, n, &out);
        acts.recycle();
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
fn matmul_packed(isa: Isa, w: &Weight, acts: &QuantActs, n: usize, out: &SharedMut<'_, f32>) {
    let chunks = group_chunks(w, n, 1.0);
    parallel_for(chunks.len(), |c| {
        run_group_chunk(isa, w, acts, n, chunks[c].clone(), out, None)
    });
}

/// Work interleaved with a product's own: `f(i, of)`, called once for each `i in 0..of` from
/// the product's tasks, one call after each row group (see `matmul_multi_with`).
pub(crate) type SideWork<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// Several block-quantized weights with the same columns against the same activations: one
/// activation quantization and one pool job for all of them. `side` runs between row groups.
pub(crate) fn matmul_packed_multi(
    isa: Isa,
    ws: &[&Weight],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
    side: Option<SideWork<'_>>,
) {
    let cols = ws[0].cols();
    let acts = QuantActs::new(isa, x, n, cols);
    let outs: Vec<SharedMut<'_, f32>> = outs.iter_mut().map(|o| SharedMut::new(o)).collect();
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
    // Row groups before each task's, for numbering the side work.
    let mut before = Vec::with_capacity(tasks.len());
    let mut groups = 0;
    for (_, chunk) in &tasks {
        before.push(groups);
        groups += chunk.len();
    }
    parallel_for(tasks.len(), |t| {
        let (k, ref chunk) = tasks[t];
        let side = side.map(|f| (f, before[t], groups));
        run_group_chunk(isa, ws[k], &acts, n, chunk.clone(), &outs[k], side);
    });
    acts.recycle();
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

/// Most tiles in one pass of `TOKENS_PER_PASS` activation rows.
const MAX_TILES: usize = TOKENS_PER_PASS.div_ceil(MAX_T);

/// Row groups `chunk` of `w` against all `n` activation rows, into `out`. With `side` =
/// `(f, first, of)`, calls `f(first + j, of)` after the chunk's `j`-th row group.
fn run_group_chunk(
    isa: Isa,
    w: &Weight,
    acts: &QuantActs,
    n: usize,
    chunk: Range<usize>,
    out: &SharedMut<'_, f32>,
    side: Option<(SideWork<'_>, usize, usize)>,
) {
    let rows = w.rows();
    let mut res = [[0.0f32; GROUP]; MAX_T];
    for pass in (0..n).step_by(TOKENS_PER_PASS) {
        let pass_end = (pass + TOKENS_PER_PASS).min(n);
        // Tiles of near-equal size (e.g. 9 rows: 5 + 4, not 8 + 1), their activation rows
        // resolved once for every row group of the chunk.
        let len = pass_end - pass;
        let n_tiles = len.div_ceil(MAX_T);
        let mut tiles: [Option<Tile>; MAX_TILES] = Default::default();
        let mut i = pass;
        for (j, tile) in tiles[..n_tiles].iter_mut().enumerate() {
            let t = len / n_tiles + usize::from(j < len % n_tiles);
            *tile = Some(Tile::new(isa, acts, i, t));
            i += t;
        }
        for (j, g) in chunk.clone().enumerate() {
            if pass == 0
                && let Some((f, first, of)) = side
            {
                f(first + j, of);
            }
            let r0 = g * GROUP;
            let valid = GROUP.min(rows - r0);
            for tile in tiles.iter().map_while(Option::as_ref) {
                group_tile(isa, w, g, acts, tile, &mut res);
                for (k, res) in res[..tile.t].iter().enumerate() {
                    let at = (tile.i0 + k) * rows + r0;
                    // SAFETY: each row group of `w` belongs to one task only and each
                    // activation row is visited once per group, so output ranges never
                    // overlap.
                    if valid == GROUP {
                        unsafe { out.slice(at, GROUP) }.copy_from_slice(res);
                    } else {
                        unsafe { out.slice(at, valid) }.copy_from_slice(&res[..valid]);
                    }
                }
            }
        }
    }
}

/// Activation rows `i0..i0 + t` (`t <= MAX_T`) that one kernel call takes.
struct Tile {
    i0: usize,
    t: usize,
    /// The rows' pointers, for the x86 kernels.
    #[cfg(target_arch = "x86_64")]
    x86: Option<super::x86_quant::TileActs>,
}

impl Tile {
    fn new(isa: Isa, acts: &QuantActs, i0: usize, t: usize) -> Tile {
        Tile {
            i0,
            t,
            #[cfg(target_arch = "x86_64")]
            x86: (isa != Isa::Scalar).then(|| super::x86_quant::TileActs::new(acts, i0, t)),
        }
    }
}

/// Row group `g` of `w` against the activation rows of `tile`, into `out[..tile.t]`.
fn group_tile(
    isa: Isa,
    w: &Weight,
    g: usize,
    acts: &QuantActs,
    tile: &Tile,
    out: &mut [[f32; GROUP]; MAX_T],
) {
    let group = w.group_data(g);
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = &tile.x86 {
        // SAFETY: `matmul_with` checked that this ISA is supported (and `x86` is only set for
        // a SIMD ISA); `group` and the tile come from the same weight and activation rows of
        // `w.cols()` values.
        unsafe { super::x86_quant::group_tile(isa, w.format(), group, acts.nb, x, out) };
        return;
    }
    let _ = isa;
    for (k, res) in out[..tile.t].iter_mut().enumerate() {
        packed::dot_group(w.format(), group, acts, tile.i0 + k, res);
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
