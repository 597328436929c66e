//! Reconciliation: Redis's count of items sold against the order table.
//!
//! Every `backend.reconcile_interval_ms`, and on demand through
//! `POST /admin/sales/{id}/reconcile`, each live (not archived) sale in
//! Redis is compared with the database. Redis is read without blocking it:
//! the reservation index and the returned items in `HSCAN`/`SSCAN` pages,
//! between two atomic reads of the counters (stock, remaining and the sets'
//! sizes); when buys moved the counters meanwhile the read is retried, and
//! a sale still moving gets a report marked not `settled`, whose drift is
//! not exported. The database is read in one snapshot:
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
//!
//! A bucketed sale is reconciled bucket by bucket against the orders of
//! the buyers at home there, and then its buckets' bases against the
//! database's stock, repaired under the sale's hold ([`reconcile_bucketed`],
//! [`repair_bases`]). A sale of one bucket has the stock Redis sells from
//! compared with the database's row and repaired the same way first
//! ([`repair_stock`]): the drift above counts the items sold against
//! Redis's own stock, so a stock Redis holds that the database does not
//! is added to it (`bases_off`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use flashgate_common::buckets::home_bucket;
use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::Reservation;
use flashgate_common::sale::SaleSpec;
use redis::aio::ConnectionLike;
use serde::Serialize;
use tokio::sync::watch;

use crate::buckets::stock::{Moved, Short};
use crate::error::SaleError;
use crate::recovery::adopt;
use crate::store::{OrderRow, OrderStatus, Store};
use crate::stream::entry::parse as parse_entry;

/// Stream entries read per `XRANGE` while looking for unprocessed ones.
const SCAN_CHUNK: usize = 1000;
/// Elements asked for per `HSCAN`/`SSCAN` call.
const SCAN_PAGE: usize = 1000;
/// Reads of a sale whose counters keep moving before its report is given
/// as not settled (and its drift not exported).
const SNAPSHOT_ATTEMPTS: usize = 3;
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
        if let Some(g) = self
            .sales
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(sale_id)
        {
            return g.clone();
        }
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(sale_id.to_owned())
            .or_default()
            .clone()
    }

    /// The last drift of `sale_id`, `None` before its first reconcile.
    pub fn get(&self, sale_id: &str) -> Option<i64> {
        self.sales
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(sale_id)
            .map(|g| g.load(Ordering::Relaxed))
    }

    /// Forgets the drift of every sale in `sales` (archived sales: not
    /// reconciled any more, so their last drift is not exported either).
    pub fn forget(&self, sales: &HashSet<String>) {
        self.sales
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| !sales.contains(id));
    }

    /// Every sale's last drift, sorted by sale id.
    pub fn snapshot(&self) -> Vec<(String, i64)> {
        let map = self.sales.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect();
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
    /// False when buys kept changing the sale while it was read: the drift
    /// is then not exact, and not exported.
    pub settled: bool,
    /// Items the repair of the stock Redis sells from (Σ bases of a
    /// bucketed sale, the sale's own `stock` for one bucket) = the
    /// database's stock added (> 0) or removed (< 0) now; 0 when they
    /// agreed.
    pub bases_moved: i64,
    /// That stock in Redis − the database's stock, left after the repair
    /// (items sold or in transit cannot be removed); 0 when they agree.
    pub bases_off: i64,
    /// The stocks differ but were not repaired now (a bucket, or the
    /// sale, is fenced, or a bucket absent, in Redis); the next pass or
    /// the re-sync repairs it. `bases_off` then shows the whole difference.
    pub bases_unrepaired: bool,
}

