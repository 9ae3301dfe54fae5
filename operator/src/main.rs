//! `sgl-operator run` reconciles SGLangService objects; `sgl-operator render -f FILE` prints
//! the objects it would apply, without a cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use sgl_crds::SGLangService;
use sgl_operator::controller::{self, Context};
use sgl_operator::leader::LeaderElector;
use sgl_operator::metrics::{self, Metrics};
use sgl_operator::objects::{PlanOptions, render_yaml};

#[derive(Parser)]
#[command(
    name = "sgl-operator",
    version,
    about = "Kubernetes operator for SGLangService"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller.
    Run {
        /// Address of the /metrics and /health server.
        #[arg(
            long,
            default_value = "0.0.0.0:8080",
            env = "SGL_OPERATOR_METRICS_ADDR"
        )]
        metrics_addr: SocketAddr,
        /// Elect a leader through a Lease so several replicas can run.
        #[arg(long, env = "SGL_OPERATOR_LEADER_ELECTION")]
        leader_election: bool,
        /// Namespace of the Lease (the operator's own namespace).
        #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
        lease_namespace: String,
        #[arg(long, default_value = "sgl-operator-leader")]
        lease_name: String,
        /// This replica's identity in the Lease and in Events (the pod name).
        #[arg(long, env = "POD_NAME", default_value = "sgl-operator")]
        identity: String,
        #[arg(long, default_value_t = 15)]
        lease_seconds: i32,
        /// Scale services with `autoscaling.minReplicas: 0` through a KEDA ScaledObject whose
        /// triggers query this Prometheus (KEDA must be installed), instead of an HPA.
        #[arg(long, env = "SGL_OPERATOR_KEDA_PROMETHEUS_URL")]
        keda_prometheus_url: Option<String>,
    },
    /// Print every object the operator would apply for the SGLangService(s) in a file.
    Render {
        /// YAML file with one or more SGLangService documents; `-` reads stdin.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// Namespace for objects that do not name one.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Render as an operator run with this option does (a KEDA ScaledObject for services
        /// with `autoscaling.minReplicas: 0`).
        #[arg(long)]
        keda_prometheus_url: Option<String>,
    },
}

fn render(file: &PathBuf, namespace: &str, options: &PlanOptions) -> anyhow::Result<()> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut out = String::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        // Other kinds in the same file (Secrets, PVCs) are the user's, not the operator's.
        if value.get("kind").and_then(serde_yaml::Value::as_str) != Some("SGLangService") {
            continue;
        }
        let mut svc: SGLangService =
            serde_yaml::from_value(value).context("not an SGLangService")?;
        svc.metadata
            .namespace
            .get_or_insert_with(|| namespace.to_string());
        // Owner references need a uid; a preview has none until the API server assigns it.
        svc.metadata
            .uid
            .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".to_string());
        out.push_str(&render_yaml(&svc, options)?);
    }
    print!("{out}");
    Ok(())
}

use serde::Deserialize as _;

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .json()
        .init();
    match Cli::parse().command {
        Command::Render {
            file,
            namespace,
            keda_prometheus_url,
        } => render(
            &file,
            &namespace,
            &PlanOptions {
                keda_prometheus_url,
            },
        ),
        Command::Run {
            metrics_addr,
            leader_election,
            lease_namespace,
            lease_name,
            identity,
            lease_seconds,
            keda_prometheus_url,
        } => {
            let metrics = Arc::new(Metrics::new()?);
            let server = tokio::spawn(metrics::serve(metrics_addr, metrics.clone()));
            let client = Client::try_default()
                .await
                .context("connecting to Kubernetes")?;
            let ctx = Arc::new(
                Context::new(client.clone(), metrics.clone(), Some(identity.clone())).with_options(
                    PlanOptions {
                        keda_prometheus_url,
                    },
                ),
            );
            if !leader_election {
                metrics.leader.set(1);
                controller::run(ctx).await?;
                server.abort();
                return Ok(());
            }
            let elector = LeaderElector::new(
                Api::<Lease>::namespaced(client, &lease_namespace),
                &lease_name,
                &identity,
                lease_seconds,
            );
            // A replica that loses the lease (another took it, or the API server was away
            // longer than the lease) stops reconciling and campaigns again in the same process,
            // so an outage of the API server costs no restart.
            let lead = async {
                loop {
                    tracing::info!(lease = %lease_name, %identity, "waiting for leadership");
                    elector.acquire().await?;
                    metrics.leader.set(1);
                    tracing::info!(%identity, "leading");
                    tokio::select! {
                        result = controller::run(ctx.clone()) => return result,
                        lost = elector.hold() => {
                            metrics.leader.set(0);
                            tracing::warn!(%identity, error = %lost, "stopped leading");
                        }
                    }
                }
            };
            // A shutdown signal ends the process whether it leads or follows (the controller's
            // own handler only runs while it leads); a reconcile cut short is an idempotent
            // server-side apply that the next leader repeats.
            tokio::select! {
                result = lead => result?,
                () = shutdown_signal() => tracing::info!("shutting down"),
            }
            server.abort();
            Ok(())
        }
    }
}
