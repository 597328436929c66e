//! Restore, stock return and payment timeout against a real redis-server
//! and a SQLite file.

use flashgate_common::keys::SaleKeys;
use redis::AsyncCommands;

use super::*;
use crate::testing::{reservation, sale, sqlite_url, unique, RedisServer};
use crate::timeout::expire_once;

/// Re-syncs a sale a restore installed (fenced), as the loop's next pass,
/// the start-up preheat or the admin API would.
async fn resynced(conn: &mut redis::aio::MultiplexedConnection, store: &Store, id: &str) {
    let fence = crate::fence::Resyncer::new(
        std::time::Duration::from_secs(600),
        prometheus::IntCounter::new("s", "s").unwrap(),
    );
    assert!(matches!(
        fence.resync(conn, store, id).await.unwrap(),
        crate::fence::Resynced::Synced { .. }
    ));
}

#[tokio::test]
async fn a_lost_sale_is_restored_counting_live_orders_and_in_flight_reservations() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 10);
    store.sales().upsert(&spec).await.unwrap();
    let (a, b, c) = (
        reservation(&id, "a"),
        reservation(&id, "b"),
        reservation(&id, "c"),
    );
    store
        .orders()
        .insert(&[a.clone(), b.clone(), c.clone()])
        .await
        .unwrap();
    let c_order = store
        .orders()
        .by_reservation(&c.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(store
        .orders()
        .cancel_if_unpaid(&c_order.order_id)
        .await
        .unwrap());
    // A reservation that survived in Redis but has no order yet.
    let keys = SaleKeys::new(&id);
    let d = reservation(&id, "d");
    let () = conn
        .hset(&keys.reservations, &d.reservation_id, "d")
        .await
        .unwrap();

    let restored = restore(&mut conn, &store, &spec.id).await.unwrap();
    assert_eq!(
        restored,
        Restored::Loaded {
            remaining: 7,
            live_orders: 2,
            in_flight: 1
        }
    );
    let buyers: HashMap<String, i64> = conn.hgetall(&keys.buyers).await.unwrap();
    assert_eq!(
        buyers,
        HashMap::from([("a".into(), 1), ("b".into(), 1), ("d".into(), 1)])
    );
    // The cancelled order's item is already counted as back: no second return.
    let released: bool = conn
        .sismember(&keys.released, &c.reservation_id)
        .await
        .unwrap();
    assert!(released);
    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 0);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 7);
    // Restoring again changes nothing.
    assert_eq!(
        restore(&mut conn, &store, &spec.id).await.unwrap(),
        Restored::NotNeeded
    );
}

#[tokio::test]
async fn release_returns_an_item_once_and_waits_for_a_missing_sale() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let keys = SaleKeys::new(&id);
    let call = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let keys = keys.clone();
        async move {
            RELEASE
                .key(&keys.meta)
                .key(&keys.remaining)
                .key(&keys.buyers)
                .key(&keys.reservations)
                .key(&keys.released)
                .arg("r1")
                .arg("u")
                .invoke_async::<i64>(&mut conn)
                .await
                .unwrap()
        }
    };
    assert_eq!(call(&mut conn).await, -1, "absent sale: nothing changes");
    store.sales().upsert(&sale(&id, 5)).await.unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &sale(&id, 5))
        .await
        .unwrap();
    let () = conn.set(&keys.remaining, 4).await.unwrap();
    let () = conn.hset(&keys.buyers, "u", 1).await.unwrap();
    let () = conn.hset(&keys.reservations, "r1", "u").await.unwrap();
    assert_eq!(call(&mut conn).await, 1);
    assert_eq!(call(&mut conn).await, 0);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 5);
    assert_eq!(
        conn.hget::<_, _, Option<i64>>(&keys.buyers, "u")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn unpaid_orders_past_the_timeout_are_cancelled_and_their_items_return_once() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 5);
    store.sales().upsert(&spec).await.unwrap();
    store.sales().set_payment_timeout(&id, 60).await.unwrap();
    let (paid, unpaid) = (reservation(&id, "payer"), reservation(&id, "idler"));
    store
        .orders()
        .insert(&[paid.clone(), unpaid.clone()])
        .await
        .unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec)
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 3);
    let paid_order = store
        .orders()
        .by_reservation(&paid.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store.orders().pay(&paid_order.order_id).await.unwrap(),
        crate::store::Payment::Paid(_)
    ));

    let now = flashgate_common::now_ms();
    assert_eq!(
        expire_once(&mut conn, &store, now).await.unwrap(),
        crate::timeout::ExpiryPass::default(),
        "not yet due"
    );
    let pass = expire_once(&mut conn, &store, now + 61_000).await.unwrap();
    assert_eq!((pass.cancelled, pass.returned), (1, 1));
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 4);
    assert_eq!(
        conn.hget::<_, _, Option<i64>>(&keys.buyers, "idler")
            .await
            .unwrap(),
        None,
        "the buyer may buy again"
    );
    let again = expire_once(&mut conn, &store, now + 120_000).await.unwrap();
    assert_eq!((again.cancelled, again.returned), (0, 0));
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 4);
    // A payment arriving after the cancellation is refused.
    let unpaid_order = store
        .orders()
        .by_reservation(&unpaid.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store.orders().pay(&unpaid_order.order_id).await.unwrap(),
        crate::store::Payment::Cancelled(_)
    ));
}