/// Reconciles one sale; `None` when the sale is not in Redis (the restore
/// loop deals with that).
///
/// # Errors
/// Redis or the database failed.
pub async fn reconcile_sale<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
) -> Result<Option<Report>, SaleError> {
    let keys = SaleKeys::new(sale_id);
    // Orders first, Redis second: a reservation is in Redis before its order
    // is written, so every order read here is in the snapshot unless Redis
    // really lost it. The other order would take orders written between the
    // two reads for lost ones (harmless, but a script call each).
    let orders = store.orders().of_sale(sale_id).await?;
    let all: Vec<&OrderRow> = orders.iter().collect();
    let Some(Part { mut report, .. }) =
        reconcile_part(conn, store, sale_id, &keys, &all, None).await?
    else {
        return Ok(None);
    };
    report.drift = (report.stock - report.remaining) - (report.live_orders + report.returning);
    // A sale that moved while it was read has no meaningful drift.
    if report.drift != 0 && report.settled {
        tracing::warn!(
            sale = sale_id,
            drift = report.drift,
            ?report,
            "stock drift between redis and the order table"
        );
    }
    Ok(Some(report))
}

/// Reconciles sale `spec`, bucketed or not ([`reconcile_bucketed`],
/// [`reconcile_sale`]).
///
/// # Errors
/// Redis or the database failed.
pub async fn reconcile_spec<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    spec: &SaleSpec,
) -> Result<Option<Report>, SaleError> {
    if spec.buckets > 1 {
        return reconcile_bucketed(conn, store, spec).await;
    }
    // The stock first: the counts below are then read against the stock
    // Redis sells from after the repair.
    let repair = repair_stock(conn, store, &spec.id).await?;
    let Some(mut report) = reconcile_sale(conn, store, &spec.id).await? else {
        return Ok(None);
    };
    report.bases_moved = repair.moved;
    report.bases_off = repair.off;
    report.bases_unrepaired = repair.unrepaired;
    report.drift += repair.off;
    if repair.off != 0 && report.settled {
        tracing::warn!(sale = %spec.id, drift = report.drift, ?report, "redis sells from another stock than the database holds");
    }
    Ok(Some(report))
}

/// Makes the stock one-bucket sale `id` sells from in Redis (its meta's
/// `stock`) equal the database's, under the exclusive hold of the sale's
/// row, as [`repair_bases`] does for a bucketed sale: a difference is left
/// by a stock change that died between its Redis part and its commit (too
/// few items: a raise committed, not applied yet; too many: a change made
/// before the ordering of `api::admin`, or a put-back that was refused).
/// Missing items are added; a surplus is taken if still unsold, else
/// nothing moves (`lua/update_sale.lua` is all or nothing) and it stays as
/// `off`, logged. A fenced sale is skipped (`unrepaired`): its re-sync
/// applies the database's definition.
///
/// # Errors
/// Redis or the database failed.
pub async fn repair_stock<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    id: &str,
) -> Result<BasesRepair, SaleError> {
    // Read without the hold first, as `repair_bases` does.
    let saved = store.sales().get(id).await?.map(|s| s.stock);
    let held = crate::sales::stock_in_redis(conn, id).await?;
    if saved.is_none() || held.is_none() || saved == held {
        return Ok(BasesRepair::default());
    }
    let mut hold = store.locks().begin_resync(id).await?;
    let Some(spec) = hold.sale(id).await? else {
        return Ok(BasesRepair::default());
    };
    let Some(before) = crate::sales::stock_in_redis(conn, id).await? else {
        return Ok(BasesRepair::default());
    };
    if before == spec.stock {
        hold.commit().await?;
        return Ok(BasesRepair::default());
    }
    let applied = crate::sales::apply_present(conn, &spec).await;
    hold.commit().await?;
    let off = before - spec.stock;
    match applied {
        Ok(Some(crate::sales::Applied::StockBelowSold { sold })) => {
            tracing::error!(
                sale = id,
                redis_stock = before,
                stock = spec.stock,
                sold,
                "redis sells from more than the database's stock and the surplus is sold: not repaired"
            );
            Ok(BasesRepair {
                moved: 0,
                off,
                unrepaired: false,
            })
        }
        Ok(Some(_)) => {
            tracing::warn!(
                sale = id,
                redis_stock = before,
                stock = spec.stock,
                "redis's stock moved to the database's"
            );
            // Items may be back: gateways forget a sold-out flag.
            crate::redis_io::announce(
                conn,
                &flashgate_common::keys::SaleEvent::Changed(id.to_owned()),
            )
            .await;
            Ok(BasesRepair {
                moved: -off,
                off: 0,
                unrepaired: false,
            })
        }
        Ok(None) => Ok(BasesRepair::default()),
        Err(SaleError::Fenced) => {
            tracing::warn!(
                sale = id,
                redis_stock = before,
                stock = spec.stock,
                "redis's stock differs from the database's; the sale is fenced, its re-sync repairs it"
            );
            Ok(BasesRepair {
                moved: 0,
                off,
                unrepaired: true,
            })
        }
        Err(other) => Err(other),
    }
}

