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

/// Buys as `user` until it wins (bounded): a `sold_out` or a 503 answered
/// before a raise reached the gateway is tried again.
async fn buy_until_won(gateway: std::net::SocketAddr, sale: &str, user: &str) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = buy_all(gateway, sale, vec![Attempt::by(user)], 1).await.remove(0);
        if o.won() || Instant::now() > deadline {
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
                let mut read_all = true;
                for k in 0..BUCKETS {
                    // A transient Redis error (a slot moving, a timeout)
                    // skips this sample; the books are checked exactly
                    // after the burst.
                    let Ok(ledger) = transfer::ledger(&mut conn, &id, k).await else {
                        read_all = false;
                        break;
                    };
                    assert!(ledger.balances(), "bucket {k} out of balance while selling: {ledger:?}");
                    remaining += ledger.remaining;
                    reserved += ledger.reserved;
                    in_transit += ledger.sent - ledger.received;
                }
                if read_all {
                    assert_eq!(remaining + reserved + in_transit, STOCK, "the sale's books while selling");
                    samples += 1;
                }
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

/// `PUT /admin/sales/{id}` of an open bucketed sale with `stock`
/// (and a payment timeout when given); status and body.
async fn change_stock(stack: &Stack, id: &str, window: (i64, i64), stock: i64, payment_timeout: Option<i64>) -> (u16, serde_json::Value) {
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
    stack.admin(reqwest::Method::PUT, &format!("/admin/sales/{id}"), Some(body)).await
}

/// The crowd of `users` on the stack's gateway, a 503 retried until decided.
async fn crowd(gateway: std::net::SocketAddr, id: &str, users: &[String]) -> Vec<flashgate_tests::Outcome> {
    let mut outcomes = buy_all(gateway, id, users.iter().map(|u| Attempt::by(u)).collect(), 16).await;
    for o in outcomes.iter_mut().filter(|o| o.status == 503) {
        let (status, body) = buy_until_decided(gateway, id, &o.attempt.user).await;
        (o.status, o.body) = (status, body);
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucketed_sale_keeps_exact_books_through_stock_changes_and_payment_timeouts_while_selling() {
    const BUCKETS: u32 = 4;
    let stack = Stack::start(StackOptions { extra_toml: "expiry_poll_ms = 100\n".into(), ..cluster_stack() }).await;
    let id = sale_id("chg");
    let now = flashgate_common::now_ms();
    let window = (now - 1000, now + 3_600_000);
    let (status, view) = change_stock(&stack, &id, window, 300, Some(900)).await;
    assert_eq!((status, view["remaining"].as_i64()), (201, Some(300)), "{view}");

    // Every bucket's own books balance at every instant, whatever buys,
    // transfers, stock changes and returns do to it.
    let selling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (selling, id) = (selling.clone(), id.clone());
        let mut conn = stack.redis_handle().await;
        tokio::spawn(async move {
            let mut samples = 0;
            while selling.load(Ordering::Relaxed) {
                let mut read_all = true;
                for k in 0..BUCKETS {
                    // A transient Redis error skips this sample (the
                    // books are checked again at the end).
                    let Ok(ledger) = transfer::ledger(&mut conn, &id, k).await else {
                        read_all = false;
                        break;
                    };
                    assert!(ledger.balances(), "bucket {k} out of balance while selling: {ledger:?}");
                }
                samples += u32::from(read_all);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            samples
        })
    };

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
    assert_eq!((status, view["stock"].as_i64()), (200, Some(500)), "raised while selling: {view}");
    let mut outcomes = buying.await.unwrap();
    // Those answered before the raise reached their bucket buy again: the
    // items added are sold to them.
    for o in outcomes.iter_mut().filter(|o| !o.won()) {
        (o.status, o.body) = buy_until_won(stack.gateway_addr, &id, &o.attempt.user).await;
    }
    assert!(outcomes.iter().all(|o| o.won()), "350 buyers of 500 items all win: {:?}", outcomes.iter().find(|o| !o.won()));
    assert!(outcomes.len() > 300, "more winners than the stock before the raise");
    let (orders, _, _) = stack.wait_orders(&id, 350, Duration::from_secs(30)).await;
    assert_eq!(orders, 350);

    // 150 of them pay; the sale's payment timeout drops to 1 s, so the 200
    // others are cancelled and their items go back to their home buckets
    // while wave 2 buys: 60 new buyers, and the 200 cancelled ones again
    // (a rebuy before the cancellation is refused by the limit), while an
    // operator lowers the stock to 480.
    let rows = stack.order_rows(&id).await;
    let order_of: HashMap<&str, &str> = rows.iter().map(|r| (r.reservation_id.as_str(), r.order_id.as_str())).collect();
    let mut paid = HashSet::new();
    for o in &outcomes[..150] {
        let order = order_of[o.reservation_id().unwrap()];
        let (status, body) = stack.backend_post(&format!("/internal/orders/{order}/pay")).await;
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
    assert_eq!((status, view["stock"].as_i64()), (200, Some(480)), "lowered while selling: {view}");
    let wave2_outcomes = buying.await.unwrap();
    for o in &wave2_outcomes {
        assert!(o.won() || (o.status == 409 && o.body["code"] == "limit_reached"), "{}: {} {}", o.attempt.user, o.status, o.body);
    }
    outcomes.extend(wave2_outcomes);
    let winners: Vec<&str> = outcomes.iter().filter(|o| o.won()).map(|o| o.reservation_id().unwrap()).collect();

    // Every unpaid order is cancelled in the end (1 s), and its item back:
    // the books settle with exactly the paid orders held.
    let mut conn = stack.redis_handle().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (rows, books) = loop {
        let rows = stack.order_rows(&id).await;
        let books = transfer::books(&mut conn, &id, BUCKETS).await.unwrap();
        let live = rows.iter().filter(|r| r.status != "cancelled").count();
        if rows.len() == winners.len() && live == paid.len() && books.reserved == live as i64 && books.in_transit == 0 {
            break (rows, books);
        }
        assert!(Instant::now() < deadline, "never settled: {} rows of {} winners, {live} live, {books:?}", rows.len(), winners.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    selling.store(false, Ordering::Relaxed);
    assert!(sampler.await.unwrap() > 0, "the ledgers were sampled while selling");

    // Winners − cancelled = live orders = the paid ones, one order per
    // winner, nobody above the limit.
    let by_rid: HashMap<&str, &flashgate_tests::OrderRow> = rows.iter().map(|r| (r.reservation_id.as_str(), r)).collect();
    assert!(winners.iter().all(|rid| by_rid.contains_key(rid)), "a winner has no order");
    let cancelled = rows.iter().filter(|r| r.status == "cancelled").count();
    let live: Vec<&flashgate_tests::OrderRow> = rows.iter().filter(|r| r.status != "cancelled").collect();
    assert_eq!(winners.len() - cancelled, live.len());
    assert!(live.iter().all(|r| paid.contains(&r.order_id)), "only paid orders are left live");
    let mut per_user: HashMap<&str, usize> = HashMap::new();
    for r in &live {
        *per_user.entry(r.user_id.as_str()).or_default() += 1;
    }
    assert!(per_user.values().all(|n| *n == 1), "a user above the limit: {per_user:?}");

    // The books: the final stock, exactly, over every bucket.
    const FINAL: i64 = 480;
    assert_eq!(books.total(), FINAL, "{books:?}");
    let remaining: i64 = books.remaining.iter().sum();
    assert_eq!(live.len() as i64, FINAL - remaining - books.in_transit, "{books:?}");
    let (mut bases, mut sent) = (0, 0);
    for k in 0..BUCKETS {
        let ledger = transfer::ledger(&mut conn, &id, k).await.unwrap();
        assert!(ledger.balances(), "bucket {k}: {ledger:?}");
        bases += ledger.stock;
        sent += ledger.sent;
    }
    assert_eq!(bases, FINAL, "Σ bases = the stock saved");
    assert!(sent > 0, "bucket 0's crowd was served by items moved from the other buckets");
    let (status, report) = stack.admin(reqwest::Method::POST, &format!("/admin/sales/{id}/reconcile"), None).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        (report["drift"].as_i64(), report["bases_off"].as_i64(), report["live_orders"].as_i64()),
        (Some(0), Some(0), Some(live.len() as i64)),
        "{report}"
    );
}
