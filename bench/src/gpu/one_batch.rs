//! `bench-one-batch --model DIR [--batch B] [--input I] [--output O] [--disable-cuda-graph]
//! [--gemv on|off|both|ablate] [--ttft-input N] [--attn-sweep 1,8,64]`: static batch, prints
//! TTFT, decode tok/s, and the memory roofline (weight bytes per step ÷ device copy bandwidth
//! measured in the same run) and compute floor of the prefill (FLOPs ÷ bf16 GEMM rate measured
//! in the same run), as JSON and a table. `--gemv both` runs the batch with the decode GEMV and
//! again with cuBLASLt only (as `SGL_DISABLE_GEMV=1` would); `--gemv ablate` runs the decode
//! forms one by one: GEMV with RMSNorm fused and programmatic dependent launch (the default),
//! without PDL, without the norm fusion, and cuBLASLt; `--ttft-input N` adds a batch-1 TTFT of
//! an N-token prompt (median of 9) to the report; `--attn-sweep 1,8,64` times decode steps with
//! the one-launch decode attention and the three-launch form at each of those batch sizes.
//! Engine flags `--cuda-graph-max-bs`, `--max-total-tokens`, `--mem-fraction-static`,
//! `--tp-size`, `--quantization fp8` and `--kv-cache-dtype` are honoured. `--profile-steps N`
//! brackets the last N decode steps of the measured run with the CUDA profiler's start and stop,
//! so a profiler started with its collection off (Nsight Compute's `--profile-from-start off`)
//! sees only those steps' kernels.

use std::time::Instant;

use cudarc::driver::result as dres;
use half::bf16;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sgl_core::backend::cuda::CudaBackend;
use sgl_core::backend::{Backend, SeqInput};
use sgl_core::error::{EngineError, Result};
use sgl_core::model::config::ModelConfig;
use sgl_kernels::dptr;

use super::{Slots, arg, arg_usize, cuda_err, open, random_tokens};

#[derive(Debug, Clone)]
pub struct BenchOneBatchArgs {
    pub batch_size: usize,
    pub input_len: usize,
    pub output_len: usize,
    /// Decode steps at the end of the measured run the profiler sees (0: no profiler range).
    pub profile_steps: usize,
}

