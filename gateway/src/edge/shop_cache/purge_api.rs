//! `POST /cache/purge` on the admin listener: removes cached shop responses
//! by URL or by path prefix. Needs `Authorization: Bearer
//! $FLASHGATE_ADMIN_TOKEN`; without that variable set, every call is refused.
//!
//! Body: `{"url": "/products/1?color=red"}` (that path and query, every host
//! and variant) or `{"prefix": "/products/"}` (every path starting with it).
//! Answer: `{"kind": "url"|"prefix", "purged": n, "announced": bool}`:
//! `purged` counts this gateway's removed responses; the purge is then
//! announced on `fg:events` to the other gateways, and `announced` says
//! whether Redis took the announcement (if not, purge each gateway).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashgate_common::config::RedisConfig;
use flashgate_common::keys::{publish, valid_purge_path, SaleEvent};
use flashgate_common::redis_conn::{RedisHandle, Tuning};
use flashgate_common::secret::{bearer_challenge, bearer_matches};
use serde::Deserialize;
use serde_json::json;

use super::{PurgeTarget, ShopCache};

/// What the purge route needs.
#[derive(Clone)]
pub struct PurgeApi {
    /// `None` while `shop.cache.enabled` is false.
    pub cache: Option<Arc<ShopCache>>,
    /// `FLASHGATE_ADMIN_TOKEN`; `None` refuses every call.
    pub admin_token: Option<Arc<str>>,
    /// Where purges are announced to the other gateways.
    pub redis: RedisConfig,
}

/// Announces a purge on `fg:events`, over a connection of its own (purges
/// are rare; the proxy's connection stays on the proxy's runtime).
async fn announce(redis: &RedisConfig, event: &SaleEvent) -> bool {
    let attempt = async {
        let mut conn = RedisHandle::connect(redis, &Tuning::new(redis.timeout)).await?;
        publish(&mut conn, event).await
    };
    match tokio::time::timeout(redis.timeout * 4, attempt).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "shop cache purge not announced to the other gateways");
            false
        }
        Err(_) => {
            tracing::warn!("shop cache purge not announced to the other gateways: redis timed out");
            false
        }
    }
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
    if !valid_purge_path(&path) {
        return Err("`url` or `prefix` must be a path starting with / (at most 4096 bytes, no control characters)");
    }
    Ok(target)
}

/// The handler of `POST /cache/purge`.
pub async fn purge(
    State(api): State<PurgeApi>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !api
        .admin_token
        .as_deref()
        .is_some_and(|token| bearer_matches(authorization, token))
    {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send Authorization: Bearer <FLASHGATE_ADMIN_TOKEN>",
        );
        let challenge = HeaderValue::from_static(bearer_challenge(authorization));
        response
            .headers_mut()
            .insert(http::header::WWW_AUTHENTICATE, challenge);
        return response;
    }
    let Some(cache) = api.cache else {
        return error(
            StatusCode::NOT_FOUND,
            "cache_off",
            "the shop cache is off (shop.cache.enabled = false)",
        );
    };
    let body: PurgeBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "body must be {\"url\": \"/path\"} or {\"prefix\": \"/path\"}",
            )
        }
    };
    let target = match target(body) {
        Ok(t) => t,
        Err(why) => return error(StatusCode::BAD_REQUEST, "bad_request", why),
    };
    let purged = cache.purge(&target);
    let announced = announce(&api.redis, &target.event(&cache.id)).await;
    tracing::info!(
        kind = target.label(),
        purged,
        announced,
        "shop cache purged"
    );
    (
        StatusCode::OK,
        Json(json!({ "kind": target.label(), "purged": purged, "announced": announced })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(url: Option<&str>, prefix: Option<&str>) -> PurgeBody {
        PurgeBody {
            url: url.map(str::to_owned),
            prefix: prefix.map(str::to_owned),
        }
    }

    #[test]
    fn a_purge_names_exactly_one_path() {
        assert_eq!(
            target(body(Some("/a?b=1"), None)),
            Ok(PurgeTarget::Url("/a?b=1".into()))
        );
        assert_eq!(
            target(body(None, Some("/p/"))),
            Ok(PurgeTarget::Prefix("/p/".into()))
        );
        assert!(target(body(None, None)).is_err());
        assert!(target(body(Some("/a"), Some("/b"))).is_err());
        assert!(target(body(Some("http://x/a"), None)).is_err());
        assert!(target(body(None, Some(&format!("/{}", "x".repeat(5000))))).is_err());
        assert!(target(body(Some("/a\nb"), None)).is_err());
    }
}
