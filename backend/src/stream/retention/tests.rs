//! Trimming and archiving against a real redis-server and a SQLite file.

use redis::AsyncCommands;

use super::*;
use crate::testing::{reservation, sale, sqlite_url, unique, RedisServer};

async fn add(conn: &mut redis::aio::MultiplexedConnection, stream: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(conn.xadd(stream, "*", &[("n", i.to_string())]).await.unwrap());
    }
    ids
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
async fn acknowledged_entries_are_trimmed_and_unacknowledged_ones_stay() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let stream = SaleKeys::new(&unique("s")).stream;
    assert_eq!(trim_acknowledged(&mut conn, &stream).await.unwrap(), 0, "no stream yet");
    let () = redis::cmd("XGROUP").arg("CREATE").arg(&stream).arg(CONSUMER_GROUP).arg("0").arg("MKSTREAM").query_async(&mut conn).await.unwrap();
    let e = add(&mut conn, &stream, 6).await;
    assert_eq!(trim_acknowledged(&mut conn, &stream).await.unwrap(), 0, "nothing delivered: nothing trimmed");
    read(&mut conn, &stream, 4).await; // e0..e3 delivered, e4 and e5 not
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[0], &e[1], &e[3]]).await.unwrap();

    // e2 is pending: it and everything after it stays.
    assert_eq!(trim_acknowledged(&mut conn, &stream).await.unwrap(), 2);
    assert_eq!(ids(&mut conn, &stream).await, e[2..].to_vec());
    let _: i64 = conn.xack(&stream, CONSUMER_GROUP, &[&e[2]]).await.unwrap();
    // Nothing pending: up to the last delivered entry (kept); never the undelivered ones.
    assert_eq!(trim_acknowledged(&mut conn, &stream).await.unwrap(), 1);
    assert_eq!(ids(&mut conn, &stream).await, e[3..].to_vec());
    let position = position(&mut conn, &stream).await.unwrap().unwrap();
    assert!(!position.drained(), "e4 and e5 were never delivered");
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
    let grace = Duration::from_secs(60);
    let now = flashgate_common::now_ms();

    assert!(!try_archive(&mut conn, &store, &id, 2_000 + 59_000, grace).await.unwrap(), "within the grace");
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
