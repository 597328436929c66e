//! Order events to the shop: the deliverer that empties the outbox
//! ([`crate::store::outbox`]) into a signed webhook, an AMQP exchange, or
//! both (`[events]`; see docs/EVENTS.md).
//!
//! Layout:
//! - [`sign`]: the webhook signature and how a shop verifies it.
//! - [`webhook`]: one signed `POST` per event.
//! - [`amqp`]: one confirmed, persistent publish per event.
//! - [`tls`]: the roots a TLS destination is verified against (the
//!   system's and `events.ca_file`), and telling a failed handshake apart.
//! - this module: the loop. Each round claims the due events (at most one
//!   per order: the first one left of it, so event n+1 of an order is
//!   never sent before n was delivered), sends them to every destination
//!   that has not taken them yet (orders in parallel), deletes the
//!   delivered ones, and pushes the others back with capped exponential
//!   backoff and jitter, or marks them dead after `events.max_attempts`.
//!
//! Delivery is at least once: a backend killed after a send and before the
//! delete leaves the event claimed until its lease passes, and then it is
//! sent again, with the same id and body. The shop deduplicates by id.

pub mod amqp;
pub mod sign;
pub mod tls;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use flashgate_common::config::EventsConfig;
use flashgate_common::metrics::Registry;
use futures_util::StreamExt;
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, Opts};
use tokio::sync::watch;

use crate::store::outbox::{Failure, OutboxEvent};
use crate::store::{Store, StoreError};

/// Bit of [`OutboxEvent::sinks_done`] for the webhook.
const SINK_WEBHOOK: u8 = 1;
/// Bit of [`OutboxEvent::sinks_done`] for AMQP.
const SINK_AMQP: u8 = 2;
/// How often the backlog gauges are read from the database.
const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The deliverer's metrics (registered in [`crate::metrics::Metrics`]).
#[derive(Clone)]
pub struct EventMetrics {
    /// Events a destination took, by destination (`webhook`, `amqp`).
    pub delivered: IntCounterVec,
    /// Attempts a destination failed, by destination.
    pub failed_attempts: IntCounterVec,
    /// Events that became dead (gave up after `events.max_attempts`).
    pub dead_total: IntCounter,
    /// Dead events in the outbox now (`order_events_dead_in_outbox`: plain
    /// `order_events_dead` is the family of `dead_total` to an OpenMetrics
    /// scraper, which drops a counter's `_total`).
    pub dead: IntGauge,
    /// Events waiting to be delivered now.
    pub backlog: IntGauge,
    /// Age of the oldest event waiting, in seconds (0 when none waits).
    pub lag_seconds: Gauge,
}

impl EventMetrics {
    /// # Panics
    /// Only if a name is taken twice in `registry`, a programming error.
    pub fn register(registry: &Registry) -> Self {
        fn reg<M: prometheus::core::Collector + Clone + 'static>(
            registry: &Registry,
            m: prometheus::Result<M>,
        ) -> M {
            let m = m.expect("valid metric");
            registry
                .register(Box::new(m.clone()))
                .expect("unique metric");
            m
        }
        let by_sink = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["sink"]);
        Self {
            delivered: reg(
                registry,
                by_sink(
                    "order_events_delivered_total",
                    "Order events a destination took (sink: webhook, amqp).",
                ),
            ),
            failed_attempts: reg(
                registry,
                by_sink(
                    "order_events_failed_attempts_total",
                    "Order event deliveries that failed (sink: webhook, amqp).",
                ),
            ),
            dead_total: reg(
                registry,
                IntCounter::new(
                    "order_events_dead_total",
                    "Order events given up after events.max_attempts.",
                ),
            ),
            dead: reg(
                registry,
                IntGauge::new(
                    "order_events_dead_in_outbox",
                    "Dead order events in the outbox (see GET /admin/events/dead).",
                ),
            ),
            backlog: reg(
                registry,
                IntGauge::new(
                    "order_events_backlog",
                    "Order events waiting in the outbox to be delivered.",
                ),
            ),
            lag_seconds: reg(
                registry,
                Gauge::new(
                    "order_events_lag_seconds",
                    "Age of the oldest order event waiting to be delivered.",
                ),
            ),
        }
    }
}

