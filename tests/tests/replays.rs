//! Idempotency-Key replays and what they may change: a replayed answer
//! never closes a sale, random keys cannot grow Redis, a win carries one
//! reservation time on both of its paths to the database, and a polling
//! winner costs the backend one lookup per cache TTL, and a won key still
//! replays its order once the sale sold out again.

// A buy's future, spawned here, nests deeper than the default limit when
// proving it `Send` (as in the gateway crate).
#![recursion_limit = "256"]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashgate_common::config::{Config, Env, ENV_INTERNAL_TOKEN, ENV_JWT_SECRET};
use flashgate_common::reservation::{fields, Reservation};
use flashgate_gateway::buy::{BuyOutcome, BuyRequest};
use flashgate_gateway::edge::Gateway;
use flashgate_gateway::rejection::Rejection;
use flashgate_tests::{buy_all, random_user, token, Attempt, Stack, StackOptions};
use serde_json::Value;

/// `used_memory` of the stack's Redis, bytes.
async fn redis_used_memory(stack: &Stack) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut stack.redis.conn().await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// The gateway as the server builds it from `stack`'s config, with room
/// for a debug build under load (a 5 s Redis timeout, a breaker that stays
/// closed); nothing listens. Its switch watcher does not run: the global
/// switch is taken as off, as the stack's Redis has it.
fn gateway_of(stack: &Stack) -> Gateway {
    struct Secrets;
    impl Env for Secrets {
        fn var(&self, name: &str) -> Option<String> {
            match name {
                ENV_JWT_SECRET => Some(flashgate_tests::JWT_SECRET.into()),
                ENV_INTERNAL_TOKEN => Some(flashgate_tests::INTERNAL_TOKEN.into()),
                _ => None,
            }
        }
    }
    let text = std::fs::read_to_string(&stack.config_path).unwrap();
    let mut config = Config::from_toml_str(&text, &Secrets, flashgate_common::now_ms()).unwrap();
    config.redis.timeout = Duration::from_secs(5);
    config.redis.breaker_failures = 1000;
    let (gateway, _worker) = flashgate_gateway::server::build_gateway(Arc::new(config)).unwrap();
    gateway.switches.set_all_paused(false);
    gateway
}

