//! Test support: a real `redis-server` of the test's own (the one in
//! `flashgate-testkit`, on a port no other test holds), killed when
//! dropped, and a wall clock the test moves.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use flashgate_testkit::master_replid;
pub use flashgate_testkit::RedisServer;

use super::WallClock;

/// A clock that moves only when told; clones share the time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn at(now_ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(now_ms)))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::Relaxed);
    }
}

impl WallClock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}
