//! The re-sync of a bucketed sale (`flashgate_common::buckets`) after a
//! failover: each bucket is its own sub-sale with its own `synced` mark,
//! so a failover fences only the buckets whose master changed, and each
//! is re-synced on its own, under the one exclusive hold of the sale's row
//! (no order of the sale commits meanwhile).
//!
//! A fenced bucket K is re-synced only once it has been seen fenced for
//! longer than the **settle bound** ([`Settle`]), then:
//! 1. the database's orders **whose home bucket is K** are counted in K
//!    (`lua/resync.lua`, exactly as a sale's re-sync does);
//! 2. K's transfers are reconciled with the other buckets' records
//!    (`lua/resync_transfers.lua`): a transfer into K that its donor
//!    records as done but K's `xfer-in` lacks is added (K lost the add);
//!    a record of another bucket's `xfer-in` naming K as donor that K's
//!    `xfer-out` lacks is recorded as done and its items taken from K (K
//!    lost the take). Open transfers into K are the transit repair's: its
//!    give is idempotent, so an add K lost is redone;
//! 3. if the buckets' bases (each meta's `stock`) no longer sum to the
//!    database's stock (a base change K lost), K's base and remaining move
//!    by the difference, never below zero remaining (left fenced, logged);
//! 4. the definition is copied to K, and K's fence is lifted only if every
//!    script ran on the Redis that holds K now.
//!
//! Every step is idempotent, so a re-sync cut anywhere (or a second
//! failover meanwhile: `Moved`) is simply run again by the next pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashgate_common::buckets::home_bucket;
use flashgate_common::keys::{SaleEvent, SaleKeys};
use flashgate_common::sale::SaleSpec;
use flashgate_common::transfer::{Received, Record, REFILL_DEADLINE_TIMEOUTS};
use redis::aio::ConnectionLike;
use redis::Script;

use super::{count_page, fence, Resynced, Resyncer, PAGE};
use crate::error::SaleError;
use crate::redis_io::announce;
use crate::store::{Store, SyncedOrder};

/// Reconciles one bucket's transfers and base (`lua/resync_transfers.lua`).
static RESYNC_TRANSFERS: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../../lua/resync_transfers.lua")));

/// The settle wait of fenced buckets.
///
/// A gateway that took items out of bucket K on its old master (a take
/// record the failover may have lost) gives them to their target within
/// its refill deadline or never: the refill runs under a deadline of
/// [`REFILL_DEADLINE_TIMEOUTS`] × `redis.timeout_ms` after the buyer's
/// first deduct, itself cut at one `redis.timeout_ms`, and the take comes
/// after that deduct. The failover comes after the take, and the backend
/// sees the fence after the failover. So once K has been seen fenced for
/// `(1 + REFILL_DEADLINE_TIMEOUTS + 1) × redis.timeout_ms` (the first
/// deduct, the refill, and one more timeout for a give already sent when
/// the deadline cut its caller), every give of a take K lost is in its
/// target's `xfer-in` or will never be: the reconciliation then sees it.
/// While K is fenced nobody takes from it (`lua/xfer_out.lua` answers
/// `fenced`), so no new lost take can appear.
///
/// The first sighting is kept in memory per (sale, bucket): a restarted
/// backend starts the clock again, which only re-syncs later (safe). It is
/// forgotten when the bucket is seen unfenced or has been re-synced, so
/// the next failover starts a new wait.
#[derive(Clone)]
pub(super) struct Settle {
    bound: Duration,
    first_seen: Arc<Mutex<HashMap<(String, u32), Instant>>>,
}

impl Settle {
    pub(super) fn new(redis_timeout: Duration) -> Self {
        Self { bound: redis_timeout * (REFILL_DEADLINE_TIMEOUTS + 2), first_seen: Arc::default() }
    }

    /// Whether bucket `k` of `sale_id`, fenced now, was first seen fenced
    /// at least the bound ago (the first sighting starts the clock).
    fn due(&self, sale_id: &str, k: u32) -> bool {
        let mut seen = self.first_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.entry((sale_id.to_owned(), k)).or_insert_with(Instant::now).elapsed() >= self.bound
    }

