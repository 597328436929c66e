//! The sentinel mode: a connection to the primary the sentinels name, that
//! follows a failover.
//!
//! [`lookup`] finds the primary (it skips masters the sentinels flag down
//! and checks `ROLE` on the one it picks) and hands out a client bound to
//! that address. [`SentinelHandle`] keeps the current connection in an
//! `ArcSwap` with a generation number; a call that fails in a way a
//! failover explains (I/O error, timeout, `READONLY` from a demoted
//! primary, `MASTERDOWN`) starts one lookup in the background, unless a
//! lookup is already running or the connection was replaced since the call
//! began. The failed call returns its error (the gateway answers 503 with
//! Retry-After); a deduct is never re-sent across the swap.

mod lookup;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::sync::Mutex;

use super::tls::Roots;
use lookup::Lookup;

/// Pause after a lookup that found no usable master, so the calls failing
/// meanwhile do not turn into a stream of lookups.
const FAILED_LOOKUP_PAUSE: Duration = Duration::from_millis(100);

/// The current primary connection and how many times it was replaced.
struct Current {
    generation: u64,
    conn: MultiplexedConnection,
}

struct Shared {
    /// Needs `&mut` for a lookup; the lock also makes lookups one at a time.
    lookup: Arc<Mutex<Lookup>>,
    config: AsyncConnectionConfig,
    /// Each call's own bound, a little under the response timeout, so a call
    /// to a silent primary fails here (and starts a lookup) before a caller
    /// that bounds its calls with the same timeout (the gateway) drops it.
    call_timeout: Duration,
    current: ArcSwap<Current>,
}

/// A connection to the sentinel-managed primary; clones share it.
#[derive(Clone)]
pub struct SentinelHandle {
    shared: Arc<Shared>,
}

/// The primary's client, as `sentinels` name it: over TLS when they are
/// `rediss://`, verified against the system's roots and those of `ca_file`.
///
/// # Errors
/// A bad URL or `ca_file`, or no primary found (see [`lookup`]).
pub(super) async fn primary(
    sentinels: &[String],
    master_name: &str,
    ca_file: Option<&Path>,
) -> RedisResult<Client> {
    Lookup::new(sentinels, master_name, Roots::load(ca_file)?)?
        .primary()
        .await
}

/// One connection to the current primary, not followed afterwards.
pub(super) async fn master_connection(
    sentinels: &[String],
    master_name: &str,
    ca_file: Option<&Path>,
    config: &AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    primary(sentinels, master_name, ca_file)
        .await?
        .get_multiplexed_async_connection_with_config(config)
        .await
}

impl SentinelHandle {
    /// Asks the sentinels for the primary and connects to it.
    ///
    /// # Errors
    /// A bad URL, no sentinel answers, none knows `master_name`, or the
    /// primary does not answer as a master.
    pub async fn connect(
        sentinels: &[String],
        master_name: &str,
        ca_file: Option<&Path>,
        config: &AsyncConnectionConfig,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let mut lookup = Lookup::new(sentinels, master_name, Roots::load(ca_file)?)?;
        let conn = lookup
            .primary()
            .await?
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        Ok(Self {
            shared: Arc::new(Shared {
                lookup: Arc::new(Mutex::new(lookup)),
                config: config.clone(),
                call_timeout: response_timeout.mul_f64(0.9),
                current: ArcSwap::from_pointee(Current {
                    generation: 0,
                    conn,
                }),
            }),
        })
    }

    /// How many times the connection followed the primary elsewhere.
    pub fn generation(&self) -> u64 {
        self.shared.current.load().generation
    }

    /// After a failure on the connection of `generation` that says the
    /// primary may have moved: a new lookup, in the background.
    fn after_error(&self, generation: u64) {
        // A lookup is running: it will replace the connection.
        let Ok(mut lookup) = self.shared.lookup.clone().try_lock_owned() else {
            return;
        };
        let shared = self.shared.clone();
        tokio::spawn(async move {
            if shared.current.load().generation != generation {
                return;
            }
            let found = match lookup.primary().await {
                Ok(client) => {
                    client
                        .get_multiplexed_async_connection_with_config(&shared.config)
                        .await
                }
                Err(e) => Err(e),
            };
            match found {
                Ok(conn) => {
                    shared.current.store(Arc::new(Current {
                        generation: generation + 1,
                        conn,
                    }));
                    tracing::info!(
                        generation = generation + 1,
                        "redis primary looked up again through the sentinels"
                    );
                }
                Err(error) => {
                    tracing::warn!(%error, "no redis primary from the sentinels yet");
                    tokio::time::sleep(FAILED_LOOKUP_PAUSE).await;
                }
            }
        });
    }
}

impl ConnectionLike for SentinelHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let current = self.shared.current.load_full();
        async move {
            let mut conn = current.conn.clone();
            let reply = bounded(self.shared.call_timeout, conn.req_packed_command(cmd)).await;
            if reply
                .as_ref()
                .map_or_else(primary_may_have_moved, refused_by_a_replica)
            {
                self.after_error(current.generation);
            }
            reply
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let current = self.shared.current.load_full();
        async move {
            let mut conn = current.conn.clone();
            let reply = bounded(
                self.shared.call_timeout,
                conn.req_packed_commands(pipeline, offset, count),
            )
            .await;
            if reply
                .as_ref()
                .map_or_else(primary_may_have_moved, |values| {
                    values.iter().any(refused_by_a_replica)
                })
            {
                self.after_error(current.generation);
            }
            reply
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.shared.current.load().conn.get_db()
    }
}

/// `call` cut at `limit`, as a timeout error.
async fn bounded<T>(
    limit: Duration,
    call: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer from the redis primary",
        )
        .into())
    })
}

/// Whether a reply is a refusal that only a demoted or cut-off primary
/// gives (`READONLY`, `MASTERDOWN`).
fn refused_by_a_replica(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if matches!(e.kind(), Some(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)))
}

/// Whether `error` can mean the primary is no longer where we connected.
fn primary_may_have_moved(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failover_shaped_error_starts_a_lookup_and_a_refusal_does_not() {
        let readonly = RedisError::from((ErrorKind::Server(ServerErrorKind::ReadOnly), "READONLY"));
        assert!(primary_may_have_moved(&readonly));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(primary_may_have_moved(&io));
        let refused = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "WRONGTYPE",
        ));
        assert!(!primary_may_have_moved(&refused));
    }
}
