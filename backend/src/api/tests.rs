//! API tests: the real routers driven with `oneshot`, over a real
//! redis-server and a SQLite file.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use flashgate_common::keys::{SaleKeys, SALES_INDEX};
use flashgate_common::reservation::Reservation;
use http_body_util::BodyExt;
use redis::AsyncCommands;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::*;
use crate::testing::{reservation, sqlite_url, unique, RedisServer};

const TOKEN: &str = "test-admin-token";
/// The gateways' token on the order API.
const GATEWAY: &str = "gateway-token-of-the-api-tests-0123456789";
/// The shop's token for payments.
const SHOP: &str = "shop-token-of-the-api-tests-0123456789abc";

struct Fixture {
    redis: RedisServer,
    state: AppState,
}

async fn fixture() -> Fixture {
    let redis = RedisServer::start().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let conn = crate::redis_io::shared_connection(&redis.config())
        .await
        .unwrap();
    let state = AppState::new(
        store,
        conn,
        auth::ApiTokens::new(TOKEN, GATEWAY, SHOP).unwrap(),
        std::time::Duration::from_secs(600),
    );
    Fixture { redis, state }
}

async fn call(
    router: Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let request = request
        .body(Body::from(body.unwrap_or("").to_owned()))
        .unwrap();
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{method} {uri}: body is not JSON: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, value)
}

fn sale_body(stock: i64) -> String {
    json!({"name": "Sneaker", "stock": stock, "starts_at": "2020-01-01T00:00:00Z", "ends_at": "2100-01-01T00:00:00Z"}).to_string()
}

async fn admin(f: &Fixture, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    call(
        admin_router(f.state.clone()),
        method,
        uri,
        Some(TOKEN),
        body,
    )
    .await
}

