//! `sgl-bench bench-all-reduce --tp-size N`: the collective that
//! tensor parallelism runs twice per layer, alone.
//!
//! 1. Correctness against a host sum: int32 values (exact) and bf16 values (within the rounding
//!    of one bf16 add per rank), each rank's input made from its rank number so every rank can
//!    compute the expected sum itself.
//!    The one-shot kernel over peer memory (what decode steps use up to 2 MB) is checked the
//!    same way, and every rank must get the same bits.
//!    So is the all-reduce fused with the residual add and RMSNorm (`bench_ar_norm`).
//! 2. Time per all-reduce and bus bandwidth (`2 (n - 1) / n` × bytes ÷ time, NCCL's definition)
//!    from 8 KB to 64 MB, queued one after another on the stream and, up to 1 MB (the decode
//!    sizes), replayed from a CUDA graph as the decode graphs run them; the one-shot kernel
//!    beside NCCL up to its 2 MB limit.
//! 3. The link's peak: a 256 MB copy from GPU 0 to GPU 1 (`cuMemcpyPeerAsync`), the bound the
//!    bus bandwidth reads against.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream, sys};
use half::bf16;
use sgl_kernels::nccl::{Comm, UniqueId};
use sgl_kernels::{Dptr, dptr};

use super::cuda_err;
use crate::backend::BackendError;
use crate::error::{EngineError, Result};

fn nccl_err(e: sgl_kernels::nccl::NcclError) -> EngineError {
    EngineError::from(BackendError::Nccl(e))
}

/// Value `i` of rank `r`'s int32 input.
fn int_value(r: usize, i: usize) -> i32 {
    ((i * 7 + r * 13) % 1001) as i32 - 500
}

/// Value `i` of rank `r`'s bf16 input, in [-1, 1).
fn float_value(r: usize, i: usize) -> f32 {
    let x = (i as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(r as u64 * 0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// What a rank measured: the timings, the link peak (rank 0) and its device's name.
type RankResult = (Vec<Row>, Option<f64>, String);

/// The largest difference of `got[i]` from the exact sum of every rank's bf16 value `i`, in
/// units of `roundings` bf16 roundings (2^-8 relative) of the sum of the magnitudes.
fn rounding_error(got: &[bf16], size: usize, roundings: f32) -> f32 {
    let mut worst = 0.0f32;
    for (i, g) in got.iter().enumerate() {
        let terms: Vec<f32> = (0..size)
            .map(|r| bf16::from_f32(float_value(r, i)).to_f32())
            .collect();
        let exact: f32 = terms.iter().sum();
        let scale: f32 = terms.iter().map(|t| t.abs()).sum::<f32>().max(1e-3);
        worst = worst.max((g.to_f32() - exact).abs() / (scale * roundings * 2f32.powi(-8)));
    }
    worst
}

struct Row {
    bytes: usize,
    eager_us: f64,
    graph_us: Option<f64>,
    /// The one-shot kernel, replayed from a graph.
    custom_us: Option<f64>,
    /// The low-latency one-shot kernel (epochs in the lines, no flags), replayed from a graph.
    ll_us: Option<f64>,
}

/// Runs the checks and the timings on `size` GPUs; prints a table and JSON lines.
pub fn all_reduce_bench(size: usize) -> Result<()> {
    let gpus = CudaContext::device_count().map_err(cuda_err)? as usize;
    if size < 2 || gpus < size {
        return Err(EngineError::InvalidArgument(format!(
            "the all-reduce benchmark needs --tp-size of at least 2 GPUs; asked {size}, the driver sees {gpus}"
        )));
    }
    sgl_kernels::nccl::available().map_err(nccl_err)?;
    let version = sgl_kernels::nccl::version().map_err(nccl_err)?;
    let id = UniqueId::new().map_err(nccl_err)?;
    let barrier = Barrier::new(size);
    let join = super::tp::Join::new(id, size);
    // Rank 1's buffer and context, for the peer-copy peak measured by rank 0.
    let peer_buf: Mutex<Option<(u64, usize)>> = Mutex::new(None);
    let results: Vec<Result<RankResult>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (barrier, peer_buf, join) = (&barrier, &peer_buf, &join);
                scope.spawn(move || rank_main(rank, size, id, barrier, peer_buf, join))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(EngineError::Internal("a rank panicked".into())))
            })
            .collect()
    });
    let mut rank0 = None;
    for (r, res) in results.into_iter().enumerate() {
        let out = res.map_err(|e| EngineError::Internal(format!("rank {r}: {e}")))?;
        if r == 0 {
            rank0 = Some(out);
        }
    }
    let Some((rows, peak, device)) = rank0 else {
        return Err(EngineError::Internal("no result from rank 0".into()));
    };
    let factor = 2.0 * (size as f64 - 1.0) / size as f64;
    println!(
        "all-reduce (sum, bf16) on {size} x {device}, NCCL {version}; link peak (GPU 0 -> 1 copy, 256 MB): {}",
        peak.map_or("n/a".into(), |p| format!("{p:.1} GB/s"))
    );
    println!(
        "| size | NCCL µs (stream) | NCCL µs (graph) | one-shot µs (graph) | low-latency µs (graph) | best bus GB/s | of link peak |"
    );
    println!("|---|---|---|---|---|---|---|");
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |g| format!("{g:.1}"));
    for r in &rows {
        let best = [Some(r.eager_us), r.graph_us, r.custom_us, r.ll_us]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        let bus = factor * r.bytes as f64 / (best * 1e-6) / 1e9;
        println!(
            "| {} | {:.1} | {} | {} | {} | {:.1} | {} |",
            human(r.bytes),
            r.eager_us,
            fmt(r.graph_us),
            fmt(r.custom_us),
            fmt(r.ll_us),
            bus,
            peak.map_or("-".into(), |p| format!("{:.0}%", 100.0 * bus / p))
        );
        println!(
            "{{\"bytes\":{},\"nccl_us\":{:.2},\"nccl_graph_us\":{},\"oneshot_graph_us\":{},\"ll_graph_us\":{},\"bus_gb_s\":{:.2},\"ranks\":{size}}}",
            r.bytes,
            r.eager_us,
            r.graph_us.map_or("null".into(), |g| format!("{g:.2}")),
            r.custom_us.map_or("null".into(), |g| format!("{g:.2}")),
            r.ll_us.map_or("null".into(), |g| format!("{g:.2}")),
            bus
        );
    }
    Ok(())
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MB", bytes >> 20)
    } else {
        format!("{} KB", bytes >> 10)
    }
}

