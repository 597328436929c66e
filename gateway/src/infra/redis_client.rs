//! The gateway's Redis connection and scripts.
//!
//! One [`RedisHandle`] serves every request, in the configured `redis.mode`:
//! clones share one multiplexed socket per Redis node, so concurrent
//! deducts are pipelined without a pool. It is
//! created lazily on first use because redis-rs spawns the connection's
//! driver on the runtime that creates it, and that must be the proxy's
//! runtime, not a temporary one in `main`, nor a background task's (each
//! runs on a runtime of its own): there every call of a buy would hop to
//! another thread and back, waking it each time. A background task that
//! calls Redis takes a [`RedisClient::sibling`], whose connection is its
//! own. Every call goes through
//! [`RedisClient::call`] ([`RedisClient::publish`] for announcements on
//! `fg:events`), the one way to the shared connection: it takes the handle
//! and bounds the call by the configured timeout and the circuit breaker in
//! one step no caller can skip, so a stalled Redis yields a quick 503, not
//! a hang, and every failure counts. With `redis.wait_replicas` set the
//! bound is `redis.timeout_ms + redis.wait_timeout_ms`: a call may queue
//! behind a replica `WAIT` on the shared connection.
//!
//! The deduct scripts are loaded (`SCRIPT LOAD`, on every master of a
//! cluster) when the connection is made, and reloaded on `NOSCRIPT`. Only
//! calls feed the breaker: taking the connection is refused while it is
//! open but reports nothing. Outside this client, on connections of their
//! own and outside the breaker: the readiness check and the switch poll
//! (`RedisHandle::dedicated`, each call bounded by `redis.timeout_ms`), the
//! `fg:events` subscription, and the shop cache's purge announcement
//! (bounded by 4 × `redis.timeout_ms`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flashgate_common::config::RedisConfig;
use flashgate_common::keys::SaleEvent;
use flashgate_common::redis_conn::{RedisHandle, Tuning};
use tokio::sync::OnceCell;

use crate::infra::breaker::{Breaker, BreakerState};

/// Why a Redis call did not produce an answer. Clone: one batched deduct's
/// failure is every attempt's in it (`buy::deduct::batch`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum RedisError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis circuit open")]
    CircuitOpen,
    /// Too many buys of one sale already waiting for their deduct call
    /// (`buy::deduct::batch::MAX_QUEUED`): Redis is slower than they come.
    #[error("too many buys of this sale waiting for redis")]
    QueueFull,
}

/// Server error codes that say "not now" (a script running, a dump
/// loading, a failover under way), never "not this": the same call may
/// succeed a moment later.
const TRANSIENT_CODES: &[&str] = &[
    "BUSY",
    "LOADING",
    "TRYAGAIN",
    "MASTERDOWN",
    "READONLY",
    "CLUSTERDOWN",
];

impl RedisError {
    /// Whether the same call may succeed if sent again shortly: a timeout,
    /// an open breaker, a full deduct queue, a cut or refused connection, or a server busy,
    /// loading or failing over. A script error, `WRONGTYPE` or a bad reply
    /// is not: sending it again gets the same answer.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::CircuitOpen | Self::QueueFull => true,
            Self::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.code().is_some_and(|code| TRANSIENT_CODES.contains(&code))
            }
        }
    }
}

/// The deduct script (`lua/deduct_batch.lua`), compiled in so a deployed
/// binary always runs the script it was tested with.
pub static DEDUCT_BATCH_LUA: &str = flashgate_common::scripts::DEDUCT_BATCH.body();

pub struct RedisClient {
    config: RedisConfig,
    conn: OnceCell<RedisHandle>,
    pub deduct_batch: redis::Script,
    /// Shared with the admin listener, which reports its state.
    pub breaker: Arc<Breaker>,
}

impl RedisClient {
    /// A client of the deployment `config` names; nothing connects yet.
    pub fn new(config: RedisConfig, breaker: Breaker) -> Self {
        Self {
            config,
            breaker: Arc::new(breaker),
            conn: OnceCell::new(),
            deduct_batch: flashgate_common::scripts::DEDUCT_BATCH.clone(),
        }
    }

    /// A client of the same deployment, sharing this one's breaker, with a
    /// connection of its own, made on first use on its first caller's
    /// runtime: for a background task, whose calls then neither make nor
    /// wake the request path's connection (see the module doc).
    pub fn sibling(&self) -> Self {
        Self {
            config: self.config.clone(),
            conn: OnceCell::new(),
            deduct_batch: self.deduct_batch.clone(),
            breaker: self.breaker.clone(),
        }
    }

