//! `sgl-bench bench-all-reduce`'s part for the fused all-reduce, residual add and RMSNorm
//! (`allreduce_pull_add_rmsnorm`, what passes through the GEMMs run at tp 2): on every rank,
//! its output against the one-shot kernel followed by the norm kernels, bit for bit (bf16 out;
//! FP8 out from an FP8 GEMM's unscaled product, scaled first, its row scales also its output's,
//! as in the engine), then both timed in a CUDA graph at the token counts of a 4096-wide
//! model's passes.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, sys};
use half::bf16;
use sgl_kernels::{Kernels, NormOut, dptr};

use super::cuda_err;
use super::tp::{CustomAllReduce, OneShot, PullSet};
use crate::error::{EngineError, Result};

/// The model width checked and timed (Llama-3.1-8B's).
const HIDDEN: usize = 4096;
const EPS: f32 = 1e-5;

/// A value in [-1, 1) from a seed and an index.
fn value(seed: u64, i: usize) -> f32 {
    let x = (i as u64)
        .wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn bf16s(n: usize, f: impl Fn(usize) -> f32) -> Vec<bf16> {
    (0..n).map(|i| bf16::from_f32(f(i))).collect()
}

/// One case's inputs on this rank: its delta, the residual stream (the same on every rank),
/// the norm weight, and FP8 scales (per token, this rank's; per column).
struct Inputs {
    delta: CudaSlice<bf16>,
    residual: CudaSlice<bf16>,
    weight: CudaSlice<bf16>,
    xs: CudaSlice<f32>,
    ws: CudaSlice<f32>,
}

impl Inputs {
    fn new(s: &Arc<CudaStream>, rank: usize, tokens: usize) -> Result<Self> {
        let n = tokens * HIDDEN;
        let up = |v: Vec<bf16>| s.clone_htod(&v).map_err(cuda_err);
        let upf = |v: Vec<f32>| s.clone_htod(&v).map_err(cuda_err);
        Ok(Inputs {
            delta: up(bf16s(n, |i| 4.0 * value(rank as u64 + 1, i)))?,
            residual: up(bf16s(n, |i| 2.0 * value(100, i)))?,
            weight: up(bf16s(HIDDEN, |i| 1.0 + 0.5 * value(200, i)))?,
            xs: upf((0..tokens)
                .map(|t| 0.01 + 0.005 * value(rank as u64 + 300, t).abs())
                .collect())?,
            ws: upf((0..HIDDEN)
                .map(|c| 0.02 + 0.01 * value(400, c).abs())
                .collect())?,
        })
    }
}

/// What one path leaves: the residual stream and the norm's output (bf16 bits, or e4m3 bytes
/// with the scales' bits).
#[derive(PartialEq)]
struct Outputs {
    residual: Vec<u16>,
    out: Vec<u16>,
    q: Vec<u8>,
    scales: Vec<u32>,
}

struct Case<'a> {
    k: &'a Kernels,
    /// The one-shot set the unfused path takes for this size.
    ar: &'a OneShot,
    pull: &'a PullSet,
    /// Pull calls made so far: each takes the area after the last one's, as the engine's
    /// o_proj and down_proj do.
    calls: std::cell::Cell<usize>,
    s: &'a Arc<CudaStream>,
    rank: usize,
    tokens: usize,
    fp8: bool,
}

