//! `[[shop.cache.rules]]` at the edge: what the operator adds to the
//! shop's own headers so that a real shop's pages are cacheable at all
//! (PHP and Django pages carry no lifetime; every visitor carries
//! analytics cookies). The first rule matching the request's method and
//! path (without query) applies; no rule, no change: [`super::policy`]
//! alone decides, as without rules.
//!
//! - `bypass`: the request neither looks up nor fills the cache.
//! - `ignore_cookies`: a request whose cookies are all ignored (or key
//!   cookies) is anonymous: it is answered from the cache and may fill it,
//!   and the ignored cookies are not sent to the shop. One other cookie (a
//!   session) keeps it credentialed, as without rules.
//! - `key_cookies`: their values (absent counts as a value) join the
//!   variant of the response ([`Rules::variance`]), beside what its `Vary`
//!   names, so two values never share a stored copy; the primary key, and
//!   so purges by URL or prefix, stay the same.
//! - `ttl_seconds`: a response of a listed status with no lifetime of its
//!   own (no `max-age`, `s-maxage` or `Expires`) is stored as if it said
//!   `max-age`; the stored and answered headers stay the shop's. Every
//!   other rule of [`super::policy`] still applies: `private`, `no-store`,
//!   `Set-Cookie`, `Vary: *` and credentialed requests keep it out.
//! - `stale_if_error_seconds` / `stale_while_revalidate_seconds`: the
//!   windows of matching responses whose `Cache-Control` names none.

use std::time::Duration;

use flashgate_common::config::{CacheRule, RuleMethod, ShopCacheConfig};
use http::{header, Method};
use pingora::cache::cache_control::CacheControl;
use pingora::cache::key::HashBinary;
use pingora::cache::{CacheMetaDefaults, RespCacheable, VarianceBuilder};
use pingora::http::{RequestHeader, ResponseHeader};

use super::bypass::BypassReason;
use super::CacheUse;

/// The variance name the key cookies are hashed under.
const KEY_COOKIES: &str = "flashgate-key-cookies";
/// The variance name the response's own `Vary` hash is kept under when key
/// cookies join it.
const VARY: &str = "flashgate-vary";

/// Response headers that give a lifetime of their own (RFC 9111, RFC 9213).
const LIFETIME_HEADERS: [&str; 3] = ["expires", "cdn-cache-control", "flashgate-cache-control"];

/// The rules of one gateway, in order.
pub struct Rules {
    rules: Vec<Rule>,
}

struct Rule {
    config: CacheRule,
    /// The stale windows of matching responses that name none.
    defaults: CacheMetaDefaults,
}

/// What the rules decided for one request (kept in its context).
#[derive(Debug, Default, Clone)]
pub struct Applied {
    /// Index of the rule that matched.
    pub rule: Option<usize>,
    /// Why the request does not use the cache, when decided before the lookup.
    pub bypass: Option<BypassReason>,
    /// What makes the request credentialed, if it is.
    pub credential: Option<BypassReason>,
    /// The `Cookie` the shop gets instead of the client's (ignored cookies
    /// dropped); empty: none.
    pub upstream_cookie: Option<String>,
    /// The key cookies' values, part of the variant.
    pub variant: Option<Vec<u8>>,
}

