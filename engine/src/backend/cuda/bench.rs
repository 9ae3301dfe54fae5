//! GPU benchmarks and the end-to-end check driver, run as
//! `bench_main(["one-batch", ...])` (the CLI wires `bench-one-batch --device cuda` here).
//!
//! - `one-batch --model DIR [--batch B] [--input I] [--output O] [--disable-cuda-graph]
//!   [--gemv on|off|both] [--ttft-input N]`: static batch, prints TTFT, decode tok/s, and the
//!   memory roofline (weight bytes per step ÷ device copy bandwidth measured in the same run)
//!   and compute floor of the prefill (FLOPs ÷ bf16 GEMM rate measured in the same run), as
//!   JSON and a table. `--gemv both` runs the batch with the decode GEMV and again with
//!   cuBLASLt only (as `SGL_DISABLE_GEMV=1` would); `--gemv ablate` runs the decode forms one
//!   by one: GEMV with RMSNorm fused and programmatic dependent launch (the default), without
//!   PDL, without the norm fusion, and cuBLASLt; `--ttft-input N` adds a batch-1 TTFT of an
//!   N-token prompt (median of 3) to the report; `--attn-sweep 1,8,64` times decode steps with
//!   the one-launch decode attention and the three-launch form at each of those batch sizes.
//! - `check --model DIR --prompts FILE --out DIR`: runs the prompts of FILE greedily (the
//!   transformers comparison script writes FILE and reads what this writes).
//! - `offline --model DIR ...`: SGLang's bench_offline_throughput through the real engine
//!   (`scheduler::launch`, every request submitted at once, streams read to the end); see
//!   [`offline_engine`] for the dataset flags. Prints JSON and a table (output and total tok/s,
//!   the radix cache hit rate from the engine's counters, wall time).
//! - `offline --backend-loop --model DIR --num-prompts N --max-input I --max-output O`: the
//!   benchmark's own continuous-batching loop straight on the backend (no scheduler, no radix
//!   cache, sampling on the GPU): the engine's upper bound without host-side overheads.

use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::driver::result as dres;
use half::bf16;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sgl_kernels::dptr;

use super::{CudaBackend, CudaOptions, cuda_err};
use crate::backend::{Backend, SeqInput};
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;

#[derive(Debug, Clone)]
pub struct BenchOneBatchArgs {
    pub batch_size: usize,
    pub input_len: usize,
    pub output_len: usize,
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

fn arg_usize(args: &[String], name: &str, default: usize) -> Result<usize> {
    match arg(args, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| EngineError::InvalidArgument(format!("{name} expects a number, got {v}"))),
    }
}

fn open(args: &[String]) -> Result<CudaBackend> {
    let model = arg(args, "--model")
        .ok_or_else(|| EngineError::InvalidArgument("--model DIR is required".into()))?;
    let model = crate::model::load(&PathBuf::from(model))?;
    let opts = CudaOptions {
        disable_cuda_graph: args.iter().any(|a| a == "--disable-cuda-graph"),
        cuda_graph_max_bs: arg_usize(args, "--cuda-graph-max-bs", 160)?,
        max_total_tokens: arg(args, "--max-total-tokens").and_then(|v| v.parse().ok()),
        mem_fraction_static: arg(args, "--mem-fraction-static")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.88),
        tensor_parallel: crate::model::llama::TensorParallel {
            rank: 0,
            size: arg_usize(args, "--tp-size", 1)?,
        },
        quantization: match arg(args, "--quantization") {
            None => crate::model::Quantization::AsStored,
            Some("fp8") => crate::model::Quantization::Fp8,
            Some(q) => {
                return Err(EngineError::InvalidArgument(format!(
                    "--quantization {q}: only fp8 is supported"
                )));
            }
        },
        kv: match arg(args, "--kv-cache-dtype") {
            None | Some("auto") => sgl_kernels::KvDtype::Bf16,
            Some("fp8_e4m3") => sgl_kernels::KvDtype::Fp8E4m3,
            Some("fp8_e5m2") => sgl_kernels::KvDtype::Fp8E5m2,
            Some(k) => {
                return Err(EngineError::InvalidArgument(format!(
                    "--kv-cache-dtype {k}: auto, fp8_e4m3 or fp8_e5m2"
                )));
            }
        },
        ..CudaOptions::default()
    };
    CudaBackend::load(&model, &opts)
}

