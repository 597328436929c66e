//! The stack on a Redis Cluster and on a Sentinel-managed primary
//! (`redis.mode = "cluster" | "sentinel"`), with real processes on loopback,
//! and `flashgate check --connect` against both.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use flashgate_tests::{
    bin, buy_all, get_json, random_user, redis_toml, token, wait_subscribers, Attempt, Deployment,
    RedisCluster, RedisMode, RedisSentinels, Stack, StackOptions, TempDir,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sales_on_three_masters_sell_exactly_through_two_gateways_and_two_backends() {
    let opts = StackOptions {
        redis_mode: RedisMode::Cluster,
        redis_timeout_ms: 3000,
        ..StackOptions::default()
    };
    let stack = Stack::start(opts).await;
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    let (_backend2, backend2_addr) = stack.start_second_backend();
    let (_gateway2, gateway2_addr) = stack.start_gateway_via(backend2_addr);
    let gateways = [stack.gateway_addr, gateway2_addr];
    wait_subscribers(cluster, 2).await;

    const STOCK: i64 = 300;
    const ATTEMPTS_PER_SALE: usize = 10_000;
    const USERS_PER_SALE: usize = 7_000;
    let sales = cluster.tags_on_distinct_masters(3).await;
    let masters: HashSet<u16> = {
        let mut m = HashSet::new();
        for id in &sales {
            m.insert(
                cluster
                    .master_for_key(&format!("fg:{{sale:{id}}}:meta"))
                    .await,
            );
        }
        m
    };
    assert_eq!(masters.len(), 3, "the sales' tags land on three masters");
    for id in &sales {
        stack.open_sale(id, STOCK, 1).await;
    }

    // 30,000 attempts at once: every sale through both gateways, 3,000
    // users per sale trying twice.
    let started = Instant::now();
    let mut runs = Vec::new();
    for id in &sales {
        for (g, gateway) in gateways.iter().enumerate() {
            let attempts: Vec<Attempt> = (0..ATTEMPTS_PER_SALE)
                .filter(|i| i % 2 == g)
                .map(|i| Attempt::by(&format!("u{id}-{}", i % USERS_PER_SALE)))
                .collect();
            let (gateway, id) = (*gateway, id.clone());
            runs.push(tokio::spawn(async move {
                (id.clone(), buy_all(gateway, &id, attempts, 24).await)
            }));
        }
    }
    let mut outcomes: HashMap<String, Vec<flashgate_tests::Outcome>> = HashMap::new();
    for run in runs {
        let (id, got) = run.await.unwrap();
        outcomes.entry(id).or_default().extend(got);
    }
    eprintln!("30,000 buys in {:?}", started.elapsed());

    for id in &sales {
        let got = &outcomes[id];
        assert_eq!(got.len(), ATTEMPTS_PER_SALE);
        let statuses: HashSet<u16> = got.iter().map(|o| o.status).collect();
        assert!(
            statuses.iter().all(|s| [202, 409, 410].contains(s)),
            "sale {id}: unexpected answers {statuses:?}"
        );
        let winners: Vec<&str> = got
            .iter()
            .filter(|o| o.won())
            .map(|o| o.reservation_id().unwrap())
            .collect();
        assert_eq!(
            winners.len() as i64,
            STOCK,
            "sale {id}: exactly the stock wins"
        );
        let (orders, users, most) = stack.wait_orders(id, STOCK, Duration::from_secs(30)).await;
        assert_eq!(
            (orders, users, most),
            (STOCK, STOCK, 1),
            "sale {id}: one order per winner, per-user limit held"
        );
        let rows: HashSet<String> = stack
            .order_rows(id)
            .await
            .into_iter()
            .map(|r| r.reservation_id)
            .collect();
        assert!(
            winners.iter().all(|rid| rows.contains(*rid)),
            "sale {id}: a winner has no order"
        );
        assert_eq!(stack.remaining(id).await, 0, "sale {id}");
        for gateway in gateways {
            // The page state is cached for `pages.state_ttl_ms`.
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                let (status, view) = get_json(
                    &stack.http,
                    &format!("http://{gateway}/flashgate/api/sales/{id}"),
                )
                .await;
                assert_eq!(status, 200, "sale page of {id} on {gateway}: {view}");
                if view["state"].as_str() == Some("sold_out") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sale page of {id} on {gateway}: {view}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    // The sold-out broadcast: a sale sold out through the first gateway only;
    // then neither gateway runs the deduct script for it again.
    stack.open_sale("bcast", 5, 1).await;
    let sellout = buy_all(
        stack.gateway_addr,
        "bcast",
        (0..50).map(|_| Attempt::by(&random_user())).collect(),
        16,
    )
    .await;
    assert_eq!(sellout.iter().filter(|o| o.won()).count(), 5);
    let master = cluster.master_for_key("fg:{sale:bcast}:meta").await;
    // The buy path's deduct script (`lua/deduct_batch.lua`).
    let deduct_sha = flashgate_common::scripts::DEDUCT_BATCH
        .get_hash()
        .to_owned();
    let watch = flashgate_tests::Monitor::start(master).await;
    let late = |gateway| {
        buy_all(
            gateway,
            "bcast",
            (0..2_000).map(|_| Attempt::by(&random_user())).collect(),
            32,
        )
    };
    let (first, second) = tokio::join!(late(stack.gateway_addr), late(gateway2_addr));
    assert!(
        first.iter().chain(&second).all(|o| o.status == 410),
        "every late buyer is told sold out"
    );
    let deducts = watch
        .commands()
        .await
        .into_iter()
        .filter(|c| c.contains(&deduct_sha))
        .count();
    assert_eq!(deducts, 0, "a sold-out buy ran the deduct script");
}

/// A `POST .../buy` as a new user: status, `Retry-After` present, JSON body.
async fn buy_once(
    http: &reqwest::Client,
    gateway: std::net::SocketAddr,
    sale: &str,
) -> (u16, bool, serde_json::Value) {
    let resp = http
        .post(format!("http://{gateway}/flashgate/api/sales/{sale}/buy"))
        .bearer_auth(token(&random_user()))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp.headers().contains_key("retry-after");
    (
        status,
        retry_after,
        resp.json().await.unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_sentinel_a_sale_sells_exactly_and_both_processes_follow_the_promoted_primary() {
    let mut stack = Stack::start(StackOptions {
        redis_mode: RedisMode::Sentinel,
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("exact", 50, 1).await;
    let got = buy_all(
        stack.gateway_addr,
        "exact",
        (0..400).map(|_| Attempt::by(&random_user())).collect(),
        16,
    )
    .await;
    assert_eq!(got.iter().filter(|o| o.won()).count(), 50);
    assert_eq!(
        stack
            .wait_orders("exact", 50, Duration::from_secs(20))
            .await,
        (50, 50, 1)
    );

    stack.open_sale("live", 1_000, 1).await;
    for _ in 0..5 {
        assert_eq!(
            buy_once(&stack.http, stack.gateway_addr, "live").await.0,
            202
        );
    }
    // The replica has the sale before its primary dies.
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut stack.redis_handle().await)
        .await
        .unwrap();
    assert_eq!(acked, 1);
    let Deployment::Sentinel(set) = &mut stack.deployment else {
        unreachable!("sentinel mode")
    };
    let old_primary = set.kill_primary().await;
    let killed = Instant::now();

    // Buyers keep coming from the moment the primary dies; until the gateway
    // reaches the promoted replica they get only 503 with Retry-After and JSON.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut recovered, mut refused) = (None, 0);
    while Instant::now() < deadline {
        let (status, retry_after, body) = buy_once(&stack.http, stack.gateway_addr, "live").await;
        if status == 202 {
            recovered = Some(killed.elapsed());
            break;
        }
        assert_eq!(status, 503, "during the failover: {status} {body}");
        assert!(
            retry_after && body["code"].is_string(),
            "a 503 without Retry-After or JSON: {body}"
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = recovered.expect("the gateway never sold again after the failover");
    eprintln!("selling again {recovered:?} after the primary was killed ({refused} buys answered 503 meanwhile)");
    assert!(
        refused > 0,
        "a buy succeeded while no primary was promoted yet"
    );
    let promoted = set.wait_failover(Duration::from_secs(30)).await;
    assert_ne!(promoted.port(), old_primary);

    // The backend follows too: the winners after the failover become orders.
    let after = buy_all(
        stack.gateway_addr,
        "live",
        (0..20).map(|_| Attempt::by(&random_user())).collect(),
        4,
    )
    .await;
    let winners: Vec<String> = after
        .iter()
        .filter(|o| o.won())
        .map(|o| o.reservation_id().unwrap().to_owned())
        .collect();
    assert_eq!(winners.len(), 20);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows: HashSet<String> = stack
            .order_rows("live")
            .await
            .into_iter()
            .map(|r| r.reservation_id)
            .collect();
        if winners.iter().all(|rid| rows.contains(rid)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the backend did not write the orders of the new primary's winners"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (orders, _, most) = stack.db_orders("live").await;
    assert!(
        orders <= 1_000 && most <= 1,
        "oversold: {orders} orders, {most} for one user"
    );
}

/// `flashgate --config FILE check --connect` with `redis` as the `[redis]` keys.
fn check_connect(dir: &TempDir, redis: &str) -> std::process::Output {
    let path = dir.0.join(format!("check-{}.toml", rand::random::<u32>()));
    std::fs::write(&path, format!("[redis]\n{redis}\ntimeout_ms = 2000\n")).unwrap();
    Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&path)
        .args(["check", "--connect"])
        .output()
        .unwrap()
}

/// The scripts of the registry (`flashgate_common::scripts::ALL`) that the
/// Redis at `port` does not hold (`SCRIPT EXISTS`).
async fn scripts_missing_on(port: u16) -> Vec<&'static str> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut exists = redis::cmd("SCRIPT");
    exists.arg("EXISTS");
    for script in flashgate_common::scripts::ALL {
        exists.arg(script.get_hash());
    }
    let held: Vec<i64> = exists.query_async(&mut conn).await.unwrap();
    assert_eq!(held.len(), flashgate_common::scripts::ALL.len());
    flashgate_common::scripts::ALL
        .iter()
        .zip(held)
        .filter(|(_, held)| *held != 1)
        .map(|(script, _)| script.name())
        .collect()
}

/// Empties the script cache of the Redis at `port`.
async fn flush_scripts(port: u16) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_connect_accepts_a_cluster_and_a_sentinel_set_and_names_an_unknown_master() {
    let dir = TempDir::new("check");
    let cluster = RedisCluster::start();
    let masters = cluster.masters().await;
    for port in &masters {
        flush_scripts(*port).await;
        assert!(!scripts_missing_on(*port).await.is_empty());
    }
    let out = check_connect(
        &dir,
        &redis_toml(&flashgate_common::config::RedisTarget::Cluster {
            nodes: cluster.nodes(),
        }),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("cluster_state:ok").count(),
        cluster.nodes().len(),
        "{stdout}"
    );
    assert_eq!(stdout.matches("every script loaded").count(), 3, "{stdout}");
    // Every script of the registry, the gateway's and the backend's alike,
    // is now held by every master.
    for port in &masters {
        assert_eq!(
            scripts_missing_on(*port).await,
            Vec::<&str>::new(),
            "master {port}"
        );
    }
    drop(cluster);

    let set = RedisSentinels::start();
    let target = |name: &str| flashgate_common::config::RedisTarget::Sentinel {
        sentinels: set.sentinels(),
        master_name: name.to_owned(),
    };
    let primary = set.master_addr().await.port();
    flush_scripts(primary).await;
    let out = check_connect(&dir, &redis_toml(&target(set.master_name())));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ROLE master, every script loaded"),
        "{stdout}"
    );
    assert_eq!(scripts_missing_on(primary).await, Vec::<&str>::new());

    let out = check_connect(&dir, &redis_toml(&target("no-such-master")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("redis.master_name") && stderr.contains("no-such-master"),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_connect_names_a_redis_user_whose_scripts_cannot_read_info() {
    let dir = TempDir::new("check-acl");
    let redis = flashgate_testkit::RedisServer::private();
    let mut conn = redis.conn().await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("fg")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-info")
        .query_async(&mut conn)
        .await
        .unwrap();
    let out = check_connect(
        &dir,
        &format!("url = \"redis://fg:secret@127.0.0.1:{}/\"", redis.port),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("INFO replication") && stderr.contains("+info"),
        "{stderr}"
    );
    let out = check_connect(&dir, &format!("url = \"{}\"", redis.url()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("replication id"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
