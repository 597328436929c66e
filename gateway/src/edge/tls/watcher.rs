//! Reloads the listener's certificates when their files change.
//!
//! Every `gateway.tls.reload_interval_ms`, and at once on SIGHUP
//! ([`crate::admission::Hangup`]), the files are read and compared with what
//! was loaded. On a change the whole set is loaded and checked
//! again, then swapped in: handshakes from then on use it, connections
//! already open keep theirs (a certificate only matters in a handshake).
//! A set that fails to load (unreadable file, key not matching its
//! certificate, e.g. half-way through a rotation; a leaf outside its
//! validity window; a chain out of order) is logged and counted
//! (`flashgate_tls_reloads_total{result="error"}`), the running set stays,
//! and the next change is tried again; `flashgate_tls_reload_failing` is 1
//! until then. The set in use also sets
//! `flashgate_tls_certificate_expiry_timestamp_seconds`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use flashgate_common::config::TlsConfig;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{IntCounterVec, IntGauge};
use tracing::{info, warn};

use super::certs::{read_all, FileBytes};
use super::CertSet;
use crate::admission::ReloadRequests;

pub struct CertWatcher {
    pub config: TlsConfig,
    pub certs: Arc<ArcSwap<CertSet>>,
    /// `flashgate_tls_reloads_total{result}`.
    pub reloads: IntCounterVec,
    /// `flashgate_tls_certificate_expiry_timestamp_seconds`, of the set in use.
    pub expiry: IntGauge,
    /// `flashgate_tls_reload_failing`: 1 from a failed try until the files
    /// load (or are back to those in use).
    pub failing: IntGauge,
    /// SIGHUP: compare the files now, not at the next interval.
    pub requests: ReloadRequests,
}

/// What one check of the files did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The files are those of the running set, or of the last failed try.
    Unchanged,
    /// A new set is in use.
    Swapped,
    /// The new files cannot be used; the running set stays.
    Failed,
}

impl CertWatcher {
    /// Checks the files once. `failed` holds the bytes of the last attempt
    /// that failed, so a broken file is logged and counted once, not at
    /// every check; it is tried again as soon as any file changes.
    pub fn check(&self, failed: &mut Option<FileBytes>) -> Reload {
        let result = self.try_reload(failed);
        self.failing.set(i64::from(failed.is_some()));
        result
    }

    fn try_reload(&self, failed: &mut Option<FileBytes>) -> Reload {
        let now = match read_all(&self.config) {
            Ok(now) => now,
            Err(error) => {
                // A file being replaced (gone for an instant) or unreadable.
                if failed.is_some() {
                    return Reload::Unchanged;
                }
                warn!(%error, "TLS certificate reload failed; keeping the running certificates");
                self.reloads.with_label_values(&["error"]).inc();
                *failed = Some(Vec::new());
                return Reload::Failed;
            }
        };
        if now == self.certs.load().loaded_from {
            *failed = None;
            return Reload::Unchanged;
        }
        if failed.as_ref() == Some(&now) {
            return Reload::Unchanged;
        }
        match CertSet::from_bytes(&self.config, now.clone()) {
            Ok(set) => {
                info!(default = ?set.default_names(), sni = ?set.sni_names(), "TLS certificates reloaded");
                self.expiry.set(set.earliest_expiry_unix());
                self.certs.store(Arc::new(set));
                self.reloads.with_label_values(&["ok"]).inc();
                *failed = None;
                Reload::Swapped
            }
            Err(error) => {
                warn!(%error, "TLS certificate reload failed; keeping the running certificates");
                self.reloads.with_label_values(&["error"]).inc();
                *failed = Some(now);
                Reload::Failed
            }
        }
    }
}

#[async_trait]
impl BackgroundService for CertWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        self.expiry.set(self.certs.load().earliest_expiry_unix());
        let mut failed = None;
        let mut requests = self.requests.clone();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.config.reload_interval) => {}
                _ = requests.next() => {}
            }
            self.check(&mut failed);
        }
    }
}
