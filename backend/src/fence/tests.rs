//! The fence against a real redis-server that comes back older than the
//! database (restarted from an RDB saved before the last wins), and a
//! SQLite file.

use std::collections::HashMap;

use flashgate_common::reservation::Reservation;
use redis::AsyncCommands;

use super::*;
use crate::counted::write_counted;
use crate::recovery::{restore, return_stock, Restored};
use crate::testing::{buy, buy_with_key, sale, sqlite_url, unique, RedisServer};

const TTL: Duration = Duration::from_secs(60);

fn resyncer() -> Resyncer {
    Resyncer::new(TTL, IntCounter::new("scripts", "script calls").unwrap(), Duration::ZERO)
}

/// A Redis of the test's own, a SQLite store, and sale `id` of `stock`
/// items restored into that Redis (installed fenced, not re-synced yet).
struct Fixture {
    redis: RedisServer,
    conn: redis::aio::MultiplexedConnection,
    store: Store,
    id: String,
    keys: SaleKeys,
}

async fn restored_sale(stock: i64) -> Fixture {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    store.upsert_sale(&sale(&id, stock)).await.unwrap();
    assert!(matches!(restore(&mut conn, &store, &id).await.unwrap(), Restored::Loaded { .. }));
    Fixture { redis, conn, store, keys: SaleKeys::new(&id), id }
}

/// Every reservation record in the sale's stream, as the consumer reads it.
async fn reservations(conn: &mut redis::aio::MultiplexedConnection, keys: &SaleKeys) -> Vec<Reservation> {
    let entries: redis::streams::StreamRangeReply = conn.xrange_all(&keys.stream).await.unwrap();
    entries.ids.iter().map(|e| crate::stream::entry::parse(e).unwrap()).collect()
}

/// Wins for `user` with `key`; answers the reservation id.
async fn win(conn: &mut redis::aio::MultiplexedConnection, sale_id: &str, user: &str, key: &str) -> String {
    let reply = buy_with_key(conn, sale_id, user, key).await;
    assert_eq!(reply[0], "won", "{reply:?}");
    reply[1].clone()
}

#[tokio::test]
async fn a_redis_back_without_its_last_wins_sells_nothing_until_every_order_of_the_database_is_counted_in_it() {
    let Fixture { mut redis, mut conn, store, id, keys } = restored_sale(10).await;
    assert_eq!(buy(&mut conn, &id, "a").await, "fenced", "a restore installs the sale fenced");
    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::Synced { adopted: 0, returned: 0 });
    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::NotNeeded);

    // a and b win and get their orders; Redis saves; c and d win and get
    // theirs; a's order is cancelled and its item returned.
    let a = win(&mut conn, &id, "a", "ka").await;
    win(&mut conn, &id, "b", "kb").await;
    let first = reservations(&mut conn, &keys).await;
    write_counted(&store, &mut conn, &first).await.unwrap();
    let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    let c = win(&mut conn, &id, "c", "kc").await;
    win(&mut conn, &id, "d", "").await;
    let all = reservations(&mut conn, &keys).await;
    let written = write_counted(&store, &mut conn, &all).await.unwrap();
    assert_eq!(written.created.len(), 2);
    let a_order = store.order_by_reservation(&a).await.unwrap().unwrap();
    assert!(store.cancel_if_unpaid(&a_order.order_id).await.unwrap());
    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 1);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 7);

    // Redis comes back with the saved state: a, b sold, nothing returned.
    redis.restart();
    let mut conn = redis.conn().await;
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 8, "the older state");
    assert_eq!(buy(&mut conn, &id, "e").await, "fenced");
    assert_eq!(buy(&mut conn, &id, "c").await, "fenced", "c's win is not in this redis: it would win again");
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 8, "nothing sold while fenced");

    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::Synced { adopted: 2, returned: 1 });
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 7, "stock minus the three live orders");
    let buyers: HashMap<String, i64> = conn.hgetall(&keys.buyers).await.unwrap();
    assert_eq!(buyers, HashMap::from([("b".into(), 1), ("c".into(), 1), ("d".into(), 1)]));
    assert!(conn.sismember::<_, _, bool>(&keys.released, &a).await.unwrap());
    // c's key replays c's win; c cannot win a second item; e buys.
    assert_eq!(buy_with_key(&mut conn, &id, "c", "kc").await[..2], ["replay:won".to_owned(), c]);
    assert_eq!(buy(&mut conn, &id, "c").await, "limit_reached");
    assert_eq!(buy(&mut conn, &id, "e").await, "won");
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 6);
    // a's return is not given twice by the return loop either.
    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 0);
    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::NotNeeded);
}

