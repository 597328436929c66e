//! One test per buy outcome and error of the public API, against the real
//! stack. Every error body is JSON `{code, message}`.

use std::time::Duration;

use flashgate_tests::{random_user, token, token_with, Stack, StackOptions, JWT_SECRET};
use serde_json::Value;

async fn post(
    stack: &Stack,
    path: &str,
    auth: Option<&str>,
    headers: &[(&str, &str)],
    body: &'static str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = stack.http.post(stack.url(path)).body(body);
    if let Some(t) = auth {
        req = req.bearer_auth(t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.timeout(Duration::from_secs(10)).send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

fn assert_error(got: &(u16, reqwest::header::HeaderMap, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{:?}", got.2);
    assert_eq!(got.2["code"], code, "{:?}", got.2);
    assert!(got.2["message"].is_string());
}

/// Status and `WWW-Authenticate` of a request with `authorization`.
async fn challenge(
    stack: &Stack,
    method: reqwest::Method,
    url: &str,
    authorization: Option<&str>,
) -> (u16, Option<String>) {
    let mut req = stack.http.request(method, url);
    if let Some(value) = authorization {
        req = req.header("Authorization", value);
    }
    let resp = req.timeout(Duration::from_secs(10)).send().await.unwrap();
    let value = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), value)
}

/// Every 401 names the scheme that would be accepted (RFC 9110 §11.6.1):
/// `Bearer realm="flashgate"`, with `error="invalid_token"` when a bearer
/// token was sent and refused, and no error code when none was (RFC 6750
/// §3): the buyer API and the admin purge of the gateway, and the admin,
/// gateway and shop APIs of the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_401_carries_a_bearer_challenge_with_invalid_token_only_when_a_token_was_sent() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("auth", 5, 1).await;
    let no_token = Some(r#"Bearer realm="flashgate""#.to_owned());
    let refused = Some(r#"Bearer realm="flashgate", error="invalid_token""#.to_owned());
    let bearer = |t: &str| format!("Bearer {t}");
    let expired = bearer(&token_with("alice", JWT_SECRET, -60));
    let forged = bearer(&token_with(
        "alice",
        "not-the-jwt-secret-but-long-enough-0000",
        60,
    ));
    let wrong = bearer("not-the-right-token-but-long-enough-000000");
    let buy = stack.url("/flashgate/api/sales/auth/buy");
    let purge = format!("http://{}/cache/purge", stack.gateway_admin_addr);
    let admin = stack.admin_url("/admin/sales");
    let internal = format!("http://{}/internal/sales/auth", stack.backend_addr);
    let pay = format!("http://{}/internal/orders/o1/pay", stack.backend_addr);
    let (get, post) = (reqwest::Method::GET, reqwest::Method::POST);
    let cases: [(&reqwest::Method, &str, Option<&str>, &Option<String>); 14] = [
        (&post, &buy, None, &no_token),
        (&post, &buy, Some("Basic YWxpY2U6c2VjcmV0"), &no_token),
        (&post, &buy, Some("Bearer not.a.jwt"), &refused),
        (&post, &buy, Some(&expired), &refused),
        (&post, &buy, Some(&forged), &refused),
        (&post, &purge, None, &no_token),
        (&post, &purge, Some(&wrong), &refused),
        (&get, &admin, None, &no_token),
        (&get, &admin, Some("Basic YWxpY2U6c2VjcmV0"), &no_token),
        (&get, &admin, Some(&wrong), &refused),
        (&get, &internal, None, &no_token),
        (&get, &internal, Some(&wrong), &refused),
        (&post, &pay, None, &no_token),
        (&post, &pay, Some(&wrong), &refused),
    ];
    for (method, url, authorization, expected) in cases {
        let got = challenge(&stack, method.clone(), url, authorization).await;
        assert_eq!(
            got,
            (401, expected.clone()),
            "{method} {url} with {authorization:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_and_input_errors_change_nothing() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("errs", 5, 1).await;
    let path = "/flashgate/api/sales/errs/buy";
    let good = token("alice");

    assert_error(
        &post(&stack, path, None, &[], "").await,
        401,
        "unauthorized",
    );
    assert_error(
        &post(
            &stack,
            path,
            Some(&token_with("alice", "test-secret-not-for-production", -60)),
            &[],
            "",
        )
        .await,
        401,
        "unauthorized",
    );
    assert_error(
        &post(
            &stack,
            path,
            Some(&token_with("alice", "wrong-secret", 60)),
            &[],
            "",
        )
        .await,
        401,
        "unauthorized",
    );
    assert_error(
        &post(&stack, path, Some("not.a.jwt"), &[], "").await,
        401,
        "unauthorized",
    );
    assert_error(
        &post(
            &stack,
            path,
            Some(&good),
            &[("Idempotency-Key", &"k".repeat(65))],
            "",
        )
        .await,
        400,
        "bad_request",
    );
    assert_error(
        &post(&stack, path, Some(&good), &[], "{not json").await,
        400,
        "bad_request",
    );
    assert_error(
        &post(&stack, path, Some(&good), &[], "[1,2]").await,
        400,
        "bad_request",
    );
    let long = format!("/flashgate/api/sales/{}/buy", "x".repeat(200));
    let r = stack
        .http
        .post(stack.url(&long))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let big: &'static str = Box::leak("x".repeat(10_000).into_boxed_str());
    assert_error(
        &post(&stack, path, Some(&good), &[], big).await,
        413,
        "payload_too_large",
    );
    let r = stack.http.get(stack.url(path)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(r.headers()["allow"], "POST");

    assert_eq!(
        stack.remaining("errs").await,
        5,
        "a rejected request changed the stock"
    );
    assert_eq!(stack.stream_len("errs").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_outcomes_have_their_status_codes() {
    let stack = Stack::start(StackOptions::default()).await;
    assert_error(
        &post(
            &stack,
            "/flashgate/api/sales/nosuch/buy",
            Some(&token("a")),
            &[],
            "",
        )
        .await,
        404,
        "not_found",
    );

    stack
        .put_sale(
            "later",
            5,
            1,
            Duration::from_secs(600),
            Duration::from_secs(60),
        )
        .await;
    let r = post(
        &stack,
        "/flashgate/api/sales/later/buy",
        Some(&token("a")),
        &[],
        "",
    )
    .await;
    assert_error(&r, 403, "not_started");
    let retry: u64 = r.1["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((590..=601).contains(&retry), "Retry-After {retry}");

    stack
        .put_sale("brief", 5, 1, Duration::ZERO, Duration::from_millis(1500))
        .await;
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_error(
        &post(
            &stack,
            "/flashgate/api/sales/brief/buy",
            Some(&token("a")),
            &[],
            "",
        )
        .await,
        410,
        "ended",
    );

    stack.open_sale("one", 1, 1).await;
    let win = post(
        &stack,
        "/flashgate/api/sales/one/buy",
        Some(&token("winner")),
        &[("Idempotency-Key", "w1")],
        "",
    )
    .await;
    assert_eq!(
        (win.0, win.2["status"].as_str()),
        (202, Some("queued")),
        "{:?}",
        win.2
    );
    let rid = win.2["reservation_id"].as_str().unwrap().to_owned();
    let order_id = stack.order_id_of("winner", &rid).await;
    // The same key again: the first outcome, now with its order, and no second deduction.
    let replay = post(
        &stack,
        "/flashgate/api/sales/one/buy",
        Some(&token("winner")),
        &[("Idempotency-Key", "w1")],
        "",
    )
    .await;
    assert_eq!(
        (replay.0, replay.2["status"].as_str()),
        (201, Some("confirmed")),
        "{:?}",
        replay.2
    );
    assert_eq!(
        (
            replay.2["reservation_id"].as_str(),
            replay.2["order_id"].as_str()
        ),
        (Some(rid.as_str()), Some(order_id.as_str()))
    );
    assert_eq!(replay.1["idempotent-replayed"], "true");
    assert_error(
        &post(
            &stack,
            "/flashgate/api/sales/one/buy",
            Some(&token("winner")),
            &[("Idempotency-Key", "w2")],
            "",
        )
        .await,
        409,
        "limit_reached",
    );
    assert_error(
        &post(
            &stack,
            "/flashgate/api/sales/one/buy",
            Some(&token("loser")),
            &[],
            "",
        )
        .await,
        410,
        "sold_out",
    );
    assert_eq!(stack.stream_len("one").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_or_stalled_answers_503_and_forwards_nothing() {
    let mut stack = Stack::start(StackOptions {
        redis_timeout_ms: 300,
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("fault", 10, 1).await;

    stack.redis.proc.signal("STOP");
    let r = post(
        &stack,
        "/flashgate/api/sales/fault/buy",
        Some(&token(&random_user())),
        &[],
        "",
    )
    .await;
    assert_error(&r, 503, "unavailable");
    assert!(r.1.contains_key("retry-after"));
    stack.redis.proc.signal("CONT");

    stack.redis.restart(); // no AOF: a fresh, empty Redis is also "not there" for this sale
    let r = post(
        &stack,
        "/flashgate/api/sales/fault/buy",
        Some(&token(&random_user())),
        &[],
        "",
    )
    .await;
    if r.0 == 202 {
        // The backend's recovery restored the sale from its database into
        // the fresh Redis before this buy arrived: it was deducted there,
        // and its one order is the only one.
        assert_eq!(stack.remaining("fault").await, 9, "{r:?}");
        let orders = stack.wait_orders("fault", 1, Duration::from_secs(10)).await;
        assert_eq!(orders.0, 1, "one deduct, one order");
    } else {
        assert!(r.0 == 503 || r.0 == 404, "{r:?}");
        assert_eq!(
            stack.db_orders("fault").await.0,
            0,
            "nothing may be forwarded without a deduct"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_winner_is_queued_when_the_backend_is_down_and_confirmed_from_the_stream() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("queued", 3, 1).await;
    stack.kill_backend();

    let (status, body) = stack.buy("queued", "bob", Some("b1")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (202, Some("queued")),
        "{body}"
    );
    let rid = body["reservation_id"].as_str().unwrap().to_owned();
    let (http, url) = (
        stack.http.clone(),
        stack.url(&format!("/flashgate/api/reservations/{rid}")),
    );
    let look = |user: &'static str| {
        let req = http.get(&url).bearer_auth(token(user));
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(look("bob").await.1["status"], "queued");
    assert_eq!(
        look("mallory").await.0,
        404,
        "another user's reservation is not visible"
    );

    stack.start_backend();
    let (orders, _, _) = stack
        .wait_orders("queued", 1, Duration::from_secs(20))
        .await;
    assert_eq!(orders, 1);
    let (status, body) = look("bob").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("confirmed")),
        "{body}"
    );
    assert!(body["order_id"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sale_state_and_list_report_the_sale() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("shown", 7, 2).await;
    stack.buy("shown", "carol", None).await;
    let v: Value = stack
        .http
        .get(stack.url("/flashgate/api/sales/shown"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            v["state"].as_str(),
            v["stock"].as_i64(),
            v["remaining"].as_i64()
        ),
        (Some("open"), Some(7), Some(6))
    );
    for k in ["starts_at", "ends_at", "server_time"] {
        assert!(v[k].as_str().is_some_and(|t| t.ends_with('Z')), "{k}: {v}");
    }
    let list: Value = stack
        .http
        .get(stack.url("/flashgate/api/sales"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        list["sales"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == "shown"),
        "{list}"
    );
    let r = stack
        .http
        .get(stack.url("/flashgate/api/sales/absent"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_paths_are_proxied_to_the_shop() {
    let stack = Stack::start(StackOptions::default()).await;
    let r = stack
        .http
        .post(stack.url("/echo/cart?item=7"))
        .header("X-Custom", "yes")
        .body("payload")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (
            v["method"].as_str(),
            v["path"].as_str(),
            v["query"].as_str()
        ),
        (Some("POST"), Some("/echo/cart"), Some("item=7"))
    );
    assert_eq!(v["body"], "payload");
    assert_eq!(v["headers"]["x-custom"], "yes");
    assert_eq!(v["headers"]["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_key_of_a_cancelled_order_answers_cancelled_not_confirmed() {
    let stack = Stack::start(StackOptions {
        extra_toml: "expiry_poll_ms = 100\n".into(),
        ..StackOptions::default()
    })
    .await;
    let sale = serde_json::json!({
        "name": "Unpaid", "stock": 1, "starts_at": "2020-01-01T00:00:00Z", "ends_at": "2100-01-01T00:00:00Z",
        "payment_timeout_seconds": 1,
    });
    let (status, body) = stack
        .admin(reqwest::Method::PUT, "/admin/sales/unpaid", Some(sale))
        .await;
    assert_eq!(status, 201, "{body}");
    let win = post(
        &stack,
        "/flashgate/api/sales/unpaid/buy",
        Some(&token("idler")),
        &[("Idempotency-Key", "k1")],
        "",
    )
    .await;
    assert_eq!(win.0, 202, "{:?}", win.2);
    let rid = win.2["reservation_id"].as_str().unwrap().to_owned();
    let order_id = stack.order_id_of("idler", &rid).await;
    // Unpaid past its timeout, the order is cancelled and the item returned.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while stack
        .order_rows("unpaid")
        .await
        .iter()
        .any(|o| o.status != "cancelled")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the order was never cancelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The gateway keeps an order it looked up for a second
    // (`gateway::order_cache`): wait until it reports the cancellation.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let resp = stack
            .http
            .get(stack.url(&format!("/flashgate/api/reservations/{rid}")))
            .bearer_auth(token("idler"))
            .send()
            .await
            .unwrap();
        let (status, body) = (
            resp.status().as_u16(),
            resp.json::<Value>().await.unwrap_or(Value::Null),
        );
        if status == 200 && body["status"] == "cancelled" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway never saw the cancellation: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let replay = post(
        &stack,
        "/flashgate/api/sales/unpaid/buy",
        Some(&token("idler")),
        &[("Idempotency-Key", "k1")],
        "",
    )
    .await;
    assert_error(&replay, 410, "order_cancelled");
    assert_eq!(
        (replay.2["status"].as_str(), replay.2["order_id"].as_str()),
        (Some("cancelled"), Some(order_id.as_str()))
    );
    assert_eq!(replay.1["idempotent-replayed"], "true");
}