#[tokio::test]
async fn a_cancelled_order_whose_reservation_redis_never_counted_returns_no_item() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 5);
    store.sales().upsert(&spec).await.unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec)
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);
    // Written from the forward after Redis lost the reservation: Redis
    // never took its item out of `remaining`.
    let lost = reservation(&id, "u");
    store
        .orders()
        .insert(std::slice::from_ref(&lost))
        .await
        .unwrap();
    let order = store
        .orders()
        .by_reservation(&lost.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(store
        .orders()
        .cancel_if_unpaid(&order.order_id)
        .await
        .unwrap());

    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 0);
    assert_eq!(
        conn.get::<_, i64>(&keys.remaining).await.unwrap(),
        5,
        "no item may appear from nowhere"
    );
    assert_eq!(
        return_stock(&mut conn, &store).await.unwrap(),
        0,
        "done once: not retried"
    );
    // Reconciliation cannot count it afterwards either.
    let report = crate::reconcile::reconcile_sale(&mut conn, &store, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.adopted, report.remaining, report.drift), (0, 5, 0));
}

#[tokio::test]
async fn an_order_restored_from_the_database_then_cancelled_returns_its_item_once() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 5);
    store.sales().upsert(&spec).await.unwrap();
    let kept = reservation(&id, "u");
    store
        .orders()
        .insert(std::slice::from_ref(&kept))
        .await
        .unwrap();
    // Redis lost everything; the restore counts the live order.
    assert!(matches!(
        restore(&mut conn, &store, &spec.id).await.unwrap(),
        Restored::Loaded { remaining: 4, .. }
    ));
    let keys = SaleKeys::new(&id);
    let order = store
        .orders()
        .by_reservation(&kept.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(store
        .orders()
        .cancel_if_unpaid(&order.order_id)
        .await
        .unwrap());

    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 1);
    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 0);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 5);
    assert_eq!(
        conn.hget::<_, _, Option<i64>>(&keys.buyers, "u")
            .await
            .unwrap(),
        None,
        "the buyer may buy again"
    );
}

/// Patterns at which a restorer is stopped just before its first write to
/// the sale's live keys: a `DEL` or a script call.
fn before_writes() -> Vec<&'static [u8]> {
    vec![b"$3\r\nDEL\r\n", b"$7\r\nEVALSHA\r\n"]
}

