//! Capped exponential backoff with jitter, for waiting on a dependency.
//!
//! Every process retries what it depends on (Redis, the database, the
//! backend) with this: the wait doubles from `base` up to `cap`, and each
//! wait is drawn between half and all of that step, so many processes
//! started together (or a fleet of gateways after a Redis restart) do not
//! knock on the dependency in lockstep.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The wait before the next attempt; [`Backoff::reset`] after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
    /// Seeds the jitter; `RandomState` is randomly keyed per process.
    random: RandomState,
}

impl Backoff {
    /// Waits growing from `base` to at most `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            failures: 0,
            random: RandomState::new(),
        }
    }

    /// The wait before the next attempt, between half and all of
    /// `min(cap, base * 2^failures)`.
    pub fn next_wait(&mut self) -> Duration {
        let step = self
            .base
            .saturating_mul(1u32 << self.failures.min(16))
            .min(self.cap);
        self.failures = self.failures.saturating_add(1);
        let mut hasher = self.random.build_hasher();
        hasher.write_u32(self.failures);
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        let fraction = (hasher.finish() % 1000) as u32;
        step / 2 + (step / 2) * fraction / 1000
    }

    /// Back to `base` (after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

impl Default for Backoff {
    /// 100 ms up to 2 s: a dependency that comes back is seen within about
    /// two seconds, and a waiting process costs it at most a few calls a second.
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_stay_within_their_jitter_band() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let steps = [100, 200, 400, 800, 1000, 1000, 1000];
        for step in steps {
            let wait = b.next_wait();
            let step = Duration::from_millis(step);
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }

    #[test]
    fn many_failures_never_overflow() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        for _ in 0..100 {
            assert!(b.next_wait() <= Duration::from_secs(5));
        }
    }
}
