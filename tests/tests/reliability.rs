//! Reliability end to end: Redis losing a sale, payment timeout and stock
//! return, reconciliation, dead letters; real processes over loopback.

use std::time::{Duration, Instant};

use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP};
use flashgate_tests::{random_user, Stack, StackOptions};
use reqwest::Method;
use serde_json::{json, Value};

/// Polls `check` every 100 ms until it returns `Some`, or panics after `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put_sale(stack: &Stack, id: &str, stock: i64, payment_timeout_seconds: i64) {
    let now = flashgate_common::now_ms();
    let body = json!({
        "name": format!("Sale {id}"), "stock": stock, "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(now - 1000), "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        "payment_timeout_seconds": payment_timeout_seconds,
    });
    let (status, v) = stack
        .admin(Method::PUT, &format!("/admin/sales/{id}"), Some(body))
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["payment_timeout_seconds"], payment_timeout_seconds, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_redis_lost_answers_503_until_restored_and_never_sells_an_item_twice() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("lost", 10, 1).await;
    let early: Vec<String> = (0..4).map(|_| random_user()).collect();
    for u in &early {
        let (status, body) = stack.buy("lost", u, None).await;
        assert_eq!(status, 202);
        // Persisted before Redis goes: without AOF, a reservation not yet
        // written as an order is lost with Redis (docs/RELIABILITY.md).
        stack
            .order_id_of(u, body["reservation_id"].as_str().unwrap())
            .await;
    }
    stack.redis.restart(); // no AOF: the new Redis is empty

    // Until the backend restores it, the sale is refused with 503, never 404.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = stack.buy("lost", &random_user(), None).await;
        assert_ne!(status, 404, "a lost sale must not look unknown: {body}");
        if status == 201 || status == 202 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "the sale was not restored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stack
        .log("flashgate-backend")
        .contains("restored from the database"));
    // The early buyers are known again: their limit holds.
    assert_eq!(stack.buy("lost", &early[0], None).await.0, 409);
    // 4 early orders + the 1 that won just now: 5 left, sold exactly once.
    assert_eq!(stack.remaining("lost").await, 5);
    let rest: Vec<String> = (0..30).map(|_| random_user()).collect();
    let mut won = 0;
    for u in &rest {
        let (status, _) = stack.buy("lost", u, None).await;
        won += i64::from(status == 201 || status == 202);
    }
    assert_eq!(won, 5);
    let (orders, users, most) = stack.wait_orders("lost", 10, Duration::from_secs(20)).await;
    assert_eq!((orders, users, most), (10, 10, 1));
    assert_eq!(stack.remaining("lost").await, 0);
    // The gateway asked the backend while restoring.
    let (status, v) = {
        let url = format!("http://{}/internal/sales/lost", stack.backend_addr);
        let r = stack
            .http
            .get(url)
            .bearer_auth(flashgate_tests::INTERNAL_TOKEN)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!((status, v["exists"].as_bool()), (200, Some(true)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaid_order_is_cancelled_after_the_timeout_and_its_item_sold_again() {
    let stack = Stack::start(StackOptions::default()).await;
    put_sale(&stack, "pay", 2, 2).await;
    let (payer, idler) = (random_user(), random_user());
    let (s1, paid) = stack.buy("pay", &payer, None).await;
    let (s2, unpaid) = stack.buy("pay", &idler, None).await;
    assert_eq!((s1, s2), (202, 202), "{paid} {unpaid}");
    let paid_order = stack
        .order_id_of(&payer, paid["reservation_id"].as_str().unwrap())
        .await;
    let unpaid_order = stack
        .order_id_of(&idler, unpaid["reservation_id"].as_str().unwrap())
        .await;

    let (status, v) = stack
        .backend_post(&format!("/internal/orders/{paid_order}/pay"))
        .await;
    assert_eq!((status, v["status"].as_str()), (200, Some("paid")), "{v}");
    assert_eq!(
        stack
            .backend_post(&format!("/internal/orders/{paid_order}/pay"))
            .await
            .0,
        200,
        "paying twice is harmless"
    );
    assert_eq!(stack.remaining("pay").await, 0);

    eventually(
        "the unpaid order to be cancelled and its item returned",
        Duration::from_secs(20),
        || async {
            let rows = stack.order_rows("pay").await;
            let cancelled = rows
                .iter()
                .any(|r| r.order_id == unpaid_order && r.status == "cancelled");
            (cancelled && stack.remaining("pay").await == 1).then_some(())
        },
    )
    .await;
    let rows = stack.order_rows("pay").await;
    assert!(
        rows.iter()
            .any(|r| r.order_id == paid_order && r.status == "paid"),
        "a paid order is never cancelled"
    );
    let (status, v) = stack
        .backend_post(&format!("/internal/orders/{unpaid_order}/pay"))
        .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (409, Some("order_cancelled")),
        "{v}"
    );

    // The item is back and the idle buyer's slot is free: they may buy again.
    let (status, again) = stack.buy("pay", &idler, None).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(stack.remaining("pay").await, 0);
    let (status, _) = stack.buy("pay", &random_user(), None).await;
    assert_eq!(status, 410);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_writes_orders_nobody_processed_and_adopts_orders_redis_forgot() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("recon", 10, 1).await;
    stack.kill_backend();
    for _ in 0..3 {
        assert_eq!(stack.buy("recon", &random_user(), None).await.0, 202);
    }
    // The gateway's forwards of the three failed (a late one would reach
    // the restarted backend and write the orders itself).
    let forwards = "flashgate_backend_forward_failures_total";
    eventually(
        "the three forwards to fail",
        Duration::from_secs(10),
        || async { (stack.gateway_metric(forwards).await >= 3.0).then_some(()) },
    )
    .await;
    // The consumer group skips those entries: they would never be processed.
    let keys = SaleKeys::new("recon");
    let mut conn = stack.redis.conn().await;
    let () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(&keys.stream)
        .arg(CONSUMER_GROUP)
        .arg("$")
        .query_async(&mut conn)
        .await
        .unwrap();
    stack.start_backend();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stack.db_orders("recon").await.0, 0);

    let (status, report) = stack
        .admin(Method::POST, "/admin/sales/recon/reconcile", None)
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        (report["repaired"].as_i64(), report["drift"].as_i64()),
        (Some(3), Some(0)),
        "{report}"
    );
    assert_eq!(stack.db_orders("recon").await.0, 3);

    // Redis forgets one reservation (a lost write): reconcile counts it again.
    let buyer = random_user();
    let (s, won) = stack.buy("recon", &buyer, None).await;
    assert_eq!(s, 202);
    stack
        .order_id_of(&buyer, won["reservation_id"].as_str().unwrap())
        .await;
    let rid = won["reservation_id"].as_str().unwrap();
    let () = redis::cmd("HDEL")
        .arg(&keys.reservations)
        .arg(rid)
        .query_async::<i64>(&mut conn)
        .await
        .map(drop)
        .unwrap();
    let () = redis::cmd("INCR")
        .arg(&keys.remaining)
        .query_async::<i64>(&mut conn)
        .await
        .map(drop)
        .unwrap();
    let (_, report) = stack
        .admin(Method::POST, "/admin/sales/recon/reconcile", None)
        .await;
    assert_eq!(
        (report["adopted"].as_i64(), report["drift"].as_i64()),
        (Some(1), Some(0)),
        "{report}"
    );
    assert_eq!(stack.remaining("recon").await, 6);
    let (_, report) = stack
        .admin(Method::POST, "/admin/sales/recon/reconcile", None)
        .await;
    assert_eq!(
        (
            report["repaired"].as_i64(),
            report["adopted"].as_i64(),
            report["drift"].as_i64()
        ),
        (Some(0), Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_keeps_failing_is_dead_lettered_listed_and_retried() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("poison", 5, 1).await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&stack.database_url).await.unwrap();
    sqlx::query("CREATE TRIGGER refuse BEFORE INSERT ON orders WHEN NEW.user_id = 'poisoned' BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END")
        .execute(&pool)
        .await
        .unwrap();
    let (status, body) = stack.buy("poison", "poisoned", None).await;
    assert_eq!(status, 202, "the reservation is queued: {body}");
    let (status, healthy) = stack.buy("poison", "healthy", None).await;
    assert_eq!(status, 202, "the next buyer is not blocked");
    stack
        .order_id_of("healthy", healthy["reservation_id"].as_str().unwrap())
        .await;

    let dead = eventually(
        "the entry to be dead-lettered",
        Duration::from_secs(30),
        || async {
            let (_, v) = stack
                .admin(Method::GET, "/admin/sales/poison/dead-letters", None)
                .await;
            let list = v["dead_letters"].as_array().cloned().unwrap_or_default();
            (!list.is_empty()).then_some(list)
        },
    )
    .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["reservation"]["user_id"], "poisoned");
    assert!(
        dead[0]["error"]
            .as_str()
            .unwrap()
            .contains("refused by a trigger"),
        "{:?}",
        dead[0]
    );
    let (_, report) = stack
        .admin(Method::POST, "/admin/sales/poison/reconcile", None)
        .await;
    assert_eq!(
        (
            report["dead_letters"].as_i64(),
            report["unrepaired"].as_i64(),
            report["drift"].as_i64()
        ),
        (Some(1), Some(1), Some(1)),
        "{report}"
    );

    sqlx::query("DROP TRIGGER refuse")
        .execute(&pool)
        .await
        .unwrap();
    let entry = dead[0]["entry_id"].as_str().unwrap();
    let (status, v) = stack
        .admin(
            Method::POST,
            &format!("/admin/sales/poison/dead-letters/{entry}/retry"),
            None,
        )
        .await;
    assert_eq!(status, 202, "{v}");
    stack
        .wait_orders("poison", 2, Duration::from_secs(20))
        .await;
    assert!(stack
        .order_rows("poison")
        .await
        .iter()
        .any(|r| r.user_id == "poisoned"));
    let (_, v) = stack
        .admin(Method::GET, "/admin/sales/poison/dead-letters", None)
        .await;
    assert_eq!(v["dead_letters"].as_array().map(Vec::len), Some(0));
    let (status, v) = stack
        .admin(
            Method::POST,
            &format!("/admin/sales/poison/dead-letters/{entry}/retry"),
            None,
        )
        .await;
    assert_eq!((status, v["code"].as_str()), (404, Some("not_found")));
    let (status, v) = stack
        .admin(
            Method::POST,
            "/admin/sales/poison/dead-letters/not-an-id/retry",
            None,
        )
        .await;
    assert_eq!((status, v["code"].as_str()), (400, Some("bad_request")));
    let (_, report) = stack
        .admin(Method::POST, "/admin/sales/poison/reconcile", None)
        .await;
    assert_eq!(report["drift"].as_i64(), Some(0), "{report}");
}

