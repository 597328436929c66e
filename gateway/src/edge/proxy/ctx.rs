//! Per-request state carried through the phases, and its metric labels.

use crate::edge::shop_cache::rules::Applied;
use crate::edge::shop_cache::CacheUse;
use crate::infra::RouteKind;
use crate::rejection::Rejection;

/// Per-request state.
pub struct RequestCtx {
    /// Sent back to the client and to the shop or backend, for log correlation.
    pub request_id: String,
    /// The `route` metric label.
    pub route: RouteKind,
    /// The `outcome` metric label.
    pub outcome: Outcome,
    pub started: std::time::Instant,
    /// How a shop request uses the edge cache.
    pub cache: CacheUse,
    /// What `[[shop.cache.rules]]` decided for it.
    pub cache_rule: Applied,
    /// The request came over TLS (the HTTPS listener).
    pub tls: bool,
    /// Answered from a stale copy because a recent fetch of it failed.
    pub stale_on_error: bool,
    /// The shop origin `upstream_peer` chose (its name is the `Host` when
    /// the client sent none).
    pub origin: Option<std::sync::Arc<flashgate_common::config::Origin>>,
    /// The brotli body compressed here has its last block (`compress`).
    pub brotli_closed: bool,
    /// The shop's `304` to a revalidation, whose fields update the stored
    /// copy (`shop_cache::revalidation`).
    pub not_modified: Option<Box<pingora::http::ResponseHeader>>,
    /// The waiting room's `Set-Cookie` for the shop's answer (a visitor
    /// let in, or a session renewed).
    pub room_cookie: Option<String>,
}

impl RequestCtx {
    pub fn new() -> Self {
        Self {
            request_id: String::new(),
            route: RouteKind::Shop,
            outcome: Outcome::Ok,
            started: std::time::Instant::now(),
            cache: CacheUse::Off,
            cache_rule: Applied::default(),
            tls: false,
            stale_on_error: false,
            origin: None,
            brotli_closed: false,
            not_modified: None,
            room_cookie: None,
        }
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}

/// What happened to a request, as the `outcome` label counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// A buy won just now.
    Won,
    /// A won Idempotency-Key retried.
    Replay,
    /// Turned down; labelled by its code (rate limits with their scope).
    Rejected(Rejection),
    /// The shop answered 4xx.
    ClientError,
    /// The shop answered 5xx.
    UpstreamError,
    /// The shop could not be reached (502).
    BadGateway,
    /// The shop answered too slowly (504).
    GatewayTimeout,
    /// The proxied request failed before any answer was written.
    Error,
    /// A page asked over plain HTTP, sent to HTTPS (`gateway.tls.redirect_http`).
    RedirectedToHttps,
}

impl Outcome {
    /// The label; these strings are what dashboards and alert rules match.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Won => "won",
            Outcome::Replay => "replay",
            Outcome::Rejected(r) => r.label(),
            Outcome::ClientError => "client_error",
            Outcome::UpstreamError => "upstream_error",
            Outcome::BadGateway => "bad_gateway",
            Outcome::GatewayTimeout => "gateway_timeout",
            Outcome::Error => "error",
            Outcome::RedirectedToHttps => "redirected_to_https",
        }
    }

    /// The outcome of a proxied request, from the status written (if any).
    pub fn of_shop(status: Option<u16>, failed: bool) -> Self {
        match (failed, status) {
            (_, Some(502)) => Outcome::BadGateway,
            (_, Some(504)) => Outcome::GatewayTimeout,
            (_, Some(s)) if s < 400 => Outcome::Ok,
            (_, Some(s)) if s < 500 => Outcome::ClientError,
            (_, Some(_)) => Outcome::UpstreamError,
            (true, None) => Outcome::Error,
            (false, None) => Outcome::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shop_outcomes_keep_their_labels() {
        let label = |status, failed| Outcome::of_shop(status, failed).as_str();
        assert_eq!(label(Some(502), false), "bad_gateway");
        assert_eq!(label(Some(504), true), "gateway_timeout");
        assert_eq!(label(Some(200), false), "ok");
        assert_eq!(label(Some(404), false), "client_error");
        assert_eq!(label(Some(500), false), "upstream_error");
        assert_eq!(label(None, true), "error");
        assert_eq!(label(None, false), "ok");
    }
}
