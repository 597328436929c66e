//! Recovery of a sale Redis lost, and the stock returns of cancelled orders.
//!
//! A Redis that restarts without its data (no AOF, a lost disk, a replica
//! promoted too early) has no `meta` for the sale, so every gateway stops
//! selling it: the deduct script answers "not found", and the gateway,
//! asking the backend (`GET /internal/sales/{id}`), answers `503 unavailable`
//! with `Retry-After` instead. [`watch`] notices the missing `meta` within
//! `backend.restore_poll_ms` and [`restore`] rebuilds the sale from the
//! database:
//!
//! 1. it takes the sale's lock (`SET NX PX` with a random token, renewed
//!    while the work lasts) and checks again, under the lock, that `meta`
//!    is still absent;
//! 2. it reads the sale's definition again, under the lock (an operator may
//!    have changed it since the caller read it);
//! 3. it puts the global switch back if Redis lost it (see
//!    [`switches::restore_switch`]), so no sale becomes buyable before
//!    the switch that may stop them all;
//! 4. one snapshot of every order of the sale;
//! 5. reservations that survived in Redis without an order (still in
//!    flight) are kept and counted as sold;
//! 6. the buyers hash and the reservation index are built from the live
//!    orders and those in-flight reservations, and the `released` set from
//!    the cancelled orders (so a stock return never runs twice), under
//!    scratch keys of this restore's own;
//! 7. `lua/preheat.lua` installs all of it at once, with
//!    `remaining = stock - live orders - in-flight reservations` and the
//!    sale **paused**, only if `meta` is still absent and the lock still
//!    holds this restore's token; otherwise it drops the scratch keys and
//!    changes nothing;
//! 8. while the sale is still paused, orders written after the snapshot
//!    (a forward or a stream batch that checked its reservation in the
//!    Redis that was lost and committed only now) are counted with
//!    `lua/adopt.lua`, and only then the pause the database holds is
//!    applied. A pause sent at any moment of the restore is therefore in
//!    force from the install on, and a crash or error after the install
//!    leaves the sale paused until the next pass of the loop, which brings
//!    every present sale's pause in line with the database
//!    ([`switches::sync_pauses`]).
//!
//! So a restore never overwrites a live sale: not when another backend
//! restored it first, not when this one stalled past its lock. While `meta`
//! is absent nothing else writes the sale's keys (the deduct, release and
//! adopt scripts all refuse an absent sale), so the Redis part of the
//! snapshot stays true until the install; orders the database gains
//! meanwhile are counted in step 8 (or, committed later still, by
//! reconciliation).
//!
//! [`return_stock`] gives back the item of every cancelled order not yet
//! returned (`lua/release.lua`, idempotent, and only for a reservation Redis
//! counted), then records it in the order row, so a crash between the two
//! only repeats a no-op.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::time::Duration;

use flashgate_common::keys::{SaleEvent, SaleKeys, CONSUMER_GROUP, SALES_INDEX};
use flashgate_common::sale::SaleSpec;
use flashgate_common::scripts::{ADOPT, PREHEAT, RELEASE, RESTORE_LOCK_FREE, RESTORE_LOCK_RENEW};
use redis::aio::ConnectionLike;
use redis::RedisError;
use tokio::sync::watch;

use crate::error::SaleError;
use crate::redis_io::announce;
use crate::store::{OrderRow, OrderStatus, Store};
use crate::switches;

/// Makes Redis count `order` (its item out of `remaining`, its buyer in
/// `buyers`, its reservation in `resv`) unless Redis already knows the
/// reservation. `true` when it was adopted now.
///
/// # Errors
/// Redis failed.
pub async fn adopt<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
    order: &OrderRow,
) -> redis::RedisResult<bool> {
    Ok(order_script(&ADOPT, conn, keys, order).await? == 1)
}

