//! Benchmark of the CPU matmul kernels on SmolLM2-135M-Instruct's real weights.
//!
//! Workload: one decode step's matmuls (every layer's q, k, v, o, gate, up, down at n = 1 plus
//! the 49152 × 576 output projection), and the same at n = 64 (prefill or a 64-sequence decode
//! batch). Prints ms per step, GB/s of weight reads, the machine's memory-read roofline measured
//! in-process, and the ratio to llama.cpp on this machine (2 threads: ~69 tok/s decode,
//! i.e. ~14.5 ms per token end to end; ~160 tok/s prefill).
//!
//! Usage: `bench_kernels [path/to/model.gguf | --synthetic]` (default: the file
//! `scripts/fetch-model.sh` fetches; `--synthetic`: random weights of the same shapes and
//! formats). `SGL_BENCH_SECONDS` sets the time per measurement (default 1.5),
//! `SGL_BENCH_THREADS` the thread counts to try (default `1,2`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use candle_core::Device;
use candle_core::quantized::{GgmlDType, gguf_file};
use sgl_engine::backend::cpu::kernels::{
    Isa, Weight, WeightFormat, matmul_multi, matmul_with_isa, parallel_for, set_num_threads,
};

const LLAMA_CPP_DECODE_MS: f64 = 1000.0 / 69.0;
const LLAMA_CPP_PREFILL_TOK_S: f64 = 160.0;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        .to_string()
    });
    let seconds: f64 = std::env::var("SGL_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.5);
    let (layers, output) = if path == "--synthetic" {
        synthetic()?
    } else {
        load(&path)?
    };
    let thread_counts: Vec<usize> = std::env::var("SGL_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .collect();
    let layer_bytes: usize = layers.iter().map(Weight::size_bytes).sum();
    let step_bytes = layer_bytes + output.size_bytes();
    println!(
        "model: {path}\n  {} layer matrices ({:.1} MB) + output {}x{} {} ({:.1} MB)",
        layers.len(),
        layer_bytes as f64 / 1e6,
        output.rows(),
        output.cols(),
        output.format(),
        output.size_bytes() as f64 / 1e6
    );
    println!(
        "  best ISA detected: {:?}; threads available: {}",
        Isa::detect(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    for threads in thread_counts {
        set_num_threads(threads);
        let bw = memory_read_gbs(threads);
        println!("\n== {threads} thread(s); memory read roofline {bw:.1} GB/s ==");
        println!("  per-call overhead: {}", call_overhead());
        for isa in Isa::all_supported() {
            let budget = if isa == Isa::Scalar {
                seconds / 3.0
            } else {
                seconds
            };
            let t1 = time_step(isa, &layers, &output, 1, true, budget);
            println!(
                "  {isa:?} n=1  (decode step): {:7.2} ms/step, {:5.1} GB/s weights ({:.0}% of roofline), \
                 {:.1}x llama.cpp's {LLAMA_CPP_DECODE_MS:.1} ms/token",
                t1 * 1e3,
                step_bytes as f64 / t1 / 1e9,
                step_bytes as f64 / t1 / 1e9 / bw * 100.0,
                LLAMA_CPP_DECODE_MS / (t1 * 1e3)
            );
            if isa == Isa::detect() {
                let tf = time_fused_step(&layers, &output, budget);
                println!(
                    "  {isa:?} n=1  fused (matmul_multi for q,k,v and gate,up): {:7.2} ms/step, \
                     {:5.1} GB/s weights",
                    tf * 1e3,
                    step_bytes as f64 / tf / 1e9
                );
            }
            let n = 64;
            let tl = time_step(isa, &layers, &output, n, false, budget);
            let to = time_step(isa, &layers, &output, n, true, budget);
            println!(
                "  {isa:?} n={n} (batch): layers {:7.2} ms ({:6.0} tok/s, {:.1}x llama.cpp prefill), \
                 with output at n={n}: {:7.2} ms ({:6.0} tok/s)",
                tl * 1e3,
                n as f64 / tl,
                n as f64 / tl / LLAMA_CPP_PREFILL_TOK_S,
                to * 1e3,
                n as f64 / to
            );
        }
    }
    Ok(())
}

/// Every layer's matrices in forward order, and the output projection (tied to the embedding
/// when the file has no `output.weight`).
fn load(path: &str) -> anyhow::Result<(Vec<Weight>, Weight)> {
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("open {path} (run scripts/fetch-model.sh)"))?;
    let content = gguf_file::Content::read(&mut file).context("read GGUF")?;
    let mut read = |name: &str| -> anyhow::Result<Weight> {
        let q = content.tensor(&mut file, name, &Device::Cpu)?;
        let (rows, cols) = q.shape().dims2()?;
        let format = match q.dtype() {
            GgmlDType::F32 => WeightFormat::F32,
            GgmlDType::F16 => WeightFormat::F16,
            GgmlDType::BF16 => WeightFormat::BF16,
            GgmlDType::Q8_0 => WeightFormat::Q8_0,
            GgmlDType::Q4_0 => WeightFormat::Q4_0,
            GgmlDType::Q4_1 => WeightFormat::Q4_1,
            other => bail!("{name}: unsupported dtype {other:?}"),
        };
        Ok(Weight::from_raw(
            format,
            rows,
            cols,
            q.data()?.into_owned(),
        )?)
    };
    let mut layers = Vec::new();
    for l in 0.. {
        if !content
            .tensor_infos
            .contains_key(&format!("blk.{l}.attn_q.weight"))
        {
            break;
        }
        for part in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            layers.push(read(&format!("blk.{l}.{part}.weight"))?);
        }
    }
    let output = if content.tensor_infos.contains_key("output.weight") {
        read("output.weight")?
    } else {
        read("token_embd.weight")?
    };
    Ok((layers, output))
}

/// SmolLM2-135M's shapes (30 layers, hidden 576, 9 + 3 × 64 heads, MLP 1536, vocab 49152)
/// with random Q4_1 layer weights and a random Q8_0 output projection.
fn synthetic() -> anyhow::Result<(Vec<Weight>, Weight)> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut random_byte = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 24) as u8
    };
    let mut make = |format: WeightFormat, rows: usize, cols: usize| -> anyhow::Result<Weight> {
        let mut bytes = Vec::with_capacity(rows * format.row_bytes(cols));
        for _ in 0..rows * cols / 32 {
            // f16 scale 0.01 and, for Q4_1, min -0.08, then random quants.
            bytes.extend_from_slice(&0x211eu16.to_le_bytes());
            if format == WeightFormat::Q4_1 {
                bytes.extend_from_slice(&0xad1fu16.to_le_bytes());
            }
            let quants = if format == WeightFormat::Q8_0 { 32 } else { 16 };
            bytes.extend((0..quants).map(|_| random_byte()));
        }
        Ok(Weight::from_raw(format, rows, cols, bytes)?)
    };
    let (h, kv, ffn) = (576, 192, 1536);
    let mut layers = Vec::new();
    for _ in 0..30 {
        for (rows, cols) in [
            (h, h),
            (kv, h),
            (kv, h),
            (h, h),
            (ffn, h),
            (ffn, h),
            (h, ffn),
        ] {
            layers.push(make(WeightFormat::Q4_1, rows, cols)?);
        }
    }
    let output = make(WeightFormat::Q8_0, 49152, h)?;
    Ok((layers, output))
}