/// Why the deliverer cannot start.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error(transparent)]
    CaFile(#[from] tls::CaFileError),
    #[error("cannot build the webhook client: {}", tls::chain(.0))]
    Client(#[from] reqwest::Error),
}

/// The configured destinations, built before anything else starts (so a
/// bad `events.ca_file` stops the backend at once, not once the database
/// is up); nothing connects until the first delivery.
#[derive(Clone, Debug)]
pub struct Destinations {
    webhook: Option<webhook::Webhook>,
    amqp: Option<Arc<amqp::Amqp>>,
}

impl Destinations {
    /// Reads `events.ca_file` and builds a client per destination.
    ///
    /// # Errors
    /// [`EventsError`]: the CA file cannot be used, or the webhook client
    /// cannot be built.
    pub fn new(config: &EventsConfig) -> Result<Self, EventsError> {
        let roots = tls::extra_roots(config.ca_file.as_deref())?;
        if let (Some(roots), Some(path)) = (&roots, &config.ca_file) {
            tracing::info!(ca_file = %path.display(), certificates = roots.len(), "order events: trusting these CA certificates besides the system's");
        }
        let webhook = config
            .webhook
            .as_ref()
            .map(|c| webhook::Webhook::new(c, roots.as_ref()))
            .transpose()?;
        let amqp = config
            .amqp
            .clone()
            .map(|c| Arc::new(amqp::Amqp::new(c, roots.as_ref())));
        Ok(Self { webhook, amqp })
    }
}

/// Delivers the outbox to the configured destinations.
#[derive(Clone)]
pub struct Deliverer {
    store: Store,
    webhook: Option<webhook::Webhook>,
    amqp: Option<Arc<amqp::Amqp>>,
    config: EventsConfig,
    metrics: EventMetrics,
}

impl Deliverer {
    /// # Errors
    /// See [`Destinations::new`].
    pub fn new(
        store: Store,
        config: &EventsConfig,
        metrics: EventMetrics,
    ) -> Result<Self, EventsError> {
        Ok(Self::with_destinations(
            store,
            Destinations::new(config)?,
            config,
            metrics,
        ))
    }

    /// A deliverer to `destinations`, built beforehand from `config`.
    pub fn with_destinations(
        store: Store,
        destinations: Destinations,
        config: &EventsConfig,
        metrics: EventMetrics,
    ) -> Self {
        let Destinations { webhook, amqp } = destinations;
        Self {
            store,
            webhook,
            amqp,
            config: config.clone(),
            metrics,
        }
    }

    /// One round: claims the due events, sends them, records the outcomes.
    /// Answers how many events it claimed.
    ///
    /// # Errors
    /// The database failed to hand out events; what was sent stays sent
    /// and is sent again when its lease passes.
    pub async fn deliver_once(&self) -> Result<usize, StoreError> {
        // A claim token of its own per round: the rows it claims are read
        // back by it.
        let owner = format!("d-{}", uuid::Uuid::new_v4().simple());
        let lease = i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX);
        let claimed_at = flashgate_common::now_ms();
        let events = self
            .store
            .outbox()
            .claim(&owner, claimed_at, lease, i64::from(self.config.batch_size))
            .await?;
        let claimed = events.len();
        // The whole batch at once: no event waits behind another while its
        // lease runs (the lease is validated against one delivery).
        let lease_ends_ms = claimed_at.saturating_add(lease);
        let concurrency = claimed.max(1);
        let owner = owner.as_str();
        let warned = &TlsWarnings::default();
        futures_util::stream::iter(events)
            .for_each_concurrent(concurrency, |event| async move {
                if self.lease_left_for_a_delivery(lease_ends_ms) {
                    self.deliver(event, owner, warned).await;
                } else {
                    // The claim itself was slow: what is left of the lease
                    // might run out mid-send and let another backend send
                    // it too. Left claimed; taken again when the lease ends.
                    tracing::warn!(event = %event.event_id, "order event lease too short to send it now; it waits for the next lease");
                }
            })
            .await;
        Ok(claimed)
    }

    /// Whether a lease ending at `lease_ends_ms` covers one full delivery:
    /// a send to each destination in turn, each bounded by its timeout,
    /// and one more timeout for the database.
    fn lease_left_for_a_delivery(&self, lease_ends_ms: i64) -> bool {
        let timeouts = self
            .webhook
            .iter()
            .map(|w| w.timeout())
            .chain(self.amqp.iter().map(|a| a.timeout()));
        let longest = timeouts.clone().max().unwrap_or_default();
        let needed = timeouts.sum::<Duration>() + longest;
        let needed_ms = i64::try_from(needed.as_millis()).unwrap_or(i64::MAX);
        flashgate_common::now_ms().saturating_add(needed_ms) <= lease_ends_ms
    }

    /// Sends one claimed event everywhere it has not gone yet, then deletes
    /// it or records the failure.
    async fn deliver(&self, event: OutboxEvent, owner: &str, warned: &TlsWarnings) {
        let mut done = event.sinks_done;
        let mut errors: Vec<String> = Vec::new();
        if let Some(webhook) = self.webhook.as_ref().filter(|_| done & SINK_WEBHOOK == 0) {
            match webhook.send(&event).await {
                Ok(()) => {
                    done |= SINK_WEBHOOK;
                    self.metrics.delivered.with_label_values(&["webhook"]).inc();
                }
                Err(e) => {
                    self.metrics
                        .failed_attempts
                        .with_label_values(&["webhook"])
                        .inc();
                    if e.is_tls() && warned.first(SINK_WEBHOOK) {
                        tls_failure_warning("webhook", &event, &e);
                    }
                    errors.push(e.to_string());
                }
            }
        }
        if let Some(amqp) = self.amqp.as_ref().filter(|_| done & SINK_AMQP == 0) {
            match amqp.send(&event).await {
                Ok(()) => {
                    done |= SINK_AMQP;
                    self.metrics.delivered.with_label_values(&["amqp"]).inc();
                }
                Err(e) => {
                    self.metrics
                        .failed_attempts
                        .with_label_values(&["amqp"])
                        .inc();
                    if e.is_tls() && warned.first(SINK_AMQP) {
                        tls_failure_warning("amqp", &event, &e);
                    }
                    errors.push(e.to_string());
                }
            }
        }
        if errors.is_empty() {
            if let Err(error) = self.store.outbox().delivered(&event.event_id).await {
                // Sent but still in the outbox: sent again once the lease
                // passes, with the same id.
                tracing::warn!(%error, event = %event.event_id, "order event delivered but not removed from the outbox");
            }
            return;
        }
        let attempts = event.attempts.saturating_add(1);
        let retry_at_ms = (attempts < self.config.max_attempts).then(|| {
            flashgate_common::now_ms()
                + backoff_ms(
                    self.config.backoff_initial,
                    self.config.backoff_max,
                    attempts,
                )
        });
        let error = errors.join("; ");
        let failure = Failure {
            attempts,
            sinks_done: done,
            error: &error,
            retry_at_ms,
        };
        match self
            .store
            .outbox()
            .failed(&event.event_id, owner, &failure)
            .await
        {
            Ok(true) if retry_at_ms.is_none() => {
                self.metrics.dead_total.inc();
                tracing::error!(event = %event.event_id, order = %event.order_id, kind = event.kind.as_str(), attempts, %error, "order event is dead: retry it with POST /admin/events/{{id}}/retry");
            }
            Ok(_) => {
                tracing::debug!(event = %event.event_id, attempts, %error, "order event delivery failed; will retry")
            }
            Err(db) => {
                tracing::warn!(error = %db, event = %event.event_id, "cannot record a failed order event delivery; the lease will expire")
            }
        }
    }

    /// Reads the backlog gauges.
    async fn refresh_stats(&self) {
        match self.store.outbox().stats().await {
            Ok(stats) => {
                self.metrics.backlog.set(stats.pending);
                self.metrics.dead.set(stats.dead);
                let age_ms = stats
                    .oldest_pending_ms
                    .map_or(0, |t| (flashgate_common::now_ms() - t).max(0));
                self.metrics.lag_seconds.set(age_ms as f64 / 1000.0);
            }
            Err(error) => tracing::debug!(%error, "cannot read the outbox backlog"),
        }
    }

    /// Delivers until `shutdown`: a full round goes again at once, else
    /// the next round waits `events.poll_ms`.
    pub async fn run(
        self,
        readiness: crate::readiness::Readiness,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut stats_at = tokio::time::Instant::now();
        loop {
            // The outbox is all it needs: Redis being away must not hold
            // back events already committed.
            if !readiness.wait_database(&mut shutdown).await {
                return;
            }
            let full = match self.deliver_once().await {
                Ok(n) => n >= self.config.batch_size as usize,
                Err(error) => {
                    tracing::warn!(%error, "cannot claim order events; will retry");
                    false
                }
            };
            if stats_at.elapsed() >= STATS_INTERVAL {
                self.refresh_stats().await;
                stats_at = tokio::time::Instant::now();
            }
            if *shutdown.borrow() {
                return;
            }
            if !full {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.poll) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
        }
    }
}

