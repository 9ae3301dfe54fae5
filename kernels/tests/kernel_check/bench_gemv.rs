//! The decode GEMV's benchmarks (`bench-gemv`, `bench-gemv-fp8`): against cuBLASLt and the copy bandwidth on Llama-3.1-8B's shapes, FP8 weights, and every plan of the FP8 and tensor-parallel shapes.

use super::*;

/// Buffers to time a GEMV on: copies of `bytes` of weights (byte i is `(i % 251) & mask`),
/// enough to cycle past L2; x of 8 token rows of k; y of 8 rows of n; and the launches that
/// read about 4 GiB of weights.
struct GemvBufs {
    ws: Vec<CudaSlice<u8>>,
    x: CudaSlice<bf16>,
    y: CudaSlice<bf16>,
    iters: usize,
}

impl GemvBufs {
    fn new(c: &mut Ctx, k: usize, n: usize, bytes: usize, mask: u8) -> R<Self> {
        let copies = (256usize << 20).div_ceil(bytes).max(1);
        let host: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8 & mask).collect();
        let ws = (0..copies)
            .map(|_| c.s.clone_htod(&host))
            .collect::<Result<_, _>>()?;
        drop(host);
        let xh = bf(&(0..8 * k).map(|_| c.rng.sym()).collect::<Vec<_>>());
        Ok(GemvBufs {
            ws,
            x: c.up(&xh)?,
            y: c.s.alloc_zeros::<bf16>(8 * n)?,
            iters: (4usize << 30).div_ceil(bytes).clamp(10, 400),
        })
    }
}

