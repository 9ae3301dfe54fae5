//! Benchmark of the CPU matmul kernels on SmolLM2-135M-Instruct's real weights.
//!
//! Workload: one decode step's matmuls (every layer's q, k, v, o, gate, up, down at n = 1 plus
//! the 49152 × 576 output projection), and the same at n = 64 (prefill or a 64-sequence decode
//! batch). Prints ms per step, GB/s of weight reads, the machine's memory-read roofline measured
//! in-process, and the ratio to llama.cpp on this machine (2 threads: ~69 tok/s decode,
//! i.e. ~14.5 ms per token end to end; ~160 tok/s prefill).
//!
//! Usage: `sgl-bench cpu-kernels [path/to/model.gguf | --synthetic]` (default: the file
//! `scripts/fetch-model.sh` fetches; `--synthetic`: random weights of the same shapes and
//! formats). `SGL_BENCH_SECONDS` sets the time per measurement (default 1.5),
//! `SGL_BENCH_THREADS` the thread counts to try (default `1,2`), `SGL_BENCH_BEST=1` reports the
//! best step instead of the median (steadier on a busy machine).
//!
//! `sgl-bench cpu-kernels --decode [path/to/model.gguf]`: the whole forward pass instead (the CPU
//! backend as the server runs it): one decode step at batch 1 and at batch 16, with every
//! sequence's context at 128 and at 384 tokens (filled by a real prefill of distinct prompts;
//! cache slots laid out as the server's pool hands them out: the first context's prompts one
//! contiguous run each, later positions interleaved across the batch as in batched decode),
//! printing ms per step (wall clock and CPU time), tokens/s and the batch-16 / batch-1 ratio.
//! `SGL_BENCH_BATCH` changes the batch (default 16), `SGL_BENCH_CONTEXTS` the contexts
//! (default `128,384`).
//!
//! `sgl-bench cpu-kernels --micro`: single products of random weights of the model's shapes on one
//! thread (`SGL_BENCH_THREADS` to change) at n = 1, 8 and 16 for every instruction set, best of many runs (robust on a busy
//! machine), in µs and int8 multiply-adds per ns.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use candle_core::Device;
use candle_core::quantized::{GgmlDType, gguf_file};
use sgl_core::backend::cpu::CpuBackend;
use sgl_core::backend::{Backend, SeqInput};
use sgl_kernels::cpu::{
    Isa, Weight, WeightFormat, matmul_multi, matmul_with_isa, parallel_for, set_num_threads,
};

const LLAMA_CPP_DECODE_MS: f64 = 1000.0 / 69.0;
const LLAMA_CPP_PREFILL_TOK_S: f64 = 160.0;

const DEFAULT_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
);

