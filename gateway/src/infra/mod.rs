//! What every layer stands on: the Redis client and its circuit breaker,
//! the order backend's client, readiness, metrics, the clock, the runtime
//! directory, and the [`task::Task`] every long-running task implements.

pub mod breaker;
pub mod clock;
pub mod metrics;
pub mod orders;
pub mod readiness;
pub mod redis_client;
pub mod runtime_dir;
pub mod task;
#[cfg(test)]
pub(crate) mod testing;
