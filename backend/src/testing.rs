//! Test fixtures: real services, never mocks. Each test starts its own
//! `redis-server` on a free port and uses its own SQLite file; PostgreSQL
//! is a schema of the shared `test` database (see [`postgres_url`]), shared
//! by the tests, so ids carry a random suffix; MySQL (MariaDB) is a fresh
//! database per test, dropped after it ([`MysqlDatabase`]).

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
    let schema = format!(
        "flashgate_test_{}",
        crate::store::schema::fingerprint(crate::store::Flavour::Postgres)
    );
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(POSTGRES_URL)
        .await
        .expect("postgres (is it running?)");
    // Tests start at once; concurrent `CREATE SCHEMA IF NOT EXISTS` can
    // still collide in the catalog, so they take turns.
    sqlx::query("SELECT pg_advisory_lock(7220412)")
        .execute(&mut conn)
        .await
        .expect("lock");
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .execute(&mut conn)
        .await
        .expect("create the test schema");
    sqlx::query("SELECT pg_advisory_unlock(7220412)")
        .execute(&mut conn)
        .await
        .expect("unlock");
    conn.close().await.ok();
    format!("{POSTGRES_URL}?options[search_path]={schema}")
}

/// A random lowercase hex string, unique enough to namespace a test.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A fresh SQLite database file URL under the temp dir.
pub fn sqlite_url() -> String {
    let path =
        std::env::temp_dir().join(format!("{}/orders.db", unique("flashgate-backend-test-")));
    format!("sqlite://{}", path.display())
}

/// The MySQL (MariaDB) server the tests use: root, no password.
pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";

/// A database of its own on [`MYSQL_SERVER`], dropped with this value.
pub struct MysqlDatabase {
    name: String,
    pub url: String,
}

/// Test databases older than this are leftovers of killed runs: dropped
/// by the next test that creates one.
const MYSQL_LEFTOVER_SECONDS: u64 = 3600;

