//! Trimming and archiving against a real redis-server and a SQLite file.

use flashgate_common::reservation::fields;
use redis::AsyncCommands;

use super::*;
use crate::testing::{reservation, sale, sqlite_url, unique, RedisServer};

/// Appends `n` reservation entries of `sale` as the deduct script would.
async fn add(
    conn: &mut redis::aio::MultiplexedConnection,
    sale: &str,
    n: usize,
) -> Vec<(String, flashgate_common::reservation::Reservation)> {
    let stream = SaleKeys::new(sale).stream;
    let mut out = Vec::new();
    for i in 0..n {
        let r = reservation(sale, &format!("u{i}"));
        let record = [(fields::RECORD, r.record())];
        let id: String = conn.xadd(&stream, "*", &record).await.unwrap();
        out.push((id, r));
    }
    out
}

async fn read(conn: &mut redis::aio::MultiplexedConnection, stream: &str, count: usize) {
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(CONSUMER_GROUP)
        .arg("c")
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(conn)
        .await
        .unwrap();
}

async fn ids(conn: &mut redis::aio::MultiplexedConnection, stream: &str) -> Vec<String> {
    let reply: redis::streams::StreamRangeReply = conn.xrange_all(stream).await.unwrap();
    reply.ids.into_iter().map(|e| e.id).collect()
}

#[tokio::test]
async fn entries_written_as_orders_are_trimmed_and_the_others_stay() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale = unique("s");
    let stream = SaleKeys::new(&sale).stream;
    assert_eq!(
        trim_written(&mut conn, &store, &sale).await.unwrap(),
        None,
        "no stream yet"
    );
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(CONSUMER_GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    let added = add(&mut conn, &sale, 7).await;
    let e: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
    let write = |i: usize| added[i].1.clone();
    store
        .orders()
        .insert(&[
            write(0),
            write(1),
            write(2),
            write(3),
            write(4),
            write(5),
            write(6),
        ])
        .await
        .unwrap();
    assert_eq!(
        trim_written(&mut conn, &store, &sale).await.unwrap(),
        None,
        "nothing delivered: nothing trimmed"
    );
    read(&mut conn, &stream, 5).await; // e0..e4 delivered, e5 and e6 not
    let _: i64 = conn
        .xack(&stream, CONSUMER_GROUP, &[&e[0], &e[1], &e[3], &e[4]])
        .await
        .unwrap();

    // e2 is pending: it and everything after it stays.
    assert_eq!(
        trim_written(&mut conn, &store, &sale).await.unwrap(),
        Some(2)
    );
    assert_eq!(ids(&mut conn, &stream).await, e[2..].to_vec());
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[2]]).await.unwrap();
    // Nothing pending: up to the last delivered entry (kept); never the undelivered ones.
    assert_eq!(
        trim_written(&mut conn, &store, &sale).await.unwrap(),
        Some(2)
    );
    assert_eq!(ids(&mut conn, &stream).await, e[4..].to_vec());
    let position = position(&mut conn, &stream).await.unwrap().unwrap();
    assert!(!position.drained(), "e5 and e6 were never delivered");
}

#[tokio::test]
async fn an_entry_without_an_order_is_never_trimmed_even_when_the_group_skipped_it() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let sale = unique("s");
    let stream = SaleKeys::new(&sale).stream;
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(CONSUMER_GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    let added = add(&mut conn, &sale, 4).await;
    store
        .orders()
        .insert(&[added[0].1.clone(), added[2].1.clone()])
        .await
        .unwrap();
    // The group moves past every entry without reading them: e1 and e3 have no order.
    let () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(&stream)
        .arg(CONSUMER_GROUP)
        .arg("$")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        trim_written(&mut conn, &store, &sale).await.unwrap(),
        Some(1),
        "only e0, before the first entry without an order"
    );
    let e: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids(&mut conn, &stream).await, e[1..].to_vec());
}

