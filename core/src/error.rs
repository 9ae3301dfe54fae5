//! The engine's one error type, with the HTTP status code and the OpenAI-style body each
//! error is answered with. The response itself is built by the HTTP server (`sgl-engine`'s
//! `api/error.rs`), so this crate knows no web framework.

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
    /// The waiting queue is full (429).
    #[error("{message}")]
    Overloaded {
        message: String,
        retry_after: RetryAfter,
    },
    /// The request cannot be served now (503): it would wait or waited past the queue
    /// deadline, the scheduler is gone (shutting down), the backend failed.
    #[error("{message}")]
    Unavailable {
        message: String,
        retry_after: RetryAfter,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

/// When a refused client should come back: whole seconds for `Retry-After`, from an
/// estimated wait where there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(u32);

impl RetryAfter {
    /// Shortest and longest advice: a client told 0 retries at once, and past a minute an
    /// estimate says more about the queue's past than about when it will have room.
    pub const MIN_SECS: u32 = 1;
    pub const MAX_SECS: u32 = 60;
    /// Without an estimate: a full queue frees a place soon (429) ...
    pub const OVERLOADED: RetryAfter = RetryAfter(1);
    /// ... and an engine that cannot serve takes longer to come back (503).
    pub const UNAVAILABLE: RetryAfter = RetryAfter(5);

    /// An estimated wait in seconds, rounded up into `MIN_SECS..=MAX_SECS` (an infinite or
    /// undefined one gives `MAX_SECS`).
    pub fn from_wait(secs: f64) -> RetryAfter {
        let (min, max) = (f64::from(Self::MIN_SECS), f64::from(Self::MAX_SECS));
        if secs.is_nan() {
            return RetryAfter(Self::MAX_SECS);
        }
        // In range after the clamp, so the cast is exact.
        RetryAfter(secs.ceil().clamp(min, max) as u32)
    }

    pub fn secs(self) -> u32 {
        self.0
    }
}

impl EngineError {
    /// A 429 with the default `Retry-After` ([`RetryAfter::OVERLOADED`]).
    pub fn overloaded(message: impl Into<String>) -> Self {
        EngineError::Overloaded {
            message: message.into(),
            retry_after: RetryAfter::OVERLOADED,
        }
    }

    /// A 503 with the default `Retry-After` ([`RetryAfter::UNAVAILABLE`]).
    pub fn unavailable(message: impl Into<String>) -> Self {
        EngineError::Unavailable {
            message: message.into(),
            retry_after: RetryAfter::UNAVAILABLE,
        }
    }

    /// When to come back, for the answers that say so (429 and 503).
    pub fn retry_after(&self) -> Option<RetryAfter> {
        match self {
            EngineError::Overloaded { retry_after, .. }
            | EngineError::Unavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

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

    /// The HTTP status this error is answered with.
    pub fn status_code(&self) -> u16 {
        match self {
            EngineError::BadRequest { .. } | EngineError::InvalidArgument(_) => 400,
            EngineError::NotFound(_) => 404,
            EngineError::Unauthorized(_) => 401,
            EngineError::Overloaded { .. } => 429,
            EngineError::Unavailable { .. } => 503,
            EngineError::Load(_)
            | EngineError::Model(_)
            | EngineError::Backend(_)
            | EngineError::Internal(_) => 500,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            EngineError::BadRequest { .. } | EngineError::InvalidArgument(_) => {
                "invalid_request_error"
            }
            EngineError::NotFound(_) => "not_found_error",
            EngineError::Unauthorized(_) => "authentication_error",
            EngineError::Overloaded { .. } => "rate_limit_error",
            EngineError::Unavailable { .. } => "service_unavailable",
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
                "code": self.status_code(),
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

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_an_estimate_up_within_a_minute() {
        let secs = |w: f64| RetryAfter::from_wait(w).secs();
        assert_eq!(secs(0.0), 1);
        assert_eq!(secs(-3.0), 1);
        assert_eq!(secs(0.2), 1);
        assert_eq!(secs(1.0), 1);
        assert_eq!(secs(1.01), 2);
        assert_eq!(secs(17.4), 18);
        assert_eq!(secs(60.0), 60);
        assert_eq!(secs(61.0), 60);
        assert_eq!(secs(f64::INFINITY), 60);
        assert_eq!(secs(f64::NAN), 60);
    }
}