/// Reconciles bucketed sale `spec`: each bucket as a sale of its own
/// against the orders of the buyers at home there (their reservations are
/// counted in their home bucket), then Σ bases against the database's
/// stock ([`repair_bases`]). The report sums the buckets: `remaining` is
/// what buyers are shown (every bucket's plus the items in transit), and
/// the drift is, over the buckets, `reserved - (live orders + returning)`
/// (a bucket's `stock - remaining` also moves with its transfers), plus
/// Σ bases − the stock left after the repair.
///
/// # Errors
/// Redis or the database failed.
pub async fn reconcile_bucketed<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    spec: &SaleSpec,
) -> Result<Option<Report>, SaleError> {
    let id = spec.id.as_str();
    let n = spec.buckets;
    let orders = store.orders().of_sale(id).await?;
    let mut by_home: Vec<Vec<&OrderRow>> = vec![Vec::new(); n as usize];
    for o in &orders {
        by_home[home_bucket(&o.user_id, n) as usize].push(o);
    }
    let own = SaleKeys::new(id);
    let mut report = Report {
        sale_id: id.to_owned(),
        stock: spec.stock,
        settled: true,
        ..Report::default()
    };
    for (k, home) in (0..n).zip(&by_home) {
        let keys = SaleKeys::bucket(id, k);
        // A dead letter put back goes to the sale's own stream.
        let Some(Part {
            report: b,
            reserved,
        }) = reconcile_part(conn, store, id, &keys, home, Some(&own.stream)).await?
        else {
            return Ok(None);
        };
        let drift = reserved - (b.live_orders + b.returning);
        if drift != 0 && b.settled {
            tracing::warn!(sale = id, bucket = k, drift, report = ?b, "stock drift between a bucket and the orders of its buyers");
        }
        report.live_orders += b.live_orders;
        report.returning += b.returning;
        report.repaired += b.repaired;
        report.adopted += b.adopted;
        report.unrepaired += b.unrepaired;
        report.dead_letters += b.dead_letters;
        report.settled &= b.settled;
        report.drift += drift;
    }
    let own_dead: i64 = redis::cmd("XLEN").arg(&own.dead).query_async(conn).await?;
    report.dead_letters += own_dead;
    let repair = repair_bases(conn, store, id, n).await?;
    report.bases_moved = repair.moved;
    report.bases_off = repair.off;
    report.bases_unrepaired = repair.unrepaired;
    report.drift += repair.off;
    report.remaining = flashgate_common::transfer::left(conn, id, n).await?;
    if report.drift != 0 && report.settled {
        tracing::warn!(
            sale = id,
            drift = report.drift,
            ?report,
            "stock drift between the buckets and the order table"
        );
    }
    Ok(Some(report))
}

/// What [`repair_bases`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BasesRepair {
    /// Items added (> 0) or removed (< 0) now.
    pub moved: i64,
    /// Σ bases − stock left after the repair.
    pub off: i64,
    /// A difference was left alone: a bucket is fenced or absent.
    pub unrepaired: bool,
}

