//! Forwarding one request to a worker: selection, retries, and streaming the response back.
//!
//! A generation request goes only to a worker with room for it, and is answered 429 (or 503)
//! with `Retry-After` at once when no worker has any ([`crate::app::AppState::select_within_bounds`]).
//! A worker's own overload answer (429, or 503 with `Retry-After`) is passed to the client
//! and never retried: the other engines are likely as full, and a refused request walking
//! the fleet costs every engine a round trip; the router remembers it for the worker.
//!
//! A request is retried on another worker (chosen again by the policy, the failed ones left
//! out while others remain) after a failure to connect or a 502/503/504 answer, with
//! exponential backoff and jitter between attempts; a worker that refuses the connection is
//! taken out of rotation at once. So is a worker that sends nothing for
//! `--first-byte-timeout-secs` and then fails a health probe (frozen: stopped, hung, its
//! machine gone); the request, of which the client has received nothing, goes to another
//! worker, but not to a third once two have frozen on it. A request whose worker took it and
//! then dropped the connection without an answer is not retried: the worker may have crashed
//! on that very request, and a retry would take the next worker down the same way (a poison
//! request must not walk through the fleet). It is answered 502 and the worker is marked dead
//! until its health checks pass again. A request the worker does not accept (any answer but
//! a 2xx, or no answer) is taken back out of the cache-aware prefix tree. Once a worker's
//! status line has been accepted, its body is streamed to the client chunk by chunk as it
//! arrives, and is never retried: the client may already hold part of it. The worker's load
//! counts the request until the last chunk has been sent or the client has gone away. A
//! body from which nothing comes for `--stream-idle-timeout-secs` (a worker frozen
//! mid-stream) is ended there: an SSE stream with an error event and `[DONE]`, another body
//! cut short; the connection to the worker is dropped and the worker's health probed. A
//! generation response's prompt and cached token counts are read as it passes
//! ([`crate::usage`]) and counted when it ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::Stream;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderName, Method, StatusCode, header};

use crate::app::{AppState, Chosen};
use crate::error::{Result, RouterError};
use crate::retry::is_retryable_status;
use crate::usage::UsageScan;
use crate::worker::{LoadGuard, Worker};

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

