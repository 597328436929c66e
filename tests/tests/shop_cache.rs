//! The edge cache of the shop's pages (`[shop.cache]`), against the real
//! gateway and a real shop: an axum server in the test, on loopback, that
//! counts the requests it gets per path and answers by path:
//!
//! - `/cold…` after 300 ms, `max-age=60` (coalescing);
//! - `/short` `max-age=1`; `/smaxage` `s-maxage=60, max-age=0`;
//!   `/private` `private, max-age=60`; `/nostore` `no-store`;
//! - `/aged` `max-age=60` with `Age: 50`, `/aged-out` with `Age: 100`;
//!   `/cdn` `Cache-Control: no-store` with `CDN-Cache-Control: max-age=60`;
//! - `/cookie…` `max-age=60` with a new `Set-Cookie: sid=N` each time;
//! - `/personal` `max-age=60`, `/public…` `public, max-age=60`, both echoing
//!   the request's cookie;
//! - `/vary` `max-age=60, Vary: Accept-Encoding`, echoing it;
//! - `/swr` `max-age=1, stale-while-revalidate=30`;
//! - `/sie` `max-age=1, stale-if-error=60`, `/sie-default` `max-age=1`;
//!   every `/sie…` answers 500 once the test sets the shop failing;
//! - `/big/…` 64 KiB bodies, `max-age=60`;
//! - `/text…` 4 KiB of uncompressed text, `max-age=60`;
//! - `/echo` `max-age=60`, echoing the request headers that could change
//!   the answer (`X-Forwarded-Host`, `X-Original-URL`, ...);
//! - `/mustrev` `max-age=60, must-revalidate`, echoing the request's cookie;
//! - `/guarded…` `max-age=60`, but 401 to any `Authorization` and 500 to
//!   an `X-Break` header (both outside the key);
//! - anything else `max-age=60`.
//!
//! Every body ends with `#N`, the shop's count for that path.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use flashgate_tests::test_shop::TestShop;
use flashgate_tests::{header, Stack, StackOptions, ADMIN_TOKEN};

/// Bound of the cache in these tests (the smallest allowed).
const MAX_BYTES: usize = 1 << 20;
const BIG_BODY: usize = 64 * 1024;

/// The test's shop, and the switch that makes its `/sie…` pages fail.
struct Shop {
    shop: TestShop,
    failing: Arc<AtomicBool>,
}

impl Shop {
    async fn start() -> Self {
        let failing = Arc::new(AtomicBool::new(false));
        let flag = failing.clone();
        let shop = TestShop::start(move |req, n| answer(flag.clone(), req, n)).await;
        Self { shop, failing }
    }

    /// Requests the shop got for `path` (with its query).
    fn count(&self, path: &str) -> usize {
        self.shop.count(path)
    }
}

async fn answer(failing: Arc<AtomicBool>, req: Request, n: usize) -> Response {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut resp = Response::builder().status(200);
    let mut body = format!("{path} #{n}");
    let cc = match path.as_str() {
        p if p.starts_with("/cold") => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "max-age=60"
        }
        "/short" => "max-age=1",
        "/smaxage" => "s-maxage=60, max-age=0",
        "/private" => "private, max-age=60",
        "/nostore" => "no-store",
        "/aged" => {
            resp = resp.header("age", "50");
            "max-age=60"
        }
        "/aged-out" => {
            resp = resp.header("age", "100");
            "max-age=60"
        }
        "/cdn" => {
            resp = resp.header("cdn-cache-control", "max-age=60");
            "no-store"
        }
        p if p.starts_with("/cookie") => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            resp = resp.header("set-cookie", format!("sid={n}; HttpOnly"));
            "max-age=60"
        }
        "/personal" => {
            body = format!("cookie={} {body}", header("cookie"));
            "max-age=60"
        }
        p if p.starts_with("/public") => {
            body = format!("cookie={} {body}", header("cookie"));
            "public, max-age=60"
        }
        "/vary" => {
            resp = resp.header("vary", "Accept-Encoding");
            body = format!("encoding={} {body}", header("accept-encoding"));
            "max-age=60"
        }
        "/echo" => {
            let names = [
                "x-forwarded-host",
                "x-forwarded-port",
                "x-forwarded-prefix",
                "x-original-url",
                "x-rewrite-url",
                "x-http-method-override",
            ];
            let seen: Vec<String> = names.iter().map(|n| format!("{n}={}", header(n))).collect();
            body = format!("{} {body}", seen.join(";"));
            "max-age=60"
        }
        "/mustrev" => {
            body = format!("cookie={} {body}", header("cookie"));
            "max-age=60, must-revalidate"
        }
        p if p.starts_with("/guarded") && !header("authorization").is_empty() => {
            return Response::builder()
                .status(401)
                .header("cache-control", "max-age=60")
                .body(Body::from("who are you"))
                .unwrap();
        }
        p if p.starts_with("/guarded") && !header("x-break").is_empty() => {
            return Response::builder()
                .status(500)
                .header("cache-control", "max-age=60")
                .body(Body::from("broken"))
                .unwrap();
        }
        "/swr" => "max-age=1, stale-while-revalidate=30",
        p if p.starts_with("/sie") && failing.load(Ordering::SeqCst) => {
            return Response::builder()
                .status(500)
                .body(Body::from("shop down"))
                .unwrap();
        }
        "/sie" | "/sie-crowd" => "max-age=1, stale-if-error=60",
        "/sie-default" => "max-age=1",
        p if p.starts_with("/text") => {
            body = format!("{}{body}", "flash sale ".repeat(400));
            "max-age=60"
        }
        p if p.starts_with("/big/") => {
            body = format!("{body}{}", "x".repeat(BIG_BODY));
            "max-age=60"
        }
        _ => "max-age=60",
    };
    resp.header("cache-control", cc)
        .header("content-type", "text/plain")
        .body(Body::from(body))
        .unwrap()
}

