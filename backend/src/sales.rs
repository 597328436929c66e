//! Sales: preheating them into Redis, changing them, and the view operators
//! see.
//!
//! The database row is the truth of a sale's definition and of its pause,
//! and the `settings` table the truth of the global switch; Redis holds the
//! live counters the gateway deducts from, and a copy of both switches.
//! Preheating copies a row into Redis only when the sale is absent there
//! (see [`recovery::restore`]), with `remaining = stock - live
//! orders`, installed paused and given the recorded pause once the orders
//! written meanwhile are counted, so restarting a process never resets a
//! running sale and a Redis that lost its data resumes from the orders made,
//! paused if it was paused.
//!
//! Operators' pauses and the global switch are in [`crate::switches`].

use flashgate_common::keys::SaleKeys;
use flashgate_common::sale::{SaleSpec, SaleState};
use flashgate_common::{now_ms, rfc3339};
use redis::aio::ConnectionLike;
use redis::RedisError;
use serde::Serialize;

use crate::error::SaleError;
use crate::recovery::{self, Restored};
use crate::redis_io::{update_sale, IfFenced};
use crate::store::Store;

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

/// Preheats sale `spec.id` from the database when Redis lacks it: its
/// live orders (and reservations still in flight) count as sold, and its
/// buyers and returned items are rebuilt (see [`recovery::restore`]).
/// The definition installed is the one the database holds when the
/// restore has the sale's lock, not `spec`, which may be older.
///
/// # Errors
/// Redis or the database failed, or the sale is being restored (by another
/// backend, or this restore must be retried; the restore loop does).
pub async fn preheat_from_store<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
    spec: &SaleSpec,
) -> Result<Preheat, SaleError> {
    preheat_restored(recovery::restore(conn, store, &spec.id).await?)
}

fn preheat_restored(restored: Restored) -> Result<Preheat, SaleError> {
    match restored {
        Restored::Loaded { remaining, .. } => Ok(Preheat::Loaded { remaining }),
        Restored::NotNeeded => Ok(Preheat::AlreadyThere),
        Restored::Busy | Restored::Retry => Err(SaleError::Restoring),
        // Never "already there": an admin change would apply again, forever.
        Restored::LeftAbsent => Err(SaleError::LeftAbsent),
        Restored::StockBelowSold { sold } => Ok(Preheat::StockBelowSold { sold }),
    }
}

/// Applies a new definition to Redis: changes a preheated sale atomically
/// (keeping what is sold), or preheats an absent one. Gateways are not
/// told: the caller announces the change (`changed:ID`) once it is final,
/// after its commit (see `api::admin`), so no gateway acts on a change
/// the database may still refuse. A stock change on a sale fenced after a
/// failover is refused ([`SaleError::Fenced`]): what it has sold is not
/// known until the re-sync.
///
/// # Errors
/// Redis or the database failed, the sale is fenced and the stock would
/// change, or the script answered nonsense.
pub async fn apply<C: ConnectionLike + Send + Clone>(
    conn: &mut C,
    store: &Store,
    spec: &SaleSpec,
) -> Result<Applied, SaleError> {
    match apply_present(conn, spec).await? {
        Some(applied) => Ok(applied),
        // Absent: load it with this definition, which the caller has not
        // committed yet (the database would still give the old one).
        None => Ok(
            match preheat_restored(recovery::restore_given(conn, store, spec).await?)? {
                Preheat::Loaded { remaining } => Applied::Preheated { remaining },
                Preheat::StockBelowSold { sold } => Applied::StockBelowSold { sold },
                // Someone preheated it between the two scripts: apply again.
                Preheat::AlreadyThere => return Box::pin(apply(conn, store, spec)).await,
            },
        ),
    }
}