impl Case<'_> {
    /// The engine's path before the fusion: (rescale), one-shot all-reduce, then the norm, in
    /// place on the work's delta.
    fn unfused(&self, inp: &Inputs, work: &Work) -> Result<()> {
        let (k, s, t) = (self.k, self.s, self.tokens);
        let d = dptr(&work.delta, s);
        // SAFETY: every buffer holds tokens x HIDDEN (or tokens / HIDDEN scales); every rank
        // makes the same calls on buffers from tp::custom_all_reduce.
        unsafe {
            if self.fp8 {
                let xs = dptr(&work.xs, s);
                k.fp8_rescale(s, d, d, xs, dptr(&inp.ws, s), t, HIDDEN, false)
                    .map_err(cuda_err)?;
            }
            self.ar.all_reduce(k, s, d, t * HIDDEN, self.rank)?;
            let res = dptr(&work.residual, s);
            let w = dptr(&inp.weight, s);
            if self.fp8 {
                let (q, xs) = (dptr(&work.q, s), dptr(&work.xs, s));
                k.add_rmsnorm_quant_fp8(s, q, xs, res, Some(d), None, w, t, HIDDEN, EPS)
            } else {
                k.add_rmsnorm(s, dptr(&work.out, s), res, Some(d), w, t, HIDDEN, EPS)
            }
            .map_err(cuda_err)
        }
    }

    /// This rank's product into its pull area `a`, as its GEMM would write it (scaled, for
    /// FP8).
    fn fill_area(&self, inp: &Inputs, work: &Work, a: usize) -> Result<()> {
        let s = self.s;
        let area = self.pull.own_area(a);
        // SAFETY: the area holds half_elems >= tokens x HIDDEN values; the inputs hold them.
        unsafe {
            if self.fp8 {
                let (xs, ws) = (dptr(&work.xs, s), dptr(&inp.ws, s));
                self.k.fp8_rescale(
                    s,
                    area,
                    dptr(&inp.delta, s),
                    xs,
                    ws,
                    self.tokens,
                    HIDDEN,
                    false,
                )
            } else {
                let src = dptr(&inp.delta, s).addr();
                sys::cuMemcpyDtoDAsync_v2(area.addr(), src, self.tokens * HIDDEN * 2, s.cu_stream())
                    .result()
                    .map_err(sgl_kernels::KernelError::from)
            }
        }
        .map_err(cuda_err)
    }

    /// The fused launch (with FP8, the rescale in place on the area before it, as the engine
    /// runs it when `rescale`).
    fn fused(&self, inp: &Inputs, work: &Work, rescale: bool) -> Result<()> {
        let s = self.s;
        let xs = dptr(&work.xs, s);
        let a = self.calls.get() & 1;
        self.calls.set(self.calls.get() + 1);
        let area = self.pull.own_area(a);
        let out = if self.fp8 {
            NormOut::Fp8 {
                q: dptr(&work.q, s),
                scale: xs,
            }
        } else {
            NormOut::Bf16(dptr(&work.out, s))
        };
        // SAFETY: as in `unfused`; every rank's product is in its area.
        unsafe {
            if self.fp8 && rescale {
                self.k
                    .fp8_rescale(
                        s,
                        area,
                        area,
                        xs,
                        dptr(&inp.ws, s),
                        self.tokens,
                        HIDDEN,
                        false,
                    )
                    .map_err(cuda_err)?;
            }
            self.k.allreduce_pull_add_rmsnorm(
                s,
                &self.pull.peers[a],
                dptr(&self.pull.epochs, s),
                (self.rank, self.pull.half_elems, self.pull.blocks),
                dptr(&work.residual, s),
                out,
                dptr(&inp.weight, s),
                (self.tokens, HIDDEN),
                EPS,
            )
        }
        .map_err(cuda_err)
    }
}

/// The buffers a path writes (reset from the inputs before each run).
struct Work {
    delta: CudaSlice<bf16>,
    residual: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    q: CudaSlice<u8>,
    xs: CudaSlice<f32>,
}

impl Work {
    fn new(s: &Arc<CudaStream>, tokens: usize) -> Result<Self> {
        let n = tokens * HIDDEN;
        Ok(Work {
            delta: s.alloc_zeros(n).map_err(cuda_err)?,
            residual: s.alloc_zeros(n).map_err(cuda_err)?,
            out: s.alloc_zeros(n).map_err(cuda_err)?,
            q: s.alloc_zeros(n).map_err(cuda_err)?,
            xs: s.alloc_zeros(tokens).map_err(cuda_err)?,
        })
    }

    /// The delta, the residual and the per-token scales back to the case's inputs.
    fn reset(&mut self, s: &Arc<CudaStream>, inp: &Inputs) -> Result<()> {
        s.memcpy_dtod(&inp.delta, &mut self.delta)
            .map_err(cuda_err)?;
        s.memcpy_dtod(&inp.residual, &mut self.residual)
            .map_err(cuda_err)?;
        s.memcpy_dtod(&inp.xs, &mut self.xs).map_err(cuda_err)
    }

