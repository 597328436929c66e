//! Recovery of a sale Redis lost, and the stock returns of cancelled orders.
//!
//! A Redis that restarts without its data (no AOF, a lost disk, a replica
//! promoted too early) has no `meta` for the sale, so every gateway stops
//! selling it: the deduct script answers "not found", and the gateway,
//! asking [`crate::api::orders::sale_exists`], answers `503 unavailable`
//! with `Retry-After` instead. [`watch`] notices the missing `meta` within
//! `backend.restore_poll_ms` and [`restore`] rebuilds the sale from the
//! database, in this order, under a per-sale lock:
//!
//! 1. one snapshot of every order of the sale;
//! 2. reservations that survived in Redis without an order (still in
//!    flight) are kept and counted as sold;
//! 3. the buyers hash and the reservation index are rebuilt from the live
//!    orders and those in-flight reservations, and the `released` set from
//!    the cancelled orders (so a stock return never runs twice);
//! 4. last, `lua/preheat.lua` writes `meta` with
//!    `remaining = stock - live orders - in-flight reservations`: only now
//!    can the sale be bought again.
//!
//! [`return_stock`] gives back the item of every cancelled order not yet
//! returned (`lua/release.lua`, idempotent), then records it in the order
//! row, so a crash between the two only repeats a no-op.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use std::time::Duration;

use flashgate_common::keys::SaleKeys;
use flashgate_common::sale::SaleSpec;
use redis::aio::ConnectionLike;
use redis::{RedisError, Script};
use tokio::sync::watch;

use crate::sales::{Preheat, SaleError};
use crate::store::{OrderStatus, Store};

/// Returns one cancelled reservation's item (`lua/release.lua`).
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/release.lua")));

/// Makes Redis count an order it forgot (`lua/adopt.lua`).
pub static ADOPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/adopt.lua")));

/// Redis commands per pipeline while rebuilding a sale.
const CHUNK: usize = 1000;
/// How long the restore lock is held at most (a crashed restorer frees it).
const RESTORE_LOCK_MS: u64 = 30_000;
/// Cancelled orders returned per pass of [`return_stock`].
const RETURN_BATCH: i64 = 500;

/// What [`restore`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The sale was rebuilt with this many items left.
    Loaded { remaining: i64, live_orders: i64, in_flight: i64 },
    /// The sale was in Redis already.
    NotNeeded,
    /// Another backend is restoring it right now.
    Busy,
    /// Stock below what the database holds as sold: left absent, logged.
    StockBelowSold { sold: i64 },
}

/// Loads `spec` into Redis from the database if its `meta` is absent,
/// counting live orders and in-flight reservations as sold (see the module
/// doc). Idempotent; safe with several backends (a lock key serialises them).
///
/// # Errors
/// Redis or the database failed; Redis may then hold a partial rebuild,
/// without `meta`, which the next attempt redoes.
pub async fn restore<C: ConnectionLike + Send>(conn: &mut C, store: &Store, spec: &SaleSpec) -> Result<Restored, SaleError> {
    let keys = SaleKeys::new(&spec.id);
    let present: bool = redis::cmd("EXISTS").arg(&keys.meta).query_async(conn).await?;
    if present {
        return Ok(Restored::NotNeeded);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    let locked: Option<String> =
        redis::cmd("SET").arg(&keys.restoring).arg(&token).arg("NX").arg("PX").arg(RESTORE_LOCK_MS).query_async(conn).await?;
    if locked.is_none() {
        return Ok(Restored::Busy);
    }
    let result = rebuild(conn, store, spec, &keys).await;
    // Free the lock only if still ours.
    let current: Option<String> = redis::cmd("GET").arg(&keys.restoring).query_async(conn).await?;
    if current.as_deref() == Some(token.as_str()) {
        let () = redis::cmd("DEL").arg(&keys.restoring).query_async::<i64>(conn).await.map(drop)?;
    }
    result
}

async fn rebuild<C: ConnectionLike + Send>(conn: &mut C, store: &Store, spec: &SaleSpec, keys: &SaleKeys) -> Result<Restored, SaleError> {
    let orders = store.sale_orders(&spec.id).await?;
    let known: HashSet<&str> = orders.iter().map(|o| o.reservation_id.as_str()).collect();
    // Reservations Redis still has that have no order yet: in flight.
    let surviving: HashMap<String, String> = redis::cmd("HGETALL").arg(&keys.reservations).query_async(conn).await?;
    let in_flight: Vec<(&String, &String)> = surviving.iter().filter(|(rid, _)| !known.contains(rid.as_str())).collect();

    let mut buyers: HashMap<&str, i64> = HashMap::new();
    let mut live = 0_i64;
    let mut cancelled = Vec::new();
    let mut index = Vec::new();
    for o in &orders {
        index.push((o.reservation_id.as_str(), o.user_id.as_str()));
        if o.status == OrderStatus::Cancelled {
            cancelled.push(o.reservation_id.as_str());
        } else {
            live += 1;
            *buyers.entry(o.user_id.as_str()).or_default() += 1;
        }
    }
    for (_, user) in &in_flight {
        *buyers.entry(user.as_str()).or_default() += 1;
    }
    let sold = live + in_flight.len() as i64;
    if sold > spec.stock {
        tracing::error!(sale = %spec.id, stock = spec.stock, sold, "cannot restore: more sold than the stock");
        return Ok(Restored::StockBelowSold { sold });
    }

    let () = redis::cmd("DEL").arg(&keys.buyers).arg(&keys.released).query_async::<i64>(conn).await.map(drop)?;
    for chunk in index.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for (rid, user) in chunk {
            pipe.cmd("HSET").arg(&keys.reservations).arg(*rid).arg(*user).ignore();
        }
        let () = pipe.query_async(conn).await?;
    }
    let buyers: Vec<_> = buyers.into_iter().collect();
    for chunk in buyers.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for (user, n) in chunk {
            pipe.cmd("HSET").arg(&keys.buyers).arg(*user).arg(*n).ignore();
        }
        let () = pipe.query_async(conn).await?;
    }
    for chunk in cancelled.chunks(CHUNK) {
        let () = redis::cmd("SADD").arg(&keys.released).arg(chunk).query_async::<i64>(conn).await.map(drop)?;
    }
    match crate::sales::preheat(conn, spec, sold).await? {
        Preheat::Loaded { remaining } => {
            Ok(Restored::Loaded { remaining, live_orders: live, in_flight: in_flight.len() as i64 })
        }
        Preheat::AlreadyThere => Ok(Restored::NotNeeded),
        Preheat::StockBelowSold { sold } => Ok(Restored::StockBelowSold { sold }),
    }
}

