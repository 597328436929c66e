//! Consumer tests against a real redis-server and a SQLite file.

use std::time::Duration;

use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP};
use flashgate_common::reservation::Reservation;
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

use super::*;
use crate::testing::{reservation, sale, sqlite_url, unique, RedisServer};

fn settings(redis: &RedisServer, consumer: &str, claim_idle: Duration) -> Settings {
    Settings {
        redis: redis.config(),
        consumer_name: consumer.to_owned(),
        batch_size: 3,
        block: Duration::from_millis(100),
        claim_idle,
        forward_grace: Duration::ZERO,
        sale_poll: Duration::from_millis(50),
        max_deliveries: 3,
        metrics: std::sync::Arc::new(crate::metrics::Metrics::register()),
        readiness: None,
    }
}

/// What the deduct script does for a winner: the `resv` entry and the record.
async fn reserve(conn: &mut MultiplexedConnection, r: &Reservation) {
    count_in_redis(conn, r).await;
    let keys = SaleKeys::new(&r.sale_id);
    let _: String = redis::cmd("XADD")
        .arg(&keys.stream)
        .arg("*")
        .arg(fields::RECORD)
        .arg(r.record())
        .query_async(conn)
        .await
        .unwrap();
}

/// The `resv` entry of a winner: Redis counts its reservation.
async fn count_in_redis(conn: &mut MultiplexedConnection, r: &Reservation) {
    let () = redis::cmd("HSET")
        .arg(SaleKeys::new(&r.sale_id).reservations)
        .arg(&r.reservation_id)
        .arg(&r.user_id)
        .query_async(conn)
        .await
        .unwrap();
}

async fn create_group(conn: &mut MultiplexedConnection, sale_id: &str) {
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(SaleKeys::new(sale_id).stream)
        .arg(CONSUMER_GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await
        .unwrap();
}

/// Reads every new entry as `consumer` without acknowledging, as a process
/// that crashed right after reading would.
async fn read_without_ack(conn: &mut MultiplexedConnection, sale_id: &str, consumer: &str) {
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(CONSUMER_GROUP)
        .arg(consumer)
        .arg("STREAMS")
        .arg(SaleKeys::new(sale_id).stream)
        .arg(">")
        .query_async(conn)
        .await
        .unwrap();
}

async fn pending(conn: &mut MultiplexedConnection, sale_id: &str) -> i64 {
    let reply: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(SaleKeys::new(sale_id).stream)
        .arg(CONSUMER_GROUP)
        .query_async(conn)
        .await
        .unwrap();
    reply.0
}

async fn wait_for_orders(store: &Store, sale_id: &str, expected: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = store.orders().count_live(sale_id).await.unwrap();
        if n == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {expected} orders, have {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a consumer for `sale_id`; stop it with the returned sender.
fn spawn(
    sale_id: &str,
    store: &Store,
    settings: Settings,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = watch::channel(false);
    (
        stop,
        tokio::spawn(consume_sale(
            sale_id.to_owned(),
            store.clone(),
            settings,
            stopped,
        )),
    )
}

async fn stop(stop: watch::Sender<bool>, task: tokio::task::JoinHandle<()>) {
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("consumer stops on shutdown")
        .unwrap();
}

#[tokio::test]
async fn stream_entries_become_orders_once_and_are_acknowledged() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    let batch: Vec<_> = (0..7)
        .map(|i| reservation(&sale_id, &format!("u{i}")))
        .collect();
    for r in &batch {
        reserve(&mut conn, r).await;
    }
    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "c1", Duration::from_secs(60)),
    );
    wait_for_orders(&store, &sale_id, 7).await;

    // The same reservation appended again (a replayed record) adds nothing.
    reserve(&mut conn, &batch[0]).await;
    reserve(&mut conn, &reservation(&sale_id, "late")).await;
    wait_for_orders(&store, &sale_id, 8).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(store.orders().count_live(&sale_id).await.unwrap(), 8);
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    for r in &batch {
        assert!(store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .is_some());
    }
    stop(tx, task).await;
}

