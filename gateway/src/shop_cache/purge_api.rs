//! `POST /cache/purge` on the admin listener: removes cached shop responses
//! by URL or by path prefix. Needs `Authorization: Bearer
//! $FLASHGATE_ADMIN_TOKEN`; without that variable set, every call is refused.
//!
//! Body: `{"url": "/products/1?color=red"}` (that path and query, every host
//! and variant) or `{"prefix": "/products/"}` (every path starting with it).
//! Answer: `{"kind": "url"|"prefix", "purged": n}`. The purge is local to
//! this gateway: an operator calls every gateway (docs/OPERATIONS.md).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashgate_common::secret::bearer_matches;
use serde::Deserialize;
use serde_json::json;

use super::{PurgeTarget, ShopCache};

/// Longest URL or prefix accepted.
pub const MAX_PURGE_PATH_BYTES: usize = 4096;

/// What the purge route needs.
#[derive(Clone)]
pub struct PurgeApi {
    /// `None` while `shop.cache.enabled` is false.
    pub cache: Option<Arc<ShopCache>>,
    /// `FLASHGATE_ADMIN_TOKEN`; `None` refuses every call.
    pub admin_token: Option<Arc<str>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    url: Option<String>,
    prefix: Option<String>,
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "code": code, "message": message }))).into_response()
}

/// The target named by a purge body, or why it names none.
fn target(body: PurgeBody) -> Result<PurgeTarget, &'static str> {
    let (target, path) = match (body.url, body.prefix) {
        (Some(url), None) => (PurgeTarget::Url(url.clone()), url),
        (None, Some(prefix)) => (PurgeTarget::Prefix(prefix.clone()), prefix),
        _ => return Err("give exactly one of `url` and `prefix`"),
    };
    if !path.starts_with('/') || path.len() > MAX_PURGE_PATH_BYTES {
        return Err("`url` or `prefix` must be a path starting with / (at most 4096 bytes)");
    }
    Ok(target)
}

/// The handler of `POST /cache/purge`.
pub async fn purge(State(api): State<PurgeApi>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let authorization = headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if !api.admin_token.as_deref().is_some_and(|token| bearer_matches(authorization, token)) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "send Authorization: Bearer <FLASHGATE_ADMIN_TOKEN>");
    }
    let Some(cache) = api.cache else {
        return error(StatusCode::NOT_FOUND, "cache_off", "the shop cache is off (shop.cache.enabled = false)");
    };
    let body: PurgeBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(_) => return error(StatusCode::BAD_REQUEST, "bad_request", "body must be {\"url\": \"/path\"} or {\"prefix\": \"/path\"}"),
    };
    let target = match target(body) {
        Ok(t) => t,
        Err(why) => return error(StatusCode::BAD_REQUEST, "bad_request", why),
    };
    let purged = cache.purge(&target);
    tracing::info!(kind = target.label(), purged, "shop cache purged");
    (StatusCode::OK, Json(json!({ "kind": target.label(), "purged": purged }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(url: Option<&str>, prefix: Option<&str>) -> PurgeBody {
        PurgeBody { url: url.map(str::to_owned), prefix: prefix.map(str::to_owned) }
    }

    #[test]
    fn a_purge_names_exactly_one_path() {
        assert_eq!(target(body(Some("/a?b=1"), None)), Ok(PurgeTarget::Url("/a?b=1".into())));
        assert_eq!(target(body(None, Some("/p/"))), Ok(PurgeTarget::Prefix("/p/".into())));
        assert!(target(body(None, None)).is_err());
        assert!(target(body(Some("/a"), Some("/b"))).is_err());
        assert!(target(body(Some("http://x/a"), None)).is_err());
        assert!(target(body(None, Some(&format!("/{}", "x".repeat(5000))))).is_err());
    }
}
