//! Live reload of limits and deny lists when the config file changes, and
//! of everything the gateway reloads on SIGHUP.
//!
//! The file's modification time is checked every second. A new version is
//! validated in full; a bad one is logged and the running settings stay.
//! Limiters are rebuilt only when the limits changed (rebuilding resets
//! every bucket). Other sections (listeners, Redis, backend) apply at the
//! next restart, and the log says so.
//!
//! SIGHUP (`systemctl reload`, as nginx users expect) asks every watcher
//! to reload at once rather than at its next check: this one re-reads the
//! config file even if its modification time is unchanged, the TLS
//! certificate watcher and the static pages watcher compare their files.
//! [`Hangup`] listens for the signal (Pingora handles only SIGTERM, SIGINT
//! and SIGQUIT; without a handler SIGHUP would end the process) and counts
//! it into a channel each watcher follows through [`ReloadRequests`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use flashgate_common::config::Config;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::admission::limits::Limiters;
use crate::admission::Edge;
use crate::infra::{Shutdown, Task};

/// Listens for SIGHUP and asks every watcher to reload.
pub struct Hangup {
    asked: watch::Sender<u64>,
}

impl Hangup {
    /// The listener, and the requests the watchers follow.
    pub fn new() -> (Self, ReloadRequests) {
        let (asked, requests) = watch::channel(0);
        (Self { asked }, ReloadRequests(requests))
    }
}

#[async_trait]
impl Task for Hangup {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(error) => {
                warn!(%error, "cannot listen for SIGHUP; files are still reloaded when they change");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = hangups.recv() => {
                    info!("SIGHUP: reloading the config file, TLS certificates and static files");
                    self.asked.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
        }
    }
}

/// A watcher's view of the reloads SIGHUP asked for.
#[derive(Clone, Debug)]
pub struct ReloadRequests(watch::Receiver<u64>);

impl ReloadRequests {
    /// Waits for the next request; forever once none can come.
    pub async fn next(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

pub struct ConfigWatcher {
    pub path: PathBuf,
    pub edge: Arc<ArcSwap<Edge>>,
    pub interval: Duration,
    /// SIGHUP: re-read the file now, changed or not.
    pub requests: ReloadRequests,
}

impl ConfigWatcher {
    fn modified(&self) -> Option<SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
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
        let limiters = if limits_changed {
            Arc::new(Limiters::new(&config.limits))
        } else {
            current.limiters.clone()
        };
        self.edge
            .store(Arc::new(Edge::with_limiters(&config, limiters)));
        info!(
            limits_changed,
            "config reloaded: limits and deny lists applied; other sections apply at restart"
        );
    }
}

#[async_trait]
impl Task for ConfigWatcher {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut seen = self.modified();
        let mut requests = self.requests.clone();
        loop {
            let asked = tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.interval) => false,
                _ = requests.next() => true,
            };
            let now = self.modified();
            if asked || now != seen {
                seen = now;
                self.reload();
            }
        }
    }
}
