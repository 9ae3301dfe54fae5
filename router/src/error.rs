//! The router's one error type and its one mapping to an HTTP status and JSON body.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Every failure the router can report, to a client or to its caller.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("invalid request: {0}")]
    BadRequest(String),

    #[error("request body is larger than the limit of {limit} bytes (--max-payload-size)")]
    PayloadTooLarge { limit: usize },

    #[error("the request body did not arrive within {secs} s")]
    BodyTimeout { secs: u64 },

    #[error("missing or invalid API key: send `Authorization: Bearer <key>`")]
    Unauthorized,

    #[error("no healthy worker is available to serve this request; check GET /list_workers")]
    NoHealthyWorker,

    #[error("{size} requests are already waiting for a worker (--queue-size); retry later")]
    QueueFull { size: usize },

    #[error("no worker became available within {secs} s (--queue-timeout-secs); retry later")]
    QueueTimeout { secs: u64 },

    /// Every worker that could take the request is at its bound (or refused the last one),
    /// or the router is at `--max-concurrent-requests`: answered at once, as an engine would
    /// (429, or the 503 of an engine's queue deadline), without sending it anywhere.
    #[error("{message}")]
    Overloaded {
        message: String,
        status: StatusCode,
        retry_after: u64,
    },

    #[error("worker {url} did not answer within {secs} s (--request-timeout-secs)")]
    Timeout { url: String, secs: u64 },

    #[error(
        "worker {url} sent nothing for {secs} s in the middle of its response \
         (--stream-idle-timeout-secs); the response is incomplete"
    )]
    StreamStalled { url: String, secs: u64 },

    #[error("request failed after {attempts} attempt(s); last error: {last}")]
    RetriesExhausted { attempts: u32, last: String },

    #[error("worker {url} failed: {message}")]
    Upstream { url: String, message: String },

    #[error("invalid worker url `{url}`: {reason}")]
    InvalidWorkerUrl { url: String, reason: String },

    #[error("worker {0} is already registered")]
    WorkerExists(String),

    #[error("worker {0} is not registered")]
    WorkerNotFound(String),

    #[error("service discovery: {0}")]
    Discovery(String),

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl RouterError {
    /// The HTTP status a client sees for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) | Self::InvalidWorkerUrl { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NoHealthyWorker | Self::QueueFull { .. } | Self::QueueTimeout { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Overloaded { status, .. } => *status,
            Self::Timeout { .. } | Self::StreamStalled { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::RetriesExhausted { .. } | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::WorkerExists(_) => StatusCode::CONFLICT,
            Self::WorkerNotFound(_) => StatusCode::NOT_FOUND,
            Self::Discovery(_) | Self::Config(_) | Self::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short, stable label for the `kind` label of error metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::Unauthorized => "unauthorized",
            Self::NoHealthyWorker => "no_healthy_worker",
            Self::QueueFull { .. } => "queue_full",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::Overloaded { .. } => "overloaded",
            Self::Timeout { .. } => "timeout",
            Self::StreamStalled { .. } => "stream_idle_timeout",
            Self::RetriesExhausted { .. } => "retries_exhausted",
            Self::Upstream { .. } => "upstream",
            Self::InvalidWorkerUrl { .. } => "invalid_worker_url",
            Self::WorkerExists(_) => "worker_exists",
            Self::WorkerNotFound(_) => "worker_not_found",
            Self::Discovery(_) => "discovery",
            Self::Config(_) => "config",
            Self::Io(_) => "io",
        }
    }
}

/// The engine's `type` of an error body for `status`, so that a client sees the same shapes
/// from the router as from an engine.
fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT => {
            "invalid_request_error"
        }
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::CONFLICT => "conflict_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
        StatusCode::GATEWAY_TIMEOUT => "timeout_error",
        StatusCode::BAD_GATEWAY => "bad_gateway",
        _ => "internal_error",
    }
}

/// An error body in the engine's shape:
/// `{"object": "error", "error": {"message", "type", "param", "code"}}`.
pub fn error_body(status: StatusCode, message: impl Into<String>) -> serde_json::Value {
    json!({
        "object": "error",
        "error": {
            "message": message.into(),
            "type": error_type(status),
            "param": null,
            "code": status.as_u16(),
        }
    })
}

/// An error response with [`error_body`].
pub fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(error_body(status, message))).into_response()
}

impl IntoResponse for RouterError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = match &self {
            Self::Overloaded { retry_after, .. } => Some(*retry_after),
            // Every 503 of the router's own says when to come back.
            _ if status == StatusCode::SERVICE_UNAVAILABLE => Some(crate::queue::RETRY_AFTER_SECS),
            _ => None,
        };
        let mut resp = error_response(status, self.to_string());
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

pub type Result<T, E = RouterError> = std::result::Result<T, E>;