    /// A client of the standalone Redis at `url` (tests, tools).
    pub fn standalone(url: &str, timeout: Duration, breaker: Breaker) -> Self {
        Self::new(
            RedisConfig {
                timeout,
                ..RedisConfig::standalone(url)
            },
            breaker,
        )
    }

    /// Runs one call on the shared connection: `op` gets the handle
    /// (connecting, and loading the scripts, on first use; refused while
    /// the breaker is open) and its future runs through the breaker with
    /// the configured timeout, its outcome feeding the breaker. The handle
    /// is a clone of the shared multiplexed one: cheap, and dropped with
    /// the call.
    ///
    /// # Errors
    /// [`RedisError::CircuitOpen`] without trying while the breaker is open,
    /// [`RedisError::Timeout`] when connecting or the call takes longer, or
    /// the call's error.
    pub async fn call<T, E, Fut>(
        &self,
        op: impl FnOnce(RedisHandle) -> Fut,
    ) -> Result<T, RedisError>
    where
        Fut: Future<Output = Result<T, E>>,
        RedisError: From<E>,
    {
        let conn = self.conn().await?;
        Ok(self.bounded(op(conn)).await??)
    }

    /// A handle on the shared connection, connecting (and loading the
    /// scripts with SCRIPT LOAD) on first use.
    ///
    /// # Errors
    /// When Redis cannot be reached within the timeout.
    async fn conn(&self) -> Result<RedisHandle, RedisError> {
        if let Some(conn) = self.conn.get() {
            // Refused while the breaker is open, before the caller builds
            // its call. Nothing is reported to the breaker: a handle in hand
            // says nothing of Redis, and counting it a success would reset
            // the failures of the calls between (the breaker would never
            // open under load) and spend the half-open probe on no call.
            if self.breaker.state() == BreakerState::Open {
                return Err(RedisError::CircuitOpen);
            }
            return Ok(conn.clone());
        }
        // Boxed: connecting is a future of kilobytes, and held inline it
        // would grow the future of every request that calls Redis (moved
        // into its box on each request), where only the first call needs it.
        let conn = Box::pin(self.bounded(self.conn.get_or_try_init(|| async {
            let tuning = Tuning {
                connection_timeout: self.config.timeout,
                // A call may queue behind a replica WAIT on this connection.
                response_timeout: self.config.call_timeout(),
                reconnect_retries: 1,
                max_reconnect_delay: Some(Duration::from_millis(500)),
            };
            let mut conn = RedisHandle::connect(&self.config, &tuning).await?;
            conn.load_script(DEDUCT_BATCH_LUA).await?;
            Ok::<_, RedisError>(conn)
        })))
        .await??;
        Ok(conn.clone())
    }

    /// Runs a Redis call through the circuit breaker, with the configured
    /// timeout (`redis.timeout_ms`, plus `redis.wait_timeout_ms` when wins
    /// wait for replicas: a call may queue behind a `WAIT`). Its outcome
    /// feeds the breaker.
    ///
    /// # Errors
    /// [`RedisError::CircuitOpen`] without trying while the breaker is open,
    /// [`RedisError::Timeout`] when the call takes longer, or the call's error.
    async fn bounded<T, E>(
        &self,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<Result<T, E>, RedisError> {
        // Dropped unreported if this future is (the client went away
        // mid-call): a probe then leaves its turn to the next call.
        let Some(permit) = self.breaker.allow() else {
            return Err(RedisError::CircuitOpen);
        };
        let limit = self.config.call_timeout();
        match tokio::time::timeout(limit, fut).await {
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
                Err(RedisError::Timeout(limit))
            }
        }
    }

    /// Announces `event` to every gateway and backend on `fg:events`, on
    /// the shared connection and through [`RedisClient::call`], like any
    /// other call: it is refused while the breaker is open, and its
    /// failure or timeout counts.
    ///
    /// # Errors
    /// [`RedisError::CircuitOpen`], [`RedisError::Timeout`], or Redis's error.
    pub async fn publish(&self, event: &SaleEvent) -> Result<(), RedisError> {
        self.call(|mut conn| async move { flashgate_common::keys::publish(&mut conn, event).await })
            .await
    }

    /// Where Redis is, for connections of their own (pub/sub, checks).
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::testing::RedisServer;

    /// A call that takes the connection, then fails.
    async fn failing_call(redis: &RedisClient) {
        let outcome = redis
            .call(|_conn| async { Err::<(), _>(RedisError::QueueFull) })
            .await;
        assert!(matches!(outcome, Err(RedisError::QueueFull)), "{outcome:?}");
    }

