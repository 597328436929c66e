//! Trimming and archiving against a real redis-server and a SQLite file.

use redis::AsyncCommands;

use super::*;
use crate::testing::{reservation, sale, sqlite_url, unique, RedisServer};

/// Appends `n` reservation entries of `sale` as the deduct script would.
async fn add(conn: &mut redis::aio::MultiplexedConnection, sale: &str, n: usize) -> Vec<(String, flashgate_common::reservation::Reservation)> {
    let stream = SaleKeys::new(sale).stream;
    let mut out = Vec::new();
    for i in 0..n {
        let r = reservation(sale, &format!("u{i}"));
        let fields = [("rid", r.reservation_id.clone()), ("sale", r.sale_id.clone()), ("user", r.user_id.clone()), ("idem", String::new()), ("ts", r.reserved_at_ms.to_string())];
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
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), 0, "no stream yet");
    let () = redis::cmd("XGROUP").arg("CREATE").arg(&stream).arg(CONSUMER_GROUP).arg("0").arg("MKSTREAM").query_async(&mut conn).await.unwrap();
    let added = add(&mut conn, &sale, 7).await;
    let e: Vec<String> = added.iter().map(|(id, _)| id.clone()).collect();
    let write = |i: usize| added[i].1.clone();
    store.insert_orders(&[write(0), write(1), write(2), write(3), write(4), write(5), write(6)]).await.unwrap();
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), 0, "nothing delivered: nothing trimmed");
    read(&mut conn, &stream, 5).await; // e0..e4 delivered, e5 and e6 not
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[0], &e[1], &e[3], &e[4]]).await.unwrap();

    // e2 is pending: it and everything after it stays.
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), 2);
    assert_eq!(ids(&mut conn, &stream).await, e[2..].to_vec());
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[2]]).await.unwrap();
    // Nothing pending: up to the last delivered entry (kept); never the undelivered ones.
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), 2);
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
    let () = redis::cmd("XGROUP").arg("CREATE").arg(&stream).arg(CONSUMER_GROUP).arg("0").arg("MKSTREAM").query_async(&mut conn).await.unwrap();
    let added = add(&mut conn, &sale, 4).await;
    store.insert_orders(&[added[0].1.clone(), added[2].1.clone()]).await.unwrap();
    // The group moves past every entry without reading them: e1 and e3 have no order.
    let () = redis::cmd("XGROUP").arg("SETID").arg(&stream).arg(CONSUMER_GROUP).arg("$").query_async(&mut conn).await.unwrap();
    assert_eq!(trim_written(&mut conn, &store, &sale).await.unwrap(), 1, "only e0, before the first entry without an order");
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
    let now = flashgate_common::now_ms();

    assert!(!try_archive(&mut conn, &store, &id, 2_000 + 59_000, grace).await.unwrap(), "within the grace");
    assert!(!try_archive(&mut conn, &store, &id, now, grace).await.unwrap(), "a reservation has no order");
    let () = conn.hdel(&keys.reservations, &stray.reservation_id).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, now, grace).await.unwrap(), "an unpaid order is pending");
    let order = store.order_by_reservation(&r.reservation_id).await.unwrap().unwrap();
    assert!(matches!(store.pay(&order.order_id).await.unwrap(), crate::store::Payment::Paid(_)));
    let _: String = conn.xadd(&keys.stream, "*", &[("rid", "x")]).await.unwrap();
    assert!(!try_archive(&mut conn, &store, &id, now, grace).await.unwrap(), "an entry was never delivered");
    read(&mut conn, &keys.stream, 10).await;
    assert!(!try_archive(&mut conn, &store, &id, now, grace).await.unwrap(), "an entry is pending");
    let pending: Vec<String> = ids(&mut conn, &keys.stream).await;
    let _: i64 = conn.xack(&keys.stream, CONSUMER_GROUP, &pending).await.unwrap();

    assert!(try_archive(&mut conn, &store, &id, now, grace).await.unwrap());
    assert!(archived(&mut conn).await.unwrap().contains(&id));
    unarchive(&mut conn, &id).await.unwrap();
    assert!(archived(&mut conn).await.unwrap().is_empty());
}