#[tokio::test]
async fn the_fence_is_lifted_only_for_the_redis_the_sale_was_resynced_on() {
    let Fixture { redis: _redis, mut conn, store, id, keys } = restored_sale(3).await;
    let () = conn.set(&keys.synced, "00aa").await.unwrap();
    // A re-sync that ran on another Redis (its replication id) lifts nothing.
    assert!(!fence(&mut conn, &keys, "00bb").await.unwrap().lifted);
    assert_eq!(buy(&mut conn, &id, "u").await, "fenced");
    let seen = fence(&mut conn, &keys, "").await.unwrap();
    assert!(seen.present && seen.synced == "00aa" && seen.replid != "00aa");
    assert!(fence(&mut conn, &keys, &seen.replid).await.unwrap().lifted);
    assert_eq!(buy(&mut conn, &id, "u").await, "won");
    // An absent sale is the restore's: the fence neither reports nor lifts it.
    let gone = SaleKeys::new("gone");
    let absent = fence(&mut conn, &gone, &seen.replid).await.unwrap();
    assert!(!absent.present && !absent.lifted);
    assert_eq!(resyncer().resync(&mut conn, &store, "gone").await.unwrap(), Resynced::Absent);
}

#[tokio::test]
async fn an_order_whose_reservation_redis_lost_is_not_written() {
    let Fixture { mut redis, mut conn, store, id, keys } = restored_sale(1).await;
    resyncer().resync(&mut conn, &store, &id).await.unwrap();
    let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    win(&mut conn, &id, "lost", "").await;
    let lost = reservations(&mut conn, &keys).await;
    // Redis loses the win before its order was written.
    redis.restart();
    let mut conn = redis.conn().await;
    resyncer().resync(&mut conn, &store, &id).await.unwrap();
    assert_eq!(buy(&mut conn, &id, "other").await, "won", "the only item, sold again in the redis that lost the first win");
    let written = write_counted(&store, &mut conn, &lost).await.unwrap();
    assert!(written.counted.is_empty() && written.uncounted.len() == 1, "{written:?}");
    assert_eq!(store.count_live_orders(&id).await.unwrap(), 0, "never more orders than the stock");
}

#[tokio::test]
async fn a_resync_gives_back_an_idempotency_key_only_for_what_is_left_of_its_ttl() {
    let Fixture { redis: _redis, mut conn, store, id, keys } = restored_sale(5).await;
    let now = flashgate_common::now_ms();
    let mut old = crate::testing::reservation(&id, "old");
    (old.idempotency_key, old.reserved_at_ms) = ("kold".into(), now - 3_600_000);
    let mut recent = crate::testing::reservation(&id, "recent");
    (recent.idempotency_key, recent.reserved_at_ms) = ("krecent".into(), now - 30_000);
    // Orders Redis does not know (it lost them), and a fence.
    store.insert_orders(&[old.clone(), recent.clone()]).await.unwrap();
    let () = conn.set(&keys.synced, "00").await.unwrap();
    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::Synced { adopted: 2, returned: 0 });
    assert!(!conn.exists::<_, bool>(keys.idempotency("old", "kold")).await.unwrap(), "its TTL ran out long ago");
    let ttl: i64 = conn.ttl(keys.idempotency("recent", "krecent")).await.unwrap();
    assert!((1..=30).contains(&ttl), "what is left of 60 s after 30 s, got {ttl}");
    assert_eq!(buy(&mut conn, &id, "old").await, "limit_reached", "the per-user limit counts both");
}

#[tokio::test]
async fn an_operators_change_the_redis_lost_is_applied_before_the_sale_sells_again() {
    let Fixture { mut redis, mut conn, store, id, keys } = restored_sale(10).await;
    resyncer().resync(&mut conn, &store, &id).await.unwrap();
    win(&mut conn, &id, "a", "").await;
    let first = reservations(&mut conn, &keys).await;
    write_counted(&store, &mut conn, &first).await.unwrap();
    let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    // The operator lowers the stock to 4; Redis then loses that write.
    let lower = SaleSpec { stock: 4, ..sale(&id, 10) };
    store.upsert_sale(&lower).await.unwrap();
    crate::sales::apply(&mut conn, &store, &lower).await.unwrap();
    redis.restart();
    let mut conn = redis.conn().await;
    assert_eq!(conn.hget::<_, _, i64>(&keys.meta, "stock").await.unwrap(), 10, "the older definition");
    assert!(matches!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::Synced { adopted: 0, .. }));
    assert_eq!(conn.hget::<_, _, i64>(&keys.meta, "stock").await.unwrap(), 4);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 3, "the new stock minus the one order");
}