    /// A client of `server` whose breaker opens after 3 failures, connected.
    async fn connected(server: &RedisServer) -> RedisClient {
        let redis = RedisClient::standalone(
            &server.url(),
            Duration::from_millis(500),
            Breaker::new(3, Duration::from_secs(60)),
        );
        redis.conn().await.expect("first connect");
        redis
    }

    #[tokio::test]
    async fn a_sibling_connects_on_its_own_and_its_failures_open_the_shared_breaker() {
        let server = RedisServer::private();
        let redis = connected(&server).await;
        let sibling = redis.sibling();
        assert!(
            sibling.conn.get().is_none(),
            "the sibling's connection is made by its own first call"
        );
        sibling.conn().await.expect("the sibling connects");
        for _ in 0..3 {
            failing_call(&sibling).await;
        }
        assert!(
            matches!(redis.conn().await, Err(RedisError::CircuitOpen)),
            "one breaker for both"
        );
    }

    #[tokio::test]
    async fn failed_calls_open_the_breaker_though_each_first_takes_the_connection() {
        let server = RedisServer::private();
        let redis = connected(&server).await;
        for _ in 0..3 {
            failing_call(&redis).await;
        }
        assert_eq!(redis.breaker.state(), BreakerState::Open);
        assert!(
            matches!(redis.conn().await, Err(RedisError::CircuitOpen)),
            "an open breaker refuses the handle"
        );
    }

    #[tokio::test]
    async fn a_publish_goes_through_the_breaker_which_counts_its_failure_and_then_refuses_it() {
        let server = RedisServer::private();
        let redis = RedisClient::standalone(
            &server.url(),
            Duration::from_millis(500),
            Breaker::new(1, Duration::from_secs(60)),
        );
        let event = SaleEvent::SoldOut {
            sale: "s".into(),
            epoch: 1,
        };
        redis.publish(&event).await.expect("published");
        assert_eq!(server.command_calls("publish").await, 1);
        assert_eq!(redis.breaker.state(), BreakerState::Closed);

        // Redis refuses the next publish: one failure opens this breaker.
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("-publish")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        let refused = redis.publish(&event).await;
        assert!(matches!(refused, Err(RedisError::Redis(_))), "{refused:?}");
        assert_eq!(
            redis.breaker.state(),
            BreakerState::Open,
            "the failed publish fed the breaker"
        );

        // While open, a publish is not even sent.
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("+publish")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        assert!(matches!(
            redis.publish(&event).await,
            Err(RedisError::CircuitOpen)
        ));
        assert_eq!(server.command_calls("publish").await, 1);
    }

    #[tokio::test]
    async fn a_call_that_outlasts_the_timeout_is_answered_at_once_and_opens_the_breaker() {
        let server = RedisServer::private();
        let redis = RedisClient::standalone(
            &server.url(),
            Duration::from_millis(200),
            Breaker::new(1, Duration::from_secs(60)),
        );
        let started = std::time::Instant::now();
        // Blocks for 2 s on the server: the call's bound answers first.
        let outcome: Result<Option<(String, String)>, _> = redis
            .call(|mut conn| async move {
                redis::cmd("BLPOP")
                    .arg("nothing")
                    .arg(2)
                    .query_async(&mut conn)
                    .await
            })
            .await;
        assert!(outcome.is_err(), "{outcome:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            redis.breaker.state(),
            BreakerState::Open,
            "the timed-out call fed the breaker"
        );
    }

    #[tokio::test]
    async fn the_half_open_probe_is_the_first_real_call_not_the_handle() {
        let server = RedisServer::private();
        let redis = RedisClient::standalone(
            &server.url(),
            Duration::from_millis(500),
            Breaker::new(1, Duration::ZERO),
        );
        redis.conn().await.expect("first connect");
        failing_call(&redis).await;
        assert_eq!(redis.breaker.state(), BreakerState::HalfOpen);
        // Taking the handle neither closes the breaker nor spends the probe.
        let _conn = redis
            .conn()
            .await
            .expect("half-open lets the handle through");
        assert_eq!(redis.breaker.state(), BreakerState::HalfOpen);
        let pong: String = redis
            .call(|mut conn| async move { redis::cmd("PING").query_async(&mut conn).await })
            .await
            .expect("the probe answers PONG");
        assert_eq!(pong, "PONG");
        assert_eq!(
            redis.breaker.state(),
            BreakerState::Closed,
            "the real call's success closed it"
        );
    }
}