/// Forwards `winners` as one gateway batch; answers the
/// `(created, existing, rejected)` counts.
async fn forward(f: &Fixture, winners: &[&Reservation]) -> (u64, u64, u64) {
    let body: Vec<Value> = winners
        .iter()
        .map(|r| json!({"reservation_id": r.reservation_id, "sale_id": r.sale_id, "user_id": r.user_id, "reserved_at_ms": r.reserved_at_ms, "request_id": "q"}))
        .collect();
    let body = Value::from(body).to_string();
    let (status, reply) = call(
        order_router(f.state.clone()),
        "POST",
        "/internal/orders/batch",
        Some(GATEWAY),
        Some(&body),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let count = |k: &str| reply[k].as_u64().unwrap();
    (count("created"), count("existing"), count("rejected"))
}

/// What the deduct script leaves in Redis for a winner (stream aside).
async fn reserve_in_redis(f: &Fixture, r: &Reservation) {
    let mut conn = f.redis.conn().await;
    let () = conn
        .hset(
            SaleKeys::new(&r.sale_id).reservations,
            &r.reservation_id,
            &r.user_id,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn admin_routes_require_the_bearer_token() {
    let f = fixture().await;
    for (token, uri) in [
        (None, "/admin/sales"),
        (Some("wrong"), "/admin/sales"),
        (None, "/admin/nowhere"),
    ] {
        let (status, body) = call(admin_router(f.state.clone()), "GET", uri, token, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(body["code"], "unauthorized");
    }
    let (status, body) = call(
        admin_router(f.state.clone()),
        "PUT",
        "/admin/sales/x",
        None,
        Some(&sale_body(1)),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    assert_eq!(f.state.store.sales().get("x").await.unwrap(), None);
    let (status, _) = admin(&f, "GET", "/admin/sales", None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn put_creates_the_sale_and_preheats_redis() {
    let f = fixture().await;
    let id = unique("s");
    let (status, view) = admin(
        &f,
        "PUT",
        &format!("/admin/sales/{id}"),
        Some(&sale_body(50)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    assert_eq!(view["stock"], 50);
    assert_eq!(view["per_user_limit"], 1);
    assert_eq!(view["remaining"], 50);
    assert_eq!(view["state"], "open");
    assert_eq!(view["starts_at"], "2020-01-01T00:00:00.000Z");
    assert_eq!(
        (
            view["orders"].as_i64(),
            view["reservations"].as_i64(),
            view["pending"].as_i64()
        ),
        (Some(0), Some(0), Some(0))
    );

    let keys = SaleKeys::new(&id);
    let mut conn = f.redis.conn().await;
    let meta: std::collections::HashMap<String, String> = conn.hgetall(&keys.meta).await.unwrap();
    assert_eq!(meta["stock"], "50");
    assert_eq!(meta["paused"], "0");
    assert_eq!(meta["starts_at_ms"], "1577836800000");
    let remaining: i64 = conn.get(&keys.remaining).await.unwrap();
    assert_eq!(remaining, 50);
    assert!(conn
        .sismember::<_, _, bool>(SALES_INDEX, &id)
        .await
        .unwrap());
    let groups: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&keys.stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(groups.len(), 1, "the consumer group exists");

    let (status, view) = admin(
        &f,
        "PUT",
        &format!("/admin/sales/{id}"),
        Some(&sale_body(60)),
    )
    .await;
    assert_eq!(
        (status, view["remaining"].as_i64()),
        (StatusCode::OK, Some(60))
    );
    let (status, list) = admin(&f, "GET", "/admin/sales", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
}

#[tokio::test]
async fn put_with_stock_below_sold_is_refused_and_changes_nothing() {
    let f = fixture().await;
    let id = unique("s");
    let uri = format!("/admin/sales/{id}");
    admin(&f, "PUT", &uri, Some(&sale_body(5))).await;
    // Three items sold by the gateway.
    let mut conn = f.redis.conn().await;
    let keys = SaleKeys::new(&id);
    let () = conn.decr(&keys.remaining, 3).await.unwrap();

    let (status, body) = admin(&f, "PUT", &uri, Some(&sale_body(2))).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("stock_below_sold")),
        "{body}"
    );
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        5
    );
    let stock: String = conn.hget(&keys.meta, "stock").await.unwrap();
    let remaining: i64 = conn.get(&keys.remaining).await.unwrap();
    assert_eq!((stock.as_str(), remaining), ("5", 2));

    let (status, view) = admin(&f, "PUT", &uri, Some(&sale_body(3))).await;
    assert_eq!(
        (status, view["remaining"].as_i64(), view["state"].as_str()),
        (StatusCode::OK, Some(0), Some("sold_out"))
    );
}

#[tokio::test]
async fn put_preheats_an_absent_sale_minus_the_orders_already_made() {
    let f = fixture().await;
    let id = unique("s");
    f.state
        .store
        .orders()
        .insert(&[reservation(&id, "a"), reservation(&id, "b")])
        .await
        .unwrap();
    let (status, view) = admin(
        &f,
        "PUT",
        &format!("/admin/sales/{id}"),
        Some(&sale_body(10)),
    )
    .await;
    assert_eq!(
        (status, view["remaining"].as_i64(), view["orders"].as_i64()),
        (StatusCode::CREATED, Some(8), Some(2))
    );
    let (status, body) = admin(
        &f,
        "PUT",
        &format!("/admin/sales/{}", unique("t")),
        Some(&sale_body(10)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn put_rejects_bad_bodies_naming_the_field() {
    let f = fixture().await;
    let uri = format!("/admin/sales/{}", unique("s"));
    let cases = [
        (
            r#"{"name":"x","stock":1,"starts_at":"2100-01-01T00:00:00Z","ends_at":"2020-01-01T00:00:00Z"}"#,
            "ends_at",
        ),
        (
            r#"{"name":"x","stock":1,"starts_at":"tomorrow","ends_at":"2020-01-01T00:00:00Z"}"#,
            "starts_at",
        ),
        (
            r#"{"name":"x","stock":-1,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2100-01-01T00:00:00Z"}"#,
            "stock",
        ),
        (
            r#"{"name":"x","stock":1,"per_user_limit":0,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2100-01-01T00:00:00Z"}"#,
            "per_user_limit",
        ),
        (
            r#"{"name":"x","stock":1,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2100-01-01T00:00:00Z","extra":1}"#,
            "extra",
        ),
        (r#"{"name": "#, "invalid JSON"),
    ];
    for (body, field) in cases {
        let (status, reply) = admin(&f, "PUT", &uri, Some(body)).await;
        assert_eq!(
            (status, reply["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_request")),
            "{body}"
        );
        assert!(
            reply["message"].as_str().unwrap().contains(field),
            "{field}: {reply}"
        );
    }
    let (status, _) = admin(&f, "PUT", "/admin/sales/bad%20id", Some(&sale_body(1))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = admin(&f, "GET", "/admin/sales/unknown", None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
}

#[tokio::test]
async fn a_forwarded_reservation_unknown_to_redis_is_rejected_and_writes_nothing() {
    let f = fixture().await;
    let r = reservation(&unique("s"), "alice");
    assert_eq!(forward(&f, &[&r]).await, (0, 0, 1));

    // Known in Redis, but for another user, or claimed under another sale.
    reserve_in_redis(&f, &r).await;
    let mut other_user = r.clone();
    other_user.user_id = "mallory".into();
    assert_eq!(forward(&f, &[&other_user]).await, (0, 0, 1));
    let mut other_sale = r.clone();
    other_sale.sale_id = unique("t");
    assert_eq!(forward(&f, &[&other_sale]).await, (0, 0, 1));
    assert_eq!(
        f.state
            .store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_refused_copy_of_a_reservation_does_not_shadow_its_valid_copy_later_in_the_batch() {
    let f = fixture().await;
    let r = reservation(&unique("s"), "alice");
    reserve_in_redis(&f, &r).await;
    let mut forged = r.clone();
    forged.user_id = "mallory".into();
    assert_eq!(forward(&f, &[&forged, &r, &r]).await, (1, 0, 0));
    let order = f
        .state
        .store
        .orders()
        .by_reservation(&r.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(order.user_id, "alice");
    assert_eq!(
        forward(&f, &[&forged]).await,
        (0, 0, 1),
        "alone, the forged copy is refused"
    );
}

#[tokio::test]
async fn forwarding_a_reservation_twice_writes_one_order() {
    let f = fixture().await;
    let r = reservation(&unique("s"), "alice");
    reserve_in_redis(&f, &r).await;
    assert_eq!(forward(&f, &[&r]).await, (1, 0, 0));
    assert_eq!(forward(&f, &[&r]).await, (0, 1, 0));

    let uri = format!("/internal/reservations/{}", r.reservation_id);
    let (status, found) = call(
        order_router(f.state.clone()),
        "GET",
        &uri,
        Some(GATEWAY),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (found["status"].as_str(), found["reservation_id"].as_str()),
        (Some("confirmed"), Some(r.reservation_id.as_str()))
    );
}

#[tokio::test]
async fn order_api_errors_are_json() {
    let f = fixture().await;
    let router = || order_router(f.state.clone());
    let (status, body) = call(
        router(),
        "POST",
        "/internal/orders/batch",
        Some(GATEWAY),
        Some("{not json"),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let (status, body) = call(
        router(),
        "POST",
        "/internal/orders/batch",
        Some(GATEWAY),
        Some(r#"[{"reservation_id": 5}]"#),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let (status, body) = call(
        router(),
        "GET",
        "/internal/reservations/nope",
        Some(GATEWAY),
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = call(router(), "GET", "/nowhere", None, None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = call(
        router(),
        "GET",
        "/internal/orders/batch",
        Some(GATEWAY),
        None,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"))
    );
    let (status, body) = call(router(), "GET", "/healthz", None, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
}

#[tokio::test]
async fn orders_answer_503_when_redis_is_down() {
    let Fixture { redis, state } = fixture().await;
    drop(redis);
    let r = reservation(&unique("s"), "alice");
    let body =
        json!([{"reservation_id": r.reservation_id, "sale_id": r.sale_id, "user_id": r.user_id, "reserved_at_ms": r.reserved_at_ms}])
            .to_string();
    let (status, reply) = call(
        order_router(state.clone()),
        "POST",
        "/internal/orders/batch",
        Some(GATEWAY),
        Some(&body),
    )
    .await;
    assert_eq!(
        (status, reply["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
    // The admin view still answers from the database, with Redis counters null.
    let id = unique("s");
    state
        .store
        .sales()
        .upsert(&crate::testing::sale(&id, 3))
        .await
        .unwrap();
    let (status, view) = call(
        admin_router(state),
        "GET",
        &format!("/admin/sales/{id}"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(
        (status, view["remaining"].is_null(), view["orders"].as_i64()),
        (StatusCode::OK, true, Some(0))
    );
}

#[tokio::test]
async fn a_forward_batch_naming_one_reservation_twice_writes_it_once() {
    let f = fixture().await;
    let r = reservation(&unique("s"), "alice");
    reserve_in_redis(&f, &r).await;
    let winner = json!({"reservation_id": r.reservation_id, "sale_id": r.sale_id, "user_id": r.user_id, "reserved_at_ms": r.reserved_at_ms, "request_id": "q"});
    let body = json!([winner, winner]).to_string();
    let (status, reply) = call(
        order_router(f.state.clone()),
        "POST",
        "/internal/orders/batch",
        Some(GATEWAY),
        Some(&body),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        (
            reply["created"].as_u64(),
            reply["existing"].as_u64(),
            reply["rejected"].as_u64()
        ),
        (Some(1), Some(0), Some(0))
    );
    assert!(f
        .state
        .store
        .orders()
        .by_reservation(&r.reservation_id)
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn order_routes_require_their_own_bearer_token_and_change_nothing_without_it() {
    let f = fixture().await;
    let r = reservation(&unique("s"), "alice");
    reserve_in_redis(&f, &r).await;
    let winner = json!([{"reservation_id": r.reservation_id, "sale_id": r.sale_id, "user_id": r.user_id, "reserved_at_ms": r.reserved_at_ms}]);
    let unpaid = reservation(&r.sale_id, "bob");
    f.state
        .store
        .orders()
        .insert(std::slice::from_ref(&unpaid))
        .await
        .unwrap();
    let order_id = f
        .state
        .store
        .orders()
        .by_reservation(&unpaid.reservation_id)
        .await
        .unwrap()
        .unwrap()
        .order_id;

    let batch = winner.to_string();
    let lookup = format!("/internal/reservations/{}", unpaid.reservation_id);
    let sale = format!("/internal/sales/{}", r.sale_id);
    let pay = format!("/internal/orders/{order_id}/pay");
    let gateway_routes = [
        ("POST", "/internal/orders/batch", Some(batch.as_str())),
        ("GET", lookup.as_str(), None),
        ("GET", sale.as_str(), None),
    ];
    for token in [
        None,
        Some("wrong"),
        Some(SHOP),
        Some(TOKEN),
        Some(&GATEWAY[..GATEWAY.len() - 1]),
    ] {
        for (method, uri, body) in gateway_routes {
            let (status, reply) =
                call(order_router(f.state.clone()), method, uri, token, body).await;
            assert_eq!(
                (status, reply["code"].as_str()),
                (StatusCode::UNAUTHORIZED, Some("unauthorized")),
                "{method} {uri} with {token:?}"
            );
        }
    }
    for token in [None, Some("wrong"), Some(GATEWAY), Some(TOKEN)] {
        let (status, reply) = call(order_router(f.state.clone()), "POST", &pay, token, None).await;
        assert_eq!(
            (status, reply["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized")),
            "pay with {token:?}"
        );
    }
    assert_eq!(
        f.state
            .store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap(),
        None,
        "no order was written"
    );
    let order = f
        .state
        .store
        .orders()
        .get(&order_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        order.status,
        crate::store::OrderStatus::Created,
        "an unauthenticated payment paid nothing"
    );

    // The right token works.
    let (status, reply) = call(
        order_router(f.state.clone()),
        "POST",
        &pay,
        Some(SHOP),
        None,
    )
    .await;
    assert_eq!(
        (status, reply["status"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{reply}"
    );
    let (status, reply) = call(
        order_router(f.state.clone()),
        "POST",
        "/internal/orders/batch",
        Some(GATEWAY),
        Some(&batch),
    )
    .await;
    assert_eq!(
        (status, reply["created"].as_u64()),
        (StatusCode::OK, Some(1)),
        "{reply}"
    );
    let (status, _) = call(
        order_router(f.state.clone()),
        "GET",
        &lookup,
        Some(GATEWAY),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, reply) = call(
        order_router(f.state.clone()),
        "GET",
        &sale,
        Some(GATEWAY),
        None,
    )
    .await;
    assert_eq!(
        (status, reply["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "the sale is not in the database"
    );
}

/// `calls` of `command` in INFO commandstats.
async fn command_calls(f: &Fixture, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn scrape(f: &Fixture) -> String {
    let request = Request::builder()
        .uri("/metrics")
        .body(Body::empty())
        .unwrap();
    let response = order_router(f.state.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap()
}

#[tokio::test]
async fn scraping_metrics_costs_no_redis_call_the_background_refresh_fills_the_gauges() {
    let f = fixture().await;
    let sales: Vec<String> = (0..3).map(|_| unique("s")).collect();
    for id in &sales {
        assert_eq!(
            admin(
                &f,
                "PUT",
                &format!("/admin/sales/{id}"),
                Some(&sale_body(50))
            )
            .await
            .0,
            StatusCode::CREATED
        );
    }
    let counted = ["get", "xinfo|groups", "smembers", "sismember", "exists"];
    let mut before = Vec::new();
    for c in counted {
        before.push(command_calls(&f, c).await);
    }
    for _ in 0..20 {
        scrape(&f).await;
    }
    for (c, n) in counted.iter().zip(before) {
        assert_eq!(command_calls(&f, c).await, n, "a scrape called {c}");
    }

    crate::metrics::refresh_sales(&mut f.redis.conn().await, &f.state.store, &f.state.metrics)
        .await
        .unwrap();
    let text = scrape(&f).await;
    for id in &sales {
        assert!(
            text.contains(&format!(
                "flashgate_sale_remaining_items{{sale=\"{id}\"}} 50"
            )),
            "{text}"
        );
    }
    // An archived sale is no longer read, and its gauges go.
    let () = redis::cmd("SADD")
        .arg(flashgate_common::keys::ARCHIVED_SALES)
        .arg(&sales[0])
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    let xinfo = command_calls(&f, "xinfo|groups").await;
    crate::metrics::refresh_sales(&mut f.redis.conn().await, &f.state.store, &f.state.metrics)
        .await
        .unwrap();
    assert_eq!(
        command_calls(&f, "xinfo|groups").await - xinfo,
        2,
        "one XINFO per live sale"
    );
    assert!(!scrape(&f).await.contains(&format!("sale=\"{}\"", sales[0])));
}

/// Makes `SREM fg:archived` fail (`WRONGTYPE`) on a real Redis.
async fn break_archived_set(f: &Fixture) {
    let () = redis::cmd("SET")
        .arg(flashgate_common::keys::ARCHIVED_SALES)
        .arg("not a set")
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dead_letter_stays_put_when_its_sale_cannot_be_made_live() {
    let f = fixture().await;
    let id = unique("s");
    let keys = SaleKeys::new(&id);
    let mut conn = f.redis.conn().await;
    let entry: String = conn
        .xadd(
            &keys.dead,
            "*",
            &[("rid", "x"), ("dead_error", "e"), ("dead_source_id", "1-0")],
        )
        .await
        .unwrap();
    break_archived_set(&f).await;
    let (status, _) = admin(
        &f,
        "POST",
        &format!("/admin/sales/{id}/dead-letters/{entry}/retry"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let dead: i64 = conn.xlen(&keys.dead).await.unwrap();
    let requeued: i64 = conn.xlen(&keys.stream).await.unwrap();
    assert_eq!((dead, requeued), (1, 0), "nothing moved");
}

#[tokio::test]
async fn a_sale_change_that_cannot_unarchive_the_sale_answers_503() {
    let f = fixture().await;
    let id = unique("s");
    assert_eq!(
        admin(
            &f,
            "PUT",
            &format!("/admin/sales/{id}"),
            Some(&sale_body(5))
        )
        .await
        .0,
        StatusCode::CREATED
    );
    break_archived_set(&f).await;
    let (status, body) = admin(
        &f,
        "PUT",
        &format!("/admin/sales/{id}"),
        Some(&sale_body(6)),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
        "{body}"
    );
    // Refused before anything changed: Redis never sells by a definition
    // whose sale nobody consumes.
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        5
    );
    let mut conn = f.redis.conn().await;
    let stock: i64 = redis::cmd("HGET")
        .arg(SaleKeys::new(&id).meta)
        .arg("stock")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stock, 5);
}

#[tokio::test]
async fn the_drift_gauge_of_an_archived_sale_goes_with_its_other_gauges() {
    let f = fixture().await;
    let id = unique("s");
    assert_eq!(
        admin(
            &f,
            "PUT",
            &format!("/admin/sales/{id}"),
            Some(&sale_body(5))
        )
        .await
        .0,
        StatusCode::CREATED
    );
    let mut conn = f.redis.conn().await;
    crate::reconcile::reconcile_all(&mut conn, &f.state.store, &f.state.drift)
        .await
        .unwrap();
    let label = format!("flashgate_reconcile_stock_drift{{sale=\"{id}\"}}");
    assert!(scrape(&f).await.contains(&label));

    let () = redis::cmd("SADD")
        .arg(flashgate_common::keys::ARCHIVED_SALES)
        .arg(&id)
        .query_async(&mut conn)
        .await
        .unwrap();
    crate::reconcile::reconcile_all(&mut conn, &f.state.store, &f.state.drift)
        .await
        .unwrap();
    crate::metrics::refresh_sales(&mut conn, &f.state.store, &f.state.metrics)
        .await
        .unwrap();
    let text = scrape(&f).await;
    assert!(!text.contains(&format!("sale=\"{id}\"")), "{text}");
}

fn bucketed_body(stock: i64, buckets: i64) -> String {
    json!({"name": "Sneaker", "stock": stock, "starts_at": "2020-01-01T00:00:00Z", "ends_at": "2100-01-01T00:00:00Z", "buckets": buckets})
        .to_string()
}

/// A new bucketed sale of `stock` over `buckets`, created through the
/// admin API; its id and admin path.
async fn created_bucketed(f: &Fixture, stock: i64, buckets: i64) -> (String, String) {
    let id = unique("b");
    let uri = format!("/admin/sales/{id}");
    let (status, view) = admin(f, "PUT", &uri, Some(&bucketed_body(stock, buckets))).await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    (id, uri)
}

#[tokio::test]
async fn a_bucketed_sale_is_preheated_bucket_by_bucket_and_a_new_stock_is_spread_over_its_buckets()
{
    let f = fixture().await;
    let id = unique("b");
    let uri = format!("/admin/sales/{id}");
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(10, 4))).await;
    assert_eq!(
        (status, view["buckets"].as_i64(), view["remaining"].as_i64()),
        (StatusCode::CREATED, Some(4), Some(10)),
        "{view}"
    );
    let mut conn = f.redis.conn().await;
    let own = SaleKeys::new(&id);
    let meta: std::collections::HashMap<String, String> = conn.hgetall(&own.meta).await.unwrap();
    assert_eq!(
        (meta["buckets"].as_str(), meta["stock"].as_str()),
        ("4", "10")
    );
    assert_eq!(
        conn.get::<_, i64>(&own.remaining).await.unwrap(),
        0,
        "nothing sells from the sale's own keys"
    );
    for (k, share) in [(0, 3), (1, 3), (2, 2), (3, 2)] {
        let keys = SaleKeys::bucket(&id, k);
        assert_eq!(
            conn.get::<_, i64>(&keys.remaining).await.unwrap(),
            share,
            "bucket {k}"
        );
        let meta: std::collections::HashMap<String, String> =
            conn.hgetall(&keys.meta).await.unwrap();
        assert_eq!(
            (
                meta["bucket"].as_str(),
                meta["buckets"].as_str(),
                meta["paused"].as_str()
            ),
            (k.to_string().as_str(), "4", "0")
        );
        let groups: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&keys.stream)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            groups.len(),
            1,
            "bucket {k}'s stream has the consumer group"
        );
    }

    // A pause reaches every bucket's copy of the definition.
    let (status, _) = admin(&f, "POST", &format!("{uri}/pause"), None).await;
    assert_eq!(status, StatusCode::OK);
    for k in 0..4 {
        let paused: String = conn
            .hget(SaleKeys::bucket(&id, k).meta, "paused")
            .await
            .unwrap();
        assert_eq!(paused, "1", "bucket {k}");
    }

    // A new stock is spread over the buckets like a preheat: 2 more items
    // go one each to buckets 0 and 1.
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(12, 4))).await;
    assert_eq!(
        (status, view["stock"].as_i64(), view["remaining"].as_i64()),
        (StatusCode::OK, Some(12), Some(12)),
        "{view}"
    );
    for (k, share) in [(0, 4), (1, 4), (2, 2), (3, 2)] {
        let keys = SaleKeys::bucket(&id, k);
        assert_eq!(
            conn.get::<_, i64>(&keys.remaining).await.unwrap(),
            share,
            "bucket {k}"
        );
        assert_eq!(
            conn.hget::<_, _, i64>(&keys.meta, "stock").await.unwrap(),
            share,
            "bucket {k}'s base"
        );
    }
    assert_eq!(
        conn.get::<_, i64>(&own.remaining).await.unwrap(),
        0,
        "still nothing sells from the sale's own keys"
    );
    assert_eq!(
        conn.hget::<_, _, i64>(&own.meta, "stock").await.unwrap(),
        12
    );
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        12
    );

    // The bucket count stays, and nothing changes.
    let (status, body) = admin(&f, "PUT", &uri, Some(&bucketed_body(12, 2))).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("buckets_fixed")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().starts_with("buckets:"),
        "{body}"
    );
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        12
    );
    assert_eq!(
        conn.get::<_, i64>(SaleKeys::bucket(&id, 0).remaining)
            .await
            .unwrap(),
        4
    );

    // Reconciled like a sale, bucket by bucket: nothing sold, no drift.
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (
            report["stock"].as_i64(),
            report["remaining"].as_i64(),
            report["drift"].as_i64(),
            report["bases_moved"].as_i64()
        ),
        (Some(12), Some(12), Some(0), Some(0)),
        "{report}"
    );

    // Out of range, named.
    let (status, body) = admin(
        &f,
        "PUT",
        &format!("/admin/sales/{}", unique("b")),
        Some(&bucketed_body(10, 65)),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().starts_with("buckets:"),
        "{body}"
    );
}

/// Each bucket's (base, remaining) of bucketed sale `id`.
async fn bucket_books(
    conn: &mut redis::aio::MultiplexedConnection,
    id: &str,
    buckets: u32,
) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for k in 0..buckets {
        let keys = SaleKeys::bucket(id, k);
        out.push((
            conn.hget(&keys.meta, "stock").await.unwrap(),
            conn.get(&keys.remaining).await.unwrap(),
        ));
    }
    out
}

#[tokio::test]
async fn a_bucketed_sale_lowered_below_its_unsold_items_is_refused_and_nothing_changes() {
    let f = fixture().await;
    let (id, uri) = created_bucketed(&f, 10, 4).await;
    let mut conn = f.redis.conn().await;
    // Bucket 0's 3 items are sold, and 1 of bucket 1's is in transit to
    // bucket 2 (taken from bucket 1, not added to bucket 2 yet): 6 unsold
    // items are left that a decrease can take (2 + 2 + 2).
    let b0 = SaleKeys::bucket(&id, 0);
    let () = conn.set(&b0.remaining, 0).await.unwrap();
    let () = conn
        .hset_multiple(
            &b0.reservations,
            &[("r1", "u1"), ("r2", "u2"), ("r3", "u3")],
        )
        .await
        .unwrap();
    assert_eq!(
        flashgate_common::transfer::take(&mut conn, &id, 1, 2, "x1", 1)
            .await
            .unwrap(),
        flashgate_common::transfer::Taken::Moved(1)
    );
    let before = bucket_books(&mut conn, &id, 4).await;
    assert_eq!(before, vec![(3, 0), (3, 2), (2, 2), (2, 2)]);

    // 10 → 3 needs 7 unsold items: refused as a sale's stock below what is
    // sold is, and nothing changed anywhere.
    let (status, body) = admin(&f, "PUT", &uri, Some(&bucketed_body(3, 4))).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("stock_below_sold")),
        "{body}"
    );
    assert_eq!(
        body["message"].as_str(),
        Some("stock: 3 is below the 4 items already sold"),
        "{body}"
    );
    assert_eq!(
        bucket_books(&mut conn, &id, 4).await,
        before,
        "every bucket's base and remaining as before"
    );
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        10
    );
    assert_eq!(
        conn.hget::<_, _, i64>(SaleKeys::new(&id).meta, "stock")
            .await
            .unwrap(),
        10
    );

    // 10 → 4 takes the 6 unsold items: each bucket's books still balance.
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(4, 4))).await;
    assert_eq!(
        (status, view["stock"].as_i64()),
        (StatusCode::OK, Some(4)),
        "{view}"
    );
    assert_eq!(
        bucket_books(&mut conn, &id, 4).await,
        vec![(3, 0), (1, 0), (0, 0), (0, 0)]
    );
    for k in 0..4 {
        let ledger = flashgate_common::transfer::ledger(&mut conn, &id, k)
            .await
            .unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
    }
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        4
    );
}

#[tokio::test]
async fn reconciliation_moves_the_bases_of_a_bucketed_sale_back_to_the_database_stock() {
    let f = fixture().await;
    let (id, uri) = created_bucketed(&f, 8, 2).await;
    let mut conn = f.redis.conn().await;
    // A stock change to 11 that died before its commit: the bases moved,
    // the database kept 8.
    let moved = crate::buckets::stock::move_to(
        &mut conn,
        &id,
        2,
        11,
        crate::buckets::stock::Short::GiveBack,
    )
    .await
    .unwrap();
    assert!(
        matches!(moved, crate::buckets::stock::Moved::Done { missing: 0, .. }),
        "{moved:?}"
    );
    assert_eq!(bucket_books(&mut conn, &id, 2).await, vec![(6, 6), (5, 5)]);
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (
            report["bases_moved"].as_i64(),
            report["bases_off"].as_i64(),
            report["drift"].as_i64()
        ),
        (Some(-3), Some(0), Some(0)),
        "{report}"
    );
    assert_eq!(
        bucket_books(&mut conn, &id, 2).await,
        vec![(3, 3), (5, 5)],
        "taken where most items are"
    );
    // One that died short of its commit the other way: items added back.
    let moved = crate::buckets::stock::move_to(
        &mut conn,
        &id,
        2,
        5,
        crate::buckets::stock::Short::GiveBack,
    )
    .await
    .unwrap();
    assert!(
        matches!(moved, crate::buckets::stock::Moved::Done { missing: 0, .. }),
        "{moved:?}"
    );
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(
        (
            status,
            report["bases_moved"].as_i64(),
            report["bases_off"].as_i64()
        ),
        (StatusCode::OK, Some(3), Some(0)),
        "{report}"
    );
    let sum: i64 = bucket_books(&mut conn, &id, 2)
        .await
        .iter()
        .map(|(base, _)| base)
        .sum();
    assert_eq!(sum, 8);
}

/// Σ bases of bucketed sale `id`.
async fn bases_sum(conn: &mut redis::aio::MultiplexedConnection, id: &str, buckets: u32) -> i64 {
    bucket_books(conn, id, buckets)
        .await
        .iter()
        .map(|(base, _)| base)
        .sum()
}

#[tokio::test]
async fn a_bucketed_sale_in_redis_but_not_in_the_database_has_its_bases_moved_to_the_committed_stock(
) {
    let f = fixture().await;
    let id = unique("b");
    let uri = format!("/admin/sales/{id}");
    // The buckets are in Redis, the row is not (as after a create whose
    // commit failed): installed through another database over the same
    // Redis.
    let other = |f: &Fixture| {
        let redis = f.state.redis.clone();
        async move {
            let store = Store::connect(&sqlite_url()).await.unwrap();
            AppState::new(
                store,
                redis,
                auth::ApiTokens::new(TOKEN, GATEWAY, SHOP).unwrap(),
                std::time::Duration::from_secs(600),
            )
        }
    };
    let elsewhere = other(&f).await;
    let (status, view) = call(
        admin_router(elsewhere),
        "PUT",
        &uri,
        Some(TOKEN),
        Some(&bucketed_body(10, 2)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    let mut conn = f.redis.conn().await;
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 10);
    assert!(f.state.store.sales().get(&id).await.unwrap().is_none());

    // Created here with 6: the bases follow the committed stock, not the
    // 10 Redis held (update_sale.lua alone would leave them at 10).
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(6, 2))).await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    assert_eq!(
        f.state.store.sales().get(&id).await.unwrap().unwrap().stock,
        6
    );
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 6);

    // The same the other way: created with 9 through a third database.
    let third = other(&f).await;
    let (status, view) = call(
        admin_router(third.clone()),
        "PUT",
        &uri,
        Some(TOKEN),
        Some(&bucketed_body(9, 2)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    assert_eq!(
        third.store.sales().get(&id).await.unwrap().unwrap().stock,
        9
    );
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 9);
}

#[tokio::test]
async fn a_stock_change_cut_at_its_crash_points_never_leaves_more_items_than_the_database_stock() {
    let f = fixture().await;
    let (id, uri) = created_bucketed(&f, 8, 2).await;
    let mut conn = f.redis.conn().await;

    // An increase to 12 cut after its commit: the database has 12, the
    // bases move only after the commit, so they are still 8 (too few,
    // never too many).
    let mut saved = f.state.store.sales().get(&id).await.unwrap().unwrap();
    saved.stock = 12;
    f.state.store.sales().upsert(&saved).await.unwrap();
    assert!(bases_sum(&mut conn, &id, 2).await <= 12);
    // Sending the change again adds the missing items (an increase is
    // never refused), though the stock is unchanged.
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(12, 2))).await;
    assert_eq!(
        (status, view["stock"].as_i64()),
        (StatusCode::OK, Some(12)),
        "{view}"
    );
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 12);

    // A decrease to 7 cut before its commit: the bases moved first, the
    // database kept 12, so Σ bases ≤ the stock until reconciliation adds
    // the items back.
    let moved = crate::buckets::stock::move_to(
        &mut conn,
        &id,
        2,
        7,
        crate::buckets::stock::Short::GiveBack,
    )
    .await
    .unwrap();
    assert!(
        matches!(moved, crate::buckets::stock::Moved::Done { missing: 0, .. }),
        "{moved:?}"
    );
    assert!(
        bases_sum(&mut conn, &id, 2).await
            <= f.state.store.sales().get(&id).await.unwrap().unwrap().stock
    );
    // A rename with the stock unchanged takes nothing (never a 409); it
    // adds the missing items back, as an increase is never refused.
    let (status, view) = admin(
        &f,
        "PUT",
        &uri,
        Some(&bucketed_body(12, 2).replace("Sneaker", "Boot")),
    )
    .await;
    assert_eq!(
        (status, view["name"].as_str()),
        (StatusCode::OK, Some("Boot")),
        "{view}"
    );
    assert_eq!(
        bases_sum(&mut conn, &id, 2).await,
        12,
        "missing items are added back (never a surplus)"
    );
    let moved = crate::buckets::stock::move_to(
        &mut conn,
        &id,
        2,
        7,
        crate::buckets::stock::Short::GiveBack,
    )
    .await
    .unwrap();
    assert!(
        matches!(moved, crate::buckets::stock::Moved::Done { missing: 0, .. }),
        "{moved:?}"
    );
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(
        (
            status,
            report["bases_moved"].as_i64(),
            report["bases_off"].as_i64()
        ),
        (StatusCode::OK, Some(5), Some(0)),
        "{report}"
    );
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 12);
    for k in 0..2 {
        let moving: bool = conn.exists(SaleKeys::bucket(&id, k).moving).await.unwrap();
        assert!(!moving, "bucket {k}'s stock-move marker ends with the move");
    }
}

#[tokio::test]
async fn reconciliation_reports_a_surplus_already_sold_and_skips_a_fenced_bucket() {
    let f = fixture().await;
    let (id, uri) = created_bucketed(&f, 8, 2).await;
    let mut conn = f.redis.conn().await;
    // 3 items too many in the bases (an older change that died), and every
    // unsold item gone: the surplus cannot be taken back.
    let moved = crate::buckets::stock::move_to(
        &mut conn,
        &id,
        2,
        11,
        crate::buckets::stock::Short::GiveBack,
    )
    .await
    .unwrap();
    assert!(
        matches!(moved, crate::buckets::stock::Moved::Done { missing: 0, .. }),
        "{moved:?}"
    );
    for k in 0..2 {
        let () = conn
            .set(SaleKeys::bucket(&id, k).remaining, 0)
            .await
            .unwrap();
    }
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (report["bases_moved"].as_i64(), report["bases_off"].as_i64()),
        (Some(0), Some(3)),
        "{report}"
    );
    assert!(report["bases_off"].as_i64().unwrap() > 0);
    assert_eq!(
        report["bases_unrepaired"].as_bool(),
        Some(false),
        "{report}"
    );

    // Unsold items again, but bucket 1 fenced (its Redis failed over): the
    // report comes back, the repair is skipped and nothing moves.
    for k in 0..2 {
        let () = conn
            .set(SaleKeys::bucket(&id, k).remaining, 5)
            .await
            .unwrap();
    }
    let () = conn
        .set(SaleKeys::bucket(&id, 1).synced, "another-redis")
        .await
        .unwrap();
    let before = bucket_books(&mut conn, &id, 2).await;
    let (status, report) = admin(&f, "POST", &format!("{uri}/reconcile"), None).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (
            report["bases_moved"].as_i64(),
            report["bases_off"].as_i64(),
            report["bases_unrepaired"].as_bool()
        ),
        (Some(0), Some(3), Some(true)),
        "{report}"
    );
    assert_eq!(
        bucket_books(&mut conn, &id, 2).await,
        before,
        "nothing taken nor given back"
    );
}

#[tokio::test]
async fn after_a_failed_commit_redis_follows_what_the_database_holds_never_the_old_stock_blindly() {
    let f = fixture().await;
    let (id, _) = created_bucketed(&f, 8, 2).await;
    let mut conn = f.redis.conn().await;
    let old = f.state.store.sales().get(&id).await.unwrap().unwrap();

    // A decrease to 5 whose commit failed: the bases were lowered before
    // it and the new definition written; the database kept 8, so both go
    // back to 8.
    let mut lowered = old.clone();
    lowered.stock = 5;
    let moved = crate::buckets::stock::move_to(
        &mut conn,
        &id,
        2,
        5,
        crate::buckets::stock::Short::GiveBack,
    )
    .await
    .unwrap();
    assert!(
        matches!(moved, crate::buckets::stock::Moved::Done { missing: 0, .. }),
        "{moved:?}"
    );
    crate::sales::apply(&mut f.state.redis.clone(), &f.state.store, &lowered)
        .await
        .unwrap();
    super::admin::after_failed_commit(
        &mut f.state.redis.clone(),
        &f.state.store,
        &lowered,
        Some(&old),
        Some(8),
        &f.state.metrics.stock_reverts_refused,
    )
    .await;
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 8);
    assert_eq!(
        conn.hget::<_, _, i64>(SaleKeys::new(&id).meta, "stock")
            .await
            .unwrap(),
        8
    );

    // A raise to 12 whose commit answered an error but happened: Redis
    // follows the 12 committed, not the 8 of before.
    let mut raised = old.clone();
    raised.stock = 12;
    f.state.store.sales().upsert(&raised).await.unwrap();
    crate::sales::apply(&mut f.state.redis.clone(), &f.state.store, &raised)
        .await
        .unwrap();
    super::admin::after_failed_commit(
        &mut f.state.redis.clone(),
        &f.state.store,
        &raised,
        Some(&old),
        None,
        &f.state.metrics.stock_reverts_refused,
    )
    .await;
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 12);
    assert_eq!(
        conn.hget::<_, _, i64>(SaleKeys::new(&id).meta, "stock")
            .await
            .unwrap(),
        12
    );
}

#[tokio::test]
async fn a_decreases_stock_move_markers_stay_until_it_is_committed_or_moved_back() {
    use crate::buckets::stock::{self, Moved, Short};
    let f = fixture().await;
    let id = unique("b");
    let uri = format!("/admin/sales/{id}");
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(10, 2))).await;
    assert_eq!(status, StatusCode::CREATED, "{view}");
    let mut conn = f.redis.conn().await;
    let moving = |conn: &mut redis::aio::MultiplexedConnection, k: u32| {
        let key = SaleKeys::bucket(&id, k).moving;
        let mut conn = conn.clone();
        async move { conn.exists::<_, bool>(key).await.unwrap() }
    };
    // Lowered, not final yet (the change may still be moved back): every
    // bucket lowered keeps its marker, so no gateway confirms it dry.
    let (moved, markers) = stock::move_keeping_markers(&mut conn, &id, 2, 6, Short::GiveBack)
        .await
        .unwrap();
    let Moved::Done {
        changes,
        missing: 0,
    } = moved
    else {
        panic!("{moved:?}")
    };
    for (k, c) in changes.iter().enumerate() {
        assert_eq!(
            moving(&mut conn, k as u32).await,
            *c != 0,
            "bucket {k} ({c}): marker kept until the change is final"
        );
    }
    assert!(changes.iter().any(|c| *c != 0), "{changes:?}");
    markers.refresh(&mut conn).await;
    // Moved back (the commit failed), then final: the markers end.
    let back = stock::move_to(&mut conn, &id, 2, 10, Short::Keep)
        .await
        .unwrap();
    assert!(matches!(back, Moved::Done { missing: 0, .. }), "{back:?}");
    markers.end(&mut conn).await;
    assert!(!moving(&mut conn, 0).await && !moving(&mut conn, 1).await);
    // A decrease through the API ends them once committed.
    let (status, view) = admin(&f, "PUT", &uri, Some(&bucketed_body(7, 2))).await;
    assert_eq!(
        (status, view["stock"].as_i64()),
        (StatusCode::OK, Some(7)),
        "{view}"
    );
    assert!(
        !moving(&mut conn, 0).await && !moving(&mut conn, 1).await,
        "committed: the markers end"
    );
    assert_eq!(bases_sum(&mut conn, &id, 2).await, 7);
}

mod stock_changes;
