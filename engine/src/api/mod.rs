//! The HTTP API: SGLang's native routes and the OpenAI-compatible ones, on axum.
//!
//! Handlers read a body into its serde types ([`schema`]), check and turn them into
//! [`GenerateRequest`](sgl_core::request::GenerateRequest)s ([`validate`]), submit them to the
//! engine and answer with JSON or server-sent events ([`sse`]). Every error goes through [`EngineError`]'s one HTTP mapping. A client that goes
//! away drops its handler (or its event stream), which drops the request's stream and so
//! aborts the request in the scheduler.

mod error;
mod generation;
mod native;
mod openai;
pub mod schema;
mod sse;
pub mod validate;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value};

pub use error::{ApiError, ApiResult};
use sgl_core::engine::EngineHandle;
use sgl_core::error::{EngineError, Result};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// All routes, with the body limit and (with `--api-key`) the key check.
pub fn router(engine: EngineHandle) -> Router {
    let mut app = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{model}", get(openai::retrieve_model))
        .route("/generate", post(native::generate).put(native::generate))
        .route("/parse_function_call", post(native::parse_function_call))
        .route("/function_call", post(native::parse_function_call))
        .route("/health", get(native::health))
        .route("/health_generate", get(native::health_generate))
        .route("/get_model_info", get(native::get_model_info))
        .route("/get_server_info", get(native::get_server_info))
        .route(
            "/flush_cache",
            get(native::flush_cache).post(native::flush_cache),
        )
        .route("/metrics", get(native::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ));
    if engine.args().api_key.is_some() {
        app = app.layer(middleware::from_fn_with_state(
            engine.clone(),
            require_api_key,
        ));
    }
    app.with_state(engine)
}

/// Serve `router(engine)` on `listener` until SIGINT or SIGTERM, then finish the requests in
/// flight and return.
pub async fn serve(engine: EngineHandle, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let limits = sgl_http::listen::ConnLimits::default();
    tracing::info!(
        max_connections = limits.max_connections,
        header_read_timeout_s = limits.header_read_timeout.as_secs(),
        "connection limits"
    );
    sgl_http::listen::serve_with_limits(listener, router(engine), limits, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for SIGINT: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down: finishing requests in flight");
}

/// A handler that panicked (a bug, never the request's fault) answers 500 with the usual
/// error body; the connection and the server carry on.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let reason = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    tracing::error!(reason, "request handler panicked");
    ApiError(EngineError::Internal(format!(
        "the request handler failed: {reason}"
    )))
    .into_response()
}

/// 405 with the same body shape as every other error.
async fn method_not_allowed(req: Request) -> Response {
    let status = StatusCode::METHOD_NOT_ALLOWED;
    let err = EngineError::bad_request(format!(
        "{} does not take {}",
        req.uri().path(),
        req.method()
    ));
    let mut body = err.body();
    body["error"]["type"] = Value::from("method_not_allowed");
    body["error"]["code"] = Value::from(status.as_u16());
    (status, axum::Json(body)).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError(EngineError::NotFound(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    )))
}

/// Routes open without the API key: probes (`/health`) and Prometheus scrapes (`/metrics`),
/// which carry no prompts or outputs, as in vLLM, which checks the key on `/v1` routes only.
const OPEN_ROUTES: [&str; 2] = ["/health", "/metrics"];

/// `Authorization: Bearer <key>` on every route but [`OPEN_ROUTES`].
async fn require_api_key(State(engine): State<EngineHandle>, req: Request, next: Next) -> Response {
    let Some(key) = engine.args().api_key.as_deref() else {
        return next.run(req).await;
    };
    if OPEN_ROUTES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError(EngineError::Unauthorized("invalid API key".into())).into_response(),
        None => ApiError(EngineError::Unauthorized(
            "missing API key: send the header `Authorization: Bearer <key>`".into(),
        ))
        .into_response(),
    }
}

/// Compare without leaking, through timing, how long a prefix matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A request body that must be a JSON object. Any `Content-Type` is accepted (SGLang reads
/// the body as JSON whatever the header says, and `curl -d` sends a form type).
pub struct JsonObject(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Refuse an announced oversized body before reading any of it.
        let announced = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(payload_too_large());
        }
        let read = tokio::time::timeout(
            sgl_http::listen::BODY_READ_TIMEOUT,
            Bytes::from_request(req, state),
        );
        let Ok(read) = read.await else {
            let err = EngineError::bad_request(format!(
                "the request body did not arrive within {} s",
                sgl_http::listen::BODY_READ_TIMEOUT.as_secs()
            ));
            let mut body = err.body();
            body["error"]["code"] = Value::from(StatusCode::REQUEST_TIMEOUT.as_u16());
            return Err((StatusCode::REQUEST_TIMEOUT, axum::Json(body)).into_response());
        };
        let bytes = match read {
            Ok(b) => b,
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(payload_too_large());
            }
            Err(rejection) => {
                return Err(ApiError(EngineError::bad_request(format!(
                    "cannot read the request body: {}",
                    rejection.body_text()
                )))
                .into_response());
            }
        };
        parse_object(&bytes)
            .map(JsonObject)
            .map_err(|e| ApiError(e).into_response())
    }
}

/// Parse a body into a JSON object, with errors that say where the JSON broke.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(EngineError::bad_request(
            "the request body is empty: send a JSON object",
        ));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(EngineError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            validate::describe(&other)
        ))),
        Err(e) => Err(EngineError::bad_request(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// 413 with the same body shape as every other error.
fn payload_too_large() -> Response {
    let err = EngineError::bad_request(format!(
        "the request body is larger than {} MiB",
        MAX_BODY_BYTES / (1024 * 1024)
    ));
    let mut body = err.body();
    body["error"]["code"] = Value::from(StatusCode::PAYLOAD_TOO_LARGE.as_u16());
    (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response()
}

/// Run CPU-heavy parsing (tokenization, chat templates) off the async workers.
async fn run_blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::Internal(format!("request parsing failed: {e}")))?
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn body_parsing_errors() {
        assert!(parse_object(b"").unwrap_err().to_string().contains("empty"));
        assert!(
            parse_object(b"{\"a\":")
                .unwrap_err()
                .to_string()
                .contains("not valid JSON")
        );
        assert!(
            parse_object(b"[1]")
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        assert_eq!(parse_object(b" {\"a\": 1} ").map(|m| m.len()).ok(), Some(1));
    }

    #[test]
    fn key_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
