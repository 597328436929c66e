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
use flashgate_tests::{
    buy_all, get_json, node, wait_subscribers, Attempt, Deployment, RedisMode, Stack, StackOptions,
};

/// Samples the books of sale `id` every 20 ms until the returned flag is
/// cleared; the task answers how many samples it read whole. Every
/// bucket's own books must balance at every instant (each bucket is read
/// atomically, one MULTI in its slot); with `stock`, so must the sale's:
/// `Σ remaining + Σ reserved + in transit = stock`, in transit being
/// `Σ sent − Σ received` over the buckets. A transient Redis error (a slot
/// moving, a timeout) skips that sample: the books are checked exactly
/// again once nothing moves.
async fn sample_books(
    stack: &Stack,
    id: &str,
    buckets: u32,
    stock: Option<i64>,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u32>) {
    let selling = Arc::new(AtomicBool::new(true));
    let (flag, id) = (selling.clone(), id.to_owned());
    let mut conn = stack.redis_handle().await;
    let sampler = tokio::spawn(async move {
        let mut samples = 0;
        while flag.load(Ordering::Relaxed) {
            let (mut total, mut read_all) = (0, true);
            for k in 0..buckets {
                let Ok(ledger) = transfer::ledger(&mut conn, &id, k).await else {
                    read_all = false;
                    break;
                };
                assert!(
                    ledger.balances(),
                    "bucket {k} out of balance while selling: {ledger:?}"
                );
                total += ledger.remaining + ledger.reserved + ledger.sent - ledger.received;
            }
            if read_all {
                if let Some(stock) = stock {
                    assert_eq!(total, stock, "the sale's books while selling");
                }
                samples += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        samples
    });
    (selling, sampler)
}

/// `n` user ids whose home bucket (of `buckets`) satisfies `want`.
fn users_where(prefix: &str, n: usize, buckets: u32, want: impl Fn(u32) -> bool) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|u| want(home_bucket(u, buckets)))
        .take(n)
        .collect()
}

/// A unique sale id.
fn sale_id(prefix: &str) -> String {
    format!("{prefix}{:08x}", rand::random::<u32>())
}

