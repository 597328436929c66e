//! The checkout hand-off and the shop's side of an order, end to end on a
//! real stack: a winner's answer carries the sale's `checkout_url` with a
//! `{handoff}` token that a shop-side script, written from
//! docs/CHECKOUT.md alone, verifies with PyJWT; the shop cancels an order
//! and its item is back in Redis and won again, `order.cancelled` reaches
//! the shop's webhook, a payment after the cancellation is `409
//! order_cancelled`; every delivered event verifies with the official
//! Standard Webhooks package (`standardwebhooks` from PyPI).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashgate_tests::python::{run_script, venv};
use flashgate_tests::{random_user, Stack, StackOptions, HANDOFF_SECRET, WEBHOOK_SECRET};
use reqwest::Method;
use serde_json::{json, Value};

const TEMPLATE: &str =
    "https://shop.example/checkout?sale={sale_id}&reservation={reservation_id}&order={order_id}&handoff={handoff}";

/// The shop's check, as docs/CHECKOUT.md writes it: prints the claims, or
/// exits 1 with the reason.
const SHOP_CHECK: &str = r#"
import json, sys
import jwt

token, secret = sys.argv[1], sys.argv[2]
try:
    claims = jwt.decode(
        token,
        secret,
        algorithms=["HS256"],
        audience="flashgate-checkout",
        options={"require": ["exp", "iat", "sub", "sale", "rid"]},
    )
except jwt.InvalidTokenError as e:
    print(f"refused: {e!r}")
    sys.exit(1)
print(json.dumps(claims))
"#;

/// Verifies every delivery in the JSON file argv[2] with the Standard
/// Webhooks library and secret argv[1]; prints each event's type and
/// order, or exits 1 at the first that does not verify.
const VERIFY_EVENTS: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

wh = Webhook(sys.argv[1])
out = []
for d in json.load(open(sys.argv[2])):
    try:
        event = wh.verify(d["body"].encode(), d["headers"])
    except WebhookVerificationError as e:
        print(f"refused {d['headers'].get('webhook-id')}: {e!r}")
        sys.exit(1)
    out.append([event["type"], event["order"]["order_id"]])
print(json.dumps(out))
"#;

fn python(packages: &[&str]) -> std::path::PathBuf {
    venv("checkout-tests", packages)
}

/// The venv both tests share: PyJWT and standardwebhooks.
fn shop_python() -> std::path::PathBuf {
    python(&["PyJWT==2.*", "standardwebhooks==1.*"])
}

async fn put_sale(stack: &Stack, id: &str, stock: i64, checkout_url: Option<&str>) -> (u16, Value) {
    let now = flashgate_common::now_ms();
    let body = json!({
        "name": format!("Sale {id}"), "stock": stock, "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(now - 1000),
        "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        "checkout_url": checkout_url,
    });
    stack
        .admin(Method::PUT, &format!("/admin/sales/{id}"), Some(body))
        .await
}

