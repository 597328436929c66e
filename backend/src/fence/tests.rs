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
    Resyncer::new(TTL, IntCounter::new("scripts", "script calls").unwrap())
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
    store.sales().upsert(&sale(&id, stock)).await.unwrap();
    assert!(matches!(
        restore(&mut conn, &store, &id).await.unwrap(),
        Restored::Loaded { .. }
    ));
    Fixture {
        redis,
        conn,
        store,
        keys: SaleKeys::new(&id),
        id,
    }
}

/// Every reservation record in the sale's stream, as the consumer reads it.
async fn reservations(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &SaleKeys,
) -> Vec<Reservation> {
    let entries: redis::streams::StreamRangeReply = conn.xrange_all(&keys.stream).await.unwrap();
    entries
        .ids
        .iter()
        .map(|e| crate::stream::entry::parse(e).unwrap())
        .collect()
}

/// Wins for `user` with `key`; answers the reservation id.
async fn win(
    conn: &mut redis::aio::MultiplexedConnection,
    sale_id: &str,
    user: &str,
    key: &str,
) -> String {
    let reply = buy_with_key(conn, sale_id, user, key).await;
    assert_eq!(reply[0], "won", "{reply:?}");
    reply[1].clone()
}

#[tokio::test]
async fn a_redis_back_without_its_last_wins_sells_nothing_until_every_order_of_the_database_is_counted_in_it(
) {
    let Fixture {
        mut redis,
        mut conn,
        store,
        id,
        keys,
    } = restored_sale(10).await;
    assert_eq!(
        buy(&mut conn, &id, "a").await,
        "fenced",
        "a restore installs the sale fenced"
    );
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced {
            adopted: 0,
            returned: 0
        }
    );
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded
    );

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
    let a_order = store.orders().by_reservation(&a).await.unwrap().unwrap();
    assert!(store
        .orders()
        .cancel_if_unpaid(&a_order.order_id)
        .await
        .unwrap());
    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 1);
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 7);

    // Redis comes back with the saved state: a, b sold, nothing returned.
    redis.restart();
    let mut conn = redis.conn().await;
    assert_eq!(
        conn.get::<_, i64>(&keys.remaining).await.unwrap(),
        8,
        "the older state"
    );
    assert_eq!(buy(&mut conn, &id, "e").await, "fenced");
    assert_eq!(
        buy(&mut conn, &id, "c").await,
        "fenced",
        "c's win is not in this redis: it would win again"
    );
    assert_eq!(
        conn.get::<_, i64>(&keys.remaining).await.unwrap(),
        8,
        "nothing sold while fenced"
    );

    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced {
            adopted: 2,
            returned: 1
        }
    );
    assert_eq!(
        conn.get::<_, i64>(&keys.remaining).await.unwrap(),
        7,
        "stock minus the three live orders"
    );
    let buyers: HashMap<String, i64> = conn.hgetall(&keys.buyers).await.unwrap();
    assert_eq!(
        buyers,
        HashMap::from([("b".into(), 1), ("c".into(), 1), ("d".into(), 1)])
    );
    assert!(conn
        .sismember::<_, _, bool>(&keys.released, &a)
        .await
        .unwrap());
    // c's key replays c's win; c cannot win a second item; e buys.
    assert_eq!(
        buy_with_key(&mut conn, &id, "c", "kc").await[..2],
        ["replay:won".to_owned(), c]
    );
    assert_eq!(buy(&mut conn, &id, "c").await, "limit_reached");
    assert_eq!(buy(&mut conn, &id, "e").await, "won");
    assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 6);
    // a's return is not given twice by the return loop either.
    assert_eq!(return_stock(&mut conn, &store).await.unwrap(), 0);
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded
    );
}

#[tokio::test]
async fn the_fence_is_lifted_only_for_the_redis_the_sale_was_resynced_on() {
    let Fixture {
        redis: _redis,
        mut conn,
        store,
        id,
        keys,
    } = restored_sale(3).await;
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
    assert_eq!(
        resyncer().resync(&mut conn, &store, "gone").await.unwrap(),
        Resynced::Absent
    );
}

