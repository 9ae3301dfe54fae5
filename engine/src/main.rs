//! `sgl-engine`: serve a model over SGLang's native and OpenAI-compatible APIs.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sgl_engine::config::{DeviceKind, ServerArgs};

#[derive(Parser)]
#[command(
    name = "sgl-engine",
    version,
    about = "SGLang-compatible LLM serving engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model (flags follow SGLang's launch_server).
    Serve(Box<ServerArgs>),
    /// Static-batch latency benchmark on the GPU backend (SGLang's bench_one_batch):
    /// `--model DIR --batch-size N --input-len N --output-len N`.
    BenchOneBatch {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Offline throughput benchmark on the GPU backend (SGLang's bench_offline_throughput):
    /// `--model DIR --num-prompts N --random-input-len N --random-output-len N`.
    BenchOfflineThroughput {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Greedy run of reference prompts on the GPU backend, for the comparison with
    /// transformers (`scripts/gpu/hf_ref.py` writes the prompts, `compare.py` scores):
    /// `--model DIR --prompts FILE --out DIR`.
    CheckReference {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[cfg(feature = "cuda")]
fn run_gpu_bench(kind: &str, args: Vec<String>) -> ExitCode {
    init_logging("info");
    let mut all = vec![kind.to_string()];
    all.extend(args);
    match sgl_engine::backend::cuda::bench_main(&all) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn run_gpu_bench(_: &str, _: Vec<String>) -> ExitCode {
    eprintln!(
        "error: this sgl-engine was built without CUDA support (rebuild with `--features cuda`); \
         for CPU benchmarks run scripts/bench/cpu_bench.py"
    );
    ExitCode::FAILURE
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},sgl_engine={level}"))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn serve(args: ServerArgs) -> Result<(), String> {
    let addr = format!("{}:{}", args.host, args.port);
    // Bind first so a port clash fails fast, before the model load.
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let engine = tokio::task::spawn_blocking(move || sgl_engine::engine::launch(args))
        .await
        .map_err(|e| format!("start-up failed: {e}"))?
        .map_err(|e| e.to_string())?;
    tracing::info!("The server is fired up and ready to roll! Listening on http://{local}");
    // One machine-readable line on stdout for scripts and tests.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "listening on http://{local}");
    let _ = out.flush();
    sgl_engine::api::serve(engine, listener)
        .await
        .map_err(|e| format!("server error: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::BenchOneBatch { args } => run_gpu_bench("one-batch", args),
        Command::BenchOfflineThroughput { args } => run_gpu_bench("offline", args),
        Command::CheckReference { args } => run_gpu_bench("check", args),
        Command::Serve(args) => {
            init_logging(args.log_level.as_filter());
            let mut rt = tokio::runtime::Builder::new_multi_thread();
            rt.enable_all();
            if let Some(n) = http_worker_threads(&args) {
                rt.worker_threads(n);
            }
            let rt = match rt.build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(serve(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Async worker threads of the HTTP server. On the CPU device the model's kernel threads keep
/// the cores they were given busy through every step, and each streamed token wakes an async
/// worker: workers beyond the cores the model leaves free only preempt the kernels, so the
/// runtime gets those cores, at least one. `TOKIO_WORKER_THREADS` overrides this; on a GPU
/// the runtime keeps tokio's default (one worker per core).
fn http_worker_threads(args: &ServerArgs) -> Option<usize> {
    if args.device != DeviceKind::Cpu || std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = args.num_threads.unwrap_or(cores).min(cores);
    Some(cores.saturating_sub(model).max(1))
}