    fn forget(&self, sale_id: &str, k: u32) {
        let mut seen = self.first_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.remove(&(sale_id.to_owned(), k));
    }
}

/// Re-syncs every fenced bucket of `sale_id` (`buckets` of them) whose
/// settle wait is over (see the module doc). Answers `Synced` (summed over
/// the buckets re-synced now) if any was, else the first other outcome
/// (`Moved`, `StockBelowSold`), else `Settling` if a bucket waits, else
/// `NotNeeded`.
pub(super) async fn resync<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    buckets: u32,
    resyncer: &Resyncer,
) -> Result<Resynced, SaleError> {
    let (mut due, mut settling) = (Vec::new(), false);
    for k in 0..buckets {
        resyncer.scripts.inc();
        if fence(conn, &SaleKeys::bucket(sale_id, k), "").await?.settled().is_some() {
            resyncer.settle.forget(sale_id, k);
        } else if resyncer.settle.due(sale_id, k) {
            due.push(k);
        } else {
            settling = true;
        }
    }
    if due.is_empty() {
        return Ok(if settling { Resynced::Settling } else { Resynced::NotNeeded });
    }
    let mut hold = store.begin_resync(sale_id).await?;
    let orders = hold.orders(sale_id).await?;
    let spec = hold.sale(sale_id).await?;
    let (mut synced, mut other) = (None::<(i64, i64)>, None);
    for k in due {
        let outcome = resync_bucket(conn, sale_id, buckets, k, &orders, spec.as_ref(), resyncer).await?;
        match outcome {
            Resynced::Synced { adopted, returned } => {
                resyncer.settle.forget(sale_id, k);
                tracing::warn!(
                    sale = sale_id,
                    bucket = k,
                    adopted,
                    returned,
                    "bucket re-synced with the database after its redis changed; selling again"
                );
                let (a, r) = synced.unwrap_or((0, 0));
                synced = Some((a + adopted, r + returned));
            }
            Resynced::NotNeeded | Resynced::Absent => resyncer.settle.forget(sale_id, k),
            Resynced::StockBelowSold { sold } => {
                tracing::error!(
                    sale = sale_id,
                    bucket = k,
                    sold,
                    "the bucket's stock would fall below what it sold; the bucket stays fenced"
                );
                other.get_or_insert(outcome);
            }
            Resynced::Moved | Resynced::Settling => {
                other.get_or_insert(outcome);
            }
        }
    }
    hold.commit().await?;
    Ok(match (synced, other) {
        (Some((adopted, returned)), _) => Resynced::Synced { adopted, returned },
        (None, Some(other)) => other,
        (None, None) if settling => Resynced::Settling,
        (None, None) => Resynced::NotNeeded,
    })
}

/// Transfers the other buckets record that concern bucket `k`: those into
/// `k` their donor records as done (`(xid, donor, n)`), and those their
/// `xfer-in` holds with `k` as donor (`(xid, target, n)`).
type Peers = (Vec<(String, u32, i64)>, Vec<(String, u32, i64)>);

async fn peers<C: ConnectionLike + Send>(conn: &mut C, sale_id: &str, buckets: u32, k: u32) -> Result<Peers, SaleError> {
    let (mut into, mut out) = (Vec::new(), Vec::new());
    for x in (0..buckets).filter(|x| *x != k) {
        let keys = SaleKeys::bucket(sale_id, x);
        let sent: HashMap<String, String> = redis::cmd("HGETALL").arg(&keys.xfer_out).query_async(conn).await?;
        for (xid, raw) in sent.iter().filter(|(xid, _)| !xid.starts_with('#')) {
            if let Ok(r) = serde_json::from_str::<Record>(raw) {
                if r.to == k && r.done {
                    into.push((xid.clone(), x, r.n));
                }
            }
        }
        let received: HashMap<String, String> = redis::cmd("HGETALL").arg(&keys.xfer_in).query_async(conn).await?;
        for (xid, raw) in &received {
            if let Some(Received { from: Some(from), n }) = Received::parse(raw) {
                if from == k {
                    out.push((xid.clone(), x, n));
                }
            }
        }
    }
    Ok((into, out))
}

