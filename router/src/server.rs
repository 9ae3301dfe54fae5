//! The router's HTTP API: the engine's routes, proxied, plus worker management, metrics and
//! the router's own health (`/health`, `/liveness`, `/readiness`: answered here, never
//! proxied, so that a router with no engine behind it stays ready).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::app::AppState;
use crate::error::{Result, RouterError, error_response};
use crate::proxy::{self, Outgoing};
use crate::request_text::{GenerationRoute, parse_request};

/// Builds the axum application over `state`.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/generate", post(generate).put(generate))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(passthrough))
        .route("/v1/models/{model}", get(passthrough))
        .route("/parse_function_call", post(passthrough_post))
        .route("/function_call", post(passthrough_post))
        .route("/get_model_info", get(passthrough))
        .route("/get_server_info", get(passthrough))
        .route("/health", get(health))
        .route("/liveness", get(health))
        .route("/readiness", get(health))
        .route("/health_generate", get(passthrough))
        .route("/flush_cache", post(flush_cache).get(flush_cache))
        .route("/add_worker", post(add_worker))
        .route("/remove_worker", post(remove_worker))
        .route("/list_workers", get(list_workers))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        .with_state(state)
}

/// A handler that panicked answers 500 with the usual error body; the router carries on.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let reason = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    tracing::error!(reason, "request handler panicked");
    error_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the request handler failed: {reason}"),
    )
}

/// Paths open without the API key: probes and scraping. `/health_generate` is not among
/// them: it makes an engine generate.
fn is_public(path: &str) -> bool {
    matches!(path, "/health" | "/liveness" | "/readiness" | "/metrics")
}

/// Compares in time independent of where the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key
        && !is_public(req.uri().path())
    {
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_secret(presented.as_bytes(), key.as_bytes()) {
            return RouterError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

/// Reads the whole body, refusing more than `limit` bytes.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(RouterError::PayloadTooLarge { limit });
    }
    let read = async {
        let mut buf = BytesMut::new();
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| RouterError::BadRequest(format!("could not read the body: {e}")))?;
            if buf.len() + chunk.len() > limit {
                return Err(RouterError::PayloadTooLarge { limit });
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    };
    tokio::time::timeout(sgl_http::listen::BODY_READ_TIMEOUT, read)
        .await
        .map_err(|_| RouterError::BodyTimeout {
            secs: sgl_http::listen::BODY_READ_TIMEOUT.as_secs(),
        })?
}

fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query().map_or(uri.path(), |pq| pq.as_str())
}

/// Counts the request and, on failure, the error; turns the outcome into a response.
fn finish(
    state: &AppState,
    route: &'static str,
    started: Instant,
    result: Result<Response>,
) -> Response {
    match result {
        Ok(resp) => resp,
        Err(e) => {
            state
                .metrics
                .errors
                .with_label_values(&[route, e.metric_label()])
                .inc();
            state
                .metrics
                .request_duration
                .with_label_values(&[route])
                .observe(started.elapsed().as_secs_f64());
            if e.status().is_server_error() {
                tracing::warn!(route, error = %e, "request failed");
            }
            e.into_response()
        }
    }
}

async fn generation(
    state: AppState,
    route: GenerationRoute,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let label = route.path();
    state.metrics.requests.with_label_values(&[label]).inc();
    let result = async {
        let bytes = read_body(&headers, body, state.config.max_payload_size).await?;
        let parsed = parse_request(route, &bytes)?;
        proxy::forward(
            &state,
            Outgoing {
                route: label,
                method: Method::POST,
                path_and_query: path_and_query(&uri),
                headers: &headers,
                body: Some(bytes),
                text: Some(&parsed.text),
                started,
            },
        )
        .await
    }
    .await;
    finish(&state, label, started, result)
}

async fn generate(State(s): State<AppState>, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    generation(s, GenerationRoute::Generate, uri, headers, body).await
}

async fn completions(
    State(s): State<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generation(s, GenerationRoute::Completions, uri, headers, body).await
}

async fn chat_completions(
    State(s): State<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generation(s, GenerationRoute::ChatCompletions, uri, headers, body).await
}

/// Metric label of a route proxied to one worker.
fn passthrough_label(path: &str) -> &'static str {
    match path {
        "/v1/models" => "/v1/models",
        "/get_model_info" => "/get_model_info",
        "/get_server_info" => "/get_server_info",
        "/health_generate" => "/health_generate",
        "/parse_function_call" => "/parse_function_call",
        "/function_call" => "/function_call",
        p if p.starts_with("/v1/models/") => "/v1/models/{model}",
        _ => "other",
    }
}

/// POST routes without a prompt (`/parse_function_call`): the body goes to any one worker.
async fn passthrough_post(
    State(state): State<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let route = passthrough_label(uri.path());
    state.metrics.requests.with_label_values(&[route]).inc();
    let result = async {
        let bytes = read_body(&headers, body, state.config.max_payload_size).await?;
        proxy::forward(
            &state,
            Outgoing {
                route,
                method: Method::POST,
                path_and_query: path_and_query(&uri),
                headers: &headers,
                body: Some(bytes),
                text: None,
                started,
            },
        )
        .await
    }
    .await;
    finish(&state, route, started, result)
}

