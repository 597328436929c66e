//! How long a shop response stays fresh here (RFC 9111 §4.2), from the
//! directives meant for this cache (RFC 9213).
//!
//! pingora-cache's `resp_cacheable` counts a lifetime from the moment the
//! response arrives: it ignores the `Age` the response arrives with and
//! judges `Expires` against the gateway's clock, and it reads only
//! `Cache-Control`. Both are done here instead:
//!
//! - Directives: `Flashgate-Cache-Control` (only this gateway obeys it)
//!   wins over `CDN-Cache-Control` (every CDN on the path), then
//!   `Surrogate-Control` (the Edge Architecture's surrogates), which win
//!   over `Cache-Control` and `Expires`. A targeted field that is not a valid
//!   Structured Field dictionary (RFC 8941) is ignored as a whole, as
//!   RFC 9213 §2.1 says. Targeted fields are passed on to clients
//!   unchanged: a CDN in front of the gateway still needs its
//!   `CDN-Cache-Control`, and browsers ignore both.
//! - Lifetime: `s-maxage`, then `max-age`, then `Expires` minus the
//!   response's own `Date` (so a shop whose clock is off still gets the
//!   lifetime it meant); `no-cache` is stored but always stale.
//! - Age: the first value of the first `Age` line, digits only (anything
//!   else is ignored, as RFC 9111 §5.1 says); too large a value means
//!   stale. The apparent age from `Date` is not added: a shop whose clock
//!   runs a minute behind would otherwise never be cached.
//! - `must-understand`: with a status this cache understands, it overrides
//!   `no-store` (RFC 9111 §5.2.2.3).

use std::time::{Duration, SystemTime};

use http::header;
use httpdate::HttpDate;
use pingora::cache::cache_control::{CacheControl, InterpretCacheControl};
use pingora::http::ResponseHeader;

/// The response header only Flashgate obeys, with `Cache-Control` syntax.
pub const FLASHGATE_CACHE_CONTROL: &str = "flashgate-cache-control";
/// The response header every CDN obeys (RFC 9213).
pub const CDN_CACHE_CONTROL: &str = "cdn-cache-control";
/// The surrogates' header of the Edge Architecture specification, which
/// shops written for Varnish and Fastly send; read as a targeted field.
pub const SURROGATE_CONTROL: &str = "surrogate-control";

/// The directives this cache follows for a response.
pub struct Directives {
    pub cc: Option<CacheControl>,
    /// From a targeted field: `Cache-Control` and `Expires` are ignored.
    pub targeted: bool,
}

impl Directives {
    /// Picks the field that applies (see the module doc).
    pub fn of(resp: &ResponseHeader) -> Self {
        for name in [
            FLASHGATE_CACHE_CONTROL,
            CDN_CACHE_CONTROL,
            SURROGATE_CONTROL,
        ] {
            if valid_dictionary(resp, name) {
                return Self {
                    cc: CacheControl::from_resp_headers_named(name, resp),
                    targeted: true,
                };
            }
        }
        Self {
            cc: CacheControl::from_resp_headers(resp),
            targeted: false,
        }
    }

    /// `private`, or `no-store` unless `must-understand` with a status the
    /// cache understands.
    pub fn forbids_storing(&self, understood_status: bool) -> bool {
        let Some(cc) = &self.cc else { return false };
        let overridden = understood_status && cc.has_key("must-understand");
        cc.private() || (cc.no_store() && !overridden)
    }

    /// The freshness lifetime; `None` when the response gives none.
    pub fn lifetime(&self, resp: &ResponseHeader) -> Option<Duration> {
        let from_cc = self.cc.as_ref().and_then(|cc| cc.fresh_duration());
        if self.targeted {
            return from_cc;
        }
        from_cc.or_else(|| expires_lifetime(resp))
    }
}

/// Whether every line of `name` parses as a Structured Field dictionary
/// whose freshness members are integers; false when absent.
fn valid_dictionary(resp: &ResponseHeader, name: &str) -> bool {
    let mut lines = resp.headers.get_all(name).iter().peekable();
    if lines.peek().is_none() {
        return false;
    }
    lines.all(|line| line.to_str().is_ok_and(dictionary_ok))
}

fn dictionary_ok(line: &str) -> bool {
    line.split(',').map(str::trim).all(|member| {
        if member.is_empty() {
            return false;
        }
        let (item, _params) = member.split_once(';').unwrap_or((member, ""));
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        let key_ok = key.starts_with(|c: char| c.is_ascii_lowercase() || c == '*')
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.*".contains(c));
        let numeric = matches!(
            key,
            "max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error"
        );
        let value_ok = match value {
            None => !numeric,
            Some(v) if numeric => is_sf_integer(v),
            Some(v) => is_sf_bare_item(v),
        };
        key_ok && value_ok
    })
}

fn is_sf_integer(v: &str) -> bool {
    let digits = v.strip_prefix('-').unwrap_or(v);
    !digits.is_empty() && digits.len() <= 15 && digits.bytes().all(|b| b.is_ascii_digit())
}

fn is_sf_bare_item(v: &str) -> bool {
    if v.is_empty() {
        return false;
    }
    if v.starts_with('"') {
        return v.len() >= 2 && v.ends_with('"');
    }
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/?=".contains(c))
}