/// Buys as a new user until the answer is not `503 unavailable` (the sale
/// is back in Redis); returns that answer.
async fn first_answer_once_restored(stack: &Stack, sale: &str) -> (u16, Value) {
    eventually(
        "the sale to be restored",
        Duration::from_secs(20),
        || async {
            let (status, body) = stack.buy(sale, &random_user(), None).await;
            (body["code"] != "unavailable").then_some((status, body))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sale_is_restored_paused_when_redis_restarts_empty() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("mispriced", 10, 1).await;
    let (status, v) = stack
        .admin(Method::POST, "/admin/sales/mispriced/pause", None)
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, body) = stack.buy("mispriced", &random_user(), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("paused")),
        "{body}"
    );

    stack.redis.restart(); // no AOF: the new Redis is empty
    let keys = SaleKeys::new("mispriced");
    let paused: String = eventually(
        "the sale back in redis",
        Duration::from_secs(20),
        || async {
            let mut conn = stack.redis.conn().await;
            redis::cmd("HGET")
                .arg(&keys.meta)
                .arg("paused")
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap()
        },
    )
    .await;
    assert_eq!(paused, "1", "the restored sale must keep its pause");
    let (status, body) = first_answer_once_restored(&stack, "mispriced").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("paused")),
        "{body}"
    );
    assert_eq!(stack.remaining("mispriced").await, 10);

    // Resuming works on the restored sale.
    let (status, v) = stack
        .admin(Method::POST, "/admin/sales/mispriced/resume", None)
        .await;
    assert_eq!(status, 200, "{v}");
    // A gateway may answer from its cached window until the announcement
    // of the resume reaches it, and `503 unavailable` while its connection
    // to the restarted Redis comes back.
    let (status, body) = eventually("buys open again", Duration::from_secs(10), || async {
        let (status, body) = stack.buy("mispriced", &random_user(), None).await;
        (body["code"] != "paused" && body["code"] != "unavailable").then_some((status, body))
    })
    .await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_switch_stays_paused_when_redis_restarts_empty() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("calm", 10, 1).await;
    let (status, v) = stack
        .admin(Method::PUT, "/admin/switch", Some(json!({"paused": true})))
        .await;
    assert_eq!(status, 200, "{v}");
    eventually("every buy paused", Duration::from_secs(10), || async {
        let (status, body) = stack.buy("calm", &random_user(), None).await;
        (status == 503 && body["code"] == "paused").then_some(())
    })
    .await;
    // A buy sent before the switch reached the gateway may have won: the
    // restore must bring back exactly what was left.
    let left = stack.remaining("calm").await;

    stack.redis.restart(); // no AOF: the new Redis is empty
    let switch: String = eventually(
        "the switch back in redis",
        Duration::from_secs(20),
        || async {
            let mut conn = stack.redis.conn().await;
            redis::cmd("GET")
                .arg(flashgate_common::keys::GLOBAL_SWITCH)
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap()
        },
    )
    .await;
    assert_eq!(switch, "paused");
    // The sale itself is restored too, and still refused.
    eventually(
        "the sale back in redis",
        Duration::from_secs(20),
        || async {
            let mut conn = stack.redis.conn().await;
            let present: bool = redis::cmd("EXISTS")
                .arg(&SaleKeys::new("calm").meta)
                .query_async(&mut conn)
                .await
                .unwrap();
            present.then_some(())
        },
    )
    .await;
    for _ in 0..5 {
        let (status, body) = stack.buy("calm", &random_user(), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (503, Some("paused")),
            "{body}"
        );
    }
    assert_eq!(stack.remaining("calm").await, left);

    let (status, v) = stack
        .admin(Method::PUT, "/admin/switch", Some(json!({"paused": false})))
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, body) = eventually("buys open again", Duration::from_secs(10), || async {
        let (status, body) = stack.buy("calm", &random_user(), None).await;
        (status != 503).then_some((status, body))
    })
    .await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sale_gets_no_consumer_nor_backlog_polling_and_written_entries_are_trimmed() {
    let stack = Stack::start(StackOptions::default()).await;
    let mut conn = stack.redis.conn().await;
    // A sale that ended long ago, with nothing left to write.
    let old = serde_json::json!({"name": "Old", "stock": 5, "starts_at": "2020-01-01T00:00:00Z", "ends_at": "2020-01-02T00:00:00Z"});
    assert_eq!(
        stack
            .admin(Method::PUT, "/admin/sales/old", Some(old))
            .await
            .0,
        201
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !redis::cmd("SISMEMBER")
        .arg("fg:archived")
        .arg("old")
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the finished sale was never archived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A poll that read the sale list just before the archive may still
    // read this sale's backlog once: let one poll interval pass first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Several backlog polls (every 500 ms) and consumer reads (every 200 ms) later: none for it.
    let (xinfo, xread) = (
        stack.redis.command_calls("xinfo|groups").await,
        stack.redis.command_calls("xreadgroup").await,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        stack.redis.command_calls("xinfo|groups").await,
        xinfo,
        "nobody polls an archived sale's backlog"
    );
    assert_eq!(
        stack.redis.command_calls("xreadgroup").await,
        xread,
        "an archived sale has no consumer"
    );

    // A live sale: its entries, once written as orders and acknowledged, are trimmed.
    stack.open_sale("live", 3, 1).await;
    for user in ["a", "b", "c"] {
        assert_eq!(stack.buy("live", user, None).await.0, 202);
    }
    stack.wait_orders("live", 3, Duration::from_secs(20)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stack.stream_entries_kept("live").await > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "acknowledged entries were never trimmed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        (
            stack.db_orders("live").await.0,
            stack.stream_len("live").await
        ),
        (3, 3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_redis_has_no_switch_sells_nothing_until_it_reads_one() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("stopped", 10, 1).await;
    let (status, v) = stack
        .admin(Method::PUT, "/admin/switch", Some(json!({"paused": true})))
        .await;
    assert_eq!(status, 200, "{v}");

    // Redis lost the switch (but not the sale) while the backend is down,
    // and a gateway restarts.
    stack.kill_backend();
    let mut conn = stack.redis.conn().await;
    let () = redis::cmd("DEL")
        .arg(flashgate_common::keys::GLOBAL_SWITCH)
        .query_async(&mut conn)
        .await
        .unwrap();
    stack.kill_gateway();
    stack.start_gateway();
    for _ in 0..5 {
        let (status, body) = stack.buy("stopped", &random_user(), None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (503, Some("paused")),
            "{body}"
        );
    }
    assert_eq!(stack.remaining("stopped").await, 10);

    // The backend writes the recorded switch back; resuming opens the shop.
    stack.start_backend();
    let switch: String = eventually(
        "the switch back in redis",
        Duration::from_secs(20),
        || async {
            let mut conn = stack.redis.conn().await;
            redis::cmd("GET")
                .arg(flashgate_common::keys::GLOBAL_SWITCH)
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap()
        },
    )
    .await;
    assert_eq!(switch, "paused");
    let (status, v) = stack
        .admin(Method::PUT, "/admin/switch", Some(json!({"paused": false})))
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, body) = eventually("buys open again", Duration::from_secs(10), || async {
        let (status, body) = stack.buy("stopped", &random_user(), None).await;
        (status != 503).then_some((status, body))
    })
    .await;
    assert_eq!(status, 202, "{body}");
}