/// Runs `lua/adopt.lua` or `lua/release.lua` for `order`: both take the
/// sale's counters and reservation sets, and the order's reservation and user.
async fn order_script<C: ConnectionLike + Send>(
    script: &redis::Script,
    conn: &mut C,
    keys: &SaleKeys,
    order: &OrderRow,
) -> redis::RedisResult<i64> {
    script
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(&keys.reservations)
        .key(&keys.released)
        .arg(&order.reservation_id)
        .arg(&order.user_id)
        .invoke_async(conn)
        .await
}

/// Redis commands per pipeline while rebuilding a sale.
const CHUNK: usize = 1000;
/// Lifetime of the restore lock without renewal: a restorer killed while
/// holding it keeps the sale unbuyable (`503`) for at most this long.
const RESTORE_LOCK_MS: u64 = 10_000;
/// The lock is renewed this often while a restore works: two renewals can
/// fail (a slow Redis) before it expires.
const RENEW_EVERY: Duration = Duration::from_millis(3_000);
/// Lifetime of a restore's scratch keys, renewed with every write: what a
/// crashed restorer leaves behind goes away on its own.
const SCRATCH_TTL_MS: u64 = 600_000;
/// Cancelled orders returned per pass of [`return_stock`].
const RETURN_BATCH: i64 = 500;

/// What [`restore`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The sale was rebuilt with this many items left.
    Loaded {
        remaining: i64,
        live_orders: i64,
        in_flight: i64,
    },
    /// The sale was in Redis already (or another backend installed it
    /// first), or the database no longer has it; nothing changed.
    NotNeeded,
    /// Another backend holds the lock (or took it over from this one).
    Busy,
    /// The rebuild outlived its scratch keys (it took far too long);
    /// nothing changed, the next pass tries again.
    Retry,
    /// Stock below what the database holds as sold: left absent, logged.
    StockBelowSold { sold: i64 },
    /// A bucketed sale phase 1 cannot rebuild (it has orders, or some of
    /// its buckets survived): left absent, logged; nothing changed.
    LeftAbsent,
}

/// Loads sale `id` into Redis from the database if its `meta` is absent,
/// counting live orders and in-flight reservations as sold (see the module
/// doc); its definition is read from the database under the lock.
/// Idempotent; safe with several backends: one restores, the others
/// answer [`Restored::Busy`] or [`Restored::NotNeeded`], and none of them
/// ever writes over a sale that is live.
///
/// # Errors
/// Redis or the database failed; nothing is installed then, or the sale is
/// installed paused and the next pass of the loop applies its pause (scratch
/// keys may be left; they expire).
pub async fn restore<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
    id: &str,
) -> Result<Restored, SaleError> {
    restore_sale(conn, store, id, None).await
}

/// [`restore`] with a definition the caller has written but not committed
/// yet (the admin API changing a sale Redis lacks), instead of the
/// database's.
///
/// # Errors
/// As [`restore`].
pub async fn restore_given<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
    spec: &SaleSpec,
) -> Result<Restored, SaleError> {
    restore_sale(conn, store, &spec.id, Some(spec)).await
}

async fn restore_sale<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
    id: &str,
    given: Option<&SaleSpec>,
) -> Result<Restored, SaleError> {
    let keys = SaleKeys::new(id);
    // Cheap first look: a present sale costs one EXISTS per poll and no lock.
    if sale_present(conn, &keys).await? {
        return Ok(Restored::NotNeeded);
    }
    let token = uuid::Uuid::new_v4().simple().to_string();
    let locked: Option<String> = redis::cmd("SET")
        .arg(&keys.restoring)
        .arg(&token)
        .arg("NX")
        .arg("PX")
        .arg(RESTORE_LOCK_MS)
        .query_async(conn)
        .await?;
    if locked.is_none() {
        return Ok(Restored::Busy);
    }
    let renewer = conn.clone();
    let result = tokio::select! {
        result = restore_locked(conn, store, id, given, &keys, &token) => result,
        never = keep_lock(renewer, &keys.restoring, &token) => match never {},
    };
    let freed: Result<i64, RedisError> = RESTORE_LOCK_FREE
        .key(&keys.restoring)
        .arg(&token)
        .invoke_async(conn)
        .await;
    if let Err(error) = freed {
        // It expires on its own; the restore itself is done or failed already.
        tracing::warn!(%error, sale = id, "cannot free the restore lock");
    }
    result
}