fn rank_main(
    rank: usize,
    size: usize,
    id: UniqueId,
    barrier: &Barrier,
    peer_buf: &Mutex<Option<(u64, usize)>>,
    join: &super::tp::Join,
) -> Result<RankResult> {
    let ctx = CudaContext::new(rank).map_err(cuda_err)?;
    // SAFETY: one stream; no cross-stream events needed (and none during capture).
    unsafe { ctx.disable_event_tracking() };
    let s = ctx.new_stream().map_err(cuda_err)?;
    let device = ctx.name().unwrap_or_else(|_| "GPU".into());
    let comm = Comm::init(&s, id, rank, size).map_err(nccl_err)?;

    // 1. correctness against host sums
    let n = (1 << 20) + 7;
    let ints: Vec<i32> = (0..n).map(|i| int_value(rank, i)).collect();
    let d_ints = s.clone_htod(&ints).map_err(cuda_err)?;
    // SAFETY: n ints on this device; every rank queues the same collectives.
    unsafe { comm.all_reduce_sum(dptr(&d_ints, &s), n, &s) }.map_err(nccl_err)?;
    let got = s.clone_dtoh(&d_ints).map_err(cuda_err)?;
    let bad = (0..n)
        .filter(|&i| got[i] != (0..size).map(|r| int_value(r, i)).sum::<i32>())
        .count();
    if bad > 0 {
        return Err(EngineError::Internal(format!(
            "int32 all-reduce: {bad} of {n} sums differ from the host's"
        )));
    }
    let floats: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32(float_value(rank, i)))
        .collect();
    let d_floats = s.clone_htod(&floats).map_err(cuda_err)?;
    // SAFETY: as above.
    unsafe { comm.all_reduce_sum(dptr(&d_floats, &s), n, &s) }.map_err(nccl_err)?;
    let got = s.clone_dtoh(&d_floats).map_err(cuda_err)?;
    // one bf16 rounding per add
    let worst = rounding_error(&got, size, size as f32);
    if worst > 1.0 {
        return Err(EngineError::Internal(format!(
            "bf16 all-reduce: error {worst:.2}x the rounding bound"
        )));
    }
    if rank == 0 {
        println!(
            "all-reduce check: int32 sums of {n} values exact on {size} ranks; bf16 sums within {:.2} of the rounding bound",
            worst
        );
    }

    // The one-shot kernel: against the host sum, and the same bits on every rank (checked
    // through a second all-reduce of the differences to rank 0's result).
    let kernels = sgl_kernels::Kernels::load(&ctx).map_err(cuda_err)?;
    let custom = super::tp::custom_all_reduce(&ctx, &s, join, rank, false)?;
    let sets = custom
        .as_ref()
        .map(|c| {
            std::iter::once(&c.small)
                .chain(&c.large)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for ar in sets {
        let m = ar.half_elems;
        let floats: Vec<bf16> = (0..m)
            .map(|i| bf16::from_f32(float_value(rank, i)))
            .collect();
        let d = s.clone_htod(&floats).map_err(cuda_err)?;
        // SAFETY: m = half_elems elements; every rank makes the same calls.
        unsafe { ar.all_reduce(&kernels, &s, dptr(&d, &s), m, rank) }?;
        let got = s.clone_dtoh(&d).map_err(cuda_err)?;
        // a sum in f32, rounded once
        let worst = rounding_error(&got, size, 1.0);
        // Same bits everywhere: the sum over ranks of (mine - rank 0's) must be zero, with rank
        // 0's result broadcast by NCCL first.
        let d0 = s.clone_htod(&got).map_err(cuda_err)?;
        // SAFETY: m elements on every rank.
        unsafe { comm.broadcast(dptr(&d0, &s), m, 0, &s) }.map_err(nccl_err)?;
        let r0 = s.clone_dtoh(&d0).map_err(cuda_err)?;
        let differ = got
            .iter()
            .zip(&r0)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        if worst > 1.0 || differ > 0 {
            return Err(EngineError::Internal(format!(
                "one-shot all-reduce: error {worst:.2}x the rounding bound, {differ} values differ from rank 0's"
            )));
        }
        if rank == 0 {
            println!(
                "one-shot all-reduce check ({} blocks): {m} bf16 sums within {worst:.2} of one rounding, the same bits on every rank",
                ar.blocks
            );
        }
    }

    // The low-latency kernel: the one-shot kernel's bits on every rank, at sizes up to its
    // largest, three calls each (both parities, and a call after a larger one).
    if let Some(ll) = custom.as_ref().and_then(|c| c.ll.as_ref()) {
        let max = ll.half_elems / 2;
        let sizes = [4096usize.min(max), (32 << 10).min(max), 8, max];
        let mut checked = 0;
        for (k, &m) in sizes.iter().cycle().take(3 * sizes.len()).enumerate() {
            let Some(one) = custom.as_ref().and_then(|c| c.pick(m, false)) else {
                continue;
            };
            let vals: Vec<bf16> = (0..m)
                .map(|i| bf16::from_f32(float_value(rank + 7 * k, i)))
                .collect();
            let (a, b) = (
                s.clone_htod(&vals).map_err(cuda_err)?,
                s.clone_htod(&vals).map_err(cuda_err)?,
            );
            // SAFETY: m elements each (within both sets' limits); every rank makes the same
            // calls.
            unsafe {
                one.all_reduce(&kernels, &s, dptr(&a, &s), m, rank)?;
                ll.all_reduce(&kernels, &s, dptr(&b, &s), m, rank)?;
            }
            let (ga, gb) = (
                s.clone_dtoh(&a).map_err(cuda_err)?,
                s.clone_dtoh(&b).map_err(cuda_err)?,
            );
            let differ = ga
                .iter()
                .zip(&gb)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            if differ > 0 {
                return Err(EngineError::Internal(format!(
                    "low-latency all-reduce of {m} elements: {differ} values differ from the one-shot kernel's"
                )));
            }
            checked += 1;
        }
        if rank == 0 {
            println!(
                "low-latency all-reduce check ({} blocks): the same bits as the one-shot kernel in {checked} calls of 8 to {} elements",
                ll.blocks,
                ll.half_elems / 2
            );
        }
    }

    // The fused all-reduce, add and RMSNorm (tp 2): checked against the one-shot kernel and
    // the norm, and timed against them.
    let mut fused_lines = Vec::new();
    if let Some(c) = &custom {
        fused_lines = super::bench_ar_norm::check_and_time(&kernels, c, &s, rank)?;
    }
    if rank == 0 && !fused_lines.is_empty() {
        let (checks, rows): (Vec<_>, Vec<_>) =
            fused_lines.iter().partition(|l| !l.starts_with('|'));
        for l in checks {
            println!("{l}");
        }
        println!(
            "| rows | out | one-shot blocks | one-shot + norm µs (graph) | fused µs (graph) | speed-up |"
        );
        println!("|---|---|---|---|---|---|");
        for l in rows {
            println!("{l}");
        }
    }

    // 2. timings
    let max_elems = (64 << 20) / 2;
    // SAFETY: contents do not matter for timing; written before read by the collectives.
    let buf = unsafe { s.alloc::<bf16>(max_elems) }.map_err(cuda_err)?;
    let p = dptr(&buf, &s);
    let mut rows = Vec::new();
    let mut bytes = 8 << 10;
    while bytes <= 64 << 20 {
        let count = bytes / 2;
        let iters = if bytes <= 1 << 20 { 200 } else { 20 };
        barrier.wait();
        let eager_us = time_eager(&comm, &s, p, count, iters)?;
        let graph_us = if bytes <= 1 << 20 {
            Some(time_graph(&comm, &s, p, count, iters)?)
        } else {
            None
        };
        let custom_us = match custom.as_ref().and_then(|c| c.pick(count, false)) {
            // SAFETY: p holds count <= half_elems elements; every rank makes the same calls.
            Some(ar) if count <= ar.half_elems => Some(time_warm(&s, iters, || unsafe {
                ar.all_reduce(&kernels, &s, p, count, rank)
            })?),
            _ => None,
        };
        let ll_us = match custom.as_ref().and_then(|c| c.pick_ll(count)) {
            // SAFETY: p holds count elements, taken by pick_ll; every rank makes the same calls.
            Some(ll) => Some(time_warm(&s, iters, || unsafe {
                ll.all_reduce(&kernels, &s, p, count, rank)
            })?),
            None => None,
        };
        rows.push(Row {
            bytes,
            eager_us,
            graph_us,
            custom_us,
            ll_us,
        });
        bytes *= 2;
    }

    // 3. link peak: GPU 0 -> GPU 1
    let copy = 256usize << 20;
    // Plain device memory (pool memory is not reachable by peer copies at full speed).
    let pbuf = super::tp::PeerMemory::zeroed(&ctx, copy)?;
    if rank == 1
        && let Ok(mut b) = peer_buf.lock()
    {
        *b = Some((pbuf.addr(), ctx.cu_ctx() as usize));
    }
    barrier.wait();
    let mut peak = None;
    if rank == 0
        && let Some((dst, dst_ctx)) = peer_buf.lock().ok().and_then(|b| *b)
    {
        let src = pbuf.addr();
        let go = || -> Result<()> {
            // SAFETY: both buffers hold `copy` bytes and stay allocated until the barrier
            // below, which rank 1 reaches only after this rank synchronized.
            unsafe {
                sys::cuMemcpyPeerAsync(
                    dst,
                    dst_ctx as sys::CUcontext,
                    src,
                    ctx.cu_ctx(),
                    copy,
                    s.cu_stream(),
                )
            }
            .result()
            .map_err(cuda_err)
        };
        go()?;
        s.synchronize().map_err(cuda_err)?;
        let t = Instant::now();
        for _ in 0..10 {
            go()?;
        }
        s.synchronize().map_err(cuda_err)?;
        peak = Some(10.0 * copy as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    barrier.wait();
    drop(comm);
    Ok((rows, peak, device))
}

fn time_eager(
    comm: &Comm,
    s: &Arc<CudaStream>,
    p: Dptr<bf16>,
    count: usize,
    iters: usize,
) -> Result<f64> {
    let run = |k: usize| -> Result<()> {
        for _ in 0..k {
            // SAFETY: p holds at least count elements; all ranks queue the same calls.
            unsafe { comm.all_reduce_sum(p, count, s) }.map_err(nccl_err)?;
        }
        Ok(())
    };
    run(5)?;
    s.synchronize().map_err(cuda_err)?;
    let t = Instant::now();
    run(iters)?;
    s.synchronize().map_err(cuda_err)?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

fn time_graph(
    comm: &Comm,
    s: &Arc<CudaStream>,
    p: Dptr<bf16>,
    count: usize,
    iters: usize,
) -> Result<f64> {
    // SAFETY: as in `time_eager`; captured, run at launch.
    time_in_graph(s, iters, || {
        unsafe { comm.all_reduce_sum(p, count, s) }.map_err(nccl_err)
    })
}

/// Microseconds per call of `call`, captured `iters` times into one CUDA graph and replayed
/// (after one replay to warm up).
pub(super) fn time_in_graph(
    s: &Arc<CudaStream>,
    iters: usize,
    call: impl Fn() -> Result<()>,
) -> Result<f64> {
    s.synchronize().map_err(cuda_err)?;
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(cuda_err)?;
    let mut body = Ok(());
    for _ in 0..iters {
        if let Err(e) = call() {
            body = Err(e);
            break;
        }
    }
    let graph = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(cuda_err);
    body?;
    let graph = graph?.ok_or_else(|| EngineError::Internal("empty graph".into()))?;
    graph.launch().map_err(cuda_err)?;
    s.synchronize().map_err(cuda_err)?;
    let t = Instant::now();
    graph.launch().map_err(cuda_err)?;
    s.synchronize().map_err(cuda_err)?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// Microseconds per call of `call` in a CUDA graph, after five calls outside one.
fn time_warm(s: &Arc<CudaStream>, iters: usize, call: impl Fn() -> Result<()>) -> Result<f64> {
    for _ in 0..5 {
        call()?;
    }
    time_in_graph(s, iters, call)
}
