//! The one place errors become HTTP responses.
//!
//! Every error body is JSON `{"code": "...", "message": "..."}`, including
//! axum's own rejections (bad JSON, unknown route, wrong method), so the
//! gateway and operators' scripts never have to parse plain text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::error::SaleError;
use crate::store::StoreError;

/// An API failure: a status, a stable machine code, and a human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Sent as `Retry-After` (seconds) when the failure passes on its own.
    pub retry_after_seconds: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after_seconds: None,
        }
    }

    /// The same error, telling the client to try again in `seconds`.
    pub fn retry_after(self, seconds: u32) -> Self {
        Self {
            retry_after_seconds: Some(seconds),
            ..self
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(Body {
            code: self.code,
            message: &self.message,
        });
        let mut response = (self.status, body).into_response();
        if let Some(seconds) = self.retry_after_seconds {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "database failure");
        ApiError::unavailable("the order database is unavailable")
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(error: redis::RedisError) -> Self {
        tracing::error!(%error, "redis failure");
        ApiError::unavailable("redis is unavailable")
    }
}

impl From<crate::counted::WriteError> for ApiError {
    fn from(error: crate::counted::WriteError) -> Self {
        match error {
            crate::counted::WriteError::Redis(e) => e.into(),
            crate::counted::WriteError::Store(e) => e.into(),
        }
    }
}

/// How long an operator is told to wait before sending a stock change to a
/// fenced sale again: the recovery loop re-syncs fenced sales every pass
/// (about a second apart).
const FENCED_RETRY_AFTER_SECONDS: u32 = 2;

impl From<SaleError> for ApiError {
    fn from(error: SaleError) -> Self {
        match error {
            SaleError::Redis(e) => e.into(),
            SaleError::Store(e) => e.into(),
            SaleError::Restoring => ApiError::unavailable("the sale is being restored into redis; retry shortly"),
            SaleError::BucketsDiffer { held, given } => ApiError::new(
                StatusCode::CONFLICT,
                "buckets_fixed",
                format!("buckets: redis holds the sale with {held} bucket(s), not {given}; a sale's bucket count cannot change"),
            ),
            SaleError::LeftAbsent => ApiError::new(
                StatusCode::CONFLICT,
                "bucketed_sale_absent",
                "the bucketed sale is missing from redis and has orders or surviving buckets; it cannot be restored yet",
            ),
            SaleError::BucketUnavailable { bucket, why } => {
                ApiError::unavailable(format!(
                "bucket {bucket} of the sale is {why} in redis; its stock did not change (items moved before were moved back, else reconciliation repairs them), send it again later"
            ))
            }
            SaleError::Fenced => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "sale_fenced",
                "the sale's redis failed over and the sale is not re-synced yet; its stock did not change, send the change again shortly",
            )
            .retry_after(FENCED_RETRY_AFTER_SECONDS),
            SaleError::BadReply(_) => {
                tracing::error!(%error, "sale script failure");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "unexpected reply from redis")
            }
        }
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::BytesRejection) -> Self {
        let status = rejection.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "payload_too_large"
        } else {
            "bad_request"
        };
        ApiError::new(status, code, rejection.body_text())
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(rejection: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(rejection.body_text())
    }
}

/// Parses a JSON body, answering 400 with serde's message (which names
/// the bad field, line and column) when it is malformed.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Fallback for routes that do not exist.
pub async fn no_route() -> ApiError {
    ApiError::not_found("no such route")
}

/// Fallback for a known route called with the wrong method.
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
