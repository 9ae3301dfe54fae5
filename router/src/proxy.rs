//! Forwarding one request to a worker: selection, retries, and streaming the response back.
//!
//! A request is retried on another worker (chosen again by the policy, the failed ones left
//! out while others remain) after a connection error or a 502/503/504 answer, with
//! exponential backoff and jitter between attempts. Once a worker's status line has been
//! accepted, its body is streamed to the client chunk by chunk as it arrives, and is never
//! retried: the client may already hold part of it. The worker's load counts the request
//! until the last chunk has been sent or the client has gone away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::Stream;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderName, Method, header};

use crate::app::AppState;
use crate::error::{Result, RouterError};
use crate::retry::is_retryable_status;
use crate::worker::LoadGuard;

/// A request to forward.
pub struct Outgoing<'a> {
    /// Metric label of the route, e.g. `/generate`.
    pub route: &'static str,
    pub method: Method,
    /// Path and query appended to the worker's URL.
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub body: Option<Bytes>,
    /// Routing text (cache-aware policy), when the request has one.
    pub text: Option<&'a str>,
    pub started: Instant,
}

/// Headers that describe one connection and must not be forwarded.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn request_headers(client: &HeaderMap, api_key: Option<&str>) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len());
    for (name, value) in client {
        if is_hop_by_hop(name) || name == header::HOST || name == header::CONTENT_LENGTH {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(key) = api_key
        && let Ok(v) = format!("Bearer {key}").parse()
    {
        out.insert(header::AUTHORIZATION, v);
    }
    out
}

/// Describes a client error with its causes ("error sending request: connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// Sends `req` to a worker, retrying as described in the module documentation.
pub async fn forward(state: &AppState, req: Outgoing<'_>) -> Result<Response> {
    let attempts = state.retry.max_retries + 1;
    let headers = request_headers(req.headers, state.config.api_key.as_deref());
    let timeout = state.config.request_timeout();
    let mut tried: Vec<Arc<str>> = Vec::new();
    let mut last_error = String::from("no attempt was made");
    for attempt in 0..attempts {
        if attempt > 0 {
            state.metrics.retries.with_label_values(&[req.route]).inc();
            let wait = state.retry.backoff(attempt - 1, &mut rand::rng());
            tokio::time::sleep(wait).await;
        }
        let Some((worker, _)) = state.select(req.text, &tried) else {
            if attempt == 0 || attempt + 1 == attempts {
                return Err(RouterError::NoHealthyWorker);
            }
            continue;
        };
        let mut guard = worker.start_request();
        state
            .metrics
            .worker_requests
            .with_label_values(&[worker.url()])
            .inc();
        let url = format!("{}{}", worker.url(), req.path_and_query);
        let mut builder = state
            .client
            .request(req.method.clone(), &url)
            .headers(headers.clone())
            .timeout(timeout);
        if let Some(body) = &req.body {
            builder = builder.body(body.clone());
        }
        match builder.send().await {
            Ok(resp) => {
                let status = resp.status();
                if is_retryable_status(status) && attempt + 1 < attempts {
                    guard.failed();
                    tracing::warn!(worker = worker.url(), %status, attempt, "worker unavailable; retrying");
                    last_error = format!("{} answered {status}", worker.url());
                    tried.push(worker.url_arc());
                    continue;
                }
                if status.is_server_error() {
                    guard.failed();
                    state
                        .metrics
                        .errors
                        .with_label_values(&[req.route, "worker_5xx"])
                        .inc();
                } else {
                    guard.succeeded();
                }
                return Ok(stream_back(state, resp, guard, req.route, req.started));
            }
            Err(e) if e.is_timeout() => {
                guard.failed();
                return Err(RouterError::Timeout {
                    url: worker.url().to_string(),
                    secs: timeout.as_secs(),
                });
            }
            Err(e) => {
                guard.failed();
                last_error = format!("{}: {}", worker.url(), error_chain(&e));
                tracing::warn!(worker = worker.url(), error = %last_error, attempt, "request to worker failed");
                tried.push(worker.url_arc());
            }
        }
    }
    Err(RouterError::RetriesExhausted {
        attempts,
        last: last_error,
    })
}

/// Builds the client's response from the worker's: same status and headers, body streamed.
fn stream_back(
    state: &AppState,
    resp: reqwest::Response,
    guard: LoadGuard,
    route: &'static str,
    started: Instant,
) -> Response {
    let status = resp.status();
    let mut headers = HeaderMap::with_capacity(resp.headers().len());
    for (name, value) in resp.headers() {
        if !is_hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let body = GuardedBody {
        inner: Box::pin(resp.bytes_stream()),
        guard,
        state: state.clone(),
        route,
        started,
    };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// A worker's response body on its way to the client; holds the worker's load until the
/// stream ends or the client drops it.
struct GuardedBody {
    inner: BoxStream<'static, reqwest::Result<Bytes>>,
    guard: LoadGuard,
    state: AppState,
    route: &'static str,
    started: Instant,
}

impl Stream for GuardedBody {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let polled = this.inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Err(e))) = &polled {
            this.guard.failed();
            this.state
                .metrics
                .errors
                .with_label_values(&[this.route, "stream_interrupted"])
                .inc();
            tracing::warn!(
                worker = this.guard.worker().url(),
                error = %error_chain(e),
                "worker response broke off mid-stream"
            );
        }
        polled
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        self.state
            .metrics
            .request_duration
            .with_label_values(&[self.route])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_headers_drop_hop_by_hop_and_apply_the_key() {
        let mut client = HeaderMap::new();
        client.insert(header::CONNECTION, "keep-alive".parse().unwrap());
        client.insert(header::HOST, "router:30000".parse().unwrap());
        client.insert(header::CONTENT_LENGTH, "12".parse().unwrap());
        client.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        client.insert(header::AUTHORIZATION, "Bearer client".parse().unwrap());
        client.insert("x-request-id", "abc".parse().unwrap());
        let out = request_headers(&client, None);
        assert_eq!(out.len(), 3);
        assert_eq!(out[header::AUTHORIZATION], "Bearer client");
        assert_eq!(out["x-request-id"], "abc");
        let out = request_headers(&client, Some("secret"));
        assert_eq!(out[header::AUTHORIZATION], "Bearer secret");
    }
}