/// The change bucket `k`'s base needs so that the buckets' bases sum to
/// the database's `stock`; 0 when a bucket's meta is absent (the sum is
/// unknown: nothing is changed).
async fn base_change<C: ConnectionLike + Send>(conn: &mut C, sale_id: &str, buckets: u32, stock: i64) -> Result<i64, SaleError> {
    let mut sum = 0;
    for x in 0..buckets {
        let base: Option<i64> = redis::cmd("HGET").arg(SaleKeys::bucket(sale_id, x).meta).arg("stock").query_async(conn).await?;
        let Some(base) = base else {
            tracing::warn!(sale = sale_id, bucket = x, "a bucket is not in redis; its base is unknown, no base change applied");
            return Ok(0);
        };
        sum += base;
    }
    Ok(stock - sum)
}

async fn resync_bucket<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
    k: u32,
    orders: &[SyncedOrder],
    spec: Option<&SaleSpec>,
    resyncer: &Resyncer,
) -> Result<Resynced, SaleError> {
    let keys = SaleKeys::bucket(sale_id, k);
    // Again under the hold: another backend may have re-synced it.
    resyncer.scripts.inc();
    let seen = fence(conn, &keys, "").await?;
    if let Some(settled) = seen.settled() {
        return Ok(settled);
    }
    let mine: Vec<SyncedOrder> = orders.iter().filter(|o| home_bucket(&o.row.user_id, buckets) == k).cloned().collect();
    let (mut adopted, mut returned) = (0, 0);
    for page in mine.chunks(PAGE) {
        resyncer.scripts.inc();
        let (replid, counted, back) = count_page(conn, &keys, page, resyncer.idempotency_ttl).await?;
        if counted < 0 {
            return Ok(Resynced::Absent);
        }
        if replid != seen.replid {
            return Ok(Resynced::Moved);
        }
        adopted += counted;
        returned += back;
    }
    let (into, out) = peers(conn, sale_id, buckets, k).await?;
    let change = match spec {
        Some(spec) => base_change(conn, sale_id, buckets, spec.stock).await?,
        None => 0,
    };
    let mut call = RESYNC_TRANSFERS.prepare_invoke();
    call.key(&keys.meta).key(&keys.remaining).key(&keys.xfer_out).key(&keys.xfer_in).key(&keys.reservations).key(&keys.released);
    call.arg(change).arg(into.len());
    for (xid, bucket, n) in into.iter().chain(&out) {
        call.arg(xid).arg(*bucket).arg(*n);
    }
    resyncer.scripts.inc();
    let (replid, added, taken, status, remaining, reserved): (String, i64, i64, i64, i64, i64) = call.invoke_async(conn).await?;
    match status {
        1 => {}
        0 => {
            tracing::error!(sale = sale_id, bucket = k, remaining, change, "the bucket's remaining would be negative after its re-sync");
            return Ok(Resynced::StockBelowSold { sold: reserved });
        }
        _ => return Ok(Resynced::Absent),
    }
    if replid != seen.replid {
        return Ok(Resynced::Moved);
    }
    if added > 0 || taken > 0 || change != 0 {
        tracing::warn!(sale = sale_id, bucket = k, added, taken, change, "bucket's transfers and base reconciled with the other buckets");
    }
    if let Some(spec) = spec {
        let mut fields = crate::buckets::definition_fields(spec);
        let paused: Option<String> = redis::cmd("HGET").arg(SaleKeys::new(sale_id).meta).arg("paused").query_async(conn).await?;
        fields.extend(paused.map(|p| ("paused", p)));
        resyncer.scripts.inc();
        crate::buckets::copy_fields_to(conn, sale_id, k, &fields).await?;
    }
    resyncer.scripts.inc();
    if !fence(conn, &keys, &seen.replid).await?.lifted {
        return Ok(Resynced::Moved);
    }
    // Gateways forget what they cached, and the flag of the bucket empty.
    announce(conn, &SaleEvent::Changed(sale_id.to_owned())).await;
    announce(conn, &SaleEvent::BucketStocked { sale: sale_id.to_owned(), bucket: k }).await;
    Ok(Resynced::Synced { adopted, returned })
}