#[tokio::test]
async fn a_restarted_consumer_rereads_its_own_pending_entries() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    create_group(&mut conn, &sale_id).await;
    for i in 0..4 {
        reserve(&mut conn, &reservation(&sale_id, &format!("u{i}"))).await;
    }
    read_without_ack(&mut conn, &sale_id, "same-name").await;
    assert_eq!(pending(&mut conn, &sale_id).await, 4);

    // claim_idle is long: only the re-read of its own pending list can help.
    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "same-name", Duration::from_secs(600)),
    );
    wait_for_orders(&store, &sale_id, 4).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    stop(tx, task).await;
}

#[tokio::test]
async fn entries_left_pending_by_a_dead_consumer_are_claimed() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    create_group(&mut conn, &sale_id).await;
    for i in 0..5 {
        reserve(&mut conn, &reservation(&sale_id, &format!("u{i}"))).await;
    }
    read_without_ack(&mut conn, &sale_id, "dead").await;

    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "alive", Duration::from_millis(200)),
    );
    wait_for_orders(&store, &sale_id, 5).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    stop(tx, task).await;
}

#[tokio::test]
async fn malformed_entries_move_to_the_dead_letter_stream_without_orders() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    let stream = SaleKeys::new(&sale_id).stream;
    // Earlier layout: no user field, then another sale's with a bad time.
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("rid")
        .arg("x")
        .arg("sale")
        .arg(&sale_id)
        .arg("ts")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let other = reservation(&unique("other"), "u");
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("rid")
        .arg(&other.reservation_id)
        .arg("sale")
        .arg(&other.sale_id)
        .arg("user")
        .arg("u")
        .arg("ts")
        .arg("not-a-number")
        .query_async(&mut conn)
        .await
        .unwrap();
    // One-field records: another sale's (well formed), then one whose
    // time is not a number.
    let bad_time = reservation(&sale_id, "u")
        .record()
        .replacen(" u ", " u five ", 1);
    for record in [other.record(), bad_time] {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg(fields::RECORD)
            .arg(record)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    reserve(&mut conn, &reservation(&sale_id, "good")).await;

    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "c1", Duration::from_secs(60)),
    );
    wait_for_orders(&store, &sale_id, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    assert_eq!(store.orders().count_live(&other.sale_id).await.unwrap(), 0);
    let dead = crate::stream::dead_letter::list(&mut conn, &sale_id)
        .await
        .unwrap();
    assert_eq!(dead.len(), 4, "{dead:?}");
    assert!(dead[0].error.contains("`user`"), "{dead:?}");
    assert!(dead[1].error.contains("`ts`"), "{dead:?}");
    assert_eq!(dead[1].fields["ts"], "not-a-number");
    assert!(dead[2].error.contains("`sale`"), "{dead:?}");
    assert_eq!(dead[2].reservation.as_ref(), Some(&other), "{dead:?}");
    assert!(dead[3].error.contains("`ts`"), "{dead:?}");
    assert_eq!(dead[3].reservation, None, "{dead:?}");
    stop(tx, task).await;
}

#[tokio::test]
async fn a_record_of_the_earlier_layout_becomes_its_order() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    create_group(&mut conn, &sale_id).await;
    let keys = SaleKeys::new(&sale_id);
    let r = Reservation {
        idempotency_key: "key with spaces".into(),
        ..reservation(&sale_id, "old")
    };
    count_in_redis(&mut conn, &r).await;
    // As a gateway of the earlier release wrote it: one field per part.
    let _: String = redis::cmd("XADD")
        .arg(&keys.stream)
        .arg("*")
        .arg("rid")
        .arg(&r.reservation_id)
        .arg("sale")
        .arg(&r.sale_id)
        .arg("user")
        .arg(&r.user_id)
        .arg("idem")
        .arg(&r.idempotency_key)
        .arg("ts")
        .arg(r.reserved_at_ms)
        .query_async(&mut conn)
        .await
        .unwrap();

    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "c1", Duration::from_secs(60)),
    );
    wait_for_orders(&store, &sale_id, 1).await;
    let mut resync = store.locks().begin_resync(&sale_id).await.unwrap();
    let written = resync.orders(&sale_id).await.unwrap();
    resync.commit().await.unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(
        (
            written[0].row.reservation_id.as_str(),
            written[0].row.user_id.as_str(),
            written[0].idempotency_key.as_str(),
            written[0].reserved_at_ms
        ),
        (
            r.reservation_id.as_str(),
            "old",
            "key with spaces",
            r.reserved_at_ms
        )
    );
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    stop(tx, task).await;
}