impl MysqlDatabase {
    /// Creates `flashgate_t_<unix seconds>_<random>`, dropping leftovers.
    pub async fn create() -> Self {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let name = format!(
            "flashgate_t_{now}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let mut conn = sqlx::AnyConnection::connect(MYSQL_SERVER)
            .await
            .expect("MariaDB on 127.0.0.1:3306 (deploy/local/install-deps.sh --test starts it)");
        let rows = sqlx::query("SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata WHERE schema_name LIKE 'flashgate_t_%'")
            .fetch_all(&mut conn)
            .await
            .expect("list test databases");
        for row in rows {
            let old: String = sqlx::Row::try_get(&row, 0).expect("database name");
            let made: Option<u64> = old
                .strip_prefix("flashgate_t_")
                .and_then(|r| r.split('_').next())
                .and_then(|t| t.parse().ok());
            if made.is_some_and(|t| t + MYSQL_LEFTOVER_SECONDS < now) {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{old}`"))
                    .execute(&mut conn)
                    .await;
            }
        }
        sqlx::query(&format!(
            "CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        ))
        .execute(&mut conn)
        .await
        .expect("create the test database");
        conn.close().await.ok();
        let url = format!("{MYSQL_SERVER}/{name}");
        Self { name, url }
    }
}

impl Drop for MysqlDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        // A connection still in a transaction on it must not hang the test.
        drop_on_server(
            MYSQL_SERVER,
            [
                "SET SESSION lock_wait_timeout = 5".to_owned(),
                format!("DROP DATABASE IF EXISTS `{name}`"),
            ],
        );
    }
}

/// Runs `statements` on a connection of its own to `server`, from a thread
/// with a runtime of its own: `Drop` runs inside the test's runtime, which
/// cannot be blocked on. Errors are ignored (the test is over).
fn drop_on_server(server: &'static str, statements: [String; 2]) {
    let dropper = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            use sqlx::Connection;
            if let Ok(mut conn) = sqlx::AnyConnection::connect(server).await {
                for statement in &statements {
                    let _ = sqlx::query(statement).execute(&mut conn).await;
                }
                let _ = conn.close().await;
            }
        });
    });
    let _ = dropper.join();
}

/// A PostgreSQL schema of one test's own in the shared `test` database,
/// dropped with this value: for tests that look at whole tables.
pub struct PostgresSchema {
    name: String,
    pub url: String,
}

impl PostgresSchema {
    pub async fn create() -> Self {
        use sqlx::Connection;
        sqlx::any::install_default_drivers();
        let name = unique("flashgate_own_");
        let mut conn = sqlx::AnyConnection::connect(POSTGRES_URL)
            .await
            .expect("postgres (is it running?)");
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&mut conn)
            .await
            .expect("create a test schema");
        conn.close().await.ok();
        Self {
            url: format!("{POSTGRES_URL}?options[search_path]={name}"),
            name,
        }
    }
}

impl Drop for PostgresSchema {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        drop_on_server(
            POSTGRES_URL,
            [
                "SET lock_timeout = '5s'".to_owned(),
                format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
            ],
        );
    }
}

/// A store on a test database, which it keeps alive (MySQL, and a
/// PostgreSQL schema of its own: dropped after).
pub struct TestStore {
    store: Store,
    _mysql: Option<MysqlDatabase>,
    _postgres: Option<PostgresSchema>,
}

impl std::ops::Deref for TestStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

/// A store on a fresh MySQL database.
pub async fn mysql_store() -> TestStore {
    let db = MysqlDatabase::create().await;
    let store = Store::connect(&db.url)
        .await
        .expect("mysql store (is MariaDB running?)");
    TestStore {
        store,
        _mysql: Some(db),
        _postgres: None,
    }
}

/// Every database, each with nothing but what the test writes (a fresh
/// SQLite file, PostgreSQL schema and MySQL database).
pub async fn isolated_stores() -> Vec<(&'static str, TestStore)> {
    let schema = PostgresSchema::create().await;
    let postgres = Store::connect(&schema.url)
        .await
        .expect("postgres store (is it running?)");
    vec![
        (
            "sqlite",
            TestStore {
                store: Store::connect(&sqlite_url()).await.expect("sqlite store"),
                _mysql: None,
                _postgres: None,
            },
        ),
        (
            "postgres",
            TestStore {
                store: postgres,
                _mysql: None,
                _postgres: Some(schema),
            },
        ),
        ("mysql", mysql_store().await),
    ]
}

/// Every database, each as a connected store.
pub async fn stores() -> Vec<(&'static str, TestStore)> {
    vec![
        (
            "sqlite",
            TestStore {
                store: Store::connect(&sqlite_url()).await.expect("sqlite store"),
                _mysql: None,
                _postgres: None,
            },
        ),
        (
            "postgres",
            TestStore {
                store: Store::connect(&postgres_url().await)
                    .await
                    .expect("postgres store (is it running?)"),
                _mysql: None,
                _postgres: None,
            },
        ),
        ("mysql", mysql_store().await),
    ]
}

/// A well-formed reservation of `sale_id` by `user`.
pub fn reservation(sale_id: &str, user: &str) -> Reservation {
    Reservation {
        reservation_id: flashgate_common::reservation::reservation_id(
            sale_id,
            uuid::Uuid::new_v4().as_u128(),
        ),
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
        buckets: 1,
        checkout_url: None,
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
        Self {
            url: server.url(),
            server,
        }
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

/// One buy attempt through the gateway's own script (`lua/deduct_batch.lua`,
/// one attempt in the call), as a gateway would run it; answers the
/// outcome (`won`, `limit_reached`, ...).
pub async fn buy(
    conn: &mut redis::aio::MultiplexedConnection,
    sale_id: &str,
    user: &str,
) -> String {
    let reply = buy_with_key(conn, sale_id, user, "").await;
    reply
        .into_iter()
        .next()
        .expect("the script answers an outcome first")
}

/// [`buy`] with an Idempotency-Key; answers the attempt's whole reply
/// (outcome, detail such as the reservation id, ...).
pub async fn buy_with_key(
    conn: &mut redis::aio::MultiplexedConnection,
    sale_id: &str,
    user: &str,
    key: &str,
) -> Vec<String> {
    let keys = flashgate_common::keys::SaleKeys::new(sale_id);
    let rid =
        flashgate_common::reservation::reservation_id(sale_id, uuid::Uuid::new_v4().as_u128());
    // The sale's shared keys (no draw keys: no draw), then the attempt's
    // two; one attempt, its nine arguments (no nonce, no draw window, not
    // a bucket).
    let replies: Vec<Vec<String>> = flashgate_common::scripts::DEDUCT_BATCH
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(&keys.stream)
        .key(&keys.reservations)
        .key(&keys.synced)
        .key(keys.idempotency(user, key))
        .key(keys.idempotency_misses(user))
        .arg(1)
        .arg(user)
        .arg(key)
        .arg(&rid)
        .arg(60)
        .arg(sale_id)
        .arg(16)
        .arg("")
        .arg(0)
        .arg("0")
        .invoke_async(conn)
        .await
        .unwrap();
    replies.into_iter().next().expect("one reply per attempt")
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
        let gate = std::sync::Arc::new(Self {
            url: format!("redis://{}/", listener.local_addr().unwrap()),
            state,
            patterns,
        });
        let upstream = redis
            .url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
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
                        let hit = gate
                            .patterns
                            .iter()
                            .any(|p| chunk.windows(p.len()).any(|w| w == *p));
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
