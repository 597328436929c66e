//! What every layer stands on: the Redis client and its circuit breaker,
//! the order backend's client, readiness, metrics, the clock, the runtime
//! directory, and the [`Task`] every long-running task implements. It
//! imports no other layer.

mod breaker;
mod clock;
mod metrics;
mod orders;
mod readiness;
mod redis_client;
mod runtime_dir;
mod task;
#[cfg(test)]
mod testing;

pub use breaker::{Breaker, BreakerState};
pub use clock::{SystemClock, WallClock};
pub(crate) use metrics::BATCH_SIZE_BUCKETS;
pub use metrics::{Metrics, RouteKind};
pub use orders::{BackendError, OrderClient};
pub use readiness::{DependencyWatcher, Readiness};
pub use redis_client::{RedisClient, RedisError};
pub use runtime_dir::{prepare as prepare_runtime_dir, RuntimePaths};
pub use task::{Shutdown, Task};
#[cfg(test)]
pub(crate) use testing::{master_replid, ManualClock, RedisServer};