#[tokio::test]
async fn only_an_ended_drained_and_settled_sale_is_archived() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let mut spec = sale(&id, 5);
    spec.starts_at_ms = 1_000;
    spec.ends_at_ms = 2_000;
    store.sales().upsert(&spec).await.unwrap();
    let r = reservation(&id, "u");
    store
        .orders()
        .insert(std::slice::from_ref(&r))
        .await
        .unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec)
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);
    let () = conn
        .hset(&keys.reservations, &r.reservation_id, "u")
        .await
        .unwrap();
    let stray = reservation(&id, "v");
    let () = conn
        .hset(&keys.reservations, &stray.reservation_id, "v")
        .await
        .unwrap();
    let grace = Duration::from_secs(60);

    assert!(
        !try_archive(&mut conn, &store, &id, Duration::from_secs(4_000_000_000))
            .await
            .unwrap(),
        "within the grace"
    );
    assert!(
        !try_archive(&mut conn, &store, &id, grace).await.unwrap(),
        "a reservation has no order"
    );
    let () = conn
        .hdel(&keys.reservations, &stray.reservation_id)
        .await
        .unwrap();
    assert!(
        !try_archive(&mut conn, &store, &id, grace).await.unwrap(),
        "an unpaid order is pending"
    );
    let order = store
        .orders()
        .by_reservation(&r.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store.orders().pay(&order.order_id).await.unwrap(),
        crate::store::Payment::Paid(_)
    ));
    let _: String = conn.xadd(&keys.stream, "*", &[("rid", "x")]).await.unwrap();
    assert!(
        !try_archive(&mut conn, &store, &id, grace).await.unwrap(),
        "an entry was never delivered"
    );
    read(&mut conn, &keys.stream, 10).await;
    assert!(
        !try_archive(&mut conn, &store, &id, grace).await.unwrap(),
        "an entry is pending"
    );
    let pending: Vec<String> = ids(&mut conn, &keys.stream).await;
    let _: i64 = conn
        .xack(&keys.stream, CONSUMER_GROUP, &pending)
        .await
        .unwrap();

    assert!(try_archive(&mut conn, &store, &id, grace).await.unwrap());
    assert!(archived(&mut conn).await.unwrap().contains(&id));
    unarchive(&mut conn, &id).await.unwrap();
    assert!(archived(&mut conn).await.unwrap().is_empty());
}

/// A finished sale: window long over, one paid order whose reservation is
/// in `resv`, the group created and drained.
async fn finished_sale(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &Store,
) -> (String, SaleKeys) {
    let id = unique("s");
    let mut spec = sale(&id, 5);
    spec.starts_at_ms = 1_000;
    spec.ends_at_ms = 2_000;
    store.sales().upsert(&spec).await.unwrap();
    let r = reservation(&id, "u");
    store
        .orders()
        .insert(std::slice::from_ref(&r))
        .await
        .unwrap();
    let order = store
        .orders()
        .by_reservation(&r.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store.orders().pay(&order.order_id).await.unwrap(),
        crate::store::Payment::Paid(_)
    ));
    crate::sales::preheat_from_store(conn, store, &spec)
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);
    let () = conn
        .hset(&keys.reservations, &r.reservation_id, "u")
        .await
        .unwrap();
    (id, keys)
}