/// Makes Σ bases of bucketed sale `id` equal the database's stock, under
/// the exclusive hold of the sale's row (so no stock change, re-sync or
/// order commit of the sale runs meanwhile). A difference is left by a
/// stock change that died between its Redis part and its commit:
/// surplus items are taken from the buckets holding the most unsold ones
/// (what is sold already cannot be taken, and stays as `off`), missing
/// items are added, spread as a preheat spreads them. A fenced or absent
/// bucket skips the repair (nothing is taken or added; `unrepaired`): its
/// count may lack writes until the re-sync, and the next pass tries again.
///
/// # Errors
/// Redis or the database failed.
pub async fn repair_bases<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    id: &str,
    buckets: u32,
) -> Result<BasesRepair, SaleError> {
    // Read without the hold first: equal, nothing to repair (a change in
    // flight that moved the bases already shows as a difference, and the
    // hold below waits for it to end), and no pass takes the hold for
    // nothing.
    let saved = store.sales().get(id).await?.map(|s| s.stock);
    if saved.is_none()
        || saved
            == Some(
                crate::buckets::stock::bases(conn, id, buckets)
                    .await?
                    .iter()
                    .sum(),
            )
    {
        return Ok(BasesRepair::default());
    }
    let mut hold = store.locks().begin_resync(id).await?;
    let Some(spec) = hold.sale(id).await? else {
        return Ok(BasesRepair::default());
    };
    let before: i64 = crate::buckets::stock::bases(conn, id, buckets)
        .await?
        .iter()
        .sum();
    if before == spec.stock {
        hold.commit().await?;
        return Ok(BasesRepair::default());
    }
    let unrepaired = BasesRepair {
        moved: 0,
        off: before - spec.stock,
        unrepaired: true,
    };
    if let Err(error) = crate::buckets::stock::check(conn, id, buckets).await {
        hold.commit().await?;
        return match error {
            SaleError::BucketUnavailable { bucket, why } => {
                tracing::error!(
                    sale = id,
                    bases = before,
                    stock = spec.stock,
                    bucket,
                    why,
                    "bucket bases differ from the stock, but a bucket cannot be moved now: not repaired"
                );
                Ok(unrepaired)
            }
            other => Err(other),
        };
    }
    let moved = crate::buckets::stock::move_to(conn, id, buckets, spec.stock, Short::Keep).await;
    hold.commit().await?;
    let (changes, missing) = match moved {
        Ok(Moved::Done { changes, missing }) => (changes, missing),
        Ok(Moved::Refused { .. }) => return Ok(unrepaired),
        // Fenced between the check and the move: what moved was moved back.
        Err(SaleError::BucketUnavailable { bucket, why }) => {
            tracing::error!(
                sale = id,
                bucket,
                why,
                "a bucket became unavailable during the repair of the bases: not repaired"
            );
            return Ok(unrepaired);
        }
        Err(other) => return Err(other),
    };
    let made: i64 = changes.iter().sum();
    let off = before + made - spec.stock;
    tracing::warn!(
        sale = id,
        bases = before,
        stock = spec.stock,
        ?changes,
        off,
        "bucket bases moved to the database's stock"
    );
    if missing > 0 {
        tracing::error!(
            sale = id,
            missing,
            "bucket bases stay above the stock: those items are sold or in transit; the next pass tries again"
        );
    }
    Ok(BasesRepair {
        moved: made,
        off,
        unrepaired: false,
    })
}

/// One sale's or one bucket's reconciliation, before its drift: the report
/// (its `stock` and `remaining` those of the keys reconciled) and the
/// items reserved there (reservations − returned, adoptions included).
struct Part {
    report: Report,
    reserved: i64,
}

