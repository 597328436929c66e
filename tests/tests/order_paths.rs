//! Who writes a winner's order: the gateway's forward, once; the stream
//! consumer only checks and acknowledges, and writes what the forward
//! missed after `backend.forward_grace_ms`. Real gateway, backend, Redis
//! and PostgreSQL over loopback.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP};
use flashgate_tests::{buy, free_port, token, PostgresDatabase, Stack, StackOptions};

const WINNERS: i64 = 12;

/// The sum of the backend's samples of `metric` with `labels` (e.g.
/// `source="stream"`); 0 when absent.
async fn backend_metric(stack: &Stack, metric: &str, labels: &str) -> f64 {
    let text = stack.backend_metrics_text().await;
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Waits until the sale's consumer group has acknowledged every entry
/// (nothing pending, nothing undelivered).
async fn wait_acknowledged(stack: &Stack, sale: &str) {
    let mut conn = stack.redis.conn().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (lag, pending) =
            flashgate_common::stream_info::group_backlog(&mut conn, &SaleKeys::new(sale).stream)
                .await
                .unwrap();
        let xack = stack.redis.command_calls("xack").await;
        if lag == 0 && pending == 0 && xack > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "entries of {sale} never acknowledged by {CONSUMER_GROUP}: lag {lag}, pending {pending}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn buy_winners(stack: &Stack, gateway: SocketAddr, sale: &str) {
    for i in 0..WINNERS {
        let (status, body) = buy(
            &stack.http,
            gateway,
            sale,
            &token(&format!("{sale}-u{i}")),
            None,
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_grace_winners_orders_are_written_by_the_forward_alone_and_the_consumer_acknowledges_them(
) {
    let database = PostgresDatabase::create().await;
    // A grace far longer than a forward takes even on a loaded machine (and
    // a claim time that leaves room for it): the forward writes first
    // however slow the run.
    let opts = StackOptions {
        database_url: Some(database.url.clone()),
        forward_grace_ms: 5000,
        claim_idle_ms: 30_000,
        ..StackOptions::default()
    };
    let stack = Stack::start(opts).await;
    stack.open_sale("once", 100, 1).await;

    buy_winners(&stack, stack.gateway_addr, "once").await;
    assert_eq!(
        stack
            .wait_orders("once", WINNERS, Duration::from_secs(20))
            .await,
        (WINNERS, WINNERS, 1)
    );
    wait_acknowledged(&stack, "once").await;

    let created = "flashgate_backend_orders_created_total";
    assert_eq!(
        backend_metric(&stack, created, "source=\"forward\"").await as i64,
        WINNERS
    );
    assert_eq!(
        backend_metric(&stack, created, "source=\"stream\"").await as i64,
        0,
        "the consumer wrote nothing"
    );
    assert_eq!(
        backend_metric(&stack, "flashgate_backend_orders_existing_total", "").await as i64,
        0,
        "nothing was written twice"
    );
    assert_eq!(
        backend_metric(
            &stack,
            "flashgate_backend_stream_entries_already_written_total",
            ""
        )
        .await as i64,
        WINNERS
    );
    assert_eq!(stack.db_orders("once").await.0, WINNERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_forward_failing_the_consumer_writes_every_order_after_the_grace() {
    let database = PostgresDatabase::create().await;
    let opts = StackOptions {
        database_url: Some(database.url.clone()),
        forward_grace_ms: 500,
        ..StackOptions::default()
    };
    let stack = Stack::start(opts).await;
    stack.open_sale("missed", 100, 1).await;
    // A gateway whose forwards reach no backend.
    let nobody: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let (_gateway, gateway) = stack.start_gateway_via(nobody);

    buy_winners(&stack, gateway, "missed").await;
    assert_eq!(
        stack
            .wait_orders("missed", WINNERS, Duration::from_secs(20))
            .await,
        (WINNERS, WINNERS, 1)
    );
    wait_acknowledged(&stack, "missed").await;

    let created = "flashgate_backend_orders_created_total";
    assert_eq!(
        backend_metric(&stack, created, "source=\"stream\"").await as i64,
        WINNERS
    );
    assert_eq!(
        backend_metric(&stack, created, "source=\"forward\"").await as i64,
        0
    );
    assert_eq!(stack.db_orders("missed").await.0, WINNERS);
}
