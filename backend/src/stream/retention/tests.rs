//! Trimming and archiving against a real redis-server and a SQLite file.

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
        let fields = [
            ("rid", r.reservation_id.clone()),
            ("sale", r.sale_id.clone()),
            ("user", r.user_id.clone()),
            ("idem", String::new()),
            ("ts", r.reserved_at_ms.to_string()),
        ];
        let id: String = conn.xadd(&stream, "*", &fields).await.unwrap();
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
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), None, "no stream yet");
    let () =
        redis::cmd("XGROUP").arg("CREATE").arg(&stream).arg(CONSUMER_GROUP).arg("0").arg("MKSTREAM").query_async(&mut conn).await.unwrap();
    let added = add(&mut conn, &sale, 7).await;
    let e: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
    let write = |i: usize| added[i].1.clone();
    store.insert_orders(&[write(0), write(1), write(2), write(3), write(4), write(5), write(6)]).await.unwrap();
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), None, "nothing delivered: nothing trimmed");
    read(&mut conn, &stream, 5).await; // e0..e4 delivered, e5 and e6 not
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[0], &e[1], &e[3], &e[4]]).await.unwrap();

    // e2 is pending: it and everything after it stays.
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), Some(2));
    assert_eq!(ids(&mut conn, &stream).await, e[2..].to_vec());
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[2]]).await.unwrap();
    // Nothing pending: up to the last delivered entry (kept); never the undelivered ones.
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), Some(2));
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
    let () =
        redis::cmd("XGROUP").arg("CREATE").arg(&stream).arg(CONSUMER_GROUP).arg("0").arg("MKSTREAM").query_async(&mut conn).await.unwrap();
    let added = add(&mut conn, &sale, 4).await;
    store.insert_orders(&[added[0].1.clone(), added[2].1.clone()]).await.unwrap();
    // The group moves past every entry without reading them: e1 and e3 have no order.
    let () = redis::cmd("XGROUP").arg("SETID").arg(&stream).arg(CONSUMER_GROUP).arg("$").query_async(&mut conn).await.unwrap();
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), Some(1), "only e0, before the first entry without an order");
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
    store.upsert_sale(&spec).await.unwrap();
    let r = reservation(&id, "u");
    store.insert_orders(std::slice::from_ref(&r)).await.unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec).await.unwrap();
    let keys = SaleKeys::new(&id);
    let () = conn.hset(&keys.reservations, &r.reservation_id, "u").await.unwrap();
    let stray = reservation(&id, "v");
    let () = conn.hset(&keys.reservations, &stray.reservation_id, "v").await.unwrap();
    let grace = Duration::from_secs(60);

    assert!(!try_archive(&mut conn, &store, &id, Duration::from_secs(4_000_000_000)).await.unwrap(), "within the grace");
    assert!(!try_archive(&mut conn, &store, &id, grace).await.unwrap(), "a reservation has no order");
    let () = conn.hdel(&keys.reservations, &stray.reservation_id).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, grace).await.unwrap(), "an unpaid order is pending");
    let order = store.order_by_reservation(&r.reservation_id).await.unwrap().unwrap();
    assert!(matches!(store.pay(&order.order_id).await.unwrap(), crate::store::Payment::Paid(_)));
    let _: String = conn.xadd(&keys.stream, "*", &[("rid", "x")]).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, grace).await.unwrap(), "an entry was never delivered");
    read(&mut conn, &keys.stream, 10).await;
    assert!(!try_archive(&mut conn, &store, &id, grace).await.unwrap(), "an entry is pending");
    let pending: Vec<String> = ids(&mut conn, &keys.stream).await;
    let _: i64 = conn.xack(&keys.stream, CONSUMER_GROUP, &pending).await.unwrap();

    assert!(try_archive(&mut conn, &store, &id, grace).await.unwrap());
    assert!(archived(&mut conn).await.unwrap().contains(&id));
    unarchive(&mut conn, &id).await.unwrap();
    assert!(archived(&mut conn).await.unwrap().is_empty());
}

