//! The shop's own identity against the real stack: tokens signed by an
//! identity provider's keys, read from its JWKS over real HTTP on
//! loopback (a tiny provider in the test, keys made by OpenSSL), and the
//! sign-in cookie with its CSRF check.
//!
//! - Tokens of two rotated keys are accepted; the first token of the new
//!   `kid` fetches the set once, however many arrive together, and more
//!   unknown `kid`s fetch nothing within the refetch interval.
//! - Forged and `alg`-swapped tokens (the RSA public key as an HS256
//!   secret, `alg: none`, another provider's key under a known `kid`, an
//!   HS256 token when only the JWKS is allowed) are refused with 401 and
//!   take nothing.
//! - A buy signed in by cookie: refused with `403 csrf_rejected` from
//!   another site, accepted same-origin (`Origin` / `Sec-Fetch-Site`) and
//!   with `X-Flashgate-CSRF: 1`; a bearer token needs no such proof.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use flashgate_tests::{jwks, token, SigningKey, Stack, StackOptions, JWT_SECRET};
use serde_json::{json, Value};

/// An identity provider serving its JWKS at `/jwks.json`, counting fetches.
struct Provider {
    addr: SocketAddr,
    document: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
}

impl Provider {
    async fn start(keys: &[&SigningKey]) -> Self {
        let document = Arc::new(Mutex::new(jwks(keys)));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (doc, count) = (document.clone(), fetches.clone());
        let app = Router::new().route(
            "/jwks.json",
            get(move || {
                count.fetch_add(1, Ordering::SeqCst);
                let body = doc.lock().unwrap().clone();
                async move { ([("content-type", "application/json")], body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            document,
            fetches,
        }
    }

    /// The provider rotates: it now publishes `keys`.
    fn publish(&self, keys: &[&SigningKey]) {
        *self.document.lock().unwrap() = jwks(keys);
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// Waits until the gateway fetched the set at least once (its start).
    async fn wait_fetched(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.fetches() == 0 {
            assert!(
                Instant::now() < deadline,
                "the gateway never fetched the JWKS"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A stack whose gateway accepts only JWKS tokens of `provider`, and
/// refetches for an unknown `kid` at most every ten minutes (never twice
/// in one test).
async fn stack_of(provider: &Provider) -> Stack {
    let extra_toml = format!(
        "\n[auth]\njwks_url = \"http://{}/jwks.json\"\nalgorithms = [\"RS256\", \"ES256\", \"EdDSA\"]\njwks_refetch_interval_ms = 600000\n",
        provider.addr
    );
    Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await
}

fn claims(user: &str) -> Value {
    json!({"sub": user, "exp": flashgate_common::now_ms() / 1000 + 600})
}

fn buy_url(stack: &Stack, sale: &str) -> String {
    stack.url(&format!("/flashgate/api/sales/{sale}/buy"))
}

/// A buy with `Authorization: Bearer token`; status and JSON body.
async fn buy_with(stack: &Stack, sale: &str, token: &str) -> (u16, Value) {
    send(stack.http.post(buy_url(stack, sale)).bearer_auth(token)).await
}

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.timeout(Duration::from_secs(10)).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_two_rotated_keys_are_accepted_and_an_unknown_kid_is_fetched_once() {
    let (old, new) = (SigningKey::rsa("2026-11"), SigningKey::ec("2026-12"));
    let provider = Provider::start(&[&old]).await;
    let stack = stack_of(&provider).await;
    stack.open_sale("s", 100, 1).await;
    provider.wait_fetched().await;

    let (status, body) = buy_with(&stack, "s", &old.sign(&claims("u-old"))).await;
    assert_eq!(status, 202, "a token of the published key: {body}");
    let before = provider.fetches();

    // The provider rotates; the first tokens of the new key arrive together.
    provider.publish(&[&old, &new]);
    let buys = (0..5).map(|i| {
        let token = new.sign(&claims(&format!("u-new-{i}")));
        let stack = &stack;
        async move { buy_with(stack, "s", &token).await }
    });
    for (status, body) in futures_util::future::join_all(buys).await {
        assert_eq!(status, 202, "a token of the rotated-in key: {body}");
    }
    assert_eq!(
        provider.fetches(),
        before + 1,
        "the unknown kid is fetched once"
    );

    // Both keys go on being accepted from the set, with no fetch.
    let (status, _) = buy_with(&stack, "s", &new.sign(&claims("u-new-9"))).await;
    assert_eq!(status, 202);
    let (status, _) = buy_with(&stack, "s", &old.sign(&claims("u-old-2"))).await;
    assert_eq!(status, 202);

    // A kid the provider never published: refused, and within the refetch
    // interval no fetch however often it is tried.
    let stranger = SigningKey::ed25519("made-up");
    for i in 0..3 {
        let (status, body) =
            buy_with(&stack, "s", &stranger.sign(&claims(&format!("m-{i}")))).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("unauthorized")),
            "{body}"
        );
    }
    assert_eq!(
        provider.fetches(),
        before + 1,
        "unknown kids fetch nothing more"
    );
    assert_eq!(stack.remaining("s").await, 100 - 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_alg_swapped_tokens_are_refused_and_take_nothing() {
    let rsa = SigningKey::rsa("rsa-1");
    let provider = Provider::start(&[&rsa]).await;
    let stack = stack_of(&provider).await;
    stack.open_sale("s", 10, 1).await;
    provider.wait_fetched().await;

    // The RSA public key, as published, used as an HMAC secret.
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("rsa-1".into());
    let swapped = jsonwebtoken::encode(
        &header,
        &claims("mallory"),
        &jsonwebtoken::EncodingKey::from_secret(&rsa.public_pem()),
    )
    .unwrap();
    // alg: none, with the known kid and no signature.
    let b64 = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT", "kid": "rsa-1"})),
        b64(claims("mallory"))
    );
    // Another provider's key under the known kid; an Ed25519 signature
    // under the RSA key's kid; an HS256 token signed with the real secret
    // (HS256 is not in auth.algorithms here).
    let impostor = SigningKey::rsa("rsa-1").sign(&claims("mallory"));
    let cross = SigningKey::ed25519("x").sign_as(&claims("mallory"), Some("rsa-1"));
    let hs256 = token("mallory");
    assert!(!JWT_SECRET.is_empty());
    for (what, bad) in [
        ("alg swapped to HS256", &swapped),
        ("alg none", &none),
        ("another key under a known kid", &impostor),
        ("an EdDSA signature under an RSA kid", &cross),
        ("HS256 when only the JWKS is allowed", &hs256),
    ] {
        let (status, body) = buy_with(&stack, "s", bad).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("unauthorized")),
            "{what}: {body}"
        );
    }
    assert_eq!(stack.remaining("s").await, 10, "nothing was taken");
    // The genuine key still buys.
    let (status, body) = buy_with(&stack, "s", &rsa.sign(&claims("alice"))).await;
    assert_eq!(status, 202, "{body}");
}

/// A stack whose gateway also reads the buyer's token from the `fg_token`
/// cookie (HS256, the test secret).
async fn cookie_stack() -> Stack {
    Stack::start(StackOptions {
        extra_toml: "\n[auth]\ncookie = \"fg_token\"\n".into(),
        ..StackOptions::default()
    })
    .await
}

/// A buy signed in by cookie as `user`, with extra headers.
async fn cookie_buy(stack: &Stack, user: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = stack
        .http
        .post(buy_url(stack, "s"))
        .header("Cookie", format!("theme=dark; fg_token={}", token(user)));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send(req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_signed_cross_site_buy_is_refused_and_same_origin_or_header_buys_pass() {
    let stack = cookie_stack().await;
    stack.open_sale("s", 10, 1).await;
    let own_origin = format!("http://{}", stack.gateway_addr);

    // From another site: a form posting to the buy URL, the browser
    // adding the cookie (with and without Fetch Metadata).
    for headers in [
        &[
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ][..],
        &[("Origin", "https://evil.example")][..],
        &[("Sec-Fetch-Site", "same-site")][..],
        &[][..],
    ] {
        let (status, body) = cookie_buy(&stack, "victim", headers).await;
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert_eq!(body["code"], "csrf_rejected", "{body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(
        stack.remaining("s").await,
        10,
        "no cross-site buy took stock"
    );

    // Same origin, as the browser says with Origin and Fetch Metadata.
    let (status, body) = cookie_buy(
        &stack,
        "same-origin",
        &[("Origin", &own_origin), ("Sec-Fetch-Site", "same-origin")],
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = cookie_buy(&stack, "origin-only", &[("Origin", &own_origin)]).await;
    assert_eq!(status, 202, "{body}");
    // The header a cross-site form cannot send (the sale page's script sends it).
    let (status, body) = cookie_buy(&stack, "header", &[("X-Flashgate-CSRF", "1")]).await;
    assert_eq!(status, 202, "{body}");
    // A bearer token needs no proof: a cross-site page cannot send one.
    let (status, body) = send(
        stack
            .http
            .post(buy_url(&stack, "s"))
            .bearer_auth(token("bearer"))
            .header("Origin", "https://evil.example"),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(stack.remaining("s").await, 10 - 4);
}
