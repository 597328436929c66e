//! Fault injection: each case runs a burst of buyers against the real
//! stack while one part fails, lets it recover, sells again, and checks
//! that nothing was lost or sold twice:
//!
//! - no oversell: at most `STOCK` live orders, `remaining >= 0`;
//! - every client told it won (201/202) has exactly one order, its own;
//! - no duplicate order (one per reservation, one per user at limit 1);
//! - `remaining + live orders = stock` once the stack has settled.
//!
//! Each case prints one report line (`fault=... redis=... sent=...
//! winners=... orders=... remaining=...`); `make faults` runs this suite
//! repeatedly. Every wait is bounded by a deadline, and every process is
//! killed by PID when the stack drops.
//!
//! A stock raise cut between its Redis step and its commit while buyers
//! hammer is in [`stock_raise`] (on PostgreSQL, whose sessions it cuts).
//!
//! The cases that fail the gateway, the backend or the database run on the
//! Redis named by `FLASHGATE_FAULTS_REDIS`: `standalone` (the default) or
//! `cluster` (3 masters with a replica each); `make faults` runs them in
//! both. The Redis cases (`redis_*`) are about one standalone Redis's
//! persistence and always run on one; a Redis killed in a cluster is a
//! failover, tested in `failover.rs`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use flashgate_tests::{buy_all, random_user, Attempt, Outcome, RedisMode, Stack, StackOptions};

#[path = "faults/stock_raise.rs"]
mod stock_raise;

const STOCK: i64 = 100;
const FIRST_BURST: usize = 400;
const SECOND_BURST: usize = 200;
const CONCURRENCY: usize = 32;
/// How long the stack may take to settle after a fault.
const SETTLE: Duration = Duration::from_secs(60);

/// The Redis the gateway, backend and database cases run on, from
/// `FLASHGATE_FAULTS_REDIS` (`standalone` when unset).
///
/// # Panics
/// On any other value, so a misspelled mode never runs the standalone
/// suite twice while claiming a cluster.
fn faults_redis() -> RedisMode {
    match std::env::var("FLASHGATE_FAULTS_REDIS").as_deref() {
        Err(_) | Ok("") | Ok("standalone") => RedisMode::Standalone,
        Ok("cluster") => RedisMode::Cluster,
        Ok(other) => {
            panic!("FLASHGATE_FAULTS_REDIS={other:?}: expected \"standalone\" or \"cluster\"")
        }
    }
}

/// A stack on the Redis of [`faults_redis`].
async fn stack() -> Stack {
    Stack::start(StackOptions {
        redis_mode: faults_redis(),
        ..StackOptions::default()
    })
    .await
}

/// The `redis=` field of a report line.
fn redis_label(stack: &Stack) -> &'static str {
    match stack.deployment {
        flashgate_tests::Deployment::Standalone => "standalone",
        flashgate_tests::Deployment::Cluster(_) => "cluster",
        flashgate_tests::Deployment::Sentinel(_) => "sentinel",
    }
}

/// One attempt each by `n` new users.
fn users(n: usize) -> Vec<Attempt> {
    (0..n).map(|_| Attempt::by(&random_user())).collect()
}

/// Starts the first burst in the background.
fn burst(stack: &Stack, sale: &str, n: usize) -> tokio::task::JoinHandle<Vec<Outcome>> {
    let (addr, sale, users) = (stack.gateway_addr, sale.to_owned(), users(n));
    tokio::spawn(async move { buy_all(addr, &sale, users, CONCURRENCY).await })
}

/// Waits a little so the fault lands mid-burst.
async fn mid_burst() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

