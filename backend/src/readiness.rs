//! What the backend waits for, and its probes.
//!
//! The backend starts in any order with its dependencies: it listens at
//! once, then waits, retrying with backoff, for the database (connected,
//! schema and migrations done), for Redis (answering, not `LOADING`), and
//! for the sales declared in the file to be preheated. Meanwhile every API
//! route answers `503 unavailable`, and:
//!
//! - `GET /live` (order listener): 200 while the process runs, whatever
//!   its dependencies do: a backend waiting for Redis is alive.
//! - `GET /ready` (order listener): 200 once the database and Redis answer
//!   and the declared sales are preheated, else 503; the JSON body names
//!   each dependency's state and what is awaited.
//!
//! After start, [`monitor`] keeps checking both dependencies, so readiness
//! flips back while Redis reloads or the database restarts, and the
//! background loops pause (see [`Readiness::dependencies_ready`]) instead of
//! logging one failure per pass.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashgate_common::backoff::Backoff;
use flashgate_common::dependency::{ping_redis, DepState, Dependency};
use flashgate_common::redis_conn::RedisHandle;
use tokio::sync::watch;

use crate::store::{Store, StoreError};

/// How often a healthy dependency is checked again.
const HEALTHY_CHECK: Duration = Duration::from_secs(1);

/// The backend's dependencies; cheap to clone.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    database: Dependency,
    redis: Dependency,
    /// The sales declared in the file, written to the database and preheated.
    sales: Dependency,
}

impl Default for Readiness {
    fn default() -> Self {
        Self(Arc::new(Inner {
            database: Dependency::new("database"),
            redis: Dependency::new("redis"),
            sales: Dependency::new("configured sales"),
        }))
    }
}

impl Readiness {
    pub fn database(&self) -> &Dependency {
        &self.0.database
    }

    pub fn redis(&self) -> &Dependency {
        &self.0.redis
    }

    pub fn sales(&self) -> &Dependency {
        &self.0.sales
    }

    /// Database and Redis answer: the background loops may run a pass.
    pub fn dependencies_ready(&self) -> bool {
        self.0.database.is_ready() && self.0.redis.is_ready()
    }

    /// Everything is up: what `GET /ready` answers 200 for.
    pub fn is_ready(&self) -> bool {
        self.dependencies_ready() && self.0.sales.is_ready()
    }

    /// Waits until the database and Redis answer; false if `shutdown` came first.
    pub async fn wait_dependencies(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        wait_until(|| self.dependencies_ready(), shutdown).await
    }

    /// Waits until the database answers (for loops that need nothing else,
    /// such as the order events deliverer); false if `shutdown` came first.
    pub async fn wait_database(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        wait_until(|| self.0.database.is_ready(), shutdown).await
    }

    fn report(&self) -> serde_json::Value {
        let deps = [&self.0.database, &self.0.redis, &self.0.sales];
        let waiting: Vec<&str> = deps
            .iter()
            .filter(|d| !d.is_ready())
            .map(|d| d.name())
            .collect();
        serde_json::json!({
            "ready": waiting.is_empty(),
            "waiting_for": waiting,
            "database": self.0.database.state().as_str(),
            "redis": self.0.redis.state().as_str(),
            "sales": self.0.sales.state().as_str(),
        })
    }
}

/// Polls `ready` until it holds; false if `shutdown` came first.
async fn wait_until(ready: impl Fn() -> bool, shutdown: &mut watch::Receiver<bool>) -> bool {
    while !ready() {
        if sleep_or_stop(Duration::from_millis(100), shutdown).await {
            return false;
        }
    }
    true
}

/// What a failed database connection says about the database.
pub fn store_state(error: &StoreError) -> DepState {
    match error {
        StoreError::Connect(_) => DepState::Unreachable,
        _ => DepState::Failing,
    }
}

/// `GET /live`: the process runs.
pub async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "alive"}))
}

/// `GET /ready`: 200 when ready, else 503; the body says what is awaited.
pub async fn ready(State(readiness): State<Readiness>) -> Response {
    let status = if readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness.report())).into_response()
}

/// Sleeps `wait`; true if `shutdown` turned true first.
pub async fn sleep_or_stop(wait: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(wait) => false,
        _ = shutdown.wait_for(|s| *s) => true,
    };
    stopped || *shutdown.borrow()
}

/// Checks the database and Redis until `shutdown`: every second while both
/// answer, with backoff while one does not.
pub async fn monitor(
    readiness: Readiness,
    store: Store,
    redis: RedisHandle,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    loop {
        // Side by side: a database ping waiting out its timeout in an
        // outage must not hold back what Redis says.
        let mut conn = redis.clone();
        let (database, redis_ping) = tokio::join!(store.ping(), ping_redis(&mut conn));
        if database {
            readiness.database().ready();
        } else {
            readiness
                .database()
                .observe(DepState::Unreachable, "the database does not answer");
        }
        match redis_ping {
            Ok(()) => readiness.redis().ready(),
            Err(error) => readiness.redis().redis_failed(&error),
        }
        let wait = if readiness.dependencies_ready() {
            backoff.reset();
            HEALTHY_CHECK
        } else {
            backoff.next_wait()
        };
        if sleep_or_stop(wait, &mut shutdown).await {
            return;
        }
    }
}
