//! A sale's Redis fails over, or its slot moves to another master, in the
//! middle of a burst of buyers; afterwards the books must still be exact.
//!
//! Each buyer sends one buy with its own Idempotency-Key and, like a real
//! client, sends the same key again on `503` or on a lost connection, a
//! bounded number of times. Mid-burst the master holding the sale is
//! `kill -9`'d (a Redis Cluster master, whose replica the cluster promotes;
//! a Sentinel primary, whose replica the Sentinels promote), or the sale's
//! slot is moved to another master. Once the sale answers buys without
//! `503` again and the backend has written every order, the books are
//! checked against what the failover fence (`backend/src/fence.rs`)
//! promises:
//!
//! - no oversell: live orders in the database `<= stock`, `remaining >= 0`;
//! - no user above the per-user limit, in the database and in Redis's
//!   `buyers`;
//! - every live order is counted in Redis (its reservation id is in the
//!   sale's `resv`), and Redis balances as `backend/src/reconcile.rs`
//!   defines it: `stock - remaining = live orders + reservations without
//!   an order yet + cancelled orders whose item is not back`;
//! - a winner's order, when there is one, is its own;
//! - every `503` carries `Retry-After`.
//!
//! `lost_winners` counts buyers told `201`/`202` whose reservation is
//! neither in Redis nor an order: replication is asynchronous, so with
//! `redis.wait_replicas = 0` a failover may lose the last wins; it is
//! reported, and asserted to be 0 where nothing may be lost (a slot
//! migration, or a failover with `wait_replicas >= 1`; see
//! [`sale_survives_a_failover`]).
//!
//! Each test prints one report line (`failover=<case> sent=.. winners=..
//! orders=.. lost_winners=.. refused_503=.. remaining=..`). Every wait has
//! a deadline; every process is stopped by PID when the stack drops. The
//! tests of this binary run one at a time (`.config/nextest.toml`): a
//! cluster decides a node is down by timing, which a starved machine must
//! not trigger.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashgate_common::keys::SaleKeys;
use flashgate_tests::{
    token, Deployment, OrderRow, Proc, RedisMode, SaleInRedis, Stack, StackOptions,
};
use serde_json::Value;

const STOCK: i64 = 200;
const PER_USER_LIMIT: i64 = 1;
/// Users who try twice, with two keys at once: the limit refuses one.
const TWICE: usize = 300;
/// Users who try once.
const ONCE: usize = 700;
const CONCURRENCY: usize = 32;
/// Tries of one Idempotency-Key, and how long a buyer keeps trying it.
const TRIES: usize = 100;
const KEEP_TRYING: Duration = Duration::from_secs(20);
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long the cluster or the Sentinels may take to promote a replica.
const FAILOVER: Duration = Duration::from_secs(30);
/// How long the sale may answer `503` after the fault, and the backend
/// take to write every order, once the burst is over.
const SETTLE: Duration = Duration::from_secs(30);

/// One buyer: a user and the Idempotency-Key it keeps for its buy.
#[derive(Clone, Debug)]
struct Buyer {
    user: String,
    key: String,
}

/// What one buyer got, over all its tries.
#[derive(Clone, Debug)]
struct Bought {
    buyer: Buyer,
    /// The last answer (0: no answer, the connection failed).
    status: u16,
    reservation_id: Option<String>,
    /// Requests sent, retries included.
    sent: usize,
    /// Answers `503` among them.
    refused_503: usize,
    /// Answers `503` without `Retry-After`.
    refused_without_retry_after: usize,
    /// Every status seen.
    statuses: Vec<u16>,
}

impl Bought {
    fn won(&self) -> bool {
        self.status == 201 || self.status == 202
    }
}

/// `TWICE` users with two keys each (sent next to each other), then
/// `ONCE` users with one.
fn buyers(sale: &str) -> Vec<Buyer> {
    let twice = (0..2 * TWICE).map(|i| Buyer {
        user: format!("{sale}-u{}", i / 2),
        key: format!("k{i}"),
    });
    let once = (0..ONCE).map(|i| Buyer {
        user: format!("{sale}-u{}", TWICE + i),
        key: format!("k{}", 2 * TWICE + i),
    });
    twice.chain(once).collect()
}