#[tokio::test]
async fn an_order_whose_reservation_redis_lost_is_not_written() {
    let Fixture {
        mut redis,
        mut conn,
        store,
        id,
        keys,
    } = restored_sale(1).await;
    resyncer().resync(&mut conn, &store, &id).await.unwrap();
    let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    win(&mut conn, &id, "lost", "").await;
    let lost = reservations(&mut conn, &keys).await;
    // Redis loses the win before its order was written.
    redis.restart();
    let mut conn = redis.conn().await;
    resyncer().resync(&mut conn, &store, &id).await.unwrap();
    assert_eq!(
        buy(&mut conn, &id, "other").await,
        "won",
        "the only item, sold again in the redis that lost the first win"
    );
    let written = write_counted(&store, &mut conn, &lost).await.unwrap();
    assert!(
        written.counted.is_empty() && written.uncounted.len() == 1,
        "{written:?}"
    );
    assert_eq!(
        store.orders().count_live(&id).await.unwrap(),
        0,
        "never more orders than the stock"
    );
}

#[tokio::test]
async fn a_resync_gives_back_an_idempotency_key_only_for_what_is_left_of_its_ttl() {
    let Fixture {
        redis: _redis,
        mut conn,
        store,
        id,
        keys,
    } = restored_sale(5).await;
    let now = flashgate_common::now_ms();
    let mut old = crate::testing::reservation(&id, "old");
    (old.idempotency_key, old.reserved_at_ms) = ("kold".into(), now - 3_600_000);
    let mut recent = crate::testing::reservation(&id, "recent");
    (recent.idempotency_key, recent.reserved_at_ms) = ("krecent".into(), now - 30_000);
    // Orders Redis does not know (it lost them), and a fence.
    store
        .orders()
        .insert(&[old.clone(), recent.clone()])
        .await
        .unwrap();
    let () = conn.set(&keys.synced, "00").await.unwrap();
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced {
            adopted: 2,
            returned: 0
        }
    );
    assert!(
        !conn
            .exists::<_, bool>(keys.idempotency("old", "kold"))
            .await
            .unwrap(),
        "its TTL ran out long ago"
    );
    let ttl: i64 = conn
        .ttl(keys.idempotency("recent", "krecent"))
        .await
        .unwrap();
    assert!(
        (1..=30).contains(&ttl),
        "what is left of 60 s after 30 s, got {ttl}"
    );
    assert_eq!(
        buy(&mut conn, &id, "old").await,
        "limit_reached",
        "the per-user limit counts both"
    );
}

#[tokio::test]
async fn an_operators_change_the_redis_lost_is_applied_before_the_sale_sells_again() {
    let Fixture {
        mut redis,
        mut conn,
        store,
        id,
        keys,
    } = restored_sale(10).await;
    resyncer().resync(&mut conn, &store, &id).await.unwrap();
    win(&mut conn, &id, "a", "").await;
    let first = reservations(&mut conn, &keys).await;
    write_counted(&store, &mut conn, &first).await.unwrap();
    let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    // The operator lowers the stock to 4; Redis then loses that write.
    let lower = SaleSpec {
        stock: 4,
        ..sale(&id, 10)
    };
    store.sales().upsert(&lower).await.unwrap();
    crate::sales::apply(&mut conn, &store, &lower)
        .await
        .unwrap();
    redis.restart();
    let mut conn = redis.conn().await;
    assert_eq!(
        conn.hget::<_, _, i64>(&keys.meta, "stock").await.unwrap(),
        10,
        "the older definition"
    );
    assert!(matches!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced { adopted: 0, .. }
    ));
    assert_eq!(
        conn.hget::<_, _, i64>(&keys.meta, "stock").await.unwrap(),
        4
    );
    assert_eq!(
        conn.get::<_, i64>(&keys.remaining).await.unwrap(),
        3,
        "the new stock minus the one order"
    );
}

/// A user whose home bucket is `k` of `buckets`.
fn user_in(k: u32, buckets: u32) -> String {
    (0..)
        .map(|i| format!("u{i}"))
        .find(|u| flashgate_common::buckets::home_bucket(u, buckets) == k)
        .unwrap()
}