/// Sells again after recovery, then checks every invariant and prints the
/// report line.
async fn settle_and_check(stack: &Stack, fault: &str, sale: &str, mut outcomes: Vec<Outcome>) {
    outcomes.extend(buy_all(stack.gateway_addr, sale, users(SECOND_BURST), CONCURRENCY).await);
    let winners: Vec<&Outcome> = outcomes.iter().filter(|o| o.won()).collect();
    let deadline = Instant::now() + SETTLE;
    let (rows, remaining) = loop {
        let rows = stack.order_rows(sale).await;
        let remaining = stack.remaining(sale).await;
        let live = rows.iter().filter(|r| r.status != "cancelled").count() as i64;
        let with_order: HashSet<&str> = rows.iter().map(|r| r.reservation_id.as_str()).collect();
        let all_winners = winners.iter().all(|w| {
            w.reservation_id()
                .is_some_and(|rid| with_order.contains(rid))
        });
        if remaining >= 0 && remaining + live == STOCK && all_winners {
            break (rows, remaining);
        }
        assert!(
            Instant::now() < deadline,
            "{fault}: did not settle: remaining {remaining} + live {live} != {STOCK} or a winner has no order (all winners: {all_winners})\nbackend log:\n{}",
            stack.log("flashgate-backend")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let live = rows.iter().filter(|r| r.status != "cancelled").count() as i64;
    assert!(
        live <= STOCK,
        "{fault}: oversold: {live} orders for {STOCK} items"
    );
    let mut per_rid: HashMap<&str, usize> = HashMap::new();
    let mut per_user: HashMap<&str, usize> = HashMap::new();
    for r in &rows {
        *per_rid.entry(&r.reservation_id).or_default() += 1;
        *per_user.entry(&r.user_id).or_default() += 1;
    }
    assert!(
        per_rid.values().all(|&n| n == 1),
        "{fault}: duplicate order for one reservation"
    );
    assert!(
        per_user.values().all(|&n| n == 1),
        "{fault}: a user holds two orders at per_user_limit 1"
    );
    let by_rid: HashMap<&str, &str> = rows
        .iter()
        .map(|r| (r.reservation_id.as_str(), r.user_id.as_str()))
        .collect();
    for w in &winners {
        let rid = w.reservation_id().unwrap_or_default();
        assert_eq!(
            by_rid.get(rid).copied(),
            Some(w.attempt.user.as_str()),
            "{fault}: winner {} has no order of its own",
            w.attempt.user
        );
    }
    let unexpected: Vec<u16> = outcomes
        .iter()
        .map(|o| o.status)
        .filter(|s| ![0, 201, 202, 410, 503].contains(s))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{fault}: unexpected statuses {unexpected:?}"
    );
    println!(
        "fault={fault} redis={} sent={} winners={} orders={} remaining={remaining}",
        redis_label(stack),
        outcomes.len(),
        winners.len(),
        rows.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_sale_with_aof_always_loses_no_winner() {
    let mut stack = Stack::start(StackOptions {
        appendonly: true,
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("f-redis-kill", STOCK, 1).await;
    let first = burst(&stack, "f-redis-kill", FIRST_BURST);
    mid_burst().await;
    stack.redis.restart();
    let outcomes = first.await.unwrap();
    settle_and_check(&stack, "redis_kill9_aof_always", "f-redis-kill", outcomes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_for_three_seconds_answers_503_and_loses_no_winner() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("f-redis-stop", STOCK, 1).await;
    let first = burst(&stack, "f-redis-stop", FIRST_BURST);
    mid_burst().await;
    stack.redis.proc.signal("STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack.redis.proc.signal("CONT");
    let outcomes = first.await.unwrap();
    settle_and_check(&stack, "redis_sigstop_3s", "f-redis-stop", outcomes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_killed_while_draining_loses_no_winner() {
    let mut stack = stack().await;
    stack.open_sale("f-backend-kill", STOCK, 1).await;
    let first = burst(&stack, "f-backend-kill", FIRST_BURST);
    mid_burst().await;
    stack.kill_backend();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stack.start_backend();
    let outcomes = first.await.unwrap();
    settle_and_check(&stack, "backend_kill9", "f-backend-kill", outcomes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_killed_mid_burst_loses_no_winner() {
    let mut stack = stack().await;
    stack.open_sale("f-gateway-kill", STOCK, 1).await;
    let first = burst(&stack, "f-gateway-kill", FIRST_BURST);
    mid_burst().await;
    stack.kill_gateway();
    let outcomes = first.await.unwrap();
    stack.start_gateway();
    settle_and_check(&stack, "gateway_kill9", "f-gateway-kill", outcomes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_locked_for_five_seconds_loses_no_winner() {
    let stack = stack().await;
    stack.open_sale("f-db-lock", STOCK, 1).await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let first = burst(&stack, "f-db-lock", FIRST_BURST);
    // Every write waits on this lock (and fails past SQLite's busy timeout).
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut *conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
    drop(conn);
    pool.close().await;
    let outcomes = first.await.unwrap();
    settle_and_check(&stack, "database_locked_5s", "f-db-lock", outcomes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_to_the_backend_cut_for_three_seconds_loses_no_winner() {
    let stack = stack().await;
    stack.open_sale("f-backend-cut", STOCK, 1).await;
    let first = burst(&stack, "f-backend-cut", FIRST_BURST);
    mid_burst().await;
    // A stopped process accepts nothing and answers nothing: the gateway's
    // forwards time out as on a cut network.
    let backend = stack.backend.as_ref().unwrap();
    backend.signal("STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    backend.signal("CONT");
    let outcomes = first.await.unwrap();
    settle_and_check(&stack, "backend_network_cut_3s", "f-backend-cut", outcomes).await;
}

/// Buys on the gateway at `addr` until it answers a status in `wanted` (or 10 s pass).
async fn buy_until(
    stack: &Stack,
    addr: std::net::SocketAddr,
    sale: &str,
    user: &str,
    key: Option<&str>,
    wanted: &[u16],
) -> u16 {
    let token = flashgate_tests::token(user);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = flashgate_tests::buy(&stack.http, addr, sale, &token, key).await;
        if wanted.contains(&status) || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sale events are lost while the gateways' subscriptions are down (pub/sub
/// delivers at most once): an item comes back unannounced to a gateway
/// still flagging the sale sold out, a buyer wins it elsewhere and never
/// hears the 202; its retry on that gateway must replay the win, and the
/// gateway must sell again soon, not after its flag's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_events_lost_while_subscriptions_drop_never_turn_a_winners_key_away() {
    let stack = Stack::start(StackOptions::default()).await;
    let (_second, second) = stack.start_second_gateway();
    stack.open_sale("lost", 1, 1).await;
    assert_eq!(stack.buy("lost", &random_user(), Some("k")).await.0, 202);
    // Both gateways flag it: one from its own answer, one from the event.
    assert_eq!(
        buy_until(
            &stack,
            stack.gateway_addr,
            "lost",
            &random_user(),
            None,
            &[410]
        )
        .await,
        410
    );
    assert_eq!(
        buy_until(&stack, second, "lost", &random_user(), None, &[410]).await,
        410
    );

    // Every subscription drops, and the restock's `changed` goes out
    // before they stand again (their first retry waits 100 ms).
    let mut conn = stack.redis.conn().await;
    let dropped: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(dropped >= 2, "{dropped} subscriptions dropped");
    stack
        .put_sale("lost", 3, 1, Duration::ZERO, Duration::from_secs(3600))
        .await;

    // A buyer wins on the first gateway (a keyed buy asks Redis, whatever
    // the flag), loses the answer, and retries on the second.
    let z = random_user();
    assert_eq!(
        buy_until(&stack, stack.gateway_addr, "lost", &z, Some("kz"), &[202]).await,
        202
    );
    let (status, v) = flashgate_tests::buy(
        &stack.http,
        second,
        "lost",
        &flashgate_tests::token(&z),
        Some("kz"),
    )
    .await;
    assert!(
        matches!(status, 201 | 202),
        "a winner's retry was answered {status}: {v}"
    );
    // The second gateway's flag went with its subscription: it sells the last item.
    let started = Instant::now();
    assert_eq!(
        buy_until(&stack, second, "lost", &random_user(), None, &[202]).await,
        202,
        "the restocked item never sold on the second gateway"
    );
    println!(
        "fault=events_lost redis=standalone resold_after_ms={}",
        started.elapsed().as_millis()
    );
}