/// Median seconds of one step: every layer matrix at `n` rows of activations, plus the output
/// projection when `with_output`.
fn time_step(
    isa: Isa,
    layers: &[Weight],
    output: &Weight,
    n: usize,
    with_output: bool,
    budget: f64,
) -> f64 {
    let max_cols = layers
        .iter()
        .map(Weight::cols)
        .max()
        .unwrap_or(0)
        .max(output.cols());
    let max_rows = layers
        .iter()
        .map(Weight::rows)
        .max()
        .unwrap_or(0)
        .max(output.rows());
    let x: Vec<f32> = (0..n * max_cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    let mut out = vec![0.0f32; n * max_rows];
    let mut step = || {
        for w in layers {
            let (r, c) = (w.rows(), w.cols());
            matmul_with_isa(isa, w, &x[..n * c], n, &mut out[..n * r]);
        }
        if with_output {
            let (r, c) = (output.rows(), output.cols());
            matmul_with_isa(isa, output, &x[..n * c], n, &mut out[..n * r]);
        }
    };
    step();
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < 3 || (started.elapsed().as_secs_f64() < budget && times.len() < 1000) {
        let t = Instant::now();
        step();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Median seconds of one n = 1 step with q, k, v and gate, up each fused into one
/// `matmul_multi` call (the layer order in `layers` is q, k, v, o, gate, up, down).
fn time_fused_step(layers: &[Weight], output: &Weight, budget: f64) -> f64 {
    let x = vec![0.25f32; 2048];
    let mut bufs: Vec<Vec<f32>> = (0..3).map(|_| vec![0.0f32; output.rows()]).collect();
    let mut step = || {
        for l in layers.chunks_exact(7) {
            let [b0, b1, b2] = &mut bufs[..] else {
                unreachable!("three buffers")
            };
            let (q, k, v) = (&l[0], &l[1], &l[2]);
            matmul_multi(
                &[q, k, v],
                &x[..q.cols()],
                1,
                &mut [
                    &mut b0[..q.rows()],
                    &mut b1[..k.rows()],
                    &mut b2[..v.rows()],
                ],
            );
            matmul_with_isa(
                Isa::detect(),
                &l[3],
                &x[..l[3].cols()],
                1,
                &mut b0[..l[3].rows()],
            );
            let (g, u) = (&l[4], &l[5]);
            matmul_multi(
                &[g, u],
                &x[..g.cols()],
                1,
                &mut [&mut b0[..g.rows()], &mut b1[..u.rows()]],
            );
            matmul_with_isa(
                Isa::detect(),
                &l[6],
                &x[..l[6].cols()],
                1,
                &mut b2[..l[6].rows()],
            );
        }
        let out = &mut bufs[0][..output.rows()];
        matmul_with_isa(Isa::detect(), output, &x[..output.cols()], 1, out);
    };
    step();
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < 3 || (started.elapsed().as_secs_f64() < budget && times.len() < 1000) {
        let t = Instant::now();
        step();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Best-of-5 read bandwidth over a 256 MiB buffer split across the pool.
fn memory_read_gbs(threads: usize) -> f64 {
    let words: usize = 32 << 20;
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads * 8);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let total = std::sync::atomic::AtomicU64::new(0);
        parallel_for(words.div_ceil(chunk), |c| {
            let s: u64 = buf[c * chunk..((c + 1) * chunk).min(words)]
                .iter()
                .fold(0u64, |a, &b| a.wrapping_add(b));
            total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        std::hint::black_box(total.into_inner());
        best = best.min(t.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best / 1e9
}

/// Microseconds per call of an empty `parallel_for` and of a tiny matmul.
fn call_overhead() -> String {
    let time = |f: &mut dyn FnMut()| {
        let reps = 20_000;
        for _ in 0..1000 {
            f();
        }
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() * 1e6 / reps as f64
    };
    let pf = time(&mut || {
        parallel_for(2, |i| {
            std::hint::black_box(i);
        })
    });
    let w = Weight::from_raw(WeightFormat::Q4_1, 64, 64, vec![0; 64 * 40]).expect("valid shape");
    let x = vec![0.5f32; 64];
    let mut out = vec![0.0f32; 64];
    let mm = time(&mut || matmul_with_isa(Isa::detect(), &w, &x, 1, &mut out));
    std::thread::sleep(Duration::from_millis(1));
    format!("parallel_for(2 tasks) {pf:.2} us, matmul 64x64 Q4_1 n=1 {mm:.2} us")
}
