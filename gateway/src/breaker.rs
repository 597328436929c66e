//! A circuit breaker on Redis.
//!
//! After `failures` consecutive errors or timeouts it opens: for `cooldown`
//! every Redis-bound request gets `503 unavailable` at once instead of
//! waiting out a timeout, which keeps a struggling Redis from being buried
//! and the gateway's connections from piling up. Then one request is let
//! through as a probe: success closes the breaker, failure opens it again.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use flashgate_common::now_ms;

pub struct Breaker {
    threshold: u32,
    cooldown_ms: i64,
    failures: AtomicU32,
    /// 0 when closed; else when the cooldown ends.
    open_until_ms: AtomicI64,
    probing: AtomicBool,
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
        Self {
            threshold: threshold.max(1),
            cooldown_ms: cooldown.as_millis() as i64,
            failures: AtomicU32::new(0),
            open_until_ms: AtomicI64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub fn state(&self) -> BreakerState {
        match self.open_until_ms.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            until if now_ms() < until => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether a request may go to Redis now: a permit to report its
    /// outcome with, or `None` while open (or while another probe runs).
    pub fn allow(&self) -> Option<Permit<'_>> {
        let probe = match self.state() {
            BreakerState::Closed => false,
            BreakerState::Open => return None,
            // One probe at a time.
            BreakerState::HalfOpen => {
                if self.probing.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
                    return None;
                }
                true
            }
        };
        Some(Permit { breaker: self, probe })
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open_until_ms.swap(0, Ordering::AcqRel) != 0 {
            tracing::info!("redis circuit closed");
        }
        self.probing.store(false, Ordering::Release);
    }

    fn failure(&self) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let was_probe = self.probing.swap(false, Ordering::AcqRel);
        if failures >= self.threshold || was_probe {
            let until = now_ms() + self.cooldown_ms;
            if self.open_until_ms.swap(until, Ordering::AcqRel) == 0 {
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
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
}

impl Permit<'_> {
    pub fn success(mut self) {
        self.probe = false;
        self.breaker.success();
    }

    pub fn failure(mut self) {
        self.probe = false;
        self.breaker.failure();
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(b: &Breaker) {
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
}
