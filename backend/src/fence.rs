//! The failover fence: a sale whose Redis may have gone back in time sells
//! nothing until the backend has made that Redis agree with the database.
//!
//! Replication is asynchronous. A replica promoted by Sentinel or by the
//! cluster, or a Redis restarted from an older RDB or an `everysec` AOF,
//! may lack the last deducts: buyers were told they won, and the database
//! may hold their orders. Its `remaining`, `buyers` and `resv` are those of
//! an earlier moment, so it would sell those items again.
//!
//! Every Redis gets a new replication id (`master_replid`) when it becomes
//! a master, at a promotion and at every start. Each sale records in
//! `synced` (see `flashgate_common::keys::SaleKeys::synced`) the id of the
//! Redis it was last made to agree with the database on: the install of a
//! restore writes it, and so does [`resync`]. The deduct script compares
//! the two and answers `fenced` (the gateway: `503` with `Retry-After`)
//! while they differ. [`resync_fenced`], one pass of the backend's
//! recovery loop, finds fenced sales and re-syncs each:
//!
//! 1. it holds the sale's row in the database exclusively
//!    (`crate::store::SaleResync`): no order of the sale commits until it
//!    is done, and every order write checks its reservation in Redis under
//!    a shared hold (`crate::counted`), so no order can slip between the
//!    read below and the end of the re-sync;
//! 2. it reads every order of the sale;
//! 3. `lua/resync.lua` counts, page by page, each live order Redis does
//!    not know (`resv`, `buyers`, `remaining`, and its Idempotency-Key so a
//!    retry replays the win) and gives back the item of each cancelled one
//!    Redis still counts; each page answers the replication id it ran on;
//! 4. it applies the sale's definition as the database has it
//!    (`lua/update_sale.lua`): an operator's change may be among the lost
//!    writes;
//! 5. `lua/fence.lua` lifts the fence only if every page ran on the Redis
//!    that holds the sale now. A second failover meanwhile leaves the sale
//!    fenced, and the next pass starts again: the pages are idempotent.
//!
//! A bucketed sale (see `crate::buckets`) is re-synced bucket by bucket,
//! each fenced bucket on its own (the token fence on the other buckets,
//! its orders, its transfers against the other buckets' records, a
//! shortfall covered from the other buckets, then its base stock): see
//! `bucketed`. The sale's own keys stay fenced for ever
//! (nothing is sold from them).
//!
//! A sale a restore installs (Redis lost it entirely) is installed fenced
//! too, and the same re-sync makes it sell: the start-up preheat and the
//! admin API run it at once, after their own work, the recovery loop on
//! its next pass.
//!
//! Reservations Redis has and the database does not (their orders are on
//! their way) stay counted. A reservation lost with the failover whose
//! order never reached the database is gone: its forward is refused
//! (`crate::counted`), and with `redis.wait_replicas = 0` its buyer was
//! told `202` for nothing. That is the promise `wait_replicas` buys.

use std::time::Duration;

use flashgate_common::keys::{SaleEvent, SaleKeys};
use flashgate_common::sale::SaleSpec;
use flashgate_common::scripts::{FENCE, RESYNC};
use prometheus::IntCounter;
use redis::aio::ConnectionLike;

use crate::error::SaleError;
use crate::redis_io::{announce, update_sale, IfFenced};
use crate::store::{OrderStatus, Store, SyncedOrder};

/// Orders per `lua/resync.lua` call: one call keeps Redis busy for about a
/// millisecond per thousand.
const PAGE: usize = 500;

/// What [`resync`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resynced {
    /// The sale agrees with the database on the Redis that holds it.
    NotNeeded,
    /// The sale is not in Redis: the restore loop installs it.
    Absent,
    /// Redis now counts every order: `adopted` live orders it did not
    /// know, `returned` cancelled orders' items it still counted.
    Synced { adopted: i64, returned: i64 },
    /// The Redis holding the sale changed while it was re-synced: still
    /// fenced, the next pass starts again.
    Moved,
    /// The database's stock is below what Redis counts as sold (after the
    /// orders were counted): left fenced, logged for an operator.
    StockBelowSold { sold: i64 },
    /// Another bucket's transfer-in record has no donor (a bare count
    /// from an older version) or cannot be read: a take the failed-over
    /// bucket lost cannot be seen, so it stays fenced, logged for an
    /// operator (see `bucketed`).
    UnreadableTransfers,
}