/// Restores every sale of the database that is missing from Redis.
///
/// # Errors
/// The database failed (listing sales); a failure on one sale is logged
/// and the others are still tried.
pub async fn restore_missing<C: ConnectionLike + Send>(conn: &mut C, store: &Store) -> Result<usize, SaleError> {
    let mut restored = 0;
    for spec in store.sales().await? {
        match restore(conn, store, &spec).await {
            Ok(Restored::Loaded { remaining, live_orders, in_flight }) => {
                restored += 1;
                tracing::warn!(sale = %spec.id, remaining, live_orders, in_flight, "sale was missing from redis; restored from the database");
                announce(conn, &spec.id).await;
            }
            Ok(Restored::NotNeeded | Restored::Busy | Restored::StockBelowSold { .. }) => {}
            Err(error) => tracing::warn!(%error, sale = %spec.id, "cannot restore the sale into redis yet"),
        }
    }
    Ok(restored)
}

/// Gives back the item of every cancelled order not returned yet. Returns
/// how many items went back to the stock by this call.
///
/// One pass pages through every unreturned cancelled order once, by order
/// id, so orders that cannot be returned now (their sale is missing from
/// Redis, waiting for the restore loop) never hide those of other sales.
/// A sale that answered "missing" is skipped for the rest of the pass: one
/// script call per missing sale, not one per order.
///
/// # Errors
/// Redis or the database failed; what was done stays done.
pub async fn return_stock<C: ConnectionLike + Send>(conn: &mut C, store: &Store) -> Result<u64, SaleError> {
    let mut returned = 0;
    let mut touched = HashSet::new();
    let mut missing = HashSet::new();
    let mut cursor = String::new();
    loop {
        let batch = store.unreleased_cancelled(&cursor, RETURN_BATCH).await?;
        let full = batch.len() as i64 == RETURN_BATCH;
        if let Some(last) = batch.last() {
            cursor.clone_from(&last.order_id);
        }
        for order in batch {
            if missing.contains(&order.sale_id) {
                continue;
            }
            let keys = SaleKeys::new(&order.sale_id);
            let reply: i64 = RELEASE
                .key(&keys.meta)
                .key(&keys.remaining)
                .key(&keys.buyers)
                .key(&keys.released)
                .arg(&order.reservation_id)
                .arg(&order.user_id)
                .invoke_async(conn)
                .await?;
            if reply < 0 {
                // The sale is being restored; the restore counts this order
                // as returned or the next pass returns it.
                missing.insert(order.sale_id);
                continue;
            }
            returned += reply as u64;
            store.mark_released(&order.order_id, flashgate_common::now_ms()).await?;
            touched.insert(order.sale_id);
        }
        if !full {
            break;
        }
    }
    for sale in &touched {
        announce(conn, sale).await;
    }
    Ok(returned)
}

/// Tells gateways to forget their cached state (a sold-out flag may be stale).
async fn announce<C: ConnectionLike + Send>(conn: &mut C, id: &str) {
    let event = flashgate_common::keys::SaleEvent::Changed(id.to_owned());
    let sent: Result<i64, RedisError> =
        redis::cmd("PUBLISH").arg(flashgate_common::keys::EVENTS_CHANNEL).arg(event.encode()).query_async(conn).await;
    if let Err(error) = sent {
        tracing::debug!(%error, sale = id, "could not announce the sale to gateways");
    }
}

/// Every `interval`, restores the sales Redis lost, until `shutdown`.
pub async fn watch<C: ConnectionLike + Send + Clone>(conn: C, store: Store, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        let mut c = conn.clone();
        if let Err(error) = restore_missing(&mut c, &store).await {
            tracing::warn!(%error, "cannot check the sales in redis; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests;
