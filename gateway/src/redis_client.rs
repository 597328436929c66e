//! The gateway's Redis connection and scripts.
//!
//! One multiplexed [`ConnectionManager`] serves every request: clones share
//! one socket, so concurrent deducts are pipelined without a pool. It is
//! created lazily on first use because redis-rs spawns the connection's
//! driver on the runtime that creates it, and that must be the proxy's
//! runtime, not a temporary one in `main`. Every call is bounded by the
//! configured timeout, so a stalled Redis yields a quick 503, not a hang.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use crate::breaker::Breaker;

/// Why a Redis call did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis circuit open")]
    CircuitOpen,
}

/// The deduct script, compiled in so a deployed binary always runs the
/// script it was tested with.
pub static DEDUCT_LUA: &str = include_str!("../../lua/deduct.lua");

pub struct RedisClient {
    client: redis::Client,
    timeout: Duration,
    conn: OnceCell<ConnectionManager>,
    pub deduct: redis::Script,
    /// Shared with the admin listener, which reports its state.
    pub breaker: Arc<Breaker>,
}

impl RedisClient {
    /// # Errors
    /// When `url` is not a valid Redis URL.
    pub fn new(url: &str, timeout: Duration, breaker: Breaker) -> Result<Self, RedisError> {
        Ok(Self {
            client: redis::Client::open(url)?,
            timeout,
            breaker: Arc::new(breaker),
            conn: OnceCell::new(),
            deduct: redis::Script::new(DEDUCT_LUA),
        })
    }

    /// A handle on the shared connection, connecting (and loading the
    /// scripts with SCRIPT LOAD) on first use.
    ///
    /// # Errors
    /// When Redis cannot be reached within the timeout.
    pub async fn conn(&self) -> Result<ConnectionManager, RedisError> {
        let conn = self
            .bounded(self.conn.get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let mut conn = ConnectionManager::new_with_config(self.client.clone(), config).await?;
                self.deduct.prepare_invoke().load_async(&mut conn).await?;
                Ok::<_, RedisError>(conn)
            }))
            .await??;
        Ok(conn.clone())
    }

    /// Runs a Redis call through the circuit breaker, with the configured
    /// timeout. Its outcome feeds the breaker.
    ///
    /// # Errors
    /// [`RedisError::CircuitOpen`] without trying while the breaker is open,
    /// [`RedisError::Timeout`] when the call takes longer, or the call's error.
    pub async fn bounded<T, E>(&self, fut: impl Future<Output = Result<T, E>>) -> Result<Result<T, E>, RedisError> {
        // Dropped unreported if this future is (the client went away
        // mid-call): a probe then leaves its turn to the next call.
        let Some(permit) = self.breaker.allow() else {
            return Err(RedisError::CircuitOpen);
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => {
                permit.success();
                Ok(Ok(v))
            }
            Ok(Err(e)) => {
                permit.failure();
                Ok(Err(e))
            }
            Err(_) => {
                permit.failure();
                Err(RedisError::Timeout(self.timeout))
            }
        }
    }

    /// A client for connections of their own (pub/sub).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }
}
