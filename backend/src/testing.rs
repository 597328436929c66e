//! Test fixtures: real services, never mocks. Each test starts its own
//! `redis-server` on a free port and uses its own SQLite file; PostgreSQL
//! is a schema of the shared `test` database (see [`postgres_url`]), shared
//! by the tests, so ids carry a random suffix.

use std::time::Duration;

use flashgate_common::reservation::Reservation;
use flashgate_common::sale::SaleSpec;

use crate::store::Store;

/// The PostgreSQL database the tests use (trust auth).
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// [`POSTGRES_URL`] with the search path set to a schema of its own, named
/// after this build's PostgreSQL migrations and created if missing. The
/// tables other versions left in the `public` schema of the shared
/// database never meet these migrations, and a changed migration gets a
/// fresh schema instead of a checksum mismatch.
pub async fn postgres_url() -> String {
    use sqlx::Connection;
    let schema = format!("flashgate_test_{}", crate::store::schema::fingerprint(crate::store::Flavour::Postgres));
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(POSTGRES_URL).await.expect("postgres (is it running?)");
    // Tests start at once; concurrent `CREATE SCHEMA IF NOT EXISTS` can
    // still collide in the catalog, so they take turns.
    sqlx::query("SELECT pg_advisory_lock(7220412)").execute(&mut conn).await.expect("lock");
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).execute(&mut conn).await.expect("create the test schema");
    sqlx::query("SELECT pg_advisory_unlock(7220412)").execute(&mut conn).await.expect("unlock");
    conn.close().await.ok();
    format!("{POSTGRES_URL}?options[search_path]={schema}")
}

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
        ("postgres", Store::connect(&postgres_url().await).await.expect("postgres store (is it running?)")),
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
    SaleSpec {
        id: id.to_owned(),
        name: format!("sale {id}"),
        stock,
        per_user_limit: 1,
        starts_at_ms: now - 1000,
        ends_at_ms: now + 3_600_000,
        draw_window_ms: None,
    }
}

/// A `redis-server` of the test's own (the one in `flashgate-testkit`, on
/// a port no other test holds), with its URL; killed when dropped.
pub struct RedisServer {
    server: flashgate_testkit::RedisServer,
    pub url: String,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub async fn start() -> Self {
        let server = flashgate_testkit::RedisServer::private();
        Self { url: server.url(), server }
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.server.conn().await
    }

    /// How many times Redis ran `command` (`INFO commandstats`).
    pub async fn command_calls(&self, command: &str) -> u64 {
        self.server.command_calls(command).await
    }

    /// Kills the server (SIGKILL) and starts it again on its port and
    /// files: it comes back with what it last saved (`SAVE`), as a master
    /// with a new replication id, like a Redis restarted from an old RDB.
    pub fn restart(&mut self) {
        self.server.restart();
        flashgate_testkit::redis::wait_redis_loaded(self.server.port, Duration::from_secs(10));
    }

    pub fn config(&self) -> flashgate_common::config::RedisConfig {
        flashgate_common::config::RedisConfig {
            timeout: Duration::from_millis(500),
            ..flashgate_common::config::RedisConfig::standalone(&self.url)
        }
    }
}

/// One buy attempt through the gateway's own script (`lua/deduct.lua`), as
/// a gateway would run it; answers the outcome (`won`, `limit_reached`, ...).
pub async fn buy(conn: &mut redis::aio::MultiplexedConnection, sale_id: &str, user: &str) -> String {
    let reply = buy_with_key(conn, sale_id, user, "").await;
    reply.into_iter().next().expect("the script answers an outcome first")
}

/// [`buy`] with an Idempotency-Key; answers the script's whole reply
/// (outcome, detail such as the reservation id, ...).
pub async fn buy_with_key(conn: &mut redis::aio::MultiplexedConnection, sale_id: &str, user: &str, key: &str) -> Vec<String> {
    static DEDUCT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(flashgate_common::scripts::DEDUCT));
    let keys = flashgate_common::keys::SaleKeys::new(sale_id);
    let rid = flashgate_common::reservation::reservation_id(sale_id, uuid::Uuid::new_v4().as_u128());
    DEDUCT
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(keys.idempotency(user, key))
        .key(&keys.stream)
        .key(&keys.reservations)
        .key(keys.idempotency_misses(user))
        .key(&keys.synced)
        .arg(user)
        .arg(key)
        .arg(&rid)
        .arg(60)
        .arg(sale_id)
        .arg(16)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// A TCP relay in front of a real Redis that can hold one client's next
/// command: armed with a pattern, it stops forwarding the first chunk the
/// client sends that contains it, until [`Gate::open`]. Lets a test stop a
/// process at an exact step (say, just before it writes) and change Redis
/// under it, with no timing involved.
pub struct Gate {
    pub url: String,
    state: tokio::sync::watch::Sender<GateState>,
    patterns: Vec<&'static [u8]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GateState {
    Armed,
    Holding,
    Open,
}

impl Gate {
    /// Relays to `redis`, holding the first chunk that contains any of
    /// `patterns` (e.g. `b"$3\r\nDEL\r\n"`, a RESP `DEL` command).
    pub async fn start(redis: &RedisServer, patterns: Vec<&'static [u8]>) -> std::sync::Arc<Self> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (state, _) = tokio::sync::watch::channel(GateState::Armed);
        let gate = std::sync::Arc::new(Self { url: format!("redis://{}/", listener.local_addr().unwrap()), state, patterns });
        let upstream = redis.url.trim_start_matches("redis://").trim_end_matches('/').to_owned();
        let relay = gate.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                });
                let gate = relay.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0_u8; 64 * 1024];
                    loop {
                        let n = match client_rx.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        let hit = gate.patterns.iter().any(|p| chunk.windows(p.len()).any(|w| w == *p));
                        if hit && *gate.state.borrow() == GateState::Armed {
                            gate.state.send_replace(GateState::Holding);
                            let mut open = gate.state.subscribe();
                            let _ = open.wait_for(|s| *s == GateState::Open).await;
                        }
                        if server_tx.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        gate
    }

    /// Waits until a chunk is held.
    pub async fn holding(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|s| *s == GateState::Holding).await;
    }

    /// Forwards the held chunk and everything after it.
    pub fn open(&self) {
        self.state.send_replace(GateState::Open);
    }
}
