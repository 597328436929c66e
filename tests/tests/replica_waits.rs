//! `redis.wait_replicas`: a winner is answered once that many replicas have
//! the win, through one `WAIT` shared by the winners of the moment, on the
//! master that holds the sale; too few replicas in time answer 503 with
//! Retry-After and the win stays, replayed by a retry with its key.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use flashgate_tests::{
    bin, buy_all, random_user, token, Attempt, Deployment, RedisMode, RedisServer, Stack,
    StackOptions, TempDir,
};

fn waiting(replicas: u32, timeout_ms: u64) -> StackOptions {
    StackOptions {
        redis_extra: format!("wait_replicas = {replicas}\nwait_timeout_ms = {timeout_ms}"),
        ..StackOptions::default()
    }
}

/// `calls` of `cmdstat_wait` on the Redis at `port`; `None` when the
/// server never ran a WAIT (the line is absent).
fn wait_calls(port: u16) -> Option<u64> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// 200 buyers, each with a key, 64 at a time, on a sale of 50: the
/// distinct reservations won.
async fn burst(stack: &Stack, sale: &str) -> usize {
    let attempts = (0..200)
        .map(|_| random_user())
        .map(|u| Attempt {
            idempotency_key: Some(format!("k-{u}")),
            user: u,
        })
        .collect();
    let got = buy_all(stack.gateway_addr, sale, attempts, 64).await;
    let odd: Vec<_> = got
        .iter()
        .filter(|o| ![202, 410].contains(&o.status))
        .collect();
    assert!(
        odd.is_empty(),
        "only wins and sold out expected: {:?}",
        &odd[..odd.len().min(3)]
    );
    got.iter()
        .filter(|o| o.won())
        .filter_map(|o| o.reservation_id())
        .collect::<HashSet<_>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_live_replica_winners_are_answered_and_one_wait_covers_many_of_them() {
    let stack = Stack::start(waiting(1, 2000)).await;
    let _replica = stack.redis.start_replica();
    stack.open_sale("shared", 50, 1).await;
    let winners = burst(&stack, "shared").await;
    let waits = wait_calls(stack.redis.port).unwrap_or(0);
    println!("{winners} winners, {waits} WAIT calls");
    assert_eq!(winners, 50);
    assert!(waits > 0, "winners were answered without a WAIT");
    assert!(
        waits < winners as u64,
        "one WAIT per winner: {waits} WAITs for {winners} winners"
    );
    assert_eq!(
        stack
            .gateway_metric("flashgate_gateway_replica_waits_total")
            .await as u64,
        waits
    );
    assert_eq!(
        stack
            .gateway_metric("flashgate_gateway_replica_wait_timeouts_total")
            .await as u64,
        0
    );
    assert_eq!(
        stack
            .wait_orders("shared", 50, Duration::from_secs(30))
            .await,
        (50, 50, 1)
    );
}

/// Waits (up to 15 s) until the replica of `primary` acknowledged all its
/// writes (`INFO replication`: the replica's offset = `master_repl_offset`).
async fn caught_up(primary: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let info = primary.replication_info();
        let field = |prefix: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .map(|v| v.trim().to_owned())
        };
        let master = field("master_repl_offset:");
        let replica = field("slave0:").and_then(|v| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix("offset="))
                .map(str::to_owned)
        });
        if master.is_some() && master == replica {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never caught up:\n{info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Resumes a stopped process when dropped, whatever the test did.
struct Stopped(u32);

impl Stopped {
    fn stop(server: &RedisServer) -> Self {
        server.proc.signal("STOP");
        Self(server.proc.pid())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_win_the_replica_did_not_acknowledge_answers_503_and_its_retry_replays_it_once_the_replica_caught_up(
) {
    let stack = Stack::start(waiting(1, 300)).await;
    let replica = stack.redis.start_replica();
    stack.open_sale("stalled", 10, 1).await;

    let stopped = Stopped::stop(&replica);
    let send = || {
        stack
            .http
            .post(stack.url("/flashgate/api/sales/stalled/buy"))
            .bearer_auth(token("alice"))
            .header("Idempotency-Key", "alice-1")
            .timeout(Duration::from_secs(10))
            .send()
    };
    let started = Instant::now();
    let resp = send().await.unwrap();
    println!("503 after {:?} (wait_timeout_ms = 300)", started.elapsed());
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        (status, body["code"].as_str(), retry_after.as_deref()),
        (503, Some("unavailable"), Some("1")),
        "{body}"
    );
    assert_eq!(
        stack
            .gateway_metric("flashgate_gateway_replica_wait_timeouts_total")
            .await as u64,
        1
    );
    // The reservation stands in the master while the replica is stopped.
    assert_eq!(stack.remaining("stalled").await, 9);

    drop(stopped);
    caught_up(&stack.redis).await;
    let resp = send().await.unwrap();
    let (status, replayed) = (
        resp.status().as_u16(),
        resp.headers().contains_key("idempotent-replayed"),
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        [201, 202].contains(&status) && replayed,
        "the retry replays the win: {status} {body}"
    );
    let rid = body["reservation_id"].as_str().unwrap().to_owned();

    // The books: one order, for that reservation; one item taken.
    assert_eq!(
        stack
            .wait_orders("stalled", 1, Duration::from_secs(30))
            .await,
        (1, 1, 1)
    );
    let rows = stack.order_rows("stalled").await;
    assert_eq!(
        rows.iter()
            .map(|r| r.reservation_id.as_str())
            .collect::<Vec<_>>(),
        [rid.as_str()]
    );
    assert_eq!(stack.remaining("stalled").await, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_replicas_no_wait_is_sent() {
    let stack = Stack::start(StackOptions::default()).await;
    let _replica = stack.redis.start_replica();
    stack.open_sale("plain", 50, 1).await;
    assert_eq!(burst(&stack, "plain").await, 50);
    assert_eq!(
        wait_calls(stack.redis.port),
        None,
        "cmdstat_wait present with wait_replicas = 0"
    );
    assert_eq!(
        stack
            .gateway_metric("flashgate_gateway_replica_waits_total")
            .await as u64,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_the_shared_wait_goes_only_to_the_master_of_the_sale() {
    let opts = StackOptions {
        redis_mode: RedisMode::Cluster,
        redis_timeout_ms: 3000,
        ..waiting(1, 2000)
    };
    let stack = Stack::start(opts).await;
    stack.open_sale("slotted", 50, 1).await;
    let Deployment::Cluster(cluster) = &stack.deployment else {
        unreachable!("cluster mode")
    };
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .await;
    let winners = burst(&stack, "slotted").await;
    let home = cluster.master_for_key("fg:{sale:slotted}:remaining").await;
    let waits = wait_calls(home).unwrap_or(0);
    println!("{winners} winners, {waits} WAIT calls on the sale's master {home}");
    assert_eq!(winners, 50);
    assert!(
        0 < waits && waits < winners as u64,
        "{waits} WAITs for {winners} winners"
    );
    for master in cluster.masters().await.into_iter().filter(|m| *m != home) {
        assert_eq!(
            wait_calls(master),
            None,
            "a WAIT went to master {master}, which does not hold the sale"
        );
    }
    assert_eq!(
        stack
            .wait_orders("slotted", 50, Duration::from_secs(30))
            .await,
        (50, 50, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_sentinel_winners_wait_for_the_primarys_replica() {
    let opts = StackOptions {
        redis_mode: RedisMode::Sentinel,
        ..waiting(1, 2000)
    };
    let stack = Stack::start(opts).await;
    stack.open_sale("watched", 50, 1).await;
    let winners = burst(&stack, "watched").await;
    let Deployment::Sentinel(set) = &stack.deployment else {
        unreachable!("sentinel mode")
    };
    let primary = set.master_addr().await.port();
    let waits = wait_calls(primary).unwrap_or(0);
    println!("{winners} winners, {waits} WAIT calls on the primary");
    assert_eq!(winners, 50);
    assert!(
        0 < waits && waits < winners as u64,
        "{waits} WAITs for {winners} winners"
    );
    assert_eq!(
        stack
            .wait_orders("watched", 50, Duration::from_secs(30))
            .await,
        (50, 50, 1)
    );
}

/// `flashgate --config FILE check --connect` on the Redis at `port`.
fn check_connect(dir: &TempDir, port: u16, wait_replicas: u32) -> std::process::Output {
    let path = dir.0.join(format!("check-{wait_replicas}.toml"));
    std::fs::write(
        &path,
        format!("[redis]\nurl = \"redis://127.0.0.1:{port}/\"\nwait_replicas = {wait_replicas}\n"),
    )
    .unwrap();
    std::process::Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&path)
        .args(["check", "--connect"])
        .output()
        .unwrap()
}

#[test]
fn check_connect_names_wait_replicas_when_the_master_has_fewer_replicas() {
    let redis = RedisServer::private();
    let dir = TempDir::new("check-replicas");
    let out = check_connect(&dir, redis.port, 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted a master without replicas");
    assert!(
        stderr.contains("redis.wait_replicas") && stderr.contains("0 connected replicas"),
        "{stderr}"
    );

    let _replica = redis.start_replica();
    let out = check_connect(&dir, redis.port, 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 connected replicas (redis.wait_replicas = 1)"),
        "{stdout}"
    );
    assert!(
        check_connect(&dir, redis.port, 0).status.success(),
        "without wait_replicas, replicas are not asked for"
    );
}
