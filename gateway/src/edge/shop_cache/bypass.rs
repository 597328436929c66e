//! Why a shop request bypassed the cache: the `reason` label of
//! `flashgate_shop_cache_bypasses_total`, counted once per client request
//! answered `X-Cache: BYPASS`. An operator reads it to learn what keeps a
//! page out of the cache (a cookie, a missing lifetime, `Set-Cookie`) and
//! which `[[shop.cache.rules]]` would fix it.

use http::{header, Method};
use pingora::cache::cache_control::CacheControl;
use pingora::cache::{CachePhase, NoCacheReason};
use pingora::http::{RequestHeader, ResponseHeader};

use super::policy;

/// One bounded label per cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BypassReason {
    /// Not `GET` or `HEAD`.
    Method,
    /// A request body.
    Body,
    /// A protocol upgrade (WebSocket).
    Upgrade,
    /// No `Host`, or a target the key cannot hold (too long, not UTF-8).
    Target,
    /// A `bypass = true` rule.
    RuleBypass,
    /// A cookie no rule ignores, and a response not marked `public`.
    Cookie,
    /// `Authorization`, and a response not marked `public`.
    Authorization,
    /// A status never stored.
    Status,
    /// The response sets a cookie.
    SetCookie,
    /// `Vary: *`.
    VaryStar,
    /// No lifetime (no `max-age`, `s-maxage`, `Expires` or rule TTL).
    NoLifetime,
    Private,
    NoStore,
    /// Larger than `shop.cache.max_object_bytes`, or than the fills' share.
    TooBig,
    /// The shop failed (5xx, unreachable).
    UpstreamError,
    /// Gave up waiting on another request's fetch.
    LockTimeout,
    Other,
}

impl BypassReason {
    pub fn label(self) -> &'static str {
        match self {
            BypassReason::Method => "method",
            BypassReason::Body => "body",
            BypassReason::Upgrade => "upgrade",
            BypassReason::Target => "target",
            BypassReason::RuleBypass => "rule_bypass",
            BypassReason::Cookie => "cookie",
            BypassReason::Authorization => "authorization",
            BypassReason::Status => "status",
            BypassReason::SetCookie => "set_cookie",
            BypassReason::VaryStar => "vary_star",
            BypassReason::NoLifetime => "no_lifetime",
            BypassReason::Private => "private",
            BypassReason::NoStore => "no_store",
            BypassReason::TooBig => "too_big",
            BypassReason::UpstreamError => "upstream_error",
            BypassReason::LockTimeout => "lock_timeout",
            BypassReason::Other => "other",
        }
    }

    /// Why [`policy::request_use`] kept a request off the cache.
    pub fn of_request(req: &RequestHeader) -> Self {
        let h = &req.headers;
        if !(req.method == Method::GET || req.method == Method::HEAD) {
            BypassReason::Method
        } else if h.contains_key(header::UPGRADE) {
            BypassReason::Upgrade
        } else if h.contains_key(header::TRANSFER_ENCODING)
            || h.contains_key(header::CONTENT_LENGTH)
        {
            BypassReason::Body
        } else {
            BypassReason::Target
        }
    }

    /// Why a request the cache was on for was not answered from it nor
    /// stored, from the phase it ended in and the response it got;
    /// `credential` is what made the request credentialed, if anything.
    pub fn of_phase(
        phase: CachePhase,
        resp: Option<&ResponseHeader>,
        credential: Option<BypassReason>,
    ) -> Self {
        let CachePhase::Disabled(reason) = phase else {
            return BypassReason::Other;
        };
        match reason {
            NoCacheReason::Custom(policy::CREDENTIALED) => {
                credential.unwrap_or(BypassReason::Cookie)
            }
            NoCacheReason::Custom(policy::SETS_COOKIE) => BypassReason::SetCookie,
            NoCacheReason::Custom(policy::VARY_ANY) => BypassReason::VaryStar,
            NoCacheReason::Custom(policy::STATUS) => BypassReason::Status,
            NoCacheReason::ResponseTooLarge | NoCacheReason::PredictedResponseTooLarge => {
                BypassReason::TooBig
            }
            NoCacheReason::UpstreamError => BypassReason::UpstreamError,
            NoCacheReason::CacheLockTimeout
            | NoCacheReason::CacheLockGiveUp
            | NoCacheReason::CacheLockRetryLimit => BypassReason::LockTimeout,
            NoCacheReason::OriginNotCache => resp.map_or(BypassReason::Other, Self::of_directives),
            _ => BypassReason::Other,
        }
    }

    /// A response the shop's `Cache-Control` kept out: which directive.
    fn of_directives(resp: &ResponseHeader) -> Self {
        match CacheControl::from_resp_headers(resp) {
            Some(cc) if cc.no_store() => BypassReason::NoStore,
            Some(cc) if cc.private() => BypassReason::Private,
            _ => BypassReason::NoLifetime,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(cc: Option<&str>) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        if let Some(cc) = cc {
            r.insert_header("cache-control", cc).unwrap();
        }
        r
    }

    #[test]
    fn a_refused_request_is_labelled_by_what_kept_it_off() {
        let req = |method: &str, headers: &[(&str, &str)]| {
            let mut r = RequestHeader::build(method, b"/", None).unwrap();
            for (k, v) in headers {
                r.insert_header(k.to_string(), *v).unwrap();
            }
            BypassReason::of_request(&r).label()
        };
        assert_eq!(req("POST", &[]), "method");
        assert_eq!(req("GET", &[("content-length", "3")]), "body");
        assert_eq!(req("GET", &[("upgrade", "websocket")]), "upgrade");
        assert_eq!(req("GET", &[]), "target");
    }

    #[test]
    fn a_refused_response_is_labelled_by_its_directive_or_the_policy_reason() {
        let of = |reason, cc: Option<&str>, credential| {
            BypassReason::of_phase(CachePhase::Disabled(reason), Some(&resp(cc)), credential)
                .label()
        };
        assert_eq!(of(NoCacheReason::OriginNotCache, None, None), "no_lifetime");
        assert_eq!(
            of(
                NoCacheReason::OriginNotCache,
                Some("private, max-age=9"),
                None
            ),
            "private"
        );
        assert_eq!(
            of(NoCacheReason::OriginNotCache, Some("no-store"), None),
            "no_store"
        );
        assert_eq!(
            of(NoCacheReason::Custom(policy::SETS_COOKIE), None, None),
            "set_cookie"
        );
        assert_eq!(
            of(
                NoCacheReason::Custom(policy::CREDENTIALED),
                None,
                Some(BypassReason::Authorization)
            ),
            "authorization"
        );
        assert_eq!(of(NoCacheReason::ResponseTooLarge, None, None), "too_big");
        assert_eq!(
            BypassReason::of_phase(CachePhase::Miss, None, None).label(),
            "other"
        );
    }
}