/// Runs the CPU kernel benchmark with the arguments after `cpu-kernels` (see the module docs).
pub fn run(mut args: Vec<String>) -> anyhow::Result<()> {
    let decode = args.first().is_some_and(|a| a == "--decode");
    if decode {
        args.remove(0);
    }
    let path = args
        .first()
        .cloned()
        .unwrap_or_else(|| DEFAULT_MODEL.to_string());
    let seconds: f64 = std::env::var("SGL_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.5);
    if decode {
        return decode_bench(&path, seconds);
    }
    if path == "--micro" {
        micro_bench(seconds);
        return Ok(());
    }
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
            for n in [16, 64] {
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
    let (median, best) = time_step_stats(isa, layers, output, n, with_output, budget);
    if std::env::var_os("SGL_BENCH_BEST").is_some() {
        best
    } else {
        median
    }
}

/// Median and best seconds of one step (see [`time_step`]).
fn time_step_stats(
    isa: Isa,
    layers: &[Weight],
    output: &Weight,
    n: usize,
    with_output: bool,
    budget: f64,
) -> (f64, f64) {
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
    (times[times.len() / 2], times[0])
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

/// The `--micro` mode (see the module documentation).
fn micro_bench(seconds: f64) {
    let threads = std::env::var("SGL_BENCH_THREADS")
        .ok()
        .and_then(|t| t.split(',').next()?.trim().parse().ok())
        .unwrap_or(1);
    set_num_threads(threads);
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut random_byte = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 24) as u8
    };
    let mut make = |format: WeightFormat, rows: usize, cols: usize| -> Weight {
        let mut bytes = Vec::with_capacity(rows * format.row_bytes(cols));
        for _ in 0..rows * cols / 32 {
            bytes.extend_from_slice(&0x211eu16.to_le_bytes());
            if format == WeightFormat::Q4_1 {
                bytes.extend_from_slice(&0xad1fu16.to_le_bytes());
            }
            let quants = if format == WeightFormat::Q8_0 { 32 } else { 16 };
            bytes.extend((0..quants).map(|_| random_byte()));
        }
        Weight::from_raw(format, rows, cols, bytes).expect("valid shape")
    };
    let shapes = [
        (WeightFormat::Q4_1, 1536, 576),
        (WeightFormat::Q4_1, 576, 1536),
        (WeightFormat::Q4_1, 192, 576),
        (WeightFormat::Q4_0, 1536, 576),
        (WeightFormat::Q8_0, 4096, 576),
    ];
    for (format, rows, cols) in shapes {
        let w = make(format, rows, cols);
        for n in [1, 8, 16] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
                .collect();
            let mut out = vec![0.0f32; n * rows];
            let mut line = format!("  {format} {rows:5}x{cols:<5} n={n:2}:");
            for isa in Isa::all_supported() {
                let mut best = f64::MAX;
                let started = Instant::now();
                while started.elapsed().as_secs_f64() < seconds / 10.0 {
                    let t = Instant::now();
                    for _ in 0..10 {
                        matmul_with_isa(isa, &w, &x, n, &mut out);
                    }
                    best = best.min(t.elapsed().as_secs_f64() / 10.0);
                }
                let macs = (rows * cols * n) as f64;
                line += &format!(
                    "  {isa:?} {:8.1} us {:6.1} MAC/ns",
                    best * 1e6,
                    macs / best / 1e9
                );
            }
            println!("{line}");
        }
    }
    // Weights streamed from memory: 128 matrices of 1536 x 576 Q4_1 (71 MB), one after another.
    let (rows, cols) = (1536, 576);
    let ws: Vec<Weight> = (0..128)
        .map(|_| make(WeightFormat::Q4_1, rows, cols))
        .collect();
    for n in [1, 16] {
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
            .collect();
        let mut out = vec![0.0f32; n * rows];
        let mut best = f64::MAX;
        let started = Instant::now();
        while started.elapsed().as_secs_f64() < seconds {
            let t = Instant::now();
            for w in &ws {
                matmul_with_isa(Isa::detect(), w, &x, n, &mut out);
            }
            best = best.min(t.elapsed().as_secs_f64() / ws.len() as f64);
        }
        let macs = (rows * cols * n) as f64;
        println!(
            "  streamed Q4_1 {rows}x{cols} n={n:2}: {:?} {:8.1} us {:6.1} MAC/ns",
            Isa::detect(),
            best * 1e6,
            macs / best / 1e9
        );
    }
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

/// Seconds of CPU time (user + system, all threads) this process has used so far, from
/// `/proc/self/stat` (clock ticks of 10 ms); `None` where that file is missing.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The decode benchmark of the whole model (see the module documentation).
fn decode_bench(path: &str, seconds: f64) -> anyhow::Result<()> {
    let env_list = |name: &str, default: &str| -> Vec<usize> {
        std::env::var(name)
            .unwrap_or_else(|_| default.into())
            .split(',')
            .filter_map(|t| t.trim().parse().ok())
            .collect()
    };
    let threads = env_list("SGL_BENCH_THREADS", "2")
        .first()
        .copied()
        .unwrap_or(2);
    let batch = env_list("SGL_BENCH_BATCH", "16")
        .first()
        .copied()
        .unwrap_or(16);
    let contexts = env_list("SGL_BENCH_CONTEXTS", "128,384");
    let max_ctx = contexts.iter().copied().max().unwrap_or(1).max(1);
    set_num_threads(threads);

    let model = sgl_core::model::load(std::path::Path::new(path))
        .with_context(|| format!("load {path} (run scripts/fetch-model.sh)"))?;
    let vocab = model.config.vocab_size as u64;
    let mut backend = CpuBackend::with_capacity(&model, batch * max_ctx, max_ctx)?;
    drop(model);
    println!(
        "model: {path}\n  {}; {threads} thread(s), batch {batch}, contexts {contexts:?}",
        backend.describe()
    );

    // Distinct pseudo-random prompts. Slots as the server's pool hands them out: the first
    // context's prompt one contiguous run per sequence (a prefill), every later position one
    // slot per step and sequence, interleaved (a batch decoding together).
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let tokens: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            (0..max_ctx)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % vocab) as u32
                })
                .collect()
        })
        .collect();
    let prompt = contexts
        .iter()
        .copied()
        .min()
        .unwrap_or(1)
        .saturating_sub(1);
    let slots: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            (0..max_ctx)
                .map(|i| {
                    if i < prompt {
                        (b * prompt + i) as u32
                    } else {
                        (batch * prompt + (i - prompt) * batch + b) as u32
                    }
                })
                .collect()
        })
        .collect();

    let mut filled = 0;
    let mut results = Vec::new();
    for &ctx in &contexts {
        // Prefill positions `filled..ctx - 1` of every sequence (the step under test then
        // writes position `ctx - 1` and attends over `ctx` keys).
        let upto = ctx - 1;
        if upto > filled {
            let inputs: Vec<SeqInput<'_>> = (0..batch)
                .map(|b| SeqInput {
                    tokens: &tokens[b][filled..upto],
                    start_pos: filled,
                    kv_slots: &slots[b][..upto],
                    num_logits: 0,
                    prompt: true,
                })
                .collect();
            let t = Instant::now();
            backend.forward(&inputs)?;
            let dt = t.elapsed().as_secs_f64();
            println!(
                "  prefill {} tokens ({batch} x {}): {:.2} s, {:.0} tok/s",
                batch * (upto - filled),
                upto - filled,
                dt,
                (batch * (upto - filled)) as f64 / dt
            );
        }
        filled = upto;
        for bs in [1, batch] {
            let inputs: Vec<SeqInput<'_>> = (0..bs)
                .map(|b| SeqInput {
                    tokens: &tokens[b][upto..ctx],
                    start_pos: upto,
                    kv_slots: &slots[b][..ctx],
                    num_logits: 1,
                    prompt: false,
                })
                .collect();
            for _ in 0..2 {
                backend.forward(&inputs)?;
            }
            let mut times = Vec::new();
            let cpu0 = cpu_seconds();
            let started = Instant::now();
            while times.len() < 5
                || (started.elapsed().as_secs_f64() < seconds && times.len() < 500)
            {
                let t = Instant::now();
                let logits = std::hint::black_box(backend.forward(&inputs)?);
                times.push(t.elapsed().as_secs_f64());
                // As the server's sampler does: the next step reuses the buffer.
                backend.recycle_logits(logits);
            }
            let cpu = cpu_seconds()
                .zip(cpu0)
                .map(|(b, a)| (b - a) / times.len() as f64);
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let best = times[0];
            println!(
                "  context {ctx:4}, batch {bs:2}: median {:7.2} ms/step (best {:7.2}, CPU {} ms/step), \
                 {:6.1} tok/s",
                median * 1e3,
                best * 1e3,
                cpu.map_or("?".into(), |c| format!("{:.2}", c * 1e3)),
                bs as f64 / median
            );
            results.push((ctx, bs, median, best));
        }
    }
    println!("  batch {batch} / batch 1 decode throughput (median; best):");
    for &ctx in &contexts {
        let find = |bs: usize| {
            results
                .iter()
                .find(|r| r.0 == ctx && r.1 == bs)
                .map(|r| (r.2, r.3))
        };
        if let (Some(one), Some(many)) = (find(1), find(batch)) {
            println!(
                "    context {ctx:4}: {:.2}x; {:.2}x",
                batch as f64 * one.0 / many.0,
                batch as f64 * one.1 / many.1
            );
        }
    }
    Ok(())
}
