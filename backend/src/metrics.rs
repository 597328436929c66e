//! The backend's Prometheus metrics, served at `GET /metrics` on the order
//! listener (`backend.listen`; a private network).
//!
//! Counters are bumped where things happen (orders written, batches,
//! claims, dead letters). The per-sale gauges read from Redis (remaining
//! stock, backlog not yet acknowledged, stream lag) are refreshed by [`run_refresh`]
//! every [`REFRESH_INTERVAL`], for live (not archived) sales only, so a
//! scrape costs no Redis or database call at all however often it comes;
//! the reconcile drift is kept in memory by reconciliation.
//! The `sale` label is bounded by the number of sales, which operators
//! create; no user, order or reservation ids are labels.

use flashgate_common::metrics::Registry;
use flashgate_common::stream_info::Backlog;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    /// Order rows created, by the path that created them (forward, stream).
    pub orders_created: IntCounterVec,
    /// Reservations a path took through the whole write (hold, Redis
    /// check, insert) only to find their order made already by the other
    /// path: the work done twice, by the path that wasted it.
    pub orders_existing: IntCounterVec,
    /// Stream entries the consumer found written already by its one read
    /// per batch, and so did nothing more for.
    pub stream_already_written: IntCounter,
    /// Entries per stream batch written with one multi-row insert.
    pub batch_size: Histogram,
    /// Entries taken over from idle consumers with XAUTOCLAIM.
    pub claimed_entries: IntCounter,
    /// Entries moved to a dead-letter stream.
    pub dead_letters: IntCounter,
    /// Runs of `lua/trim.lua` by stream maintenance (the backend's only
    /// script that runs on a timer; the benchmark subtracts these from
    /// Redis's script calls to count one deduct per buy).
    pub trim_scripts: IntCounter,
    /// Runs of `lua/fence.lua` and `lua/resync.lua` by the recovery loop
    /// (one fence check per sale and pass, on a timer like the trims).
    pub fence_scripts: IntCounter,
    /// Operators' changes whose commit failed and whose definition could
    /// not be put back in Redis because more items were sold meanwhile
    /// than the database's stock: Redis then sells a stock the database
    /// does not hold, until an operator resolves it (docs/OPERATIONS.md).
    pub stock_reverts_refused: IntCounter,
    /// Orders cancelled by the payment timeout.
    pub orders_expired: IntCounter,
    /// Reservation lookups answered for gateways (`GET /internal/reservations/{rid}`).
    pub order_lookups: IntCounter,
    pub remaining: IntGaugeVec,
    pub backlog: IntGaugeVec,
    pub stream_lag: IntGaugeVec,
    pub drift: IntGaugeVec,
    /// Per bucket of a bucketed sale: items left (its `remaining` plus its
    /// items in open transfers out of it) and its stream's backlog, so a
    /// dashboard shows whether the load spreads and where items sit.
    pub bucket_remaining: IntGaugeVec,
    pub bucket_backlog: IntGaugeVec,
    /// Order events to the shop (`crate::events`).
    pub events: crate::events::EventMetrics,
}