/// The fence as `lua/fence.lua` reports it.
struct Fence {
    replid: String,
    synced: String,
    present: bool,
    lifted: bool,
}

impl Fence {
    /// What a re-sync has to do with a sale it finds so: nothing (`Some`),
    /// or count its orders (`None`).
    fn settled(&self) -> Option<Resynced> {
        if !self.present {
            Some(Resynced::Absent)
        } else if self.synced == self.replid {
            Some(Resynced::NotNeeded)
        } else {
            None
        }
    }
}

async fn fence<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
    lift: &str,
) -> Result<Fence, SaleError> {
    let (replid, synced, present, lifted): (String, String, i64, i64) = FENCE
        .key(&keys.meta)
        .key(&keys.synced)
        .arg(lift)
        .invoke_async(conn)
        .await?;
    Ok(Fence {
        replid,
        synced,
        present: present == 1,
        lifted: lifted == 1,
    })
}

/// Whether sale `sale_id` is fenced on the Redis that holds it now
/// (present there, and not re-synced since that Redis became a master):
/// its stock cannot change until the re-sync. `lua/update_sale.lua`
/// refuses such a change itself; this asks first for a raise, which goes
/// to Redis only after its commit (`api::admin`).
///
/// # Errors
/// Redis failed.
pub async fn is_fenced<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
) -> Result<bool, SaleError> {
    let seen = fence(conn, &SaleKeys::new(sale_id), "").await?;
    Ok(seen.present && seen.synced != seen.replid)
}

/// Re-syncs fenced sales: what the recovery loop, the start-up preheat
/// and the admin API share (the Idempotency-Keys' lifetime, and the
/// counter of the scripts it runs, which the benchmark subtracts from
/// Redis's script calls).
#[derive(Clone)]
pub struct Resyncer {
    idempotency_ttl: Duration,
    scripts: IntCounter,
}

impl Resyncer {
    /// Idempotency-Keys written back live at most `idempotency_ttl` after
    /// their win; every script call is counted in `scripts`.
    pub fn new(idempotency_ttl: Duration, scripts: IntCounter) -> Self {
        Self {
            idempotency_ttl,
            scripts,
        }
    }

    /// Re-syncs sale `sale_id` if it is fenced (see the module doc).
    ///
    /// # Errors
    /// Redis or the database failed; the sale stays fenced and what was
    /// counted stays counted (the next pass counts nothing twice).
    pub async fn resync<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        store: &Store,
        sale_id: &str,
    ) -> Result<Resynced, SaleError> {
        let buckets = crate::buckets::in_redis(conn, sale_id).await?;
        if buckets > 1 {
            return bucketed::resync(conn, store, sale_id, buckets, self).await;
        }
        resync(conn, store, sale_id, self.idempotency_ttl, &self.scripts).await
    }

    /// Re-syncs every fenced sale among `sales` (one pass of the recovery
    /// loop), those open now first; returns how many were re-synced. A
    /// failure on one sale is logged and the others are still tried.
    pub async fn resync_fenced<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        store: &Store,
        sales: &[SaleSpec],
    ) -> usize {
        let now = flashgate_common::now_ms();
        let mut order: Vec<&SaleSpec> = sales.iter().collect();
        // Open sales first, then those to come, the ended last: after a
        // failover every sale of the Redis is fenced, and a buyer waits
        // only on the ones that sell.
        order.sort_by_key(|s| (s.ends_at_ms <= now, s.starts_at_ms > now, s.starts_at_ms));
        let mut synced = 0;
        for spec in order {
            match self.resync(conn, store, &spec.id).await {
                Ok(Resynced::Synced { adopted, returned }) => {
                    synced += 1;
                    tracing::warn!(sale = %spec.id, adopted, returned, "sale re-synced with the database after its redis changed; selling again");
                }
                Ok(Resynced::Moved) => {
                    tracing::warn!(sale = %spec.id, "redis changed again during the re-sync; still fenced")
                }
                Ok(Resynced::StockBelowSold { sold }) => tracing::error!(
                    sale = %spec.id,
                    stock = spec.stock,
                    sold,
                    "the database's stock is below what redis counts as sold; the sale stays fenced"
                ),
                Ok(Resynced::UnreadableTransfers) => {
                    tracing::error!(sale = %spec.id, "a fenced bucket cannot be re-synced from unreadable transfer records; still fenced")
                }
                Ok(Resynced::NotNeeded | Resynced::Absent) => {}
                Err(error) => {
                    tracing::warn!(%error, sale = %spec.id, "cannot re-sync the fenced sale yet")
                }
            }
        }
        synced
    }
}

