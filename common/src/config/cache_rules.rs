//! `[[shop.cache.rules]]`: the operator's rules that make a shop's pages
//! cacheable when its own headers do not (no lifetime, analytics cookies
//! on every request), validated into [`CacheRule`]s. The gateway applies
//! them (`gateway/src/edge/shop_cache/rules.rs`); the path and cookie
//! patterns match here, so validation and matching share one syntax.

use std::time::Duration;

use super::check::Check;
use super::file;

/// Most rules: each request walks them in order.
pub const MAX_CACHE_RULES: usize = 256;
/// Most names in one rule's `ignore_cookies` or `key_cookies`.
pub const MAX_RULE_COOKIES: usize = 64;
/// Longest cookie name taken.
const MAX_COOKIE_NAME_BYTES: usize = 128;
/// Longest `path` taken.
const MAX_RULE_PATH_BYTES: usize = 1024;
/// Longest `ttl_seconds` and stale window: a year.
const MAX_RULE_SECONDS: u64 = 31_536_000;
/// Statuses the shop cache stores at all: a `ttl_seconds` for any other
/// would never apply.
pub const STORABLE_STATUSES: [u16; 8] = [200, 203, 204, 300, 301, 308, 404, 410];

/// A validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheRule {
    pub path: PathPattern,
    pub methods: Vec<RuleMethod>,
    /// Statuses `ttl` applies to.
    pub statuses: Vec<u16>,
    /// Lifetime of a response that carries none.
    pub ttl: Option<Duration>,
    pub ignore_cookies: Vec<CookieName>,
    pub key_cookies: Vec<String>,
    pub bypass: bool,
    pub stale_if_error: Option<Duration>,
    pub stale_while_revalidate: Option<Duration>,
}

impl CacheRule {
    /// Whether the rule applies to a request of this method and path (the
    /// path without its query).
    pub fn matches(&self, method: RuleMethod, path: &str) -> bool {
        self.methods.contains(&method) && self.path.matches(path)
    }
}

/// The methods a rule can name: the only ones the cache serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleMethod {
    Get,
    Head,
}

/// `path`: a prefix, or a glob of the whole path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    Prefix(String),
    /// `*` matches any run of characters but `/`.
    Glob(String),
}

impl PathPattern {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Prefix(prefix) => path.starts_with(prefix.as_str()),
            PathPattern::Glob(glob) => glob_matches(glob.as_bytes(), path.as_bytes()),
        }
    }
}

/// Whether `path` matches `glob` as a whole; `*` spans no `/`. Iterative
/// with one backtrack point per segment, so linear in practice.
fn glob_matches(glob: &[u8], path: &[u8]) -> bool {
    let (mut g, mut p) = (0, 0);
    // Where the last `*` was, and the path position it is trying.
    let mut star: Option<(usize, usize)> = None;
    while p < path.len() {
        if g < glob.len() && glob[g] == b'*' {
            star = Some((g, p));
            g += 1;
        } else if g < glob.len() && glob[g] == path[p] {
            g += 1;
            p += 1;
        } else if let Some((sg, sp)) = star.filter(|(_, sp)| path[*sp] != b'/') {
            // Let the `*` take one more character (never a `/`).
            star = Some((sg, sp + 1));
            g = sg + 1;
            p = sp + 1;
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|b| *b == b'*')
}

/// A name of `ignore_cookies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CookieName {
    Exact(String),
    /// `_ga*`: every name starting with `_ga`.
    Prefix(String),
}

impl CookieName {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            CookieName::Exact(n) => n == name,
            CookieName::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// A cookie name as RFC 6265 allows it (an HTTP token).
fn valid_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_COOKIE_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'+-.^_`|~".contains(&b))
}

/// Every rule, each problem named `shop.cache.rules[i].key`.
pub(super) fn validate(check: &mut Check, rules: Vec<file::ShopCacheRule>) -> Vec<CacheRule> {
    check.at_most("shop.cache.rules", rules.len(), MAX_CACHE_RULES);
    rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| validate_rule(check, &format!("shop.cache.rules[{i}]"), rule))
        .collect()
}

