//! Live reload of limits and deny lists when the config file changes.
//!
//! The file's modification time is checked every second. A new version is
//! validated in full; a bad one is logged and the running settings stay.
//! Limiters are rebuilt only when the limits changed (rebuilding resets
//! every bucket). Other sections (listeners, Redis, backend) apply at the
//! next restart, and the log says so.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use flashgate_common::config::Config;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tracing::{info, warn};

use crate::admission::Edge;
use crate::limits::Limiters;

pub struct ConfigWatcher {
    pub path: PathBuf,
    pub edge: Arc<ArcSwap<Edge>>,
    pub interval: Duration,
}

impl ConfigWatcher {
    fn modified(&self) -> Option<SystemTime> {
        std::fs::metadata(&self.path).and_then(|m| m.modified()).ok()
    }

    /// Loads the file and swaps in its limits and deny lists.
    pub fn reload(&self) {
        let config = match Config::load(&self.path) {
            Ok(c) => c,
            Err(error) => {
                warn!(%error, path = %self.path.display(), "config reload rejected; keeping the running settings");
                return;
            }
        };
        let current = self.edge.load();
        let limits_changed = current.limits != config.limits;
        // Keep the running buckets when only the deny lists changed.
        let limiters = if limits_changed { Arc::new(Limiters::new(&config.limits)) } else { current.limiters.clone() };
        self.edge.store(Arc::new(Edge::with_limiters(&config, limiters)));
        info!(limits_changed, "config reloaded: limits and deny lists applied; other sections apply at restart");
    }
}

#[async_trait]
impl BackgroundService for ConfigWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut seen = self.modified();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            let now = self.modified();
            if now != seen {
                seen = now;
                self.reload();
            }
        }
    }
}
