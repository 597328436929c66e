//! A buy in a bucketed sale (`flashgate_common::buckets`): the deduct runs
//! on the buyer's home bucket; when that bucket answers a fresh `sold_out`
//! while other buckets may hold items, items are moved into it
//! (`flashgate_common::transfer`) and the deduct runs again, so a dry
//! bucket never makes a buyer hear `sold_out` while the sale has stock.
//!
//! ```text
//! deduct on home K ── won / refused ─────────────────────────► answer
//!        └─ sold_out: flag K empty (a hint), then until the deadline:
//!           donor D = K itself first (its own items may be in transit),
//!           then the buckets not flagged empty here (random start), then
//!           the flagged ones (flags are hints, never trusted for 410)
//!           take on D ── moved t ──► (with `redis.wait_replicas`: the
//!                 │                   take on D's replicas, else 503)
//!                 │                   give t to K (carrying D's replication
//!                 │                   id: the token fence), close on D, clear
//!                 │                   K's flag (announced), deduct on K
//!                 │                   again: won or refused ─► answer
//!                 ├─ stocked (D = K holds items again) ► deduct again
//!                 ├─ empty ─────────► D dry here, flag D (hint), next D
//!                 ├─ in transit to X ► complete that transfer (give to X,
//!                 │                   close on D; no replica wait, the
//!                 │                   token fence covers it); X = K: deduct on K
//!                 │                   again, else X is the next donor
//!                 └─ fenced / absent ► next D
//!           every D answered empty ─► confirm (`transfer::confirm_dry`,
//!                 2 × N calls): dry ─► flag the sale ─► sold_out (410)
//!           anything else (not confirmed, a donor fenced or absent, a
//!           Redis error, the deadline) ─► unavailable (503, Retry-After)
//! ```
//!
//! The whole loop runs under `tokio::time::timeout_at` of
//! [`REFILL_DEADLINE_TIMEOUTS`] Redis timeouts (`redis.timeout_ms`) after
//! the first deduct: a buyer whose bucket ran dry waits at most the first
//! deduct plus that (1 s at the default 250 ms), then wins, is refused,
//! hears `sold_out` or `unavailable`. Cutting the loop mid-transfer is safe:
//! the transfer stays open and the backend's transit repair completes it.
//! The sale is answered sold out locally (0 Redis calls) only once this
//! gateway confirmed every bucket dry, and only to buys without an
//! Idempotency-Key; per-bucket flags only order donors. A keyed buy of a
//! sale so flagged has the confirmation run again (2 × N reads, no
//! transfers) and, still dry, its home bucket's `sold_out` remembered
//! under its key.

use std::collections::HashSet;

use flashgate_common::buckets::{bucket_id, home_bucket};
use flashgate_common::keys::SaleEvent;
use flashgate_common::transfer::{self, Given, Taken};
use tracing::{debug, warn};

use super::BuyService;
use crate::buy::deduct::Decision;
use crate::infra::WallClock;
use crate::rejection::Rejection;

/// Most items one transfer moves: half of what the donor holds, rounded
/// up, at most this. A batch serves the next buyers of the receiving
/// bucket without a transfer each, while a small cap keeps one busy bucket
/// from draining the others.
pub const TRANSFER_BATCH_MAX: i64 = 8;

/// How long a buyer whose home bucket ran dry may wait for items from the
/// other buckets, in Redis timeouts (`redis.timeout_ms`, 250 ms by
/// default: 1 s).
pub const REFILL_DEADLINE_TIMEOUTS: u32 = 4;

impl<C: WallClock> BuyService<C> {
    /// The deduct of a bucketed sale, with transfers into the buyer's home
    /// bucket when it ran dry (see the module doc).
    pub(super) async fn deduct_in_buckets(
        &self,
        sale_id: &str,
        buckets: u32,
        user: &str,
        idempotency_key: &str,
        rid: &str,
    ) -> Result<Decision, Rejection> {
        let home = home_bucket(user, buckets);
        // A keyed buy of a sale this gateway confirmed dry since its last
        // clear: the confirmation runs again (2 × N reads, no transfers)
        // rather than trusting the flag; still dry, the key's answer is the
        // home bucket's, remembered.
        if !idempotency_key.is_empty()
            && self.sales.is_sold_out(sale_id)
            && self.confirm_dry(sale_id, buckets).await?
        {
            return self
                .deduct(sale_id, buckets, user, idempotency_key, rid, true)
                .await;
        }
        let decision = self
            .deduct(sale_id, buckets, user, idempotency_key, rid, false)
            .await?;
        if !decision.found_sold_out() {
            return Ok(decision);
        }
        self.flag_empty(sale_id, home).await;
        let deadline =
            tokio::time::Instant::now() + self.redis.config().timeout * REFILL_DEADLINE_TIMEOUTS;
        match tokio::time::timeout_at(
            deadline,
            self.refill(sale_id, buckets, user, idempotency_key, rid, home),
        )
        .await
        {
            Ok(Ok(Some(decision))) => Ok(decision),
            // Every bucket confirmed dry (flagged sold out by `refill`):
            // final for an unkeyed buy; a key's answer is the home bucket's
            // once more, now remembered, so the key never wins later. It may
            // still win (items came back since), or replay the key's first
            // answer (the same key raced itself).
            Ok(Ok(None)) if idempotency_key.is_empty() => Ok(decision),
            Ok(Ok(None)) => {
                self.deduct(sale_id, buckets, user, idempotency_key, rid, true)
                    .await
            }
            Ok(Err(rejection)) => Err(rejection),
            Err(_) => {
                self.metrics
                    .bucket_transfers
                    .with_label_values(&["deadline"])
                    .inc();
                Err(Rejection::Unavailable)
            }
        }
    }