fn validate_rule(check: &mut Check, at: &str, f: file::ShopCacheRule) -> CacheRule {
    let path = path_pattern(check, format!("{at}.path"), &f.path);
    let methods = match f.methods {
        None => vec![RuleMethod::Get, RuleMethod::Head],
        Some(names) => {
            check.that(
                !names.is_empty(),
                format!("{at}.methods"),
                "must name GET, HEAD or both (or be left out for both)",
            );
            names
                .iter()
                .filter_map(|m| match m.to_ascii_uppercase().as_str() {
                    "GET" => Some(RuleMethod::Get),
                    "HEAD" => Some(RuleMethod::Head),
                    _ => {
                        check.fail(
                            format!("{at}.methods"),
                            format!("`{m}` is not cached: only GET and HEAD are"),
                        );
                        None
                    }
                })
                .collect()
        }
    };
    let statuses = f.statuses.unwrap_or_else(|| vec![200]);
    check.that(
        !statuses.is_empty(),
        format!("{at}.statuses"),
        "must name at least one status (or be left out for 200)",
    );
    for status in &statuses {
        check.that(
            STORABLE_STATUSES.contains(status),
            format!("{at}.statuses"),
            format!("{status} is never stored: take from {STORABLE_STATUSES:?}"),
        );
    }
    let seconds = |check: &mut Check, key: &str, value: Option<u64>, min: u64| {
        value.map(|v| {
            check.between(format!("{at}.{key}"), v, min, MAX_RULE_SECONDS);
            Duration::from_secs(v)
        })
    };
    let ttl = seconds(check, "ttl_seconds", f.ttl_seconds, 1);
    let stale_if_error = seconds(check, "stale_if_error_seconds", f.stale_if_error_seconds, 0);
    let stale_while_revalidate = seconds(
        check,
        "stale_while_revalidate_seconds",
        f.stale_while_revalidate_seconds,
        0,
    );
    let ignore_cookies = cookie_names(
        check,
        &format!("{at}.ignore_cookies"),
        &f.ignore_cookies,
        true,
    )
    .into_iter()
    .map(|name| match name.strip_suffix('*') {
        Some(prefix) => CookieName::Prefix(prefix.to_owned()),
        None => CookieName::Exact(name),
    })
    .collect::<Vec<_>>();
    let key_cookies = cookie_names(check, &format!("{at}.key_cookies"), &f.key_cookies, false);
    for name in &key_cookies {
        if ignore_cookies.iter().any(|c| c.matches(name)) {
            check.fail(
                format!("{at}.key_cookies"),
                format!("`{name}` is also ignored by ignore_cookies: a cookie is one or the other"),
            );
        }
    }
    let shapes_caching = ttl.is_some()
        || !ignore_cookies.is_empty()
        || !key_cookies.is_empty()
        || stale_if_error.is_some()
        || stale_while_revalidate.is_some();
    if f.bypass && shapes_caching {
        check.fail(
            format!("{at}.bypass"),
            "a bypass rule caches nothing: it takes no ttl_seconds, cookies or stale windows",
        );
    }
    CacheRule {
        path,
        methods,
        statuses,
        ttl,
        ignore_cookies,
        key_cookies,
        bypass: f.bypass,
        stale_if_error,
        stale_while_revalidate,
    }
}

/// A rule's path at `key`: a prefix, or a glob when it holds `*`.
pub(super) fn path_pattern(check: &mut Check, key: String, path: &str) -> PathPattern {
    let ok = path.starts_with('/')
        && path.len() <= MAX_RULE_PATH_BYTES
        && !path.contains(['?', '#'])
        && path.bytes().all(|b| b.is_ascii_graphic());
    check
        .that(
            ok,
            key,
            format!("must be a path starting with `/`, without query, spaces or control characters, at most {MAX_RULE_PATH_BYTES} bytes"),
        )
        .note("a prefix such as `/static/`, or a glob such as `/products/*/reviews`");
    if path.contains('*') {
        PathPattern::Glob(path.to_owned())
    } else {
        PathPattern::Prefix(path.to_owned())
    }
}

/// The names of one cookie list; `wildcard`: a trailing `*` is allowed.
fn cookie_names(check: &mut Check, key: &str, names: &[String], wildcard: bool) -> Vec<String> {
    check.at_most(key, names.len(), MAX_RULE_COOKIES);
    for name in names {
        let bare = if wildcard {
            name.strip_suffix('*').unwrap_or(name)
        } else {
            name
        };
        check.that(
            valid_cookie_name(bare),
            key,
            format!(
                "`{name}` is not a cookie name (letters, digits and !#$%&'+-.^_`|~, at most {MAX_COOKIE_NAME_BYTES} bytes{})",
                if wildcard { ", a trailing * for a prefix" } else { "" }
            ),
        );
    }
    names.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_star_matches_within_one_segment_and_the_whole_path() {
        let g = |glob: &str, path: &str| PathPattern::Glob(glob.into()).matches(path);
        assert!(g("/products/*/reviews", "/products/42/reviews"));
        assert!(!g("/products/*/reviews", "/products/4/2/reviews"));
        assert!(!g("/products/*/reviews", "/products/42/reviews/all"));
        assert!(g("/products/*", "/products/42"));
        assert!(!g("/products/*", "/products/42/x"));
        assert!(g("/*.css", "/site.css"));
        assert!(!g("/*.css", "/a/site.css"));
        assert!(g("/a*b*c", "/aXbYc"));
        assert!(!g("/a*b*c", "/aXbY"));
        assert!(PathPattern::Prefix("/static/".into()).matches("/static/app.js"));
        assert!(!PathPattern::Prefix("/static/".into()).matches("/stat"));
    }

    #[test]
    fn a_trailing_star_makes_a_cookie_name_a_prefix() {
        assert!(CookieName::Prefix("_ga".into()).matches("_ga_XYZ"));
        assert!(CookieName::Prefix("_ga".into()).matches("_ga"));
        assert!(!CookieName::Exact("_ga".into()).matches("_gat"));
    }
}