/// [`apply`] to a sale Redis holds; `None` (nothing done) when it is
/// absent: for callers that hold the sale's row, which a restore would
/// wait for.
///
/// # Errors
/// As [`apply`].
pub async fn apply_present<C: ConnectionLike + Send>(
    conn: &mut C,
    spec: &SaleSpec,
) -> Result<Option<Applied>, SaleError> {
    let reply = update_sale(conn, spec, IfFenced::Refuse).await?;
    match reply.as_slice() {
        // A bucketed sale: its own `remaining` is 0 and stays so (its
        // stock is in its buckets' bases, which the admin API moves,
        // `crate::buckets::stock`); the new definition is copied to every
        // bucket.
        [1, _] if spec.buckets > 1 => {
            crate::buckets::copy_fields(
                conn,
                &spec.id,
                spec.buckets,
                &crate::buckets::definition_fields(spec),
            )
            .await?;
            let (remaining, _, _) = crate::buckets::counters(conn, &spec.id, spec.buckets).await?;
            Ok(Some(Applied::Updated { remaining }))
        }
        [1, remaining] => Ok(Some(Applied::Updated {
            remaining: *remaining,
        })),
        [0, sold] => Ok(Some(Applied::StockBelowSold { sold: *sold })),
        [-1, _] => Ok(None),
        [-2, held] => Err(SaleError::BucketsDiffer {
            held: *held,
            given: spec.buckets,
        }),
        [-3, _] => Err(SaleError::Fenced),
        _ => Err(SaleError::BadReply(reply)),
    }
}

/// The stock Redis sells sale `id` from (its meta's `stock`; for a
/// bucketed sale the sum of its buckets' bases is the one that counts,
/// see `crate::buckets::stock`); `None` when the sale is not in Redis.
///
/// # Errors
/// Redis failed.
pub async fn stock_in_redis<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
) -> Result<Option<i64>, RedisError> {
    redis::cmd("HGET")
        .arg(SaleKeys::new(id).meta)
        .arg("stock")
        .query_async(conn)
        .await
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
    /// The sale's own opening draw window, ms; `null`: it follows
    /// `[fairness] window_ms`.
    pub draw_window_ms: Option<i64>,
    /// How many buckets the stock is split over (1: one slot).
    pub buckets: u32,
}

/// Live counters read from Redis in one round trip.
struct Counters {
    remaining: Option<i64>,
    reservations: i64,
    paused: bool,
    pending: i64,
}

async fn counters<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
) -> Result<Counters, RedisError> {
    let keys = SaleKeys::new(id);
    if buckets > 1 {
        let paused: Option<String> = redis::cmd("HGET")
            .arg(&keys.meta)
            .arg("paused")
            .query_async(conn)
            .await?;
        let (left, reservations, pending) = crate::buckets::counters(conn, id, buckets).await?;
        // Absent meta: not in Redis, as for a sale of one bucket.
        let remaining = paused.is_some().then_some(left);
        return Ok(Counters {
            remaining,
            reservations,
            paused: paused.as_deref() == Some("1"),
            pending,
        });
    }
    let (remaining, reservations, paused): (Option<i64>, i64, Option<String>) = redis::pipe()
        .get(&keys.remaining)
        .hlen(&keys.reservations)
        .hget(&keys.meta, "paused")
        .query_async(conn)
        .await?;
    let pending = flashgate_common::stream_info::pending(conn, &keys.stream).await?;
    Ok(Counters {
        remaining,
        reservations,
        paused: paused.as_deref() == Some("1"),
        pending,
    })
}

/// Builds the operator view of `spec`. Redis being down leaves its counters
/// empty rather than failing the view: the database part is still useful.
///
/// # Errors
/// The database failed.
pub async fn view<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    spec: SaleSpec,
) -> Result<SaleView, SaleError> {
    let orders = store.orders().count_live(&spec.id).await?;
    let payment_timeout_seconds = store.sales().payment_timeout(&spec.id).await?;
    let live = match counters(conn, &spec.id, spec.buckets).await {
        Ok(c) => Some(c),
        Err(error) => {
            tracing::warn!(%error, sale = %spec.id, "cannot read the sale's counters from redis");
            None
        }
    };
    let remaining = live.as_ref().and_then(|c| c.remaining);
    let paused = live.as_ref().is_some_and(|c| c.paused);
    let state = SaleState::at(
        now_ms(),
        &spec,
        paused,
        remaining.unwrap_or(spec.stock - orders),
    );
    Ok(SaleView {
        starts_at: rfc3339(spec.starts_at_ms),
        ends_at: rfc3339(spec.ends_at_ms),
        state,
        remaining,
        reservations: live.as_ref().map(|c| c.reservations),
        orders,
        payment_timeout_seconds,
        pending: live.as_ref().map(|c| c.pending),
        draw_window_ms: spec.draw_window_ms,
        buckets: spec.buckets,
        id: spec.id,
        name: spec.name,
        stock: spec.stock,
        per_user_limit: spec.per_user_limit,
    })
}