#[tokio::test]
async fn a_failed_over_bucket_that_lost_a_take_an_add_an_order_and_a_base_change_is_resynced_to_balanced_books(
) {
    use flashgate_common::transfer::{self, Taken};
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = unique("s");
    let spec = SaleSpec {
        buckets: 2,
        ..sale(&id, 10)
    };
    store.sales().upsert(&spec).await.unwrap();
    assert!(matches!(
        restore(&mut conn, &store, &id).await.unwrap(),
        Restored::Loaded { .. }
    ));
    let (b0, b1) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // Bucket 0 gives 3 to bucket 1 (x1), bucket 1 gives 4 back (x2).
    assert_eq!(
        transfer::take(&mut conn, &id, 0, 1, "x1", 8).await.unwrap(),
        Taken::Moved(3)
    );
    assert!(transfer::complete(&mut conn, &id, 0, 1, "x1", 3, "r")
        .await
        .unwrap());
    assert_eq!(
        transfer::take(&mut conn, &id, 1, 0, "x2", 4).await.unwrap(),
        Taken::Moved(4)
    );
    assert!(transfer::complete(&mut conn, &id, 1, 0, "x2", 4, "r")
        .await
        .unwrap());
    // A buyer of bucket 0 won; the order is in the database.
    let buyer = user_in(0, 2);
    store
        .orders()
        .insert(&[crate::testing::reservation(&id, &buyer)])
        .await
        .unwrap();
    // The operator raised the stock to 12, bucket 0's base by 2.
    store
        .sales()
        .upsert(&SaleSpec {
            stock: 12,
            ..spec.clone()
        })
        .await
        .unwrap();
    // Bucket 0's Redis fails over to a replica that lacks the take x1 (its
    // record and its DECRBY), the add x2, the buyer's win and the base
    // change: its replication id is not the one it was synced on.
    let () = conn.hdel(&b0.xfer_out, "x1").await.unwrap();
    let () = conn.hdel(&b0.xfer_in, "x2").await.unwrap();
    let () = conn.set(&b0.remaining, 5).await.unwrap();
    let () = conn.set(&b0.synced, "00").await.unwrap();
    assert_eq!(
        buy(
            &mut conn,
            &flashgate_common::buckets::bucket_id(&id, 0),
            &buyer
        )
        .await,
        "fenced"
    );
    assert_eq!(
        transfer::take(&mut conn, &id, 0, 1, "x3", 8).await.unwrap(),
        Taken::Fenced,
        "nothing is taken from a fenced bucket"
    );

    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced {
            adopted: 1,
            returned: 0
        }
    );
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded,
        "nothing twice"
    );
    // 5 - 1 order + 4 re-added (x2) - 3 re-taken (x1) + 2 of base change.
    assert_eq!(conn.get::<_, i64>(&b0.remaining).await.unwrap(), 7);
    assert_eq!(
        conn.hget::<_, _, i64>(&b0.meta, "stock").await.unwrap(),
        7,
        "bucket 0's base: its 5 and the 2 it lost"
    );
    let x1: String = conn.hget(&b0.xfer_out, "x1").await.unwrap();
    assert!(
        serde_json::from_str::<transfer::Record>(&x1).unwrap().done,
        "{x1}"
    );
    assert_eq!(
        conn.hget::<_, _, i64>(&b0.xfer_out, "#open").await.unwrap(),
        0,
        "a lost take comes back done, nothing open"
    );
    for k in 0..2 {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
    }
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.total(), books.in_transit, books.reserved),
        (12, 0, 1),
        "{books:?}"
    );
    assert_eq!(conn.get::<_, i64>(&b1.remaining).await.unwrap(), 4);
    // The bucket sells again; its buyer is at the limit.
    assert_eq!(
        buy(
            &mut conn,
            &flashgate_common::buckets::bucket_id(&id, 0),
            &buyer
        )
        .await,
        "limit_reached"
    );
    assert_eq!(
        buy(
            &mut conn,
            &flashgate_common::buckets::bucket_id(&id, 0),
            "other"
        )
        .await,
        "won"
    );
}