/// A finished sale: window long over, one paid order whose reservation is
/// in `resv`, the group created and drained.
async fn finished_sale(conn: &mut redis::aio::MultiplexedConnection, store: &Store) -> (String, SaleKeys) {
    let id = unique("s");
    let mut spec = sale(&id, 5);
    spec.starts_at_ms = 1_000;
    spec.ends_at_ms = 2_000;
    store.upsert_sale(&spec).await.unwrap();
    let r = reservation(&id, "u");
    store.insert_orders(std::slice::from_ref(&r)).await.unwrap();
    let order = store.order_by_reservation(&r.reservation_id).await.unwrap().unwrap();
    assert!(matches!(store.pay(&order.order_id).await.unwrap(), crate::store::Payment::Paid(_)));
    crate::sales::preheat_from_store(conn, store, &spec).await.unwrap();
    let keys = SaleKeys::new(&id);
    let () = conn.hset(&keys.reservations, &r.reservation_id, "u").await.unwrap();
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
    store.insert_orders(std::slice::from_ref(&uncounted)).await.unwrap();
    let order = store.order_by_reservation(&uncounted.reservation_id).await.unwrap().unwrap();
    assert!(matches!(store.pay(&order.order_id).await.unwrap(), crate::store::Payment::Paid(_)));
    // ...and a reservation Redis counted that has no order: as many of each.
    let () = conn.hset(&keys.reservations, reservation(&id, "v").reservation_id, "v").await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, ARCHIVE_GRACE).await.unwrap());
    assert!(archived(&mut conn).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_sale_with_dead_letters_is_not_archived() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    let _: String = conn.xadd(&keys.dead, "*", &[("rid", "junk"), ("dead_error", "malformed")]).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, ARCHIVE_GRACE).await.unwrap());
    let _: i64 = redis::cmd("DEL").arg(&keys.dead).query_async(&mut conn).await.unwrap();
    assert!(try_archive(&mut conn, &store, &id, ARCHIVE_GRACE).await.unwrap(), "once the dead letters are gone");
}

#[tokio::test]
async fn a_stream_with_entries_but_no_group_is_not_drained() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    let () =
        redis::cmd("XGROUP").arg("DESTROY").arg(&keys.stream).arg(CONSUMER_GROUP).query_async::<i64>(&mut conn).await.map(drop).unwrap();
    let _: String = conn.xadd(&keys.stream, "*", &[("rid", "x")]).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, ARCHIVE_GRACE).await.unwrap(), "nobody ever read the entry");
    let () = redis::cmd("XGROUP").arg("CREATE").arg(&keys.stream).arg(CONSUMER_GROUP).arg("$").query_async(&mut conn).await.unwrap();
    assert!(try_archive(&mut conn, &store, &id, ARCHIVE_GRACE).await.unwrap(), "the group is past it");
}

#[tokio::test]
async fn the_end_of_a_sale_is_judged_by_the_redis_clock() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let (id, keys) = finished_sale(&mut conn, &store).await;
    // Ended by Redis's clock, but not by a grace longer than Redis's age of the end.
    let redis_now = redis_now_ms(&mut conn).await.unwrap();
    let () = conn.hset(&keys.meta, "ends_at_ms", redis_now - 10_000).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, Duration::from_secs(60)).await.unwrap());
    assert!(try_archive(&mut conn, &store, &id, Duration::from_secs(1)).await.unwrap());
}

#[tokio::test]
async fn the_trim_script_trims_nothing_once_the_group_moved_back_below_the_bound() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let sale = unique("s");
    let stream = SaleKeys::new(&sale).stream;
    let () =
        redis::cmd("XGROUP").arg("CREATE").arg(&stream).arg(CONSUMER_GROUP).arg("0").arg("MKSTREAM").query_async(&mut conn).await.unwrap();
    let added = add(&mut conn, &sale, 4).await;
    let e: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
    read(&mut conn, &stream, 4).await;
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[0], &e[1], &e[2], &e[3]]).await.unwrap();

    // An operator moves the group back: e1.. are undelivered again.
    let () = redis::cmd("XGROUP").arg("SETID").arg(&stream).arg(CONSUMER_GROUP).arg(&e[0]).query_async(&mut conn).await.unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[3]).await, -1);
    // Re-delivered: e1 stays pending below the bound, e2 is acknowledged.
    read(&mut conn, &stream, 2).await;
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[2]]).await.unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[2]).await, -1, "e1 is pending");
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[1]]).await.unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[2]).await, 2, "e0 and e1 go");
    let () = redis::cmd("XGROUP").arg("DESTROY").arg(&stream).arg(CONSUMER_GROUP).query_async::<i64>(&mut conn).await.map(drop).unwrap();
    assert_eq!(trim(&mut conn, &stream, &e[3]).await, -1, "no group");
    assert_eq!(ids(&mut conn, &stream).await, e[2..].to_vec());
}

async fn trim(conn: &mut redis::aio::MultiplexedConnection, stream: &str, keep_from: &str) -> i64 {
    TRIM.key(stream).arg(CONSUMER_GROUP).arg(keep_from).invoke_async(conn).await.unwrap()
}