#[tokio::test]
async fn an_order_redis_never_counted_does_not_stand_in_for_a_reservation_without_one() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    // An order written from a forward whose reservation Redis lost...
    let uncounted = reservation(&id, "w");
    store
        .orders()
        .insert(std::slice::from_ref(&uncounted))
        .await
        .unwrap();
    let order = store
        .orders()
        .by_reservation(&uncounted.reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        store.orders().pay(&order.order_id).await.unwrap(),
        crate::store::Payment::Paid(_)
    ));
    // ...and a reservation Redis counted that has no order: as many of each.
    let () = conn
        .hset(
            &keys.reservations,
            reservation(&id, "v").reservation_id,
            "v",
        )
        .await
        .unwrap();
    assert!(!try_archive(&mut conn, &store, &id, ARCHIVE_GRACE)
        .await
        .unwrap());
    assert!(archived(&mut conn).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_sale_with_dead_letters_is_not_archived() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    let _: String = conn
        .xadd(
            &keys.dead,
            "*",
            &[("rid", "junk"), ("dead_error", "malformed")],
        )
        .await
        .unwrap();
    assert!(!try_archive(&mut conn, &store, &id, ARCHIVE_GRACE)
        .await
        .unwrap());
    let _: i64 = redis::cmd("DEL")
        .arg(&keys.dead)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        try_archive(&mut conn, &store, &id, ARCHIVE_GRACE)
            .await
            .unwrap(),
        "once the dead letters are gone"
    );
}

#[tokio::test]
async fn a_stream_with_entries_but_no_group_is_not_drained() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    let () = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(&keys.stream)
        .arg(CONSUMER_GROUP)
        .query_async::<i64>(&mut conn)
        .await
        .map(drop)
        .unwrap();
    let _: String = conn.xadd(&keys.stream, "*", &[("rid", "x")]).await.unwrap();
    assert!(
        !try_archive(&mut conn, &store, &id, ARCHIVE_GRACE)
            .await
            .unwrap(),
        "nobody ever read the entry"
    );
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.stream)
        .arg(CONSUMER_GROUP)
        .arg("$")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        try_archive(&mut conn, &store, &id, ARCHIVE_GRACE)
            .await
            .unwrap(),
        "the group is past it"
    );
}

#[tokio::test]
async fn the_end_of_a_sale_is_judged_by_the_redis_clock() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    // Ended by Redis's clock, but not by a grace longer than Redis's age of the end.
    let redis_now = redis_now_ms(&mut conn).await.unwrap();
    let () = conn
        .hset(&keys.meta, "ends_at_ms", redis_now - 10_000)
        .await
        .unwrap();
    assert!(
        !try_archive(&mut conn, &store, &id, Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(try_archive(&mut conn, &store, &id, Duration::from_secs(1))
        .await
        .unwrap());
}

#[tokio::test]
async fn the_trim_script_trims_nothing_once_the_group_moved_back_below_the_bound() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let sale = unique("s");
    let stream = SaleKeys::new(&sale).stream;
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(CONSUMER_GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    let added = add(&mut conn, &sale, 4).await;
    let e: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
    read(&mut conn, &stream, 4).await;
    let _: i64 = conn
        .xack(&stream, CONSUMER_GROUP, &[&e[0], &e[1], &e[2], &e[3]])
        .await
        .unwrap();

    // An operator moves the group back: e1.. are undelivered again.
    let () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(&stream)
        .arg(CONSUMER_GROUP)
        .arg(&e[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[3]).await, -1);
    // Re-delivered: e1 stays pending below the bound, e2 is acknowledged.
    read(&mut conn, &stream, 2).await;
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[2]]).await.unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[2]).await, -1, "e1 is pending");
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[1]]).await.unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[2]).await, 2, "e0 and e1 go");
    let () = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(&stream)
        .arg(CONSUMER_GROUP)
        .query_async::<i64>(&mut conn)
        .await
        .map(drop)
        .unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[3]).await, -1, "no group");
    assert_eq!(ids(&mut conn, &stream).await, e[2..].to_vec());
}