/// A bucketed sale of `stock` over 2 buckets, installed (synced).
async fn bucketed_sale(
    conn: &mut redis::aio::MultiplexedConnection,
    store: &Store,
    stock: i64,
) -> String {
    let id = unique("s");
    store
        .sales()
        .upsert(&SaleSpec {
            buckets: 2,
            ..sale(&id, stock)
        })
        .await
        .unwrap();
    assert!(matches!(
        restore(conn, store, &id).await.unwrap(),
        Restored::Loaded { .. }
    ));
    id
}

#[tokio::test]
async fn both_sides_of_a_transfer_lost_with_the_buyers_order_in_the_database_are_covered_by_the_other_bucket_and_a_late_give_is_refused(
) {
    use flashgate_common::buckets::bucket_id;
    use flashgate_common::transfer::{self, Given, Taken};
    let mut redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let (x, y) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // Bucket Y (1) gives all its 5 items to X (0): Y is dry, X holds 10.
    for (xid, n) in [("y1", 3), ("y2", 1), ("y3", 1)] {
        assert_eq!(
            transfer::take(&mut conn, &id, 1, 0, xid, 8).await.unwrap(),
            Taken::Moved(n)
        );
        assert!(transfer::complete(&mut conn, &id, 1, 0, xid, n, "r")
            .await
            .unwrap());
    }
    let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    let old: String = conn.get(&x.synced).await.unwrap();
    // Both buckets on one master: a refill takes 5 from X for Y, gives and
    // closes; the buyer of Y wins, and the order is written.
    let buyer = user_in(1, 2);
    let (taken, replid) = transfer::take_on(&mut conn, &id, 0, 1, "lost", 8)
        .await
        .unwrap();
    assert_eq!(
        (taken, replid.as_deref()),
        (Taken::Moved(5), Some(old.as_str()))
    );
    assert!(transfer::complete(&mut conn, &id, 0, 1, "lost", 5, &old)
        .await
        .unwrap());
    let rid = buy_with_key(&mut conn, &bucket_id(&id, 1), &buyer, "").await[1].clone();
    let order = Reservation {
        reservation_id: rid,
        ..crate::testing::reservation(&id, &buyer)
    };
    store.orders().insert(&[order]).await.unwrap();
    // The master dies; its replica lacked the take, the give and the win.
    redis.restart();
    let mut conn = redis.conn().await;
    assert_eq!(
        (
            conn.get::<_, i64>(&x.remaining).await.unwrap(),
            conn.get::<_, i64>(&y.remaining).await.unwrap()
        ),
        (10, 0)
    );
    assert_eq!(
        buy(&mut conn, &bucket_id(&id, 0), "someone").await,
        "fenced",
        "every bucket is fenced"
    );

    // X finds no record of the lost take and keeps its 10; Y adopts the
    // order (remaining -1) and covers it with an item from X.
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced {
            adopted: 1,
            returned: 0
        }
    );
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded,
        "nothing twice"
    );
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (
            books.remaining.clone(),
            books.in_transit,
            books.reserved,
            books.total()
        ),
        (vec![9, 0], 0, 1, 10),
        "{books:?}"
    );
    for k in 0..2 {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
    }

    // The stalled gateway's give of the lost take, with X's old
    // replication id, arrives after the re-sync: refused, books exact.
    assert_eq!(
        transfer::give(&mut conn, &id, 0, 1, "lost", 5, &old)
            .await
            .unwrap(),
        Given::Refused
    );
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining.clone(), books.total()),
        (vec![9, 0], 10),
        "{books:?}"
    );
    // Both buckets sell again; the buyer is at the limit.
    assert_eq!(
        buy(&mut conn, &bucket_id(&id, 1), &buyer).await,
        "limit_reached"
    );
    assert_eq!(
        buy(&mut conn, &bucket_id(&id, 0), &user_in(0, 2)).await,
        "won"
    );
}