#[tokio::test]
async fn a_restore_overtaken_by_another_changes_nothing_and_no_user_wins_twice() {
    let redis = RedisServer::start().await;
    let gate = crate::testing::Gate::start(&redis, before_writes()).await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 10);
    store.sales().upsert(&spec).await.unwrap();
    store
        .orders()
        .insert(&[reservation(&id, "early")])
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);

    // Restorer B has its snapshot and is stopped before it writes; its lock
    // expires (a stalled process), and restorer A restores the sale.
    let mut slow = redis::Client::open(gate.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let slow_store = store.clone();
    let slow_spec = spec.clone();
    let b = tokio::spawn(async move {
        restore(&mut slow, &slow_store, &slow_spec.id)
            .await
            .unwrap()
    });
    gate.holding().await;
    let () = conn.del(&keys.restoring).await.unwrap();
    assert!(matches!(
        restore(&mut conn, &store, &spec.id).await.unwrap(),
        Restored::Loaded { remaining: 9, .. }
    ));
    resynced(&mut conn, &store, &id).await;
    // The sale is live: a limit-1 user wins once.
    assert_eq!(crate::testing::buy(&mut conn, &id, "v").await, "won");
    assert_eq!(
        crate::testing::buy(&mut conn, &id, "early").await,
        "limit_reached"
    );

    gate.open();
    assert_eq!(b.await.unwrap(), Restored::NotNeeded);
    assert_eq!(
        crate::testing::buy(&mut conn, &id, "v").await,
        "limit_reached",
        "v must not win twice"
    );
    assert_eq!(
        crate::testing::buy(&mut conn, &id, "early").await,
        "limit_reached"
    );
    let buyers: HashMap<String, i64> = conn.hgetall(&keys.buyers).await.unwrap();
    assert_eq!(
        buyers,
        HashMap::from([("early".into(), 1), ("v".into(), 1)])
    );
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 8);
    assert_eq!(conn.hlen::<_, i64>(&keys.reservations).await.unwrap(), 2);
}

#[tokio::test]
async fn a_restorer_that_lost_its_lock_installs_nothing() {
    let redis = RedisServer::start().await;
    let gate = crate::testing::Gate::start(&redis, before_writes()).await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 10);
    store.sales().upsert(&spec).await.unwrap();
    let keys = SaleKeys::new(&id);

    let mut slow = redis::Client::open(gate.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let slow_store = store.clone();
    let slow_spec = spec.clone();
    let b = tokio::spawn(async move {
        restore(&mut slow, &slow_store, &slow_spec.id)
            .await
            .unwrap()
    });
    gate.holding().await;
    // Its lock expired and another restorer holds it now.
    let () = conn.set(&keys.restoring, "someone-else").await.unwrap();
    gate.open();
    assert_eq!(b.await.unwrap(), Restored::Busy);
    assert!(
        !conn.exists::<_, bool>(&keys.meta).await.unwrap(),
        "only the lock holder may install the sale"
    );
    let leftovers: Vec<String> = conn.keys(format!("fg:{{sale:{id}}}:*")).await.unwrap();
    assert_eq!(
        leftovers,
        vec![keys.restoring.clone()],
        "scratch keys are dropped"
    );
}

#[tokio::test]
async fn two_restores_of_one_lost_sale_at_once_load_it_once() {
    let redis = RedisServer::start().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 10);
    store.sales().upsert(&spec).await.unwrap();
    store
        .orders()
        .insert(&[reservation(&id, "a"), reservation(&id, "b")])
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);
    for _ in 0..20 {
        let (mut one, mut two) = (redis.conn().await, redis.conn().await);
        let (x, y) = tokio::join!(
            restore(&mut one, &store, &spec.id),
            restore(&mut two, &store, &spec.id)
        );
        let mut results = [x.unwrap(), y.unwrap()];
        results.sort_by_key(|r| !matches!(r, Restored::Loaded { .. }));
        assert_eq!(
            results[0],
            Restored::Loaded {
                remaining: 8,
                live_orders: 2,
                in_flight: 0
            },
            "{results:?}"
        );
        assert!(
            matches!(results[1], Restored::Busy | Restored::NotNeeded),
            "{results:?}"
        );
        let mut conn = redis.conn().await;
        resynced(&mut conn, &store, &id).await;
        // Live buys, then a restore attempt on the live sale changes nothing.
        assert_eq!(crate::testing::buy(&mut conn, &id, "c").await, "won");
        let before: (HashMap<String, i64>, HashMap<String, String>, i64) = (
            conn.hgetall(&keys.buyers).await.unwrap(),
            conn.hgetall(&keys.reservations).await.unwrap(),
            conn.get(&keys.remaining).await.unwrap(),
        );
        assert_eq!(
            restore(&mut conn, &store, &spec.id).await.unwrap(),
            Restored::NotNeeded
        );
        let after: (HashMap<String, i64>, HashMap<String, String>, i64) = (
            conn.hgetall(&keys.buyers).await.unwrap(),
            conn.hgetall(&keys.reservations).await.unwrap(),
            conn.get(&keys.remaining).await.unwrap(),
        );
        assert_eq!(before, after);
        assert_eq!(before.2, 7);
        let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    }
}