/// Whether `e` says the worker's connection closed or was reset after the request went out
/// (the worker process died, or dropped the connection, while handling it).
fn connection_broke(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// Workers a request may find frozen before it is answered without another attempt: one
/// frozen worker is bad luck (it was stopped, its host hung), a second on the same request
/// says the request may be what freezes them, and a third would only spread it.
const MAX_FROZEN_ATTEMPTS: u32 = 2;

/// How one attempt ended, before any of the answer's body.
enum Attempt {
    /// The worker's status line and headers arrived.
    Answered(reqwest::Response),
    Failed(reqwest::Error),
    /// Nothing arrived within the first-byte timeout, and the worker then failed a health
    /// probe: it is frozen (stopped, hung, or its machine gone), not busy.
    Frozen {
        waited: Duration,
    },
}

/// Awaits `send`, probing the worker's health each time `--first-byte-timeout-secs` passes
/// without its status line: a non-streaming answer comes only when it is done, so silence
/// alone does not tell a long generation from a frozen worker, but a worker's health endpoint
/// answers while it generates. The request timeout still bounds the whole wait (inside `send`).
async fn send_watched(
    state: &AppState,
    worker: &Worker,
    send: impl Future<Output = reqwest::Result<reqwest::Response>>,
) -> Attempt {
    let done = |r: reqwest::Result<reqwest::Response>| match r {
        Ok(resp) => Attempt::Answered(resp),
        Err(e) => Attempt::Failed(e),
    };
    let Some(limit) = state.config.first_byte_timeout() else {
        return done(send.await);
    };
    let started = Instant::now();
    tokio::pin!(send);
    loop {
        if let Ok(r) = tokio::time::timeout(limit, &mut send).await {
            return done(r);
        }
        let probe = state.probe(worker.url());
        tokio::pin!(probe);
        tokio::select! {
            r = &mut send => return done(r),
            alive = &mut probe => if !alive {
                return Attempt::Frozen { waited: started.elapsed() };
            },
        }
        tracing::debug!(
            worker = worker.url(),
            waited_s = started.elapsed().as_secs(),
            "no answer yet; the worker is alive and still working"
        );
    }
}

/// Sends `req` to a worker, retrying as described in the module documentation.
pub async fn forward(state: &AppState, req: Outgoing<'_>) -> Result<Response> {
    let attempts = state.retry.max_retries + 1;
    let headers = request_headers(req.headers, state.config.api_key.as_deref());
    let timeout = state.config.request_timeout();
    let mut tried: Vec<Arc<str>> = Vec::new();
    let mut last_error = String::from("no attempt was made");
    let mut frozen = 0;
    // Generation requests are the ones an engine admits against its bounds.
    let bounded = req.text.is_some();
    for attempt in 0..attempts {
        if attempt > 0 {
            state.metrics.retries.with_label_values(&[req.route]).inc();
            let wait = state.retry.backoff(attempt - 1, &mut rand::rng());
            tokio::time::sleep(wait).await;
        }
        let chosen = if attempt == 0 {
            // No worker yet (scaled to zero, all restarting): wait in the queue for one.
            Some(state.select_or_wait(req.text, &tried, bounded).await?)
        } else {
            state.select_within_bounds(req.text, &tried, bounded)?
        };
        let Some(Chosen {
            worker,
            decision,
            mut guard,
        }) = chosen
        else {
            if attempt + 1 == attempts {
                return Err(RouterError::NoHealthyWorker);
            }
            continue;
        };
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
        let sent = send_watched(state, &worker, builder.send()).await;
        // A request the worker did not accept leaves nothing in the prefix tree.
        let accepted = matches!(&sent, Attempt::Answered(resp) if resp.status().is_success());
        if !accepted && let (Some(text), Some(recorded)) = (req.text, decision.recorded) {
            state.policy.on_refused(text, worker.url(), recorded);
        }
        let sent = match sent {
            Attempt::Answered(resp) => Ok(resp),
            Attempt::Failed(e) => Err(e),
            Attempt::Frozen { waited } => {
                guard.failed();
                frozen += 1;
                last_error = format!(
                    "{} sent nothing for {} s (--first-byte-timeout-secs) and did not answer \
                     its health check",
                    worker.url(),
                    waited.as_secs()
                );
                tracing::warn!(worker = worker.url(), error = %last_error, attempt, "worker is frozen");
                state.mark_down(&worker, "no first byte and no answer to its health check");
                if frozen >= MAX_FROZEN_ATTEMPTS {
                    return Err(RouterError::Upstream {
                        url: worker.url().to_string(),
                        message: format!(
                            "{last_error}; {frozen} workers froze on this request, which may \
                             be what froze them: not sent to another"
                        ),
                    });
                }
                // Nothing reached the client yet: the request may go elsewhere.
                tried.push(worker.url_arc());
                continue;
            }
        };
        match sent {
            Ok(resp) => {
                let status = resp.status();
                let overload = overload_advice(&resp);
                if let Some(retry_after) = overload {
                    // The engine sheds load: passed to the client as it is, never retried
                    // elsewhere (the other engines are likely as full), and remembered so
                    // that the next requests are answered here until the worker has room.
                    if bounded {
                        worker.note_refusal(status, retry_after, worker.load());
                    }
                    guard.succeeded();
                    state
                        .metrics
                        .errors
                        .with_label_values(&[req.route, "worker_overloaded"])
                        .inc();
                    return Ok(stream_back(
                        state,
                        resp,
                        guard,
                        req.route,
                        req.started,
                        false,
                    ));
                }
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
                let counts_tokens = req.text.is_some() && status.is_success();
                return Ok(stream_back(
                    state,
                    resp,
                    guard,
                    req.route,
                    req.started,
                    counts_tokens,
                ));
            }
            Err(e) if e.is_timeout() => {
                guard.failed();
                return Err(RouterError::Timeout {
                    url: worker.url().to_string(),
                    secs: timeout.as_secs(),
                });
            }
            Err(e) if e.is_connect() => {
                // Nothing was sent: the request is safe to send elsewhere.
                guard.failed();
                last_error = format!("{}: {}", worker.url(), error_chain(&e));
                tracing::warn!(worker = worker.url(), error = %last_error, attempt, "cannot connect to worker");
                state.mark_down(&worker, "connection refused");
                tried.push(worker.url_arc());
            }
            Err(e) if !connection_broke(&e) => {
                // The worker answered something that is not HTTP, or the request could not
                // be built: another worker may do better.
                guard.failed();
                last_error = format!("{}: {}", worker.url(), error_chain(&e));
                tracing::warn!(worker = worker.url(), error = %last_error, attempt, "request to worker failed");
                tried.push(worker.url_arc());
            }
            Err(e) => {
                // The worker took the request and its connection broke before it answered:
                // it may have died of this very request, which would kill every worker it
                // is retried on. Answer 502 and take the worker out of rotation.
                guard.failed();
                state.mark_down(&worker, "connection broke during a request");
                return Err(RouterError::Upstream {
                    url: worker.url().to_string(),
                    message: format!(
                        "the connection broke while it handled the request ({}); not retried \
                         on another worker, since the request itself may have caused it",
                        error_chain(&e)
                    ),
                });
            }
        }
    }
    Err(RouterError::RetriesExhausted {
        attempts,
        last: last_error,
    })
}

/// Whether a worker's answer is its load shedding, and its advice in seconds: a 429, or a
/// 503 with `Retry-After` (an engine's queue deadline; a 503 without it is a gateway's or a
/// stopping server's, worth another worker). An HTTP-date or missing `Retry-After` of a 429
/// counts as one second.
fn overload_advice(resp: &reqwest::Response) -> Option<u64> {
    let advice = resp
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
    match resp.status() {
        StatusCode::TOO_MANY_REQUESTS => Some(advice.flatten().unwrap_or(1)),
        StatusCode::SERVICE_UNAVAILABLE => advice.map(|secs| secs.unwrap_or(1)),
        _ => None,
    }
}

/// Builds the client's response from the worker's: same status and headers, body streamed.
fn stream_back(
    state: &AppState,
    resp: reqwest::Response,
    guard: LoadGuard,
    route: &'static str,
    started: Instant,
    counts_tokens: bool,
) -> Response {
    let status = resp.status();
    let scan = if counts_tokens {
        resp.headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(UsageScan::new)
    } else {
        None
    };
    let mut headers = HeaderMap::with_capacity(resp.headers().len());
    for (name, value) in resp.headers() {
        if !is_hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let idle = state.config.stream_idle_timeout().map(|limit| IdleWatch {
        limit,
        timer: Box::pin(tokio::time::sleep(limit)),
        rearm: true,
        sse,
    });
    let body = GuardedBody {
        inner: Some(Box::pin(resp.bytes_stream())),
        guard,
        state: state.clone(),
        route,
        started,
        scan,
        idle,
    };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// `--stream-idle-timeout-secs` on one response body: how long the worker has been asked
/// for its next chunk (not since the last one: a client slow to read is not the worker's
/// silence).
struct IdleWatch {
    limit: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The last poll returned something: the next one starts a new wait.
    rearm: bool,
    /// An SSE stream is ended with an error event; another body can only be cut short.
    sse: bool,
}

/// A worker's response body on its way to the client; holds the worker's load until the
/// stream ends or the client drops it.
struct GuardedBody {
    /// `None` once the worker went silent past the idle timeout: dropping it closes the
    /// connection to the worker, which aborts the request there.
    inner: Option<BoxStream<'static, reqwest::Result<Bytes>>>,
    guard: LoadGuard,
    state: AppState,
    route: &'static str,
    started: Instant,
    /// Generation responses: their prompt and cached token counts, read on the way.
    scan: Option<UsageScan>,
    idle: Option<IdleWatch>,
}

impl GuardedBody {
    /// The worker sent nothing for the idle limit: let it go, count it, probe its health, and
    /// give the client what ends its stream.
    fn stalled(&mut self, limit: Duration, sse: bool) -> Option<std::io::Result<Bytes>> {
        self.inner = None;
        self.guard.failed();
        let worker = self.guard.worker().clone();
        let err = RouterError::StreamStalled {
            url: worker.url().to_string(),
            secs: limit.as_secs(),
        };
        self.state
            .metrics
            .errors
            .with_label_values(&[self.route, err.metric_label()])
            .inc();
        tracing::warn!(worker = worker.url(), error = %err, "worker stream stalled");
        // A worker that does not answer its health check either is frozen: out of rotation.
        let state = self.state.clone();
        tokio::spawn(async move {
            if !state.probe(worker.url()).await {
                state.mark_down(
                    &worker,
                    "a stream stalled and no answer to its health check",
                );
            }
        });
        if sse {
            let event = crate::error::error_body(err.status(), err.to_string());
            Some(Ok(Bytes::from(format!(
                "data: {event}\n\ndata: [DONE]\n\n"
            ))))
        } else {
            // Nothing in a JSON body can say it is incomplete: the client sees it cut short.
            Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                err.to_string(),
            )))
        }
    }
}

