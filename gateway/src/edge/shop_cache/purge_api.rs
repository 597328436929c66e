//! `POST /cache/purge` on the admin listener: removes cached shop responses
//! by URL, by path prefix or by tag. Needs `Authorization: Bearer
//! $FLASHGATE_ADMIN_TOKEN`; without that variable set, every call is refused.
//!
//! Body: `{"url": "/products/1?color=red"}` (that path and query, every host
//! and variant), `{"prefix": "/products/"}` (every path starting with it),
//! `{"tag": "product-42"}` or `{"tags": ["product-42", "category-7"]}` (every
//! response the shop tagged so, up to [`MAX_TAGS_PER_PURGE`]).
//! Answer: `{"kind": "url"|"prefix"|"tag", "purged": n, "recorded": bool,
//! "announced": bool}`: `purged` counts this gateway's removed responses;
//! each purge is then recorded in Redis (`fg:cache:purges`, read by a
//! gateway coming back: `purge_log`) and announced on `fg:events` to the
//! other gateways; `announced` says whether Redis took both for every
//! purge (if not, purge each gateway).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashgate_common::config::RedisConfig;
use flashgate_common::keys::{publish, record_purge, PurgeKind, SaleEvent};
use flashgate_common::redis_conn::{RedisHandle, Tuning};
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

/// Most tags one call purges.
pub const MAX_TAGS_PER_PURGE: usize = 64;

/// Records the purges in Redis and announces each on `fg:events`, over a
/// connection of its own (purges are rare; the proxy's connection stays on
/// the proxy's runtime). Answers whether each was recorded and announced.
/// Recorded first: a gateway that hears the announcement reads the record.
async fn announce(redis: &RedisConfig, events: &[SaleEvent]) -> (bool, bool) {
    let mut recorded = 0;
    let attempt = async {
        let mut conn = RedisHandle::connect(redis, &Tuning::new(redis.timeout)).await?;
        for event in events {
            match record_purge(&mut conn, event).await {
                Ok(_) => recorded += 1,
                Err(error) => {
                    tracing::warn!(%error, "shop cache purge not recorded: a gateway away now will not see it")
                }
            }
            publish(&mut conn, event).await?;
        }
        Ok::<_, redis::RedisError>(())
    };
    let announced = match tokio::time::timeout(redis.timeout * 4, attempt).await {
        Ok(Ok(())) => true,
        Ok(Err(error)) => {
            tracing::warn!(%error, "shop cache purge not announced to the other gateways");
            false
        }
        Err(_) => {
            tracing::warn!("shop cache purge not announced to the other gateways: redis timed out");
            false
        }
    };
    (recorded == events.len(), announced)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    url: Option<String>,
    prefix: Option<String>,
    tag: Option<String>,
    tags: Option<Vec<String>>,
}

use crate::edge::admin_api::error;

/// The targets named by a purge body (several only for `tags`), or why
/// it names none.
fn targets(body: PurgeBody) -> Result<Vec<PurgeTarget>, &'static str> {
    let targets = match (body.url, body.prefix, body.tag, body.tags) {
        (Some(url), None, None, None) => vec![PurgeTarget::new(PurgeKind::Url, url)],
        (None, Some(prefix), None, None) => vec![PurgeTarget::new(PurgeKind::Prefix, prefix)],
        (None, None, Some(tag), None) => vec![PurgeTarget::new(PurgeKind::Tag, tag)],
        (None, None, None, Some(tags)) => {
            if tags.is_empty() || tags.len() > MAX_TAGS_PER_PURGE {
                return Err("`tags` must list 1 to 64 tags");
            }
            let mut targets: Vec<PurgeTarget> = Vec::with_capacity(tags.len());
            for tag in tags {
                let target = PurgeTarget::new(PurgeKind::Tag, tag);
                if !targets.contains(&target) {
                    targets.push(target);
                }
            }
            targets
        }
        _ => return Err("give exactly one of `url`, `prefix`, `tag` and `tags`"),
    };
    for target in &targets {
        if !target.kind.valid(&target.value) {
            return Err(match target.kind {
                PurgeKind::Tag => "a tag is 1 to 128 visible ASCII characters, without spaces or commas",
                _ => "`url` or `prefix` must be a path starting with / (at most 4096 bytes, no control characters)",
            });
        }
    }
    Ok(targets)
}

/// The handler of `POST /cache/purge`.
pub async fn purge(
    State(api): State<PurgeApi>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) =
        crate::edge::admin_api::refused_without_token(api.admin_token.as_deref(), &headers)
    {
        return refused;
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
                "body must be {\"url\": \"/path\"}, {\"prefix\": \"/path\"}, {\"tag\": \"t\"} or {\"tags\": [\"t\", ...]}",
            )
        }
    };
    let targets = match targets(body) {
        Ok(t) => t,
        Err(why) => return error(StatusCode::BAD_REQUEST, "bad_request", why),
    };
    let purged: usize = targets.iter().map(|t| cache.purge(t)).sum();
    let events: Vec<SaleEvent> = targets.iter().map(|t| t.event(&cache.id)).collect();
    let (recorded, announced) = announce(&api.redis, &events).await;
    let kind = targets[0].label();
    tracing::info!(kind, purged, recorded, announced, "shop cache purged");
    (
        StatusCode::OK,
        Json(json!({
            "kind": kind,
            "purged": purged,
            "recorded": recorded,
            "announced": announced,
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> PurgeBody {
        serde_json::from_str(json).unwrap()
    }

    fn one(kind: PurgeKind, value: &str) -> Result<Vec<PurgeTarget>, &'static str> {
        Ok(vec![PurgeTarget::new(kind, value)])
    }

    #[test]
    fn a_purge_names_exactly_one_path_or_its_tags() {
        assert_eq!(
            targets(body(r#"{"url": "/a?b=1"}"#)),
            one(PurgeKind::Url, "/a?b=1")
        );
        assert_eq!(
            targets(body(r#"{"prefix": "/p/"}"#)),
            one(PurgeKind::Prefix, "/p/")
        );
        assert_eq!(
            targets(body(r#"{"tag": "product-42"}"#)),
            one(PurgeKind::Tag, "product-42")
        );
        assert_eq!(
            targets(body(r#"{"tags": ["a", "b", "a"]}"#)).map(|t| t.len()),
            Ok(2)
        );
        for bad in [
            r#"{}"#,
            r#"{"url": "/a", "prefix": "/b"}"#,
            r#"{"tag": "a", "tags": ["b"]}"#,
            r#"{"url": "http://x/a"}"#,
            r#"{"url": "/a\nb"}"#,
            r#"{"tag": ""}"#,
            r#"{"tag": "a b"}"#,
            r#"{"tag": "a,b"}"#,
            r#"{"tags": []}"#,
        ] {
            assert!(targets(body(bad)).is_err(), "{bad}");
        }
        let long = format!(r#"{{"prefix": "/{}"}}"#, "x".repeat(5000));
        assert!(targets(body(&long)).is_err());
        let long = format!(r#"{{"tag": "{}"}}"#, "x".repeat(129));
        assert!(targets(body(&long)).is_err());
        let many: Vec<String> = (0..=MAX_TAGS_PER_PURGE).map(|i| format!("t{i}")).collect();
        assert!(targets(PurgeBody {
            url: None,
            prefix: None,
            tag: None,
            tags: Some(many)
        })
        .is_err());
    }
}
