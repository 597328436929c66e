use flashgate_common::config::{Config, NoEnv};
use pingora::cache::NoCacheReason;

use super::*;
use crate::edge::shop_cache::policy;

fn rules(toml: &str) -> (Rules, ShopCacheConfig) {
    let config = Config::from_toml_str(toml, &NoEnv, 0).unwrap().shop.cache;
    (Rules::new(&config), config)
}

fn req(method: &str, target: &str, cookie: Option<&str>) -> RequestHeader {
    let mut r = RequestHeader::build(method, target.as_bytes(), None).unwrap();
    r.insert_header("host", "shop.example").unwrap();
    if let Some(c) = cookie {
        r.insert_header("cookie", c).unwrap();
    }
    r
}

fn apply(rules: &Rules, r: &RequestHeader) -> (CacheUse, Applied) {
    rules.apply(r, policy::request_use(r))
}

const SHOP: &str = r#"
[[shop.cache.rules]]
path = "/account/"
bypass = true
[[shop.cache.rules]]
path = "/products/*/reviews"
methods = ["GET"]
ttl_seconds = 30
[[shop.cache.rules]]
path = "/"
ttl_seconds = 60
statuses = [200, 404]
ignore_cookies = ["_ga*", "consent"]
key_cookies = ["currency"]
stale_while_revalidate_seconds = 5
"#;

#[test]
fn the_first_rule_matching_method_and_path_applies() {
    let (rules, _) = rules(SHOP);
    let rule = |method, target| apply(&rules, &req(method, target, None)).1.rule;
    assert_eq!(rule("GET", "/account/orders"), Some(0));
    assert_eq!(rule("GET", "/products/7/reviews?page=2"), Some(1));
    assert_eq!(
        rule("HEAD", "/products/7/reviews"),
        Some(2),
        "rule 1 is GET only"
    );
    assert_eq!(rule("GET", "/products/7/reviews/x"), Some(2));
    assert_eq!(rule("GET", "/"), Some(2));
    assert_eq!(rule("POST", "/account/"), None, "never cached anyway");
    let (none, _) = self::rules("");
    assert_eq!(
        apply(&none, &req("GET", "/", Some("_ga=1"))).0,
        CacheUse::Credentialed
    );
}

#[test]
fn a_bypass_rule_keeps_the_request_off_the_cache() {
    let (rules, _) = rules(SHOP);
    let (using, applied) = apply(&rules, &req("GET", "/account/", None));
    assert_eq!(using, CacheUse::Off);
    assert_eq!(applied.bypass, Some(BypassReason::RuleBypass));
    let (using, applied) = apply(&rules, &req("POST", "/", None));
    assert_eq!(using, CacheUse::Off);
    assert_eq!(applied.bypass, Some(BypassReason::Method));
}

#[test]
fn only_ignored_and_key_cookies_leave_a_request_anonymous() {
    let (rules, _) = rules(SHOP);
    let (using, applied) = apply(
        &rules,
        &req("GET", "/p", Some("_ga=1; _ga_X=2; consent=yes")),
    );
    assert_eq!(using, CacheUse::Shared);
    assert_eq!(applied.upstream_cookie.as_deref(), Some(""));
    assert_eq!(applied.credential, None);
    let (using, applied) = apply(&rules, &req("GET", "/p", Some("_ga=1; currency=EUR")));
    assert_eq!(using, CacheUse::Shared);
    assert_eq!(applied.upstream_cookie.as_deref(), Some("currency=EUR"));
    let (using, applied) = apply(&rules, &req("GET", "/p", Some("currency=EUR")));
    assert_eq!(using, CacheUse::Shared);
    assert_eq!(applied.upstream_cookie, None, "nothing to drop");
    let (using, applied) = apply(&rules, &req("GET", "/p", Some("_ga=1; sessionid=abc")));
    assert_eq!(using, CacheUse::Credentialed);
    assert_eq!(
        applied.upstream_cookie, None,
        "a personal request keeps its cookies"
    );
    assert_eq!(applied.credential, Some(BypassReason::Cookie));
    let (using, _) = apply(
        &rules,
        &req("GET", "/p", Some("currency=EUR; currency=USD")),
    );
    assert_eq!(using, CacheUse::Credentialed, "a key cookie sent twice");
    let mut auth = req("GET", "/p", Some("_ga=1"));
    auth.insert_header("authorization", "Bearer x").unwrap();
    let (using, applied) = apply(&rules, &auth);
    assert_eq!(using, CacheUse::Credentialed);
    assert_eq!(applied.credential, Some(BypassReason::Authorization));
    let (using, _) = apply(&rules, &req("GET", "/products/1/reviews", Some("_ga=1")));
    assert_eq!(using, CacheUse::Credentialed, "rule 1 ignores no cookie");
}