#[tokio::test]
async fn a_failed_over_bucket_stays_fenced_while_another_buckets_transfer_in_record_names_no_donor()
{
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let (b0, b1) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // A bare count from an older version in bucket 1, bucket 0 failed over.
    let () = conn.hset(&b1.xfer_in, "old", "2").await.unwrap();
    let () = conn.set(&b0.synced, "00").await.unwrap();
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::UnreadableTransfers
    );
    assert_eq!(
        conn.get::<_, String>(&b0.synced).await.unwrap(),
        "00",
        "still fenced"
    );
    assert_eq!(
        conn.get::<_, i64>(&b0.remaining).await.unwrap(),
        5,
        "nothing guessed"
    );
}

#[tokio::test]
async fn a_transfer_into_a_failed_over_bucket_still_open_on_its_donor_is_added_once() {
    use flashgate_common::transfer::{self, Given, Taken};
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let b1 = SaleKeys::bucket(&id, 1);
    // Bucket 0 took 3 for bucket 1, which failed over and lost the give.
    let (taken, replid) = transfer::take_on(&mut conn, &id, 0, 1, "open", 8)
        .await
        .unwrap();
    assert_eq!(taken, Taken::Moved(3));
    assert_eq!(
        transfer::give(&mut conn, &id, 0, 1, "open", 3, replid.as_deref().unwrap())
            .await
            .unwrap(),
        Given::Added
    );
    let () = conn.hdel(&b1.xfer_in, "open").await.unwrap();
    let () = conn.set(&b1.remaining, 5).await.unwrap();
    let () = conn.set(&b1.synced, "00").await.unwrap();
    assert!(matches!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced { .. }
    ));
    assert_eq!(
        conn.get::<_, i64>(&b1.remaining).await.unwrap(),
        8,
        "the open transfer's items are in"
    );
    // The repair (or the gateway) completes it later: added once.
    assert_eq!(
        transfer::repair(
            &mut conn,
            &id,
            2,
            flashgate_common::now_ms() + 10 * transfer::REPAIR_AFTER_MS
        )
        .await
        .unwrap(),
        1
    );
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining.clone(), books.in_transit, books.total()),
        (vec![2, 8], 0, 10),
        "{books:?}"
    );
}

#[tokio::test]
async fn a_base_cut_a_bucket_cannot_absorb_is_applied_as_far_as_it_can_and_the_bucket_sells_again()
{
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let b0 = SaleKeys::bucket(&id, 0);
    // The operator cut the stock to 2 (bucket 0 would need -8); bucket 0 lost it.
    store
        .sales()
        .upsert(&SaleSpec {
            stock: 2,
            buckets: 2,
            ..sale(&id, 2)
        })
        .await
        .unwrap();
    store.sales().set_paused(&id, true).await.unwrap();
    let () = conn.set(&b0.synced, "00").await.unwrap();
    assert!(matches!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced { .. }
    ));
    assert_eq!(
        conn.get::<_, i64>(&b0.remaining).await.unwrap(),
        0,
        "as much as it holds"
    );
    assert_eq!(conn.hget::<_, _, i64>(&b0.meta, "stock").await.unwrap(), 0);
    assert_eq!(
        conn.hget::<_, _, String>(&b0.meta, "paused").await.unwrap(),
        "1",
        "the database's pause"
    );
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded,
        "the fence is lifted"
    );
}