    fn read(&self, s: &Arc<CudaStream>, fp8: bool) -> Result<Outputs> {
        let bits = |v: Vec<bf16>| v.into_iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        Ok(Outputs {
            residual: bits(s.clone_dtoh(&self.residual).map_err(cuda_err)?),
            out: if fp8 {
                Vec::new()
            } else {
                bits(s.clone_dtoh(&self.out).map_err(cuda_err)?)
            },
            q: if fp8 {
                s.clone_dtoh(&self.q).map_err(cuda_err)?
            } else {
                Vec::new()
            },
            scales: if fp8 {
                let v = s.clone_dtoh(&self.xs).map_err(cuda_err)?;
                v.into_iter().map(f32::to_bits).collect()
            } else {
                Vec::new()
            },
        })
    }
}

/// Checks the fused launch against the unfused path (bf16 and FP8 out, a full pull area and a
/// count that leaves blocks idle); then times both.
pub(super) fn check_and_time(
    k: &Kernels,
    sets: &CustomAllReduce,
    s: &Arc<CudaStream>,
    rank: usize,
) -> Result<Vec<String>> {
    let Some(pull) = sets.pull.as_ref() else {
        return Ok(Vec::new());
    };
    let full = (pull.half_elems / HIDDEN).min(1024);
    let set_for = |tokens: usize| {
        sets.pick(tokens * HIDDEN, false)
            .ok_or_else(|| EngineError::Internal(format!("no one-shot set takes {tokens} rows")))
    };
    let mut lines = Vec::new();
    for tokens in [full, 37, 300] {
        let inp = Inputs::new(s, rank, tokens)?;
        let mut work = Work::new(s, tokens)?;
        for fp8 in [false, true] {
            let case = Case {
                k,
                ar: set_for(tokens)?,
                pull,
                calls: std::cell::Cell::new(0),
                s,
                rank,
                tokens,
                fp8,
            };
            work.reset(s, &inp)?;
            case.unfused(&inp, &work)?;
            let want = work.read(s, fp8)?;
            work.reset(s, &inp)?;
            case.fill_area(&inp, &work, 0)?;
            case.fused(&inp, &work, false)?;
            let got = work.read(s, fp8)?;
            let out = if fp8 { "FP8" } else { "bf16" };
            if got != want {
                return Err(EngineError::Internal(format!(
                    "fused all-reduce + RMSNorm ({tokens} x {HIDDEN}, {out} out) differs from the one-shot kernel and the norm"
                )));
            }
            lines.push(format!(
                "fused all-reduce + RMSNorm check ({tokens} x {HIDDEN}, {out} out, {} blocks): the same bits as the one-shot kernel and the norm",
                pull.blocks
            ));
        }
    }
    // timings, each path as the engine runs it (FP8: the rescale included on both sides)
    for tokens in [16, 64, 128, 256, 512, 1024]
        .into_iter()
        .filter(|&t| t <= full)
    {
        let inp = Inputs::new(s, rank, tokens)?;
        let mut work = Work::new(s, tokens)?;
        work.reset(s, &inp)?;
        for fp8 in [false, true] {
            let case = Case {
                k,
                ar: set_for(tokens)?,
                pull,
                calls: std::cell::Cell::new(0),
                s,
                rank,
                tokens,
                fp8,
            };
            case.fill_area(&inp, &work, 0)?;
            case.fill_area(&inp, &work, 1)?;
            // (each path runs on its own output: the values drift, the work is the same)
            let iters = 50;
            let a = super::bench_comm::time_in_graph(s, iters, || case.unfused(&inp, &work))?;
            let b = super::bench_comm::time_in_graph(s, iters, || case.fused(&inp, &work, true))?;
            lines.push(format!(
                "| {tokens} x {HIDDEN} ({} KB) | {} | {} | {a:.1} | {b:.1} | {:.2}x |",
                (tokens * HIDDEN * 2) >> 10,
                if fp8 { "FP8 (scaled)" } else { "bf16" },
                case.ar.blocks,
                a / b
            ));
        }
    }
    Ok(lines)
}