/// No heuristic freshness: a lifetime comes from the response or a rule's TTL.
fn no_default_freshness(_status: http::StatusCode) -> Option<Duration> {
    None
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

impl Rules {
    pub fn new(config: &ShopCacheConfig) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|rule| Rule {
                defaults: CacheMetaDefaults::new(
                    no_default_freshness,
                    rule.stale_while_revalidate.map_or(0, secs),
                    secs(rule.stale_if_error.unwrap_or(config.stale_if_error)),
                ),
                config: rule.clone(),
            })
            .collect();
        Self { rules }
    }

    /// How the request uses the cache, given what [`super::policy::request_use`]
    /// decided from its headers alone.
    pub fn apply(&self, req: &RequestHeader, using: CacheUse) -> (CacheUse, Applied) {
        let mut applied = Applied::default();
        if using == CacheUse::Off {
            applied.bypass = Some(BypassReason::of_request(req));
            return (using, applied);
        }
        let credential = if req.headers.contains_key(header::AUTHORIZATION) {
            Some(BypassReason::Authorization)
        } else if req.headers.contains_key(header::COOKIE) {
            Some(BypassReason::Cookie)
        } else {
            None
        };
        applied.credential = credential;
        let Some((index, rule)) = self.matching(req) else {
            return (using, applied);
        };
        applied.rule = Some(index);
        if rule.bypass {
            applied.bypass = Some(BypassReason::RuleBypass);
            return (CacheUse::Off, applied);
        }
        let cookies = Cookies::of(req);
        if !rule.key_cookies.is_empty() {
            applied.variant = Some(cookies.key_values(&rule.key_cookies));
        }
        if credential == Some(BypassReason::Cookie) && cookies.all_impersonal(rule) {
            applied.credential = None;
            applied.upstream_cookie = cookies.without_ignored(rule);
            return (CacheUse::Shared, applied);
        }
        (using, applied)
    }

    /// The first rule for this method and path.
    fn matching(&self, req: &RequestHeader) -> Option<(usize, &CacheRule)> {
        let method = if req.method == Method::GET {
            RuleMethod::Get
        } else if req.method == Method::HEAD {
            RuleMethod::Head
        } else {
            return None;
        };
        let target = req.raw_path();
        let path = target.split(|b| *b == b'?').next().unwrap_or_default();
        // `request_use` lets in UTF-8 targets only.
        let path = std::str::from_utf8(path).ok()?;
        self.rules
            .iter()
            .enumerate()
            .map(|(i, r)| (i, &r.config))
            .find(|(_, r)| r.matches(method, path))
    }

    /// The variant of a request: the response's own (`vary`, from its
    /// `Vary`) and, under a rule with key cookies, their values.
    pub fn variance(&self, applied: &Applied, vary: Option<HashBinary>) -> Option<HashBinary> {
        let Some(cookies) = &applied.variant else {
            return vary;
        };
        let mut variance = VarianceBuilder::new();
        variance.add_owned_name_value(KEY_COOKIES.to_owned(), cookies.clone());
        if let Some(vary) = vary {
            variance.add_owned_name_value(VARY.to_owned(), vary.to_vec());
        }
        variance.finalize()
    }

    /// Whether the shop's response may be stored: `policy` decides, with the
    /// matching rule's stale windows and, for a response without a
    /// lifetime of its own, its TTL.
    pub fn cacheable(
        &self,
        applied: &Applied,
        resp: &ResponseHeader,
        global: &CacheMetaDefaults,
        policy: impl Fn(&ResponseHeader, &CacheMetaDefaults) -> RespCacheable,
    ) -> RespCacheable {
        let Some(rule) = applied.rule.and_then(|i| self.rules.get(i)) else {
            return policy(resp, global);
        };
        let ttl = rule
            .config
            .ttl
            .filter(|_| rule.config.statuses.contains(&resp.status.as_u16()))
            .filter(|_| !has_own_lifetime(resp));
        let Some(ttl) = ttl else {
            return policy(resp, &rule.defaults);
        };
        // Judged as if the shop had said `max-age`; stored as it said.
        let mut judged = resp.clone();
        if judged
            .append_header(header::CACHE_CONTROL, format!("max-age={}", ttl.as_secs()))
            .is_err()
        {
            return policy(resp, &rule.defaults);
        }
        match policy(&judged, &rule.defaults) {
            RespCacheable::Cacheable(mut meta) => {
                let stored = meta.response_header_mut();
                stored.remove_header(&header::CACHE_CONTROL);
                for value in resp.headers.get_all(header::CACHE_CONTROL) {
                    // Re-adding a value the header map held cannot fail.
                    let _ = stored.append_header(header::CACHE_CONTROL, value.clone());
                }
                RespCacheable::Cacheable(meta)
            }
            refused => refused,
        }
    }

    /// The `Cookie` the shop gets on a request through the cache.
    pub fn upstream_cookie(applied: &Applied, upstream: &mut RequestHeader) -> pingora::Result<()> {
        match applied.upstream_cookie.as_deref() {
            None => {}
            Some("") => {
                upstream.remove_header(&header::COOKIE);
            }
            Some(kept) => {
                upstream.insert_header(header::COOKIE, kept)?;
            }
        }
        Ok(())
    }
}

/// Whether the response names its own lifetime, which a rule's TTL never
/// overrides (`max-age=0` included).
fn has_own_lifetime(resp: &ResponseHeader) -> bool {
    let cc = CacheControl::from_resp_headers(resp);
    cc.is_some_and(|cc| cc.has_key("max-age") || cc.has_key("s-maxage"))
        || LIFETIME_HEADERS
            .iter()
            .any(|name| resp.headers.contains_key(*name))
}

/// The request's cookies, `name=value` pairs of every `Cookie` header.
struct Cookies<'a> {
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Cookies<'a> {
    fn of(req: &'a RequestHeader) -> Self {
        let pairs = req
            .headers
            .get_all(header::COOKIE)
            .iter()
            .flat_map(|v| {
                // A header that is not text is kept whole as one unnamed
                // cookie: personal, never ignored.
                v.to_str().unwrap_or("\u{0}").split(';')
            })
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(|c| {
                let (name, value) = c.split_once('=').unwrap_or((c, ""));
                (name.trim(), value.trim())
            })
            .collect();
        Self { pairs }
    }

    fn ignored(rule: &CacheRule, name: &str) -> bool {
        rule.ignore_cookies.iter().any(|c| c.matches(name))
    }

    /// Every cookie is ignored or a key cookie, and no key cookie comes
    /// twice (the shop might read the other value than the variant's).
    fn all_impersonal(&self, rule: &CacheRule) -> bool {
        let count = |name: &str| self.pairs.iter().filter(|(n, _)| *n == name).count();
        self.pairs.iter().all(|(name, _)| {
            Self::ignored(rule, name) || rule.key_cookies.iter().any(|k| k == name)
        }) && rule.key_cookies.iter().all(|k| count(k) <= 1)
    }

    /// The `Cookie` header without the ignored cookies (empty: none left);
    /// `None` when nothing is ignored.
    fn without_ignored(&self, rule: &CacheRule) -> Option<String> {
        if !self.pairs.iter().any(|(n, _)| Self::ignored(rule, n)) {
            return None;
        }
        let kept: Vec<String> = self
            .pairs
            .iter()
            .filter(|(n, _)| !Self::ignored(rule, n))
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        Some(kept.join("; "))
    }

    /// The key cookies' values in the rule's order, each framed by its
    /// length, absent ones marked apart from empty ones.
    fn key_values(&self, names: &[String]) -> Vec<u8> {
        let mut out = Vec::new();
        for name in names {
            match self.pairs.iter().find(|(n, _)| n == name) {
                Some((_, value)) => {
                    out.push(b'=');
                    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
                    out.extend_from_slice(value.as_bytes());
                }
                None => out.push(b'-'),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