/// `Expires` minus `Date`; an invalid or repeated `Expires`, or one not
/// after `Date`, means already stale (RFC 9111 §5.3). `Date` missing or
/// invalid: judged against the gateway's clock.
fn expires_lifetime(resp: &ResponseHeader) -> Option<Duration> {
    let mut lines = resp.headers.get_all(header::EXPIRES).iter();
    let first = lines.next()?;
    if lines.next().is_some() {
        return Some(Duration::ZERO);
    }
    let Some(expires) = http_date(first.to_str().ok()) else {
        return Some(Duration::ZERO);
    };
    let date = http_date(resp.headers.get(header::DATE).and_then(|d| d.to_str().ok()))
        .unwrap_or_else(SystemTime::now);
    Some(expires.duration_since(date).unwrap_or(Duration::ZERO))
}

fn http_date(value: Option<&str>) -> Option<SystemTime> {
    value?.trim().parse::<HttpDate>().ok().map(SystemTime::from)
}

/// The `Age` the response arrived with: the first value of the first line
/// if it is all digits; saturates rather than overflows.
pub fn age_in(resp: &ResponseHeader) -> Duration {
    let Some(first) = resp
        .headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
    else {
        return Duration::ZERO;
    };
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
        return Duration::ZERO;
    }
    Duration::from_secs(first.parse::<u64>().unwrap_or(u64::MAX / 4))
}

/// When a response `age` old with `lifetime` stops being fresh, counted
/// from `now`; in the past when it is already stale.
pub fn fresh_until(now: SystemTime, lifetime: Duration, age: Duration) -> SystemTime {
    match lifetime.checked_sub(age) {
        Some(left) if !left.is_zero() => now.checked_add(left).unwrap_or(now),
        _ => now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
    }
}

/// When the response was made, as far as its `Age` tells: what served
/// copies count their `Age` from.
pub fn created(now: SystemTime, age: Duration) -> SystemTime {
    now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn age_is_the_first_value_when_it_is_all_digits() {
        let age = |v: &[&str]| age_in(&resp(&v.iter().map(|v| ("age", *v)).collect::<Vec<_>>()));
        assert_eq!(age(&["30"]), Duration::from_secs(30));
        assert_eq!(age(&["7200, 0"]), Duration::from_secs(7200));
        assert_eq!(age(&["0", "7200"]), Duration::ZERO);
        for ignored in ["abc", "-7200", "7200.0", ""] {
            assert_eq!(age(&[ignored]), Duration::ZERO, "{ignored}");
        }
        assert!(age(&["99999999999999999999999"]) > Duration::from_secs(1 << 40));
    }

    #[test]
    fn the_arriving_age_shortens_the_lifetime() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let s = Duration::from_secs;
        assert_eq!(fresh_until(now, s(60), s(20)), now + s(40));
        assert!(fresh_until(now, s(60), s(60)) < now);
        assert!(fresh_until(now, s(60), s(7200)) < now);
        assert!(fresh_until(now, s(0), s(0)) < now);
        assert_eq!(created(now, s(30)), now - s(30));
    }

    #[test]
    fn expires_is_judged_against_the_responses_own_date() {
        let lifetime = |h: &[(&str, &str)]| Directives::of(&resp(h)).lifetime(&resp(h));
        let date = "Mon, 01 Jan 2024 00:00:00 GMT";
        let expires = "Mon, 01 Jan 2024 01:00:00 GMT";
        assert_eq!(
            lifetime(&[("date", date), ("expires", expires)]),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            lifetime(&[("date", date), ("expires", "0")]),
            Some(Duration::ZERO)
        );
        assert_eq!(
            lifetime(&[("date", expires), ("expires", date)]),
            Some(Duration::ZERO)
        );
        assert_eq!(lifetime(&[("date", date)]), None);
        assert_eq!(
            lifetime(&[
                ("cache-control", "max-age=5"),
                ("date", date),
                ("expires", expires)
            ]),
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn flashgate_then_cdn_cache_control_win_over_cache_control_and_expires() {
        let pick = |h: &[(&str, &str)]| {
            let r = resp(h);
            let d = Directives::of(&r);
            (d.lifetime(&r), d.forbids_storing(true))
        };
        let s = |n| Some(Duration::from_secs(n));
        assert_eq!(
            pick(&[
                ("cache-control", "no-store"),
                ("cdn-cache-control", "max-age=100")
            ]),
            (s(100), false)
        );
        assert_eq!(
            pick(&[
                ("cache-control", "max-age=100"),
                ("expires", "Mon, 01 Jan 2035 00:00:00 GMT"),
                ("cdn-cache-control", "private")
            ]),
            (None, true)
        );
        assert_eq!(
            pick(&[
                ("cdn-cache-control", "max-age=100"),
                ("flashgate-cache-control", "max-age=7")
            ]),
            (s(7), false)
        );
        // Invalid Structured Fields are ignored as a whole.
        for invalid in [
            "max-age=10000, &&&&&",
            "max-age=\"10000\"",
            "max-age =10",
            "MaX-aGe=1",
        ] {
            assert_eq!(
                pick(&[
                    ("cache-control", "no-store"),
                    ("cdn-cache-control", invalid)
                ]),
                (None, true),
                "{invalid}"
            );
        }
        assert_eq!(
            pick(&[("cdn-cache-control", "max-age=100, foo=bar, baz")]),
            (s(100), false)
        );
    }

    #[test]
    fn must_understand_overrides_no_store_only_for_understood_statuses() {
        let d = Directives::of(&resp(&[(
            "cache-control",
            "must-understand, no-store, max-age=60",
        )]));
        assert!(!d.forbids_storing(true));
        assert!(d.forbids_storing(false));
    }
}