/// GET routes served by any one worker, chosen by the policy.
async fn passthrough(State(state): State<AppState>, uri: Uri, headers: HeaderMap) -> Response {
    let started = Instant::now();
    let route = passthrough_label(uri.path());
    state.metrics.requests.with_label_values(&[route]).inc();
    let result = proxy::forward(
        &state,
        Outgoing {
            route,
            method: Method::GET,
            path_and_query: path_and_query(&uri),
            headers: &headers,
            body: None,
            text: None,
            started,
        },
    )
    .await;
    finish(&state, route, started, result)
}

/// `/flush_cache` goes to every healthy worker.
async fn flush_cache(State(state): State<AppState>) -> Response {
    let started = Instant::now();
    let route = "/flush_cache";
    state.metrics.requests.with_label_values(&[route]).inc();
    let workers: Vec<_> = state
        .workers
        .all()
        .into_iter()
        .filter(|w| w.is_healthy())
        .collect();
    if workers.is_empty() {
        return finish(&state, route, started, Err(RouterError::NoHealthyWorker));
    }
    let timeout = Duration::from_secs(state.config.health_check_timeout_secs.max(30));
    let calls = workers.iter().map(|w| {
        let mut req = state
            .client
            .post(format!("{}/flush_cache", w.url()))
            .timeout(timeout);
        if let Some(key) = &state.config.api_key {
            req = req.bearer_auth(key);
        }
        async move {
            match req.send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("answered {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        }
    });
    let results = futures::future::join_all(calls).await;
    let mut flushed = Vec::new();
    let mut failed = serde_json::Map::new();
    for (w, r) in workers.iter().zip(results) {
        match r {
            Ok(()) => flushed.push(w.url().to_string()),
            Err(e) => {
                failed.insert(w.url().to_string(), e.into());
            }
        }
    }
    let status = if failed.is_empty() {
        StatusCode::OK
    } else {
        state
            .metrics
            .errors
            .with_label_values(&[route, "flush_failed"])
            .inc();
        StatusCode::BAD_GATEWAY
    };
    (
        status,
        Json(json!({ "flushed": flushed, "failed": failed })),
    )
        .into_response()
}

#[derive(Deserialize)]
struct UrlQuery {
    url: Option<String>,
}

/// The `url` query parameter; a query that does not parse is a 400 in the usual error shape
/// (axum's own rejection is plain text).
fn required_url(q: std::result::Result<Query<UrlQuery>, QueryRejection>) -> Result<String> {
    let Query(q) = q.map_err(|e| RouterError::BadRequest(e.body_text()))?;
    q.url
        .filter(|u| !u.is_empty())
        .ok_or_else(|| RouterError::BadRequest("the `url` query parameter is required".into()))
}

async fn add_worker(
    State(state): State<AppState>,
    q: std::result::Result<Query<UrlQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let worker = state.add_worker(&required_url(q)?).await?;
        Ok::<_, RouterError>(Json(json!({
            "url": worker.url(),
            "healthy": worker.is_healthy(),
            "message": format!("added worker {}", worker.url()),
        })))
    }
    .await;
    result.map_or_else(IntoResponse::into_response, IntoResponse::into_response)
}

async fn remove_worker(
    State(state): State<AppState>,
    q: std::result::Result<Query<UrlQuery>, QueryRejection>,
) -> Response {
    let result = required_url(q).and_then(|url| state.remove_worker(&url));
    match result {
        Ok(w) => Json(json!({
            "url": w.url(),
            "message": format!("removed worker {}", w.url()),
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list_workers(State(state): State<AppState>) -> Json<serde_json::Value> {
    let workers = state.workers.all();
    let tree_sizes: HashMap<String, usize> = state
        .policy
        .tree()
        .map(|t| {
            t.tenant_sizes()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        })
        .unwrap_or_default();
    let details: Vec<_> = workers
        .iter()
        .map(|w| {
            json!({
                "url": w.url(),
                "healthy": w.is_healthy(),
                "load": w.load(),
                "max_in_flight": w.capacity(),
                "processed": w.processed(),
                "circuit": w.breaker_state().as_str(),
                "tree_chars": tree_sizes.get(w.url()).copied().unwrap_or(0),
            })
        })
        .collect();
    Json(json!({
        "urls": workers.iter().map(|w| w.url()).collect::<Vec<_>>(),
        "policy": state.policy.name(),
        "workers": details,
    }))
}

/// The router's own health: it answers as long as it runs, with or without workers, so
/// that it stays ready (and keeps taking requests into its queue) while a service is scaled
/// to zero. Whether an engine can generate is `/health_generate`, which goes to one.
async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let workers = state.workers.all();
    Json(json!({
        "status": "ok",
        "workers": workers.len(),
        "available_workers": workers.iter().filter(|w| w.is_available()).count(),
        "pending_requests": state.queue.pending(),
    }))
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics.render(
        &state.workers.all(),
        state.policy.as_ref(),
        state.queue.pending(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found(method: Method, uri: Uri) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}
