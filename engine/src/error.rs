//! The engine's one error type and its one mapping to an HTTP status and an OpenAI-style body.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A bad flag or configuration at start-up.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The model or tokenizer could not be loaded.
    #[error("failed to load model: {0}")]
    Load(String),
    /// The checkpoint could not be found or read.
    #[error("failed to load model: {0}")]
    Model(#[source] Box<crate::model::LoadError>),
    /// The backend could not be built or failed a pass.
    #[error("backend: {0}")]
    Backend(#[source] Box<crate::backend::BackendError>),
    /// A request the user must fix (bad field, too long, ...). `param` names the field.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// A model name that this server does not serve.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthorized(String),
    /// The waiting queue is full.
    #[error("{0}")]
    Overloaded(String),
    /// The scheduler is gone (shutting down) or the backend failed.
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        EngineError::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        EngineError::BadRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            EngineError::BadRequest { .. } | EngineError::InvalidArgument(_) => {
                StatusCode::BAD_REQUEST
            }
            EngineError::NotFound(_) => StatusCode::NOT_FOUND,
            EngineError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            EngineError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            EngineError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            EngineError::Load(_)
            | EngineError::Model(_)
            | EngineError::Backend(_)
            | EngineError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            EngineError::BadRequest { .. } | EngineError::InvalidArgument(_) => {
                "invalid_request_error"
            }
            EngineError::NotFound(_) => "not_found_error",
            EngineError::Unauthorized(_) => "authentication_error",
            EngineError::Overloaded(_) => "rate_limit_error",
            EngineError::Unavailable(_) => "service_unavailable",
            EngineError::Load(_)
            | EngineError::Model(_)
            | EngineError::Backend(_)
            | EngineError::Internal(_) => "internal_error",
        }
    }

    /// OpenAI-style error body: `{"object":"error","message":..,"type":..,"param":..,"code":..}`
    /// wrapped in `{"error": ...}` so both OpenAI SDKs and SGLang clients read it.
    pub fn body(&self) -> serde_json::Value {
        let param = match self {
            EngineError::BadRequest { param, .. } => param.clone(),
            _ => None,
        };
        json!({
            "object": "error",
            "error": {
                "message": self.to_string(),
                "type": self.kind(),
                "param": param,
                "code": self.status().as_u16(),
            }
        })
    }
}

impl From<crate::model::LoadError> for EngineError {
    fn from(e: crate::model::LoadError) -> Self {
        EngineError::Model(Box::new(e))
    }
}

/// A checkpoint that cannot be read stays a load error when it surfaces through a backend.
impl From<crate::backend::BackendError> for EngineError {
    fn from(e: crate::backend::BackendError) -> Self {
        match e {
            crate::backend::BackendError::Load(e) => EngineError::Model(Box::new(e)),
            other => EngineError::Backend(Box::new(other)),
        }
    }
}

impl IntoResponse for EngineError {
    /// 429 and 503 say when to come back (`Retry-After`, seconds).
    fn into_response(self) -> Response {
        let retry_after = match self {
            EngineError::Overloaded(_) => Some("1"),
            EngineError::Unavailable(_) => Some("5"),
            _ => None,
        };
        let mut resp = (self.status(), Json(self.body())).into_response();
        if let Some(secs) = retry_after {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(secs),
            );
        }
        resp
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
