//! Accepting connections with limits, so that slow or idle clients cannot exhaust the
//! server's file handles or memory.
//!
//! * At most [`ConnLimits::max_connections`] connections are open at once. At the cap the
//!   server stops accepting; new connections wait in the kernel's backlog until one closes.
//!   The cap is kept below the process's open-file limit, with room for model files, the
//!   router's and the server's own sockets.
//! * A client must send a request's headers within [`ConnLimits::header_read_timeout`] of
//!   starting it, and an idle keep-alive connection is closed after the same time (hyper
//!   times the wait for the next request's head the same way).
//! * Request bodies are read with a deadline by the handlers (see [`BODY_READ_TIMEOUT`]): the
//!   connection layer cannot tell a slow body from a long-running response.
//! * A failed `accept` (out of file handles, for one) pauses accepting briefly instead of
//!   spinning.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Longest wait for a request body once its headers have arrived.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Default cap on open connections (lowered to fit the open-file limit).
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;

/// Default deadline for a request's headers, and for an idle keep-alive connection. Longer
/// than the router's idle pool timeout towards the engines, so the router closes its idle
/// connections first.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// File handles kept free for everything but client connections.
const RESERVED_FILES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        let files = open_file_limit().unwrap_or(usize::MAX);
        ConnLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS
                .min(files.saturating_sub(RESERVED_FILES))
                .max(16),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// The soft limit on open files (`Max open files` in `/proc/self/limits`), where known.
pub fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(usize::MAX),
        n => n.parse().ok(),
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then lets the
/// requests in flight finish (each connection closes after its current response).
pub async fn serve_with_limits(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Every connection task holds a receiver; shutdown waits for all of them to drop.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accept error: {e}; pausing accepts for 100 ms");
                    drop(permit);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let header_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                _ = stop.changed() => {
                    // Finish the response in flight, then close.
                    conn.as_mut().graceful_shutdown();
                    conn.as_mut().await
                }
            };
            if let Err(e) = result {
                tracing::debug!("connection closed: {e}");
            }
            drop(stop);
        });
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(true);
    // Wait for every connection task to finish its response.
    stop_tx.closed().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_is_read() {
        // Linux always has the file; the limit is at least the three standard handles.
        if std::path::Path::new("/proc/self/limits").exists() {
            assert!(open_file_limit().is_some_and(|n| n >= 3));
        }
        let limits = ConnLimits::default();
        assert!(limits.max_connections >= 16);
        assert!(limits.max_connections <= DEFAULT_MAX_CONNECTIONS);
    }
}
