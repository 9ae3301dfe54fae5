//! `sgl-router`: the cache-aware router (benchmarks: `sgl-bench router`).

use anyhow::Context;
use clap::Parser;
use sgl_router::{RouterConfig, launch};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "sgl-router",
    version,
    about = "Cache-aware load balancer for SGLang engine replicas"
)]
struct Cli {
    #[command(flatten)]
    config: RouterConfig,
}

fn init_tracing(level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn serve(config: RouterConfig) -> anyhow::Result<()> {
    config.validate()?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let router = launch(config, listener).await?;
    // Tests and scripts read the bound address (useful with --port 0) from this line.
    println!("sgl-router listening on {}", router.url());
    let cancel = router.cancel_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        cancel.cancel();
    });
    router.wait().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing(&cli.config.log_level);
    serve(cli.config).await
}