/// The destinations whose failed TLS handshake was logged as a warning
/// this round (bits of [`OutboxEvent::sinks_done`]): one warning per
/// destination per round, not one per event, so that a bad `ca_file`
/// with a full outbox does not flood the log (every failure still counts
/// in `order_events_failed_attempts_total` and lands in `last_error`).
#[derive(Default)]
struct TlsWarnings(std::sync::atomic::AtomicU8);

impl TlsWarnings {
    /// Whether this is the first TLS failure of `sink` this round.
    fn first(&self, sink: u8) -> bool {
        self.0.fetch_or(sink, std::sync::atomic::Ordering::Relaxed) & sink == 0
    }
}

/// A failed TLS handshake is logged as a warning (once per destination
/// per round; other failures only at debug until the event is dead): it
/// does not heal by itself like a shop that is down, it needs the
/// operator (a CA missing from `events.ca_file`, a certificate for another
/// name, or expired).
fn tls_failure_warning(sink: &'static str, event: &OutboxEvent, error: &dyn std::fmt::Display) {
    tracing::warn!(
        sink,
        event = %event.event_id,
        %error,
        "order event not delivered: the TLS handshake with the destination failed (its certificate must verify against the system's roots or events.ca_file); will retry (warned once per destination per delivery round)"
    );
}

/// The wait after the `attempts`-th failure: `initial` doubled per earlier
/// failure, at most `max`, drawn between half and all of that so failing
/// events spread out.
fn backoff_ms(initial: Duration, max: Duration, attempts: u32) -> i64 {
    let (initial, max) = (initial.as_millis() as u64, max.as_millis() as u64);
    let step = initial
        .saturating_mul(1_u64 << attempts.saturating_sub(1).min(40))
        .min(max);
    let wait = step / 2 + rand::random_range(0..=step / 2);
    i64::try_from(wait).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
