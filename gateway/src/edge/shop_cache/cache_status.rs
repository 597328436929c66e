//! The `Cache-Status` response header (RFC 9211), beside `X-Cache`: what
//! this cache did, in the form CDNs and tools read.
//!
//! - `Flashgate; hit; ttl=N`: answered from a fresh copy, `N` seconds left;
//! - `Flashgate; hit; ttl=-N; detail=stale`: a stale copy, within its
//!   `stale-while-revalidate` or `stale-if-error` window;
//! - `Flashgate; fwd=miss; stored; ttl=N`: fetched from the shop and stored;
//! - `Flashgate; fwd=stale; fwd-status=304; stored; ttl=N`: the stored copy
//!   revalidated by the shop (`fwd=stale; stored` when it sent a new one);
//! - `Flashgate; fwd=miss; detail=REASON`: fetched, not stored (`REASON`
//!   as in the cache's `no_cache` reasons: `OriginNotCache`, `set-cookie`,
//!   `status`, `credentialed`, ...);
//! - `Flashgate; fwd=bypass`: the request does not use the cache (not a
//!   `GET`/`HEAD`, a long target, ...).

use std::time::SystemTime;

use pingora::cache::{CacheMeta, CachePhase};

/// The cache's name in `Cache-Status`.
pub const NAME: &str = "Flashgate";

/// The header value for a response: `bypassed` when the request did not
/// use the cache, `stale_on_error` when a stale copy answered for a
/// failing shop; `meta` is the copy served or stored, if any.
pub fn value(
    bypassed: bool,
    stale_on_error: bool,
    phase: CachePhase,
    meta: Option<&CacheMeta>,
    now: SystemTime,
) -> String {
    let ttl = |m: &CacheMeta| match m.fresh_until().duration_since(now) {
        Ok(left) => left.as_secs() as i64,
        Err(past) => -(past.duration().as_secs() as i64),
    };
    let with_ttl = |s: &str| match meta {
        Some(m) => format!("{NAME}; {s}; ttl={}", ttl(m)),
        None => format!("{NAME}; {s}"),
    };
    if bypassed {
        return format!("{NAME}; fwd=bypass");
    }
    if stale_on_error {
        return format!("{}; detail=stale", with_ttl("hit"));
    }
    match phase {
        CachePhase::Hit => with_ttl("hit"),
        CachePhase::Stale | CachePhase::StaleUpdating => {
            format!("{}; detail=stale", with_ttl("hit"))
        }
        CachePhase::Miss => with_ttl("fwd=miss; stored"),
        CachePhase::Expired => with_ttl("fwd=stale; stored"),
        CachePhase::Revalidated => with_ttl("fwd=stale; fwd-status=304; stored"),
        CachePhase::RevalidatedNoCache(reason) => {
            format!(
                "{NAME}; fwd=stale; fwd-status=304; detail={}",
                token(reason.as_str())
            )
        }
        CachePhase::Disabled(reason) => {
            format!("{NAME}; fwd=miss; detail={}", token(reason.as_str()))
        }
        CachePhase::Bypass | CachePhase::Uninit | CachePhase::CacheKey => {
            format!("{NAME}; fwd=bypass")
        }
    }
}

/// A reason as a Structured Field token: letters, digits, `-`, `_`.
fn token(reason: &str) -> String {
    let t: String = reason
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .collect();
    if t.starts_with(|c: char| c.is_ascii_alphabetic()) {
        t
    } else {
        format!("x{t}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::cache::NoCacheReason;
    use pingora::http::ResponseHeader;
    use std::time::Duration;

    fn meta(fresh_until: SystemTime) -> CacheMeta {
        let header = ResponseHeader::build(200, None).unwrap();
        CacheMeta::new(fresh_until, fresh_until, 0, 0, header)
    }

    #[test]
    fn each_outcome_has_its_rfc_9211_form() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let fresh = meta(now + Duration::from_secs(60));
        let stale = meta(now - Duration::from_secs(5));
        let v = |bypass, soe, phase, m| value(bypass, soe, phase, m, now);
        assert_eq!(
            v(false, false, CachePhase::Hit, Some(&fresh)),
            "Flashgate; hit; ttl=60"
        );
        assert_eq!(
            v(false, false, CachePhase::Stale, Some(&stale)),
            "Flashgate; hit; ttl=-5; detail=stale"
        );
        assert_eq!(
            v(false, false, CachePhase::Miss, Some(&fresh)),
            "Flashgate; fwd=miss; stored; ttl=60"
        );
        assert_eq!(
            v(false, false, CachePhase::Revalidated, Some(&fresh)),
            "Flashgate; fwd=stale; fwd-status=304; stored; ttl=60"
        );
        assert_eq!(
            v(
                false,
                false,
                CachePhase::Disabled(NoCacheReason::Custom("set-cookie")),
                None
            ),
            "Flashgate; fwd=miss; detail=set-cookie"
        );
        assert_eq!(
            v(true, false, CachePhase::Hit, None),
            "Flashgate; fwd=bypass"
        );
    }
}
