//! `[[shop.cache.rules]]` against the real gateway and a real shop: an axum
//! server in the test, on loopback, that counts the requests it gets per
//! path and answers like a PHP or Django shop, with no `Cache-Control`:
//!
//! - `/page/…` and `/other…`: no lifetime, the body names the `Cookie` the
//!   shop received;
//! - `/page/sets-cookie`: no lifetime, and a `Set-Cookie`;
//! - `/account/…`: `max-age=60` (cacheable by its own headers).
//!
//! Every body ends with `#N`, the shop's count for that path. The gateway's
//! rules: `/account/` bypassed; `/page/` a 60 s TTL, analytics and consent
//! cookies ignored, `currency` a key cookie; nothing for `/other`.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use flashgate_tests::test_shop::TestShop;
use flashgate_tests::{header, Stack, StackOptions};

const RULES: &str = r#"
[[shop.cache.rules]]
path = "/account/"
bypass = true

[[shop.cache.rules]]
path = "/page/"
ttl_seconds = 60
ignore_cookies = ["_ga*", "consent"]
key_cookies = ["currency"]
"#;

async fn answer(req: Request, n: usize) -> Response {
    let path = req.uri().path().to_owned();
    let cookie = req
        .headers()
        .get_all("cookie")
        .iter()
        .map(|v| v.to_str().unwrap_or("?"))
        .collect::<Vec<_>>()
        .join("; ");
    let mut resp = Response::builder()
        .status(200)
        .header("content-type", "text/html");
    if path.starts_with("/account/") {
        resp = resp.header("cache-control", "max-age=60");
    }
    if path == "/page/sets-cookie" {
        resp = resp.header("set-cookie", format!("sessionid={n}"));
    }
    resp.body(Body::from(format!("cookie=[{cookie}] {path} #{n}")))
        .unwrap()
}

async fn start() -> (Stack, TestShop) {
    let shop = TestShop::start(answer).await;
    let extra_toml = format!(
        "[shop]\nupstreams = [\"{}\"]\nread_timeout_ms = 10000\n\n[shop.cache]\nenabled = true\nmax_bytes = 1048576\nmax_object_bytes = 131072\nlock_timeout_ms = 10000\n{RULES}",
        shop.addr
    );
    let stack = Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await;
    (stack, shop)
}

/// One request: status, `X-Cache`, body.
async fn send(
    stack: &Stack,
    method: reqwest::Method,
    path: &str,
    cookie: Option<&str>,
) -> (u16, String, String) {
    let mut req = stack.http.request(method, stack.url(path));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let x_cache = header(&resp, "x-cache");
    (status, x_cache, resp.text().await.unwrap())
}

