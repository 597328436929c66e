//! Bucketed stock (`buckets = N`) on a 3-master Redis Cluster, with real
//! gateways and backends on loopback: exact sales with items moving
//! between buckets, the per-user limit, and a transfer left half-done by a
//! gateway that died, which the backend's transit repair completes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashgate_common::buckets::home_bucket;
use flashgate_common::keys::SaleKeys;
use flashgate_common::transfer::{self, Taken};
use flashgate_tests::{buy_all, get_json, Attempt, Deployment, RedisCluster, RedisMode, Stack, StackOptions, ADMIN_TOKEN};
use redis::aio::MultiplexedConnection;

/// A plain connection to one node of the cluster.
async fn node(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Waits until `n` gateways are subscribed to sale events.
async fn wait_subscribers(cluster: &RedisCluster, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut total = 0;
        for port in cluster.topology().await.into_iter().filter(|t| !t.is_failing()).map(|t| t.port) {
            let subs: Vec<(String, i64)> =
                redis::cmd("PUBSUB").arg("NUMSUB").arg("fg:events").query_async(&mut node(port).await).await.unwrap();
            total += subs[0].1;
        }
        if total >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{total} of {n} gateways subscribed to sale events");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates an open bucketed sale through the admin API.
async fn put_bucketed(stack: &Stack, id: &str, stock: i64, per_user_limit: i64, buckets: u32) {
    let now = flashgate_common::now_ms();
    let body = serde_json::json!({
        "name": format!("Sale {id}"),
        "stock": stock,
        "per_user_limit": per_user_limit,
        "starts_at": flashgate_common::rfc3339(now - 1000),
        "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        "buckets": buckets,
    });
    let resp = stack.http.put(stack.admin_url(&format!("/admin/sales/{id}"))).bearer_auth(ADMIN_TOKEN).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status, 201, "PUT sale {id}: {v}");
    assert_eq!(v["buckets"], buckets, "{v}");
    assert_eq!(v["remaining"], stock, "{v}");
}

/// `n` user ids whose home bucket (of `buckets`) satisfies `want`.
fn users_where(prefix: &str, n: usize, buckets: u32, want: impl Fn(u32) -> bool) -> Vec<String> {
    (0..).map(|i| format!("{prefix}-{i}")).filter(|u| want(home_bucket(u, buckets))).take(n).collect()
}

/// A unique sale id.
fn sale_id(prefix: &str) -> String {
    format!("{prefix}{:08x}", rand::random::<u32>())
}

/// One buy of `user` on `gateway`, retried while it answers 503 (a refill
/// cut by its deadline, or a transfer not delivered yet), for at most 20 s.
async fn buy_until_decided(gateway: std::net::SocketAddr, sale: &str, user: &str) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = buy_all(gateway, sale, vec![Attempt::by(user)], 1).await.remove(0);
        if o.status != 503 || Instant::now() > deadline {
            return (o.status, o.body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cluster_stack() -> StackOptions {
    StackOptions { redis_mode: RedisMode::Cluster, redis_timeout_ms: 1000, ..StackOptions::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucketed_sale_sells_exactly_its_stock_over_several_masters_with_a_skewed_crowd() {
    let stack = Stack::start(cluster_stack()).await;
    let Deployment::Cluster(cluster) = &stack.deployment else { unreachable!("cluster mode") };
    let (_backend2, backend2_addr) = stack.start_second_backend();
    let (_gateway2, gateway2_addr) = stack.start_gateway_via(backend2_addr);
    let gateways = [stack.gateway_addr, gateway2_addr];
    wait_subscribers(cluster, 2).await;

    const STOCK: i64 = 600;
    const BUCKETS: u32 = 6;
    let id = sale_id("hot");
    put_bucketed(&stack, &id, STOCK, 1, BUCKETS).await;
    let mut masters = HashSet::new();
    for k in 0..BUCKETS {
        masters.insert(cluster.master_for_key(&SaleKeys::bucket(&id, k).meta).await);
    }
    assert!(masters.len() > 1, "the buckets' tags land on more than one master: {masters:?}");

    // 1,200 buyers, two for each item, skewed: 900 at home in bucket 0,
    // 60 in each other bucket, fewer than its 100 items. Without transfers
    // at most 100 + 5 × 60 = 400 could win: exactly 600 winners needs the
    // other buckets' items moved to bucket 0.
    let mut users = users_where(&format!("{id}-hot"), 900, BUCKETS, |b| b == 0);
    for k in 1..BUCKETS {
        users.extend(users_where(&format!("{id}-rest{k}"), 60, BUCKETS, |b| b == k));
    }

    // Every bucket's own books balance at every instant of the sale, and
    // so does the sale's: each bucket is read atomically (one MULTI in its
    // slot), and summed, `Σ remaining + Σ reserved + in transit = stock`
    // with in transit = Σ sent − Σ received over the buckets. The books
    // read transfer by transfer (`transfer::books`) are checked exactly
    // once nothing moves, after the burst.
    let selling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (selling, id) = (selling.clone(), id.clone());
        let mut conn = stack.redis_handle().await;
        tokio::spawn(async move {
            let mut samples = 0;
            while selling.load(Ordering::Relaxed) {
                let (mut remaining, mut reserved, mut in_transit) = (0, 0, 0);
                for k in 0..BUCKETS {
                    let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
                    assert!(ledger.balances(), "bucket {k} out of balance while selling: {ledger:?}");
                    remaining += ledger.remaining;
                    reserved += ledger.reserved;
                    in_transit += ledger.sent - ledger.received;
                }
                assert_eq!(remaining + reserved + in_transit, STOCK, "the sale's books while selling");
                samples += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        })
    };
    let mut runs = Vec::new();
    for (g, gateway) in gateways.iter().enumerate() {
        let attempts: Vec<Attempt> = users.iter().enumerate().filter(|(i, _)| i % 2 == g).map(|(_, u)| Attempt::by(u)).collect();
        let (gateway, id) = (*gateway, id.clone());
        runs.push(tokio::spawn(async move { buy_all(gateway, &id, attempts, 24).await }));
    }
    let mut outcomes = Vec::new();
    for run in runs {
        outcomes.extend(run.await.unwrap());
    }
    selling.store(false, Ordering::Relaxed);
    assert!(sampler.await.unwrap() > 0, "the books were sampled while selling");

    // A refill cut by its deadline on this loaded machine answers 503: the
    // buyer retries, as a client would, until decided.
    for (i, o) in outcomes.iter_mut().filter(|o| o.status == 503).enumerate() {
        let gateway = gateways[i % 2];
        let (status, body) = buy_until_decided(gateway, &id, &o.attempt.user).await;
        (o.status, o.body) = (status, body);
    }
    let statuses: HashSet<u16> = outcomes.iter().map(|o| o.status).collect();
    assert!(statuses.iter().all(|s| [202, 410].contains(s)), "unexpected answers {statuses:?}");
    let winners: Vec<&str> = outcomes.iter().filter(|o| o.won()).map(|o| o.reservation_id().unwrap()).collect();
    assert_eq!(winners.len() as i64, STOCK, "exactly the stock wins while buyers outnumber it: no undersell, no oversell");
    let (orders, distinct, most) = stack.wait_orders(&id, STOCK, Duration::from_secs(30)).await;
    assert_eq!((orders, distinct, most), (STOCK, STOCK, 1), "one order per winner, nobody above the limit");
    let rows: HashSet<String> = stack.order_rows(&id).await.into_iter().map(|r| r.reservation_id).collect();
    assert!(winners.iter().all(|rid| rows.contains(*rid)), "a winner has no order");

    let mut conn = stack.redis_handle().await;
    let books = transfer::books(&mut conn, &id, BUCKETS).await.unwrap();
    assert_eq!((books.total(), books.in_transit, books.reserved), (STOCK, 0, STOCK), "{books:?}");
    assert!(books.remaining.iter().all(|r| *r == 0), "{books:?}");
    let moved: i64 = {
        let mut sent = 0;
        for k in 0..BUCKETS {
            sent += transfer::ledger(&mut conn, &id, k).await.unwrap().sent;
        }
        sent
    };
    assert!(moved > 0, "bucket 0's crowd was served by items moved from the other buckets");
    let (status, view) = get_json(&stack.http, &stack.url(&format!("/api/sales/{id}"))).await;
    assert_eq!((status, view["remaining"].as_i64()), (200, Some(0)), "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nobody_buys_above_the_per_user_limit_of_a_bucketed_sale() {
    let stack = Stack::start(cluster_stack()).await;
    let id = sale_id("lim");
    put_bucketed(&stack, &id, 60, 3, 4).await;
    // 15 users, each hammering ten buys: 45 items at most can go.
    let users: Vec<String> = (0..15).map(|i| format!("{id}-u{i}")).collect();
    let attempts: Vec<Attempt> = (0..10).flat_map(|_| users.iter().map(|u| Attempt::by(u))).collect();
    let outcomes = buy_all(stack.gateway_addr, &id, attempts, 32).await;
    let mut wins: HashMap<&str, usize> = HashMap::new();
    for o in outcomes.iter().filter(|o| o.won()) {
        *wins.entry(o.attempt.user.as_str()).or_default() += 1;
    }
    assert!(wins.values().all(|n| *n <= 3), "a user above the limit: {wins:?}");
    assert_eq!(wins.values().sum::<usize>(), 45, "every user got their 3: {wins:?}");
    let (orders, _, most) = stack.wait_orders(&id, 45, Duration::from_secs(30)).await;
    assert_eq!((orders, most), (45, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transfer_cut_between_its_two_sides_stays_in_the_books_and_is_delivered() {
    let stack = Stack::start(cluster_stack()).await;
    let Deployment::Cluster(cluster) = &stack.deployment else { unreachable!("cluster mode") };
    let (_gateway2, gateway2_addr) = stack.start_gateway_via(stack.backend_addr);
    let gateways = [stack.gateway_addr, gateway2_addr];
    wait_subscribers(cluster, 2).await;
    let id = sale_id("cut");
    put_bucketed(&stack, &id, 6, 1, 2).await;
    let mut conn = stack.redis_handle().await;

    // A gateway takes 2 items out of bucket 0 for bucket 1, then dies.
    assert_eq!(transfer::take(&mut conn, &id, 0, 1, "dead-gateway-1", 8).await.unwrap(), Taken::Moved(2));
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!((books.remaining.clone(), books.in_transit, books.total()), (vec![1, 3], 2, 6), "in transit, in the books");
    // The backend's transit repair delivers it (older than 2 s, within a
    // pass of `backend.restore_poll_ms`).
    let deadline = Instant::now() + Duration::from_secs(20);
    let books = loop {
        let books = transfer::books(&mut conn, &id, 2).await.unwrap();
        if books.in_transit == 0 {
            break books;
        }
        assert!(Instant::now() < deadline, "the transfer was never delivered: {books:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((books.remaining.clone(), books.total()), (vec![1, 5], 6), "delivered once: nothing created or lost");

    // Another dies the same way, out of bucket 1 into bucket 0, and both
    // buckets then sell dry: only items in transit are left.
    let bucket0 = users_where(&format!("{id}-a"), 4, 2, |b| b == 0);
    let bucket1 = users_where(&format!("{id}-b"), 4, 2, |b| b == 1);
    assert_eq!(transfer::take(&mut conn, &id, 1, 0, "dead-gateway-2", 8).await.unwrap(), Taken::Moved(3));
    for user in [&bucket1[0], &bucket1[1], &bucket0[0]] {
        let (status, body) = stack.buy(&id, user, None).await;
        assert_eq!(status, 202, "{user}: {body}");
    }
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    if books.in_transit > 0 {
        // Not repaired yet (it is younger than 2 s): every bucket is dry,
        // yet the sale is not sold out, and a buyer wins.
        assert_eq!((books.remaining.clone(), books.in_transit, books.total()), (vec![0, 0], 3, 6), "{books:?}");
        let (status, view) = get_json(&stack.http, &stack.url(&format!("/api/sales/{id}"))).await;
        assert_eq!(status, 200);
        assert_ne!(view["state"], "sold_out", "{view}");
    }
    // While items are in transit, buyers at home in either bucket, on
    // either gateway, win (a 503 is retried), never hear 410: bucket 1
    // sent its items away, bucket 0 is dry until they arrive.
    for (user, gateway) in [(&bucket1[2], gateways[1]), (&bucket0[1], gateways[0]), (&bucket1[3], gateways[0])] {
        let (status, body) = buy_until_decided(gateway, &id, user).await;
        assert_eq!(status, 202, "items in transit are sold, not lost: {user}: {body}");
    }
    // Now every bucket is dry and nothing is in transit: sold out, on both.
    for (user, gateway) in [(&bucket0[2], gateways[0]), (&bucket1[2].replace("-b-", "-c-"), gateways[1])] {
        let (status, body) = buy_until_decided(gateway, &id, user).await;
        assert_eq!((status, body["code"].as_str()), (410, Some("sold_out")), "{user}: {body}");
    }

    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!((books.remaining.clone(), books.in_transit, books.reserved), (vec![0, 0], 0, 6), "{books:?}");
    let (orders, distinct, most) = stack.wait_orders(&id, 6, Duration::from_secs(30)).await;
    assert_eq!((orders, distinct, most), (6, 6, 1));
}

/// Which side of a transfer loses its last writes with its master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Killed {
    Donor,
    Target,
}

/// The replication id of the Redis on `port`.
async fn replid(port: u16) -> String {
    let info: String = redis::cmd("INFO").arg("replication").query_async(&mut node(port).await).await.unwrap();
    info.lines().find_map(|l| l.strip_prefix("master_replid:")).expect("a replication id").trim().to_owned()
}

/// One buy of `user`, retried while it answers 503 (a fenced bucket, a
/// refill cut by its deadline), until `deadline`.
async fn decide(gateway: std::net::SocketAddr, sale: &str, user: &str, deadline: Instant) -> (u16, serde_json::Value) {
    loop {
        let o = buy_all(gateway, sale, vec![Attempt::by(user)], 1).await.remove(0);
        if o.status != 503 || Instant::now() > deadline {
            return (o.status, o.body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sale of two buckets on two masters; a transfer cut between its sides
/// (the donor took, the gateway died); then the master of one bucket
/// (`killed`) is `kill -9`'d with its replica behind: the promoted replica
/// lacks a take (donor) or an add (target) of a delivered transfer, and a
/// win whose order the database has. Buys keep arriving; the bucket must
/// be re-synced and sell again, and the sale sell exactly its stock.
async fn a_failed_over_bucket_is_resynced_and_the_sale_sells_exactly_its_stock(killed: Killed) {
    const STOCK: i64 = 20;
    let mut stack = Stack::start(cluster_stack()).await;
    let Deployment::Cluster(cluster) = &stack.deployment else { unreachable!("cluster mode") };
    let (id, masters) = loop {
        let id = sale_id("fo");
        let m0 = cluster.master_for_key(&SaleKeys::bucket(&id, 0).meta).await;
        let m1 = cluster.master_for_key(&SaleKeys::bucket(&id, 1).meta).await;
        if m0 != m1 {
            break (id, [m0, m1]);
        }
    };
    put_bucketed(&stack, &id, STOCK, 1, 2).await;
    let (donor, target) = (0_u32, 1_u32);
    let lost = if killed == Killed::Donor { donor } else { target };
    let victim = masters[lost as usize];
    let homed =
        [users_where(&format!("{id}-a"), STOCK as usize, 2, |b| b == 0), users_where(&format!("{id}-b"), STOCK as usize, 2, |b| b == 1)];
    let mut won: Vec<String> = Vec::new();
    for user in [&homed[0][0], &homed[0][1], &homed[1][0], &homed[1][1]] {
        let (status, body) = stack.buy(&id, user, None).await;
        assert_eq!(status, 202, "{user}: {body}");
        won.push(user.clone());
    }
    let mut conn = stack.redis_handle().await;
    // A gateway takes items out of the donor for the target, then dies.
    assert!(matches!(transfer::take(&mut conn, &id, donor, target, "cut", 2).await.unwrap(), Taken::Moved(2)));
    cluster.wait_replicas_caught_up(Duration::from_secs(10)).await;

    // The victim's replica falls behind: frozen, its link cut.
    let replica = cluster.replica_of(victim).await;
    cluster.signal(replica, "STOP");
    let cut: i64 = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").query_async(&mut node(victim).await).await.unwrap();
    assert_eq!(cut, 1, "the victim's link to its replica");
    // Writes its replica lacks: one side of a delivered transfer, and a win
    // in its bucket whose order reaches the database.
    let (Taken::Moved(n), Some(taken_on)) = transfer::take_on(&mut conn, &id, donor, target, "lost", 8).await.unwrap() else {
        panic!("nothing taken")
    };
    assert_eq!(transfer::give(&mut conn, &id, donor, target, "lost", n, &taken_on).await.unwrap(), transfer::Given::Added);
    assert!(transfer::close(&mut conn, &id, donor, "lost").await.unwrap());
    let user = &homed[lost as usize][2];
    let (status, body) = stack.buy(&id, user, None).await;
    assert_eq!(status, 202, "{user}: {body}");
    won.push(user.clone());
    let until = Instant::now() + Duration::from_secs(10);
    while stack.order_rows(&id).await.len() < won.len() {
        assert!(Instant::now() < until, "the orders of the wins before the fault were never written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(conn);
    if let Deployment::Cluster(cluster) = &mut stack.deployment {
        cluster.kill(victim);
        cluster.signal(replica, "CONT");
    }
    let Deployment::Cluster(cluster) = &stack.deployment else { unreachable!("cluster mode") };
    let promoted = cluster.wait_failover(&SaleKeys::bucket(&id, lost).meta, Duration::from_secs(30)).await;
    assert_eq!(promoted, replica, "the victim's replica serves the bucket");

    // Buys keep arriving, from both buckets' buyers, while the bucket is
    // fenced and after.
    let rest: Vec<String> = (2..STOCK as usize).flat_map(|i| [&homed[0][i], &homed[1][i]]).filter(|u| !won.contains(u)).cloned().collect();
    let buying = {
        let (gateway, id) = (stack.gateway_addr, id.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            let mut outcomes = Vec::new();
            for user in rest {
                let (status, body) = decide(gateway, &id, &user, deadline).await;
                outcomes.push((user, status, body));
            }
            outcomes
        })
    };
    // The failed-over bucket is re-synced on the promoted master.
    let keys = SaleKeys::bucket(&id, lost);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let synced: Option<String> = redis::cmd("GET").arg(&keys.synced).query_async(&mut node(promoted).await).await.unwrap();
        if synced.as_deref() == Some(replid(promoted).await.as_str()) {
            break;
        }
        assert!(Instant::now() < until, "bucket {lost} was never re-synced on its promoted master");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outcomes = buying.await.unwrap();
    for (user, status, body) in &outcomes {
        assert!([202, 410].contains(status), "{user}: {status} {body}");
    }
    let after = outcomes.iter().filter(|(_, status, _)| *status == 202).count();
    let sold_in_lost = outcomes.iter().filter(|(user, status, _)| *status == 202 && home_bucket(user, 2) == lost).count();
    assert!(sold_in_lost > 0, "the re-synced bucket sells again");
    assert_eq!((won.len() + after) as i64, STOCK, "exactly the stock wins: no undersell, no oversell");
    let (orders, distinct, most) = stack.wait_orders(&id, STOCK, Duration::from_secs(30)).await;
    assert_eq!((orders, distinct, most), (STOCK, STOCK, 1), "one order per winner, nobody above the limit");

    let mut conn = stack.redis_handle().await;
    let until = Instant::now() + Duration::from_secs(20);
    let books = loop {
        let books = transfer::books(&mut conn, &id, 2).await.unwrap();
        if books.in_transit == 0 {
            break books;
        }
        assert!(Instant::now() < until, "a transfer stayed in transit: {books:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((books.total(), books.in_transit, books.reserved, books.remaining.clone()), (STOCK, 0, STOCK, vec![0, 0]), "{books:?}");
    for k in 0..2 {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_donor_bucket_whose_master_fails_over_mid_transfer_is_resynced_and_the_sale_sells_exactly_its_stock() {
    a_failed_over_bucket_is_resynced_and_the_sale_sells_exactly_its_stock(Killed::Donor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_bucket_whose_master_fails_over_mid_transfer_is_resynced_and_the_sale_sells_exactly_its_stock() {
    a_failed_over_bucket_is_resynced_and_the_sale_sells_exactly_its_stock(Killed::Target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_waits_a_take_no_replica_holds_is_not_given_and_stays_open_for_the_repair() {
    let stack = Stack::start(StackOptions { redis_extra: "wait_replicas = 1\nwait_timeout_ms = 200".into(), ..cluster_stack() }).await;
    let Deployment::Cluster(cluster) = &stack.deployment else { unreachable!("cluster mode") };
    let (id, donor_master) = loop {
        let id = sale_id("wt");
        let m0 = cluster.master_for_key(&SaleKeys::bucket(&id, 0).meta).await;
        if m0 != cluster.master_for_key(&SaleKeys::bucket(&id, 1).meta).await {
            break (id, m0);
        }
    };
    put_bucketed(&stack, &id, 4, 1, 2).await;
    let homed = users_where(&format!("{id}-b"), 4, 2, |b| b == 1);
    // Bucket 1 sells its two items; bucket 0 keeps its two.
    for user in &homed[..2] {
        let (status, body) = stack.buy(&id, user, None).await;
        assert_eq!(status, 202, "{user}: {body}");
    }
    // Connected before the freeze (a new cluster connection would wait
    // for the frozen node).
    let mut conn = stack.redis_handle().await;
    // The donor's replica falls behind: frozen, its link cut.
    let replica = cluster.replica_of(donor_master).await;
    cluster.signal(replica, "STOP");
    let cut: i64 = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").query_async(&mut node(donor_master).await).await.unwrap();
    assert_eq!(cut, 1, "the donor's link to its replica");
    // A buyer of the dry bucket 1: the take out of bucket 0 reaches no
    // replica, so its items are not given (a failover of the donor could
    // lose the take while the target kept them).
    let (status, body) = stack.buy(&id, &homed[2], None).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("unavailable")), "{body}");
    // Had the gateway given the item, the buyer's deduct would have won
    // it: the item was taken and left in transit, which the transit
    // repair delivers once it is 2 s old (maybe already).
    let ledger = transfer::ledger(&mut conn, &id, 0).await.unwrap();
    assert_eq!((ledger.remaining, ledger.sent), (1, 1), "taken out of the donor: {ledger:?}");
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!((books.remaining[1] + books.in_transit, books.total()), (1, 4), "taken, not sold: {books:?}");
    // The replica resumes; the transit repair delivers the open transfer,
    // and the buyers of bucket 1 get the last two items.
    cluster.signal(replica, "CONT");
    for user in &homed[2..] {
        let (status, body) = buy_until_decided(stack.gateway_addr, &id, user).await;
        assert_eq!(status, 202, "{user}: {body}");
    }
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!((books.remaining.clone(), books.in_transit, books.reserved), (vec![0, 0], 0, 4), "{books:?}");
    let (orders, distinct, most) = stack.wait_orders(&id, 4, Duration::from_secs(30)).await;
    assert_eq!((orders, distinct, most), (4, 4, 1));
}
