//! Real processes for tests, never mocks: each test starts its own
//! `redis-server` (or a Redis Cluster, or a Sentinel-managed primary;
//! and, when it stops and starts its database, its own
//! PostgreSQL) on a port no other test holds, and everything it started is
//! stopped by PID when dropped. Used by the backend's unit tests and by the
//! end-to-end tests in `tests/`.
//!
//! Layout:
//! - [`ports`]: listening ports never handed to two tests at once.
//! - [`process`]: a child process killed on drop, temp dirs, waits for a
//!   port and for `GET /ready`.
//! - [`redis`]: a redis-server of the test's own (with TLS too, on
//!   certificates the test makes), `MONITOR`, large AOFs.
//! - [`cluster`]: a Redis Cluster of the test's own: masters, replicas,
//!   failover, live slot migration.
//! - [`sentinel`]: a primary, a replica and three Sentinels; failover.
//! - [`postgres`]: a private PostgreSQL cluster.
//! - [`signing`]: an identity provider's signing keys, as JWKs and tokens.

pub mod cluster;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod redis;
pub mod sentinel;
pub mod signing;

pub use cluster::{ClusterOptions, RedisCluster, SlotMigration};
pub use ports::{free_port, free_port_with_bus};
pub use postgres::PrivatePostgres;
pub use process::{bin, wait_http_ready, wait_port, Proc, TempDir};
pub use redis::{
    aof_bytes, master_replid, prepare_large_aof, wait_redis_loaded, Monitor, RedisServer, TlsFiles,
};
pub use sentinel::RedisSentinels;
pub use signing::{jwks, SigningKey};
