//! The tensor-parallel all-reduce carried by the GEMVs (`GemvExchange`), with the ranks of a
//! group simulated on one GPU: each rank has its own exchange buffer and residual stream, every
//! rank pushes, then every rank gathers (one stream, so no rank waits on another). Against the
//! path it replaces: each rank's row-parallel GEMV into its own buffer (rank 0 accumulating
//! into the residual), the sum of the ranks' results in rank order in f32 (what the one-shot
//! all-reduce computes), and the norm-fused GEMV on that sum: bit for bit, the residual stream
//! and the GEMV's output, on every rank, over more calls than the exchange has buffers (so a
//! buffer that was not emptied would show as wrong sums).

use super::*;
use sgl_kernels::{GEMV_EXCHANGE_EMPTY, GemvExchange, WeightRef};

/// Buffers of the simulated exchanges (the engine takes the smallest divisor >= 3 of its call
/// count; 3 is the least any group gets).
const NBUFS: usize = 3;

pub(crate) fn check_gemv_exchange(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let eps = 1e-5f32;
    // (ranks, tokens, k of the row-parallel GEMV, model width, n of the gathering GEMV, its
    // epilogue, FP8 weights)
    let cases = [
        (
            2usize, 1usize, 2048usize, 4096usize, 3072usize, Store, false,
        ),
        (2, 8, 7168, 4096, 14336, SwiGlu, false),
        (2, 3, 2048, 4096, 3072, Store, true),
        (4, 1, 1024, 4096, 7168, SwiGlu, false),
        (4, 5, 512, 1024, 768, Store, false),
        (2, 2, 1024, 1024, 1024, Store, true),
    ];
    for (ranks, m, kin, h, n2, epi2, fp8) in cases {
        let slot = sgl_kernels::GEMV_MAX_TOKENS * h;
        let elems = GemvExchange::buffer_elems(ranks, slot, NBUFS);
        let empty = bf16::from_bits(GEMV_EXCHANGE_EMPTY);
        let bufs: Vec<CudaSlice<bf16>> = (0..ranks)
            .map(|_| c.up(&vec![empty; elems]))
            .collect::<R<_>>()?;
        let addrs: Vec<u64> = bufs.iter().map(|b| c.p(b).addr()).collect();
        let syncs: Vec<CudaSlice<u32>> = (0..ranks)
            .map(|_| c.up(&[0u32; 2 * NBUFS]))
            .collect::<R<_>>()?;
        let exs: Vec<GemvExchange> = (0..ranks)
            .map(|r| {
                GemvExchange::new(&addrs, c.p(&syncs[r]), r, slot, NBUFS).ok_or("exchange refused")
            })
            .collect::<std::result::Result<_, _>>()?;
        // per rank: the row-parallel weight (h x kin) and the gathering GEMV's (n2 x h), the
        // norm weight shared
        let w1: Vec<Vec<bf16>> = (0..ranks)
            .map(|_| bf(&(0..h * kin).map(|_| 0.05 * c.rng.sym()).collect::<Vec<_>>()))
            .collect();
        let w2 = bf(&(0..n2 * h).map(|_| 0.05 * c.rng.sym()).collect::<Vec<_>>());
        let g = bf(&(0..h).map(|_| 1.0 + 0.5 * c.rng.sym()).collect::<Vec<_>>());
        let (dg, dw2) = (c.up(&g)?, c.up(&w2)?);
        let dw1: Vec<CudaSlice<bf16>> = w1.iter().map(|w| c.up(w)).collect::<R<_>>()?;
        // FP8 weights: quantized on the device, the same bytes for both paths
        let q1: Vec<Option<(CudaSlice<u8>, CudaSlice<f32>)>> = if fp8 {
            dw1.iter()
                .map(|w| -> R<_> {
                    let q = c.s.alloc_zeros::<u8>(h * kin)?;
                    let sc = c.s.alloc_zeros::<f32>(h)?;
                    // SAFETY: q: h x kin bytes, sc: h, w: h x kin.
                    unsafe {
                        c.k.quantize_rows_fp8(&c.s, c.p(&q), c.p(&sc), c.p(w), h, kin)?
                    };
                    Ok(Some((q, sc)))
                })
                .collect::<R<_>>()?
        } else {
            (0..ranks).map(|_| None).collect()
        };
        let wref = |c: &Ctx, r: usize| -> WeightRef {
            match &q1[r] {
                Some((q, sc)) => WeightRef::Fp8 {
                    w: c.p(q),
                    scale: c.p(sc),
                },
                None => WeightRef::Bf16(c.p(&dw1[r])),
            }
        };
        let out_w = if epi2 == SwiGlu { n2 / 2 } else { n2 };
        // the residual stream, the same on every rank (as after the previous all-reduce)
        let x0 = bf(&(0..m * h).map(|_| 2.0 * c.rng.sym()).collect::<Vec<_>>());
        let mut xs: Vec<CudaSlice<bf16>> = (0..ranks).map(|_| c.up(&x0)).collect::<R<_>>()?;
        let mut x_ref = x0.clone();
        let (mut worst_x, mut worst_y, mut calls_ok) = (0usize, 0usize, 0usize);
        let calls = 2 * NBUFS + 1;
        for call in 0..calls {
            let mut acts = Vec::with_capacity(ranks);
            for _ in 0..ranks {
                let a = bf(&(0..m * kin).map(|_| c.rng.sym()).collect::<Vec<_>>());
                acts.push(c.up(&a)?);
            }
            // the path it replaces: each rank's result in its own buffer, summed on the host
            // in rank order in f32, then the norm-fused GEMV
            let mut sum = vec![0f32; m * h];
            for (r, act) in acts.iter().enumerate() {
                let (y, epi) = if r == 0 {
                    (c.up(&x_ref)?, Accumulate)
                } else {
                    (c.poisoned(m * h)?, Store)
                };
                // SAFETY: act: m x kin, w: h x kin, y: m x h.
                unsafe {
                    c.k.gemv(
                        &c.s,
                        c.p(&y),
                        c.p(act),
                        wref(c, r),
                        m,
                        kin,
                        h,
                        epi,
                        &c.gemv_ws,
                    )?
                };
                for (s, v) in sum.iter_mut().zip(c.down(&y)?) {
                    *s += v;
                }
            }
            x_ref = bf(&sum);
            let dx_ref = c.up(&x_ref)?;
            let y_ref = c.poisoned(m * out_w)?;
            // SAFETY: shapes as allocated.
            unsafe {
                c.k.gemv_rmsnorm(
                    &c.s,
                    c.p(&y_ref),
                    c.p(&dx_ref),
                    c.p(&dg),
                    eps,
                    c.p(&dw2),
                    m,
                    h,
                    n2,
                    epi2,
                    &c.gemv_ws,
                )?
            };
            let y_want = c.down(&y_ref)?;
            // the exchange: every rank pushes, then every rank gathers
            for r in 0..ranks {
                let epi = if r == 0 { Accumulate } else { Store };
                // SAFETY: act: m x kin, w: h x kin, x: m x h; buffers as GemvExchange says.
                unsafe {
                    c.k.gemv_push(
                        &c.s,
                        c.p(&xs[r]),
                        c.p(&acts[r]),
                        wref(c, r),
                        m,
                        kin,
                        h,
                        epi,
                        &c.gemv_ws,
                        &exs[r],
                        call,
                    )?
                };
            }
            let mut ok = true;
            for r in 0..ranks {
                let y = c.poisoned(m * out_w)?;
                // SAFETY: as above; x is written with the sum.
                unsafe {
                    c.k.gemv_rmsnorm_gather(
                        &c.s,
                        c.p(&y),
                        c.p(&xs[r]),
                        c.p(&dg),
                        eps,
                        c.p(&dw2),
                        m,
                        h,
                        n2,
                        epi2,
                        &c.gemv_ws,
                        &exs[r],
                        call,
                    )?
                };
                let got_x = c.down(&xs[r])?;
                let got_y = c.down(&y)?;
                let dx = got_x
                    .iter()
                    .zip(&x_ref)
                    .filter(|(a, b)| a.to_bits() != b.to_f32().to_bits())
                    .count();
                let dy = got_y
                    .iter()
                    .zip(&y_want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                worst_x = worst_x.max(dx);
                worst_y = worst_y.max(dy);
                ok &= dx == 0 && dy == 0;
            }
            // the gather of this call emptied the previous call's buffer on every rank
            if call > 0 {
                let prev = (call - 1) % NBUFS;
                let area = ranks * slot;
                for b in &bufs {
                    c.s.synchronize()?;
                    let all = c.s.clone_dtoh(b)?;
                    ok &= all[prev * area..(prev + 1) * area]
                        .iter()
                        .all(|v| v.to_bits() == GEMV_EXCHANGE_EMPTY);
                }
            }
            calls_ok += usize::from(ok);
            // keep every rank's residual stream as the reference's for the next call
            xs = (0..ranks).map(|_| c.up(&x_ref)).collect::<R<_>>()?;
        }
        c.record(
            &format!(
                "GEMV exchange, {ranks} ranks, {m} tokens, {kin} -> {h} -> {n2} {epi2:?}{}: {calls_ok} of {calls} calls bit-identical to GEMV + rank-order sum + gemv_rmsnorm, buffers emptied (most differing: x {worst_x}, y {worst_y})",
                if fp8 { ", FP8 weights" } else { "" }
            ),
            if calls_ok == calls { 0.0 } else { f64::INFINITY },
            0.0,
        );
    }
    Ok(())
}
