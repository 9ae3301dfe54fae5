//! `sgl-bench`: the benchmarks of the engine and the router, one binary with subcommands.
//!
//! - GPU (build with `--features cuda`): `bench-one-batch` (SGLang's bench_one_batch: static
//!   batch, TTFT and decode against the roofline), `check-reference` (greedy runs for the
//!   transformers comparison) and `bench-all-reduce` (the tensor-parallel all-reduce alone).
//!   Their flags are those `scripts/gpu/*.sh` pass; see `gpu/`.
//! - `bench-offline-throughput`: SGLang's bench_offline_throughput through the real engine in
//!   process, on the GPU or with `--device cpu` on the CPU, with a breakdown of the engine's
//!   forward passes (see `offline`); `--backend-loop` is the GPU-only loop without the engine.
//! - `cpu-kernels`: the CPU matmul kernels and the CPU forward pass on the default model.
//! - `grammar`: compile and per-step mask cost of the structured-output backends.
//! - `router`: routing decision time, proxy overhead, cache-aware vs round robin.

mod args;
mod cpu_kernels;
#[cfg(feature = "cuda")]
mod gpu;
mod grammar;
mod offline;
mod router;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sgl-bench",
    version,
    about = "Benchmarks of the SGLang engine and router"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Arguments handed on to a benchmark that reads its own flags.
#[derive(clap::Args)]
struct Passed {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

impl Passed {
    /// `bench-offline-throughput --backend-loop`: the GPU loop without the engine.
    fn backend_loop(&self) -> bool {
        self.args.iter().any(|a| a == "--backend-loop")
    }
}

#[derive(Subcommand)]
enum Command {
    /// Static-batch latency benchmark on the GPU backend (SGLang's bench_one_batch):
    /// `--model DIR [--batch N] [--input N] [--output N] [--gemv on|off|both|ablate]
    /// [--ttft-input N] [--attn-sweep 1,8,64]`.
    BenchOneBatch(Passed),
    /// Offline throughput benchmark through the engine (SGLang's bench_offline_throughput), with
    /// where the engine's time went: `--model PATH [--dataset-name
    /// random|generated-shared-prefix] [--num-prompts N] [--random-input-len N]
    /// [--random-output-len N] [--timeline-secs N] [serve flags, e.g. --device cpu]`, or
    /// `--backend-loop` for the benchmark's own batching loop on the GPU backend.
    BenchOfflineThroughput(Passed),
    /// Greedy run of reference prompts on the GPU backend, for the comparison with
    /// transformers (`scripts/gpu/hf_ref.py` writes the prompts, `compare.py` scores):
    /// `--model DIR --prompts FILE --out DIR`.
    CheckReference(Passed),
    /// The tensor-parallel all-reduce alone on N GPUs: checked against host sums, timed from
    /// 8 KB to 64 MB, bus bandwidth against the GPU-to-GPU copy peak: `--tp-size N`.
    BenchAllReduce(Passed),
    /// CPU matmul kernels on the default model's weights: `[MODEL.gguf | --synthetic]`,
    /// `--decode [MODEL.gguf]` (the whole forward pass) or `--micro` (one product per
    /// instruction set).
    CpuKernels(Passed),
    /// Grammar backends: build, compile and per-step mask cost with a model's tokenizer:
    /// `[MODEL.gguf | tokenizer.json]`.
    Grammar {
        /// The model (GGUF) or tokenizer.json whose vocabulary the grammars run on (default:
        /// the file `scripts/fetch-model.sh` fetches).
        model: Option<String>,
    },
    /// Router: routing decision time, proxy overhead and the shared-prefix workload under
    /// cache-aware routing against round robin.
    Router(router::BenchArgs),
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},sgl_core={level}"))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Exit status of a benchmark: its error on stderr.
fn report<E: std::fmt::Display>(r: Result<(), E>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "cuda")]
fn gpu(run: fn(&[String]) -> sgl_core::error::Result<()>, p: Passed) -> ExitCode {
    init_logging("info");
    report(run(&p.args))
}

#[cfg(not(feature = "cuda"))]
fn gpu_missing() -> ExitCode {
    eprintln!(
        "error: this sgl-bench was built without CUDA support (rebuild with `--features cuda`); \
         for CPU benchmarks run `sgl-bench cpu-kernels` or scripts/bench/cpu_bench.py"
    );
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    // Tensor parallelism: NCCL's NVLink multicast (NVLS) stays off unless the user asks for
    // it, as in `sgl-engine serve`.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: no other thread exists yet (runtimes and ranks start later).
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    let cli = Cli::parse();
    match cli.command {
        #[cfg(feature = "cuda")]
        Command::BenchOneBatch(p) => gpu(gpu::one_batch, p),
        #[cfg(feature = "cuda")]
        Command::BenchOfflineThroughput(p) if p.backend_loop() => gpu(gpu::offline_backend_loop, p),
        #[cfg(not(feature = "cuda"))]
        Command::BenchOfflineThroughput(p) if p.backend_loop() => gpu_missing(),
        Command::BenchOfflineThroughput(p) => {
            init_logging("info");
            report(offline::run(&p.args))
        }
        #[cfg(feature = "cuda")]
        Command::CheckReference(p) => gpu(gpu::check_reference, p),
        #[cfg(feature = "cuda")]
        Command::BenchAllReduce(p) => gpu(gpu::all_reduce, p),
        #[cfg(not(feature = "cuda"))]
        Command::BenchOneBatch(_) | Command::CheckReference(_) | Command::BenchAllReduce(_) => {
            gpu_missing()
        }
        Command::CpuKernels(p) => report(cpu_kernels::run(p.args)),
        Command::Grammar { model } => report(grammar::run(model)),
        Command::Router(args) => {
            init_logging("warn");
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            report(rt.block_on(router::run(args)))
        }
    }
}