#[test]
fn key_cookie_values_pick_distinct_variants() {
    let (rules, _) = rules(SHOP);
    let variant = |cookie: Option<&str>| {
        let (_, applied) = apply(&rules, &req("GET", "/p", cookie));
        rules.variance(&applied, None)
    };
    let eur = variant(Some("currency=EUR"));
    assert!(eur.is_some());
    assert_eq!(eur, variant(Some("_ga=9; currency=EUR")));
    assert_ne!(eur, variant(Some("currency=USD")));
    assert_ne!(eur, variant(None));
    assert_ne!(variant(None), variant(Some("currency=")));
    let (_, applied) = apply(&rules, &req("GET", "/p", Some("currency=EUR")));
    let vary = Some([7u8; 16]);
    assert_ne!(rules.variance(&applied, vary), eur, "Vary still counts");
    let (_, plain) = apply(&rules, &req("GET", "/products/1/reviews", None));
    assert_eq!(
        rules.variance(&plain, vary),
        vary,
        "no key cookies: Vary alone"
    );
}

fn resp(status: u16, headers: &[(&str, &str)]) -> ResponseHeader {
    let mut r = ResponseHeader::build(status, None).unwrap();
    for (k, v) in headers {
        r.append_header(k.to_string(), *v).unwrap();
    }
    r
}

fn judge(
    rules: &Rules,
    config: &ShopCacheConfig,
    target: &str,
    r: &ResponseHeader,
) -> RespCacheable {
    let request = req("GET", target, None);
    let (using, applied) = apply(rules, &request);
    let global = CacheMetaDefaults::new(no_default_freshness, 0, secs(config.stale_if_error));
    rules.cacheable(&applied, r, &global, |r, d| {
        policy::response_cacheable(using, r, d)
    })
}

#[test]
fn a_rule_ttl_stores_a_response_without_a_lifetime_and_keeps_its_headers() {
    let (rules, config) = rules(SHOP);
    match judge(
        &rules,
        &config,
        "/p",
        &resp(200, &[("content-type", "text/html")]),
    ) {
        RespCacheable::Cacheable(meta) => {
            assert_eq!(meta.fresh_sec(), 60);
            assert_eq!(meta.stale_while_revalidate_sec(), 5);
            assert_eq!(meta.stale_if_error_sec(), 60, "the global default");
            assert!(!meta.headers().contains_key("cache-control"));
        }
        other => panic!("{other:?}"),
    }
    match judge(
        &rules,
        &config,
        "/p",
        &resp(404, &[("cache-control", "public")]),
    ) {
        RespCacheable::Cacheable(meta) => {
            assert_eq!(meta.fresh_sec(), 60);
            let cc: Vec<_> = meta.headers().get_all("cache-control").iter().collect();
            assert_eq!(cc, ["public"]);
        }
        other => panic!("{other:?}"),
    }
    match judge(
        &rules,
        &config,
        "/p",
        &resp(200, &[("cache-control", "max-age=5")]),
    ) {
        RespCacheable::Cacheable(meta) => assert_eq!(meta.fresh_sec(), 5, "its own lifetime wins"),
        other => panic!("{other:?}"),
    }
    match judge(
        &rules,
        &config,
        "/p",
        &resp(200, &[("cache-control", "max-age=0")]),
    ) {
        RespCacheable::Cacheable(meta) => assert!(
            !meta.is_fresh(std::time::SystemTime::now()),
            "max-age=0 is its own lifetime: stale at once"
        ),
        RespCacheable::Uncacheable(_) => {}
    }
    let stored = |target, r: ResponseHeader| judge(&rules, &config, target, &r).is_cacheable();
    assert!(
        !stored("/p", resp(410, &[])),
        "410 is not in the rule's statuses"
    );
    assert!(!stored("/p", resp(200, &[("cache-control", "private")])));
    assert!(!stored("/p", resp(200, &[("cache-control", "no-store")])));
    assert!(!stored("/p", resp(200, &[("set-cookie", "sid=1")])));
    assert!(!stored("/p", resp(200, &[("vary", "*")])));
    assert!(
        !stored("/account/x", resp(200, &[])),
        "no TTL under a bypass rule"
    );
    let (none, config) = self::rules("");
    assert!(!judge(&none, &config, "/p", &resp(200, &[])).is_cacheable());
    assert!(matches!(
        judge(&none, &config, "/p", &resp(200, &[])),
        RespCacheable::Uncacheable(NoCacheReason::OriginNotCache)
    ));
}

#[test]
fn a_rule_ttl_never_stores_a_personal_requests_answer() {
    let (rules, config) = rules(SHOP);
    let request = req("GET", "/p", Some("sessionid=abc"));
    let (using, applied) = apply(&rules, &request);
    assert_eq!(using, CacheUse::Credentialed);
    let global = CacheMetaDefaults::new(no_default_freshness, 0, secs(config.stale_if_error));
    let verdict = rules.cacheable(&applied, &resp(200, &[]), &global, |r, d| {
        policy::response_cacheable(using, r, d)
    });
    assert!(!verdict.is_cacheable());
}
