//! One Redis connection type for the three deployments of `redis.mode`.
//!
//! [`RedisHandle`] implements [`ConnectionLike`], so `Script::invoke_async`,
//! `query_async` and pipelines work on it whatever the mode; the hot path
//! pays one `match` per call, no boxing beyond what each connection does.
//!
//! - **standalone**: a reconnecting [`ConnectionManager`] (as before the
//!   modes existed), or a plain [`MultiplexedConnection`] for a connection
//!   of its own ([`RedisHandle::dedicated`]).
//! - **cluster** (`cluster`): the redis crate's `ClusterConnection`, which
//!   routes every command by the slot of its first key and follows `MOVED`,
//!   `ASK` and failovers. Two gaps are filled here: a `NOSCRIPT` is answered
//!   by `EVAL` of the script's body on the same keys (the crate's own reload
//!   fans `SCRIPT LOAD` out to every node and is never retried, so it fails
//!   right after a failover), and a pipeline of plain commands on several
//!   slots is sent as single commands (a cluster pipeline must stay on one
//!   slot).
//! - **sentinel** (`sentinel`): a connection to the primary the sentinels
//!   name, replaced by a new lookup after an I/O error, a timeout, `READONLY`
//!   or `MASTERDOWN` (one lookup at a time however many calls fail); the
//!   failed call itself returns its error.
//!
//! `rediss://` in every mode: see [`tls`] for what the server's
//! certificate is verified against.
//!
//! Also here: the subscription to sale events ([`EventSubscription`]), the
//! per-master helpers [`RedisHandle::on_master_of`] and
//! [`RedisHandle::each_master`], and [`probe`] (`flashgate check --connect`).

mod cluster;
mod events;
mod probe;
mod sentinel;
mod tls;

use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, Cmd, RedisFuture, RedisResult, Value};

pub use cluster::ClusterHandle;
pub use events::EventSubscription;
pub use probe::{probe, ProbeError};
pub use sentinel::SentinelHandle;
pub use tls::{check_ca_file, CaFileError};

use crate::config::{RedisConfig, RedisTarget};

/// How a process wants its shared connection: the gateway and the backend
/// differ in how long they wait and how hard they retry.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    pub connection_timeout: Duration,
    /// Per call; the cluster client also retries within it.
    pub response_timeout: Duration,
    /// Reconnection attempts of the standalone connection manager.
    pub reconnect_retries: usize,
    /// Longest wait between the standalone manager's reconnection attempts.
    pub max_reconnect_delay: Option<Duration>,
}

impl Tuning {
    /// Connection and response timeouts of `timeout`, two reconnection attempts.
    pub fn new(timeout: Duration) -> Self {
        Self {
            connection_timeout: timeout,
            response_timeout: timeout,
            reconnect_retries: 2,
            max_reconnect_delay: None,
        }
    }
}

/// A connection to the configured Redis deployment; cheap to clone (clones
/// share one multiplexed connection per node).
#[derive(Clone)]
pub enum RedisHandle {
    /// Standalone, reconnecting on its own.
    Standalone(ConnectionManager),
    /// One node, not reconnecting: the owner opens a new one after an error.
    Direct(MultiplexedConnection),
    Cluster(ClusterHandle),
    Sentinel(SentinelHandle),
}