/// Reconciles the sale (or bucket) at `keys` against `orders` (those whose
/// reservation is counted there); a missing reservation's entry is looked
/// for in `keys.stream`, then in `also_stream`. `None`: not in Redis.
async fn reconcile_part<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    keys: &SaleKeys,
    orders: &[&OrderRow],
    also_stream: Option<&str>,
) -> Result<Option<Part>, SaleError> {
    let Some(snapshot) = redis_snapshot(conn, keys).await? else {
        return Ok(None);
    };
    let Snapshot {
        counters:
            Counters {
                stock,
                remaining,
                dead_letters,
                reservations,
                released: released_count,
            },
        resv,
        released,
        settled,
    } = snapshot;

    let mut report = Report {
        sale_id: sale_id.to_owned(),
        stock,
        dead_letters,
        settled,
        ..Report::default()
    };
    let with_order: HashSet<&str> = orders.iter().map(|o| o.reservation_id.as_str()).collect();
    let mut adopted = 0;
    for o in orders {
        let known = resv.contains_key(&o.reservation_id);
        match o.status {
            OrderStatus::Cancelled => {
                if known && !released.contains(&o.reservation_id) {
                    report.returning += 1;
                }
            }
            OrderStatus::Created | OrderStatus::Paid if known => report.live_orders += 1,
            OrderStatus::Created | OrderStatus::Paid => {
                // Not adopted: reserved after the snapshot, so outside this count.
                if adopt(conn, keys, o).await? {
                    adopted += 1;
                    report.live_orders += 1;
                    tracing::warn!(sale = sale_id, reservation = %o.reservation_id, "order unknown to redis adopted: its item cannot be sold again");
                }
            }
        }
    }
    report.adopted = adopted;
    report.remaining = remaining - adopted;

    let missing: HashSet<&str> = resv
        .keys()
        .map(String::as_str)
        .filter(|rid| !with_order.contains(rid) && !released.contains(*rid))
        .collect();
    if !missing.is_empty() {
        let mut found = find_in_stream(conn, &keys.stream, &missing).await?;
        if let Some(also) = also_stream.filter(|_| found.len() < missing.len()) {
            found.extend(find_in_stream(conn, also, &missing).await?);
        }
        let mut unrepaired: Vec<&str> = Vec::new();
        for rid in &missing {
            match found.get(*rid) {
                Some(r) => {
                    match crate::counted::write_counted(store, conn, std::slice::from_ref(r)).await
                    {
                        Ok(written) if !written.counted.is_empty() => {
                            report.repaired += 1;
                            report.live_orders += 1;
                        }
                        // Redis no longer counts it (it failed over since the
                        // snapshot): the re-sync of the sale decides.
                        Ok(_) => unrepaired.push(rid),
                        Err(error) => {
                            tracing::warn!(%error, sale = sale_id, reservation = rid, "cannot write the order of an unprocessed entry");
                            unrepaired.push(rid);
                        }
                    }
                }
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
        tracing::warn!(
            sale = sale_id,
            repaired = report.repaired,
            "orders written from stream entries nobody had processed"
        );
    }
    Ok(Some(Part {
        report,
        reserved: reservations + adopted - released_count,
    }))
}

/// A sale's counters, read in one atomic step (each O(1) in Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    stock: i64,
    remaining: i64,
    reservations: i64,
    released: i64,
    dead_letters: i64,
}

async fn counters<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
) -> Result<Option<Counters>, SaleError> {
    let (stock, remaining, reservations, released, dead_letters): (
        Option<i64>,
        Option<i64>,
        i64,
        i64,
        i64,
    ) = redis::pipe()
        .atomic()
        .hget(&keys.meta, "stock")
        .get(&keys.remaining)
        .hlen(&keys.reservations)
        .scard(&keys.released)
        .xlen(&keys.dead)
        .query_async(conn)
        .await?;
    let (Some(stock), Some(remaining)) = (stock, remaining) else {
        return Ok(None);
    };
    Ok(Some(Counters {
        stock,
        remaining,
        reservations,
        released,
        dead_letters,
    }))
}