fn handoff_of(url: &str) -> &str {
    url.split("&handoff=")
        .nth(1)
        .expect("the URL carries the token")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_winner_is_sent_to_checkout_with_a_handoff_the_shop_verifies_from_the_docs() {
    let python = shop_python();
    let stack = Stack::start(StackOptions::default()).await;
    let (status, body) = put_sale(&stack, "drop", 5, Some("https://shop.example/{user}")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("bad_request")),
        "an unknown placeholder is refused: {body}"
    );
    let (status, body) = put_sale(&stack, "drop", 5, Some(TEMPLATE)).await;
    assert_eq!(status, 201, "{body}");

    let user = random_user();
    let (status, body) = stack.buy("drop", &user, Some("k-1")).await;
    assert_eq!(status, 202, "{body}");
    let rid = body["reservation_id"].as_str().unwrap().to_owned();
    let url = body["checkout_url"]
        .as_str()
        .expect("a checkout_url")
        .to_owned();
    assert!(
        url.starts_with(&format!(
            "https://shop.example/checkout?sale=drop&reservation={rid}&order=&handoff="
        )),
        "{url}"
    );

    // The shop, knowing only docs/CHECKOUT.md and the shared key.
    let token = handoff_of(&url);
    let out = run_script(&python, &stack.dir.0, SHOP_CHECK, &[token, HANDOFF_SECRET]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let claims: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(
        (
            &claims["sub"],
            &claims["sale"],
            &claims["rid"],
            &claims["aud"]
        ),
        (
            &json!(user),
            &json!("drop"),
            &json!(rid),
            &json!("flashgate-checkout")
        )
    );
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(lifetime, 600, "gateway.handoff_ttl_seconds defaults to 600");

    // A token signed with another key, or altered, is refused.
    let other = "another-handoff-secret-of-at-least-32-bytes";
    let out = run_script(&python, &stack.dir.0, SHOP_CHECK, &[token, other]);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (head, rest) = token.split_once('.').unwrap();
    let forged_claims = {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut c = claims.clone();
        c["sub"] = json!("mallory");
        b64.encode(serde_json::to_vec(&c).unwrap())
    };
    let forged = format!("{head}.{forged_claims}.{}", rest.split_once('.').unwrap().1);
    let out = run_script(
        &python,
        &stack.dir.0,
        SHOP_CHECK,
        &[&forged, HANDOFF_SECRET],
    );
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Retried once the order exists: 201 with the order id filled in.
    let order = stack.order_id_of(&user, &rid).await;
    let (status, body) = stack.buy("drop", &user, Some("k-1")).await;
    assert_eq!(status, 201, "{body}");
    let url = body["checkout_url"].as_str().expect("a checkout_url");
    assert!(url.contains(&format!("&order={order}&handoff=")), "{url}");

    // A sale without a checkout_url answers as before.
    let (status, body) = put_sale(&stack, "plain", 5, None).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = stack.buy("plain", &random_user(), None).await;
    assert_eq!(status, 202, "{body}");
    assert!(body.get("checkout_url").is_none(), "{body}");
}

/// One webhook request as the shop got it.
#[derive(Clone, Debug, serde::Serialize)]
struct Delivery {
    headers: std::collections::HashMap<String, String>,
    body: String,
}

/// A webhook on 127.0.0.1:0 that takes every event and records it.
async fn webhook() -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let log = log.clone();
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let log = log.clone();
                async move {
                    let headers = headers
                        .iter()
                        .filter_map(|(k, v)| {
                            Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))
                        })
                        .collect();
                    log.lock().unwrap().push(Delivery {
                        headers,
                        body: String::from_utf8_lossy(&body).into_owned(),
                    });
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook"), log)
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shop_cancel_returns_the_item_sends_order_cancelled_and_refuses_a_later_payment() {
    let python = shop_python();
    let (url, log) = webhook().await;
    let stack = Stack::start(StackOptions {
        extra_toml: format!(
            "[events]\nwebhook_url = \"{url}\"\nbackoff_initial_ms = 50\nbackoff_max_ms = 400\npoll_ms = 50\n"
        ),
        ..StackOptions::default()
    })
    .await;
    let (status, body) = put_sale(&stack, "one", 1, Some(TEMPLATE)).await;
    assert_eq!(status, 201, "{body}");

    // The only item: won, then the sale is sold out.
    let (alice, bob) = (random_user(), random_user());
    let (status, body) = stack.buy("one", &alice, None).await;
    assert_eq!(status, 202, "{body}");
    let order = stack
        .order_id_of(&alice, body["reservation_id"].as_str().unwrap())
        .await;
    let (status, body) = stack.buy("one", &bob, None).await;
    assert_eq!(status, 410, "{body}");

    // The shop cancels: the item is back in Redis, once, however often it
    // asks.
    let cancel = format!("/internal/orders/{order}/cancel");
    let (status, body) = stack.backend_post(&cancel).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let (status, body) = stack.backend_post(&cancel).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    wait_for(
        "the item back in Redis",
        Duration::from_secs(10),
        async || stack.remaining("one").await == 1,
    )
    .await;

    // It can be won again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let bobs = loop {
        let (status, body) = stack.buy("one", &bob, None).await;
        if status == 202 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the returned item is not won: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(stack.remaining("one").await, 0, "returned once, sold once");
    let bobs_order = stack
        .order_id_of(&bob, bobs["reservation_id"].as_str().unwrap())
        .await;

    // A payment after the cancellation: 409, the shop refunds it.
    let (status, body) = stack
        .backend_post(&format!("/internal/orders/{order}/pay"))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("order_cancelled")),
        "{body}"
    );
    // A paid order cannot be cancelled; an unknown one is not found.
    let (status, body) = stack
        .backend_post(&format!("/internal/orders/{bobs_order}/pay"))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = stack
        .backend_post(&format!("/internal/orders/{bobs_order}/cancel"))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("order_paid")),
        "{body}"
    );
    let (status, _) = stack
        .backend_post("/internal/orders/o-00000000000000000000000000000000/cancel")
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        stack.remaining("one").await,
        0,
        "a refused cancel returns nothing"
    );

    // The shop hears of it: order.cancelled among events that all verify
    // with the Standard Webhooks library.
    let kinds = |log: &Arc<Mutex<Vec<Delivery>>>| {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(&d.body).ok())
            .map(|v| {
                (
                    v["type"].as_str().unwrap_or("").to_owned(),
                    v["order"]["order_id"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    wait_for(
        "order.cancelled and bob's order.paid",
        Duration::from_secs(20),
        async || {
            let seen = kinds(&log);
            seen.contains(&("order.cancelled".into(), json!(order)))
                && seen.contains(&("order.paid".into(), json!(bobs_order)))
        },
    )
    .await;
    let deliveries = log.lock().unwrap().clone();
    let file = &stack.dir.0.join("deliveries.json");
    std::fs::write(file.as_path(), serde_json::to_vec(&deliveries).unwrap()).unwrap();
    let out = run_script(
        &python,
        &stack.dir.0,
        VERIFY_EVENTS,
        &[WEBHOOK_SECRET, file.to_str().unwrap()],
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verified: Vec<(String, String)> = serde_json::from_str(&printed).unwrap();
    assert_eq!(verified.len(), deliveries.len());
    assert_eq!(
        verified
            .iter()
            .filter(|(kind, o)| kind == "order.cancelled" && *o == order)
            .count(),
        1,
        "one order.cancelled for the cancelled order: {verified:?}"
    );
    assert!(
        !verified
            .iter()
            .any(|(kind, o)| kind == "order.cancelled" && *o == bobs_order),
        "{verified:?}"
    );

    // A body changed in transit does not verify.
    let mut tampered = deliveries[0].clone();
    tampered.body = tampered.body.replacen("order.", "order_", 1);
    std::fs::write(file.as_path(), serde_json::to_vec(&[tampered]).unwrap()).unwrap();
    let out = run_script(
        &python,
        &stack.dir.0,
        VERIFY_EVENTS,
        &[WEBHOOK_SECRET, file.to_str().unwrap()],
    );
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
