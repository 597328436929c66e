//! The Redis Cluster harness against real redis-server processes: the
//! cluster forms as asked, a killed master's replica takes over, a slot
//! moves to another master while the redis crate's cluster client reads it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flashgate_testkit::RedisCluster;
use redis::AsyncCommands;

async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_cluster_has_three_masters_with_a_replica_each_and_serves_every_slot() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.nodes().len(), 6);
    let nodes = cluster.topology().await;
    let masters: Vec<_> = nodes
        .iter()
        .filter(|n| n.is_master() && !n.slots.is_empty())
        .collect();
    assert_eq!(masters.len(), 3, "{nodes:?}");
    for m in &masters {
        assert_eq!(
            nodes
                .iter()
                .filter(|n| n.master_id.as_ref() == Some(&m.id))
                .count(),
            1,
            "replicas of {m:?}"
        );
    }
    let covered: usize = masters
        .iter()
        .flat_map(|m| &m.slots)
        .map(|r| r.clone().count())
        .sum();
    assert_eq!(covered, 16384);

    // The redis crate's cluster client routes every key to its master.
    let mut conn = cluster.conn().await;
    for i in 0..200 {
        let () = conn.set(format!("key:{i}"), i).await.unwrap();
    }
    for i in 0..200 {
        let v: i64 = conn.get(format!("key:{i}")).await.unwrap();
        assert_eq!(v, i);
    }
    for port in cluster.masters().await {
        let size: u64 = redis::cmd("DBSIZE")
            .query_async(&mut node(port).await)
            .await
            .unwrap();
        assert!(size > 0, "no key landed on master {port}");
    }

    // Sale ids whose {sale:ID} tags live on three different masters.
    let ids = cluster.tags_on_distinct_masters(3).await;
    assert_eq!(ids.len(), 3);
    let mut owners = Vec::new();
    for id in &ids {
        owners.push(
            cluster
                .master_for_key(&format!("fg:{{sale:{id}}}:remaining"))
                .await,
        );
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "ids {ids:?} share masters");
}

#[tokio::test]
async fn killing_the_master_of_a_key_promotes_its_replica_and_the_key_is_served_again() {
    let mut cluster = RedisCluster::start();
    let key = "fg:{sale:1}:remaining";
    let mut conn = cluster.conn().await;
    let () = conn.set(key, 42).await.unwrap();
    cluster
        .wait_replicas_caught_up(Duration::from_secs(10))
        .await;

    let old = cluster.master_for_key(key).await;
    let nodes = cluster.topology().await;
    let old_id = &nodes.iter().find(|n| n.port == old).unwrap().id;
    let replica = nodes
        .iter()
        .find(|n| n.master_id.as_ref() == Some(old_id))
        .unwrap()
        .port;

    assert_eq!(cluster.kill_master_for_key(key).await, old);
    let new = cluster.wait_failover(key, Duration::from_secs(30)).await;
    assert_eq!(new, replica, "the killed master's own replica takes over");
    assert_eq!(cluster.master_for_key(key).await, new);

    // The connection made before the failover follows it: the client
    // reconnects and refreshes its slot map on its own.
    let v: i64 = conn.get(key).await.unwrap();
    assert_eq!(v, 42);
    let v: i64 = conn.incr(key, 1).await.unwrap();
    assert_eq!(v, 43);
    let direct: i64 = node(new).await.get(key).await.unwrap();
    assert_eq!(direct, 43);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moves_to_another_master_while_the_cluster_client_keeps_reading() {
    let cluster = RedisCluster::start();
    let keys: Vec<String> = (0..300).map(|i| format!("fg:{{sale:7}}:k{i}")).collect();
    let mut conn = cluster.conn().await;
    for k in &keys {
        let () = conn.set(k, k).await.unwrap();
    }
    let slot = cluster.slot_of(&keys[0]).await;
    let from = cluster.master_for_slot(slot).await;
    let to = cluster
        .masters()
        .await
        .into_iter()
        .find(|&p| p != from)
        .unwrap();

    // A reader that runs through the whole migration: no read may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn({
        let (mut conn, keys, stop) = (conn.clone(), keys.clone(), stop.clone());
        async move {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for k in &keys {
                    let v: String = conn
                        .get(k)
                        .await
                        .unwrap_or_else(|e| panic!("read of {k} failed during the migration: {e}"));
                    assert_eq!(&v, k);
                    reads += 1;
                }
            }
            reads
        }
    });

    let migration = cluster.begin_migration(slot, to).await;
    assert_eq!(migration.move_keys(150).await, 150);
    // Halfway: the source sends the client elsewhere (ASK) for moved keys.
    let moved: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query_async(&mut node(to).await)
        .await
        .unwrap();
    assert_eq!(moved.len(), 150);
    let asked = node(from)
        .await
        .get::<_, String>(&moved[0])
        .await
        .unwrap_err();
    assert_eq!(asked.code(), Some("ASK"), "{asked}");
    for k in &keys {
        let v: String = conn.get(k).await.unwrap();
        assert_eq!(&v, k);
    }
    // A key created mid-migration goes to the target.
    let () = conn.set("fg:{sale:7}:new", "new").await.unwrap();

    migration.finish().await;
    assert_eq!(cluster.master_for_slot(slot).await, to);
    let gone: u64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query_async(&mut node(from).await)
        .await
        .unwrap();
    assert_eq!(gone, 0);
    let moved = node(from)
        .await
        .get::<_, String>(&keys[0])
        .await
        .unwrap_err();
    assert_eq!(moved.code(), Some("MOVED"), "{moved}");
    for k in &keys {
        let v: String = conn.get(k).await.unwrap();
        assert_eq!(&v, k);
    }
    let v: String = conn.get("fg:{sale:7}:new").await.unwrap();
    assert_eq!(v, "new");

    stop.store(true, Ordering::Relaxed);
    let reads = reader.await.unwrap();
    assert!(reads >= keys.len() as u64, "the reader read {reads} keys");
}