#[tokio::test]
async fn an_entry_the_database_keeps_rejecting_is_dead_lettered_then_retried_once_fixed() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let url = sqlite_url();
    let store = Store::connect(&url).await.unwrap();
    let sale_id = unique("s");
    create_group(&mut conn, &sale_id).await;
    // The database rejects this one user's orders, as a constraint would.
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON orders WHEN NEW.user_id = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
    )
    .execute(&pool)
    .await
    .unwrap();
    reserve(&mut conn, &reservation(&sale_id, "before")).await;
    reserve(&mut conn, &reservation(&sale_id, "poison")).await;
    reserve(&mut conn, &reservation(&sale_id, "after")).await;

    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "c1", Duration::from_secs(60)),
    );
    wait_for_orders(&store, &sale_id, 2).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let dead = crate::stream::dead_letter::list(&mut conn, &sale_id)
            .await
            .unwrap();
        if !dead.is_empty() || tokio::time::Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].reservation.as_ref().unwrap().user_id, "poison");
    assert!(dead[0].error.contains("poison refused"), "{dead:?}");
    assert!(dead[0].deliveries >= 3, "{dead:?}");
    assert_eq!(
        pending(&mut conn, &sale_id).await,
        0,
        "the poison entry no longer blocks the stream"
    );

    sqlx::query("DROP TRIGGER refuse_poison")
        .execute(&pool)
        .await
        .unwrap();
    let requeued = crate::stream::dead_letter::retry(&mut conn, &sale_id, &dead[0].entry_id)
        .await
        .unwrap();
    assert!(requeued.is_some());
    wait_for_orders(&store, &sale_id, 3).await;
    assert!(crate::stream::dead_letter::list(&mut conn, &sale_id)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        crate::stream::dead_letter::retry(&mut conn, &sale_id, &dead[0].entry_id)
            .await
            .unwrap(),
        None
    );
    stop(tx, task).await;
}

#[tokio::test]
async fn consumers_start_for_sales_added_while_running() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (stop_tx, stopped) = watch::channel(false);
    let supervisor = tokio::spawn(run(
        store.clone(),
        settings(&redis, "c1", Duration::from_secs(60)),
        stopped,
    ));

    let sale_id = unique("s");
    store
        .sales()
        .insert_if_absent(&sale(&sale_id, 10))
        .await
        .unwrap();
    reserve(&mut conn, &reservation(&sale_id, "u")).await;
    wait_for_orders(&store, &sale_id, 1).await;

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), supervisor)
        .await
        .expect("supervisor stops")
        .unwrap();
}

#[tokio::test]
async fn a_consumer_keeps_retrying_while_redis_is_down_and_stops_on_shutdown() {
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let settings = Settings {
        redis: flashgate_common::config::RedisConfig {
            timeout: Duration::from_millis(100),
            ..flashgate_common::config::RedisConfig::standalone("redis://127.0.0.1:1/")
        },
        consumer_name: "c".into(),
        batch_size: 10,
        block: Duration::from_millis(100),
        claim_idle: Duration::from_secs(1),
        forward_grace: Duration::ZERO,
        sale_poll: Duration::from_millis(50),
        max_deliveries: 3,
        metrics: std::sync::Arc::new(crate::metrics::Metrics::register()),
        readiness: None,
    };
    let (tx, task) = spawn("s", &store, settings);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !task.is_finished(),
        "the consumer must not exit on Redis errors"
    );
    stop(tx, task).await;
}

