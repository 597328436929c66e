//! Test fixtures: real services, never mocks. Each test starts its own
//! `redis-server` on a free port and uses its own SQLite file; PostgreSQL
//! is the shared `test` database, so ids carry a random suffix.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flashgate_common::reservation::Reservation;
use flashgate_common::sale::SaleSpec;

use crate::store::Store;

/// The PostgreSQL database the tests use (trust auth).
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A random lowercase hex string, unique enough to namespace a test.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A fresh SQLite database file URL under the temp dir.
pub fn sqlite_url() -> String {
    let path = std::env::temp_dir().join(format!("{}/orders.db", unique("flashgate-backend-test-")));
    format!("sqlite://{}", path.display())
}

/// Both databases, each as a connected store.
pub async fn stores() -> Vec<(&'static str, Store)> {
    vec![
        ("sqlite", Store::connect(&sqlite_url()).await.expect("sqlite store")),
        ("postgres", Store::connect(POSTGRES_URL).await.expect("postgres store (is it running?)")),
    ]
}

/// A well-formed reservation of `sale_id` by `user`.
pub fn reservation(sale_id: &str, user: &str) -> Reservation {
    Reservation {
        reservation_id: flashgate_common::reservation::reservation_id(sale_id, uuid::Uuid::new_v4().as_u128()),
        sale_id: sale_id.to_owned(),
        user_id: user.to_owned(),
        idempotency_key: String::new(),
        reserved_at_ms: flashgate_common::now_ms(),
    }
}

/// A sale open now for an hour.
pub fn sale(id: &str, stock: i64) -> SaleSpec {
    let now = flashgate_common::now_ms();
    SaleSpec { id: id.to_owned(), name: format!("sale {id}"), stock, per_user_limit: 1, starts_at_ms: now - 1000, ends_at_ms: now + 3_600_000 }
}

/// A `redis-server` child process, killed when dropped.
pub struct RedisServer {
    child: Child,
    pub url: String,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let server = Self { child, url: format!("redis://127.0.0.1:{port}/") };
        let client = redis::Client::open(server.url.as_str()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not answer PING");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }

    pub fn config(&self) -> flashgate_common::config::RedisConfig {
        flashgate_common::config::RedisConfig { url: self.url.clone(), timeout: Duration::from_millis(500), breaker_failures: 5, breaker_cooldown: Duration::from_secs(1) }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
