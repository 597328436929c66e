//! What a process waits for, and how it tells.
//!
//! A process never gives up on a dependency (Redis, the database, the order
//! backend): it keeps serving what it can, retries with
//! [`crate::backoff::Backoff`], and records each check's outcome in a
//! [`Dependency`]. The readiness endpoints read these; the logs get one line
//! per change of state ("waiting for redis: loading", "redis is ready"), not
//! one per retry.

use std::fmt::Display;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::redis_conn::RedisHandle;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Where a dependency stands, as last checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DepState {
    /// Not checked yet.
    Starting = 0,
    /// Refused, timed out or cut: not there (yet).
    Unreachable = 1,
    /// Redis answered `LOADING`: it is reading its dataset; not yet.
    Loading = 2,
    /// It answered with an error.
    Failing = 3,
    Ready = 4,
}

impl DepState {
    /// The name readiness endpoints and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            DepState::Starting => "starting",
            DepState::Unreachable => "unreachable",
            DepState::Loading => "loading",
            DepState::Failing => "failing",
            DepState::Ready => "ready",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => DepState::Unreachable,
            2 => DepState::Loading,
            3 => DepState::Failing,
            4 => DepState::Ready,
            _ => DepState::Starting,
        }
    }
}

/// One dependency's last known state; shared between the task that checks
/// it and the readiness endpoint.
#[derive(Debug)]
pub struct Dependency {
    name: &'static str,
    state: AtomicU8,
}

impl Dependency {
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            state: AtomicU8::new(DepState::Starting as u8),
        }
    }

    /// One assumed to answer until a call to it fails: for a loop that
    /// logs its failures once per change, where the first success says
    /// nothing new.
    pub const fn assumed_ready(name: &'static str) -> Self {
        Self {
            name,
            state: AtomicU8::new(DepState::Ready as u8),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn state(&self) -> DepState {
        DepState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn is_ready(&self) -> bool {
        self.state() == DepState::Ready
    }

    /// Records a check's outcome; logs only when the state changes.
    pub fn observe(&self, state: DepState, detail: impl Display) {
        let before = DepState::from_u8(self.state.swap(state as u8, Ordering::AcqRel));
        if before == state {
            return;
        }
        let name = self.name;
        match state {
            DepState::Ready => {
                tracing::info!(dependency = name, was = before.as_str(), "{name} is ready")
            }
            _ => {
                tracing::warn!(dependency = name, state = state.as_str(), %detail, "waiting for {name}: {}", state.as_str())
            }
        }
    }

    /// Records a successful check.
    pub fn ready(&self) {
        self.observe(DepState::Ready, "");
    }

    /// Records a failed Redis call, telling loading from absent.
    pub fn redis_failed(&self, error: &RedisError) {
        self.observe(redis_state(error), error);
    }
}

/// What a failed Redis call says about Redis: `LOADING` is "not yet", a
/// refused or cut connection is "not there".
pub fn redis_state(error: &RedisError) -> DepState {
    if error.kind() == ErrorKind::Server(ServerErrorKind::BusyLoading) {
        DepState::Loading
    } else if error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
    {
        DepState::Unreachable
    } else {
        DepState::Failing
    }
}

/// `PING`: answers `Ok` only when Redis serves commands (not while it
/// loads); on a cluster, only when every master does (a dead replica does
/// not make a process unready, a master without a successor does).
///
/// # Errors
/// Redis is unreachable, loading, or failing.
pub async fn ping_redis(conn: &mut RedisHandle) -> Result<(), RedisError> {
    conn.ping().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loading_answer_is_not_yet_and_a_refused_connection_is_absent() {
        let loading =
            RedisError::from((ErrorKind::Server(ServerErrorKind::BusyLoading), "loading"));
        assert_eq!(redis_state(&loading), DepState::Loading);
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(redis_state(&refused), DepState::Unreachable);
    }

    #[test]
    fn the_state_follows_the_last_check() {
        let d = Dependency::new("redis");
        assert_eq!(d.state(), DepState::Starting);
        d.observe(DepState::Loading, "x");
        assert!(!d.is_ready());
        d.ready();
        assert!(d.is_ready());
    }
}