#[test]
fn backoff_grows_to_five_seconds_and_resets() {
    let mut b = Backoff::default();
    let waits: Vec<_> = (0..8).map(|_| b.next().as_millis()).collect();
    assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    b.reset();
    assert_eq!(b.next().as_millis(), 200);
}

#[tokio::test]
async fn an_archived_sale_whose_window_is_open_is_made_live_again() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    store
        .sales()
        .insert_if_absent(&sale(&sale_id, 10))
        .await
        .unwrap();
    // Archived while its window is open (an operator's change whose
    // unarchive failed): the supervisor undoes it and consumes the sale.
    let () = redis::cmd("SADD")
        .arg(flashgate_common::keys::ARCHIVED_SALES)
        .arg(&sale_id)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (stop_tx, stopped) = watch::channel(false);
    let supervisor = tokio::spawn(run(
        store.clone(),
        settings(&redis, "c1", Duration::from_secs(60)),
        stopped,
    ));
    reserve(&mut conn, &reservation(&sale_id, "u")).await;
    wait_for_orders(&store, &sale_id, 1).await;
    assert!(!retention::archived(&mut conn)
        .await
        .unwrap()
        .contains(&sale_id));

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), supervisor)
        .await
        .expect("supervisor stops")
        .unwrap();
}

#[tokio::test]
async fn an_archived_sale_that_redis_still_sells_by_a_later_window_is_made_live_again() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    // The database holds a window that ended long ago ...
    let ended = SaleSpec {
        starts_at_ms: 0,
        ends_at_ms: 1_000,
        ..sale(&sale_id, 10)
    };
    store.sales().insert_if_absent(&ended).await.unwrap();
    // ... while Redis sells by a later one (a change that died between
    // Redis and the database commit), and the sale is archived.
    let keys = flashgate_common::keys::SaleKeys::new(&sale_id);
    let open = sale(&sale_id, 10);
    let () = redis::cmd("HSET")
        .arg(&keys.meta)
        .arg("starts_at_ms")
        .arg(open.starts_at_ms)
        .arg("ends_at_ms")
        .arg(open.ends_at_ms)
        .arg("per_user_limit")
        .arg(1)
        .arg("paused")
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = redis::cmd("SET")
        .arg(&keys.remaining)
        .arg(10)
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = redis::cmd("SADD")
        .arg(flashgate_common::keys::ARCHIVED_SALES)
        .arg(&sale_id)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (stop_tx, stopped) = watch::channel(false);
    let supervisor = tokio::spawn(run(
        store.clone(),
        settings(&redis, "c1", Duration::from_secs(60)),
        stopped,
    ));
    reserve(&mut conn, &reservation(&sale_id, "u")).await;
    wait_for_orders(&store, &sale_id, 1).await;
    assert!(!retention::archived(&mut conn)
        .await
        .unwrap()
        .contains(&sale_id));

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), supervisor)
        .await
        .expect("supervisor stops")
        .unwrap();
}

#[tokio::test]
async fn entries_the_forward_already_wrote_are_acknowledged_without_asking_redis_or_writing() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale_id = unique("s");
    let forwarded: Vec<_> = (0..5)
        .map(|i| reservation(&sale_id, &format!("u{i}")))
        .collect();
    for r in &forwarded {
        reserve(&mut conn, r).await;
    }
    store.orders().insert(&forwarded).await.unwrap();
    let hmgets = redis.command_calls("hmget").await;
    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings(&redis, "c1", Duration::from_secs(60)),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while redis.command_calls("xack").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the entries were never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    assert_eq!(
        redis.command_calls("hmget").await,
        hmgets,
        "no reservation checked in redis"
    );
    // One entry the forward did not write: checked and written.
    reserve(&mut conn, &reservation(&sale_id, "new")).await;
    wait_for_orders(&store, &sale_id, 6).await;
    assert!(redis.command_calls("hmget").await > hmgets);
    stop(tx, task).await;
}