async fn sale_present<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
) -> Result<bool, RedisError> {
    redis::cmd("EXISTS").arg(&keys.meta).query_async(conn).await
}

/// Renews the lock until dropped. When the lock is lost (it expired during
/// a stall and someone else took it) renewing stops; the install then
/// refuses, since the lock no longer holds our token.
async fn keep_lock<C: ConnectionLike + Send>(mut conn: C, lock: &str, token: &str) -> Infallible {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        let renewed: Result<i64, RedisError> = RESTORE_LOCK_RENEW
            .key(lock)
            .arg(token)
            .arg(RESTORE_LOCK_MS)
            .invoke_async(&mut conn)
            .await;
        match renewed {
            Ok(1) => {}
            Ok(_) => {
                tracing::warn!(
                    lock,
                    "the restore lock was lost; this restore will install nothing"
                );
                return std::future::pending().await;
            }
            Err(error) => tracing::warn!(%error, lock, "cannot renew the restore lock"),
        }
    }
}

async fn restore_locked<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    id: &str,
    given: Option<&SaleSpec>,
    keys: &SaleKeys,
    token: &str,
) -> Result<Restored, SaleError> {
    // Again under the lock: another backend may have restored the sale
    // between the first look and the lock.
    if sale_present(conn, keys).await? {
        return Ok(Restored::NotNeeded);
    }
    // The definition as it is now: the caller's copy may predate an
    // operator's change.
    let spec = match given {
        Some(spec) => spec.clone(),
        None => match store.sales().get(id).await? {
            Some(spec) => spec,
            None => return Ok(Restored::NotNeeded),
        },
    };
    switches::restore_switch(conn, store).await?;
    let orders = store.orders().of_sale(id).await?;
    if spec.buckets > 1 {
        // Phase 1 installs a bucketed sale only before it has any order:
        // rebuilding buckets from orders is not supported yet, and a sale
        // left absent answers 503, never a wrong count.
        // Surviving buckets hold transfers and reservations a fresh share
        // would ignore: installing only the lost ones could oversell.
        let present = crate::buckets::present(conn, id, spec.buckets).await?;
        if !orders.is_empty() || present > 0 {
            tracing::error!(
                sale = id,
                orders = orders.len(),
                surviving_buckets = present,
                "a bucketed sale with orders or surviving buckets cannot be restored into redis yet; left absent"
            );
            return Ok(Restored::LeftAbsent);
        }
        crate::buckets::install(conn, &spec).await?;
    }
    let known: HashSet<&str> = orders.iter().map(|o| o.reservation_id.as_str()).collect();
    // Reservations Redis still has that have no order yet: in flight.
    let surviving: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&keys.reservations)
        .query_async(conn)
        .await?;
    let in_flight: Vec<(&String, &String)> = surviving
        .iter()
        .filter(|(rid, _)| !known.contains(rid.as_str()))
        .collect();

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
    for (rid, user) in &in_flight {
        index.push((rid.as_str(), user.as_str()));
        *buyers.entry(user.as_str()).or_default() += 1;
    }
    let sold = live + in_flight.len() as i64;
    if sold > spec.stock {
        tracing::error!(
            sale = id,
            stock = spec.stock,
            sold,
            "cannot restore: more sold than the stock"
        );
        return Ok(Restored::StockBelowSold { sold });
    }

    let scratch = keys.restore_scratch(token);
    // Each write and the expiry of the keys go in one transaction, so no
    // scratch key is ever left without its expiry.
    let expire = |pipe: &mut redis::Pipeline| {
        for key in [&scratch.buyers, &scratch.reservations, &scratch.released] {
            pipe.cmd("PEXPIRE").arg(key).arg(SCRATCH_TTL_MS).ignore();
        }
    };
    for chunk in index.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (rid, user) in chunk {
            pipe.cmd("HSET")
                .arg(&scratch.reservations)
                .arg(*rid)
                .arg(*user)
                .ignore();
        }
        expire(&mut pipe);
        let () = pipe.query_async(conn).await?;
    }
    let buyers: Vec<_> = buyers.into_iter().collect();
    for chunk in buyers.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (user, n) in chunk {
            pipe.cmd("HSET")
                .arg(&scratch.buyers)
                .arg(*user)
                .arg(*n)
                .ignore();
        }
        expire(&mut pipe);
        let () = pipe.query_async(conn).await?;
    }
    for chunk in cancelled.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("SADD").arg(&scratch.released).arg(chunk).ignore();
        expire(&mut pipe);
        let () = pipe.query_async(conn).await?;
    }

    let remaining = spec.stock - sold;
    // A bucketed sale's items are in its buckets; its own keys sell nothing.
    let own_remaining = if spec.buckets > 1 { 0 } else { remaining };
    let installed: i64 = PREHEAT
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.stream)
        .key(&keys.buyers)
        .key(&keys.reservations)
        .key(&keys.released)
        .key(&keys.restoring)
        .key(&scratch.buyers)
        .key(&scratch.reservations)
        .key(&scratch.released)
        .key(&keys.synced)
        .arg(&spec.name)
        .arg(spec.stock)
        .arg(spec.per_user_limit)
        .arg(spec.starts_at_ms)
        .arg(spec.ends_at_ms)
        .arg(own_remaining)
        .arg(CONSUMER_GROUP)
        .arg(token)
        .arg(buyers.len())
        .arg(index.len())
        .arg(cancelled.len())
        .arg(
            spec.draw_window_ms
                .map(|w| w.to_string())
                .unwrap_or_default(),
        )
        .arg(if spec.buckets > 1 {
            spec.buckets.to_string()
        } else {
            String::new()
        })
        .arg(spec.checkout_url.as_deref().unwrap_or_default())
        .invoke_async(conn)
        .await?;
    match installed {
        1 => {}
        0 => return Ok(Restored::NotNeeded),
        -2 => return Ok(Restored::Busy),
        -3 => {
            tracing::warn!(
                sale = id,
                "the restore outlived its scratch keys; installing nothing, will retry"
            );
            return Ok(Restored::Retry);
        }
        other => return Err(SaleError::BadReply(vec![other])),
    }
    // The index is outside the sale's hash slot, so it cannot be written by
    // the script; adding it again is harmless (and every pass of the loop
    // does, should this backend die right here).
    let () = redis::cmd("SADD")
        .arg(SALES_INDEX)
        .arg(id)
        .query_async(conn)
        .await?;
    // The sale is installed paused. Orders committed after the snapshot
    // were made from reservations the lost Redis had checked: count them
    // now, before anyone can buy, so their items are not sold again and a
    // limit-1 buyer cannot win twice.
    let indexed: HashSet<&str> = index.iter().map(|(rid, _)| *rid).collect();
    let late = adopt_late_orders(conn, store, id, spec.buckets, keys, &indexed).await?;
    // Only now the pause the database holds: one an operator sent during
    // the restore (the database was written first) is never lost. Redis is
    // read before the database and swapped only if unchanged, so a pause
    // applied meanwhile is not undone either.
    let seen: Option<String> = redis::cmd("HGET")
        .arg(&keys.meta)
        .arg("paused")
        .query_async(conn)
        .await?;
    let paused = store.sales().paused(id).await?.unwrap_or(false);
    if let Some(seen) = seen.filter(|seen| *seen != if paused { "1" } else { "0" }) {
        switches::swap_pause(conn, id, &seen, paused, token).await?;
    }
    Ok(Restored::Loaded {
        remaining: remaining - late,
        live_orders: live + late,
        in_flight: in_flight.len() as i64,
    })
}

