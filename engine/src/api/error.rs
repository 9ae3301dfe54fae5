//! The answer to an [`EngineError`]: its status, its OpenAI-style body and, for 429 and 503,
//! when to come back (`Retry-After`, seconds).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use sgl_core::error::EngineError;

/// An [`EngineError`] on its way out as an HTTP answer: the one mapping from the core's error
/// to a response.
#[derive(Debug)]
pub struct ApiError(pub EngineError);

/// What a route handler returns: its answer, or an error answered as [`ApiError`].
pub type ApiResult<T> = std::result::Result<T, ApiError>;

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let ApiError(e) = self;
        let status =
            StatusCode::from_u16(e.status_code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = e.retry_after();
        let mut resp = (status, Json(e.body())).into_response();
        if let Some(r) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(r.secs()));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sgl_core::error::RetryAfter;

    #[test]
    fn shed_answers_carry_their_retry_after() {
        let e = EngineError::Unavailable {
            message: "would wait".into(),
            retry_after: RetryAfter::from_wait(12.3),
        };
        let resp = ApiError(e).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "13");
        let resp = ApiError(EngineError::overloaded("full")).into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let resp = ApiError(EngineError::bad_request("no")).into_response();
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn every_error_has_a_valid_status() {
        for e in [
            EngineError::bad_request("x"),
            EngineError::InvalidArgument("x".into()),
            EngineError::NotFound("x".into()),
            EngineError::Unauthorized("x".into()),
            EngineError::overloaded("x"),
            EngineError::Internal("x".into()),
        ] {
            let code = e.status_code();
            assert_eq!(ApiError(e).into_response().status().as_u16(), code);
        }
    }
}
