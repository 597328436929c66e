//! Who may call which route: every API of the backend is behind a bearer
//! token, checked in constant time by one middleware, [`require`].
//!
//! | token (environment) | routes |
//! |---|---|
//! | `FLASHGATE_ADMIN_TOKEN` | every `/admin/*` route |
//! | `FLASHGATE_INTERNAL_TOKEN` | the `/internal/*` routes gateways call |
//! | `FLASHGATE_SHOP_TOKEN` | `POST /internal/orders/{id}/pay` and `/cancel` |
//!
//! A request without the right token is answered `401 unauthorized` before
//! any handler runs, so it changes nothing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use flashgate_common::secret::{bearer_challenge, bearer_matches};

use super::error::ApiError;

/// A token that would leave its routes open to anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the admin token is empty")]
    NoAdminToken,
    #[error("an order API token is empty")]
    NoApiToken,
}

/// The three bearer tokens of the backend; each never empty.
#[derive(Clone)]
pub struct ApiTokens {
    pub admin: Guard,
    pub gateway: Guard,
    pub shop: Guard,
}

impl ApiTokens {
    /// # Errors
    /// One of the tokens is empty: its routes would be open to anyone.
    pub fn new(admin: &str, gateway: &str, shop: &str) -> Result<Self, TokenError> {
        if admin.is_empty() {
            return Err(TokenError::NoAdminToken);
        }
        if gateway.is_empty() || shop.is_empty() {
            return Err(TokenError::NoApiToken);
        }
        Ok(Self {
            admin: Guard(admin.into()),
            gateway: Guard(gateway.into()),
            shop: Guard(shop.into()),
        })
    }
}

/// The token one group of routes requires.
#[derive(Clone)]
pub struct Guard(Arc<str>);

/// Runs the request only when it carries `Authorization: Bearer <token>`
/// with the guard's token; `401` JSON otherwise, with a `WWW-Authenticate`
/// challenge (`error="invalid_token"` when a bearer token was sent).
pub async fn require(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if bearer_matches(header, &guard.0) {
        next.run(request).await
    } else {
        let mut response = ApiError::unauthorized().into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(bearer_challenge(header)),
        );
        response
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guard(..)")
    }
}
