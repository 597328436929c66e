//! Reconciliation against a real redis-server and a SQLite file.

use redis::AsyncCommands;

use super::*;
use crate::testing::{reservation, sale, sqlite_url, unique, RedisServer};

/// `calls` of `command` in INFO commandstats.
async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn reconcile_reads_a_large_sale_in_pages_and_still_finds_the_drift() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = sale(&id, 10_000);
    store.sales().upsert(&spec).await.unwrap();
    crate::sales::preheat_from_store(&mut conn, &store, &spec)
        .await
        .unwrap();
    let keys = SaleKeys::new(&id);
    let sold: Vec<_> = (0..3500)
        .map(|i| reservation(&id, &format!("u{i}")))
        .collect();
    for chunk in sold.chunks(1000) {
        let mut pipe = redis::pipe();
        for r in chunk {
            pipe.hset(&keys.reservations, &r.reservation_id, &r.user_id)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    store.orders().insert(&sold).await.unwrap();
    // Redis counts two more items sold than there are reservations.
    let () = conn.set(&keys.remaining, 10_000 - 3500 - 2).await.unwrap();

    let (hgetall, hscan) = (
        calls(&mut conn, "hgetall").await,
        calls(&mut conn, "hscan").await,
    );
    let report = reconcile_sale(&mut conn, &store, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.drift, report.live_orders, report.settled),
        (2, 3500, true),
        "{report:?}"
    );
    assert_eq!(
        calls(&mut conn, "hgetall").await,
        hgetall,
        "no one-shot read of the whole index"
    );
    assert!(
        calls(&mut conn, "hscan").await - hscan > 1,
        "the index is read in pages"
    );
}
