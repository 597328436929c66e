//! Purge by tag (`Surrogate-Key`) across gateways: two real gateways on
//! one real redis-server, a shop in the test that tags its pages, the
//! `flashgate cache purge --tag` binary, and a gateway cut off from Redis's
//! pub/sub while a purge is announced.
//!
//! The shop answers every path `max-age=60`, its body ending `#N` (its
//! count for that path); `/products/ID…` carries `Surrogate-Key:
//! product-ID products`, anything else no tag.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use flashgate_tests::test_shop::TestShop;
use flashgate_tests::{bin, Stack, StackOptions, ADMIN_TOKEN};

async fn answer(req: Request, n: usize) -> Response {
    let path = req.uri().path().to_owned();
    let mut resp = Response::builder()
        .header("cache-control", "max-age=60")
        .header("content-type", "text/plain");
    if let Some(id) = path.strip_prefix("/products/") {
        let id = id.split('/').next().unwrap_or("");
        resp = resp.header("surrogate-key", format!("product-{id} products"));
    }
    resp.body(Body::from(format!("{path} #{n}"))).unwrap()
}

/// A stack whose gateway caches the tagging shop, and a second gateway on
/// the same Redis.
async fn two_gateways() -> (Stack, flashgate_tests::Proc, SocketAddr) {
    let shop = TestShop::start(answer).await.addr;
    let stack = Stack::start(StackOptions {
        extra_toml: format!("[shop]\nupstreams = [\"{shop}\"]\n[shop.cache]\nenabled = true\n"),
        ..StackOptions::default()
    })
    .await;
    let (second, second_addr) = stack.start_second_gateway();
    (stack, second, second_addr)
}

/// One GET: `X-Cache`, whether the tag header reached the client, body.
async fn get(stack: &Stack, addr: SocketAddr, path: &str) -> (String, bool, String) {
    let resp = stack
        .http
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    let x_cache = resp.headers()["x-cache"].to_str().unwrap().to_owned();
    let tagged = resp.headers().contains_key("surrogate-key");
    (x_cache, tagged, resp.text().await.unwrap())
}

async fn x_cache(stack: &Stack, addr: SocketAddr, path: &str) -> String {
    get(stack, addr, path).await.0
}

/// Warms `paths` on both gateways (each holds a cache of its own).
async fn warm(stack: &Stack, second: SocketAddr, paths: &[&str]) {
    for addr in [stack.gateway_addr, second] {
        for path in paths {
            get(stack, addr, path).await;
            assert_eq!(x_cache(stack, addr, path).await, "HIT", "{addr}{path}");
        }
    }
}

/// Waits until `n` clients are subscribed to `fg:events`.
async fn subscribers(stack: &Stack, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, count): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("fg:events")
            .query_async(&mut stack.redis_handle().await)
            .await
            .unwrap();
        if count == n {
            return;
        }
        assert!(Instant::now() < deadline, "{count} subscribed, not {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a command on the test's redis-server.
async fn redis(stack: &Stack, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut stack.redis_handle().await)
        .await
        .unwrap()
}

/// `flashgate --config CONFIG cache purge ARGS`, on the first gateway.
fn cli_purge(stack: &Stack, args: &[&str]) -> Output {
    Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&stack.config_path)
        .args(["cache", "purge"])
        .args(args)
        .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Waits until `path` on `addr` is no longer a hit.
