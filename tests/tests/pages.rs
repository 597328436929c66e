//! Product pages, the live-stock micro-cache and the reverse proxy to the
//! shop, against the real stack. Paths that a client library would
//! normalise are sent as raw bytes over a `TcpStream`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use flashgate_tests::{free_port, Stack, StackOptions};
use serde_json::Value;

/// A raw HTTP/1.1 exchange: `request` is sent as is (it should ask for
/// `Connection: close`), the answer is read to EOF and split.
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut body = buf[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(
            std::str::from_utf8(&b[..eol])
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sale_page_revalidates_with_etag_to_304_and_answers_head_without_body() {
    let stack = Stack::start(StackOptions::default()).await;
    let r = stack
        .http
        .get(stack.url("/flashgate/sales/demo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["cache-control"], "public, max-age=10");
    assert!(h.contains_key("last-modified"));
    let etag = h["etag"].to_str().unwrap().to_owned();
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong ETag: {etag}"
    );
    let page = r.bytes().await.unwrap();
    assert!(std::str::from_utf8(&page)
        .unwrap()
        .contains("/flashgate/static/sale.js"));

    let r = stack
        .http
        .get(stack.url("/flashgate/sales/another-sale"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 304, "every sale shares the page");
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
    assert!(r.bytes().await.unwrap().is_empty());
    let r = stack
        .http
        .get(stack.url("/flashgate/sales/demo"))
        .header("If-None-Match", "\"stale\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let (status, head, body) = raw(
        stack.gateway_addr,
        b"HEAD /flashgate/static/sale.css HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert!(body.is_empty(), "HEAD has no body");
    let css = stack
        .http
        .get(stack.url("/flashgate/static/sale.css"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(
        header(&head, "content-length"),
        Some(css.len().to_string().as_str())
    );
    assert_eq!(
        header(&head, "content-type"),
        Some("text/css; charset=utf-8")
    );

    let r = stack
        .http
        .post(stack.url("/flashgate/static/sale.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_are_sent_gzip_or_brotli_as_accept_encoding_asks() {
    let stack = Stack::start(StackOptions::default()).await;
    let get = |enc: Option<&'static str>| {
        let mut req = stack.http.get(stack.url("/flashgate/static/sale.js"));
        if let Some(e) = enc {
            req = req.header("Accept-Encoding", e);
        }
        async move {
            let r = req.send().await.unwrap();
            let h = r.headers().clone();
            (h, r.bytes().await.unwrap().to_vec())
        }
    };
    let (plain_h, plain) = get(None).await;
    assert!(!plain_h.contains_key("content-encoding"));
    assert_eq!(plain_h["vary"], "Accept-Encoding");

    let (gz_h, gz) = get(Some("gzip, deflate")).await;
    assert_eq!(gz_h["content-encoding"], "gzip");
    assert_eq!(gz_h["vary"], "Accept-Encoding");
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut unzipped)
        .unwrap();
    assert_eq!(unzipped, plain);
    assert!(gz.len() < plain.len());

    let (br_h, br) = get(Some("gzip, deflate, br")).await;
    assert_eq!(br_h["content-encoding"], "br");
    let mut unbrotli = Vec::new();
    brotli::Decompressor::new(&br[..], 4096)
        .read_to_end(&mut unbrotli)
        .unwrap();
    assert_eq!(unbrotli, plain);

    let (h, _) = get(Some("br;q=0, gzip;q=0")).await;
    assert!(
        !h.contains_key("content-encoding"),
        "q=0 refuses an encoding"
    );

    let etags = [&plain_h, &gz_h, &br_h].map(|h| h["etag"].to_str().unwrap().to_owned());
    assert!(
        etags[0] != etags[1] && etags[1] != etags[2] && etags[0] != etags[2],
        "{etags:?}"
    );
    // A gzip revalidation matches the gzip representation only.
    let r = stack
        .http
        .get(stack.url("/flashgate/static/sale.js"))
        .header("Accept-Encoding", "gzip")
        .header("If-None-Match", &etags[1])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 304);
    let r = stack
        .http
        .get(stack.url("/flashgate/static/sale.js"))
        .header("If-None-Match", &etags[1])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_traversal_attempts_never_leave_the_static_dir() {
    let stack = Stack::start(StackOptions::default()).await;
    for path in [
        "/flashgate/static/../Cargo.toml",
        "/flashgate/static/../../Cargo.toml",
        "/flashgate/static/%2e%2e/Cargo.toml",
        "/flashgate/static/%2E%2E/%2E%2E/Cargo.toml",
        "/flashgate/static/..%2fCargo.toml",
        "/flashgate/static/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/flashgate/static/.%2e/gateway/src/main.rs",
        "/flashgate/static//etc/passwd",
        "/flashgate/static/..\\Cargo.toml",
        "/flashgate/static/%5c..%5cCargo.toml",
        "/flashgate/static/sale.js%00.html",
        "/flashgate/static/.gitignore",
        "/flashgate/sales/..%2f..%2fCargo.toml",
        "/flashgate/sales/../static/../Cargo.toml",
    ] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, _, body) = raw(stack.gateway_addr, req.as_bytes());
        let body = String::from_utf8_lossy(&body);
        assert!(status == 404 || status == 400, "{path}: {status} {body}");
        assert!(
            !body.contains("[workspace]") && !body.contains("root:") && !body.contains("fn main"),
            "{path} leaked: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_requests_drop_hop_by_hop_headers_gain_forwarded_ones_and_stream_the_body() {
    let stack = Stack::start(StackOptions::default()).await;
    let chunk = "0123456789abcdef".repeat(4096); // 64 KiB per chunk
    let mut req = String::from(
        "POST /echo/cart?item=7&x=%20y HTTP/1.1\r\nHost: shop.example\r\nConnection: close, X-Hop-Secret\r\n\
         X-Hop-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eDp5\r\nTE: trailers\r\n\
         X-Custom: kept\r\nX-Forwarded-For: 203.0.113.9\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    for _ in 0..4 {
        req.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    req.push_str("0\r\n\r\n");
    let (status, _, body) = raw(stack.gateway_addr, req.as_bytes());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (
            v["method"].as_str(),
            v["path"].as_str(),
            v["query"].as_str()
        ),
        (Some("POST"), Some("/echo/cart"), Some("item=7&x=%20y"))
    );
    assert_eq!(
        v["body"].as_str().map(str::len),
        Some(4 * chunk.len()),
        "the whole chunked body arrives"
    );
    let h = &v["headers"];
    for gone in ["x-hop-secret", "keep-alive", "proxy-authorization", "te"] {
        assert!(h.get(gone).is_none(), "{gone} was forwarded: {h}");
    }
    assert_eq!(h["x-custom"], "kept");
    assert_eq!(h["host"], "shop.example");
    assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert!(h["x-request-id"].is_string());
}

/// A tiny upstream that answers every request with its name, plus headers
/// that must not cross the gateway. Runs on its own thread until the test ends.
fn named_upstream(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut seen = Vec::new();
                loop {
                    let Ok(n) = conn.read(&mut buf) else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let body = format!("hello from {name}");
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: keep-alive, X-Hop-Secret\r\n\
                             X-Hop-Secret: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nX-Upstream: {name}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(resp.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// An upstream that accepts and reads but never answers.
fn silent_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_shop_upstreams_share_the_load_and_a_dead_one_is_skipped() {
    let (a, b) = (named_upstream("a"), named_upstream("b"));
    let dead: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let extra_toml = format!(
        "[shop]\nupstreams = [\"{dead}\", \"{a}\", \"{b}\"]\nhealth_check_interval_ms = 200\n"
    );
    let stack = Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await;
    let mut seen = std::collections::HashSet::new();
    for i in 0..30 {
        let r = stack
            .http
            .get(stack.url(&format!("/products/{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "request {i}");
        let h = r.headers().clone();
        for gone in ["x-hop-secret", "keep-alive", "proxy-authenticate"] {
            assert!(!h.contains_key(gone), "{gone} came back from the shop");
        }
        seen.insert(h["x-upstream"].to_str().unwrap().to_owned());
        assert!(r.text().await.unwrap().starts_with("hello from "));
    }
    assert_eq!(seen.len(), 2, "both live upstreams got requests: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_shop_answers_502_json() {
    let mut stack = Stack::start(StackOptions::default()).await;
    drop(stack.shop.take());
    for path in ["/", "/cart?x=1"] {
        let r = stack.http.get(stack.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 502, "{path}");
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "bad_gateway");
        assert!(v["message"].is_string());
    }
    // The gateway's own routes do not depend on the shop.
    assert_eq!(
        stack
            .http
            .get(stack.url("/flashgate/sales/demo"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shop_that_does_not_answer_in_time_gets_504_json() {
    let silent = silent_upstream();
    let extra_toml = format!("[shop]\nupstreams = [\"{silent}\"]\nread_timeout_ms = 300\n");
    let stack = Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await;
    let r = stack.http.get(stack.url("/slow")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 504);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "gateway_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_concurrent_state_reads_cost_a_handful_of_redis_reads() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("hot", 50, 1).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(2000)
        .build()
        .unwrap();
    let before = stack.redis.command_calls("hgetall").await;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let (http, url) = (http.clone(), stack.url("/flashgate/api/sales/hot"));
        tasks.push(tokio::spawn(async move {
            let r = http
                .get(url)
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }));
    }
    for t in tasks {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            (v["remaining"].as_i64(), v["state"].as_str()),
            (Some(50), Some("open"))
        );
    }
    let elapsed = started.elapsed();
    let reads = stack.redis.command_calls("hgetall").await - before;
    println!("2000 concurrent reads of one sale in {elapsed:?}: {reads} Redis reads");
    // At most one read per TTL (250 ms) that the burst spanned, plus the first.
    let windows = 1 + elapsed.as_millis() as u64 / 250;
    assert!(
        reads >= 1 && reads <= windows + 1,
        "{reads} Redis reads over {windows} TTL windows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_flashgate_demo_signin_the_demo_shop_neither_signs_in_nor_links_to_it() {
    // The test stack starts the demo shop as production would: without
    // FLASHGATE_DEMO_SIGNIN (only `make run` sets it).
    let stack = Stack::start(StackOptions::default()).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = http
        .get(stack.url("/demo/sign-in?next=/flashgate/sales/demo"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert!(
        resp.headers().get("set-cookie").is_none(),
        "no token handed out"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "not_found");
    let home = http.get(stack.url("/")).send().await.unwrap();
    assert_eq!(home.status().as_u16(), 200);
    let home = home.text().await.unwrap();
    assert!(
        home.contains("Demo shop") && !home.contains("/demo/sign-in"),
        "{home}"
    );
}