/// A counter of the backend's `/metrics` (0 when not exported yet).
async fn backend_counter(stack: &Stack, name: &str) -> u64 {
    let text = stack.backend_metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_sold_out_key_does_not_close_a_restocked_sale() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("restock", 1, 1).await;
    assert_eq!(stack.buy("restock", "alice", Some("a1")).await.0, 202);
    let (status, body) = stack.buy("restock", "bob", Some("k")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (410, Some("sold_out")),
        "{body}"
    );

    // The operator adds one item.
    stack.open_sale("restock", 2, 1).await;
    // Wait until the gateway has dropped its sold-out flag: alice, at her
    // limit, is then answered by the script (409), not by the flag (410).
    // Nothing is deducted for her.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    while Instant::now() < deadline && status != 409 {
        status = stack.buy("restock", "alice", None).await.0;
    }
    assert_eq!(status, 409, "the restock never reached the gateway");

    // bob's retry gets his first answer again...
    let (status, body) = stack.buy("restock", "bob", Some("k")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (410, Some("sold_out")),
        "{body}"
    );
    // ...and that old answer does not close the sale: the free item sells.
    let (status, body) = stack.buy("restock", "carol", Some("c1")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (202, Some("queued")),
        "{body}"
    );
    assert_eq!(stack.remaining("restock").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_keys_from_a_buyer_at_their_limit_do_not_grow_redis() {
    const ATTEMPTS: usize = 100_000;
    const CONCURRENCY: usize = 64;
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("keys", 10, 1).await;
    assert_eq!(stack.buy("keys", "alice", Some("first")).await.0, 202);
    let before = redis_used_memory(&stack).await;

    // The gateway's own buy rules as the server builds them from this
    // stack's config (`BuyService::buy`: the local decision, then the
    // batched `lua/deduct_batch.lua` with the buy path's keys and
    // arguments), without HTTP in front: 100,000 requests through a debug
    // gateway would take minutes on a small machine.
    let gateway = Arc::new(gateway_of(&stack));
    let batch_sizes = gateway.metrics.deduct_batch_size.clone();
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let gateway = gateway.clone();
        workers.push(tokio::spawn(async move {
            let mut outcomes: HashMap<String, usize> = HashMap::new();
            for _ in 0..ATTEMPTS / CONCURRENCY {
                let key = format!("{:032x}", rand::random::<u128>());
                let outcome = gateway
                    .buy
                    .buy(BuyRequest {
                        sale_id: "keys",
                        user: "alice",
                        idempotency_key: &key,
                        request_id: "memory",
                    })
                    .await;
                *outcomes.entry(format!("{outcome:?}")).or_default() += 1;
            }
            outcomes
        }));
    }
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for w in workers {
        for (outcome, n) in w.await.unwrap() {
            *outcomes.entry(outcome).or_default() += n;
        }
    }
    assert_eq!(
        outcomes.get(&format!(
            "{:?}",
            BuyOutcome::Refused(Rejection::LimitReached)
        )),
        Some(&(ATTEMPTS / CONCURRENCY * CONCURRENCY)),
        "{outcomes:?}"
    );

    assert!(
        batch_sizes.get_sample_count() < batch_sizes.get_sample_sum() as u64,
        "the attempts went in batches ({} calls for {} attempts)",
        batch_sizes.get_sample_count(),
        batch_sizes.get_sample_sum()
    );

    let grown = redis_used_memory(&stack).await - before;
    eprintln!("100,000 random keys grew Redis by {grown} bytes");
    assert!(
        grown < 1024 * 1024,
        "100,000 random keys grew Redis by {grown} bytes"
    );
    // The winning key still replays its win.
    let (status, body) = stack.buy("keys", "alice", Some("first")).await;
    assert!(status == 201 || status == 202, "{status} {body}");
    assert_eq!(stack.stream_len("keys").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_from_the_forward_has_the_stream_records_reservation_time() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("ts", 100, 1).await;
    // Every order below must come from the gateway's forward: the backend's
    // stream consumer is refused its reads (a Redis ACL on the one user
    // every process shares) until the orders are written.
    let mut redis = stack.redis.conn().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-xreadgroup")
        .arg("-xautoclaim")
        .query_async(&mut redis)
        .await
        .unwrap();

    let attempts = (0..60)
        .map(|_| Attempt {
            user: random_user(),
            idempotency_key: None,
        })
        .collect();
    let outcomes = buy_all(stack.gateway_addr, "ts", attempts, 8).await;
    assert!(
        outcomes.iter().all(|o| o.status == 202),
        "{:?}",
        outcomes.iter().map(|o| o.status).collect::<Vec<_>>()
    );
    let (orders, _, _) = stack.wait_orders("ts", 60, Duration::from_secs(20)).await;
    assert_eq!(orders, 60);
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("+xreadgroup")
        .arg("+xautoclaim")
        .query_async(&mut redis)
        .await
        .unwrap();

    let keys = flashgate_common::keys::SaleKeys::new("ts");
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys.stream)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    let stream_ts: HashMap<String, i64> = entries
        .ids
        .iter()
        .map(|e| {
            let record: String = e.get(fields::RECORD).unwrap();
            let r = Reservation::from_fields(|name| (name == fields::RECORD).then_some(&*record));
            let r = r.unwrap();
            (r.reservation_id, r.reserved_at_ms)
        })
        .collect();
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&stack.database_url).await.unwrap();
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT reservation_id, reserved_at_ms FROM orders WHERE sale_id = $1")
            .bind("ts")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert_eq!(rows.len(), 60);
    let differing: Vec<_> = rows
        .iter()
        .filter(|(rid, at)| stream_ts.get(rid) != Some(at))
        .collect();
    assert!(
        differing.is_empty(),
        "orders whose time is not the stream record's: {differing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_win_polled_and_replayed_costs_one_backend_lookup_per_second() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("poll", 5, 1).await;
    let (status, body) = stack.buy("poll", "alice", Some("k")).await;
    assert_eq!(status, 202, "{body}");
    let rid = body["reservation_id"].as_str().unwrap().to_owned();
    let order_id = stack.order_id_of("alice", &rid).await;

    let lookups_before = backend_counter(&stack, "flashgate_backend_order_lookups_total").await;
    let started = Instant::now();
    for _ in 0..20 {
        let (status, body) = stack.buy("poll", "alice", Some("k")).await;
        assert_eq!(
            (status, body["order_id"].as_str()),
            (201, Some(order_id.as_str())),
            "{body}"
        );
        let v: Value = stack
            .http
            .get(stack.url(&format!("/flashgate/api/reservations/{rid}")))
            .bearer_auth(token("alice"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (v["status"].as_str(), v["order_id"].as_str()),
            (Some("confirmed"), Some(order_id.as_str())),
            "{v}"
        );
    }
    let elapsed = started.elapsed();
    let lookups =
        backend_counter(&stack, "flashgate_backend_order_lookups_total").await - lookups_before;
    // An order found is kept for a second: each second of polling costs at
    // most one lookup, however many requests it saw.
    assert!(
        lookups <= elapsed.as_secs() + 1,
        "40 requests in {elapsed:?} cost {lookups} backend lookups"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_won_key_replays_its_cancelled_order_after_the_sale_sells_out_again() {
    let stack = Stack::start(StackOptions::default()).await;
    let now = flashgate_common::now_ms();
    let body = serde_json::json!({
        "name": "Sale again", "stock": 1, "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(now - 1000), "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        "payment_timeout_seconds": 2,
    });
    let (status, v) = stack
        .admin(reqwest::Method::PUT, "/admin/sales/again", Some(body))
        .await;
    assert_eq!(status, 201, "{v}");
    let (first, next, late) = (random_user(), random_user(), random_user());
    let (status, won) = stack.buy("again", &first, Some("k1")).await;
    assert_eq!(status, 202, "{won}");
    let order = stack
        .order_id_of(&first, won["reservation_id"].as_str().unwrap())
        .await;

    // Not paid in time: cancelled, and the item goes back on sale. Waits
    // until the gateway's short order cache says so too, so the replay
    // below cannot see the order's earlier state.
    let rid = won["reservation_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cancelled = stack
            .order_rows("again")
            .await
            .iter()
            .any(|r| r.order_id == order && r.status == "cancelled");
        let lookup = stack
            .http
            .get(stack.url(&format!("/flashgate/api/reservations/{rid}")))
            .bearer_auth(token(&first));
        let seen: Value = lookup
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null);
        if cancelled && seen["status"] == "cancelled" && stack.remaining("again").await == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unpaid order was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Sold again, and flagged sold out on the gateway.
    assert_eq!(stack.buy("again", &next, None).await.0, 202);
    let (status, v) = stack.buy("again", &late, None).await;
    assert_eq!((status, v["code"].as_str()), (410, Some("sold_out")), "{v}");

    // The first buyer's retry of their won key tells them what became of it.
    let (status, v) = stack.buy("again", &first, Some("k1")).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (410, Some("order_cancelled")),
        "{v}"
    );
    assert_eq!(v["order_id"].as_str(), Some(order.as_str()), "{v}");
}