#[tokio::test]
async fn cancelled_orders_of_a_sale_missing_from_redis_do_not_stall_other_sales_returns() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    // Sale `lost` is in the database only (Redis lost it; the restore loop
    // has not run yet), with more cancelled orders than one return batch.
    let lost = unique("lost");
    store.sales().upsert(&sale(&lost, 1000)).await.unwrap();
    let orders: Vec<_> = (0..RETURN_BATCH + 20)
        .map(|i| reservation(&lost, &format!("u{i}")))
        .collect();
    store.orders().insert(&orders).await.unwrap();
    for r in &orders {
        let o = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(store.orders().cancel_if_unpaid(&o.order_id).await.unwrap());
    }
    // Sale `live` is in Redis with one cancelled order written last.
    let live = unique("live");
    let spec = sale(&live, 5);
    store.sales().upsert(&spec).await.unwrap();
    let r = reservation(&live, "late");
    store
        .orders()
        .insert(std::slice::from_ref(&r))
        .await
        .unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec)
        .await
        .unwrap();
    let o = store
        .orders()
        .by_reservation(&r.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(store.orders().cancel_if_unpaid(&o.order_id).await.unwrap());
    let keys = SaleKeys::new(&live);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 4);

    assert_eq!(
        return_stock(&mut conn, &store).await.unwrap(),
        1,
        "the live sale's item comes back in one pass"
    );
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 5);
    let lost_meta: bool = conn.exists(SaleKeys::new(&lost).meta).await.unwrap();
    assert!(!lost_meta, "a missing sale is left to the restore loop");
}

