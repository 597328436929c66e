//! Sales: preheating them into Redis, changing them, and the view operators
//! see.
//!
//! The database row is the truth of a sale's definition and of its pause,
//! and the `settings` table the truth of the global switch; Redis holds the
//! live counters the gateway deducts from, and a copy of both switches.
//! Preheating copies a row into Redis only when the sale is absent there
//! (see [`crate::recovery::restore`]), with `remaining = stock - live
//! orders` and the recorded pause, so restarting a process never resets a
//! running sale and a Redis that lost its data resumes from the orders made,
//! paused if it was paused.
//!
//! Operators' pause and switch changes write the database first, then
//! Redis: whatever Redis loses afterwards, the database already has.

use flashgate_common::keys::SaleEvent;
use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP, GLOBAL_SWITCH};
use flashgate_common::sale::{SaleSpec, SaleState};
use flashgate_common::{now_ms, rfc3339};
use redis::aio::ConnectionLike;
use redis::RedisError;
use serde::Serialize;

use crate::redis_io::UPDATE_SALE;
use crate::store::{Store, StoreError};

/// Why a sale could not be preheated, changed or viewed.
#[derive(Debug, thiserror::Error)]
pub enum SaleError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("unexpected reply {0:?} from a sale script")]
    BadReply(Vec<i64>),
    #[error("another backend is restoring the sale into redis")]
    Restoring,
}

/// What preheating did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preheat {
    /// The sale was loaded into Redis with this many items left.
    Loaded { remaining: i64 },
    /// The sale was already in Redis; nothing changed.
    AlreadyThere,
    /// The stock is below the orders the database holds; nothing changed.
    StockBelowSold { sold: i64 },
}

/// What applying a new definition to Redis did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A preheated sale was changed; this many items are left.
    Updated { remaining: i64 },
    /// The sale was absent and has been loaded.
    Preheated { remaining: i64 },
    /// The new stock is below what is already sold; nothing changed.
    StockBelowSold { sold: i64 },
}

/// Preheats `spec` from the database when Redis lacks it: its live orders
/// (and reservations still in flight) count as sold, and its buyers and
/// returned items are rebuilt (see [`crate::recovery::restore`]).
///
/// # Errors
/// Redis or the database failed, or another backend is restoring it.
pub async fn preheat_from_store<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
    spec: &SaleSpec,
) -> Result<Preheat, SaleError> {
    use crate::recovery::{restore, Restored};
    match restore(conn, store, spec).await? {
        Restored::Loaded { remaining, .. } => Ok(Preheat::Loaded { remaining }),
        Restored::NotNeeded => Ok(Preheat::AlreadyThere),
        Restored::Busy => Err(SaleError::Restoring),
        Restored::StockBelowSold { sold } => Ok(Preheat::StockBelowSold { sold }),
    }
}

/// Applies a new definition to Redis: changes a preheated sale atomically
/// (keeping what is sold), or preheats an absent one.
///
/// # Errors
/// Redis or the database failed, or the script answered nonsense.
pub async fn apply<C: ConnectionLike + Send + Clone>(conn: &mut C, store: &Store, spec: &SaleSpec) -> Result<Applied, SaleError> {
    let keys = SaleKeys::new(&spec.id);
    let reply: Vec<i64> = UPDATE_SALE
        .key(&keys.meta)
        .key(&keys.remaining)
        .arg(&spec.name)
        .arg(spec.stock)
        .arg(spec.per_user_limit)
        .arg(spec.starts_at_ms)
        .arg(spec.ends_at_ms)
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [1, remaining] => {
            announce_change(conn, &spec.id).await;
            Ok(Applied::Updated { remaining: *remaining })
        }
        [0, sold] => Ok(Applied::StockBelowSold { sold: *sold }),
        [-1, _] => Ok(match preheat_from_store(conn, store, spec).await? {
            Preheat::Loaded { remaining } => Applied::Preheated { remaining },
            Preheat::StockBelowSold { sold } => Applied::StockBelowSold { sold },
            // Someone preheated it between the two scripts: apply again.
            Preheat::AlreadyThere => return Box::pin(apply(conn, store, spec)).await,
        }),
        _ => Err(SaleError::BadReply(reply)),
    }
}

/// Tells every gateway to forget what it cached about the sale (window,
/// sold-out flag). Best effort: gateways also let those expire on their own.
async fn announce_change<C: ConnectionLike + Send>(conn: &mut C, id: &str) {
    announce(conn, &SaleEvent::Changed(id.to_owned())).await;
}

/// Publishes an event to every gateway; a failure is logged, not returned,
/// because gateways re-read what they cache on their own schedule.
async fn announce<C: ConnectionLike + Send>(conn: &mut C, event: &SaleEvent) {
    let sent: Result<i64, RedisError> =
        redis::cmd("PUBLISH").arg(flashgate_common::keys::EVENTS_CHANNEL).arg(event.encode()).query_async(conn).await;
    if let Err(error) = sent {
        tracing::warn!(%error, event = event.encode(), "could not announce to gateways");
    }
}

/// Where an operator's pause or resume of a sale took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// Recorded and applied to the live sale.
    Applied,
    /// Recorded; the sale is not in Redis right now, and its restore
    /// applies the recorded value before anyone can buy.
    Recorded,
    /// No such sale.
    Unknown,
}

/// Pauses or resumes one sale: the deduct script refuses buys of a paused
/// sale, and gateways are told to drop their cached window at once. The
/// database is written first, so a Redis that loses the sale afterwards
/// gets it back paused.
///
/// # Errors
/// The database or Redis failed. After a Redis failure the database holds
/// the new value (calling again is harmless).
pub async fn set_paused<C: ConnectionLike + Send>(conn: &mut C, store: &Store, id: &str, paused: bool) -> Result<Paused, SaleError> {
    if !store.set_sale_paused(id, paused).await? {
        return Ok(Paused::Unknown);
    }
    Ok(if apply_pause(conn, id, paused).await? { Paused::Applied } else { Paused::Recorded })
}

