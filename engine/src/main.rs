//! `sgl-engine`: serve a model over SGLang's native and OpenAI-compatible APIs.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sgl_core::config::{DeviceKind, ServerArgs};
use sgl_core::model::hub;

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
    /// Fetch a model from the Hugging Face Hub into the Hub cache (HF_HUB_CACHE) without
    /// serving it; prints the local path and the resolved commit. For init containers and
    /// warming a volume.
    Download(DownloadArgs),
}

#[derive(clap::Args)]
struct DownloadArgs {
    /// Hub id: `org/name`, or `org/name/file.gguf` for one GGUF file.
    model: String,
    /// Branch, tag or commit (default: main).
    #[arg(long, env = "HF_REVISION")]
    revision: Option<String>,
    #[arg(long, value_enum, default_value = "info")]
    log_level: sgl_core::config::LogLevel,
    /// Also write the result lines (`path ...`, `commit ...`) to this file, e.g. a Kubernetes
    /// container's `/dev/termination-log`, where the kubelet reads it into the pod status.
    #[arg(long)]
    termination_message_path: Option<std::path::PathBuf>,
}

fn download(args: DownloadArgs) -> ExitCode {
    init_logging(args.log_level.as_filter());
    let result = hub::RepoRef::parse(&args.model).and_then(|repo| {
        let rt = tokio::runtime::Runtime::new()
            .map_err(|e| hub::HubError::BadResponse(e.to_string()))?;
        rt.block_on(hub::fetch(
            &repo,
            args.revision.as_deref(),
            &hub::HubSettings::from_env(),
        ))
    });
    match result {
        Ok(snap) => {
            let result = format!("path {}\ncommit {}\n", snap.path.display(), snap.commit);
            print!("{result}");
            if let Some(p) = &args.termination_message_path
                && let Err(e) = std::fs::write(p, &result)
            {
                eprintln!("error: cannot write {}: {e}", p.display());
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--model-path org/name`: fetch the model (or find it in the cache) and serve the local
/// copy; the served name stays the id, as in SGLang.
async fn resolve_hub_model(args: &mut ServerArgs) -> Result<(), String> {
    let Some(repo) = hub::RepoRef::from_model_path(&args.model_path) else {
        if let Some(r) = &args.revision {
            tracing::info!("--revision {r} ignored: --model-path is a local path");
        }
        return Ok(());
    };
    let snap = hub::fetch(
        &repo,
        args.revision.as_deref(),
        &hub::HubSettings::from_env(),
    )
    .await
    .map_err(|e| e.to_string())?;
    tracing::info!(
        "{repo}@{} is commit {} at {}",
        args.revision.as_deref().unwrap_or("main"),
        snap.commit,
        snap.path.display()
    );
    if args.served_model_name.is_none() {
        args.served_model_name = Some(repo.to_string());
    }
    args.model_path = snap.path;
    Ok(())
}

/// `serve --check`: validates without loading weights or binding the port. A Hub id is looked
/// up in the local Hub cache only (nothing is downloaded); when it is not there, only the
/// flags are checked, and the output says so.
async fn check(mut args: ServerArgs) -> Result<(), String> {
    if let Some(repo) = hub::RepoRef::from_model_path(&args.model_path) {
        let offline = hub::HubSettings {
            offline: true,
            ..hub::HubSettings::from_env()
        };
        match hub::fetch(&repo, args.revision.as_deref(), &offline).await {
            Ok(snap) => args.model_path = snap.path,
            Err(e) => {
                println!(
                    "ok: flags valid; model files not checked ({repo} is not in the local Hub cache: {e})"
                );
                return Ok(());
            }
        }
    }
    let summary = sgl_core::engine::check(args).map_err(|e| e.to_string())?;
    println!("ok: {summary}");
    Ok(())
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},sgl_core={level},sgl_engine={level}"))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn serve(mut args: ServerArgs) -> Result<(), String> {
    // Flags are checked before a download that may take minutes.
    args.validate().map_err(|e| e.to_string())?;
    if args.check {
        return check(args).await;
    }
    let addr = format!("{}:{}", args.host, args.port);
    // Bind first so a port clash fails fast, before the model load.
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    resolve_hub_model(&mut args).await?;
    let engine = tokio::task::spawn_blocking(move || sgl_core::engine::launch(args))
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
    // Tensor parallelism: NCCL's NVLink multicast (NVLS) stays off unless the user asks for
    // it; the ranks all-reduce over plain NVLink/PCIe peer transfers.
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: no other thread exists yet (the runtime and the ranks start later).
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Download(args) => download(args),
        Command::Serve(mut args) => {
            init_logging(args.log_level.as_filter());
            args.resolve_device();
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
    if args.device() != DeviceKind::Cpu || std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = args.num_threads.unwrap_or(cores).min(cores);
    Some(cores.saturating_sub(model).max(1))
}