/// Waits (no deadline asserted on timing: a hang fails the test run) until
/// the sale is in Redis.
async fn until_present(conn: &mut redis::aio::MultiplexedConnection, keys: &SaleKeys) {
    while !conn.exists::<_, bool>(&keys.meta).await.unwrap() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

async fn meta_paused(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &SaleKeys,
) -> Option<String> {
    conn.hget(&keys.meta, "paused").await.unwrap()
}

async fn switch(conn: &mut redis::aio::MultiplexedConnection) -> Option<String> {
    conn.get(flashgate_common::keys::GLOBAL_SWITCH)
        .await
        .unwrap()
}

/// A restorer connected through a gate holding its first command that
/// contains `pattern`.
async fn gated(
    redis: &RedisServer,
    pattern: &'static [u8],
) -> (
    std::sync::Arc<crate::testing::Gate>,
    redis::aio::MultiplexedConnection,
) {
    let gate = crate::testing::Gate::start(redis, vec![pattern]).await;
    let conn = redis::Client::open(gate.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (gate, conn)
}

const EVALSHA: &[u8] = b"$7\r\nEVALSHA\r\n";

#[tokio::test]
async fn a_pause_sent_during_a_restore_holds_even_if_the_restorer_dies_after_the_install() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    // Loaded already, so the install is one EVALSHA and nothing after it
    // is needed for it to take effect.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(flashgate_common::scripts::PREHEAT.body())
        .query_async(&mut conn)
        .await
        .unwrap();
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    store.sales().upsert(&sale(&id, 10)).await.unwrap();
    let keys = SaleKeys::new(&id);

    let (gate, mut slow) = gated(&redis, EVALSHA).await;
    let (slow_store, slow_id) = (store.clone(), id.clone());
    let restorer = tokio::spawn(async move { restore(&mut slow, &slow_store, &slow_id).await });
    gate.holding().await;
    // The operator pauses the sale while it is absent from Redis.
    assert_eq!(
        crate::switches::set_paused(&mut conn, &store, &id, true)
            .await
            .unwrap(),
        crate::switches::Paused::Recorded
    );
    // The install goes through, and the restorer dies right after it.
    gate.open();
    restorer.abort();
    until_present(&mut conn, &keys).await;
    assert_eq!(
        meta_paused(&mut conn, &keys).await.as_deref(),
        Some("1"),
        "the pause must hold from the install on"
    );
    assert_eq!(crate::testing::buy(&mut conn, &id, "u").await, "paused");
}

#[tokio::test]
async fn a_pass_brings_pauses_and_the_switch_in_redis_in_line_with_the_database() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (a, b) = (unique("a"), unique("b"));
    for id in [&a, &b] {
        store.sales().upsert(&sale(id, 10)).await.unwrap();
    }
    assert_eq!(restore_missing(&mut conn, &store).await.unwrap(), 2);
    resynced(&mut conn, &store, &a).await;
    resynced(&mut conn, &store, &b).await;
    // Redis and the database disagree: a Redis write that failed after the
    // database write (503 to the operator), or two operators racing.
    store.sales().set_paused(&a, true).await.unwrap();
    let () = conn
        .hset(&SaleKeys::new(&b).meta, "paused", "1")
        .await
        .unwrap();
    store.switch().set_paused(true).await.unwrap();
    let () = conn
        .set(flashgate_common::keys::GLOBAL_SWITCH, "open")
        .await
        .unwrap();

    assert_eq!(restore_missing(&mut conn, &store).await.unwrap(), 0);
    assert_eq!(
        meta_paused(&mut conn, &SaleKeys::new(&a)).await.as_deref(),
        Some("1")
    );
    assert_eq!(
        meta_paused(&mut conn, &SaleKeys::new(&b)).await.as_deref(),
        Some("0")
    );
    assert_eq!(switch(&mut conn).await.as_deref(), Some("paused"));
    assert_eq!(crate::testing::buy(&mut conn, &a, "u").await, "paused");
    assert_eq!(crate::testing::buy(&mut conn, &b, "u").await, "won");
}