/// Runs `bench-one-batch` (see the module docs).
pub fn run(args: &[String]) -> Result<()> {
    let mut b = open(args)?;
    let a = BenchOneBatchArgs {
        batch_size: arg_usize(args, "--batch", 1)?,
        input_len: arg_usize(args, "--input", 128)?,
        output_len: arg_usize(args, "--output", 256)?,
        profile_steps: arg_usize(args, "--profile-steps", 0)?,
    };
    let pdl = b.pdl();
    let (fuse, attn) = (b.norm_fusion(), b.attn_fusion());
    // (GEMV, norm fusion, decode attention fusion, PDL)
    let modes: &[(bool, bool, bool, bool)] = match arg(args, "--gemv").unwrap_or("on") {
        "on" => &[(true, fuse, attn, pdl)],
        "off" => &[(false, false, attn, pdl)],
        "both" => &[(true, fuse, attn, pdl), (false, false, attn, pdl)],
        "ablate" => &[
            (true, true, true, true),
            (true, true, true, false),
            (true, true, false, true),
            (true, false, false, true),
            (false, false, false, true),
        ],
        other => {
            return Err(EngineError::InvalidArgument(format!(
                "--gemv expects on, off, both or ablate, got {other}"
            )));
        }
    };
    let mut reports = Vec::new();
    for &(gemv, fuse, attn, pdl) in modes {
        b.set_decode_form(gemv, fuse, attn, pdl)?;
        let r = bench_one_batch(&mut b, &a)?;
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
        reports.push(r);
    }
    if reports.len() > 2 {
        println!("| decode form | ms/step | tok/s | of roofline |");
        println!("|---|---|---|---|");
        for r in &reports {
            println!(
                "| GEMV {}, norm fused {}, attention fused {}, PDL {} | {:.3} | {:.1} | {:.1}% |",
                r.gemv,
                r.norm_fused,
                r.attn_fused,
                r.pdl,
                r.decode_ms_per_step,
                r.decode_tok_s,
                100.0 * r.roofline_fraction
            );
        }
    }
    let first = modes[0];
    b.set_decode_form(first.0, first.1, first.2, first.3)?;
    if b.tp_size() > 1
        && let Some(with) = reports.first()
    {
        // The same batch with the all-reduces left out (timing only: wrong numbers).
        b.set_skip_all_reduce(true)?;
        let without = bench_one_batch(&mut b, &a);
        b.set_skip_all_reduce(false)?;
        let without = without?;
        println!(
            "| all-reduce share of a decode step (tp {}, batch {}) | {:.3} ms/step with, {:.3} without | {:.1}% | {:.1} µs per all-reduce ({} per step) |",
            b.tp_size(),
            a.batch_size,
            with.decode_ms_per_step,
            without.decode_ms_per_step,
            100.0 * (1.0 - without.decode_ms_per_step / with.decode_ms_per_step),
            1000.0 * (with.decode_ms_per_step - without.decode_ms_per_step)
                / (2 * b.config().num_layers) as f64,
            2 * b.config().num_layers
        );
    }
    if let [with, without] = &reports[..] {
        let e = gemv_consistency(&mut b)?;
        println!(
            "GEMV vs cuBLASLt: decode logits of 3 sequences (graph bucket 4) differ by rel err {e:.2e} ({})",
            if e < 0.15 {
                "ok: rounding level, as amplified over the layers of a random checkpoint"
            } else {
                "TOO LARGE: check the GEMV path"
            }
        );
        println!(
            "| GEMV on vs off | {:.3} vs {:.3} ms/step | {:.1}% vs {:.1}% of roofline | speed-up {:.3}x |",
            with.decode_ms_per_step,
            without.decode_ms_per_step,
            100.0 * with.roofline_fraction,
            100.0 * without.roofline_fraction,
            without.decode_ms_per_step / with.decode_ms_per_step
        );
    }
    if let Some(list) = arg(args, "--attn-sweep") {
        attn_sweep(&mut b, &a, list)?;
        b.set_decode_form(first.0, first.1, first.2, first.3)?;
    }
    if let Some(n) = arg(args, "--ttft-input") {
        let n: usize = n.parse().map_err(|_| {
            EngineError::InvalidArgument(format!("--ttft-input expects a number, got {n}"))
        })?;
        ttft_only(&mut b, n)?;
    }
    Ok(())
}

#[derive(Debug, Serialize)]
pub struct OneBatchReport {
    pub device: String,
    pub batch_size: usize,
    pub input_len: usize,
    pub output_len: usize,
    pub cuda_graph: bool,
    /// Decode-sized GEMMs on the GEMV kernel (else cuBLASLt).
    pub gemv: bool,
    /// RMSNorm inside the decode GEMVs, o_proj and down added into the residual.
    pub norm_fused: bool,
    /// RoPE, K/V store, attention and split merge in one decode kernel.
    pub attn_fused: bool,
    /// Kernels launched with programmatic dependent launch.
    pub pdl: bool,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_ms_per_step: f64,
    pub decode_tok_s: f64,
    pub weight_gb: f64,
    pub copy_bw_gb_s: f64,
    pub roofline_ms_per_step: f64,
    pub roofline_fraction: f64,
    pub gemm_tflops: f64,
    pub prefill_floor_ms: f64,
    pub ttft_over_floor: f64,
}

/// Most prompt tokens one prefill pass of the benchmark takes (the GPU server's default chunk is
/// 8192; a pass here keeps prompts whole, so up to twice that).
const PREFILL_PASS_TOKENS: usize = 16384;