impl Stream for GuardedBody {
    type Item = std::io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = inner.as_mut().poll_next(cx);
        if let Some(idle) = &mut this.idle {
            if idle.rearm {
                idle.rearm = false;
                let next = tokio::time::Instant::now() + idle.limit;
                idle.timer.as_mut().reset(next);
            }
            if polled.is_ready() {
                idle.rearm = true;
            } else if idle.timer.as_mut().poll(cx).is_ready() {
                let (limit, sse) = (idle.limit, idle.sse);
                return Poll::Ready(this.stalled(limit, sse));
            }
        }
        if let (Poll::Ready(Some(Ok(chunk))), Some(scan)) = (&polled, &mut this.scan) {
            scan.feed(chunk);
        }
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
        polled.map(|item| item.map(|r| r.map_err(std::io::Error::other)))
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        // At drop, not at the stream's end: a body of known length is dropped once its last
        // byte is written, without being polled to its end. A body cut short counts what
        // it carried (a JSON body cut short does not parse and counts nothing).
        if let Some(usage) = self.scan.take().and_then(UsageScan::finish) {
            self.state.metrics.record_usage(usage);
        }
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

    fn answer(status: u16, retry_after: Option<&str>) -> reqwest::Response {
        let mut b = http::Response::builder().status(status);
        if let Some(v) = retry_after {
            b = b.header(header::RETRY_AFTER, v);
        }
        reqwest::Response::from(b.body("").unwrap())
    }

    #[test]
    fn a_429_or_a_503_with_retry_after_is_an_engine_shedding_load() {
        assert_eq!(overload_advice(&answer(429, Some("7"))), Some(7));
        assert_eq!(overload_advice(&answer(429, None)), Some(1));
        assert_eq!(overload_advice(&answer(503, Some("13"))), Some(13));
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        assert_eq!(overload_advice(&answer(503, Some(date))), Some(1));
        // A 503 without advice is a gateway's or a stopping server's: retried elsewhere.
        assert_eq!(overload_advice(&answer(503, None)), None);
        for status in [200, 500, 502, 504] {
            assert_eq!(
                overload_advice(&answer(status, Some("5"))),
                None,
                "{status}"
            );
        }
    }
}