#[tokio::test]
async fn pauses_kept_only_in_redis_before_an_upgrade_survive_redis_restarting_empty() {
    let url = sqlite_url();
    let path = url.strip_prefix("sqlite://").unwrap();
    std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    sqlx::any::install_default_drivers();
    let id = unique("s");
    // The database of a version that kept pauses only in Redis.
    let old = sqlx::AnyPool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE sales (id TEXT PRIMARY KEY, name TEXT NOT NULL, stock BIGINT NOT NULL, per_user_limit BIGINT NOT NULL, starts_at_ms BIGINT NOT NULL, ends_at_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL)")
        .execute(&old)
        .await
        .unwrap();
    sqlx::query(&format!(
        "INSERT INTO sales VALUES ('{id}', 'old sale', 5, 1, 0, 9999999999999, 0)"
    ))
    .execute(&old)
    .await
    .unwrap();
    old.close().await;
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let keys = SaleKeys::new(&id);
    let () = redis::cmd("HSET")
        .arg(&keys.meta)
        .arg(&[
            "name",
            "old sale",
            "stock",
            "5",
            "per_user_limit",
            "1",
            "starts_at_ms",
            "0",
            "ends_at_ms",
            "9999999999999",
            "paused",
            "1",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = conn.set(&keys.remaining, 5).await.unwrap();
    let () = conn
        .set(flashgate_common::keys::GLOBAL_SWITCH, "paused")
        .await
        .unwrap();

    // The upgraded backend starts: its first pass takes both from Redis.
    let store = Store::connect(&url).await.unwrap();
    restore_missing(&mut conn, &store).await.unwrap();
    assert_eq!(store.sales().paused(&id).await.unwrap(), Some(true));
    assert_eq!(store.switch().paused().await.unwrap(), Some(true));

    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    assert_eq!(restore_missing(&mut conn, &store).await.unwrap(), 1);
    assert_eq!(
        meta_paused(&mut conn, &keys).await.as_deref(),
        Some("1"),
        "the sale must come back paused"
    );
    assert_eq!(
        switch(&mut conn).await.as_deref(),
        Some("paused"),
        "the shop must come back paused"
    );
}

#[tokio::test]
async fn orders_written_while_a_sale_is_restored_are_counted_before_anyone_buys() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    store.sales().upsert(&sale(&id, 2)).await.unwrap();
    store
        .orders()
        .insert(&[reservation(&id, "early")])
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);

    let (gate, mut slow) = gated(&redis, EVALSHA).await;
    let (slow_store, slow_id) = (store.clone(), id.clone());
    let restorer =
        tokio::spawn(async move { restore(&mut slow, &slow_store, &slow_id).await.unwrap() });
    gate.holding().await;
    // After the snapshot, a forward checked against the lost Redis commits.
    store
        .orders()
        .insert(&[reservation(&id, "late")])
        .await
        .unwrap();
    gate.open();
    assert_eq!(
        restorer.await.unwrap(),
        Restored::Loaded {
            remaining: 0,
            live_orders: 2,
            in_flight: 0
        }
    );
    assert_eq!(
        conn.get::<_, i64>(&keys.remaining).await.unwrap(),
        0,
        "both items are sold"
    );
    resynced(&mut conn, &store, &id).await;
    assert_eq!(
        crate::testing::buy(&mut conn, &id, "late").await,
        "limit_reached",
        "a limit-1 buyer wins once"
    );
    assert_eq!(
        crate::testing::buy(&mut conn, &id, "other").await,
        "sold_out"
    );
    let buyers: HashMap<String, i64> = conn.hgetall(&keys.buyers).await.unwrap();
    assert_eq!(
        buyers,
        HashMap::from([("early".into(), 1), ("late".into(), 1)])
    );
    let report = crate::reconcile::reconcile_sale(&mut conn, &store, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.adopted, report.drift), (0, 0));
}

#[tokio::test]
async fn a_restore_installs_the_definition_the_database_holds_when_it_has_the_lock() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let old = sale(&id, 10);
    store.sales().upsert(&old).await.unwrap();

    // The caller read the definition, then waits for the lock...
    let (gate, mut slow) = gated(&redis, b"$3\r\nSET\r\n").await;
    let (slow_store, slow_old) = (store.clone(), old.clone());
    let restorer = tokio::spawn(async move {
        crate::sales::preheat_from_store(&mut slow, &slow_store, &slow_old)
            .await
            .unwrap()
    });
    gate.holding().await;
    // ...while an operator raises the stock.
    store
        .sales()
        .upsert(&SaleSpec {
            stock: 20,
            ..old.clone()
        })
        .await
        .unwrap();
    gate.open();
    assert_eq!(
        restorer.await.unwrap(),
        crate::sales::Preheat::Loaded { remaining: 20 }
    );
    let keys = SaleKeys::new(&id);
    assert_eq!(
        conn.hget::<_, _, i64>(&keys.meta, "stock").await.unwrap(),
        20
    );
}

#[tokio::test]
async fn a_sale_missing_from_the_sales_index_is_listed_again_by_the_next_pass() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    store.sales().upsert(&sale(&id, 10)).await.unwrap();
    assert_eq!(restore_missing(&mut conn, &store).await.unwrap(), 1);
    // The restorer died between the install and adding it to the index.
    let () = conn
        .srem(flashgate_common::keys::SALES_INDEX, &id)
        .await
        .unwrap();
    restore_missing(&mut conn, &store).await.unwrap();
    assert!(conn
        .sismember::<_, _, bool>(flashgate_common::keys::SALES_INDEX, &id)
        .await
        .unwrap());
}

