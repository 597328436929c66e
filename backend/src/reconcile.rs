//! Reconciliation: Redis's count of items sold against the order table.
//!
//! Every `backend.reconcile_interval_ms`, and on demand through
//! `POST /admin/sales/{id}/reconcile`, each sale in Redis is compared with
//! the database from one Redis snapshot (stock, remaining, reservation
//! index, returned items, taken atomically) and one database snapshot:
//!
//! - a reservation with no order whose stream entry is still there (never
//!   processed, or pending on a consumer that died) is turned into its
//!   order now, idempotently, as the consumer would;
//! - an order Redis does not know (its reservation was lost with Redis's
//!   last writes) is adopted (`lua/adopt.lua`), so its item cannot be sold
//!   again;
//! - what cannot be repaired (a reservation with neither order nor stream
//!   entry, or one in the dead-letter stream) is logged.
//!
//! Then the drift is `(stock - remaining) - (live orders + cancelled orders
//! whose item is not back yet)`: zero when every item Redis counts as sold
//! has an order. It is kept per sale in [`Drift`], readable by the metrics.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::Reservation;
use redis::aio::ConnectionLike;
use serde::Serialize;
use tokio::sync::watch;

use crate::recovery::ADOPT;
use crate::sales::SaleError;
use crate::store::{OrderStatus, Store};
use crate::stream::consumer::parse as parse_entry;

/// Stream entries read per `XRANGE` while looking for unprocessed ones.
const SCAN_CHUNK: usize = 1000;
/// Unrepairable reservations named in the log per sale and pass.
const LOGGED: usize = 10;

/// The last drift of every reconciled sale, shared with the metrics: one
/// `Arc<AtomicI64>` per sale, created on first reconcile.
#[derive(Debug, Clone, Default)]
pub struct Drift {
    sales: Arc<RwLock<HashMap<String, Arc<AtomicI64>>>>,
}

impl Drift {
    /// The gauge of `sale_id`, created at 0 if new.
    pub fn gauge(&self, sale_id: &str) -> Arc<AtomicI64> {
        if let Some(g) = self.sales.read().unwrap_or_else(|e| e.into_inner()).get(sale_id) {
            return g.clone();
        }
        self.sales.write().unwrap_or_else(|e| e.into_inner()).entry(sale_id.to_owned()).or_default().clone()
    }

    /// The last drift of `sale_id`, `None` before its first reconcile.
    pub fn get(&self, sale_id: &str) -> Option<i64> {
        self.sales.read().unwrap_or_else(|e| e.into_inner()).get(sale_id).map(|g| g.load(Ordering::Relaxed))
    }

    /// Every sale's last drift, sorted by sale id.
    pub fn snapshot(&self) -> Vec<(String, i64)> {
        let map = self.sales.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map.iter().map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed))).collect();
        all.sort();
        all
    }
}

/// What one reconciliation of one sale found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub sale_id: String,
    pub stock: i64,
    /// Remaining in Redis, after adoptions.
    pub remaining: i64,
    pub live_orders: i64,
    /// Cancelled orders whose item is not back in Redis yet.
    pub returning: i64,
    /// Orders written now from stream entries nobody had processed.
    pub repaired: i64,
    /// Orders Redis had forgotten, counted again now.
    pub adopted: i64,
    /// Reservations left without an order, dead-lettered ones included.
    pub unrepaired: i64,
    /// Entries in the dead-letter stream.
    pub dead_letters: i64,
    /// `(stock - remaining) - (live_orders + returning)`.
    pub drift: i64,
}