/// Counts the live orders of sale `id` the install did not (written after
/// its snapshot) with `lua/adopt.lua`; returns how many were adopted.
async fn adopt_late_orders<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    id: &str,
    buckets: u32,
    keys: &SaleKeys,
    indexed: &HashSet<&str>,
) -> Result<i64, SaleError> {
    let mut adopted = 0;
    for o in store.orders().of_sale(id).await? {
        if o.status == OrderStatus::Cancelled || indexed.contains(o.reservation_id.as_str()) {
            continue;
        }
        // A bucketed sale's order is counted in its home bucket.
        let home = (buckets > 1).then(|| SaleKeys::home(id, buckets, &o.user_id));
        if adopt(conn, home.as_ref().unwrap_or(keys), &o).await? {
            adopted += 1;
            tracing::warn!(sale = id, reservation = %o.reservation_id, "order written during the restore adopted: its item cannot be sold again");
        }
    }
    Ok(adopted)
}

/// Restores every sale of the database that is missing from Redis, and
/// brings the global switch and the pause of every present sale in line
/// with the database (one pass of [`watch`]).
///
/// # Errors
/// The database failed (listing sales); a failure on one sale is logged
/// and the others are still tried.
pub async fn restore_missing<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
) -> Result<usize, SaleError> {
    // A Redis that lost every sale lost the global switch too: put it back
    // even when there is no sale to restore, and correct it when it differs
    // from the database.
    if let Err(error) = switches::sync_switch(conn, store).await {
        tracing::warn!(%error, "cannot bring the global switch in redis in line with the database yet");
    }
    let sales = store.sales().all().await?;
    let mut restored = 0;
    for spec in &sales {
        match restore(conn, store, &spec.id).await {
            Ok(Restored::Loaded {
                remaining,
                live_orders,
                in_flight,
            }) => {
                restored += 1;
                tracing::warn!(sale = %spec.id, remaining, live_orders, in_flight, "sale was missing from redis; restored from the database");
                // Gateways forget what they cached of the sale: its
                // sold-out flag is stale, someone may win in it again.
                announce(conn, &SaleEvent::Changed(spec.id.clone())).await;
            }
            Ok(
                Restored::NotNeeded
                | Restored::Busy
                | Restored::Retry
                | Restored::StockBelowSold { .. }
                | Restored::LeftAbsent,
            ) => {}
            Err(error) => {
                tracing::warn!(%error, sale = %spec.id, "cannot restore the sale into redis yet")
            }
        }
    }
    if let Err(error) = switches::sync_pauses(conn, store, &sales).await {
        tracing::warn!(%error, "cannot bring the sales' pauses in redis in line with the database yet");
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
pub async fn return_stock<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
) -> Result<u64, SaleError> {
    let mut returned = 0;
    // Sales that got items back this pass: announced once each.
    let mut restocked = HashSet::new();
    let mut missing = HashSet::new();
    let mut buckets_of: HashMap<String, u32> = HashMap::new();
    let mut cursor = String::new();
    loop {
        let batch = store
            .orders()
            .unreleased_cancelled(&cursor, RETURN_BATCH)
            .await?;
        let full = batch.len() as i64 == RETURN_BATCH;
        if let Some(last) = batch.last() {
            cursor.clone_from(&last.order_id);
        }
        for order in batch {
            // The item goes back to the bucket that counted the
            // reservation: the order's home bucket.
            let buckets = match buckets_of.get(&order.sale_id) {
                Some(n) => *n,
                None => {
                    let n = store
                        .sales()
                        .get(&order.sale_id)
                        .await?
                        .map_or(1, |s| s.buckets);
                    buckets_of.insert(order.sale_id.clone(), n);
                    n
                }
            };
            // Missing is per bucket: one absent bucket holds back only the
            // returns homed in it.
            let home = flashgate_common::keys::home_id(&order.sale_id, buckets, &order.user_id);
            if missing.contains(&home) {
                continue;
            }
            match give_back(conn, store, buckets, &order).await? {
                GiveBack::Returned => {
                    returned += 1;
                    restocked.insert(order.sale_id.clone());
                }
                GiveBack::SaleMissing => {
                    missing.insert(home);
                }
                GiveBack::NothingToReturn => {}
            }
        }
        if !full {
            break;
        }
    }
    // Items came back: gateways forget the sold-out flags of these sales
    // and the winners held with them.
    for sale in restocked {
        announce(conn, &SaleEvent::Changed(sale)).await;
    }
    Ok(returned)
}

/// What [`give_back`] did with a cancelled order's item.
enum GiveBack {
    /// Back in its sale's stock.
    Returned,
    /// The sale (its home bucket) is missing from Redis, being restored:
    /// the restore counts the order as returned, or a later pass returns it.
    SaleMissing,
    /// Returned before, or never counted by Redis.
    NothingToReturn,
}

/// Gives back the item of cancelled `order` of a sale of `buckets`
/// buckets (to its home bucket, which counted the reservation), and
/// records it released unless the sale is missing from Redis.
async fn give_back<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    buckets: u32,
    order: &OrderRow,
) -> Result<GiveBack, SaleError> {
    let keys = SaleKeys::home(&order.sale_id, buckets, &order.user_id);
    let outcome = match order_script(&RELEASE, conn, &keys, order).await? {
        -1 => return Ok(GiveBack::SaleMissing),
        1 => GiveBack::Returned,
        2 => {
            tracing::warn!(
                sale = %order.sale_id,
                reservation = %order.reservation_id,
                "cancelled order whose reservation redis never counted: no item to give back"
            );
            GiveBack::NothingToReturn
        }
        _ => GiveBack::NothingToReturn,
    };
    store
        .orders()
        .mark_released(&order.order_id, flashgate_common::now_ms())
        .await?;
    Ok(outcome)
}