async fn trim(conn: &mut redis::aio::MultiplexedConnection, stream: &str, keep_from: &str) -> i64 {
    TRIM.key(stream)
        .arg(CONSUMER_GROUP)
        .arg(keep_from)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// Appends `n` reservation entries of `sale` to `stream` (a bucket's).
async fn add_to(
    conn: &mut redis::aio::MultiplexedConnection,
    sale: &str,
    stream: &str,
    n: usize,
) -> Vec<(String, flashgate_common::reservation::Reservation)> {
    let mut out = Vec::new();
    for i in 0..n {
        let r = reservation(sale, &format!("{stream}-u{i}"));
        let record = [(fields::RECORD, r.record())];
        let id: String = conn.xadd(stream, "*", &record).await.unwrap();
        out.push((id, r));
    }
    out
}

#[tokio::test]
async fn every_stream_of_a_bucketed_sale_is_trimmed_and_it_is_archived_once_all_are_done() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let mut spec = sale(&id, 4);
    (spec.buckets, spec.starts_at_ms, spec.ends_at_ms) = (2, 1_000, 2_000);
    store.sales().upsert(&spec).await.unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec)
        .await
        .unwrap();
    let (own, b0, b1) = (
        SaleKeys::new(&id),
        SaleKeys::bucket(&id, 0),
        SaleKeys::bucket(&id, 1),
    );
    let e0 = add_to(&mut conn, &id, &b0.stream, 2).await;
    let e1 = add_to(&mut conn, &id, &b1.stream, 2).await;
    store
        .orders()
        .insert(&[e0[0].1.clone(), e0[1].1.clone(), e1[0].1.clone()])
        .await
        .unwrap();
    for stream in [&b0.stream, &b1.stream] {
        read(&mut conn, stream, 10).await;
        let all = ids(&mut conn, stream).await;
        let _: i64 = conn.xack(stream, CONSUMER_GROUP, &all).await.unwrap();
    }
    // A dead letter of the sale with the id of bucket 1's second entry,
    // but not its fields (another stream's entry): it does not stand for it.
    let _: String = conn
        .xadd(
            &own.dead,
            "*",
            &[
                ("rid", "other"),
                ("dead_source_id", e1[1].0.as_str()),
                ("dead_error", "x"),
            ],
        )
        .await
        .unwrap();

    // Each bucket's stream is trimmed up to its last delivered entry (kept)
    // and never past an entry without an order.
    assert_eq!(
        trim_all_written(&mut conn, &store, &id, 2).await.unwrap(),
        (2, 2)
    );
    assert_eq!(ids(&mut conn, &b0.stream).await, vec![e0[1].0.clone()]);
    assert_eq!(ids(&mut conn, &b1.stream).await, vec![e1[1].0.clone()]);

    let grace = Duration::from_secs(60);
    assert!(
        !try_archive_all(&mut conn, &store, &id, 2, grace)
            .await
            .unwrap(),
        "a dead letter"
    );
    let _: i64 = conn.del(&own.dead).await.unwrap();
    let () = conn
        .hset(&b1.reservations, &e1[1].1.reservation_id, &e1[1].1.user_id)
        .await
        .unwrap();
    assert!(
        !try_archive_all(&mut conn, &store, &id, 2, grace)
            .await
            .unwrap(),
        "a bucket's reservation has no order"
    );
    store
        .orders()
        .insert(std::slice::from_ref(&e1[1].1))
        .await
        .unwrap();
    let _: String = conn.xadd(&b0.stream, "*", &[("rid", "x")]).await.unwrap();
    for (_, r) in e0.iter().chain(&e1) {
        let order = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(
            store.orders().pay(&order.order_id).await.unwrap(),
            crate::store::Payment::Paid(_)
        ));
    }
    assert!(
        !try_archive_all(&mut conn, &store, &id, 2, grace)
            .await
            .unwrap(),
        "bucket 0's stream has an entry never delivered"
    );
    read(&mut conn, &b0.stream, 10).await;
    let all = ids(&mut conn, &b0.stream).await;
    let _: i64 = conn.xack(&b0.stream, CONSUMER_GROUP, &all).await.unwrap();
    assert!(try_archive_all(&mut conn, &store, &id, 2, grace)
        .await
        .unwrap());
    assert!(archived(&mut conn).await.unwrap().contains(&id));
}