/// Reconciles one sale; `None` when the sale is not in Redis (the restore
/// loop deals with that).
///
/// # Errors
/// Redis or the database failed.
pub async fn reconcile_sale<C: ConnectionLike + Send>(conn: &mut C, store: &Store, sale_id: &str) -> Result<Option<Report>, SaleError> {
    let keys = SaleKeys::new(sale_id);
    // Orders first, Redis second: a reservation is in Redis before its order
    // is written, so every order read here is in the snapshot unless Redis
    // really lost it. The other order would take orders written between the
    // two reads for lost ones (harmless, but a script call each).
    let orders = store.sale_orders(sale_id).await?;
    let (stock, remaining, resv, released, dead_letters): (Option<i64>, Option<i64>, HashMap<String, String>, HashSet<String>, i64) =
        redis::pipe()
            .atomic()
            .hget(&keys.meta, "stock")
            .get(&keys.remaining)
            .hgetall(&keys.reservations)
            .smembers(&keys.released)
            .xlen(&keys.dead)
            .query_async(conn)
            .await?;
    let (Some(stock), Some(remaining)) = (stock, remaining) else { return Ok(None) };

    let mut report = Report { sale_id: sale_id.to_owned(), stock, dead_letters, ..Report::default() };
    let with_order: HashSet<&str> = orders.iter().map(|o| o.reservation_id.as_str()).collect();
    let mut adopted = 0;
    for o in &orders {
        let known = resv.contains_key(&o.reservation_id);
        match o.status {
            OrderStatus::Cancelled => {
                if known && !released.contains(&o.reservation_id) {
                    report.returning += 1;
                }
            }
            OrderStatus::Created | OrderStatus::Paid if known => report.live_orders += 1,
            OrderStatus::Created | OrderStatus::Paid => {
                let reply: i64 = ADOPT
                    .key(&keys.meta)
                    .key(&keys.remaining)
                    .key(&keys.buyers)
                    .key(&keys.reservations)
                    .key(&keys.released)
                    .arg(&o.reservation_id)
                    .arg(&o.user_id)
                    .invoke_async(conn)
                    .await?;
                // 0: reserved after the snapshot, so outside this count.
                if reply == 1 {
                    adopted += 1;
                    report.live_orders += 1;
                    tracing::warn!(sale = sale_id, reservation = %o.reservation_id, "order unknown to redis adopted: its item cannot be sold again");
                }
            }
        }
    }
    report.adopted = adopted;
    report.remaining = remaining - adopted;

    let missing: HashSet<&str> =
        resv.keys().map(String::as_str).filter(|rid| !with_order.contains(rid) && !released.contains(*rid)).collect();
    if !missing.is_empty() {
        let found = find_in_stream(conn, &keys.stream, &missing).await?;
        let mut unrepaired: Vec<&str> = Vec::new();
        for rid in &missing {
            match found.get(*rid) {
                Some(r) => match store.insert_orders(std::slice::from_ref(r)).await {
                    Ok(_) => {
                        report.repaired += 1;
                        report.live_orders += 1;
                    }
                    Err(error) => {
                        tracing::warn!(%error, sale = sale_id, reservation = rid, "cannot write the order of an unprocessed entry");
                        unrepaired.push(rid);
                    }
                },
                None => unrepaired.push(rid),
            }
        }
        report.unrepaired = unrepaired.len() as i64;
        if !unrepaired.is_empty() {
            tracing::error!(
                sale = sale_id,
                count = unrepaired.len(),
                sample = ?&unrepaired[..unrepaired.len().min(LOGGED)],
                "reservations without an order that cannot be repaired here (see the dead-letter stream)"
            );
        }
    }
    if report.repaired > 0 {
        tracing::warn!(sale = sale_id, repaired = report.repaired, "orders written from stream entries nobody had processed");
    }
    report.drift = (stock - report.remaining) - (report.live_orders + report.returning);
    if report.drift != 0 {
        tracing::warn!(sale = sale_id, drift = report.drift, ?report, "stock drift between redis and the order table");
    }
    Ok(Some(report))
}

/// The valid reservations of `stream` whose id is in `wanted`.
async fn find_in_stream<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    wanted: &HashSet<&str>,
) -> Result<HashMap<String, Reservation>, SaleError> {
    let mut found = HashMap::new();
    let mut start = "-".to_owned();
    loop {
        let reply: redis::streams::StreamRangeReply =
            redis::cmd("XRANGE").arg(stream).arg(&start).arg("+").arg("COUNT").arg(SCAN_CHUNK).query_async(conn).await?;
        let n = reply.ids.len();
        for entry in &reply.ids {
            if let Ok(r) = parse_entry(entry) {
                if wanted.contains(r.reservation_id.as_str()) {
                    found.insert(r.reservation_id.clone(), r);
                }
            }
        }
        match reply.ids.last() {
            Some(last) if n == SCAN_CHUNK && found.len() < wanted.len() => start = format!("({}", last.id),
            _ => return Ok(found),
        }
    }
}

/// Reconciles every sale of the database and updates `drift`.
///
/// # Errors
/// The database failed listing sales; a failure on one sale is logged.
pub async fn reconcile_all<C: ConnectionLike + Send>(conn: &mut C, store: &Store, drift: &Drift) -> Result<Vec<Report>, SaleError> {
    let mut reports = Vec::new();
    for spec in store.sales().await? {
        match reconcile_sale(conn, store, &spec.id).await {
            Ok(Some(report)) => {
                drift.gauge(&spec.id).store(report.drift, Ordering::Relaxed);
                reports.push(report);
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, sale = %spec.id, "cannot reconcile the sale"),
        }
    }
    Ok(reports)
}

/// Runs [`reconcile_all`] every `interval` until `shutdown`.
pub async fn run<C: ConnectionLike + Send + Clone>(conn: C, store: Store, interval: Duration, drift: Drift,
    readiness: crate::readiness::Readiness,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        if !readiness.wait_dependencies(&mut shutdown).await {
            return;
        }
        let mut c = conn.clone();
        if let Err(error) = reconcile_all(&mut c, &store, &drift).await {
            tracing::warn!(%error, "reconciliation failed; will retry");
        }
    }
}