/// Entry point for the benchmark and check commands (see the module docs).
pub fn bench_main(args: &[String]) -> Result<()> {
    let cmd = args.first().map(|s| s.as_str()).unwrap_or("");
    match cmd {
        "one-batch" => {
            let mut b = open(args)?;
            let a = BenchOneBatchArgs {
                batch_size: arg_usize(args, "--batch", 1)?,
                input_len: arg_usize(args, "--input", 128)?,
                output_len: arg_usize(args, "--output", 256)?,
            };
            let pdl = b.kernels.pdl();
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
        "all-reduce" => super::bench_comm::all_reduce_bench(arg_usize(args, "--tp-size", 2)?),
        "check" => {
            let mut b = open(args)?;
            let prompts = arg(args, "--prompts")
                .ok_or_else(|| EngineError::InvalidArgument("--prompts FILE is required".into()))?;
            let out = arg(args, "--out")
                .ok_or_else(|| EngineError::InvalidArgument("--out DIR is required".into()))?;
            check(&mut b, Path::new(prompts), Path::new(out))
        }
        "offline" if !args.iter().any(|a| a == "--backend-loop") => {
            offline_engine(&args[1..]).map(|_| ())
        }
        "offline" => {
            let mut b = open(args)?;
            let r = offline(
                &mut b,
                arg_usize(args, "--num-prompts", 1000)?,
                arg_usize(args, "--max-input", 1024)?,
                arg_usize(args, "--max-output", 1024)?,
                arg_usize(args, "--seed", 1)? as u64,
                arg_usize(args, "--max-running", 256)?,
            )?;
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            Ok(())
        }
        other => Err(EngineError::InvalidArgument(format!(
            "unknown bench command {other:?} (one-batch, check, offline, all-reduce)"
        ))),
    }
}

/// Hands out KV slots in order (the benchmarks run without the radix cache).
struct Slots {
    next: u32,
    cap: u32,
}

impl Slots {
    fn take(&mut self, n: usize) -> Result<Vec<u32>> {
        if self.next as usize + n > self.cap as usize {
            return Err(EngineError::Internal(
                "benchmark ran out of KV slots".into(),
            ));
        }
        let v = (self.next..self.next + n as u32).collect();
        self.next += n as u32;
        Ok(v)
    }
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
            b.gemm
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
            b.gemm
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
        fp8: if b.w.fp8() {
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

fn random_tokens(rng: &mut impl Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

pub fn bench_one_batch(b: &mut CudaBackend, a: &BenchOneBatchArgs) -> Result<OneBatchReport> {
    let cfg = b.config().clone();
    let copy_bw = copy_bandwidth(b)?;
    let rates = rates(b)?;
    let gemm = rates.fp8.unwrap_or(rates.bf16);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let run = |b: &mut CudaBackend, rng: &mut rand::rngs::StdRng| -> Result<(f64, f64)> {
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
            })
            .collect();
        let mut next = b.forward_sample_all(&batch, 0.0)?;
        let ttft = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for step in 1..a.output_len {
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
                })
                .collect();
            next = b.forward_sample_all(&batch, 0.0)?;
        }
        let decode = t1.elapsed().as_secs_f64() / (a.output_len.max(2) - 1) as f64;
        Ok((ttft, decode))
    };
    run(b, &mut rng)?; // warm-up: graph capture, cuBLASLt plans
    let (ttft, step) = run(b, &mut rng)?;
    let weight_bytes = b.weight_bytes() as f64;
    // A decode step reads every weight once except the embedding table (one row per token).
    let read = weight_bytes
        - if b.w.lm_head.is_some() {
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
        cuda_graph: !b.opts.disable_cuda_graph && a.batch_size <= b.opts.cuda_graph_max_bs,
        gemv: b.gemv_enabled(),
        norm_fused: b.fused_norm(a.batch_size),
        attn_fused: b.attn_fusion(),
        pdl: b.kernels.pdl(),
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
    let (gemv, fuse, pdl) = (b.gemv_enabled(), b.norm_fusion(), b.kernels.pdl());
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

/// Batch-1 time to first token of an `n`-token prompt, median of 3 (after one warm-up), against
/// the prefill's compute floor; prints JSON and a table row.
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
    for i in 0..4 {
        let prompt = random_tokens(&mut rng, n, cfg.vocab_size);
        let t0 = Instant::now();
        b.forward_sample_all(
            &[SeqInput {
                tokens: &prompt,
                start_pos: 0,
                kv_slots: &slots,
                num_logits: 1,
            }],
            0.0,
        )?;
        if i > 0 {
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
    println!("| TTFT prompt | TTFT ms (median of 3) | floor ms | TTFT/floor |");
    println!("|---|---|---|---|");
    println!(
        "| {n} | {:.1} | {:.1} | {:.2} |",
        ttft * 1e3,
        floor * 1e3,
        ttft / floor
    );
    Ok(())
}

#[derive(Deserialize)]
struct CheckCase {
    name: String,
    prompts: Vec<Vec<u32>>,
    /// Tokens every prompt of the case shares; run once, then reused as a cached prefix.
    #[serde(default)]
    shared_prefix: usize,
}

#[derive(Deserialize)]
struct CheckFile {
    steps: usize,
    cases: Vec<CheckCase>,
}

#[derive(Serialize)]
struct CheckOut {
    name: String,
    tokens: Vec<Vec<u32>>,
    /// Per sequence and step, the gap between the two largest logits (how near a tie the
    /// greedy choice was).
    margins: Vec<Vec<f32>>,
}

/// The gap between the largest and the second largest value.
fn top2_margin(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy generation through `Backend::forward` (host logits), for the transformers check.
/// Writes `<out>/ours.json` (tokens) and `<out>/ours_<case>.f32` (prefill logits, row-major).
fn check(b: &mut CudaBackend, prompts: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(prompts)
        .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", prompts.display())))?;
    let f: CheckFile = serde_json::from_str(&text)
        .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", prompts.display())))?;
    std::fs::create_dir_all(out).map_err(|e| EngineError::Internal(e.to_string()))?;
    let v = b.vocab_size();
    let mut results = Vec::new();
    for case in &f.cases {
        let mut slots = Slots {
            next: 0,
            cap: b.kv_capacity() as u32,
        };
        let p = case.shared_prefix;
        let prefix_slots = slots.take(p)?;
        if p > 0 {
            let pre = SeqInput {
                tokens: &case.prompts[0][..p],
                start_pos: 0,
                kv_slots: &prefix_slots,
                num_logits: 0,
            };
            b.forward(&[pre])?;
        }
        let mut seq_slots = Vec::new();
        for pr in &case.prompts {
            let mut s = prefix_slots.clone();
            s.extend(slots.take(pr.len() - p + f.steps)?);
            seq_slots.push(s);
        }
        let t0 = Instant::now();
        let batch: Vec<SeqInput> = case
            .prompts
            .iter()
            .zip(&seq_slots)
            .map(|(pr, s)| SeqInput {
                tokens: &pr[p..],
                start_pos: p,
                kv_slots: &s[..pr.len()],
                num_logits: 1,
            })
            .collect();
        let logits = b.forward(&batch)?;
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(out.join(format!("ours_{}.f32", case.name)), bytes)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let mut generated: Vec<Vec<u32>> = logits.chunks(v).map(|r| vec![argmax(r)]).collect();
        let mut margins: Vec<Vec<f32>> = logits.chunks(v).map(|r| vec![top2_margin(r)]).collect();
        for step in 1..f.steps {
            let toks: Vec<[u32; 1]> = generated.iter().map(|g| [g[step - 1]]).collect();
            let batch: Vec<SeqInput> = case
                .prompts
                .iter()
                .zip(&seq_slots)
                .zip(&toks)
                .map(|((pr, s), t)| {
                    let pos = pr.len() + step - 1;
                    SeqInput {
                        tokens: t,
                        start_pos: pos,
                        kv_slots: &s[..pos + 1],
                        num_logits: 1,
                    }
                })
                .collect();
            let logits = b.forward(&batch)?;
            for ((g, m), r) in generated
                .iter_mut()
                .zip(margins.iter_mut())
                .zip(logits.chunks(v))
            {
                g.push(argmax(r));
                m.push(top2_margin(r));
            }
        }
        eprintln!(
            "check {}: {} prompts, {:.2}s",
            case.name,
            case.prompts.len(),
            t0.elapsed().as_secs_f64()
        );
        results.push(CheckOut {
            name: case.name.clone(),
            tokens: generated,
            margins,
        });
    }
    let j = serde_json::to_string(&results).map_err(|e| EngineError::Internal(e.to_string()))?;
    std::fs::write(out.join("ours.json"), j).map_err(|e| EngineError::Internal(e.to_string()))?;
    Ok(())
}

#[derive(Debug, Serialize)]
pub struct OfflineReport {
    pub device: String,
    pub num_prompts: usize,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub seconds: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
}

struct Req {
    prompt: Vec<u32>,
    out_len: usize,
    slots: Vec<u32>,
    generated: Vec<u32>,
    prefilled: usize,
}

/// Continuous batching without a radix cache: up to `max_running` requests; each step runs
/// either one prefill chunk batch (new requests, up to 8192 tokens) or one decode batch.
fn offline(
    b: &mut CudaBackend,
    n: usize,
    max_in: usize,
    max_out: usize,
    seed: u64,
    max_running: usize,
) -> Result<OfflineReport> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = b.vocab_size();
    let mut waiting: std::collections::VecDeque<Req> = (0..n)
        .map(|_| {
            let il = rng.random_range(1..=max_in);
            let ol = rng.random_range(1..=max_out);
            Req {
                prompt: random_tokens(&mut rng, il, v),
                out_len: ol,
                slots: Vec::new(),
                generated: Vec::new(),
                prefilled: 0,
            }
        })
        .collect();
    let input_tokens: usize = waiting.iter().map(|r| r.prompt.len()).sum();
    let mut free: Vec<u32> = (0..b.kv_capacity() as u32).rev().collect();
    let mut running: Vec<Req> = Vec::new();
    let mut output_tokens = 0;
    let t0 = Instant::now();
    while !waiting.is_empty() || !running.is_empty() {
        // admit
        let mut budget = 8192usize;
        let mut admitted = Vec::new();
        while let Some(r) = waiting.front() {
            let need = r.prompt.len() + r.out_len;
            if running.len() + admitted.len() >= max_running
                || need > free.len()
                || r.prompt.len() > budget
            {
                break;
            }
            let Some(mut r) = waiting.pop_front() else {
                break;
            };
            r.slots = free.split_off(free.len() - need);
            budget -= r.prompt.len();
            admitted.push(r);
        }
        if !admitted.is_empty() {
            let batch: Vec<SeqInput> = admitted
                .iter()
                .map(|r| SeqInput {
                    tokens: &r.prompt,
                    start_pos: 0,
                    kv_slots: &r.slots[..r.prompt.len()],
                    num_logits: 1,
                })
                .collect();
            let toks = b.forward_sample_all(&batch, 0.0)?;
            for (mut r, t) in admitted.into_iter().zip(toks) {
                r.prefilled = r.prompt.len();
                r.generated.push(t);
                output_tokens += 1;
                running.push(r);
            }
        } else if !running.is_empty() {
            let toks: Vec<[u32; 1]> = running
                .iter()
                .map(|r| [*r.generated.last().unwrap_or(&0)])
                .collect();
            let batch: Vec<SeqInput> = running
                .iter()
                .zip(&toks)
                .map(|(r, t)| {
                    let pos = r.prefilled + r.generated.len() - 1;
                    SeqInput {
                        tokens: t,
                        start_pos: pos,
                        kv_slots: &r.slots[..pos + 1],
                        num_logits: 1,
                    }
                })
                .collect();
            let out = b.forward_sample_all(&batch, 0.0)?;
            for (r, t) in running.iter_mut().zip(out) {
                r.generated.push(t);
                output_tokens += 1;
            }
        } else {
            return Err(EngineError::Internal(
                "a request does not fit in the KV pool".into(),
            ));
        }
        // retire finished requests
        let mut i = 0;
        while i < running.len() {
            if running[i].generated.len() >= running[i].out_len {
                let r = running.swap_remove(i);
                free.extend(r.slots);
            } else {
                i += 1;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let r = OfflineReport {
        device: b.device_name().to_string(),
        num_prompts: n,
        input_tokens,
        output_tokens,
        seconds: secs,
        output_tok_s: output_tokens as f64 / secs,
        total_tok_s: (input_tokens + output_tokens) as f64 / secs,
    };
    println!("| device | prompts | input tok | output tok | s | output tok/s | total tok/s |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} |",
        r.device,
        r.num_prompts,
        r.input_tokens,
        r.output_tokens,
        r.seconds,
        r.output_tok_s,
        r.total_tok_s
    );
    Ok(r)
}

/// Bench flags of `offline` (through the engine) that take a value; every other flag goes to
/// the engine as a `serve` flag (`--disable-radix-cache`, `--max-running-requests`, ...).
const ENGINE_BENCH_FLAGS: &[&str] = &[
    "--model",
    "--dataset-name",
    "--num-prompts",
    "--random-input-len",
    "--random-output-len",
    "--random-range-ratio",
    "--gsp-num-groups",
    "--gsp-prompts-per-group",
    "--gsp-system-prompt-len",
    "--gsp-question-len",
    "--gsp-output-len",
    "--seed",
    "--warmup-requests",
];

#[derive(clap::Parser)]
struct ServeFlags {
    #[command(flatten)]
    server: crate::config::ServerArgs,
}

/// One benchmark request: prompt token ids and output length.
struct BenchReq {
    prompt: Vec<u32>,
    out_len: usize,
}

/// SGLang's `random` dataset on token ids: lengths uniform in
/// [max(1, len * range_ratio), len], ids uniform over the vocabulary.
fn dataset_random(
    rng: &mut rand::rngs::StdRng,
    n: usize,
    in_len: usize,
    out_len: usize,
    ratio: f64,
    vocab: usize,
) -> Vec<BenchReq> {
    let lo = |len: usize| ((len as f64 * ratio) as usize).clamp(1, len.max(1));
    (0..n)
        .map(|_| {
            let il = rng.random_range(lo(in_len)..=in_len.max(1));
            let ol = rng.random_range(lo(out_len)..=out_len.max(1));
            BenchReq {
                prompt: random_tokens(rng, il, vocab),
                out_len: ol,
            }
        })
        .collect()
}

/// SGLang's `generated-shared-prefix` dataset: `groups` random system prompts, each followed
/// by `per_group` random questions; fixed output length; requests shuffled.
fn dataset_gsp(
    rng: &mut rand::rngs::StdRng,
    groups: usize,
    per_group: usize,
    system_len: usize,
    question_len: usize,
    out_len: usize,
    vocab: usize,
) -> Vec<BenchReq> {
    let mut v = Vec::with_capacity(groups * per_group);
    for _ in 0..groups {
        let system = random_tokens(rng, system_len, vocab);
        for _ in 0..per_group {
            let mut prompt = system.clone();
            prompt.extend(random_tokens(rng, question_len, vocab));
            v.push(BenchReq { prompt, out_len });
        }
    }
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
    v
}

#[derive(Debug, Serialize)]
pub struct EngineOfflineReport {
    pub backend: String,
    pub dataset: String,
    pub num_prompts: usize,
    pub radix_cache: bool,
    pub max_running_requests: usize,
    pub chunked_prefill_size: i64,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub seconds: f64,
    pub request_throughput: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
    /// Cached prompt tokens / prompt tokens over the run, from the engine's counters.
    pub cache_hit_rate: f64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub failed: usize,
}

/// What one request's stream delivered.
struct Outcome {
    tokens: usize,
    ttft: Option<f64>,
    error: Option<String>,
}

/// Submit every request at once and read all streams to the end.
fn run_requests(
    rt: &tokio::runtime::Runtime,
    engine: &crate::engine::EngineHandle,
    reqs: &[BenchReq],
    tag: &str,
) -> Result<(Vec<Outcome>, f64)> {
    use crate::request::{GenerateRequest, SamplingParams, StreamEvent};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let req = GenerateRequest {
            rid: format!("{tag}-{i}"),
            input_ids: r.prompt.clone(),
            sampling: SamplingParams {
                temperature: 0.0,
                max_new_tokens: r.out_len,
                ignore_eos: true,
                ..SamplingParams::default()
            },
            detokenize: false,
            logprobs: None,
        };
        let mut stream = engine.submit(req)?;
        tasks.push(rt.spawn(async move {
            let mut o = Outcome {
                tokens: 0,
                ttft: None,
                error: None,
            };
            while let Some(ev) = stream.next().await {
                match ev {
                    StreamEvent::Tokens { ids, .. } => {
                        if o.ttft.is_none() && !ids.is_empty() {
                            o.ttft = Some(t0.elapsed().as_secs_f64());
                        }
                        o.tokens += ids.len();
                    }
                    StreamEvent::Error { message } => o.error = Some(message),
                    StreamEvent::Finished { .. } | StreamEvent::PromptLogprobs { .. } => {}
                }
            }
            o
        }));
    }
    let total = tasks.len();
    let done = Arc::new(AtomicUsize::new(0));
    let progress = {
        let done = done.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(20)).await;
                eprintln!(
                    "progress: {:.0}s, {} of {total} requests finished (counted in submission order)",
                    t0.elapsed().as_secs_f64(),
                    done.load(Ordering::Relaxed)
                );
            }
        })
    };
    let outcomes = rt.block_on(async {
        let mut v = Vec::with_capacity(tasks.len());
        for t in tasks {
            v.push(t.await.unwrap_or(Outcome {
                tokens: 0,
                ttft: None,
                error: Some("reader task failed".into()),
            }));
            done.fetch_add(1, Ordering::Relaxed);
        }
        v
    });
    progress.abort();
    Ok((outcomes, t0.elapsed().as_secs_f64()))
}

/// `offline` through the real engine, in process (SGLang's bench_offline_throughput flags):
///
/// - `--dataset-name random` (default): `--num-prompts N` (1000), `--random-input-len` (1024),
///   `--random-output-len` (1024), `--random-range-ratio` (0.0: lengths uniform in 1..=len).
/// - `--dataset-name generated-shared-prefix`: `--gsp-num-groups` (64),
///   `--gsp-prompts-per-group` (16), `--gsp-system-prompt-len` (2048), `--gsp-question-len`
///   (128), `--gsp-output-len` (256).
/// - `--seed S` (1), `--warmup-requests N` (16: short requests run first, then the radix cache
///   is flushed and the counters read as the baseline).
///
/// Any other flag is a `serve` flag (`--disable-radix-cache`, `--max-running-requests`,
/// `--chunked-prefill-size`, `--cuda-graph-max-bs`, `--mem-fraction-static`, ...). The engine
/// runs on `--device cuda` with `--skip-tokenizer-init` (token ids in, token ids out); unless
/// given, `--max-running-requests 256` and `--chunked-prefill-size 8192`. Greedy, ignore_eos,
/// like SGLang's benchmark.
pub fn offline_engine(args: &[String]) -> Result<EngineOfflineReport> {
    use clap::Parser;
    use std::sync::atomic::Ordering;
    let model = arg(args, "--model")
        .ok_or_else(|| EngineError::InvalidArgument("--model DIR is required".into()))?;
    let seed = arg_usize(args, "--seed", 1)? as u64;
    let mut serve: Vec<String> = vec![
        "bench".into(),
        "--model-path".into(),
        model.into(),
        "--device".into(),
        "cuda".into(),
        "--skip-tokenizer-init".into(),
    ];
    let mut i = 0;
    while i < args.len() {
        if ENGINE_BENCH_FLAGS.contains(&args[i].as_str()) {
            i += 2;
        } else {
            serve.push(args[i].clone());
            i += 1;
        }
    }
    fn has(v: &[String], f: &str) -> bool {
        v.iter().any(|a| a == f)
    }
    if !has(&serve, "--random-seed") {
        serve.extend(["--random-seed".to_string(), seed.to_string()]);
    }
    let dataset = arg(args, "--dataset-name").unwrap_or("random").to_string();
    let cfg = ModelConfig::from_hf_config(&PathBuf::from(model).join("config.json"))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = cfg.vocab_size;
    let reqs = match dataset.as_str() {
        "random" => {
            let ratio: f64 = arg(args, "--random-range-ratio")
                .map(|r| r.parse())
                .transpose()
                .map_err(|_| {
                    EngineError::InvalidArgument("--random-range-ratio expects a number".into())
                })?
                .unwrap_or(0.0);
            dataset_random(
                &mut rng,
                arg_usize(args, "--num-prompts", 1000)?,
                arg_usize(args, "--random-input-len", 1024)?,
                arg_usize(args, "--random-output-len", 1024)?,
                ratio,
                v,
            )
        }
        "generated-shared-prefix" => dataset_gsp(
            &mut rng,
            arg_usize(args, "--gsp-num-groups", 64)?,
            arg_usize(args, "--gsp-prompts-per-group", 16)?,
            arg_usize(args, "--gsp-system-prompt-len", 2048)?,
            arg_usize(args, "--gsp-question-len", 128)?,
            arg_usize(args, "--gsp-output-len", 256)?,
            v,
        ),
        other => {
            return Err(EngineError::InvalidArgument(format!(
                "--dataset-name {other}: random or generated-shared-prefix"
            )));
        }
    };
    // Every prompt is submitted at once and waits its turn: no admission bound or queue
    // deadline unless the flags ask for one.
    if !has(&serve, "--max-queued-requests") {
        serve.extend([
            "--max-queued-requests".to_string(),
            (reqs.len() + 64).to_string(),
        ]);
    }
    if !has(&serve, "--queue-timeout-secs") {
        serve.extend(["--queue-timeout-secs".to_string(), "0".to_string()]);
    }
    let flags = ServeFlags::try_parse_from(&serve)
        .map_err(|e| EngineError::InvalidArgument(format!("engine flags: {e}")))?
        .server;
    let radix = !flags.disable_radix_cache;
    let engine = crate::engine::launch(flags)?;
    let max_running = engine.info().max_running_requests;
    let chunk = engine.args().chunked_prefill_size.unwrap_or(-1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| EngineError::Internal(format!("tokio runtime: {e}")))?;

    let warm = arg_usize(args, "--warmup-requests", 16)?;
    if warm > 0 {
        let w = dataset_random(&mut rng, warm, 256, 32, 0.5, v);
        let (o, secs) = run_requests(&rt, &engine, &w, "warmup")?;
        if let Some(e) = o.iter().find_map(|o| o.error.clone()) {
            return Err(EngineError::Internal(format!(
                "warm-up request failed: {e}"
            )));
        }
        eprintln!("warm-up: {warm} requests in {secs:.1}s");
        if !rt.block_on(engine.flush_cache()) {
            eprintln!("warning: the radix cache could not be flushed after the warm-up");
        }
    }
    let stats = engine.stats();
    let prompt0 = stats.total_prompt_tokens.load(Ordering::Relaxed);
    let cached0 = stats.total_cached_tokens.load(Ordering::Relaxed);
    let (outcomes, secs) = run_requests(&rt, &engine, &reqs, "bench")?;
    let prompt = stats.total_prompt_tokens.load(Ordering::Relaxed) - prompt0;
    let cached = stats.total_cached_tokens.load(Ordering::Relaxed) - cached0;
    let failed = outcomes.iter().filter(|o| o.error.is_some()).count();
    if let Some(e) = outcomes.iter().find_map(|o| o.error.as_ref()) {
        eprintln!("{failed} requests failed; first error: {e}");
    }
    let input_tokens: usize = reqs.iter().map(|r| r.prompt.len()).sum();
    let output_tokens: usize = outcomes.iter().map(|o| o.tokens).sum();
    let mut ttfts: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft).collect();
    ttfts.sort_by(f64::total_cmp);
    let mean_ttft = ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64;
    let median_ttft = ttfts.get(ttfts.len() / 2).copied().unwrap_or(0.0);
    let r = EngineOfflineReport {
        backend: "engine".into(),
        dataset,
        num_prompts: reqs.len(),
        radix_cache: radix,
        max_running_requests: max_running,
        chunked_prefill_size: chunk,
        input_tokens,
        output_tokens,
        seconds: secs,
        request_throughput: reqs.len() as f64 / secs,
        output_tok_s: output_tokens as f64 / secs,
        total_tok_s: (input_tokens + output_tokens) as f64 / secs,
        cache_hit_rate: cached as f64 / (prompt as f64).max(1.0),
        mean_ttft_ms: mean_ttft * 1e3,
        median_ttft_ms: median_ttft * 1e3,
        failed,
    };
    println!("{}", serde_json::to_string(&r).unwrap_or_default());
    println!(
        "| dataset | prompts | radix cache | input tok | output tok | s | req/s | output tok/s | total tok/s | cache hit | mean TTFT ms | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.0} | {:.0} | {:.1}% | {:.0} | {} |",
        r.dataset,
        r.num_prompts,
        if r.radix_cache { "on" } else { "off" },
        r.input_tokens,
        r.output_tokens,
        r.seconds,
        r.request_throughput,
        r.output_tok_s,
        r.total_tok_s,
        100.0 * r.cache_hit_rate,
        r.mean_ttft_ms,
        r.failed
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    /// Runs `bench_main` with the arguments in SGL_CUDA_BENCH (space separated) on a GPU
    /// machine: `SGL_CUDA_BENCH="one-batch --model DIR" <test-binary> --ignored cuda_bench`.
    #[test]
    #[ignore = "needs a GPU; driven by scripts/gpu/run.sh"]
    fn cuda_bench() {
        let Ok(a) = std::env::var("SGL_CUDA_BENCH") else {
            eprintln!("SGL_CUDA_BENCH not set");
            return;
        };
        let args: Vec<String> = a.split_whitespace().map(String::from).collect();
        if let Err(e) = super::bench_main(&args) {
            panic!("{e}");
        }
    }
}