/// One `POST .../buy` with the buyer's key: status (0 when no answer came),
/// whether `Retry-After` came with it, and the JSON body.
async fn send(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    buyer: &Buyer,
) -> (u16, bool, Value) {
    let req = http
        .post(format!("http://{gateway}/flashgate/api/sales/{sale}/buy"))
        .bearer_auth(token(&buyer.user))
        .header("Idempotency-Key", &buyer.key)
        .timeout(Duration::from_secs(10));
    match req.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key("retry-after");
            (
                status,
                retry_after,
                resp.json().await.unwrap_or(Value::Null),
            )
        }
        Err(_) => (0, false, Value::Null),
    }
}

/// What a burst shares with the test driving it.
#[derive(Default)]
struct Progress {
    /// Buyers who won so far.
    winners: AtomicUsize,
    /// Every request is sent under a read lock: the test takes the write
    /// lock to hold the buyers (and wait out the requests in flight).
    gate: tokio::sync::RwLock<()>,
}

/// Buys with one key until an answer other than `503` or no answer, or
/// [`TRIES`] / [`KEEP_TRYING`] run out; counts a win in `progress`.
async fn buy_until_answered(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    buyer: Buyer,
    progress: &Progress,
) -> Bought {
    let started = Instant::now();
    let mut got = Bought {
        buyer,
        status: 0,
        reservation_id: None,
        sent: 0,
        refused_503: 0,
        refused_without_retry_after: 0,
        statuses: Vec::new(),
    };
    loop {
        let (status, retry_after, body) = {
            let _open = progress.gate.read().await;
            send(http, gateway, sale, &got.buyer).await
        };
        got.sent += 1;
        got.status = status;
        got.statuses.push(status);
        if status == 503 {
            got.refused_503 += 1;
            got.refused_without_retry_after += usize::from(!retry_after);
        }
        if status == 201 || status == 202 {
            got.reservation_id = body["reservation_id"].as_str().map(str::to_owned);
            progress.winners.fetch_add(1, Ordering::Relaxed);
        }
        if (status != 503 && status != 0) || got.sent >= TRIES || started.elapsed() >= KEEP_TRYING {
            return got;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Runs every buyer, [`CONCURRENCY`] at a time, in the background; buyer
/// `i` buys (and retries) through `gateways[i % len]`. `winners` counts
/// the wins as they come, and holds the buyers when asked.
fn burst(
    gateways: &[SocketAddr],
    sale: &str,
    buyers: Vec<Buyer>,
    progress: Arc<Progress>,
) -> tokio::task::JoinHandle<Vec<Bought>> {
    let (sale, gateways) = (sale.to_owned(), gateways.to_vec());
    tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(CONCURRENCY)
            .build()
            .unwrap();
        let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let tasks: Vec<_> = buyers
            .into_iter()
            .enumerate()
            .map(|(i, buyer)| {
                let (http, sem, sale, progress) =
                    (http.clone(), sem.clone(), sale.clone(), progress.clone());
                let gateway = gateways[i % gateways.len()];
                tokio::spawn(async move {
                    let _permit = sem.acquire_owned().await.unwrap();
                    buy_until_answered(&http, gateway, &sale, buyer, &progress).await
                })
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
}

/// Waits until `n` buyers have won, so a fault lands mid-burst.
async fn wait_winners(winners: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while winners.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} winners before the fault",
            winners.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends buys of new users through each gateway until one is answered
/// with neither `503` nor silence (the sale sells, or refuses as sold out,
/// again there); returns them all, for the books.
async fn wait_selling(http: &reqwest::Client, gateways: &[SocketAddr], sale: &str) -> Vec<Bought> {
    let deadline = Instant::now() + SETTLE;
    let mut probes = Vec::new();
    for &gateway in gateways {
        loop {
            let probe = Buyer {
                user: format!("{sale}-probe{}", probes.len()),
                key: "probe".to_owned(),
            };
            let (status, retry_after, body) = send(http, gateway, sale, &probe).await;
            let won = status == 201 || status == 202;
            probes.push(Bought {
                buyer: probe,
                status,
                reservation_id: if won {
                    body["reservation_id"].as_str().map(str::to_owned)
                } else {
                    None
                },
                sent: 1,
                refused_503: usize::from(status == 503),
                refused_without_retry_after: usize::from(status == 503 && !retry_after),
                statuses: vec![status],
            });
            if status != 503 && status != 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{gateway} still answers {status} {SETTLE:?} after the burst: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    probes
}

/// The books once the backend has written an order for every reservation
/// Redis holds and Redis counts every live order (or [`SETTLE`] passed:
/// the checks then say what is missing).
async fn settled_books(stack: &Stack, sale: &str) -> (Vec<OrderRow>, SaleInRedis) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let rows = stack.order_rows(sale).await;
        let redis = stack.sale_in_redis(sale).await;
        let with_order: HashSet<&str> = rows.iter().map(|r| r.reservation_id.as_str()).collect();
        let pending = redis
            .reservations
            .keys()
            .filter(|rid| !with_order.contains(rid.as_str()) && !redis.released.contains(*rid))
            .count();
        let uncounted = rows
            .iter()
            .filter(|r| {
                r.status != "cancelled" && !redis.reservations.contains_key(&r.reservation_id)
            })
            .count();
        if (pending == 0 && uncounted == 0) || Instant::now() > deadline {
            return (rows, redis);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the checks found, for the report line.
struct Books {
    winners: usize,
    orders: usize,
    lost_winners: usize,
    remaining: i64,
}

/// Checks every invariant of the module doc on `sale`; `case` names the
/// test in messages. Returns the figures of the report line.
fn check_books(case: &str, bought: &[Bought], rows: &[OrderRow], redis: &SaleInRedis) -> Books {
    let live: Vec<&OrderRow> = rows.iter().filter(|r| r.status != "cancelled").collect();
    assert!(
        live.len() as i64 <= STOCK,
        "{case}: oversold: {} live orders for {STOCK} items",
        live.len()
    );
    assert!(
        redis.remaining >= 0,
        "{case}: remaining {} (or the sale is gone from Redis)",
        redis.remaining
    );

    let mut per_rid: HashMap<&str, usize> = HashMap::new();
    let mut per_user: HashMap<&str, i64> = HashMap::new();
    for r in rows {
        *per_rid.entry(&r.reservation_id).or_default() += 1;
    }
    for r in &live {
        *per_user.entry(&r.user_id).or_default() += 1;
    }
    assert!(
        per_rid.values().all(|&n| n == 1),
        "{case}: two orders for one reservation"
    );
    let over: Vec<_> = per_user
        .iter()
        .filter(|(_, &n)| n > PER_USER_LIMIT)
        .collect();
    assert!(
        over.is_empty(),
        "{case}: users above the per-user limit {PER_USER_LIMIT} in the database: {over:?}"
    );
    let over: Vec<_> = redis
        .buyers
        .iter()
        .filter(|(_, &n)| n > PER_USER_LIMIT)
        .collect();
    assert!(
        over.is_empty(),
        "{case}: users above the per-user limit {PER_USER_LIMIT} in Redis's buyers: {over:?}"
    );

    // Every live order counted in Redis, and Redis's count balanced as
    // backend/src/reconcile.rs defines it.
    let uncounted: Vec<&str> = live
        .iter()
        .filter(|r| !redis.reservations.contains_key(&r.reservation_id))
        .map(|r| r.reservation_id.as_str())
        .collect();
    assert!(
        uncounted.is_empty(),
        "{case}: {} live orders Redis does not count (sellable again): {uncounted:?}",
        uncounted.len()
    );
    let with_order: HashSet<&str> = rows.iter().map(|r| r.reservation_id.as_str()).collect();
    let pending = redis
        .reservations
        .keys()
        .filter(|rid| !with_order.contains(rid.as_str()) && !redis.released.contains(*rid))
        .count();
    let returning = rows
        .iter()
        .filter(|r| {
            r.status == "cancelled"
                && redis.reservations.contains_key(&r.reservation_id)
                && !redis.released.contains(&r.reservation_id)
        })
        .count();
    let counted = (live.len() - uncounted.len() + pending + returning) as i64;
    assert_eq!(
        STOCK - redis.remaining,
        counted,
        "{case}: stock {STOCK} - remaining {} != live orders {} + reservations without an order {pending} + returning {returning}",
        redis.remaining,
        live.len() - uncounted.len(),
    );

    // A winner's order is its own; a winner with neither order nor
    // reservation was lost with the failover.
    let winners: Vec<&Bought> = bought.iter().filter(|b| b.won()).collect();
    let owner: HashMap<&str, &str> = rows
        .iter()
        .map(|r| (r.reservation_id.as_str(), r.user_id.as_str()))
        .collect();
    let mut lost_winners = 0;
    for w in &winners {
        let rid = w
            .reservation_id
            .as_deref()
            .unwrap_or_else(|| panic!("{case}: a win without a reservation id: {w:?}"));
        match owner.get(rid) {
            Some(user) => assert_eq!(
                *user, w.buyer.user,
                "{case}: winner {} holds another user's order",
                w.buyer.user
            ),
            None if redis.reservations.contains_key(rid) => {
                panic!(
                    "{case}: winner {} has a reservation in Redis and no order after settling",
                    w.buyer.user
                )
            }
            None => lost_winners += 1,
        }
    }

    let unexpected: Vec<u16> = bought
        .iter()
        .flat_map(|b| &b.statuses)
        .copied()
        .filter(|s| ![0, 201, 202, 409, 410, 503].contains(s))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{case}: unexpected statuses {unexpected:?}"
    );
    let without: usize = bought.iter().map(|b| b.refused_without_retry_after).sum();
    assert_eq!(
        without, 0,
        "{case}: {without} answers 503 without Retry-After"
    );
    Books {
        winners: winners.len(),
        orders: live.len(),
        lost_winners,
        remaining: redis.remaining,
    }
}

/// Prints the report line of a case; `extra` ends it (` key=value`...).
fn report(case: &str, bought: &[Bought], books: &Books, extra: &str) {
    let sent: usize = bought.iter().map(|b| b.sent).sum();
    let refused: usize = bought.iter().map(|b| b.refused_503).sum();
    println!(
        "failover={case} sent={sent} winners={} orders={} lost_winners={} refused_503={refused} remaining={}{extra}",
        books.winners, books.orders, books.lost_winners, books.remaining
    );
}

/// The processes of a case: the stack (gateway and backend), and a second
/// backend with a second gateway forwarding to it, as in production.
struct Deployed {
    stack: Stack,
    /// The second backend and gateway, stopped by PID on drop.
    _second: (Proc, Proc),
    gateways: [SocketAddr; 2],
}

/// The processes for a case on `mode`, with `redis.wait_replicas` when given.
async fn deploy(mode: RedisMode, wait_replicas: Option<u32>) -> Deployed {
    let stack = Stack::start(StackOptions {
        redis_mode: mode,
        redis_timeout_ms: 500,
        redis_extra: wait_replicas
            .map(|n| format!("wait_replicas = {n}"))
            .unwrap_or_default(),
        ..StackOptions::default()
    })
    .await;
    let (backend2, backend2_addr) = stack.start_second_backend();
    let (gateway2, gateway2_addr) = stack.start_gateway_via(backend2_addr);
    let gateways = [stack.gateway_addr, gateway2_addr];
    Deployed {
        stack,
        _second: (backend2, gateway2),
        gateways,
    }
}

/// How the sale's master dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// `kill -9` mid-burst: the replica lacks at most the wins of the last
    /// milliseconds (usually none).
    Kill,
    /// The replica frozen (`SIGSTOP`) and its link to the master cut
    /// (`CLIENT KILL TYPE replica`) while [`WON_WHILE_FROZEN`] more buyers
    /// win (for at most 2 s); the buyers held until those wins are orders
    /// (at most 10 s); then the master `kill -9`'d and the replica resumed:
    /// the promoted replica surely lacks wins the database has orders for.
    KillWithReplicaBehind,
}

/// Wins the master takes while its replica is frozen.
const WON_WHILE_FROZEN: usize = 20;

/// A plain connection to one Redis.
async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Kills the master of `sale` as `fault` says; returns the killed master's port.
async fn kill_sale_master(stack: &mut Stack, sale: &str, fault: Fault, progress: &Progress) -> u16 {
    let (meta, winners) = (SaleKeys::new(sale).meta, &progress.winners);
    let (master, replica) = match &stack.deployment {
        Deployment::Cluster(cluster) => {
            let master = cluster.master_for_key(&meta).await;
            (master, cluster.replica_of(master).await)
        }
        Deployment::Sentinel(set) => (set.master_addr().await.port(), set.replica().await),
        Deployment::Standalone => unreachable!("a failover needs a cluster or sentinels"),
    };
    let signal = |stack: &Stack, sig: &str| match &stack.deployment {
        Deployment::Cluster(cluster) => cluster.signal(replica, sig),
        Deployment::Sentinel(set) => set.signal(replica, sig),
        Deployment::Standalone => unreachable!("a failover needs a cluster or sentinels"),
    };
    if fault == Fault::KillWithReplicaBehind {
        // Frozen, the replica could still read later what the master had
        // sent it: its socket buffers it. Cut, the link carries nothing more.
        signal(stack, "STOP");
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut node(master).await)
            .await
            .unwrap();
        assert_eq!(killed, 1, "the master's link to its replica");
        // Bounded by time too: with `redis.wait_replicas` no win completes
        // while the replica is frozen.
        let (target, until) = (
            winners.load(Ordering::Relaxed) + WON_WHILE_FROZEN,
            Instant::now() + Duration::from_secs(2),
        );
        while winners.load(Ordering::Relaxed) < target && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // Buyers held, and every win so far written as an order, so the
    // promoted replica surely lacks orders the database has: the fence
    // must count them before the sale sells again. A plain kill lands on
    // the requests in flight instead.
    let mut hold = None;
    if fault == Fault::KillWithReplicaBehind {
        hold = Some(progress.gate.write().await);
        let (won, until) = (
            winners.load(Ordering::Relaxed),
            Instant::now() + Duration::from_secs(10),
        );
        while stack.order_rows(sale).await.len() < won && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    match &mut stack.deployment {
        Deployment::Cluster(cluster) => cluster.kill(master),
        Deployment::Sentinel(set) => assert_eq!(
            set.kill_primary().await,
            master,
            "the primary changed before the kill"
        ),
        Deployment::Standalone => unreachable!("a failover needs a cluster or sentinels"),
    }
    if fault == Fault::KillWithReplicaBehind {
        signal(stack, "CONT");
    }
    drop(hold);
    master
}

/// A replica for the promoted master `promoted`: in a cluster, the replica
/// of another master moved over (`CLUSTER REPLICATE`); with Sentinel, a new
/// redis-server (returned, to be stopped with the test).
async fn give_a_replica(stack: &Stack, promoted: u16) -> Option<flashgate_tests::RedisServer> {
    match &stack.deployment {
        Deployment::Cluster(cluster) => {
            let other = cluster
                .masters()
                .await
                .into_iter()
                .find(|m| *m != promoted)
                .expect("another master");
            let replica = cluster.replica_of(other).await;
            let id: String = redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async(&mut node(promoted).await)
                .await
                .unwrap();
            let () = redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(id)
                .query_async(&mut node(replica).await)
                .await
                .unwrap();
            None
        }
        Deployment::Sentinel(_) => Some(
            tokio::task::spawn_blocking(move || flashgate_tests::RedisServer::replica_of(promoted))
                .await
                .unwrap(),
        ),
        Deployment::Standalone => unreachable!("a failover needs a cluster or sentinels"),
    }
}

/// `line` without its ANSI colour sequences (`ESC [ ... m`).
fn uncoloured(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// Orders the backends' re-syncs of `sale` counted again in Redis after
/// the failover (their `sale re-synced ... adopted=N` log lines), for the
/// report: how many wins the promoted Redis lacked and the fence made good.
fn adopted_by_resync(stack: &Stack, sale: &str) -> usize {
    ["flashgate-backend", "flashgate-backend-2"]
        .iter()
        .flat_map(|name| stack.log(name).lines().map(uncoloured).collect::<Vec<_>>())
        .filter(|l| l.contains("re-synced") && l.contains(sale))
        .filter_map(|l| {
            l.split_once("adopted=")?
                .1
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

/// The whole failover case: a burst of buyers on a sale, the sale's master
/// killed (as `fault` says) once a quarter of the stock is sold, its
/// replica promoted, the burst finished, the sale selling again, the books
/// checked. `wait_replicas` is written as `redis.wait_replicas` when
/// given: with 1 or more, a winner is told `202` only once a replica has
/// its win, so no winner may be lost (asserted); without, lost winners are
/// only reported.
async fn sale_survives_a_failover(
    case: &str,
    mode: RedisMode,
    fault: Fault,
    wait_replicas: Option<u32>,
) {
    let Deployed {
        mut stack,
        gateways,
        _second,
    } = deploy(mode, wait_replicas).await;
    let sale = case.replace('_', "-");
    let meta = SaleKeys::new(&sale).meta;
    stack.open_sale(&sale, STOCK, PER_USER_LIMIT).await;

    let progress = Arc::new(Progress::default());
    let load = burst(&gateways, &sale, buyers(&sale), progress.clone());
    wait_winners(&progress.winners, STOCK as usize / 4).await;
    let killed = kill_sale_master(&mut stack, &sale, fault, &progress).await;
    let won_at_kill = progress.winners.load(Ordering::Relaxed);
    let promoted = match &stack.deployment {
        Deployment::Cluster(cluster) => cluster.wait_failover(&meta, FAILOVER).await,
        Deployment::Sentinel(set) => set.wait_failover(FAILOVER).await.port(),
        Deployment::Standalone => unreachable!("a failover needs a cluster or sentinels"),
    };
    assert_ne!(
        killed, promoted,
        "{case}: the killed master still serves the sale"
    );
    // With replica waits, the promoted master needs a replica of its own
    // before any win can be confirmed again, as an operator would give it.
    let _new_replica = if wait_replicas.is_some() {
        Some(give_a_replica(&stack, promoted).await)
    } else {
        None
    };
    let mut bought = load.await.unwrap();
    bought.extend(wait_selling(&stack.http, &gateways, &sale).await);

    let (rows, redis) = settled_books(&stack, &sale).await;
    let books = check_books(case, &bought, &rows, &redis);
    let adopted = adopted_by_resync(&stack, &sale);
    report(
        case,
        &bought,
        &books,
        &format!(" won_at_kill={won_at_kill} adopted_by_resync={adopted}"),
    );
    if wait_replicas.is_some_and(|n| n >= 1) {
        assert_eq!(
            books.lost_winners, 0,
            "{case}: winners told 202 lost with the failover despite redis.wait_replicas"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_master_killed_with_its_replica_behind_neither_oversells_nor_forgets_an_order() {
    sale_survives_a_failover(
        "cluster_master_kill9_replica_behind",
        RedisMode::Cluster,
        Fault::KillWithReplicaBehind,
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_primary_killed_with_its_replica_behind_neither_oversells_nor_forgets_an_order() {
    sale_survives_a_failover(
        "sentinel_primary_kill9_replica_behind",
        RedisMode::Sentinel,
        Fault::KillWithReplicaBehind,
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_replicas_a_cluster_failover_loses_no_win_a_buyer_was_told() {
    sale_survives_a_failover(
        "cluster_master_kill9_replica_behind_wait1",
        RedisMode::Cluster,
        Fault::KillWithReplicaBehind,
        Some(1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_replicas_a_sentinel_failover_loses_no_win_a_buyer_was_told() {
    sale_survives_a_failover(
        "sentinel_primary_kill9_replica_behind_wait1",
        RedisMode::Sentinel,
        Fault::KillWithReplicaBehind,
        Some(1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_master_killed_mid_sale_neither_oversells_nor_forgets_an_order() {
    sale_survives_a_failover(
        "cluster_master_kill9",
        RedisMode::Cluster,
        Fault::Kill,
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_primary_killed_mid_sale_neither_oversells_nor_forgets_an_order() {
    sale_survives_a_failover(
        "sentinel_primary_kill9",
        RedisMode::Sentinel,
        Fault::Kill,
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_sale_moved_to_another_master_under_load_loses_nothing_and_answers_only_sale_statuses(
) {
    let case = "cluster_slot_migration";
    let Deployed {
        stack,
        gateways,
        _second,
    } = deploy(RedisMode::Cluster, None).await;
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let sale = case.replace('_', "-");
    let meta = SaleKeys::new(&sale).meta;
    stack.open_sale(&sale, STOCK, PER_USER_LIMIT).await;
    let slot = cluster.slot_of(&meta).await;
    let from = cluster.master_for_slot(slot).await;
    let to = cluster
        .masters()
        .await
        .into_iter()
        .find(|&p| p != from)
        .expect("another master");

    let progress = Arc::new(Progress::default());
    let load = burst(&gateways, &sale, buyers(&sale), progress.clone());
    wait_winners(&progress.winners, STOCK as usize / 10).await;
    // A few keys at a time, as `redis-cli --cluster reshard` moves them,
    // while the buyers keep coming.
    let migration = cluster.begin_migration(slot, to).await;
    while migration.move_keys(5).await > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    migration.finish().await;
    assert_eq!(
        cluster.master_for_slot(slot).await,
        to,
        "{case}: the slot did not move"
    );
    let mut bought = load.await.unwrap();
    bought.extend(wait_selling(&stack.http, &gateways, &sale).await);

    let (rows, redis) = settled_books(&stack, &sale).await;
    let silent = bought.iter().filter(|b| b.statuses.contains(&0)).count();
    assert_eq!(
        silent, 0,
        "{case}: {silent} buyers got no answer (connection failed) during the migration"
    );
    let books = check_books(case, &bought, &rows, &redis);
    report(case, &bought, &books, "");
    assert_eq!(
        books.lost_winners, 0,
        "{case}: a slot migration lost winners"
    );
}