    /// Moves items into `home` and deducts there again until the buyer
    /// wins or is refused (`Some`), or every bucket is confirmed dry
    /// (`None`); anything short of that is [`Rejection::Unavailable`].
    async fn refill(
        &self,
        sale_id: &str,
        buckets: u32,
        user: &str,
        idempotency_key: &str,
        rid: &str,
        home: u32,
    ) -> Result<Option<Decision>, Rejection> {
        let start = rand::random::<u32>() % buckets;
        // The home bucket first: its own items may be in transit elsewhere.
        let mut next: Option<u32> = Some(home);
        let mut tried: HashSet<u32> = HashSet::new();
        // Buckets that answered `empty` in this loop (flags do not count).
        let mut dry: HashSet<u32> = HashSet::new();
        loop {
            let order = (0..buckets).map(|i| (start + i) % buckets);
            let donor = next.take().filter(|d| !tried.contains(d)).or_else(|| {
                let mut untried = order.filter(|d| !tried.contains(d));
                let all: Vec<u32> = untried.by_ref().collect();
                all.iter()
                    .copied()
                    .find(|d| !self.sales.bucket_empty(sale_id, *d))
                    .or_else(|| all.first().copied())
            });
            let Some(donor) = donor else { break };
            tried.insert(donor);
            dry.remove(&donor);
            let xid = format!("{:016x}", rand::random::<u64>());
            let (taken, node) = self.take(sale_id, donor, home, &xid).await?;
            let again = match taken {
                Taken::Moved(n) => {
                    self.take_replicated(sale_id, donor, node.as_deref())
                        .await?;
                    self.metrics
                        .bucket_transfers
                        .with_label_values(&["moved"])
                        .inc();
                    self.deliver(
                        sale_id,
                        donor,
                        home,
                        &xid,
                        n,
                        node.as_deref().unwrap_or_default(),
                    )
                    .await?;
                    // If others of this bucket take the batch first, the
                    // donor kept half of what it had: ask it again.
                    tried.remove(&donor);
                    true
                }
                Taken::Stocked => {
                    tried.remove(&donor);
                    true
                }
                Taken::Empty => {
                    self.metrics
                        .bucket_transfers
                        .with_label_values(&["empty"])
                        .inc();
                    dry.insert(donor);
                    self.flag_empty(sale_id, donor).await;
                    false
                }
                Taken::InTransit { to, xid, n, replid } => {
                    // Items on their way (a gateway between the two sides of
                    // a transfer, or one that died there): completed here,
                    // which is harmless if their taker completes it too.
                    self.metrics
                        .bucket_transfers
                        .with_label_values(&["in_transit"])
                        .inc();
                    self.deliver(sale_id, donor, to, &xid, n, &replid).await?;
                    tried.remove(&donor);
                    if to != home {
                        tried.remove(&to);
                        next = Some(to);
                    }
                    to == home
                }
                Taken::NotFound | Taken::Fenced => {
                    self.metrics
                        .bucket_transfers
                        .with_label_values(&["unavailable"])
                        .inc();
                    false
                }
            };
            if again {
                let decision = self
                    .deduct(sale_id, buckets, user, idempotency_key, rid, false)
                    .await?;
                if !decision.found_sold_out() {
                    return Ok(Some(decision));
                }
                self.flag_empty(sale_id, home).await;
            }
        }
        if dry.len() as u32 != buckets {
            // A donor fenced or absent: its items cannot be reached now.
            return Err(Rejection::Unavailable);
        }
        if self.confirm_dry(sale_id, buckets).await? {
            Ok(None)
        } else {
            Err(Rejection::Unavailable)
        }
    }

    /// Whether every bucket is dry in Redis (`transfer::confirm_dry`, 2 × N
    /// calls); when it is, the sale is flagged sold out here.
    async fn confirm_dry(&self, sale_id: &str, buckets: u32) -> Result<bool, Rejection> {
        // Taken before the confirmation: items stocked into a bucket after
        // it read that bucket (a `stocked` event, or a clear) must not be
        // hidden behind a sold-out flag set after them.
        let clears = self.sales.clears(sale_id);
        let confirmed = self
            .redis
            .call(
                |mut conn| async move { transfer::confirm_dry(&mut conn, sale_id, buckets).await },
            )
            .await
            .map_err(|e| self.unavailable(&e))?;
        if confirmed {
            self.confirmed_dry(sale_id, clears);
        }
        Ok(confirmed)
    }

