//! `RedisHandle` against a real Redis Cluster and a real Sentinel set: the
//! gaps it fills in the redis crate's clients (NOSCRIPT on a cluster,
//! pipelines across slots, following a sentinel failover).

use std::process::Command;
use std::time::{Duration, Instant};

use flashgate_common::config::{RedisConfig, RedisTarget};
use flashgate_common::redis_conn::{EventSubscription, RedisHandle, Tuning};
use flashgate_testkit::{RedisCluster, RedisSentinels};
use redis::Value;

fn config(target: RedisTarget) -> RedisConfig {
    RedisConfig {
        target,
        timeout: Duration::from_secs(2),
        ..RedisConfig::standalone("")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_scripts_run_without_being_loaded_and_pipelines_may_span_slots() {
    let cluster = RedisCluster::start();
    let config = config(RedisTarget::Cluster {
        nodes: cluster.nodes(),
    });
    let mut conn = RedisHandle::connect(&config, &Tuning::new(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(conn.is_cluster());
    conn.ping().await.unwrap();

    // No master has the script: EVALSHA fails with NOSCRIPT and the handle
    // sends EVAL on the same keys instead (the crate's own reload is not
    // needed). The flush makes sure nothing was cached.
    let flushed = conn
        .each_master(redis::cmd("SCRIPT").arg("FLUSH"))
        .await
        .unwrap();
    assert_eq!(flushed.len(), 3);
    let sha = flashgate_common::scripts::TRIM.get_hash().to_owned();
    for sale in ["1", "2", "3", "4", "5", "6"] {
        let stream = format!("fg:{{sale:{sale}}}:stream");
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(&sha)
            .arg(1)
            .arg(&stream)
            .arg("orders")
            .arg("0-1");
        let reply: redis::RedisResult<Value> = evalsha.query_async(&mut conn).await;
        assert!(reply.is_ok(), "sale {sale}: {reply:?}");
    }
    // EVAL cached it on the masters it ran on.
    let exists = conn
        .on_master_of(
            "fg:{sale:1}:stream",
            redis::cmd("SCRIPT").arg("EXISTS").arg(&sha),
        )
        .await
        .unwrap();
    assert_eq!(exists, Value::Array(vec![Value::Int(1)]));

    // A pipeline of plain commands over several slots.
    let mut pipe = redis::pipe();
    pipe.set("fg:sales", "x")
        .ignore()
        .get("fg:sales")
        .get("fg:archived")
        .get("fg:switch");
    let got: (String, Option<String>, Option<String>) = pipe.query_async(&mut conn).await.unwrap();
    assert_eq!(got, ("x".to_owned(), None, None));
    // A transaction over several slots stays refused.
    let mut multi = redis::pipe();
    multi.atomic().get("fg:sales").get("fg:archived");
    assert!(multi.query_async::<Value>(&mut conn).await.is_err());

    // Sale events reach a cluster subscriber whichever node publishes.
    let mut events = EventSubscription::subscribe(&config, "fg:events")
        .await
        .unwrap();
    for port in cluster.masters().await {
        let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: i64 = redis::cmd("PUBLISH")
            .arg("fg:events")
            .arg(format!("changed:{port}"))
            .query_async(&mut node)
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .unwrap();
        assert_eq!(got, Some(format!("changed:{port}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_handle_follows_the_promoted_primary() {
    let mut set = RedisSentinels::start();
    let config = config(RedisTarget::Sentinel {
        sentinels: set.sentinels(),
        master_name: set.master_name().to_owned(),
    });
    let mut conn = RedisHandle::connect(&config, &Tuning::new(Duration::from_secs(1)))
        .await
        .unwrap();
    let RedisHandle::Sentinel(sentinel) = conn.clone() else {
        panic!("a sentinel handle")
    };
    let () = redis::cmd("SET")
        .arg("k")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(acked, 1);

    set.kill_primary().await;
    let promoted = set.wait_failover(Duration::from_secs(30)).await;
    // Calls fail until the handle has looked the primary up again; then the
    // same handle (and its clones) reach the promoted replica.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match redis::cmd("INCR")
            .arg("k")
            .query_async::<i64>(&mut conn)
            .await
        {
            Ok(v) => {
                assert_eq!(v, 2);
                break;
            }
            Err(error) => assert!(
                Instant::now() < deadline,
                "never followed the failover: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sentinel.generation() >= 1);
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        info.contains(&format!("tcp_port:{}\r\n", promoted.port())),
        "{info}"
    );
}

/// `INFO server`'s `field` (`process_id`, `tcp_port`).
fn info_field(info: &str, field: &str) -> String {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_handle_leaves_a_silent_primary_while_its_caller_bounds_every_call() {
    let set = RedisSentinels::start();
    let timeout = Duration::from_millis(300);
    let config = RedisConfig {
        timeout,
        ..config(RedisTarget::Sentinel {
            sentinels: set.sentinels(),
            master_name: set.master_name().to_owned(),
        })
    };
    let mut conn = RedisHandle::connect(&config, &Tuning::new(timeout))
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let (pid, port) = (
        info_field(&info, "process_id"),
        info_field(&info, "tcp_port"),
    );

    // The primary stops answering without closing its socket (a network
    // partition, no error from the socket); the caller bounds every call
    // with the same timeout, as the gateway does.
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut incr = redis::cmd("INCR");
        incr.arg("k");
        if let Ok(Ok(_)) = tokio::time::timeout(timeout, incr.query_async::<i64>(&mut conn)).await {
            break;
        }
        assert!(Instant::now() < deadline, "still on the silent primary");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_ne!(
        info_field(&info, "tcp_port"),
        port,
        "answered by the old primary"
    );
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
}

#[tokio::test]
async fn check_connect_loads_every_script_of_the_one_list_on_a_standalone_redis() {
    let server = flashgate_testkit::RedisServer::private();
    let found =
        flashgate_common::redis_conn::probe(&config(RedisTarget::Standalone { url: server.url() }))
            .await
            .unwrap();
    assert!(
        found
            .iter()
            .any(|line| line.contains("every script loaded")),
        "{found:?}"
    );
    let mut exists = redis::cmd("SCRIPT");
    exists.arg("EXISTS");
    for script in flashgate_common::scripts::ALL {
        exists.arg(script.get_hash());
    }
    let loaded: Vec<i64> = exists.query_async(&mut server.conn().await).await.unwrap();
    let missing: Vec<&str> = flashgate_common::scripts::ALL
        .iter()
        .zip(&loaded)
        .filter(|(_, l)| **l != 1)
        .map(|(script, _)| script.name())
        .collect();
    assert_eq!(loaded.len(), flashgate_common::scripts::ALL.len());
    assert!(
        missing.is_empty(),
        "not loaded by check --connect: {missing:?}"
    );
}