async fn resync<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    idempotency_ttl: Duration,
    scripts: &IntCounter,
) -> Result<Resynced, SaleError> {
    let keys = SaleKeys::new(sale_id);
    scripts.inc();
    if let Some(settled) = fence(conn, &keys, "").await?.settled() {
        return Ok(settled);
    }
    let mut hold = store.locks().begin_resync(sale_id).await?;
    // Again under the hold: another backend may have re-synced it.
    scripts.inc();
    let seen = fence(conn, &keys, "").await?;
    if let Some(settled) = seen.settled() {
        return Ok(settled);
    }
    let orders = hold.orders(sale_id).await?;
    let (adopted, returned) =
        match count_orders(conn, &keys, &orders, &seen.replid, idempotency_ttl, scripts).await? {
            Ok(counted) => counted,
            Err(stopped) => return Ok(stopped),
        };
    // The definition too: an operator's change may be among the writes
    // this Redis lacks. Its remaining moves by the change in stock, so the
    // orders counted above stay counted.
    if let Some(spec) = hold.sale(sale_id).await? {
        let reply = update_sale(conn, &spec, IfFenced::Apply).await?;
        scripts.inc();
        match reply.as_slice() {
            [1, _] => {}
            [0, sold] => return Ok(Resynced::StockBelowSold { sold: *sold }),
            [-1, _] => return Ok(Resynced::Absent),
            _ => return Err(SaleError::BadReply(reply)),
        }
    }
    scripts.inc();
    if !fence(conn, &keys, &seen.replid).await?.lifted {
        return Ok(Resynced::Moved);
    }
    hold.commit().await?;
    // Gateways forget what they cached: remaining, sold out, the window.
    announce(conn, &SaleEvent::Changed(sale_id.to_owned())).await;
    Ok(Resynced::Synced { adopted, returned })
}

/// Counts `orders` in the sale or bucket of `keys`, page by page
/// (`lua/resync.lua`), each page checked to have run on the Redis of
/// replication id `replid`: `(adopted, returned)`, or why it stopped
/// (`Absent`: the keys are gone; `Moved`: the Redis changed). Every page
/// is one script call, counted in `scripts`.
async fn count_orders<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
    orders: &[SyncedOrder],
    replid: &str,
    idempotency_ttl: Duration,
    scripts: &IntCounter,
) -> Result<Result<(i64, i64), Resynced>, SaleError> {
    let (mut adopted, mut returned) = (0, 0);
    for page in orders.chunks(PAGE) {
        scripts.inc();
        let (ran_on, counted, back) = count_page(conn, keys, page, idempotency_ttl).await?;
        if counted < 0 {
            return Ok(Err(Resynced::Absent));
        }
        if ran_on != replid {
            return Ok(Err(Resynced::Moved));
        }
        adopted += counted;
        returned += back;
    }
    Ok(Ok((adopted, returned)))
}

async fn count_page<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
    page: &[SyncedOrder],
    idempotency_ttl: Duration,
) -> Result<(String, i64, i64), SaleError> {
    let mut invocation = RESYNC.prepare_invoke();
    invocation
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(&keys.reservations)
        .key(&keys.released);
    let now = flashgate_common::now_ms();
    let mut next_key = 6;
    for o in page {
        let live = o.row.status != OrderStatus::Cancelled;
        // A key is remembered for the TTL after its win, not after a re-sync.
        let ttl_left = (idempotency_ttl.as_millis() as i64 - (now - o.reserved_at_ms)) / 1000;
        let key_index = if !o.idempotency_key.is_empty() && ttl_left > 0 {
            invocation.key(keys.idempotency(&o.row.user_id, &o.idempotency_key));
            next_key += 1;
            next_key - 1
        } else {
            0
        };
        invocation
            .arg(&o.row.reservation_id)
            .arg(&o.row.user_id)
            .arg(if live { "live" } else { "cancelled" })
            .arg(key_index)
            .arg(ttl_left.max(1));
    }
    Ok(invocation.invoke_async(conn).await?)
}

mod bucketed;
#[cfg(test)]
mod tests;