/// A sale of 10 in PostgreSQL, whose stream is on a Redis of its own.
struct OpenSale {
    redis: RedisServer,
    conn: MultiplexedConnection,
    store: Store,
    sale_id: String,
}

impl OpenSale {
    async fn new() -> Self {
        let redis = RedisServer::start().await;
        let conn = redis.conn().await;
        let store = Store::connect(&crate::testing::postgres_url().await)
            .await
            .unwrap();
        let sale_id = unique("s");
        store
            .sales()
            .insert_if_absent(&sale(&sale_id, 10))
            .await
            .unwrap();
        Self {
            redis,
            conn,
            store,
            sale_id,
        }
    }
}

/// [`settings`] with `grace`, on a consumer named `c1` that claims nothing.
fn settings_with_grace(redis: &RedisServer, grace: Duration) -> Settings {
    Settings {
        forward_grace: grace,
        ..settings(redis, "c1", Duration::from_secs(60))
    }
}

/// Waits until the group has read every entry and acknowledged it: no lag
/// (an entry not yet read, say the next batch's) and nothing pending.
async fn wait_until_acknowledged(
    redis: &RedisServer,
    conn: &mut MultiplexedConnection,
    sale_id: &str,
) {
    let stream = SaleKeys::new(sale_id).stream;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (lag, pending) = flashgate_common::stream_info::group_backlog(conn, &stream)
            .await
            .unwrap();
        if lag == 0 && pending == 0 && redis.command_calls("xack").await > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the entries were never acknowledged: lag {lag}, pending {pending}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn with_a_grace_orders_the_forward_wrote_in_time_are_only_acknowledged_by_the_consumer() {
    let OpenSale {
        redis,
        mut conn,
        store,
        sale_id,
    } = OpenSale::new().await;
    let settings = settings_with_grace(&redis, Duration::from_secs(2));
    let metrics = settings.metrics.clone();
    let (tx, task) = spawn(&sale_id, &store, settings);
    let winners: Vec<_> = (0..5)
        .map(|i| reservation(&sale_id, &format!("u{i}")))
        .collect();
    for r in &winners {
        reserve(&mut conn, r).await;
    }
    // The forward's write, as `POST /internal/orders/batch` does it.
    let forwarded = crate::counted::write_counted(&store, &mut conn, &winners)
        .await
        .unwrap();
    assert_eq!(forwarded.created.len(), 5);

    wait_until_acknowledged(&redis, &mut conn, &sale_id).await;
    assert_eq!(store.orders().count_live(&sale_id).await.unwrap(), 5);
    assert_eq!(
        metrics.orders_created.with_label_values(&["stream"]).get(),
        0,
        "the consumer wrote nothing"
    );
    assert_eq!(
        metrics.orders_existing.with_label_values(&["stream"]).get(),
        0,
        "nor tried to"
    );
    assert_eq!(metrics.stream_already_written.get(), 5);
    stop(tx, task).await;
}

#[tokio::test]
async fn with_a_grace_the_consumer_writes_every_order_the_forward_missed() {
    let OpenSale {
        redis,
        mut conn,
        store,
        sale_id,
    } = OpenSale::new().await;
    let settings = settings_with_grace(&redis, Duration::from_millis(300));
    let metrics = settings.metrics.clone();
    let (tx, task) = spawn(&sale_id, &store, settings);
    for i in 0..7 {
        reserve(&mut conn, &reservation(&sale_id, &format!("u{i}"))).await;
    }
    wait_for_orders(&store, &sale_id, 7).await;
    wait_until_acknowledged(&redis, &mut conn, &sale_id).await;
    assert_eq!(
        metrics.orders_created.with_label_values(&["stream"]).get(),
        7
    );
    stop(tx, task).await;
}

#[tokio::test]
async fn an_entry_held_for_the_grace_at_shutdown_stays_pending_and_is_written_at_the_next_start() {
    let OpenSale {
        redis,
        mut conn,
        store,
        sale_id,
    } = OpenSale::new().await;
    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings_with_grace(&redis, Duration::from_secs(30)),
    );
    reserve(&mut conn, &reservation(&sale_id, "u0")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pending(&mut conn, &sale_id).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer never read the entry"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Shutdown does not wait for the grace, and nothing is written.
    stop(tx, task).await;
    assert_eq!(store.orders().count_live(&sale_id).await.unwrap(), 0);
    assert_eq!(pending(&mut conn, &sale_id).await, 1);

    let (tx, task) = spawn(
        &sale_id,
        &store,
        settings_with_grace(&redis, Duration::from_millis(100)),
    );
    wait_for_orders(&store, &sale_id, 1).await;
    wait_until_acknowledged(&redis, &mut conn, &sale_id).await;
    stop(tx, task).await;
}

#[tokio::test]
async fn a_crash_between_commit_and_ack_loses_nothing_and_doubles_nothing() {
    let OpenSale {
        redis,
        mut conn,
        store,
        sale_id,
    } = OpenSale::new().await;
    create_group(&mut conn, &sale_id).await;
    let winners: Vec<_> = (0..4)
        .map(|i| reservation(&sale_id, &format!("u{i}")))
        .collect();
    for r in &winners {
        reserve(&mut conn, r).await;
    }
    // Read as "c1", three of the four committed, then the process died
    // before its XACK.
    read_without_ack(&mut conn, &sale_id, "c1").await;
    crate::counted::write_counted(&store, &mut conn, &winners[..3])
        .await
        .unwrap();

    let settings = settings_with_grace(&redis, Duration::from_millis(200));
    let metrics = settings.metrics.clone();
    let (tx, task) = spawn(&sale_id, &store, settings);
    wait_for_orders(&store, &sale_id, 4).await;
    wait_until_acknowledged(&redis, &mut conn, &sale_id).await;
    assert_eq!(
        metrics.orders_created.with_label_values(&["stream"]).get(),
        1
    );
    assert_eq!(metrics.stream_already_written.get(), 3);
    assert_eq!(store.orders().count_live(&sale_id).await.unwrap(), 4);
    for r in &winners {
        assert!(store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .is_some());
    }
    stop(tx, task).await;
}

#[tokio::test]
async fn with_the_forward_dead_entries_after_the_first_batch_are_written_without_waiting_the_grace()
{
    let OpenSale {
        redis,
        mut conn,
        store,
        sale_id,
    } = OpenSale::new().await;
    let grace = Duration::from_secs(6);
    let settings = settings_with_grace(&redis, grace);
    let metrics = settings.metrics.clone();
    let (tx, task) = spawn(&sale_id, &store, settings);
    // No forward writes anything: the first batch waits the grace and
    // finds its entry unwritten.
    reserve(&mut conn, &reservation(&sale_id, "u0")).await;
    wait_for_orders(&store, &sale_id, 1).await;

    // Every later entry is written at once, in several batches (3 a batch):
    // all of them have orders well before the grace could have passed.
    let appended = std::time::Instant::now();
    for i in 1..8 {
        reserve(&mut conn, &reservation(&sale_id, &format!("u{i}"))).await;
    }
    let by = appended + grace / 2;
    while store.orders().count_live(&sale_id).await.unwrap() < 8 {
        assert!(
            std::time::Instant::now() < by,
            "entries after the first batch waited for a forward that is not delivering"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_until_acknowledged(&redis, &mut conn, &sale_id).await;
    assert_eq!(
        metrics.orders_created.with_label_values(&["stream"]).get(),
        8
    );
    stop(tx, task).await;
}

#[test]
fn the_grace_wait_is_what_is_left_of_it_and_never_longer() {
    let grace = Duration::from_millis(1000);
    assert_eq!(wait_left(grace, 5000), Duration::ZERO);
    assert_eq!(wait_left(grace, 400), Duration::from_millis(600));
    // An entry "from the future" (a clock stepped back) waits the grace, no more.
    assert_eq!(wait_left(grace, -60_000), grace);
    assert_eq!(wait_left(Duration::ZERO, 0), Duration::ZERO);
    assert_eq!(entry_ms("1700000000123-7"), Some(1_700_000_000_123));
    assert_eq!(entry_ms("bad"), None);
}

#[test]
fn batches_wait_only_while_the_forward_writes_most_of_them_and_probe_for_it_otherwise() {
    let grace = Duration::from_secs(1);
    let start = Instant::now();
    let mut forward = ForwardWatch::default();
    assert!(forward.waits(grace, start), "a session starts waiting");
    assert!(!forward.waits(Duration::ZERO, start), "no grace, no wait");

    forward.settling(start);
    forward.checked(Checked {
        entries: 4,
        written: 1,
    });
    assert!(
        !forward.waits(grace, start + grace),
        "after a batch the forward mostly missed: at once"
    );
    forward.checked(Checked {
        entries: 0,
        written: 0,
    });
    assert!(
        !forward.waits(grace, start + grace),
        "a batch of no reservations tells nothing"
    );
    assert!(
        forward.waits(grace, start + grace * PROBE_GRACES),
        "one batch in a while probes for the forward"
    );

    forward.checked(Checked {
        entries: 4,
        written: 2,
    });
    assert!(
        forward.waits(grace, start + grace),
        "the forward wrote half of a batch: waiting resumes"
    );
    forward.checked(Checked {
        entries: 3,
        written: 3,
    });
    assert!(forward.waits(grace, start + grace));
}

#[tokio::test]
async fn a_batch_written_without_the_read_first_gives_each_reservation_one_order_and_new_ones_their_event(
) {
    let OpenSale {
        redis,
        mut conn,
        store,
        sale_id,
    } = OpenSale::new().await;
    let store = store.with_order_events(true);
    let settings = settings_with_grace(&redis, Duration::ZERO);
    let metrics = settings.metrics.clone();
    let winners: Vec<_> = (0..7)
        .map(|i| reservation(&sale_id, &format!("u{i}")))
        .collect();
    for r in &winners {
        reserve(&mut conn, r).await;
    }
    // The forward wrote four of them; the item of the fourth went back
    // since, so Redis no longer counts its reservation.
    let forwarded = crate::counted::write_counted(&store, &mut conn, &winners[..4])
        .await
        .unwrap();
    assert_eq!(forwarded.created.len(), 4);
    let () = redis::cmd("HDEL")
        .arg(SaleKeys::new(&sale_id).reservations)
        .arg(&winners[3].reservation_id)
        .query_async(&mut conn)
        .await
        .unwrap();

    let consumer = Consumer {
        sale_id: &sale_id,
        stream: SaleKeys::new(&sale_id).stream,
        store: &store,
        settings: &settings,
    };
    let mut handle = redis_io::consumer_connection(&settings.redis, settings.block)
        .await
        .unwrap();
    consumer.ensure_group(&mut handle).await.unwrap();
    let mut entries = Vec::new();
    loop {
        let batch = consumer.read(&mut handle, ">", None).await.unwrap();
        if batch.is_empty() {
            break;
        }
        entries.extend(batch);
    }
    assert_eq!(entries.len(), 7);

    let checked = consumer.process(&mut handle, entries, false).await.unwrap();
    assert_eq!(
        checked,
        Checked {
            entries: 7,
            written: 4
        },
        "the insert (and, for the one Redis no longer counts, a read) found the forward's four"
    );
    assert_eq!(metrics.stream_already_written.get(), 0, "no read first");
    assert_eq!(
        metrics.orders_created.with_label_values(&["stream"]).get(),
        3
    );
    assert_eq!(pending(&mut conn, &sale_id).await, 0);
    assert_eq!(store.orders().count_live(&sale_id).await.unwrap(), 7);
    for r in &winners {
        let order = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .expect("an order per reservation");
        let events = store.outbox().of_order(&order.order_id).await.unwrap();
        assert_eq!(events.len(), 1, "one order.created per order: {events:?}");
    }
}