/// The reservation index and the returned items, read page by page, with
/// the counters they go with.
struct Snapshot {
    counters: Counters,
    resv: HashMap<String, String>,
    released: HashSet<String>,
    /// The counters were the same before and after the pages were read.
    /// Both sets only grow, and every change to them moves a counter, so
    /// the pages then are exactly the sets at the counters' time.
    settled: bool,
}

/// Reads the sale with `HSCAN`/`SSCAN` pages of [`SCAN_PAGE`] between two
/// counter reads, so a large sale never blocks Redis for one huge reply.
/// Retried while buys move the counters; `None` when the sale is not in
/// Redis.
async fn redis_snapshot<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
) -> Result<Option<Snapshot>, SaleError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(before) = counters(conn, keys).await? else {
            return Ok(None);
        };
        let resv: HashMap<String, String> = scan(conn, "HSCAN", &keys.reservations)
            .await?
            .into_iter()
            .collect();
        let released: HashSet<String> = scan(conn, "SSCAN", &keys.released)
            .await?
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        let Some(after) = counters(conn, keys).await? else {
            return Ok(None);
        };
        let settled = before == after
            && resv.len() as i64 == after.reservations
            && released.len() as i64 == after.released;
        if settled || attempt == SNAPSHOT_ATTEMPTS {
            return Ok(Some(Snapshot {
                counters: after,
                resv,
                released,
                settled,
            }));
        }
    }
}

/// Every element of a hash (`HSCAN`: field/value pairs) or set (`SSCAN`:
/// each member paired with an empty string), [`SCAN_PAGE`] per call.
async fn scan<C: ConnectionLike + Send>(
    conn: &mut C,
    command: &str,
    key: &str,
) -> Result<Vec<(String, String)>, SaleError> {
    let mut all = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd(command)
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(SCAN_PAGE)
            .query_async(conn)
            .await?;
        if command == "HSCAN" {
            let mut it = page.into_iter();
            while let (Some(field), Some(value)) = (it.next(), it.next()) {
                all.push((field, value));
            }
        } else {
            all.extend(page.into_iter().map(|m| (m, String::new())));
        }
        if next == 0 {
            return Ok(all);
        }
        cursor = next;
    }
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
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(SCAN_CHUNK)
            .query_async(conn)
            .await?;
        let n = reply.ids.len();
        for entry in &reply.ids {
            if let Ok(r) = parse_entry(entry) {
                if wanted.contains(r.reservation_id.as_str()) {
                    found.insert(r.reservation_id.clone(), r);
                }
            }
        }
        match reply.ids.last() {
            Some(last) if n == SCAN_CHUNK && found.len() < wanted.len() => {
                start = format!("({}", last.id)
            }
            _ => return Ok(found),
        }
    }
}

/// Reconciles every sale of the database and updates `drift`.
///
/// # Errors
/// The database failed listing sales; a failure on one sale is logged.
pub async fn reconcile_all<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    drift: &Drift,
) -> Result<Vec<Report>, SaleError> {
    let mut reports = Vec::new();
    // Archived sales are finished and were drained when archived.
    let archived = crate::stream::retention::archived(conn)
        .await
        .unwrap_or_else(|error| {
            tracing::debug!(%error, "cannot read the archived sales; reconciling every sale");
            HashSet::new()
        });
    drift.forget(&archived);
    for spec in store
        .sales()
        .all()
        .await?
        .into_iter()
        .filter(|s| !archived.contains(&s.id))
    {
        match reconcile_spec(conn, store, &spec).await {
            Ok(Some(report)) => {
                if report.settled {
                    drift.gauge(&spec.id).store(report.drift, Ordering::Relaxed);
                }
                reports.push(report);
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, sale = %spec.id, "cannot reconcile the sale"),
        }
    }
    Ok(reports)
}

/// Runs [`reconcile_all`] every `interval` until `shutdown`.
pub async fn run<C: ConnectionLike + Send + Clone>(
    conn: C,
    store: Store,
    interval: Duration,
    drift: Drift,
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

#[cfg(test)]
mod tests;