#[tokio::test]
async fn a_restore_that_outlived_its_scratch_keys_is_retried_not_fatal() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 10);
    store.sales().upsert(&spec).await.unwrap();
    store
        .orders()
        .insert(&[reservation(&id, "a")])
        .await
        .unwrap();

    let (gate, mut slow) = gated(&redis, EVALSHA).await;
    let (slow_store, slow_spec) = (store.clone(), spec.clone());
    let restorer = tokio::spawn(async move {
        crate::sales::preheat_from_store(&mut slow, &slow_store, &slow_spec).await
    });
    gate.holding().await;
    // The scratch keys expired before the install.
    let scratch: Vec<String> = conn
        .keys(format!("fg:{{sale:{id}}}:restore:*"))
        .await
        .unwrap();
    assert!(!scratch.is_empty());
    let () = conn.del(&scratch).await.unwrap();
    gate.open();
    let result = restorer.await.unwrap();
    assert!(matches!(result, Err(SaleError::Restoring)), "{result:?}");
    let keys = SaleKeys::new(&id);
    assert!(!conn.exists::<_, bool>(&keys.meta).await.unwrap());
    // The next pass restores it.
    assert_eq!(restore_missing(&mut conn, &store).await.unwrap(), 1);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 9);
}

#[tokio::test]
async fn a_restore_creates_the_consumer_group_on_a_stream_that_survived_without_it() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    store.sales().upsert(&sale(&id, 10)).await.unwrap();
    let keys = SaleKeys::new(&id);
    let _: String = redis::cmd("XADD")
        .arg(&keys.stream)
        .arg("*")
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();

    assert!(matches!(
        restore(&mut conn, &store, &id).await.unwrap(),
        Restored::Loaded { .. }
    ));
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&keys.stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(format!("{groups:?}").contains(CONSUMER_GROUP), "{groups:?}");

    // A stream that kept its group too: the restore still installs.
    let () = redis::cmd("DEL")
        .arg(&keys.meta)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        restore(&mut conn, &store, &id).await.unwrap(),
        Restored::Loaded { .. }
    ));
}

#[tokio::test]
async fn a_restorer_killed_holding_the_lock_blocks_the_sale_at_most_ten_seconds() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    store.sales().upsert(&sale(&id, 10)).await.unwrap();
    let (gate, mut slow) = gated(&redis, EVALSHA).await;
    let (slow_store, slow_id) = (store.clone(), id.clone());
    let restorer = tokio::spawn(async move { restore(&mut slow, &slow_store, &slow_id).await });
    gate.holding().await;
    restorer.abort();
    let ttl: i64 = conn.pttl(&SaleKeys::new(&id).restoring).await.unwrap();
    assert!((1..=10_000).contains(&ttl), "lock lifetime {ttl} ms");
    gate.open();
}

#[tokio::test]
async fn a_lost_bucketed_sale_with_orders_or_a_surviving_bucket_is_left_absent_and_an_admin_change_does_not_loop(
) {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    // Orders: nothing installed, whatever the number of tries.
    let id = unique("s");
    let spec = SaleSpec {
        buckets: 3,
        ..sale(&id, 9)
    };
    store.sales().upsert(&spec).await.unwrap();
    store
        .orders()
        .insert(&[reservation(&id, "a")])
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(
            restore(&mut conn, &store, &id).await.unwrap(),
            Restored::LeftAbsent
        );
    }
    assert_eq!(crate::buckets::present(&mut conn, &id, 3).await.unwrap(), 0);
    let applied = crate::sales::apply(&mut conn, &store, &spec).await;
    assert!(matches!(applied, Err(SaleError::LeftAbsent)), "{applied:?}");
    // No order, but one bucket survived (it may hold transfers and
    // reservations a fresh share would ignore): left absent too.
    let id = unique("t");
    let spec = SaleSpec {
        buckets: 3,
        ..sale(&id, 9)
    };
    store.sales().upsert(&spec).await.unwrap();
    crate::buckets::install(&mut conn, &spec).await.unwrap();
    for k in [0, 2] {
        let () = conn.del(SaleKeys::bucket(&id, k).meta).await.unwrap();
    }
    assert_eq!(
        restore(&mut conn, &store, &id).await.unwrap(),
        Restored::LeftAbsent
    );
    assert_eq!(
        crate::buckets::present(&mut conn, &id, 3).await.unwrap(),
        1,
        "nothing reinstalled"
    );
}
