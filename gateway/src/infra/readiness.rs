//! What the gateway waits for: Redis and the order backend.
//!
//! The gateway starts whatever its dependencies do: pages and the shop
//! proxy need neither, and a buy while Redis is away is answered `503
//! unavailable` with `Retry-After`. [`DependencyWatcher`] checks Redis
//! (`PING`; `LOADING` while it reads its dataset is "not yet") and the
//! backend (`GET /live`) with capped exponential backoff and jitter while
//! one is away, every second while both answer, and logs once per change.
//!
//! `GET /ready` on the admin listener answers 200 only while Redis answers
//! and the circuit breaker is not open. The backend's state is reported but
//! does not gate readiness: a winner never waits for the backend (its order
//! comes from the stream when the forward fails), so a backend restart must
//! not take every gateway out of the load balancer.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashgate_common::backoff::Backoff;
use flashgate_common::config::RedisConfig;
use flashgate_common::dependency::{ping_redis, DepState, Dependency};
use flashgate_common::redis_conn::RedisHandle;

use crate::infra::breaker::{Breaker, BreakerState};
use crate::infra::orders::OrderClient;
use crate::infra::task::{Shutdown, Task};

/// How often a healthy dependency is checked again.
const HEALTHY_CHECK: Duration = Duration::from_secs(1);

/// The gateway's dependencies, as last checked.
#[derive(Debug)]
pub struct Readiness {
    pub redis: Dependency,
    pub backend: Dependency,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            redis: Dependency::new("redis"),
            backend: Dependency::new("backend"),
        }
    }
}

impl Readiness {
    /// Whether buys can be served: Redis answers and the breaker lets calls through.
    pub fn is_ready(&self, breaker: &Breaker) -> bool {
        self.redis.is_ready() && breaker.state() != BreakerState::Open
    }

    /// The body of `GET /ready`.
    pub fn report(&self, breaker: &Breaker) -> serde_json::Value {
        let circuit = match breaker.state() {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        };
        let ready = self.is_ready(breaker);
        let waiting: Vec<&str> = if ready { vec![] } else { vec!["redis"] };
        serde_json::json!({
            "ready": ready,
            "waiting_for": waiting,
            "redis": self.redis.state().as_str(),
            "redis_circuit": circuit,
            "backend": self.backend.state().as_str(),
        })
    }
}

/// Checks Redis and the backend until shutdown.
pub struct DependencyWatcher {
    /// Checked on a connection of its own, in the configured `redis.mode`.
    pub redis: RedisConfig,
    pub timeout: Duration,
    pub orders: Arc<OrderClient>,
    pub readiness: Arc<Readiness>,
}

impl DependencyWatcher {
    async fn check_redis(&self, conn: &mut Option<RedisHandle>) {
        if conn.is_none() {
            let timeout = self.timeout.max(Duration::from_millis(500));
            match RedisHandle::dedicated(&self.redis, timeout, timeout).await {
                Ok(c) => *conn = Some(c),
                Err(error) => return self.readiness.redis.redis_failed(&error),
            }
        }
        let Some(c) = conn.as_mut() else { return };
        match ping_redis(c).await {
            Ok(()) => self.readiness.redis.ready(),
            Err(error) => {
                if flashgate_common::dependency::redis_state(&error) != DepState::Loading {
                    *conn = None;
                }
                self.readiness.redis.redis_failed(&error);
            }
        }
    }

    async fn check_backend(&self) {
        match self.orders.live().await {
            Ok(()) => self.readiness.backend.ready(),
            Err(error) => self.readiness.backend.observe(DepState::Unreachable, error),
        }
    }
}

#[async_trait]
impl Task for DependencyWatcher {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut conn = None;
        let mut backoff = Backoff::default();
        loop {
            tokio::join!(self.check_redis(&mut conn), self.check_backend());
            let wait = if self.readiness.redis.is_ready() && self.readiness.backend.is_ready() {
                backoff.reset();
                HEALTHY_CHECK
            } else {
                backoff.next_wait()
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
