//! Starting a router: state, the first round of health checks, background loops (health
//! checks of healthy workers, fast probes of dead ones, tree eviction, service discovery) and
//! the HTTP server.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::{AppState, DOWN_PROBE_INTERVAL};
use crate::config::RouterConfig;
use crate::discovery::{self, DiscoveryConfig};
use crate::error::Result;
use crate::server;

/// A router serving on a bound listener.
pub struct RunningRouter {
    state: AppState,
    addr: SocketAddr,
    cancel: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Runs `tick` every `period` until `cancel` fires; the first run is one period from now.
fn every<F, Fut>(period: Duration, cancel: CancellationToken, mut tick: F) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = interval.tick() => tick().await,
            }
        }
    })
}

/// Starts a router on `listener`: registers `--worker-urls`, checks them once, then serves.
pub async fn launch(config: RouterConfig, listener: TcpListener) -> Result<RunningRouter> {
    let state = AppState::new(config)?;
    state.check_all().await;
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();

    let s = state.clone();
    tasks.push(every(
        Duration::from_secs(state.config.health_check_interval_secs),
        cancel.clone(),
        move || {
            let s = s.clone();
            async move { s.check_healthy().await }
        },
    ));
    let s = state.clone();
    tasks.push(every(
        DOWN_PROBE_INTERVAL.min(Duration::from_secs(state.config.health_check_interval_secs)),
        cancel.clone(),
        move || {
            s.probe_down_workers();
            async {}
        },
    ));
    let s = state.clone();
    tasks.push(every(
        state.config.eviction_interval(),
        cancel.clone(),
        move || {
            let s = s.clone();
            async move {
                // Eviction scans the whole tree: keep it off the async worker threads.
                let policy = s.policy.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || policy.maintain()).await {
                    tracing::warn!(error = %e, "tree eviction task failed");
                }
            }
        },
    ));
    if state.config.service_discovery {
        let cfg = DiscoveryConfig {
            selector: state.config.selector_map()?,
            namespace: state.config.service_discovery_namespace.clone(),
            port: state.config.service_discovery_port,
        };
        let s = state.clone();
        let c = cancel.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = discovery::run(s, cfg, c).await {
                tracing::error!(error = %e, "service discovery stopped");
            }
        }));
    }

    let addr = listener.local_addr()?;
    let app = server::app(state.clone());
    let c = cancel.clone();
    let limits = sgl_http::listen::ConnLimits::default();
    let server =
        tokio::spawn(async move {
            sgl_http::listen::serve_with_limits(listener, app, limits, async move {
                c.cancelled().await
            })
            .await
        });
    tracing::info!(
        %addr,
        policy = state.policy.name(),
        workers = state.workers.len(),
        "router started"
    );
    Ok(RunningRouter {
        state,
        addr,
        cancel,
        server,
        tasks,
    })
}

impl RunningRouter {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port` of the router.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops accepting requests, lets requests in flight finish, stops background loops.
    pub async fn shutdown(self) -> Result<()> {
        self.cancel.cancel();
        self.wait().await
    }

    /// Waits until the server stops (after `shutdown` or a server error).
    pub async fn wait(self) -> Result<()> {
        let served = self.server.await;
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        match served {
            Ok(result) => Ok(result?),
            Err(e) => Err(std::io::Error::other(e).into()),
        }
    }

    /// A token that stops the router when cancelled (for signal handlers).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }
}