/// A stack whose gateway proxies (and caches) the test's shop.
async fn start() -> (Stack, Shop) {
    start_with("").await
}

/// As [`start`], with `more` appended to the gateway's config.
async fn start_with(more: &str) -> (Stack, Shop) {
    let shop = Shop::start().await;
    let extra_toml = format!(
        "[shop]\nupstreams = [\"{}\"]\nread_timeout_ms = 10000\n\n[shop.cache]\nenabled = true\nmax_bytes = {MAX_BYTES}\nmax_object_bytes = 131072\nlock_timeout_ms = 10000\n{more}",
        shop.shop.addr
    );
    let stack = Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await;
    (stack, shop)
}

/// One GET: status, `X-Cache`, body.
async fn get(stack: &Stack, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let mut req = stack.http.get(stack.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let x_cache = header(&resp, "x-cache");
    (status, x_cache, resp.text().await.unwrap())
}

/// Sends one raw HTTP/1.1 request: status, `X-Cache`, body.
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let x_cache = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("x-cache"))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, x_cache, body.to_owned())
}

/// The value of an unlabelled metric line.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(-1.0, |v| v.parse().unwrap())
}

async fn purge(stack: &Stack, token: Option<&str>, body: &str) -> (u16, serde_json::Value) {
    let mut req = stack
        .http
        .post(format!("http://{}/cache/purge", stack.gateway_admin_addr))
        .body(body.to_owned());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_concurrent_misses_of_a_cold_page_reach_the_shop_once() {
    let (stack, shop) = start().await;
    // Its own client: 2,000 connections at once, none reused.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = stack.url("/cold/product");
    let requests = (0..2000).map(|_| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let resp = http.get(url).send().await.unwrap();
            let x_cache = resp.headers()["x-cache"].to_str().unwrap().to_owned();
            (resp.status().as_u16(), x_cache, resp.text().await.unwrap())
        })
    });
    let started = Instant::now();
    let answers = tokio::time::timeout(Duration::from_secs(60), futures_join(requests.collect()))
        .await
        .expect("answered in time");
    eprintln!(
        "2000 concurrent requests of a cold page answered in {:?}",
        started.elapsed()
    );
    assert_eq!(shop.count("/cold/product"), 1, "the shop saw the page once");
    assert!(answers
        .iter()
        .all(|(status, _, body)| *status == 200 && body == "/cold/product #1"));
    let misses = answers.iter().filter(|(_, x, _)| x == "MISS").count();
    let hits = answers.iter().filter(|(_, x, _)| x == "HIT").count();
    assert_eq!(
        (misses, hits),
        (1, 1999),
        "one fetch, every other answer from the cache"
    );
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_is_answered_from_the_cache_until_its_max_age_then_fetched_again() {
    let (stack, shop) = start().await;
    assert_eq!(
        get(&stack, "/short", &[]).await,
        (200, "MISS".into(), "/short #1".into())
    );
    assert_eq!(
        get(&stack, "/short", &[]).await,
        (200, "HIT".into(), "/short #1".into())
    );
    let r = stack.http.head(stack.url("/short")).send().await.unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["x-cache"].to_str().unwrap()
        ),
        (200, "HIT")
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        get(&stack, "/short", &[]).await,
        (200, "MISS".into(), "/short #2".into())
    );
    assert_eq!(shop.count("/short"), 2);
    // The gateway's own routes are not the shop's: no X-Cache there.
    let page = stack
        .http
        .get(stack.url("/flashgate/static/sale.css"))
        .send()
        .await
        .unwrap();
    assert!(page.headers().get("x-cache").is_none());
    let text = stack.gateway_metrics_text().await;
    assert!(
        text.contains("flashgate_shop_cache_requests_total{result=\"hit\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("flashgate_shop_cache_requests_total{result=\"miss\"} 2"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_maxage_is_stored_and_private_or_no_store_are_not() {
    let (stack, shop) = start().await;
    assert_eq!(get(&stack, "/smaxage", &[]).await.1, "MISS");
    assert_eq!(
        get(&stack, "/smaxage", &[]).await,
        (200, "HIT".into(), "/smaxage #1".into())
    );
    for path in ["/private", "/nostore"] {
        assert_eq!(
            get(&stack, path, &[]).await,
            (200, "BYPASS".into(), format!("{path} #1"))
        );
        assert_eq!(
            get(&stack, path, &[]).await,
            (200, "BYPASS".into(), format!("{path} #2"))
        );
        assert_eq!(shop.count(path), 2, "{path} goes to the shop every time");
    }
    assert_eq!(shop.count("/smaxage"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_cookie_response_is_never_served_to_another_client() {
    let (stack, shop) = start().await;
    let cookie_of = |http: reqwest::Client, url: String| async move {
        let resp = http.get(url).send().await.unwrap();
        let cookie = resp
            .headers()
            .get("set-cookie")
            .map(|v| v.to_str().unwrap().to_owned());
        (
            resp.headers()["x-cache"].to_str().unwrap().to_owned(),
            cookie,
            resp.text().await.unwrap(),
        )
    };
    // One after another, then 50 clients at once on a cold page.
    let (x1, c1, _) = cookie_of(stack.http.clone(), stack.url("/cookie")).await;
    let (x2, c2, _) = cookie_of(stack.http.clone(), stack.url("/cookie")).await;
    assert_eq!((x1.as_str(), x2.as_str()), ("BYPASS", "BYPASS"));
    assert_eq!(
        (c1.as_deref(), c2.as_deref()),
        (Some("sid=1; HttpOnly"), Some("sid=2; HttpOnly"))
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let all: Vec<_> = (0..50)
        .map(|_| tokio::spawn(cookie_of(http.clone(), stack.url("/cookie-cold"))))
        .collect();
    let answers = futures_join(all).await;
    let mut cookies: Vec<String> = answers
        .iter()
        .map(|(_, c, _)| c.clone().expect("each answer sets its cookie"))
        .collect();
    cookies.sort();
    cookies.dedup();
    assert_eq!(
        cookies.len(),
        50,
        "no two clients got the same session cookie"
    );
    assert_eq!(shop.count("/cookie-cold"), 50);
    for (x_cache, cookie, body) in &answers {
        let sid = cookie
            .as_deref()
            .unwrap()
            .trim_start_matches("sid=")
            .split(';')
            .next()
            .unwrap();
        assert!(
            x_cache == "BYPASS" && body.ends_with(&format!("#{sid}")),
            "{x_cache} {cookie:?} {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_and_authorization_requests_bypass_the_cache_unless_the_response_is_public() {
    let (stack, shop) = start().await;
    assert_eq!(
        get(&stack, "/personal", &[]).await,
        (200, "MISS".into(), "cookie= /personal #1".into())
    );
    assert_eq!(get(&stack, "/personal", &[]).await.1, "HIT");
    // With a cookie or a token: the shop answers, and its answer is not kept.
    assert_eq!(
        get(&stack, "/personal", &[("cookie", "sid=alice")]).await,
        (200, "BYPASS".into(), "cookie=sid=alice /personal #2".into())
    );
    assert_eq!(
        get(&stack, "/personal", &[("authorization", "Bearer bob")]).await,
        (200, "BYPASS".into(), "cookie= /personal #3".into())
    );
    assert_eq!(
        get(&stack, "/personal", &[]).await,
        (200, "HIT".into(), "cookie= /personal #1".into())
    );
    assert_eq!(shop.count("/personal"), 3);

    // A public page is shared with them, and their public answers are kept.
    assert_eq!(get(&stack, "/public", &[]).await.1, "MISS");
    assert_eq!(
        get(&stack, "/public", &[("cookie", "sid=alice")]).await,
        (200, "HIT".into(), "cookie= /public #1".into())
    );
    assert_eq!(
        get(&stack, "/public-first", &[("cookie", "sid=carol")])
            .await
            .1,
        "MISS"
    );
    assert_eq!(
        get(&stack, "/public-first", &[]).await,
        (
            200,
            "HIT".into(),
            "cookie=sid=carol /public-first #1".into()
        )
    );
    assert_eq!((shop.count("/public"), shop.count("/public-first")), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_accept_encoding_keeps_one_variant_per_encoding() {
    let (stack, shop) = start().await;
    let gzip = [("accept-encoding", "gzip")];
    let br = [("accept-encoding", "br")];
    // Each variant is fetched, then seen stored (a HIT), before the next
    // one is asked for: the store finishes after the client has its answer.
    assert_eq!(
        get(&stack, "/vary", &gzip).await,
        (200, "MISS".into(), "encoding=gzip /vary #1".into())
    );
    assert_eq!(
        get(&stack, "/vary", &gzip).await,
        (200, "HIT".into(), "encoding=gzip /vary #1".into())
    );
    assert_eq!(
        get(&stack, "/vary", &br).await,
        (200, "MISS".into(), "encoding=br /vary #2".into())
    );
    assert_eq!(
        get(&stack, "/vary", &br).await,
        (200, "HIT".into(), "encoding=br /vary #2".into())
    );
    // Storing the second variant kept the first.
    assert_eq!(
        get(&stack, "/vary", &gzip).await,
        (200, "HIT".into(), "encoding=gzip /vary #1".into())
    );
    assert_eq!(shop.count("/vary"), 2);
}

/// One GET's `Content-Encoding`, `Vary`, `X-Cache` and body, decoded.
async fn get_decoded(stack: &Stack, path: &str, accept: &str) -> (String, String, String, String) {
    use std::io::Read as _;
    let resp = stack
        .http
        .get(stack.url(path))
        .header("accept-encoding", accept)
        .send()
        .await
        .unwrap();
    let (encoding, vary, x_cache) = (
        header(&resp, "content-encoding"),
        header(&resp, "vary"),
        header(&resp, "x-cache"),
    );
    let bytes = resp.bytes().await.unwrap();
    let mut body = String::new();
    match encoding.as_str() {
        "gzip" => flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut body)
            .unwrap(),
        "br" => brotli::Decompressor::new(&bytes[..], 4096)
            .read_to_string(&mut body)
            .unwrap(),
        "" => {
            body = String::from_utf8(bytes.to_vec()).unwrap();
            0
        }
        other => panic!("unexpected content-encoding {other}"),
    };
    (encoding, vary, x_cache, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_the_shop_sends_uncompressed_is_compressed_once_per_chosen_coding() {
    let (stack, shop) = start_with("\n[shop.compression]\nenabled = true\n").await;
    let page = format!("{}/text #1", "flash sale ".repeat(400));
    let (encoding, vary, x_cache, body) = get_decoded(&stack, "/text", "gzip").await;
    assert_eq!((encoding.as_str(), x_cache.as_str()), ("gzip", "MISS"));
    assert!(
        vary.to_ascii_lowercase().contains("accept-encoding"),
        "vary: {vary}"
    );
    assert_eq!(body, page);
    // Another spelling of the same codings shares the stored copy.
    let (encoding, _, x_cache, body) = get_decoded(&stack, "/text", "gzip;q=1.0").await;
    assert_eq!(
        (encoding.as_str(), x_cache.as_str(), body == page),
        ("gzip", "HIT", true)
    );
    let (encoding, _, x_cache, body) = get_decoded(&stack, "/text", "br").await;
    assert_eq!((encoding.as_str(), x_cache.as_str()), ("br", "MISS"));
    assert_eq!(body, format!("{}/text #2", "flash sale ".repeat(400)));
    // Browsers' lists get brotli, the gateway's first choice, from that copy.
    let (encoding, _, x_cache, _) = get_decoded(&stack, "/text", "gzip, deflate, br, zstd").await;
    assert_eq!((encoding.as_str(), x_cache.as_str()), ("br", "HIT"));
    // A coding refused with q=0 is never chosen, however it is listed.
    let (encoding, _, x_cache, _) = get_decoded(&stack, "/text", "br;q=0, gzip").await;
    assert_eq!((encoding.as_str(), x_cache.as_str()), ("gzip", "HIT"));
    // A client that accepts no coding gets the shop's bytes as they are.
    let (encoding, _, _, body) = get_decoded(&stack, "/text", "identity").await;
    assert_eq!(encoding, "");
    assert!(body.ends_with("/text #3"), "{body}");
    assert_eq!(shop.count("/text"), 3, "one fetch per encoding, then hits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_shop_compression_the_shops_bytes_pass_as_they_are() {
    let (stack, _shop) = start().await;
    let (encoding, _, x_cache, body) = get_decoded(&stack, "/text-plain", "gzip, br").await;
    assert_eq!((encoding.as_str(), x_cache.as_str()), ("", "MISS"));
    assert!(body.ends_with("/text-plain #1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_answers_stale_and_refreshes_in_the_background() {
    let (stack, shop) = start().await;
    assert_eq!(get(&stack, "/swr", &[]).await.1, "MISS");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        get(&stack, "/swr", &[]).await,
        (200, "STALE".into(), "/swr #1".into())
    );
    // The refresh runs behind that answer; the next answers get its result.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, x_cache, body) = get(&stack, "/swr", &[]).await;
        if body == "/swr #2" {
            assert_eq!(x_cache, "HIT");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never refreshed: {x_cache} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shop.count("/swr"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_the_stale_copy_while_the_shop_fails() {
    let (stack, shop) = start().await;
    for path in ["/sie", "/sie-default"] {
        assert_eq!(get(&stack, path, &[]).await.1, "MISS");
    }
    shop.failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // `/sie` names its window; `/sie-default` gets shop.cache.stale_if_error_seconds.
    for path in ["/sie", "/sie-default"] {
        assert_eq!(
            get(&stack, path, &[]).await,
            (200, "STALE".into(), format!("{path} #1"))
        );
        assert_eq!(shop.count(path), 2, "{path}: the shop was asked and failed");
    }
    // A page never stored has nothing to fall back on.
    let (status, _, _) = get(&stack, "/sie?never-stored", &[]).await;
    assert_eq!(status, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_near_max_bytes_as_the_least_recently_used_are_evicted() {
    let (stack, shop) = start().await;
    let pages = 3 * MAX_BYTES / BIG_BODY;
    for i in 0..pages {
        let (status, x_cache, body) = get(&stack, &format!("/big/{i}"), &[]).await;
        assert_eq!(
            (status, x_cache.as_str(), body.len() > BIG_BODY),
            (200, "MISS", true)
        );
    }
    // Eviction runs right after each store; wait for the last one to
    // bring the bytes held under the bound asserted below.
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = stack.gateway_metrics_text().await;
        if metric(&text, "flashgate_shop_cache_bytes") <= (MAX_BYTES * 3 / 4) as f64
            || Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let held = metric(&text, "flashgate_shop_cache_bytes");
    assert!(
        held > (MAX_BYTES / 2) as f64 && held <= (MAX_BYTES * 3 / 4) as f64,
        "bytes held {held}, bound {MAX_BYTES}"
    );
    assert!(
        metric(&text, "flashgate_shop_cache_evictions_total")
            >= (pages - MAX_BYTES / BIG_BODY) as f64,
        "{text}"
    );
    assert!(metric(&text, "flashgate_shop_cache_objects") < (MAX_BYTES / BIG_BODY) as f64 + 1.0);
    // The newest page is still there, the oldest is gone.
    assert_eq!(
        get(&stack, &format!("/big/{}", pages - 1), &[]).await.1,
        "HIT"
    );
    assert_eq!(get(&stack, "/big/0", &[]).await.1, "MISS");
    assert_eq!(shop.count("/big/0"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_url_and_by_prefix_needs_the_admin_token() {
    let (stack, shop) = start().await;
    for path in ["/products/1", "/products/2?color=red", "/other"] {
        assert_eq!(get(&stack, path, &[]).await.1, "MISS");
    }
    let url = r#"{"url": "/products/1"}"#;
    assert_eq!(purge(&stack, None, url).await.0, 401);
    assert_eq!(
        purge(&stack, Some("not-the-admin-token-but-long-enough-000"), url)
            .await
            .0,
        401
    );
    assert_eq!(
        get(&stack, "/products/1", &[]).await.1,
        "HIT",
        "refused purges change nothing"
    );
    let (status, body) = purge(
        &stack,
        Some(ADMIN_TOKEN),
        r#"{"url": "/products/1", "prefix": "/"}"#,
    )
    .await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")));
    assert_eq!(purge(&stack, Some(ADMIN_TOKEN), "not json").await.0, 400);

    let (status, body) = purge(&stack, Some(ADMIN_TOKEN), url).await;
    assert_eq!(
        (status, body["kind"].as_str(), body["purged"].as_u64()),
        (200, Some("url"), Some(1))
    );
    assert_eq!(
        get(&stack, "/products/1", &[]).await,
        (200, "MISS".into(), "/products/1 #2".into())
    );
    assert_eq!(get(&stack, "/products/2?color=red", &[]).await.1, "HIT");

    let (status, body) = purge(&stack, Some(ADMIN_TOKEN), r#"{"prefix": "/products/"}"#).await;
    assert_eq!((status, body["purged"].as_u64()), (200, Some(2)));
    assert_eq!(get(&stack, "/products/1", &[]).await.1, "MISS");
    assert_eq!(get(&stack, "/products/2?color=red", &[]).await.1, "MISS");
    assert_eq!(get(&stack, "/other", &[]).await.1, "HIT");
    assert_eq!(
        (
            shop.count("/products/1"),
            shop.count("/products/2?color=red"),
            shop.count("/other")
        ),
        (3, 2, 1)
    );
    let text = stack.gateway_metrics_text().await;
    assert!(
        text.contains("flashgate_shop_cache_purges_total{kind=\"prefix\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("flashgate_shop_cache_purged_objects_total{kind=\"url\"} 1"),
        "{text}"
    );
    promtool_check(&text);
}

/// The exposition, cache metrics included, passes `promtool check metrics`.
fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (make test installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_one_gateway_reaches_the_others_over_sale_events() {
    let (stack, shop) = start().await;
    let (_second, second_addr) = stack.start_second_gateway();
    let on = |addr: SocketAddr, path: &str| {
        let (http, url) = (stack.http.clone(), format!("http://{addr}{path}"));
        async move {
            http.get(url).send().await.unwrap().headers()["x-cache"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };
    for addr in [stack.gateway_addr, second_addr] {
        assert_eq!(
            on(addr, "/products/9").await,
            "MISS",
            "each gateway has a cache of its own"
        );
        assert_eq!(on(addr, "/products/9").await, "HIT");
    }
    // Both gateways listen on fg:events before the purge is announced.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let subscribers: (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("fg:events")
            .query_async(&mut stack.redis_handle().await)
            .await
            .unwrap();
        if subscribers.1 >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gateways not subscribed: {subscribers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = purge(&stack, Some(ADMIN_TOKEN), r#"{"url": "/products/9"}"#).await;
    assert_eq!(
        (status, body["purged"].as_u64(), body["announced"].as_bool()),
        (200, Some(1), Some(true))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while on(second_addr, "/products/9").await == "HIT" {
        assert!(
            Instant::now() < deadline,
            "the second gateway never heard the purge"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(on(stack.gateway_addr, "/products/9").await, "MISS");
    assert_eq!(shop.count("/products/9"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_not_a_path_is_refused_and_cannot_fill_another_key() {
    let (stack, shop) = start().await;
    let addr = stack.gateway_addr;
    // pingora parses `x:/search?q=…` to the path `/`, while the shop would
    // get the raw target: refused before the cache or the shop see it.
    for target in ["x:/search?q=poison", "*", "http://shop.example/"] {
        let request =
            format!("GET {target} HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n");
        let (status, _, body) = tokio::task::spawn_blocking(move || raw(addr, request.as_bytes()))
            .await
            .unwrap();
        assert_eq!(status, 400, "{target}: {body}");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("{target}: not JSON: {body}"));
        assert_eq!(v["code"], "bad_request", "{target}: {body}");
    }
    assert_eq!(shop.shop.total(), 0, "the shop saw none of them");
    let plain = b"GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n";
    let (status, x_cache, body) = tokio::task::spawn_blocking(move || raw(addr, plain))
        .await
        .unwrap();
    assert_eq!(
        (status, x_cache.as_str(), body.as_str()),
        (200, "MISS", "/ #1")
    );
    // The key is the raw target: `%2F` and `/` are two keys, as the shop may
    // answer them differently.
    let encoded = b"GET /a%2Fb HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n";
    let (_, x_cache, body) = tokio::task::spawn_blocking(move || raw(addr, encoded))
        .await
        .unwrap();
    assert_eq!((x_cache.as_str(), body.as_str()), ("MISS", "/a%2Fb #1"));
    // A target that is not UTF-8 is never taken from, or put in, the cache.
    for _ in 0..2 {
        let latin1 = b"GET /caf\xe9 HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n";
        let (status, x_cache, _) = tokio::task::spawn_blocking(move || raw(addr, latin1))
            .await
            .unwrap();
        assert!(
            x_cache != "HIT" && x_cache != "MISS",
            "status {status}, X-Cache {x_cache}"
        );
    }
    // Without Host: not keyed under an empty host.
    let no_host = b"GET /nohost HTTP/1.0\r\n\r\n";
    for _ in 0..2 {
        let (status, x_cache, _) = tokio::task::spawn_blocking(move || raw(addr, no_host))
            .await
            .unwrap();
        assert_eq!((status, x_cache.as_str()), (200, "BYPASS"));
    }
    assert_eq!(shop.count("/nohost"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_alone_does_not_share_a_cookie_request_answer() {
    let (stack, shop) = start().await;
    let alice = [("cookie", "sid=alice")];
    assert_eq!(
        get(&stack, "/mustrev", &alice).await,
        (200, "BYPASS".into(), "cookie=sid=alice /mustrev #1".into())
    );
    // Another client, with or without a cookie, never gets alice's page.
    assert_eq!(
        get(&stack, "/mustrev", &[("cookie", "sid=bob")]).await.2,
        "cookie=sid=bob /mustrev #2"
    );
    assert_eq!(
        get(&stack, "/mustrev", &[]).await,
        (200, "MISS".into(), "cookie= /mustrev #3".into())
    );
    // An anonymous copy is not served to a cookie request either.
    assert_eq!(get(&stack, "/mustrev", &[]).await.1, "HIT");
    assert_eq!(
        get(&stack, "/mustrev", &alice).await,
        (200, "BYPASS".into(), "cookie=sid=alice /mustrev #4".into())
    );
    assert_eq!(shop.count("/mustrev"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_cannot_switch_the_cache_off_for_a_url() {
    let (stack, shop) = start().await;
    // A junk token answered 401, before and after the page is stored.
    assert_eq!(
        get(&stack, "/guarded", &[("authorization", "Bearer junk")])
            .await
            .0,
        401
    );
    assert_eq!(get(&stack, "/guarded", &[]).await.1, "MISS");
    assert_eq!(
        get(&stack, "/guarded", &[("authorization", "Bearer junk")])
            .await
            .0,
        401
    );
    assert_eq!(
        get(&stack, "/guarded", &[]).await,
        (200, "HIT".into(), "/guarded #2".into())
    );
    // An anonymous request with a header outside the key that breaks the shop.
    assert_eq!(get(&stack, "/guarded-2", &[("x-break", "1")]).await.0, 500);
    assert_eq!(get(&stack, "/guarded-2", &[]).await.1, "MISS");
    assert_eq!(
        get(&stack, "/guarded-2", &[]).await,
        (200, "HIT".into(), "/guarded-2 #2".into())
    );
    assert_eq!((shop.count("/guarded"), shop.count("/guarded-2")), (3, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_unique_long_urls_keep_the_memory_held_near_max_bytes() {
    let (stack, shop) = start().await;
    // 7 KiB targets with tiny bodies: the URLs are most of each entry.
    let long = "q".repeat(7 * 1024);
    let urls = 3 * MAX_BYTES / long.len();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for batch in (0..urls).collect::<Vec<_>>().chunks(32) {
        let all: Vec<_> = batch
            .iter()
            .map(|i| {
                let (http, url) = (http.clone(), stack.url(&format!("/long/{i}?{long}")));
                tokio::spawn(async move { http.get(url).send().await.unwrap().status().as_u16() })
            })
            .collect();
        assert!(futures_join(all).await.iter().all(|s| *s == 200));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = stack.gateway_metrics_text().await;
        if metric(&text, "flashgate_shop_cache_bytes") <= (MAX_BYTES * 3 / 4) as f64
            || Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (held, objects) = (
        metric(&text, "flashgate_shop_cache_bytes"),
        metric(&text, "flashgate_shop_cache_objects"),
    );
    assert!(
        held > (MAX_BYTES / 2) as f64 && held <= (MAX_BYTES * 3 / 4) as f64,
        "bytes held {held}, bound {MAX_BYTES}"
    );
    assert!(
        objects * long.len() as f64 <= MAX_BYTES as f64,
        "{objects} entries of 7 KiB URLs held"
    );
    // A target over 8 KiB is not keyed at all.
    let longer = format!("/long/x?{}", "q".repeat(9 * 1024));
    assert_eq!(get(&stack, &longer, &[]).await.1, "BYPASS");
    assert_eq!(get(&stack, &longer, &[]).await.1, "BYPASS");
    assert_eq!(shop.count(&longer), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_outside_the_key_that_rewrite_the_request_do_not_reach_the_shop() {
    let (stack, shop) = start().await;
    let claims = [
        ("x-forwarded-host", "evil.example"),
        ("x-forwarded-port", "8443"),
        ("x-forwarded-prefix", "/evil"),
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
        ("x-http-method-override", "DELETE"),
    ];
    let (_, x_cache, body) = get(&stack, "/echo", &claims).await;
    let host = stack.gateway_addr.to_string();
    let expected = format!(
        "x-forwarded-host={host};x-forwarded-port=;x-forwarded-prefix=;x-original-url=;x-rewrite-url=;x-http-method-override= /echo #1"
    );
    assert_eq!(
        (x_cache.as_str(), body.as_str()),
        ("MISS", expected.as_str())
    );
    assert_eq!(
        get(&stack, "/echo", &[]).await,
        (200, "HIT".into(), expected)
    );
    assert_eq!(shop.count("/echo"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_gets_the_stale_copy_while_the_shop_fails_without_queueing_on_it() {
    let (stack, shop) = start().await;
    assert_eq!(get(&stack, "/sie-crowd", &[]).await.1, "MISS");
    shop.failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let all: Vec<_> = (0..200)
        .map(|_| {
            let (http, url) = (http.clone(), stack.url("/sie-crowd"));
            tokio::spawn(async move {
                let resp = http.get(url).send().await.unwrap();
                let x_cache = resp.headers()["x-cache"].to_str().unwrap().to_owned();
                (resp.status().as_u16(), x_cache, resp.text().await.unwrap())
            })
        })
        .collect();
    let answers = tokio::time::timeout(Duration::from_secs(30), futures_join(all))
        .await
        .expect("answered in time");
    for (status, x_cache, body) in &answers {
        assert_eq!(
            (*status, x_cache.as_str(), body.as_str()),
            (200, "STALE", "/sie-crowd #1")
        );
    }
    // One failed fetch, then a retry at most every second while the crowd lasts.
    let asked = shop.count("/sie-crowd") - 1;
    assert!(
        (1..=5).contains(&asked),
        "the failing shop was asked {asked} times"
    );
}

/// One request: `X-Cache`, `Cache-Status`, `Age` and body.
async fn cache_headers(
    stack: &Stack,
    method: reqwest::Method,
    path: &str,
) -> (String, String, Option<u64>, String) {
    let resp = stack
        .http
        .request(method, stack.url(path))
        .send()
        .await
        .unwrap();
    let (x_cache, status, age) = (
        header(&resp, "x-cache"),
        header(&resp, "cache-status"),
        header(&resp, "age").parse().ok(),
    );
    (x_cache, status, age, resp.text().await.unwrap())
}

/// `Flashgate; hit; ttl=N` → (`Flashgate; hit`, N).
fn split_ttl(cache_status: &str) -> (&str, i64) {
    let (head, ttl) = cache_status
        .rsplit_once("; ttl=")
        .unwrap_or_else(|| panic!("no ttl in {cache_status:?}"));
    (head, ttl.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_names_what_the_cache_did_beside_x_cache() {
    let (stack, _shop) = start().await;
    let (x, status, _, _) = cache_headers(&stack, reqwest::Method::GET, "/smaxage").await;
    let (head, ttl) = split_ttl(&status);
    assert_eq!((x.as_str(), head), ("MISS", "Flashgate; fwd=miss; stored"));
    assert!((0..=60).contains(&ttl), "{status}");
    let (x, status, _, _) = cache_headers(&stack, reqwest::Method::GET, "/smaxage").await;
    let (head, ttl) = split_ttl(&status);
    assert_eq!((x.as_str(), head), ("HIT", "Flashgate; hit"));
    assert!((0..=60).contains(&ttl), "{status}");
    let (x, status, _, _) = cache_headers(&stack, reqwest::Method::GET, "/nostore").await;
    assert_eq!(
        (x.as_str(), status.as_str()),
        ("BYPASS", "Flashgate; fwd=miss; detail=OriginNotCache")
    );
    let (x, status, _, _) = cache_headers(&stack, reqwest::Method::POST, "/form").await;
    assert_eq!(
        (x.as_str(), status.as_str()),
        ("BYPASS", "Flashgate; fwd=bypass")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_age_a_response_arrives_with_counts_in_its_freshness_and_in_the_age_served() {
    let (stack, shop) = start().await;
    for _ in 0..2 {
        cache_headers(&stack, reqwest::Method::GET, "/aged").await;
    }
    let (x, _, age, body) = cache_headers(&stack, reqwest::Method::GET, "/aged").await;
    assert_eq!((x.as_str(), body.as_str()), ("HIT", "/aged #1"));
    assert!(age.is_some_and(|a| a >= 50), "Age {age:?}");
    // Older than its max-age on arrival: stored stale, fetched every time.
    for n in 1..=2 {
        let (x, _, _, body) = cache_headers(&stack, reqwest::Method::GET, "/aged-out").await;
        assert_eq!((x.as_str(), body), ("MISS", format!("/aged-out #{n}")));
    }
    assert_eq!(shop.count("/aged"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdn_cache_control_wins_over_cache_control() {
    let (stack, shop) = start().await;
    cache_headers(&stack, reqwest::Method::GET, "/cdn").await;
    let (x, _, _, body) = cache_headers(&stack, reqwest::Method::GET, "/cdn").await;
    assert_eq!((x.as_str(), body.as_str()), ("HIT", "/cdn #1"));
    assert_eq!(shop.count("/cdn"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_post_to_a_url_makes_its_stored_copy_fetched_again() {
    let (stack, shop) = start().await;
    cache_headers(&stack, reqwest::Method::GET, "/product").await;
    let (x, _, _, _) = cache_headers(&stack, reqwest::Method::GET, "/product").await;
    assert_eq!(x, "HIT");
    cache_headers(&stack, reqwest::Method::POST, "/product").await;
    // The POST is the shop's second request for the path; the GET its third.
    let (x, _, _, body) = cache_headers(&stack, reqwest::Method::GET, "/product").await;
    assert_eq!((x.as_str(), body.as_str()), ("MISS", "/product #3"));
    let (x, _, _, body) = cache_headers(&stack, reqwest::Method::GET, "/product").await;
    assert_eq!((x.as_str(), body.as_str()), ("HIT", "/product #3"));
    assert_eq!(shop.count("/product"), 3);
}
