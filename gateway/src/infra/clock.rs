//! Wall-clock time for the buy rules, behind a trait so a test can set it.
//!
//! The buy path compares the time with sale windows (epoch milliseconds,
//! as the backend writes them). Production uses [`SystemClock`], a
//! zero-sized type whose call inlines to `now_ms()`; tests use
//! [`ManualClock`]. The monotonic clocks of the limiters and the circuit
//! breaker are governor's [`governor::clock::Clock`] instead
//! (`FakeRelativeClock` in tests).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The time, in milliseconds since the Unix epoch.
pub trait WallClock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    #[inline]
    fn now_ms(&self) -> i64 {
        flashgate_common::now_ms()
    }
}

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