/// A user whose home bucket is `k` of `buckets`.
fn user_in(k: u32, buckets: u32) -> String {
    (0..).map(|i| format!("u{i}")).find(|u| flashgate_common::buckets::home_bucket(u, buckets) == k).unwrap()
}

#[tokio::test]
async fn a_failed_over_bucket_that_lost_a_take_an_add_an_order_and_a_base_change_is_resynced_to_balanced_books() {
    use flashgate_common::transfer::{self, Taken};
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = SaleSpec { buckets: 2, ..sale(&id, 10) };
    store.upsert_sale(&spec).await.unwrap();
    assert!(matches!(restore(&mut conn, &store, &id).await.unwrap(), Restored::Loaded { .. }));
    let (b0, b1) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // Bucket 0 gives 3 to bucket 1 (x1), bucket 1 gives 4 back (x2).
    assert_eq!(transfer::take(&mut conn, &id, 0, 1, "x1", 8).await.unwrap(), Taken::Moved(3));
    assert!(transfer::complete(&mut conn, &id, 0, 1, "x1", 3).await.unwrap());
    assert_eq!(transfer::take(&mut conn, &id, 1, 0, "x2", 4).await.unwrap(), Taken::Moved(4));
    assert!(transfer::complete(&mut conn, &id, 1, 0, "x2", 4).await.unwrap());
    // A buyer of bucket 0 won; the order is in the database.
    let buyer = user_in(0, 2);
    store.insert_orders(&[crate::testing::reservation(&id, &buyer)]).await.unwrap();
    // The operator raised the stock to 12, bucket 0's base by 2.
    store.upsert_sale(&SaleSpec { stock: 12, ..spec.clone() }).await.unwrap();
    // Bucket 0's Redis fails over to a replica that lacks the take x1 (its
    // record and its DECRBY), the add x2, the buyer's win and the base
    // change: its replication id is not the one it was synced on.
    let () = conn.hdel(&b0.xfer_out, "x1").await.unwrap();
    let () = conn.hdel(&b0.xfer_in, "x2").await.unwrap();
    let () = conn.set(&b0.remaining, 5).await.unwrap();
    let () = conn.set(&b0.synced, "00").await.unwrap();
    assert_eq!(buy(&mut conn, &flashgate_common::buckets::bucket_id(&id, 0), &buyer).await, "fenced");
    assert_eq!(transfer::take(&mut conn, &id, 0, 1, "x3", 8).await.unwrap(), Taken::Fenced, "nothing is taken from a fenced bucket");

    // Within the settle bound (a gateway may still be giving what it took
    // from bucket 0 on its old master): not re-synced yet.
    let waiting = Resyncer::new(TTL, IntCounter::new("scripts", "script calls").unwrap(), Duration::from_secs(60));
    assert_eq!(waiting.resync(&mut conn, &store, &id).await.unwrap(), Resynced::Settling);
    assert_eq!(conn.get::<_, String>(&b0.synced).await.unwrap(), "00", "still fenced");

    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::Synced { adopted: 1, returned: 0 });
    assert_eq!(resyncer().resync(&mut conn, &store, &id).await.unwrap(), Resynced::NotNeeded, "nothing twice");
    // 5 - 1 order + 4 re-added (x2) - 3 re-taken (x1) + 2 of base change.
    assert_eq!(conn.get::<_, i64>(&b0.remaining).await.unwrap(), 7);
    assert_eq!(conn.hget::<_, _, i64>(&b0.meta, "stock").await.unwrap(), 7, "bucket 0's base: its 5 and the 2 it lost");
    let x1: String = conn.hget(&b0.xfer_out, "x1").await.unwrap();
    assert!(serde_json::from_str::<transfer::Record>(&x1).unwrap().done, "{x1}");
    assert_eq!(conn.hget::<_, _, i64>(&b0.xfer_out, "#open").await.unwrap(), 0, "a lost take comes back done, nothing open");
    for k in 0..2 {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
    }
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!((books.total(), books.in_transit, books.reserved), (12, 0, 1), "{books:?}");
    assert_eq!(conn.get::<_, i64>(&b1.remaining).await.unwrap(), 4);
    // The bucket sells again; its buyer is at the limit.
    assert_eq!(buy(&mut conn, &flashgate_common::buckets::bucket_id(&id, 0), &buyer).await, "limit_reached");
    assert_eq!(buy(&mut conn, &flashgate_common::buckets::bucket_id(&id, 0), "other").await, "won");
}
