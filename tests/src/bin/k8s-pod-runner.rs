//! Runs the pods that the test control plane binds to kwok nodes as local processes (see
//! `sgl_e2e_tests::k8s::runner`). Started by `tests/k8s/cluster.sh up --runner ...`.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use sgl_e2e_tests::k8s::runner::{RunnerConfig, default_binaries, run};

#[derive(Parser)]
#[command(about = "Run pods bound to kwok nodes as local processes of our binaries")]
struct Args {
    /// Admin kubeconfig of the test cluster.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Folder of sgl-engine, sgl-router and sgl-operator (default: this binary's folder).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// PREFIX=DIR: a path the image holds (e.g. /models) and the local folder that stands for it.
    #[arg(long = "map-path")]
    map_path: Vec<String>,
    /// Folder for each pod's logs, volumes and kubeconfig.
    #[arg(long)]
    work_dir: PathBuf,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .with_ansi(false)
        .init();
    let args = Args::parse();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let cluster = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| anyhow!("{} has no cluster", args.kubeconfig.display()))?;
    let server = cluster.server.clone().unwrap_or_default();
    let ca_file = PathBuf::from(cluster.certificate_authority.clone().unwrap_or_default());
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    // Absolute: each process starts in its pod's own folder.
    let bin_dir = match args.bin_dir {
        Some(d) => std::path::absolute(&d)?,
        None => std::env::current_exe()?
            .parent()
            .map(PathBuf::from)
            .ok_or_else(|| anyhow!("no folder for this binary"))?,
    };
    let mut path_map = Vec::new();
    for m in &args.map_path {
        let (prefix, dir) = m
            .split_once('=')
            .ok_or_else(|| anyhow!("--map-path {m}: expected PREFIX=DIR"))?;
        path_map.push((prefix.to_string(), std::path::absolute(dir)?));
    }
    std::fs::create_dir_all(&args.work_dir)?;
    let work_dir = std::path::absolute(&args.work_dir)?;
    let config = RunnerConfig {
        binaries: default_binaries(&bin_dir),
        path_map,
        work_dir,
        server,
        ca_file,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping: every pod process is stopped first");
    };
    run(client, config, shutdown).await
}