async fn until_not_hit(stack: &Stack, addr: SocketAddr, path: &str, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while x_cache(stack, addr, path).await == "HIT" {
        assert!(Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_purge_on_one_gateway_empties_the_tag_on_both() {
    let (stack, _second, second) = two_gateways().await;
    let pages = [
        "/products/42",
        "/products/42/reviews",
        "/products/43",
        "/about",
    ];
    warm(&stack, second, &pages).await;
    let (_, tagged, _) = get(&stack, stack.gateway_addr, "/products/42").await;
    assert!(!tagged, "the shop's tags are not shown to clients");
    subscribers(&stack, 2).await;

    let out = cli_purge(&stack, &["--tag", "product-42"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "purged 2 cached responses by tag product-42; announced to the other gateways\n"
    );
    until_not_hit(
        &stack,
        second,
        "/products/42",
        "the second gateway kept the tag",
    )
    .await;
    for addr in [stack.gateway_addr, second] {
        assert_eq!(x_cache(&stack, addr, "/products/42/reviews").await, "MISS");
        assert_eq!(
            x_cache(&stack, addr, "/products/43").await,
            "HIT",
            "other tags stay"
        );
        assert_eq!(x_cache(&stack, addr, "/about").await, "HIT");
    }

    // Several tags at once; `products` tags every product page held here:
    // `/products/43` and the reviews fetched again above.
    let out = cli_purge(
        &stack,
        &["--tag", "nothing-has-it", "--tag", "products", "--json"],
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"kind": "tag", "purged": 2, "recorded": true, "announced": true})
    );
    until_not_hit(
        &stack,
        second,
        "/products/43",
        "the second gateway kept `products`",
    )
    .await;
    assert_eq!(x_cache(&stack, stack.gateway_addr, "/about").await, "HIT");

    let metrics = stack.gateway_metrics_text().await;
    assert!(
        metrics.contains("flashgate_shop_cache_purges_total{kind=\"tag\"} 3"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_missed_a_purge_while_away_applies_it_on_reconnect() {
    let (stack, _second, second) = two_gateways().await;
    warm(&stack, second, &["/products/7", "/products/8"]).await;
    subscribers(&stack, 2).await;

    // Cut every subscription and keep it from standing again.
    redis(&stack, &["ACL", "SETUSER", "default", "-subscribe"]).await;
    redis(&stack, &["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    subscribers(&stack, 0).await;
    let out = cli_purge(&stack, &["--tag", "product-7"]);
    assert!(out.status.success(), "{out:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        x_cache(&stack, second, "/products/7").await,
        "HIT",
        "the second gateway heard nothing while away"
    );

    // Back: it reads the purges on record and applies the one it missed.
    redis(&stack, &["ACL", "SETUSER", "default", "+subscribe"]).await;
    subscribers(&stack, 2).await;
    until_not_hit(
        &stack,
        second,
        "/products/7",
        "the missed purge was never applied",
    )
    .await;
    assert_eq!(x_cache(&stack, second, "/products/8").await, "HIT");

    // Away again, and the record is lost meanwhile (Redis lost its data):
    // it cannot prove anything fresh, so it drops every page.
    redis(&stack, &["ACL", "SETUSER", "default", "-subscribe"]).await;
    redis(&stack, &["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    subscribers(&stack, 0).await;
    redis(&stack, &["DEL", "fg:cache:purges"]).await;
    redis(&stack, &["ACL", "SETUSER", "default", "+subscribe"]).await;
    subscribers(&stack, 2).await;
    until_not_hit(
        &stack,
        second,
        "/products/8",
        "a cache that cannot be proven fresh was kept",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_purge_needs_the_admin_token_and_bad_tags_are_refused() {
    let (stack, _second, second) = two_gateways().await;
    warm(&stack, second, &["/products/1"]).await;
    let post = |token: Option<&'static str>, body: &'static str| {
        let mut req = stack
            .http
            .post(format!("http://{}/cache/purge", stack.gateway_admin_addr))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (
                status,
                resp.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    assert_eq!(post(None, r#"{"tag": "product-1"}"#).await.0, 401);
    for bad in [
        r#"{"tag": "a b"}"#,
        r#"{"tag": ""}"#,
        r#"{"tags": []}"#,
        r#"{"tags": "product-1"}"#,
        r#"{"tag": "product-1", "url": "/products/1"}"#,
    ] {
        let (status, body) = post(Some(ADMIN_TOKEN), bad).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(body["code"], "bad_request", "{bad}");
    }
    for addr in [stack.gateway_addr, second] {
        assert_eq!(
            x_cache(&stack, addr, "/products/1").await,
            "HIT",
            "refused purges change nothing"
        );
    }
    let out = cli_purge(&stack, &["--tag", "a b"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("400 Bad Request"));
    let out = cli_purge(&stack, &["--tag", "a", "--url", "/a"]);
    assert!(!out.status.success(), "one kind of target at a time");
}