#[tokio::test]
async fn a_raise_the_bucket_lost_covers_its_shortfall_when_the_other_buckets_hold_nothing() {
    use flashgate_common::transfer::{self, Taken};
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let (b0, b1) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // Bucket 1 gives all its 5 items to bucket 0: bucket 1 holds nothing.
    for (xid, n) in [("y1", 3), ("y2", 1), ("y3", 1)] {
        assert_eq!(
            transfer::take(&mut conn, &id, 1, 0, xid, 8).await.unwrap(),
            Taken::Moved(n)
        );
        assert!(transfer::complete(&mut conn, &id, 1, 0, xid, n, "r")
            .await
            .unwrap());
    }
    // The operator raised the stock to 12 (bucket 0's base by 2); bucket 0
    // failed over to a Redis that lost that raise and is 1 item short.
    store
        .sales()
        .upsert(&SaleSpec {
            stock: 12,
            buckets: 2,
            ..sale(&id, 12)
        })
        .await
        .unwrap();
    let () = conn.set(&b0.remaining, -1).await.unwrap();
    let () = conn.set(&b0.synced, "00").await.unwrap();
    // Nothing to cover from bucket 1, but the raise covers it.
    assert!(matches!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced { .. }
    ));
    assert_eq!(
        conn.get::<_, i64>(&b0.remaining).await.unwrap(),
        1,
        "-1 and the 2 of the raise"
    );
    assert_eq!(
        conn.hget::<_, _, i64>(&b0.meta, "stock").await.unwrap(),
        7,
        "the raise applied once"
    );
    assert_eq!(conn.get::<_, i64>(&b1.remaining).await.unwrap(), 0);
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded,
        "the fence is lifted"
    );
}

#[tokio::test]
async fn a_failed_over_bucket_stays_fenced_while_another_buckets_transfer_out_record_cannot_be_read(
) {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let (b0, b1) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // An unreadable record in bucket 1's xfer-out: it may be a transfer
    // into bucket 0, which failed over and may have lost its add.
    let () = conn.hset(&b1.xfer_out, "bad", "{not json").await.unwrap();
    let () = conn.set(&b0.synced, "00").await.unwrap();
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::UnreadableTransfers
    );
    assert_eq!(
        conn.get::<_, String>(&b0.synced).await.unwrap(),
        "00",
        "still fenced"
    );
    assert_eq!(
        conn.get::<_, i64>(&b0.remaining).await.unwrap(),
        5,
        "nothing guessed"
    );
}

#[tokio::test]
async fn a_late_give_landing_after_its_target_lost_the_token_fence_is_reconciled_by_the_targets_resync(
) {
    use flashgate_common::transfer::{self, Given, Taken};
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let store = Store::connect(&sqlite_url()).await.unwrap();
    let id = bucketed_sale(&mut conn, &store, 10).await;
    let (k, x) = (SaleKeys::bucket(&id, 0), SaleKeys::bucket(&id, 1));
    // Bucket 0 takes 3 for bucket 1; its Redis fails over and loses the take.
    // "00" stands for the old master's replication id, the one the take
    // ran on and the new Redis's `synced` still names.
    assert_eq!(
        transfer::take(&mut conn, &id, 0, 1, "lost", 8)
            .await
            .unwrap(),
        Taken::Moved(3)
    );
    let old = "00";
    let () = conn.hdel(&k.xfer_out, &["lost", "#open"]).await.unwrap();
    let () = conn.set(&k.remaining, 5).await.unwrap();
    let () = conn.set(&k.synced, old).await.unwrap();
    // Bucket 0's re-sync finds no give of it anywhere, and fences it off.
    assert!(matches!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced { .. }
    ));
    assert_eq!(
        transfer::give(&mut conn, &id, 0, 1, "lost", 3, old)
            .await
            .unwrap(),
        Given::Refused
    );
    // Bucket 1 fails over to a Redis without that fence: the late give lands.
    let () = conn.del(&x.xfer_refuse).await.unwrap();
    let () = conn.set(&x.synced, "00").await.unwrap();
    assert_eq!(
        transfer::give(&mut conn, &id, 0, 1, "lost", 3, old)
            .await
            .unwrap(),
        Given::Added
    );
    // Bucket 1's re-sync records the take in bucket 0 and takes its items there.
    assert!(matches!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::Synced { .. }
    ));
    assert_eq!(
        resyncer().resync(&mut conn, &store, &id).await.unwrap(),
        Resynced::NotNeeded,
        "nothing twice"
    );
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining.clone(), books.in_transit, books.total()),
        (vec![2, 8], 0, 10),
        "{books:?}"
    );
    for b in 0..2 {
        let ledger = transfer::ledger(&mut conn, &id, b).await.unwrap();
        assert!(ledger.balances(), "bucket {b}: {ledger:?}");
    }
}