async fn get(stack: &Stack, path: &str, cookie: Option<&str>) -> (String, String) {
    let (status, x_cache, body) = send(stack, reqwest::Method::GET, path, cookie).await;
    assert_eq!(status, 200, "{path}: {body}");
    (x_cache, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_with_no_lifetime_is_cached_by_a_rule() {
    let (stack, shop) = start().await;
    let first = get(&stack, "/page/a", None).await;
    assert_eq!(first, ("MISS".into(), "cookie=[] /page/a #1".into()));
    let again = get(&stack, "/page/a", None).await;
    assert_eq!(again, ("HIT".into(), "cookie=[] /page/a #1".into()));
    assert_eq!(shop.count("/page/a"), 1);
    // Outside every rule, the shop's headers alone decide: no lifetime, no cache.
    assert_eq!(get(&stack, "/other", None).await.0, "BYPASS");
    assert_eq!(get(&stack, "/other", None).await.0, "BYPASS");
    assert_eq!(shop.count("/other"), 2);
    // A rule's TTL never stores a response that sets a cookie.
    assert_eq!(get(&stack, "/page/sets-cookie", None).await.0, "BYPASS");
    assert_eq!(get(&stack, "/page/sets-cookie", None).await.0, "BYPASS");
    assert_eq!(shop.count("/page/sets-cookie"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analytics_cookies_are_ignored_while_a_session_cookie_bypasses() {
    let (stack, shop) = start().await;
    let (x_cache, body) = get(
        &stack,
        "/page/b",
        Some("_ga=GA1.1.1; _ga_XYZ=GS1.2; consent=yes"),
    )
    .await;
    assert_eq!(x_cache, "MISS");
    assert_eq!(
        body, "cookie=[] /page/b #1",
        "the shop never saw the ignored cookies on the fill"
    );
    let (x_cache, body) = get(&stack, "/page/b", Some("_ga=GA1.1.2")).await;
    assert_eq!(
        (x_cache.as_str(), body.as_str()),
        ("HIT", "cookie=[] /page/b #1")
    );
    assert_eq!(get(&stack, "/page/b", None).await.0, "HIT");
    // A session cookie makes the request personal, as without rules: it
    // reaches the shop with every cookie it carries.
    let (x_cache, body) = get(&stack, "/page/b", Some("sessionid=abc; _ga=GA1.1.3")).await;
    assert_eq!(x_cache, "BYPASS");
    assert_eq!(body, "cookie=[sessionid=abc; _ga=GA1.1.3] /page/b #2");
    // ... and does not replace the shared copy.
    let (x_cache, body) = get(&stack, "/page/b", Some("consent=no")).await;
    assert_eq!(
        (x_cache.as_str(), body.as_str()),
        ("HIT", "cookie=[] /page/b #1")
    );
    assert_eq!(shop.count("/page/b"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_cookie_variant_is_never_served_to_the_other_variant() {
    let (stack, shop) = start().await;
    let eur = get(&stack, "/page/c", Some("currency=EUR")).await;
    assert_eq!(
        eur,
        ("MISS".into(), "cookie=[currency=EUR] /page/c #1".into())
    );
    let usd = get(&stack, "/page/c", Some("_ga=1; currency=USD")).await;
    assert_eq!(
        usd,
        ("MISS".into(), "cookie=[currency=USD] /page/c #2".into()),
        "the key cookie reaches the shop, the ignored one does not"
    );
    let none = get(&stack, "/page/c", None).await;
    assert_eq!(none, ("MISS".into(), "cookie=[] /page/c #3".into()));
    for _ in 0..3 {
        let (x, body) = get(&stack, "/page/c", Some("currency=EUR; consent=1")).await;
        assert_eq!(
            (x.as_str(), body.as_str()),
            ("HIT", "cookie=[currency=EUR] /page/c #1")
        );
        let (x, body) = get(&stack, "/page/c", Some("currency=USD")).await;
        assert_eq!(
            (x.as_str(), body.as_str()),
            ("HIT", "cookie=[currency=USD] /page/c #2")
        );
        let (x, body) = get(&stack, "/page/c", None).await;
        assert_eq!((x.as_str(), body.as_str()), ("HIT", "cookie=[] /page/c #3"));
    }
    assert_eq!(shop.count("/page/c"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bypass_rule_is_never_cached() {
    let (stack, shop) = start().await;
    for _ in 0..3 {
        assert_eq!(get(&stack, "/account/orders", None).await.0, "BYPASS");
    }
    assert_eq!(
        shop.count("/account/orders"),
        3,
        "its own max-age=60 is not enough under a bypass rule"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypasses_are_counted_by_their_reason() {
    let (stack, _shop) = start().await;
    get(&stack, "/account/orders", None).await;
    get(&stack, "/other", None).await;
    get(&stack, "/other", None).await;
    get(&stack, "/page/sets-cookie", None).await;
    get(&stack, "/page/d", Some("sessionid=abc")).await;
    let (_, x_cache, _) = send(&stack, reqwest::Method::POST, "/page/d", None).await;
    assert_eq!(x_cache, "BYPASS");
    get(&stack, "/page/d", None).await;
    get(&stack, "/page/d", None).await;
    let text = stack.gateway_metrics_text().await;
    for (reason, count) in [
        ("rule_bypass", 1),
        ("no_lifetime", 2),
        ("set_cookie", 1),
        ("cookie", 1),
        ("method", 1),
    ] {
        let line = format!("flashgate_shop_cache_bypasses_total{{reason=\"{reason}\"}} {count}");
        assert!(text.contains(&line), "missing {line}: {text}");
    }
    assert!(
        text.contains("flashgate_shop_cache_requests_total{result=\"bypass\"} 6"),
        "{text}"
    );
}