impl RedisHandle {
    /// The shared connection of a process.
    ///
    /// # Errors
    /// A bad URL, or the deployment does not answer (no seed node, no
    /// sentinel that knows the master, the master unreachable).
    pub async fn connect(config: &RedisConfig, tuning: &Tuning) -> RedisResult<Self> {
        match &config.target {
            RedisTarget::Standalone { url } => {
                let mut settings = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(tuning.connection_timeout))
                    .set_response_timeout(Some(tuning.response_timeout))
                    .set_number_of_retries(tuning.reconnect_retries);
                if let Some(delay) = tuning.max_reconnect_delay {
                    settings = settings.set_max_delay(delay);
                }
                let client = tls::client(url, config.ca_file.as_deref())?;
                Ok(Self::Standalone(
                    ConnectionManager::new_with_config(client, settings).await?,
                ))
            }
            RedisTarget::Cluster { nodes } => Ok(Self::Cluster(
                ClusterHandle::connect(
                    nodes,
                    config.ca_file.as_deref(),
                    tuning.connection_timeout,
                    tuning.response_timeout,
                )
                .await?,
            )),
            RedisTarget::Sentinel {
                sentinels,
                master_name,
            } => Ok(Self::Sentinel(
                SentinelHandle::connect(
                    sentinels,
                    master_name,
                    config.ca_file.as_deref(),
                    &node_config(tuning),
                    tuning.response_timeout,
                )
                .await?,
            )),
        }
    }

    /// A connection of its own, for blocking reads (`XREADGROUP ... BLOCK`
    /// must not stall the calls queued on a shared connection) and for
    /// background checks that reconnect themselves. `response_timeout`
    /// must exceed any `BLOCK` sent on it.
    ///
    /// # Errors
    /// As [`RedisHandle::connect`].
    pub async fn dedicated(
        config: &RedisConfig,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let tuning = Tuning {
            connection_timeout,
            response_timeout,
            reconnect_retries: 0,
            max_reconnect_delay: None,
        };
        match &config.target {
            RedisTarget::Standalone { url } => {
                let client = tls::client(url, config.ca_file.as_deref())?;
                Ok(Self::Direct(
                    client
                        .get_multiplexed_async_connection_with_config(&node_config(&tuning))
                        .await?,
                ))
            }
            RedisTarget::Cluster { nodes } => Ok(Self::Cluster(
                ClusterHandle::connect(
                    nodes,
                    config.ca_file.as_deref(),
                    connection_timeout,
                    response_timeout,
                )
                .await?,
            )),
            RedisTarget::Sentinel {
                sentinels,
                master_name,
            } => Ok(Self::Direct(
                sentinel::master_connection(
                    sentinels,
                    master_name,
                    config.ca_file.as_deref(),
                    &node_config(&tuning),
                )
                .await?,
            )),
        }
    }

    /// Loads the script `body` where it will run (`SCRIPT LOAD`): on the one
    /// master, or on every master of a cluster. A cluster master that
    /// refuses is only logged: `EVALSHA` falls back to `EVAL` there.
    ///
    /// # Errors
    /// Redis failed (outside a cluster), or no cluster master answered.
    pub async fn load_script(&mut self, body: &str) -> RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(body);
        if !self.is_cluster() {
            return load.query_async::<String>(self).await.map(drop);
        }
        for (node, reply) in self.each_master(&load).await? {
            if let Err(error) = reply {
                tracing::warn!(%error, node, "script not loaded on a cluster master; it will be sent with EVAL there");
            }
        }
        Ok(())
    }

    /// `PING` the master (every master of a cluster).
    ///
    /// # Errors
    /// A master is unreachable, loading, or failing.
    pub async fn ping(&mut self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        match self {
            Self::Cluster(c) => c.ping_masters(&ping).await,
            other => ping.query_async::<String>(other).await.map(drop),
        }
    }

    /// Which connection to the primary this is, as far as a `WAIT` cares:
    /// in sentinel mode, how many times the handle followed the primary to
    /// a new connection (a `WAIT` sent after a swap does not count the
    /// writes of the old connection); 0 in the other modes.
    pub fn generation(&self) -> u64 {
        match self {
            Self::Sentinel(s) => s.generation(),
            _ => 0,
        }
    }

    /// Whether commands on different hash slots can go to different nodes.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs `cmd` on the master that holds `key` (a cluster routes it by the
    /// key's slot; the other modes have one master). For commands that name
    /// no key but must run beside one: `WAIT`, `INFO`, `SCRIPT LOAD`.
    ///
    /// # Errors
    /// Redis failed or refused the command.
    pub async fn on_master_of(&mut self, key: &str, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Cluster(c) => c.on_master_of(key, cmd).await,
            other => other
                .req_packed_command(cmd)
                .await
                .and_then(Value::extract_error),
        }
    }

    /// Runs `pipe` in order on one connection to the master that holds
    /// `key` (in a cluster; the one connection otherwise): what a replica
    /// `WAIT` needs, whose count covers only its own connection's writes.
    ///
    /// # Errors
    /// Redis failed or refused a command.
    pub async fn pipeline_on_master_of(
        &mut self,
        key: &str,
        pipe: &redis::Pipeline,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Self::Cluster(c) => c.pipeline_on_master_of(key, pipe).await,
            other => other.req_packed_commands(pipe, 0, pipe.len()).await,
        }
    }

    /// Runs `cmd` on every master: its address (`host:port`; the configured
    /// one outside a cluster) and its answer, a refusal included.
    ///
    /// # Errors
    /// A master could not be reached at all.
    pub async fn each_master(
        &mut self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        match self {
            Self::Cluster(c) => c.each_master(cmd).await,
            other => {
                let reply = other
                    .req_packed_command(cmd)
                    .await
                    .and_then(Value::extract_error);
                if reply
                    .as_ref()
                    .is_err_and(|e| e.is_io_error() || e.is_timeout())
                {
                    return reply.map(|_| Vec::new());
                }
                Ok(vec![("master".to_owned(), reply)])
            }
        }
    }
}

impl ConnectionLike for RedisHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Standalone(c) => c.req_packed_command(cmd),
            Self::Direct(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Direct(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Standalone(c) => c.get_db(),
            Self::Direct(c) => c.get_db(),
            Self::Cluster(_) => 0,
            Self::Sentinel(c) => c.get_db(),
        }
    }
}

/// The settings of a connection to one node.
fn node_config(tuning: &Tuning) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(tuning.connection_timeout))
        .set_response_timeout(Some(tuning.response_timeout))
}
