//! A circuit breaker on Redis.
//!
//! After `failures` consecutive errors or timeouts it opens: for `cooldown`
//! every Redis-bound request gets `503 unavailable` at once instead of
//! waiting out a timeout, which keeps a struggling Redis from being buried
//! and the gateway's connections from piling up. Then one request is let
//! through as a probe: success closes the breaker, failure opens it again.
//!
//! Time comes from a governor [`Clock`]: the monotonic [`QuantaClock`] in
//! production (the limiters' clock; a read costs a few nanoseconds), a
//! `FakeRelativeClock` in tests, which drive the cooldown without sleeping.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, QuantaClock, Reference};
use governor::nanos::Nanos;

pub struct Breaker<C: Clock = QuantaClock> {
    threshold: u32,
    cooldown: Nanos,
    failures: AtomicU32,
    /// 0 when closed; else when the cooldown ends, in nanoseconds since
    /// `start` (at least 1).
    open_until: AtomicU64,
    probing: AtomicBool,
    clock: C,
    start: C::Instant,
}

/// The breaker's position, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self::with_clock(threshold, cooldown, QuantaClock::default())
    }
}

impl<C: Clock> Breaker<C> {
    /// A breaker on `clock`.
    pub fn with_clock(threshold: u32, cooldown: Duration, clock: C) -> Self {
        let start = clock.now();
        Self {
            threshold: threshold.max(1),
            cooldown: cooldown.into(),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            clock,
            start,
        }
    }

    /// Nanoseconds since the breaker was built.
    fn elapsed(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_u64()
    }

    pub fn state(&self) -> BreakerState {
        match self.open_until.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            until if self.elapsed() < until => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether a request may go to Redis now: a permit to report its
    /// outcome with, or `None` while open (or while another probe runs).
    pub fn allow(&self) -> Option<Permit<'_, C>> {
        let probe = match self.state() {
            BreakerState::Closed => false,
            BreakerState::Open => return None,
            // One probe at a time.
            BreakerState::HalfOpen => {
                if self
                    .probing
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return None;
                }
                true
            }
        };
        Some(Permit {
            breaker: self,
            probe,
        })
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("redis circuit closed");
        }
        self.probing.store(false, Ordering::Release);
    }

    fn failure(&self) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let was_probe = self.probing.swap(false, Ordering::AcqRel);
        if failures >= self.threshold || was_probe {
            let until = (self.elapsed() + self.cooldown.as_u64()).max(1);
            if self.open_until.swap(until, Ordering::AcqRel) == 0 {
                tracing::warn!(failures, "redis circuit opened");
            }
        }
    }
}

/// One call let through by [`Breaker::allow`]; report its outcome with
/// [`Permit::success`] or [`Permit::failure`].
///
/// A call whose future is dropped before it finishes (the client went away
/// mid-call) reports nothing; if it was the half-open probe, dropping the
/// permit lets the next call probe, else the breaker would stay half-open
/// refusing every call.
#[must_use = "report the call's outcome"]
pub struct Permit<'a, C: Clock = QuantaClock> {
    breaker: &'a Breaker<C>,
    probe: bool,
}

impl<C: Clock> Permit<'_, C> {
    pub fn success(mut self) {
        self.probe = false;
        self.breaker.success();
    }

    pub fn failure(mut self) {
        self.probe = false;
        self.breaker.failure();
    }
}

impl<C: Clock> Drop for Permit<'_, C> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use governor::clock::FakeRelativeClock;

    fn fail<C: Clock>(b: &Breaker<C>) {
        b.allow().expect("let through").failure();
    }

    #[test]
    fn opens_after_threshold_failures_and_a_successful_probe_closes_it() {
        let b = Breaker::new(3, Duration::from_millis(0));
        fail(&b);
        fail(&b);
        assert_eq!(b.state(), BreakerState::Closed);
        fail(&b);
        // Zero cooldown: immediately half-open, one probe allowed.
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let probe = b.allow().expect("a probe");
        assert!(b.allow().is_none(), "only one probe at a time");
        probe.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow().is_some());
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let b = Breaker::new(1, Duration::from_secs(60));
        fail(&b);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.allow().is_none());
    }

    #[test]
    fn a_probe_dropped_without_an_outcome_lets_the_next_call_probe() {
        let b = Breaker::new(1, Duration::from_millis(0));
        fail(&b);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let probe = b.allow().expect("a probe");
        assert!(b.allow().is_none(), "only one probe at a time");
        // The call was cancelled (its client went away mid-call).
        drop(probe);
        let next = b.allow().expect("the next call probes");
        next.success();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_dropped_call_while_closed_changes_nothing() {
        let b = Breaker::new(1, Duration::from_secs(60));
        drop(b.allow().expect("closed"));
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow().is_some());
    }

    #[test]
    fn it_half_opens_once_the_cooldown_has_elapsed_on_its_clock() {
        let clock = FakeRelativeClock::default();
        let b = Breaker::with_clock(2, Duration::from_secs(5), clock.clone());
        fail(&b);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "one failure is under the threshold"
        );
        fail(&b);
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(Duration::from_millis(4_999));
        assert!(b.allow().is_none(), "still cooling down");
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        // The probe fails: a full cooldown again, from now.
        b.allow().expect("a probe").failure();
        assert_eq!(b.state(), BreakerState::Open);
        clock.advance(Duration::from_secs(5));
        b.allow().expect("a probe").success();
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
