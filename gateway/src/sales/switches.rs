//! Degrade switches: sales paused without a restart.
//!
//! - **Global switch**: `fg:switch` = `paused` in Redis stops every buy on
//!   every gateway (`503 paused`); set by the admin API and announced on the
//!   events channel, and re-read by every gateway every
//!   `gateway.backlog_check_ms` in case an announcement was missed. The
//!   backend keeps it in its database and writes it into Redis on every
//!   restore pass. A gateway starts with the switch **paused** and opens
//!   only once it has read the key (or heard an announcement): a gateway
//!   started during an outage, while Redis has no switch yet, must not sell
//!   what the recorded switch may stop. Afterwards, while the key is absent
//!   it keeps the value it had.
//! - **Backlog pause**: when a sale's backlog (stream entries not yet read
//!   by the backend plus those read but not yet acknowledged, which
//!   includes about wins/s × `backend.forward_grace_ms` entries the backend
//!   holds while the forward writes them) exceeds
//!   `gateway.backlog_pause_threshold`, this gateway
//!   pauses the sale until the backlog drains below half the threshold, so
//!   a struggling database is not buried under more winners than it can
//!   write. Each gateway decides alone from the same Redis numbers.
//!   Archived sales (finished, everything written; `fg:archived`) are not
//!   polled.
//! - Per-sale pause by an operator is the sale's `paused` field, enforced by
//!   the deduct script itself.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use flashgate_common::config::RedisConfig;
use flashgate_common::keys::{buckets_in_redis, ARCHIVED_SALES, GLOBAL_SWITCH, SALES_INDEX};
use flashgate_common::redis_conn::RedisHandle;
use flashgate_common::stream_info::{sale_backlogs, Backlog};
use tracing::{info, warn};

use crate::infra::{Shutdown, Task};

pub struct Switches {
    /// True until the switch was read once, then its value.
    all_paused: AtomicBool,
    /// The sales paused by their backlog, read by every buy: a snapshot
    /// swapped whole by the poller, so a read takes no lock that the other
    /// threads' reads contend on.
    backlog_paused: ArcSwap<HashSet<String>>,
    /// Serialises the poller's changes to `backlog_paused`.
    backlog_write: Mutex<()>,
}

impl Default for Switches {
    /// Paused until the switch is known.
    fn default() -> Self {
        Self {
            all_paused: AtomicBool::new(true),
            backlog_paused: ArcSwap::default(),
            backlog_write: Mutex::default(),
        }
    }
}

impl Switches {
    pub fn all_paused(&self) -> bool {
        self.all_paused.load(Ordering::Relaxed)
    }

    pub fn set_all_paused(&self, paused: bool) {
        if self.all_paused.swap(paused, Ordering::Relaxed) != paused {
            info!(paused, "global sale switch changed");
        }
    }

    /// Applies the switch as read from Redis: `None` (absent) keeps the
    /// current value, paused at start.
    fn observe(&self, switch: Option<&str>) {
        if let Some(switch) = switch {
            self.set_all_paused(switch == "paused");
        }
    }

    pub fn backlog_paused(&self, sale_id: &str) -> bool {
        self.backlog_paused.load().contains(sale_id)
    }

    /// Applies a sale's backlog to its pause flag, with hysteresis: pause
    /// above `threshold`, resume below half of it.
    fn apply_backlog(&self, sale_id: &str, backlog: u64, threshold: u64) {
        let _writer = self
            .backlog_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let paused = self.backlog_paused.load_full();
        let pause = match paused.contains(sale_id) {
            false if backlog > threshold => true,
            true if backlog <= threshold / 2 => false,
            _ => return,
        };
        let mut set = HashSet::clone(&paused);
        if pause {
            set.insert(sale_id.to_owned());
            warn!(
                sale = sale_id,
                backlog, threshold, "sale paused: unpersisted reservation backlog too large"
            );
        } else {
            set.remove(sale_id);
            info!(sale = sale_id, backlog, "sale resumed: backlog drained");
        }
        self.backlog_paused.store(Arc::new(set));
    }
}

/// Polls the global switch and every sale's backlog.
pub struct SwitchWatcher {
    /// Polled on a connection of its own, in the configured `redis.mode`.
    pub redis: RedisConfig,
    pub switches: Arc<Switches>,
    /// 0 turns the backlog pause off.
    pub backlog_threshold: u64,
    pub interval: Duration,
    pub timeout: Duration,
}

impl SwitchWatcher {
    async fn poll(&self, conn: &mut RedisHandle) -> redis::RedisResult<()> {
        let switch: Option<String> = redis::cmd("GET")
            .arg(GLOBAL_SWITCH)
            .query_async(conn)
            .await?;
        // Absent means a Redis that restarted empty: keep what we know (paused
        // at start) until the backend puts the recorded switch back.
        self.switches.observe(switch.as_deref());
        if self.backlog_threshold == 0 {
            return Ok(());
        }
        // Two reads however many sales; an archived sale has nothing left
        // to write, so its backlog is not read.
        let (sales, archived): (Vec<String>, HashSet<String>) = redis::pipe()
            .smembers(SALES_INDEX)
            .smembers(ARCHIVED_SALES)
            .query_async(conn)
            .await?;
        for sale in &archived {
            self.switches.apply_backlog(sale, 0, self.backlog_threshold);
        }
        for sale in sales.into_iter().filter(|s| !archived.contains(s)) {
            // A bucketed sale's reservations wait in its buckets' streams.
            let buckets = buckets_in_redis(conn, &sale).await?;
            let backlog: i64 = sale_backlogs(conn, &sale, buckets)
                .await?
                .iter()
                .map(Backlog::unpersisted)
                .sum();
            self.switches
                .apply_backlog(&sale, backlog.max(0) as u64, self.backlog_threshold);
        }
        Ok(())
    }
}

#[async_trait]
impl Task for SwitchWatcher {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut conn = None;
        // The first read at once: until it finds the switch, buys are paused.
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(self.interval) => {}
                }
            }
            first = false;
            if conn.is_none() {
                conn = RedisHandle::dedicated(&self.redis, self.timeout, self.timeout)
                    .await
                    .ok();
            }
            let Some(c) = conn.as_mut() else { continue };
            if let Err(error) = self.poll(c).await {
                tracing::debug!(%error, "switch poll failed");
                conn = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_sells_nothing_until_it_has_read_the_global_switch() {
        let s = Switches::default();
        assert!(s.all_paused(), "unknown switch: paused");
        s.observe(None);
        assert!(s.all_paused(), "still unknown while the key is absent");
        s.observe(Some("open"));
        assert!(!s.all_paused());
        s.observe(None);
        assert!(
            !s.all_paused(),
            "a known switch is kept while the key is absent"
        );
        s.observe(Some("paused"));
        assert!(s.all_paused());
    }

    #[test]
    fn backlog_pause_has_hysteresis() {
        let s = Switches::default();
        s.apply_backlog("a", 150, 100);
        assert!(s.backlog_paused("a"));
        s.apply_backlog("a", 80, 100);
        assert!(s.backlog_paused("a"), "still above half the threshold");
        s.apply_backlog("a", 50, 100);
        assert!(!s.backlog_paused("a"));
    }
}