impl Metrics {
    /// # Panics
    /// Only if two metrics share a name, a programming error the tests catch.
    pub fn register() -> Self {
        let registry = Registry::with_prefix("flashgate").expect("valid prefix");
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("valid metric");
                registry
                    .register(Box::new(m.clone()))
                    .expect("unique metric");
                m
            }};
        }
        let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["sale"]);
        Self {
            orders_created: reg!(IntCounterVec::new(
                Opts::new("backend_orders_created_total", "Order rows created, by source (forward, stream)."),
                &["source"]
            )),
            orders_existing: reg!(IntCounterVec::new(
                Opts::new(
                    "backend_orders_existing_total",
                    "Reservations written again only to find their order existing, by source (forward, stream)."
                ),
                &["source"]
            )),
            stream_already_written: reg!(IntCounter::new(
                "backend_stream_entries_already_written_total",
                "Stream entries whose order the consumer found written already (skipped with no write)."
            )),
            batch_size: reg!(Histogram::with_opts(
                HistogramOpts::new("backend_batch_size", "Stream entries per batch insert.")
                    .buckets(vec![1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0])
            )),
            claimed_entries: reg!(IntCounter::new(
                "backend_claimed_entries_total",
                "Stream entries taken over from idle consumers (XAUTOCLAIM)."
            )),
            dead_letters: reg!(IntCounter::new("backend_dead_letters_total", "Stream entries moved to a dead-letter stream.")),
            trim_scripts: reg!(IntCounter::new("backend_stream_trim_scripts_total", "Runs of the stream trim script by maintenance.")),
            fence_scripts: reg!(IntCounter::new(
                "backend_fence_scripts_total",
                "Runs of the fence check and re-sync scripts by the recovery loop."
            )),
            stock_reverts_refused: reg!(IntCounter::new(
                "backend_stock_reverts_refused_total",
                "Sale changes whose failed commit could not be undone in Redis (more items sold than the database's stock)."
            )),
            orders_expired: reg!(IntCounter::new("orders_expired_total", "Orders cancelled unpaid after the payment timeout.")),
            order_lookups: reg!(IntCounter::new(
                "backend_order_lookups_total",
                "Reservation order lookups asked by gateways (GET /internal/reservations/{rid})."
            )),
            remaining: reg!(gauge("sale_remaining_items", "Items left to sell, in Redis.")),
            backlog: reg!(gauge("sale_backlog_reservations", "Stream entries not yet acknowledged by the backend (lag + pending): about wins/s x backend.forward_grace_ms of them are held by design, most already written by the forward.")),
            stream_lag: reg!(gauge("backend_stream_lag_entries", "Stream entries not yet delivered to the consumer group.")),
            drift: reg!(gauge(
                "reconcile_stock_drift",
                "Sold in Redis minus live orders and in-flight reservations, at the last reconcile."
            )),
            bucket_remaining: reg!(IntGaugeVec::new(
                Opts::new(
                    "sale_bucket_remaining_items",
                    "Items left in one bucket of a bucketed sale, with its items in transit out of it."
                ),
                &["sale", "bucket"]
            )),
            bucket_backlog: reg!(IntGaugeVec::new(
                Opts::new(
                    "sale_bucket_backlog_reservations",
                    "Stream entries of one bucket of a bucketed sale not yet acknowledged (lag + pending), those held for backend.forward_grace_ms included."
                ),
                &["sale", "bucket"]
            )),
            events: crate::events::EventMetrics::register(&registry),
            registry,
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// How often the per-sale gauges are read from Redis.
pub const REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the gauges of every live sale from Redis (two calls per sale),
/// and drops those of archived sales.
///
/// # Errors
/// The database or Redis failed; gauges already set keep their values.
pub async fn refresh_sales<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    store: &crate::store::Store,
    metrics: &Metrics,
) -> Result<(), crate::error::SaleError> {
    let archived = crate::stream::retention::archived(conn).await?;
    for sale in store.sales().all().await? {
        let id = sale.id.as_str();
        if archived.contains(id) {
            for gauge in [
                &metrics.remaining,
                &metrics.stream_lag,
                &metrics.backlog,
                &metrics.drift,
            ] {
                let _ = gauge.remove_label_values(&[id]);
            }
            for k in 0..sale.buckets {
                for gauge in [&metrics.bucket_remaining, &metrics.bucket_backlog] {
                    let _ = gauge.remove_label_values(&[id, &k.to_string()]);
                }
            }
            continue;
        }
        let counters = sale_counters(conn, id, sale.buckets).await?;
        if let Some(r) = counters.remaining {
            metrics.remaining.with_label_values(&[id]).set(r);
        }
        metrics
            .stream_lag
            .with_label_values(&[id])
            .set(counters.backlogs.iter().map(|b| b.lag).sum());
        metrics
            .backlog
            .with_label_values(&[id])
            .set(counters.backlogs.iter().map(Backlog::unpersisted).sum());
        for (k, left) in counters.bucket_left.iter().enumerate() {
            let bucket = k.to_string();
            metrics
                .bucket_remaining
                .with_label_values(&[id, &bucket])
                .set(*left);
            // Index 0 of the backlogs is the sale's own stream.
            let backlog = counters.backlogs.get(k + 1).map_or(0, Backlog::unpersisted);
            metrics
                .bucket_backlog
                .with_label_values(&[id, &bucket])
                .set(backlog);
        }
    }
    Ok(())
}

/// Runs [`refresh_sales`] every `interval` until `shutdown`.
pub async fn run_refresh<C: redis::aio::ConnectionLike + Send + Clone>(
    conn: C,
    store: crate::store::Store,
    metrics: std::sync::Arc<Metrics>,
    interval: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        if let Err(error) = refresh_sales(&mut conn.clone(), &store, &metrics).await {
            tracing::debug!(%error, "cannot refresh the sale gauges; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// One sale's counters in Redis, as the gauges show them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleCounters {
    /// Items left (absent: not preheated). A bucketed sale's is the sum
    /// of `bucket_left`.
    pub remaining: Option<i64>,
    /// Every stream's backlog: the sale's own, then each bucket's
    /// (`flashgate_common::stream_info::sale_backlogs`).
    pub backlogs: Vec<Backlog>,
    /// Each bucket's items left, with its items in transit out of it
    /// (`flashgate_common::transfer::left_in`); empty for one bucket.
    pub bucket_left: Vec<i64>,
}

/// Reads sale `sale_id`'s [`SaleCounters`] over its `buckets` buckets.
///
/// # Errors
/// Redis failed.
pub async fn sale_counters<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
) -> redis::RedisResult<SaleCounters> {
    let backlogs = flashgate_common::stream_info::sale_backlogs(conn, sale_id, buckets).await?;
    if buckets <= 1 {
        let keys = flashgate_common::keys::SaleKeys::new(sale_id);
        let remaining: Option<i64> = redis::cmd("GET")
            .arg(&keys.remaining)
            .query_async(conn)
            .await?;
        return Ok(SaleCounters {
            remaining,
            backlogs,
            bucket_left: Vec::new(),
        });
    }
    let preheated: bool = redis::cmd("EXISTS")
        .arg(flashgate_common::keys::SaleKeys::new(sale_id).meta)
        .query_async(conn)
        .await?;
    if !preheated {
        return Ok(SaleCounters {
            remaining: None,
            backlogs,
            bucket_left: Vec::new(),
        });
    }
    let mut bucket_left = Vec::with_capacity(buckets as usize);
    for k in 0..buckets {
        bucket_left.push(flashgate_common::transfer::left_in(conn, sale_id, k).await?);
    }
    Ok(SaleCounters {
        remaining: Some(bucket_left.iter().sum()),
        backlogs,
        bucket_left,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_register_with_the_prefix_and_render() {
        let m = Metrics::register();
        m.orders_created.with_label_values(&["stream"]).inc_by(3);
        assert!(m
            .render()
            .contains("flashgate_backend_orders_created_total{source=\"stream\"} 3"));
        let _second = Metrics::register();
    }
}
