//! Wall-clock time for the buy rules, behind a trait so a test can set it.
//!
//! The buy path compares the time with sale windows (epoch milliseconds,
//! as the backend writes them). Production uses [`SystemClock`], a
//! zero-sized type whose call inlines to `now_ms()`; tests use a clock
//! they move (`testing::ManualClock`). The monotonic clocks of the limiters and the circuit
//! breaker are governor's [`governor::clock::Clock`] instead
//! (`FakeRelativeClock` in tests).

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