/// Gives back the item of one order the shop just cancelled, at once
/// rather than at the next pass of [`return_stock`] (which still returns
/// it if this fails), and tells the gateways items came back.
///
/// # Errors
/// Redis or the database failed.
pub async fn return_cancelled<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    order: &OrderRow,
) -> Result<(), SaleError> {
    let buckets = store
        .sales()
        .get(&order.sale_id)
        .await?
        .map_or(1, |s| s.buckets);
    if let GiveBack::Returned = give_back(conn, store, buckets, order).await? {
        announce(conn, &SaleEvent::Changed(order.sale_id.clone())).await;
    }
    Ok(())
}

/// Every `interval`, restores the sales Redis lost and re-syncs the fenced
/// ones (see [`crate::fence`]), until `shutdown`.
pub async fn watch<C: ConnectionLike + Send + Clone>(
    conn: C,
    store: Store,
    interval: Duration,
    fence: crate::fence::Resyncer,
    readiness: crate::readiness::Readiness,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        // While Redis reloads or the database is away, the monitor has said
        // so; a pass would only fail and log.
        if !readiness.wait_dependencies(&mut shutdown).await {
            return;
        }
        let mut c = conn.clone();
        if let Err(error) = restore_missing(&mut c, &store).await {
            tracing::warn!(%error, "cannot check the sales in redis; will retry");
        }
        match store.sales().all().await {
            Ok(sales) => {
                fence.resync_fenced(&mut c, &store, &sales).await;
                crate::buckets::repair_all(&mut c, &sales).await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot list the sales to check their fences; will retry")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests;
