//! The one way an order enters the database: only while the Redis that
//! sells its sale counts its reservation (`resv` holds it, for its user).
//!
//! Whatever brings a reservation here (the gateway's forward, the stream
//! consumer, reconciliation repairing an unprocessed entry), the check and
//! the insert run inside one transaction that holds the sales shared
//! (`crate::store::OrderWrite`), so a re-sync after a failover
//! (`crate::fence`) either sees the order or runs before the check, which
//! then asks the re-synced Redis. A reservation that Redis no longer
//! counts (lost with the last writes of a Redis that failed over) is not
//! written: its item may be sold to someone else already, and the database
//! must never hold more orders than the stock.
//!
//! A bucketed sale counts a reservation in the `resv` of its user's home
//! bucket (`flashgate_common::buckets::home_bucket`), where the deduct
//! that made it ran.

use std::collections::{HashMap, HashSet};

use flashgate_common::buckets::home_bucket;
use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::Reservation;
use redis::aio::ConnectionLike;
use redis::RedisError;

use crate::store::{Store, StoreError};

/// Why a batch could not be written; nothing of it was then.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("database: {0}")]
    Store(#[from] StoreError),
}

/// What [`write_counted`] did with a batch.
#[derive(Debug, Default)]
pub struct Written {
    /// Reservations Redis counts, each once: they all have an order now.
    pub counted: Vec<Reservation>,
    /// Which of `counted` got their order from this call.
    pub created: HashSet<String>,
    /// Reservations Redis does not count for their user; not written.
    pub uncounted: Vec<Reservation>,
}

/// Writes an order for every reservation of `batch` that Redis counts for
/// its user, in one transaction (see the module doc). A reservation listed
/// twice is written once.
///
/// # Errors
/// Redis or the database failed; nothing is written then.
pub async fn write_counted<C: ConnectionLike + Send>(
    store: &Store,
    conn: &mut C,
    batch: &[Reservation],
) -> Result<Written, WriteError> {
    if batch.is_empty() {
        return Ok(Written::default());
    }
    let sales: Vec<&str> = batch.iter().map(|r| r.sale_id.as_str()).collect();
    // A bucketed sale counts a reservation in its user's home bucket (the
    // counts are the store's: one read per sale and store).
    let mut buckets: HashMap<&str, u32> = HashMap::new();
    for sale in sales.iter().copied() {
        if !buckets.contains_key(sale) {
            buckets.insert(sale, store.sales().buckets(sale).await?);
        }
    }
    let mut write = store.locks().begin_order_write(&sales).await?;
    let holders = holders(conn, batch, &buckets).await?;
    let mut seen = HashSet::with_capacity(batch.len());
    let (mut counted, mut uncounted) = (Vec::with_capacity(batch.len()), Vec::new());
    for (r, holder) in batch.iter().zip(holders) {
        if holder.as_deref() != Some(r.user_id.as_str()) {
            uncounted.push(r.clone());
        } else if seen.insert(r.reservation_id.clone()) {
            counted.push(r.clone());
        }
    }
    // A copy Redis refuses (another user) must not shadow a valid copy
    // listed after it, nor count as refused once a valid copy was written.
    uncounted.retain(|r| !seen.contains(&r.reservation_id));
    let created = write.insert(&counted).await?;
    write.commit().await?;
    Ok(Written {
        counted,
        created,
        uncounted,
    })
}

/// Who Redis says holds each reservation of `batch` (in its order): one
/// `HMGET` per `resv` hash (the sale's, or each home bucket's), all in one
/// pipeline, rather than one `HGET` and one set of key names per
/// reservation.
async fn holders<C: ConnectionLike + Send>(
    conn: &mut C,
    batch: &[Reservation],
    buckets: &HashMap<&str, u32>,
) -> Result<Vec<Option<String>>, RedisError> {
    let mut group_of: HashMap<(&str, u32), usize> = HashMap::new();
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, r) in batch.iter().enumerate() {
        let n = buckets.get(r.sale_id.as_str()).copied().unwrap_or(1);
        let home = home_bucket(&r.user_id, n);
        let g = *group_of
            .entry((r.sale_id.as_str(), home))
            .or_insert_with(|| {
                let key = SaleKeys::home(&r.sale_id, n, &r.user_id).reservations;
                groups.push((key, Vec::new()));
                groups.len() - 1
            });
        groups[g].1.push(i);
    }
    let mut pipe = redis::pipe();
    for (key, members) in &groups {
        pipe.cmd("HMGET").arg(key);
        for &i in members {
            pipe.arg(&batch[i].reservation_id);
        }
    }
    let replies: Vec<Vec<Option<String>>> = pipe.query_async(conn).await?;
    let mut holders = vec![None; batch.len()];
    for ((_, members), reply) in groups.iter().zip(replies) {
        for (&i, holder) in members.iter().zip(reply) {
            holders[i] = holder;
        }
    }
    Ok(holders)
}
