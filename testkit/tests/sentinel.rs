//! The Sentinel harness against real redis-server processes: the Sentinels
//! fail the primary over to its replica, and a client of the redis crate's
//! `sentinel` module finds the new primary.

use std::time::Duration;

use flashgate_testkit::RedisSentinels;
use redis::AsyncCommands;

#[tokio::test]
async fn after_the_primary_dies_the_sentinels_promote_the_replica_and_a_sentinel_client_follows() {
    let mut set = RedisSentinels::start_named("fg-test");
    assert_eq!(set.master_name(), "fg-test");
    assert_eq!(set.sentinels().len(), 3);
    let before = set.master_addr().await;

    let mut client = set.client();
    let mut conn = client.get_async_connection().await.unwrap();
    let () = conn.set("fg:{sale:1}:remaining", 5).await.unwrap();
    let mut direct = redis::Client::open(format!("redis://{before}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        acked, 1,
        "the replica has the write before the primary dies"
    );
    let role: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut direct)
        .await
        .unwrap();
    assert!(role.contains("role:master"), "{role}");

    assert_eq!(set.kill_primary().await, before.port());
    let after = set.wait_failover(Duration::from_secs(30)).await;
    assert_ne!(after, before);
    assert_eq!(set.master_addr().await, after);

    // The old connection is dead; the Sentinel client hands out a
    // connection to the promoted replica, which has the write.
    assert!(conn.get::<_, i64>("fg:{sale:1}:remaining").await.is_err());
    let mut conn = client.get_async_connection().await.unwrap();
    let v: i64 = conn.decr("fg:{sale:1}:remaining", 1).await.unwrap();
    assert_eq!(v, 4);
    let server: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        server.contains(&format!("tcp_port:{}\r\n", after.port())),
        "connected to the wrong server: {server}"
    );
    let role: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(role.contains("role:master"), "{role}");
}