/// Starts or stops the CUDA profiler's collection (a no-op without a profiler attached).
fn profiler(start: bool) -> Result<()> {
    use cudarc::driver::sys;
    // SAFETY: no arguments; the driver is initialised (the backend holds a context).
    let r = unsafe {
        if start {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(EngineError::Internal(format!(
            "CUDA profiler start/stop: {r:?}"
        )))
    }
}

/// Device-to-device copy bandwidth (bytes read + written per second), median of 10.
fn copy_bandwidth(b: &CudaBackend) -> Result<f64> {
    let s = b.stream();
    let n = 1usize << 30;
    let src = s.alloc_zeros::<u8>(n).map_err(cuda_err)?;
    let dst = s.alloc_zeros::<u8>(n).map_err(cuda_err)?;
    // SAFETY: fill the source with a non-zero byte pattern.
    unsafe { dres::memset_d8_async(dptr(&src, s).addr(), 0x5a, n, s.cu_stream()) }
        .map_err(cuda_err)?;
    let mut times = Vec::new();
    for i in 0..13 {
        let t = Instant::now();
        // SAFETY: both buffers hold n bytes.
        unsafe {
            dres::memcpy_dtod_async(dptr(&dst, s).addr(), dptr(&src, s).addr(), n, s.cu_stream())
        }
        .map_err(cuda_err)?;
        s.synchronize().map_err(cuda_err)?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * n as f64 / times[times.len() / 2])
}

/// FLOP/s of `gemm`, one n x n x n product, median of 10 after 3 warm-up calls.
fn gemm_flops(b: &CudaBackend, n: usize, mut gemm: impl FnMut() -> Result<()>) -> Result<f64> {
    let s = b.stream();
    let mut times = Vec::new();
    for i in 0..13 {
        let t = Instant::now();
        gemm()?;
        s.synchronize().map_err(cuda_err)?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * (n * n * n) as f64 / times[times.len() / 2])
}

/// bf16 GEMM rate through the engine's own GEMM path on random data, 8192^3.
fn gemm_rate(b: &CudaBackend) -> Result<f64> {
    let s = b.stream();
    let n = 8192usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let host: Vec<bf16> = (0..n * n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    let x = s.clone_htod(&host).map_err(cuda_err)?;
    let w = s.clone_htod(&host).map_err(cuda_err)?;
    let y = s.alloc_zeros::<bf16>(n * n).map_err(cuda_err)?;
    gemm_flops(b, n, || {
        // SAFETY: n x n buffers.
        unsafe {
            b.gemm_path()
                .linear(dptr(&x, s), dptr(&w, s), dptr(&y, s), n, n, n, false)
        }
        .map_err(cuda_err)
    })
}

/// FP8 GEMM rate (e4m3 in, bf16 out, the engine's cuBLASLt path), 8192^3.
fn gemm_rate_fp8(b: &CudaBackend) -> Result<f64> {
    let s = b.stream();
    let n = 8192usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // finite e4m3 values only (0x7f and 0xff are NaN)
    let host: Vec<u8> = (0..n * n).map(|_| rng.random_range(0..0x7fu8)).collect();
    let x = s.clone_htod(&host).map_err(cuda_err)?;
    let w = s.clone_htod(&host).map_err(cuda_err)?;
    let y = s.alloc_zeros::<bf16>(n * n).map_err(cuda_err)?;
    gemm_flops(b, n, || {
        // SAFETY: n x n buffers.
        unsafe {
            b.gemm_path()
                .linear_fp8(dptr(&x, s), dptr(&w, s), dptr(&y, s), n, n, n)
        }
        .map_err(cuda_err)
    })
}

/// GEMM rates for the prefill floor: bf16, and FP8 when the layers' weights are FP8.
struct Rates {
    bf16: f64,
    fp8: Option<f64>,
}

fn rates(b: &CudaBackend) -> Result<Rates> {
    Ok(Rates {
        bf16: gemm_rate(b)?,
        fp8: if b.fp8_weights() {
            Some(gemm_rate_fp8(b)?)
        } else {
            None
        },
    })
}

/// Seconds of a prefill of `t` tokens at the measured GEMM rates: the layers' weight GEMMs at
/// the FP8 rate when they are FP8, causal attention (scores and values) and the LM head at the
/// bf16 rate. With tensor parallelism the layers' work (GEMMs and attention heads) is split
/// over `tp` GPUs running at once; the LM head (one token's logits) is not.
fn prefill_floor(c: &ModelConfig, t: usize, r: &Rates, tp: usize) -> f64 {
    let h = c.hidden_size as f64;
    let hd = c.head_dim as f64;
    let per_tok_layer = 2.0
        * (h * (c.num_heads + 2 * c.num_kv_heads) as f64 * hd
            + c.num_heads as f64 * hd * h
            + 3.0 * h * c.intermediate_size as f64);
    let attn = 2.0 * 2.0 * c.num_heads as f64 * hd * (t as f64 * (t as f64 + 1.0) / 2.0);
    let layers = c.num_layers as f64 * per_tok_layer * t as f64;
    let tp = tp.max(1) as f64;
    let attn = c.num_layers as f64 * attn;
    let head = 2.0 * h * c.vocab_size as f64;
    (layers / r.fp8.unwrap_or(r.bf16) + attn / r.bf16) / tp + head / r.bf16
}

pub fn bench_one_batch(b: &mut CudaBackend, a: &BenchOneBatchArgs) -> Result<OneBatchReport> {
    let cfg = b.config().clone();
    let copy_bw = copy_bandwidth(b)?;
    let rates = rates(b)?;
    let gemm = rates.fp8.unwrap_or(rates.bf16);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let run =
        |b: &mut CudaBackend, rng: &mut rand::rngs::StdRng, profile: bool| -> Result<(f64, f64)> {
            let mut slots = Slots {
                next: 0,
                cap: b.kv_capacity() as u32,
            };
            let prompts: Vec<Vec<u32>> = (0..a.batch_size)
                .map(|_| random_tokens(rng, a.input_len, cfg.vocab_size))
                .collect();
            let mut seq_slots: Vec<Vec<u32>> = Vec::new();
            for _ in 0..a.batch_size {
                seq_slots.push(slots.take(a.input_len + a.output_len)?);
            }
            let t0 = Instant::now();
            let batch: Vec<SeqInput> = prompts
                .iter()
                .zip(&seq_slots)
                .map(|(p, s)| SeqInput {
                    tokens: p,
                    start_pos: 0,
                    kv_slots: &s[..a.input_len],
                    num_logits: 1,
                    prompt: true,
                })
                .collect();
            // Prompts go in passes of at most PREFILL_PASS_TOKENS tokens (whole prompts), as the
            // scheduler's chunked prefill bounds a pass: a large batch of long prompts in one pass
            // would need activations of every token at once.
            let per_pass = (PREFILL_PASS_TOKENS / a.input_len.max(1)).max(1);
            let mut next = Vec::with_capacity(batch.len());
            for group in batch.chunks(per_pass) {
                next.extend(b.forward_sample_all(group, 0.0)?);
            }
            let ttft = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let profile_from = a.output_len.saturating_sub(a.profile_steps).max(1);
            for step in 1..a.output_len {
                if profile && step == profile_from {
                    profiler(true)?;
                }
                let pos = a.input_len + step - 1;
                let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let batch: Vec<SeqInput> = toks
                    .iter()
                    .zip(&seq_slots)
                    .map(|(t, s)| SeqInput {
                        tokens: t,
                        start_pos: pos,
                        kv_slots: &s[..pos + 1],
                        num_logits: 1,
                        prompt: false,
                    })
                    .collect();
                next = b.forward_sample_all(&batch, 0.0)?;
            }
            if profile && profile_from < a.output_len {
                b.stream().synchronize().map_err(cuda_err)?;
                profiler(false)?;
            }
            let decode = t1.elapsed().as_secs_f64() / (a.output_len.max(2) - 1) as f64;
            Ok((ttft, decode))
        };
    run(b, &mut rng, false)?; // warm-up: graph capture, cuBLASLt plans
    let (ttft, step) = run(b, &mut rng, a.profile_steps > 0)?;
    let weight_bytes = b.weight_bytes() as f64;
    // A decode step reads every weight once except the embedding table (one row per token).
    let read = weight_bytes
        - if b.untied_lm_head() {
            (cfg.vocab_size * cfg.hidden_size * 2) as f64
        } else {
            0.0
        };
    // copy bandwidth counts read + write; a weight read moves its bytes once
    let roofline = read / copy_bw;
    let floor = prefill_floor(&cfg, a.input_len, &rates, b.tp_size()) * a.batch_size as f64;
    let r = OneBatchReport {
        device: b.device_name().to_string(),
        batch_size: a.batch_size,
        input_len: a.input_len,
        output_len: a.output_len,
        cuda_graph: !b.options().disable_cuda_graph
            && a.batch_size <= b.options().cuda_graph_max_bs,
        gemv: b.gemv_enabled(),
        norm_fused: b.norm_fused_for(a.batch_size),
        attn_fused: b.attn_fusion(),
        pdl: b.pdl(),
        ttft_ms: ttft * 1e3,
        prefill_tok_s: (a.batch_size * a.input_len) as f64 / ttft,
        decode_ms_per_step: step * 1e3,
        decode_tok_s: a.batch_size as f64 / step,
        weight_gb: weight_bytes / 1e9,
        copy_bw_gb_s: copy_bw / 1e9,
        roofline_ms_per_step: roofline * 1e3,
        roofline_fraction: roofline / step,
        gemm_tflops: gemm / 1e12,
        prefill_floor_ms: floor * 1e3,
        ttft_over_floor: ttft / floor,
    };
    println!(
        "| device | batch | in | out | graph | GEMV | TTFT ms | floor ms | TTFT/floor | decode tok/s | ms/step | roofline ms | of roofline | copy GB/s | GEMM TFLOP/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1}% | {:.0} | {:.0} |",
        r.device,
        r.batch_size,
        r.input_len,
        r.output_len,
        r.cuda_graph,
        r.gemv,
        r.ttft_ms,
        r.prefill_floor_ms,
        r.ttft_over_floor,
        r.decode_tok_s,
        r.decode_ms_per_step,
        r.roofline_ms_per_step,
        100.0 * r.roofline_fraction,
        r.copy_bw_gb_s,
        r.gemm_tflops
    );
    Ok(r)
}

/// Logits of one decode step of 3 sequences with the GEMV and with cuBLASLt: ‖a − b‖ / ‖b‖.
/// The two differ only in summation order (GEMM outputs ~2e-3 apart, bf16 rounding); a random
/// 32-layer checkpoint amplifies that by the logits (results/gpu/README.md: two bf16 forwards
/// end 5e-2 apart), so a few 1e-2 is expected, while a wiring error (wrong rows, layout or
/// epilogue) gives order 1.
fn gemv_consistency(b: &mut CudaBackend) -> Result<f64> {
    let v = b.vocab_size();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let prompts: Vec<Vec<u32>> = (0..3).map(|_| random_tokens(&mut rng, 64, v)).collect();
    let slots: Vec<Vec<u32>> = (0..3u32)
        .map(|i| (i * 65..(i + 1) * 65).collect())
        .collect();
    let mut logits = Vec::new();
    for on in [true, false] {
        b.set_gemv(on)?;
        let pre: Vec<SeqInput> = prompts
            .iter()
            .zip(&slots)
            .map(|(p, s)| SeqInput {
                tokens: p,
                start_pos: 0,
                kv_slots: &s[..64],
                num_logits: 1,
                prompt: true,
            })
            .collect();
        b.forward(&pre)?;
        let next: Vec<[u32; 1]> = (0..3u32).map(|i| [7 + i]).collect();
        let dec: Vec<SeqInput> = next
            .iter()
            .zip(&slots)
            .map(|(t, s)| SeqInput {
                tokens: t,
                start_pos: 64,
                kv_slots: s,
                num_logits: 1,
                prompt: false,
            })
            .collect();
        logits.push(b.forward(&dec)?);
    }
    let (num, den) = logits[0]
        .iter()
        .zip(&logits[1])
        .fold((0.0f64, 0.0f64), |(n, d), (&x, &y)| {
            (n + ((x - y) as f64).powi(2), d + (y as f64).powi(2))
        });
    Ok(if num.is_finite() {
        (num / den.max(1e-30)).sqrt()
    } else {
        f64::INFINITY
    })
}

/// Decode step time with the one-launch decode attention and with the three-launch form, for
/// each batch size of `list` (comma-separated), the rest of the decode form as it is.
fn attn_sweep(b: &mut CudaBackend, a: &BenchOneBatchArgs, list: &str) -> Result<()> {
    let (gemv, fuse, pdl) = (b.gemv_enabled(), b.norm_fusion(), b.pdl());
    let mut rows = Vec::new();
    for item in list.split(',') {
        let bs: usize = item.trim().parse().map_err(|_| {
            EngineError::InvalidArgument(format!("--attn-sweep expects batch sizes, got {item}"))
        })?;
        let args = BenchOneBatchArgs {
            batch_size: bs,
            ..a.clone()
        };
        let mut ms = [0.0; 2];
        for (i, attn) in [true, false].into_iter().enumerate() {
            b.set_decode_form(gemv, fuse, attn, pdl)?;
            ms[i] = bench_one_batch(b, &args)?.decode_ms_per_step;
        }
        rows.push((bs, ms));
    }
    println!(
        "| batch | in | out | one-launch attention ms/step | three launches ms/step | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    for (bs, [one, three]) in rows {
        println!(
            "| {bs} | {} | {} | {one:.3} | {three:.3} | {:.3} |",
            a.input_len,
            a.output_len,
            three / one
        );
    }
    Ok(())
}

/// Prefills before [`ttft_only`] times any.
const TTFT_WARMUP: usize = 2;
/// Timed prefills of [`ttft_only`], of which the median counts.
const TTFT_RUNS: usize = 9;

/// Batch-1 time to first token of an `n`-token prompt, median of [`TTFT_RUNS`] (after
/// [`TTFT_WARMUP`] warm-ups), against the prefill's compute floor; prints JSON and a table row.
/// Two runs of a median of 3 once read 15.1 and 16.2 ms on one GPU with the same kernels and
/// GEMM algorithms, as far apart as the FP8 goal from its reading: hence more runs.
fn ttft_only(b: &mut CudaBackend, n: usize) -> Result<()> {
    let cfg = b.config().clone();
    let rates = rates(b)?;
    let gemm = rates.fp8.unwrap_or(rates.bf16);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let slots: Vec<u32> = (0..n as u32).collect();
    if n > b.kv_capacity() {
        return Err(EngineError::InvalidArgument(format!(
            "--ttft-input {n} exceeds the KV pool"
        )));
    }
    let mut times = Vec::new();
    for i in 0..TTFT_WARMUP + TTFT_RUNS {
        let prompt = random_tokens(&mut rng, n, cfg.vocab_size);
        let t0 = Instant::now();
        b.forward_sample_all(
            &[SeqInput {
                tokens: &prompt,
                start_pos: 0,
                kv_slots: &slots,
                num_logits: 1,
                prompt: true,
            }],
            0.0,
        )?;
        if i >= TTFT_WARMUP {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let ttft = times[times.len() / 2];
    let floor = prefill_floor(&cfg, n, &rates, b.tp_size());
    println!(
        "{}",
        serde_json::json!({
            "ttft_input": n,
            "ttft_ms": ttft * 1e3,
            "prefill_floor_ms": floor * 1e3,
            "ttft_over_floor": ttft / floor,
            "gemm_tflops": gemm / 1e12,
        })
    );
    println!("| TTFT prompt | TTFT ms (median of {TTFT_RUNS}) | floor ms | TTFT/floor |");
    println!("|---|---|---|---|");
    println!(
        "| {n} | {:.1} | {:.1} | {:.2} |",
        ttft * 1e3,
        floor * 1e3,
        ttft / floor
    );
    Ok(())
}