/// The FP8-weight GEMV on the 8B decode shapes: µs, GB/s of FP8 weights, share of the copy
/// bandwidth; and the sum over one decode step's layer GEMMs.
pub(crate) fn bench_gemv_fp8(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let s = c.s.clone();
    let copy_bw = copy_bandwidth(c)?;
    let shapes = [
        ("qkv", 4096usize, 6144usize, Store),
        ("o", 4096, 4096, Store),
        ("gate_up", 4096, 28672, SwiGlu),
        ("down", 14336, 4096, Store),
    ];
    println!("\n| FP8 shape | k | n | tokens | plan | µs | GB/s | of copy |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut step = std::collections::BTreeMap::<usize, (f64, f64)>::new();
    for (name, k, n, epi) in shapes {
        let bytes = n * k;
        let scale = c.up(&vec![1e-3f32; n])?;
        let b = GemvBufs::new(c, k, n, bytes, 0x77)?;
        for m in [1usize, 8] {
            let plan = c.k.gemv_plan(k, n, epi);
            let us = time_us(c, b.iters, |i| {
                let w = WeightRef::Fp8 {
                    w: dptr(&b.ws[i % b.ws.len()], &s),
                    scale: dptr(&scale, &s),
                };
                // SAFETY: shapes as allocated.
                unsafe {
                    c.k.gemv(
                        &s,
                        dptr(&b.y, &s),
                        dptr(&b.x, &s),
                        w,
                        m,
                        k,
                        n,
                        epi,
                        &c.gemv_ws,
                    )?
                };
                Ok(())
            })?;
            let bw = bytes as f64 / (us * 1e-6);
            println!(
                "| {name} | {k} | {n} | {m} | {}r x {} x {} | {us:.1} | {:.0} | {:.1}% |",
                plan.rows_per_block,
                plan.tiles,
                plan.splits,
                bw / 1e9,
                100.0 * bw / copy_bw
            );
            let e = step.entry(m).or_default();
            e.0 += us * 32.0;
            e.1 += (bytes * 32) as f64;
        }
    }
    for (m, (us, bytes)) in step {
        let floor = bytes / copy_bw * 1e6;
        println!(
            "FP8 layer GEMVs of one decode step, {m} tokens: {:.3} ms, copy-rate floor {:.3} ms ({:.1}%)",
            us / 1e3,
            floor / 1e3,
            100.0 * floor / us
        );
    }
    gemv_plan_sweep(c, copy_bw)
}

/// One token's GEMV on the FP8 8B shapes and the bf16 shapes of a rank at tensor parallelism
/// 2, under every plan (16 or 32 rows per block, 1 to 4 blocks along k) and weight steps
/// prefetched into L2 before the PDL wait (`SGL_GEMV_PREFETCH`): which plan the weight stream
/// prefers where a shape fills less than a wave or two.
fn gemv_plan_sweep(c: &mut Ctx, copy_bw: f64) -> R<()> {
    use GemvEpilogue::*;
    use sgl_kernels::GemvPlan;
    let s = c.s.clone();
    let sweep_ws = c.k.gemv_workspace_for(&s, 2048)?;
    let shapes = [
        ("fp8 qkv", true, 4096usize, 6144usize, Store),
        ("fp8 o", true, 4096, 4096, Store),
        ("fp8 gate_up", true, 4096, 28672, SwiGlu),
        ("fp8 down", true, 14336, 4096, Store),
        ("bf16 tp2 qkv", false, 4096, 3072, Store),
        ("bf16 tp2 o", false, 2048, 4096, Store),
        ("bf16 tp2 gate_up", false, 4096, 14336, SwiGlu),
        ("bf16 tp2 down", false, 7168, 4096, Store),
    ];
    let default_pf = c.k.gemv_prefetch();
    println!(
        "\n| shape | plan | default plan | µs by L2 prefetch steps 0 / 1 / 2 / 4 | best of copy |"
    );
    println!("|---|---|---|---|---|");
    for (name, fp8, k, n, epi) in shapes {
        let bytes = if fp8 { n * k } else { 2 * n * k };
        let scale = c.up(&vec![1e-3f32; n])?;
        let b = GemvBufs::new(c, k, n, bytes, 0x37)?;
        let default = c.k.gemv_plan(k, n, epi);
        for rows in [16u32, 32] {
            for splits in 1u32..=4 {
                let plan = GemvPlan::tiled(n, epi, rows, splits);
                let tiles = plan.tiles;
                let mut cells = Vec::new();
                let mut best = f64::MAX;
                for pf in [0u32, 1, 2, 4] {
                    c.k.set_gemv_prefetch(pf);
                    let us = time_us(c, b.iters, |i| {
                        let wp = dptr(&b.ws[i % b.ws.len()], &s);
                        let w = if fp8 {
                            WeightRef::Fp8 {
                                w: wp,
                                scale: dptr(&scale, &s),
                            }
                        } else {
                            // SAFETY: the same allocation, read as bf16 (bytes = 2 n k).
                            WeightRef::Bf16(unsafe { Dptr::from_raw(wp.addr()) })
                        };
                        // SAFETY: shapes as allocated; the sweep's workspace fits 2048 tiles.
                        unsafe {
                            c.k.gemv_with_plan(
                                &s,
                                dptr(&b.y, &s),
                                dptr(&b.x, &s),
                                w,
                                1,
                                k,
                                n,
                                epi,
                                plan,
                                &sweep_ws,
                            )?
                        };
                        Ok(())
                    })?;
                    best = best.min(us);
                    cells.push(format!("{us:.1}"));
                }
                println!(
                    "| {name} | {rows}r x {tiles} x {splits} | {} | {} | {:.1}% |",
                    if plan == default { "yes" } else { "" },
                    cells.join(" / "),
                    100.0 * bytes as f64 / (best * 1e-6) / copy_bw
                );
            }
        }
    }
    c.k.set_gemv_prefetch(default_pf);
    Ok(())
}

/// GEMV vs cuBLASLt on the decode GEMMs of Llama-3.1-8B (weights cycled through enough copies
/// that none is still in L2), against device-to-device copy bandwidth (read + write).
pub(crate) fn bench_gemv(c: &mut Ctx) -> R<()> {
    use GemvEpilogue::*;
    let s = c.s.clone();
    let copy_bw = copy_bandwidth(c)?;
    // (name, k, n, epilogue, per decode step: 32 layers or once)
    let shapes = [
        ("qkv", 4096usize, 6144usize, Store, 32usize),
        ("o", 4096, 4096, Store, 32),
        ("gate_up", 4096, 28672, SwiGlu, 32),
        ("down", 14336, 4096, Store, 32),
        ("lm_head", 4096, 128256, Store, 1),
    ];
    println!(
        "\n| shape | k | n | tokens | plan | GEMV µs | GEMV GB/s | cuBLASLt µs | cuBLASLt GB/s | GEMV / copy | cuBLASLt / copy |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut step = std::collections::BTreeMap::<usize, (f64, f64, f64)>::new();
    for (name, k, n, epi, per_step) in shapes {
        let bytes = n * k * 2;
        let copies = (256usize << 20).div_ceil(bytes).max(1);
        // non-zero weights (a pattern: cheap to make for 1 GB)
        let host = bf(&(0..n * k)
            .map(|i| ((i % 251) as f32 - 125.0) * 1e-3)
            .collect::<Vec<_>>());
        let ws: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&host))
            .collect::<Result<_, _>>()?;
        drop(host);
        let xh = bf(&(0..8 * k).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let x = c.up(&xh)?;
        let y = s.alloc_zeros::<bf16>(8 * n)?;
        let iters = (4usize << 30).div_ceil(bytes).clamp(10, 200);
        for m in [1usize, 4, 8] {
            let plan = c.k.gemv_plan(k, n, epi);
            let gemv = time_us(c, iters, |i| {
                let w = dptr(&ws[i % copies], &s);
                // SAFETY: shapes as allocated.
                unsafe {
                    c.k.gemv(&s, dptr(&y, &s), dptr(&x, &s), w, m, k, n, epi, &c.gemv_ws)?
                };
                Ok(())
            })?;
            let blas = time_us(c, iters, |i| {
                let w = dptr(&ws[i % copies], &s);
                // SAFETY: shapes as allocated.
                unsafe {
                    c.gemm
                        .linear(dptr(&x, &s), w, dptr(&y, &s), m, k, n, false)?
                };
                Ok(())
            })?;
            let (gbw, bbw) = (bytes as f64 / (gemv * 1e-6), bytes as f64 / (blas * 1e-6));
            println!(
                "| {name} | {k} | {n} | {m} | {}r x {} x {} | {gemv:.1} | {:.0} | {blas:.1} | {:.0} | {:.1}% | {:.1}% |",
                plan.rows_per_block,
                plan.tiles,
                plan.splits,
                gbw / 1e9,
                bbw / 1e9,
                100.0 * gbw / copy_bw,
                100.0 * bbw / copy_bw
            );
            let e = step.entry(m).or_default();
            e.0 += gemv * per_step as f64;
            e.1 += blas * per_step as f64;
            e.2 += (bytes * per_step) as f64;
        }
    }
    println!(
        "\nGEMMs of one decode step (32 layers + LM head; cuBLASLt runs gate_up without the fused SwiGLU):"
    );
    println!(
        "| tokens | weight GB | GEMV ms | cuBLASLt ms | copy-rate floor ms | GEMV of floor | cuBLASLt of floor |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (m, (g, b, bytes)) in step {
        let floor = bytes / copy_bw * 1e3;
        println!(
            "| {m} | {:.2} | {:.3} | {:.3} | {floor:.3} | {:.1}% | {:.1}% |",
            bytes / 1e9,
            g / 1e3,
            b / 1e3,
            100.0 * floor / (g / 1e3),
            100.0 * floor / (b / 1e3)
        );
    }
    Ok(())
}