/// One buy of `user` on `gateway`, retried while it answers 503 (a refill
/// cut by its deadline, or a transfer not delivered yet), for at most 20 s.
async fn buy_until_decided(
    gateway: std::net::SocketAddr,
    sale: &str,
    user: &str,
) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = buy_all(gateway, sale, vec![Attempt::by(user)], 1)
            .await
            .remove(0);
        if o.status != 503 || Instant::now() > deadline {
            return (o.status, o.body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Buys as `user` until it wins (bounded): a `sold_out` or a 503 answered
/// before a raise reached the gateway is tried again.
async fn buy_until_won(
    gateway: std::net::SocketAddr,
    sale: &str,
    user: &str,
) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = buy_all(gateway, sale, vec![Attempt::by(user)], 1)
            .await
            .remove(0);
        if o.won() || Instant::now() > deadline {
            return (o.status, o.body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cluster_stack() -> StackOptions {
    StackOptions {
        redis_mode: RedisMode::Cluster,
        redis_timeout_ms: 1000,
        ..StackOptions::default()
    }
}

/// The full-size sale: 5,000 items in 6 buckets over the cluster's 3
/// masters, 100,000 distinct buyers through 2 gateways and 2 backends,
/// a third of them at home in one bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucketed_sale_sells_exactly_its_stock_over_several_masters_with_a_skewed_crowd() {
    let stack = Stack::start(cluster_stack()).await;
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let (_backend2, backend2_addr) = stack.start_second_backend();
    let (_gateway2, gateway2_addr) = stack.start_gateway_via(backend2_addr);
    let gateways = [stack.gateway_addr, gateway2_addr];
    wait_subscribers(cluster, 2).await;

    const STOCK: i64 = 5_000;
    const BUCKETS: u32 = 6;
    const BUYERS: usize = 100_000;
    let id = sale_id("hot");
    stack.open_bucketed_sale(&id, STOCK, 1, BUCKETS).await;
    let mut masters = HashSet::new();
    for k in 0..BUCKETS {
        masters.insert(cluster.master_for_key(&SaleKeys::bucket(&id, k).meta).await);
    }
    assert!(
        masters.len() > 1,
        "the buckets' tags land on more than one master: {masters:?}"
    );

    // Skewed: a third of the buyers at home in bucket 0 (33,333 for its
    // 834 items), the rest at home in the other five (13,333 each for 833).
    // Bucket 0 runs dry first, so exactly 5,000 winners needs items moved
    // to it while the others still sell. Interleaved, two of the rest to
    // one of bucket 0's, so both kinds keep arriving until the end.
    let hot = users_where(&format!("{id}-hot"), BUYERS / 3, BUCKETS, |b| b == 0);
    let rest = users_where(&format!("{id}-rest"), BUYERS - hot.len(), BUCKETS, |b| {
        b != 0
    });
    let mut crowd: Vec<String> = Vec::with_capacity(BUYERS);
    let mut hot = hot.into_iter();
    for pair in rest.chunks(2) {
        crowd.extend(pair.iter().cloned());
        crowd.extend(hot.next());
    }
    crowd.extend(hot);
    assert_eq!(
        crowd.iter().collect::<HashSet<_>>().len(),
        BUYERS,
        "distinct buyers"
    );

    // The books balance while selling, the sale's as well as each
    // bucket's; read transfer by transfer (`transfer::books`) they are
    // checked exactly once nothing moves, after the burst.
    let (selling, sampler) = sample_books(&stack, &id, BUCKETS, Some(STOCK)).await;
    let mut outcomes = buy_on_both(&gateways, &id, &crowd).await;
    // A refill cut by its deadline on this loaded machine answers 503: the
    // buyer asks again, as a client would, in rounds, until decided.
    let mut undecided: Vec<String> = outcomes
        .iter()
        .filter(|o| o.status == 503)
        .map(|o| o.attempt.user.clone())
        .collect();
    for _round in 0..20 {
        if undecided.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = buy_on_both(&gateways, &id, &undecided).await;
        undecided = again
            .iter()
            .filter(|o| o.status == 503)
            .map(|o| o.attempt.user.clone())
            .collect();
        outcomes.extend(again);
    }
    selling.store(false, Ordering::Relaxed);
    assert!(
        sampler.await.unwrap() > 0,
        "the books were sampled while selling"
    );
    assert!(
        undecided.is_empty(),
        "{} buyers still undecided after 20 rounds",
        undecided.len()
    );

    let statuses: HashSet<u16> = outcomes.iter().map(|o| o.status).collect();
    assert!(
        statuses.iter().all(|s| [202, 410, 503].contains(s)),
        "unexpected answers {statuses:?}"
    );
    let winners: Vec<&flashgate_tests::Outcome> = outcomes.iter().filter(|o| o.won()).collect();
    assert_eq!(
        winners.len() as i64,
        STOCK,
        "exactly the stock wins while buyers outnumber it: no undersell, no oversell"
    );
    // No `sold_out` while an item was left: the last item was sold after
    // its buyer asked, so a 410 answered before that ask was answered
    // while an item was still unsold.
    let last_win_asked = winners.iter().map(|o| o.sent).max().unwrap();
    let early = outcomes
        .iter()
        .filter(|o| o.status == 410 && o.answered < last_win_asked)
        .count();
    assert_eq!(
        early, 0,
        "{early} buyers heard sold_out before the last item's buyer asked"
    );
    // And the stock ran out while buyers were still arriving.
    let last_win_answered = winners.iter().map(|o| o.answered).max().unwrap();
    let later = outcomes
        .iter()
        .filter(|o| o.sent > last_win_answered)
        .count();
    assert!(
        later > 0,
        "the sale sold out only after the crowd had passed"
    );

    let (orders, distinct, most) = stack.wait_orders(&id, STOCK, Duration::from_secs(60)).await;
    assert_eq!(
        (orders, distinct, most),
        (STOCK, STOCK, 1),
        "one order per winner, nobody above the limit"
    );
    let rows: HashSet<String> = stack
        .order_rows(&id)
        .await
        .into_iter()
        .map(|r| r.reservation_id)
        .collect();
    assert!(
        winners
            .iter()
            .all(|o| rows.contains(o.reservation_id().unwrap())),
        "a winner has no order"
    );

    let mut conn = stack.redis_handle().await;
    let books = transfer::books(&mut conn, &id, BUCKETS).await.unwrap();
    assert_eq!(
        (books.total(), books.in_transit, books.reserved),
        (STOCK, 0, STOCK),
        "{books:?}"
    );
    assert!(books.remaining.iter().all(|r| *r == 0), "{books:?}");
    let mut sent = 0;
    for k in 0..BUCKETS {
        sent += transfer::ledger(&mut conn, &id, k).await.unwrap().sent;
    }
    assert!(
        sent > 0,
        "bucket 0's crowd was served by items moved from the other buckets"
    );
    let (status, view) = get_json(
        &stack.http,
        &stack.url(&format!("/flashgate/api/sales/{id}")),
    )
    .await;
    assert_eq!(
        (status, view["remaining"].as_i64()),
        (200, Some(0)),
        "{view}"
    );
}

/// Buys once for each of `users`, alternating between `gateways`, 24 in
/// flight on each.
async fn buy_on_both(
    gateways: &[std::net::SocketAddr; 2],
    id: &str,
    users: &[String],
) -> Vec<flashgate_tests::Outcome> {
    let mut runs = Vec::new();
    for (g, gateway) in gateways.iter().enumerate() {
        let attempts: Vec<Attempt> = users
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == g)
            .map(|(_, u)| Attempt::by(u))
            .collect();
        let (gateway, id) = (*gateway, id.to_owned());
        runs.push(tokio::spawn(async move {
            buy_all(gateway, &id, attempts, 24).await
        }));
    }
    let mut outcomes = Vec::new();
    for run in runs {
        outcomes.extend(run.await.unwrap());
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nobody_buys_above_the_per_user_limit_of_a_bucketed_sale() {
    let stack = Stack::start(cluster_stack()).await;
    let id = sale_id("lim");
    stack.open_bucketed_sale(&id, 60, 3, 4).await;
    // 15 users, each hammering ten buys: 45 items at most can go.
    let users: Vec<String> = (0..15).map(|i| format!("{id}-u{i}")).collect();
    let attempts: Vec<Attempt> = (0..10)
        .flat_map(|_| users.iter().map(|u| Attempt::by(u)))
        .collect();
    let outcomes = buy_all(stack.gateway_addr, &id, attempts, 32).await;
    let mut wins: HashMap<&str, usize> = HashMap::new();
    for o in outcomes.iter().filter(|o| o.won()) {
        *wins.entry(o.attempt.user.as_str()).or_default() += 1;
    }
    assert!(
        wins.values().all(|n| *n <= 3),
        "a user above the limit: {wins:?}"
    );
    assert_eq!(
        wins.values().sum::<usize>(),
        45,
        "every user got their 3: {wins:?}"
    );
    let (orders, _, most) = stack.wait_orders(&id, 45, Duration::from_secs(30)).await;
    assert_eq!((orders, most), (45, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transfer_cut_between_its_two_sides_stays_in_the_books_and_is_delivered() {
    let stack = Stack::start(cluster_stack()).await;
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let (_gateway2, gateway2_addr) = stack.start_gateway_via(stack.backend_addr);
    let gateways = [stack.gateway_addr, gateway2_addr];
    wait_subscribers(cluster, 2).await;
    let id = sale_id("cut");
    stack.open_bucketed_sale(&id, 6, 1, 2).await;
    let mut conn = stack.redis_handle().await;

    // A gateway takes 2 items out of bucket 0 for bucket 1, then dies.
    assert_eq!(
        transfer::take(&mut conn, &id, 0, 1, "dead-gateway-1", 8)
            .await
            .unwrap(),
        Taken::Moved(2)
    );
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining.clone(), books.in_transit, books.total()),
        (vec![1, 3], 2, 6),
        "in transit, in the books"
    );
    // The backend's transit repair delivers it (older than 2 s, within a
    // pass of `backend.restore_poll_ms`).
    let deadline = Instant::now() + Duration::from_secs(20);
    let books = loop {
        let books = transfer::books(&mut conn, &id, 2).await.unwrap();
        if books.in_transit == 0 {
            break books;
        }
        assert!(
            Instant::now() < deadline,
            "the transfer was never delivered: {books:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (books.remaining.clone(), books.total()),
        (vec![1, 5], 6),
        "delivered once: nothing created or lost"
    );

    // Another dies the same way, out of bucket 1 into bucket 0, and both
    // buckets then sell dry: only items in transit are left.
    let bucket0 = users_where(&format!("{id}-a"), 4, 2, |b| b == 0);
    let bucket1 = users_where(&format!("{id}-b"), 4, 2, |b| b == 1);
    assert_eq!(
        transfer::take(&mut conn, &id, 1, 0, "dead-gateway-2", 8)
            .await
            .unwrap(),
        Taken::Moved(3)
    );
    for user in [&bucket1[0], &bucket1[1], &bucket0[0]] {
        let (status, body) = stack.buy(&id, user, None).await;
        assert_eq!(status, 202, "{user}: {body}");
    }
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    if books.in_transit > 0 {
        // Not repaired yet (it is younger than 2 s): every bucket is dry,
        // yet the sale is not sold out, and a buyer wins.
        assert_eq!(
            (books.remaining.clone(), books.in_transit, books.total()),
            (vec![0, 0], 3, 6),
            "{books:?}"
        );
        let (status, view) = get_json(
            &stack.http,
            &stack.url(&format!("/flashgate/api/sales/{id}")),
        )
        .await;
        assert_eq!(status, 200);
        assert_ne!(view["state"], "sold_out", "{view}");
    }
    // While items are in transit, buyers at home in either bucket, on
    // either gateway, win (a 503 is retried), never hear 410: bucket 1
    // sent its items away, bucket 0 is dry until they arrive.
    for (user, gateway) in [
        (&bucket1[2], gateways[1]),
        (&bucket0[1], gateways[0]),
        (&bucket1[3], gateways[0]),
    ] {
        let (status, body) = buy_until_decided(gateway, &id, user).await;
        assert_eq!(
            status, 202,
            "items in transit are sold, not lost: {user}: {body}"
        );
    }
    // Now every bucket is dry and nothing is in transit: sold out, on both.
    for (user, gateway) in [
        (&bucket0[2], gateways[0]),
        (&bucket1[2].replace("-b-", "-c-"), gateways[1]),
    ] {
        let (status, body) = buy_until_decided(gateway, &id, user).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (410, Some("sold_out")),
            "{user}: {body}"
        );
    }

    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining.clone(), books.in_transit, books.reserved),
        (vec![0, 0], 0, 6),
        "{books:?}"
    );
    let (orders, distinct, most) = stack.wait_orders(&id, 6, Duration::from_secs(30)).await;
    assert_eq!((orders, distinct, most), (6, 6, 1));
}

/// Which side of a transfer loses its last writes with its master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Killed {
    Donor,
    Target,
}

/// One buy of `user`, retried while it answers 503 (a fenced bucket, a
/// refill cut by its deadline), until `deadline`.
async fn decide(
    gateway: std::net::SocketAddr,
    sale: &str,
    user: &str,
    deadline: Instant,
) -> (u16, serde_json::Value) {
    loop {
        let o = buy_all(gateway, sale, vec![Attempt::by(user)], 1)
            .await
            .remove(0);
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
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let (id, masters) = loop {
        let id = sale_id("fo");
        let m0 = cluster.master_for_key(&SaleKeys::bucket(&id, 0).meta).await;
        let m1 = cluster.master_for_key(&SaleKeys::bucket(&id, 1).meta).await;
        if m0 != m1 {
            break (id, [m0, m1]);
        }
    };
    stack.open_bucketed_sale(&id, STOCK, 1, 2).await;
    let (donor, target) = (0_u32, 1_u32);
    let lost = if killed == Killed::Donor {
        donor
    } else {
        target
    };
    let victim = masters[lost as usize];
    let homed = [
        users_where(&format!("{id}-a"), STOCK as usize, 2, |b| b == 0),
        users_where(&format!("{id}-b"), STOCK as usize, 2, |b| b == 1),
    ];
    let mut won: Vec<String> = Vec::new();
    for user in [&homed[0][0], &homed[0][1], &homed[1][0], &homed[1][1]] {
        let (status, body) = stack.buy(&id, user, None).await;
        assert_eq!(status, 202, "{user}: {body}");
        won.push(user.clone());
    }
    let mut conn = stack.redis_handle().await;
    // A gateway takes items out of the donor for the target, then dies.
    assert!(matches!(
        transfer::take(&mut conn, &id, donor, target, "cut", 2)
            .await
            .unwrap(),
        Taken::Moved(2)
    ));
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .await;

    // The victim's replica falls behind: frozen, its link cut.
    let replica = cluster.replica_of(victim).await;
    cluster.signal(replica, "STOP");
    let cut: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut node(victim).await)
        .await
        .unwrap();
    assert_eq!(cut, 1, "the victim's link to its replica");
    // Writes its replica lacks: one side of a delivered transfer, and a win
    // in its bucket whose order reaches the database.
    let (Taken::Moved(n), Some(taken_on)) =
        transfer::take_on(&mut conn, &id, donor, target, "lost", 8)
            .await
            .unwrap()
    else {
        panic!("nothing taken")
    };
    assert_eq!(
        transfer::give(&mut conn, &id, donor, target, "lost", n, &taken_on)
            .await
            .unwrap(),
        transfer::Given::Added
    );
    assert!(transfer::close(&mut conn, &id, donor, "lost")
        .await
        .unwrap());
    let user = &homed[lost as usize][2];
    let (status, body) = stack.buy(&id, user, None).await;
    assert_eq!(status, 202, "{user}: {body}");
    won.push(user.clone());
    let until = Instant::now() + Duration::from_secs(10);
    while stack.order_rows(&id).await.len() < won.len() {
        assert!(
            Instant::now() < until,
            "the orders of the wins before the fault were never written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(conn);
    if let Deployment::Cluster(cluster) = &mut stack.deployment {
        cluster.kill(victim);
        cluster.signal(replica, "CONT");
    }
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let promoted = cluster
        .wait_failover(&SaleKeys::bucket(&id, lost).meta, Duration::from_secs(30))
        .await;
    assert_eq!(promoted, replica, "the victim's replica serves the bucket");

    // Buys keep arriving, from both buckets' buyers, while the bucket is
    // fenced and after.
    let rest: Vec<String> = (2..STOCK as usize)
        .flat_map(|i| [&homed[0][i], &homed[1][i]])
        .filter(|u| !won.contains(u))
        .cloned()
        .collect();
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
        let synced: Option<String> = redis::cmd("GET")
            .arg(&keys.synced)
            .query_async(&mut node(promoted).await)
            .await
            .unwrap();
        if synced.as_deref()
            == Some(
                flashgate_testkit::master_replid(&mut node(promoted).await)
                    .await
                    .as_str(),
            )
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "bucket {lost} was never re-synced on its promoted master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outcomes = buying.await.unwrap();
    for (user, status, body) in &outcomes {
        assert!([202, 410].contains(status), "{user}: {status} {body}");
    }
    let after = outcomes
        .iter()
        .filter(|(_, status, _)| *status == 202)
        .count();
    let sold_in_lost = outcomes
        .iter()
        .filter(|(user, status, _)| *status == 202 && home_bucket(user, 2) == lost)
        .count();
    assert!(sold_in_lost > 0, "the re-synced bucket sells again");
    assert_eq!(
        (won.len() + after) as i64,
        STOCK,
        "exactly the stock wins: no undersell, no oversell"
    );
    let (orders, distinct, most) = stack.wait_orders(&id, STOCK, Duration::from_secs(30)).await;
    assert_eq!(
        (orders, distinct, most),
        (STOCK, STOCK, 1),
        "one order per winner, nobody above the limit"
    );

    let mut conn = stack.redis_handle().await;
    let until = Instant::now() + Duration::from_secs(20);
    let books = loop {
        let books = transfer::books(&mut conn, &id, 2).await.unwrap();
        if books.in_transit == 0 {
            break books;
        }
        assert!(
            Instant::now() < until,
            "a transfer stayed in transit: {books:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (
            books.total(),
            books.in_transit,
            books.reserved,
            books.remaining.clone()
        ),
        (STOCK, 0, STOCK, vec![0, 0]),
        "{books:?}"
    );
    for k in 0..2 {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_donor_bucket_whose_master_fails_over_mid_transfer_is_resynced_and_the_sale_sells_exactly_its_stock(
) {
    a_failed_over_bucket_is_resynced_and_the_sale_sells_exactly_its_stock(Killed::Donor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_bucket_whose_master_fails_over_mid_transfer_is_resynced_and_the_sale_sells_exactly_its_stock(
) {
    a_failed_over_bucket_is_resynced_and_the_sale_sells_exactly_its_stock(Killed::Target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_waits_a_take_no_replica_holds_is_not_given_and_stays_open_for_the_repair() {
    let stack = Stack::start(StackOptions {
        redis_extra: "wait_replicas = 1\nwait_timeout_ms = 200".into(),
        ..cluster_stack()
    })
    .await;
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let (id, donor_master) = loop {
        let id = sale_id("wt");
        let m0 = cluster.master_for_key(&SaleKeys::bucket(&id, 0).meta).await;
        if m0 != cluster.master_for_key(&SaleKeys::bucket(&id, 1).meta).await {
            break (id, m0);
        }
    };
    stack.open_bucketed_sale(&id, 4, 1, 2).await;
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
    let cut: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut node(donor_master).await)
        .await
        .unwrap();
    assert_eq!(cut, 1, "the donor's link to its replica");
    // A buyer of the dry bucket 1: the take out of bucket 0 reaches no
    // replica, so its items are not given (a failover of the donor could
    // lose the take while the target kept them).
    let (status, body) = stack.buy(&id, &homed[2], None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    // Had the gateway given the item, the buyer's deduct would have won
    // it: the item was taken and left in transit, which the transit
    // repair delivers once it is 2 s old (maybe already).
    let ledger = transfer::ledger(&mut conn, &id, 0).await.unwrap();
    assert_eq!(
        (ledger.remaining, ledger.sent),
        (1, 1),
        "taken out of the donor: {ledger:?}"
    );
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining[1] + books.in_transit, books.total()),
        (1, 4),
        "taken, not sold: {books:?}"
    );
    // The replica resumes; the transit repair delivers the open transfer,
    // and the buyers of bucket 1 get the last two items.
    cluster.signal(replica, "CONT");
    for user in &homed[2..] {
        let (status, body) = buy_until_decided(stack.gateway_addr, &id, user).await;
        assert_eq!(status, 202, "{user}: {body}");
    }
    let books = transfer::books(&mut conn, &id, 2).await.unwrap();
    assert_eq!(
        (books.remaining.clone(), books.in_transit, books.reserved),
        (vec![0, 0], 0, 4),
        "{books:?}"
    );
    let (orders, distinct, most) = stack.wait_orders(&id, 4, Duration::from_secs(30)).await;
    assert_eq!((orders, distinct, most), (4, 4, 1));
}

/// `PUT /admin/sales/{id}` of an open bucketed sale with `stock`
/// (and a payment timeout when given); status and body.
async fn change_stock(
    stack: &Stack,
    id: &str,
    window: (i64, i64),
    stock: i64,
    payment_timeout: Option<i64>,
) -> (u16, serde_json::Value) {
    let mut body = serde_json::json!({
        "name": format!("Sale {id}"),
        "stock": stock,
        "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(window.0),
        "ends_at": flashgate_common::rfc3339(window.1),
        "buckets": 4,
    });
    if let Some(t) = payment_timeout {
        body["payment_timeout_seconds"] = t.into();
    }
    stack
        .admin(
            reqwest::Method::PUT,
            &format!("/admin/sales/{id}"),
            Some(body),
        )
        .await
}

/// The crowd of `users` on the stack's gateway, a 503 retried until decided.
async fn crowd(
    gateway: std::net::SocketAddr,
    id: &str,
    users: &[String],
) -> Vec<flashgate_tests::Outcome> {
    let mut outcomes = buy_all(
        gateway,
        id,
        users.iter().map(|u| Attempt::by(u)).collect(),
        16,
    )
    .await;
    for o in outcomes.iter_mut().filter(|o| o.status == 503) {
        let (status, body) = buy_until_decided(gateway, id, &o.attempt.user).await;
        (o.status, o.body) = (status, body);
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucketed_sale_keeps_exact_books_through_stock_changes_and_payment_timeouts_while_selling(
) {
    const BUCKETS: u32 = 4;
    let stack = Stack::start(StackOptions {
        extra_toml: "expiry_poll_ms = 100\n".into(),
        ..cluster_stack()
    })
    .await;
    let id = sale_id("chg");
    let now = flashgate_common::now_ms();
    let window = (now - 1000, now + 3_600_000);
    let (status, view) = change_stock(&stack, &id, window, 300, Some(900)).await;
    assert_eq!(
        (status, view["remaining"].as_i64()),
        (201, Some(300)),
        "{view}"
    );

    // Every bucket's own books balance at every instant, whatever buys,
    // transfers, stock changes and returns do to it.
    let (selling, sampler) = sample_books(&stack, &id, BUCKETS, None).await;

    // Wave 1: 350 buyers, more than the 300 items at first, 280 of them
    // at home in bucket 0 (75 items: the rest come by transfers), while an
    // operator raises the stock to 500: the raise is needed for all to win.
    let mut wave1 = users_where(&format!("{id}-a"), 280, BUCKETS, |b| b == 0);
    wave1.extend(users_where(&format!("{id}-b"), 70, BUCKETS, |b| b != 0));
    let buying = tokio::spawn({
        let (gateway, id, users) = (stack.gateway_addr, id.clone(), wave1.clone());
        async move { crowd(gateway, &id, &users).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (status, view) = change_stock(&stack, &id, window, 500, None).await;
    assert_eq!(
        (status, view["stock"].as_i64()),
        (200, Some(500)),
        "raised while selling: {view}"
    );
    let mut outcomes = buying.await.unwrap();
    // Those answered before the raise reached their bucket buy again: the
    // items added are sold to them.
    for o in outcomes.iter_mut().filter(|o| !o.won()) {
        (o.status, o.body) = buy_until_won(stack.gateway_addr, &id, &o.attempt.user).await;
    }
    assert!(
        outcomes.iter().all(|o| o.won()),
        "350 buyers of 500 items all win: {:?}",
        outcomes.iter().find(|o| !o.won())
    );
    assert!(
        outcomes.len() > 300,
        "more winners than the stock before the raise"
    );
    let (orders, _, _) = stack.wait_orders(&id, 350, Duration::from_secs(30)).await;
    assert_eq!(orders, 350);

    // 150 of them pay; the sale's payment timeout drops to 1 s, so the 200
    // others are cancelled and their items go back to their home buckets
    // while wave 2 buys: 60 new buyers, and the 200 cancelled ones again
    // (a rebuy before the cancellation is refused by the limit), while an
    // operator lowers the stock to 480.
    let rows = stack.order_rows(&id).await;
    let order_of: HashMap<&str, &str> = rows
        .iter()
        .map(|r| (r.reservation_id.as_str(), r.order_id.as_str()))
        .collect();
    let mut paid = HashSet::new();
    for o in &outcomes[..150] {
        let order = order_of[o.reservation_id().unwrap()];
        let (status, body) = stack
            .backend_post(&format!("/internal/orders/{order}/pay"))
            .await;
        assert_eq!(status, 200, "pay {order}: {body}");
        paid.insert(order.to_owned());
    }
    let (status, view) = change_stock(&stack, &id, window, 500, Some(1)).await;
    assert_eq!(status, 200, "{view}");
    let mut wave2 = users_where(&format!("{id}-c"), 60, BUCKETS, |b| b == 0);
    wave2.extend(outcomes[150..].iter().map(|o| o.attempt.user.clone()));
    let buying = tokio::spawn({
        let (gateway, id, users) = (stack.gateway_addr, id.clone(), wave2.clone());
        async move { crowd(gateway, &id, &users).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // At least 500 - 350 - 60 - (items in transit) unsold items are left
    // whatever the timing: a rebuy needs its own item back first.
    let (status, view) = change_stock(&stack, &id, window, 480, None).await;
    assert_eq!(
        (status, view["stock"].as_i64()),
        (200, Some(480)),
        "lowered while selling: {view}"
    );
    let wave2_outcomes = buying.await.unwrap();
    for o in &wave2_outcomes {
        assert!(
            o.won() || (o.status == 409 && o.body["code"] == "limit_reached"),
            "{}: {} {}",
            o.attempt.user,
            o.status,
            o.body
        );
    }
    outcomes.extend(wave2_outcomes);
    let winners: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.won())
        .map(|o| o.reservation_id().unwrap())
        .collect();

    // Every unpaid order is cancelled in the end (1 s), and its item back:
    // the books settle with exactly the paid orders held.
    let mut conn = stack.redis_handle().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Settled = two reads in a row agree (the books read bucket by bucket,
    // so one read may straddle a return still in flight).
    let mut last_settled = None;
    let (rows, books) = loop {
        let rows = stack.order_rows(&id).await;
        let books = transfer::books(&mut conn, &id, BUCKETS).await.unwrap();
        let live = rows.iter().filter(|r| r.status != "cancelled").count();
        if rows.len() == winners.len()
            && live == paid.len()
            && books.reserved == live as i64
            && books.in_transit == 0
        {
            if last_settled.as_ref() == Some(&books) {
                break (rows, books);
            }
            last_settled = Some(books.clone());
        } else {
            last_settled = None;
        }
        assert!(
            Instant::now() < deadline,
            "never settled: {} rows of {} winners, {live} live, {books:?}",
            rows.len(),
            winners.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    selling.store(false, Ordering::Relaxed);
    assert!(
        sampler.await.unwrap() > 0,
        "the ledgers were sampled while selling"
    );

    // Winners − cancelled = live orders = the paid ones, one order per
    // winner, nobody above the limit.
    let by_rid: HashMap<&str, &flashgate_tests::OrderRow> = rows
        .iter()
        .map(|r| (r.reservation_id.as_str(), r))
        .collect();
    assert!(
        winners.iter().all(|rid| by_rid.contains_key(rid)),
        "a winner has no order"
    );
    let cancelled = rows.iter().filter(|r| r.status == "cancelled").count();
    let live: Vec<&flashgate_tests::OrderRow> =
        rows.iter().filter(|r| r.status != "cancelled").collect();
    assert_eq!(winners.len() - cancelled, live.len());
    assert!(
        live.iter().all(|r| paid.contains(&r.order_id)),
        "only paid orders are left live"
    );
    let mut per_user: HashMap<&str, usize> = HashMap::new();
    for r in &live {
        *per_user.entry(r.user_id.as_str()).or_default() += 1;
    }
    assert!(
        per_user.values().all(|n| *n == 1),
        "a user above the limit: {per_user:?}"
    );

    // The books: the final stock, exactly, over every bucket.
    const FINAL: i64 = 480;
    assert_eq!(books.total(), FINAL, "{books:?}");
    let remaining: i64 = books.remaining.iter().sum();
    assert_eq!(
        live.len() as i64,
        FINAL - remaining - books.in_transit,
        "{books:?}"
    );
    let (mut bases, mut sent) = (0, 0);
    for k in 0..BUCKETS {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
        bases += ledger.stock;
        sent += ledger.sent;
    }
    assert_eq!(bases, FINAL, "Σ bases = the stock saved");
    assert!(
        sent > 0,
        "bucket 0's crowd was served by items moved from the other buckets"
    );
    let (status, report) = stack
        .admin(
            reqwest::Method::POST,
            &format!("/admin/sales/{id}/reconcile"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        (
            report["drift"].as_i64(),
            report["bases_off"].as_i64(),
            report["live_orders"].as_i64()
        ),
        (Some(0), Some(0), Some(live.len() as i64)),
        "{report}"
    );
}

/// `buckets = 6` in a `[[sales]]` entry of the config file: the backend's
/// start preheats the sale in six buckets (standalone Redis is enough: the
/// buckets are key sets, whatever the deployment), and it sells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_declared_with_buckets_in_the_config_file_is_preheated_in_its_buckets_and_sells() {
    let sales = "[[sales]]\nid = \"filed\"\nname = \"Filed sale\"\nstock = 14\nper_user_limit = 1\nbuckets = 6\n";
    let stack = Stack::start(StackOptions {
        extra_toml: sales.into(),
        ..StackOptions::default()
    })
    .await;
    let view = stack.admin_sale("filed").await;
    assert_eq!(
        (view["buckets"].as_u64(), view["remaining"].as_i64()),
        (Some(6), Some(14)),
        "{view}"
    );
    let mut conn = stack.redis_handle().await;
    let books = transfer::books(&mut conn, "filed", 6).await.unwrap();
    assert_eq!(
        books.remaining,
        flashgate_common::buckets::split_stock(14, 6),
        "each bucket holds its share: {books:?}"
    );
    let user = users_where("filed-buyer", 1, 6, |b| b == 5).remove(0);
    let (status, body) = stack.buy("filed", &user, None).await;
    assert_eq!(status, 202, "{body}");
    let books = transfer::books(&mut conn, "filed", 6).await.unwrap();
    assert_eq!(
        (books.remaining[5], books.reserved, books.total()),
        (1, 1, 14),
        "the buyer's home bucket sold it: {books:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_buy_of_a_bucketed_sale_confirmed_dry_costs_the_confirmation_not_the_transfers_and_keeps_its_answer(
) {
    const BUCKETS: u32 = 4;
    let stack = Stack::start(StackOptions::default()).await;
    let id = sale_id("dry");
    stack.open_bucketed_sale(&id, 4, 1, BUCKETS).await;
    let sellout = buy_all(
        stack.gateway_addr,
        &id,
        (0..40)
            .map(|i| Attempt::by(&format!("{id}-u{i}")))
            .collect(),
        8,
    )
    .await;
    assert_eq!(sellout.iter().filter(|o| o.won()).count(), 4);
    // Until this gateway has confirmed every bucket dry (its flag).
    let deadline = Instant::now() + Duration::from_secs(10);
    let scripts = || async { stack.redis.command_calls("evalsha").await };
    loop {
        let before = scripts().await;
        let (status, _) = flashgate_tests::buy(
            &stack.http,
            stack.gateway_addr,
            &id,
            &flashgate_tests::token("late"),
            None,
        )
        .await;
        if status == 410 && scripts().await == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sale was never flagged sold out"
        );
    }
    let monitor = stack.redis.monitor().await;
    let (status, v) = flashgate_tests::buy(
        &stack.http,
        stack.gateway_addr,
        &id,
        &flashgate_tests::token("keyed"),
        Some("k"),
    )
    .await;
    assert_eq!((status, v["code"].as_str()), (410, Some("sold_out")), "{v}");
    // No transfer's take (the backend's timers may send other calls meanwhile).
    let take = flashgate_common::scripts::XFER_OUT.get_hash().to_owned();
    let takes: Vec<String> = monitor
        .commands()
        .await
        .into_iter()
        .filter(|c| c.contains(&take))
        .collect();
    assert!(
        takes.is_empty(),
        "a transfer was tried for a sale confirmed dry: {takes:#?}"
    );
    // Remembered under the key: a restock does not change its answer.
    let keys = SaleKeys::bucket(&id, home_bucket("keyed", BUCKETS));
    let remembered: bool = redis::cmd("HEXISTS")
        .arg(keys.idempotency_misses("keyed"))
        .arg("k")
        .query_async(&mut stack.redis.conn().await)
        .await
        .unwrap();
    assert!(
        remembered,
        "the key's sold out is not remembered in its home bucket"
    );
}