    /// Every bucket was confirmed dry: the sale is flagged sold out here
    /// (answered without Redis from now), unless it was cleared or a
    /// bucket stocked since `clears` was taken.
    pub(super) fn confirmed_dry(&self, sale_id: &str, clears: crate::sales::Clears) {
        if self
            .sales
            .flag_sold_out(sale_id, None, Some(clears))
            .is_none()
            && !self.sales.is_sold_out(sale_id)
        {
            debug!(
                sale = sale_id,
                "every bucket confirmed dry, but one was stocked since; not flagged"
            );
        }
    }

    /// Step 1 of a transfer, on the donor; with the replication id of the
    /// donor's Redis when items moved.
    async fn take(
        &self,
        sale_id: &str,
        donor: u32,
        home: u32,
        xid: &str,
    ) -> Result<(Taken, Option<String>), Rejection> {
        self.redis
            .call(|mut conn| async move {
                transfer::take_on(&mut conn, sale_id, donor, home, xid, TRANSFER_BATCH_MAX).await
            })
            .await
            .map_err(|e| self.unavailable(&e))
    }

    /// With `redis.wait_replicas` set: returns once that many replicas of
    /// the donor's master (replication id `node`) hold the take, so a
    /// failover of the donor cannot lose the take of items given to their
    /// target. Not confirmed: the buyer hears `503` and the
    /// transfer stays open, for the transit repair to deliver (its record
    /// survived) or never (it was lost with the items it took). The
    /// `in_transit` path and the transit repair give without this wait;
    /// they, and gateways without replica waits, are covered by the token
    /// fence: the give carries the take's replication id, and once the
    /// re-sync of a failed-over donor has read its target's records, a
    /// give of a take made on the donor's old Redis is refused
    /// (`flashgate_common::transfer`, `backend/src/fence/bucketed.rs`).
    async fn take_replicated(
        &self,
        sale_id: &str,
        donor: u32,
        node: Option<&str>,
    ) -> Result<(), Rejection> {
        if self.replica_wait.is_none() {
            return Ok(());
        }
        self.replicated(&bucket_id(sale_id, donor), node).await.inspect_err(|_| {
            warn!(sale = sale_id, donor, "a transfer's take is not on replicas in time; left open for the transit repair");
        })
    }

    /// Steps 2 and 3: the items into `to`, then the transfer closed on
    /// the donor; `to` is no longer empty, here and on every gateway. The
    /// give carries `replid`, the donor Redis's replication id where the
    /// take ran (the token fence, `flashgate_common::transfer`). A failure
    /// leaves the transfer open: the backend's transit repair completes it
    /// (`flashgate_common::transfer::repair`).
    async fn deliver(
        &self,
        sale_id: &str,
        donor: u32,
        to: u32,
        xid: &str,
        n: i64,
        replid: &str,
    ) -> Result<(), Rejection> {
        let given = self
            .redis
            .call(|mut conn| async move {
                transfer::give(&mut conn, sale_id, donor, to, xid, n, replid).await
            })
            .await
            .map_err(|e| self.unavailable(&e))?;
        match given {
            Given::Added | Given::Before => {}
            // The home bucket is gone (its Redis lost it): left open.
            Given::Absent => return Err(Rejection::Unavailable),
            Given::Refused => {
                // The donor's re-sync fenced off the Redis the take ran on.
                warn!(
                    sale = sale_id,
                    donor,
                    to,
                    transfer = xid,
                    "a transfer's give was refused by the token fence; left open"
                );
                return Err(Rejection::Unavailable);
            }
        }
        let closed = self
            .redis
            .call(|mut conn| async move { transfer::close(&mut conn, sale_id, donor, xid).await })
            .await;
        if closed.is_err() {
            warn!(
                sale = sale_id,
                donor,
                transfer = xid,
                "cannot close a delivered transfer; the backend's repair will"
            );
        }
        self.sales.bucket_stocked(sale_id, to);
        self.announce(&SaleEvent::BucketStocked {
            sale: sale_id.to_owned(),
            bucket: to,
        })
        .await;
        Ok(())
    }

    /// Flags a bucket empty here and on every gateway: a hint for choosing
    /// donors, never a reason to answer `sold_out`.
    async fn flag_empty(&self, sale_id: &str, bucket: u32) {
        if self.sales.bucket_empty(sale_id, bucket) {
            return;
        }
        self.sales.mark_bucket_empty(sale_id, bucket);
        self.announce(&SaleEvent::BucketSoldOut {
            sale: sale_id.to_owned(),
            bucket,
        })
        .await;
    }

    async fn announce(&self, event: &SaleEvent) {
        if let Err(error) = self.redis.publish(event).await {
            warn!(%error, event = event.encode(), "could not announce a bucket event");
        }
    }
}