/// Writes a sale's pause into Redis, only if the sale is there (never
/// creates a half sale); returns whether it was.
///
/// # Errors
/// Redis failed.
pub async fn apply_pause<C: ConnectionLike + Send>(conn: &mut C, id: &str, paused: bool) -> Result<bool, RedisError> {
    let keys = SaleKeys::new(id);
    let script = redis::Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end redis.call('HSET', KEYS[1], 'paused', ARGV[1]) return 1",
    );
    let existed: i64 = script.key(&keys.meta).arg(if paused { "1" } else { "0" }).invoke_async(conn).await?;
    if existed == 1 {
        announce_change(conn, id).await;
    }
    Ok(existed == 1)
}

/// Turns the global switch: `paused` stops every buy on every gateway.
/// Written to the database first, then to Redis.
///
/// # Errors
/// The database or Redis failed. After a Redis failure the database holds
/// the new value (calling again is harmless).
pub async fn set_all_paused<C: ConnectionLike + Send>(conn: &mut C, store: &Store, paused: bool) -> Result<(), SaleError> {
    store.set_all_paused(paused).await?;
    let () = redis::cmd("SET").arg(GLOBAL_SWITCH).arg(switch_value(paused)).query_async(conn).await?;
    announce(conn, &SaleEvent::AllPaused(paused)).await;
    Ok(())
}

fn switch_value(paused: bool) -> &'static str {
    if paused {
        "paused"
    } else {
        "open"
    }
}

/// Puts the recorded global switch back into a Redis that lost it (`SET
/// NX`: a switch Redis has is the one last written, database first, by
/// [`set_all_paused`]). Returns whether it was missing.
///
/// # Errors
/// The database or Redis failed.
pub async fn restore_switch<C: ConnectionLike + Send>(conn: &mut C, store: &Store) -> Result<bool, SaleError> {
    let paused = store.all_paused().await?;
    let written: Option<String> = redis::cmd("SET").arg(GLOBAL_SWITCH).arg(switch_value(paused)).arg("NX").query_async(conn).await?;
    if written.is_some() {
        tracing::warn!(paused, "global switch was missing from redis; restored from the database");
        announce(conn, &SaleEvent::AllPaused(paused)).await;
    }
    Ok(written.is_some())
}

/// A sale as operators see it: its definition and live counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SaleView {
    pub id: String,
    pub name: String,
    pub stock: i64,
    pub per_user_limit: i64,
    pub starts_at: String,
    pub ends_at: String,
    pub state: SaleState,
    /// Items left in Redis; `None` when Redis does not answer.
    pub remaining: Option<i64>,
    /// Reservations made in Redis; `None` when Redis does not answer.
    pub reservations: Option<i64>,
    /// Orders in the database that are not cancelled.
    pub orders: i64,
    /// Unpaid orders are cancelled this long after their reservation.
    pub payment_timeout_seconds: Option<i64>,
    /// Stream entries delivered to a consumer but not acknowledged yet;
    /// `None` when Redis does not answer.
    pub pending: Option<i64>,
}

/// Live counters read from Redis in one round trip.
struct Counters {
    remaining: Option<i64>,
    reservations: i64,
    paused: bool,
    pending: i64,
}

async fn counters<C: ConnectionLike + Send>(conn: &mut C, id: &str) -> Result<Counters, RedisError> {
    let keys = SaleKeys::new(id);
    let (remaining, reservations, paused): (Option<i64>, i64, Option<String>) = redis::pipe()
        .get(&keys.remaining)
        .hlen(&keys.reservations)
        .hget(&keys.meta, "paused")
        .query_async(conn)
        .await?;
    // XPENDING fails with NOGROUP before the group exists: nothing pending.
    let pending = match redis::cmd("XPENDING").arg(&keys.stream).arg(CONSUMER_GROUP).query_async::<redis::Value>(conn).await {
        Ok(redis::Value::Array(items)) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        Ok(_) => 0,
        Err(e) if e.code() == Some("NOGROUP") => 0,
        Err(e) => return Err(e),
    };
    Ok(Counters { remaining, reservations, paused: paused.as_deref() == Some("1"), pending })
}

/// Builds the operator view of `spec`. Redis being down leaves its counters
/// empty rather than failing the view: the database part is still useful.
///
/// # Errors
/// The database failed.
pub async fn view<C: ConnectionLike + Send>(conn: &mut C, store: &Store, spec: SaleSpec) -> Result<SaleView, SaleError> {
    let orders = store.count_live_orders(&spec.id).await?;
    let payment_timeout_seconds = store.payment_timeout(&spec.id).await?;
    let live = match counters(conn, &spec.id).await {
        Ok(c) => Some(c),
        Err(error) => {
            tracing::warn!(%error, sale = %spec.id, "cannot read the sale's counters from redis");
            None
        }
    };
    let remaining = live.as_ref().and_then(|c| c.remaining);
    let paused = live.as_ref().is_some_and(|c| c.paused);
    let state = SaleState::at(now_ms(), &spec, paused, remaining.unwrap_or(spec.stock - orders));
    Ok(SaleView {
        starts_at: rfc3339(spec.starts_at_ms),
        ends_at: rfc3339(spec.ends_at_ms),
        state,
        remaining,
        reservations: live.as_ref().map(|c| c.reservations),
        orders,
        payment_timeout_seconds,
        pending: live.as_ref().map(|c| c.pending),
        id: spec.id,
        name: spec.name,
        stock: spec.stock,
        per_user_limit: spec.per_user_limit,
    })
}
