//! [`SaleCache`]: everything one gateway holds about its sales.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashgate_common::keys::SALES_INDEX;
use moka::ops::compute::Op;

use super::snapshot::{read_snapshot, SaleSnapshot, SaleSummary, SaleView, SaleWindow};
use crate::infra::OrderClient;
use crate::infra::{RedisClient, RedisError};

/// How old a snapshot may be for a buy's window check.
pub const WINDOW_TTL: Duration = Duration::from_secs(2);
/// How long a sold-out flag is trusted without news.
pub const SOLD_OUT_TTL: Duration = Duration::from_secs(30);
/// How long the backend's answer about a sale missing from Redis is trusted.
pub const MISSING_TTL: Duration = Duration::from_secs(1);
/// Most sales tracked at once.
const MAX_SALES: u64 = 10_000;

/// A snapshot and when it was read. `None`: the sale is not in Redis
/// (cached too, so a flood of requests for an unknown sale costs one Redis
/// read per TTL).
#[derive(Clone)]
struct Held {
    snapshot: Option<Arc<SaleSnapshot>>,
    read_at: Instant,
}

/// What the backend said about a sale Redis does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingSale {
    /// The database has it: Redis lost it and it is being restored.
    Restoring,
    /// Nobody knows this sale.
    Unknown,
    /// The backend did not answer: refuse to sell, but do not say 404.
    NoAnswer,
}

/// What one gateway knows of a sale's stock: its sold-out flag, and what
/// tells a stale `sold_out` from a fresh one.
#[derive(Debug, Clone, Copy, Default)]
struct Stock {
    /// The newest stock epoch known (`lua/release.lua`): from `sold_out`
    /// answers and events, and read from Redis on each `changed` event. A
    /// `sold_out` decided at an older epoch was decided before items came
    /// back, and flags nothing.
    epoch: u64,
    /// Flagged sold out until then: unkeyed buys are answered without Redis.
    sold_out_until: Option<Instant>,
    /// The sale's clears so far (see [`Clears`]).
    clears: Clears,
    /// Since a blind clear (its epoch unknown here): another gateway's
    /// `sold_out` may be older than the change and this gateway cannot
    /// tell, so announced ones flag nothing until an epoch is known again
    /// (a clear whose epoch was read, or a `sold_out` of its own deducts
    /// sent after the clear).
    distrust_announced: bool,
}

/// Where a sale stands in its clears (a change, items back, a bucket
/// stocked, the subscription re-established): taken before a call whose
/// `sold_out` is read later, it tells whether stock may have come back
/// since ([`SaleCache::flag_sold_out`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clears {
    /// The number of the sale's last clear of any kind.
    all: u64,
    /// The number of its last clear whose new stock epoch is not known
    /// here (its read failed, or it has none: a bucket stocked): only
    /// these can make a `sold_out` that carries its epoch stale unseen.
    blind: u64,
}

impl Stock {
    fn flagged(&self) -> bool {
        self.sold_out_until
            .is_some_and(|until| Instant::now() < until)
    }
}

/// The hasher of every table here: aHash, seeded at random per process.
/// Sale ids come from request paths, so a client chooses the ones it asks
/// for (and unknown ones are remembered in `absent`); the random seed
/// keeps it from aiming them at one bucket, at a fraction of SipHash's
/// cost on every buy's lookups.
type Hasher = ahash::RandomState;

/// One per gateway, shared by the buy path, the sale routes and the
/// events listener.
pub struct SaleCache {
    /// One snapshot per sale; each reader accepts it up to its own age
    /// ([`WINDOW_TTL`] for buys, `pages.state_ttl_ms` for views), and the
    /// entry lives as long as the longer of the two.
    snapshots: moka::future::Cache<String, Held, Hasher>,
    /// Sale ids Redis does not have, with when that was read; apart from
    /// `snapshots` so a flood of reads of made-up ids cannot evict the
    /// snapshots real sales' buys use.
    absent: moka::future::Cache<String, Instant, Hasher>,
    view_ttl: Duration,
    /// Each sale's sold-out flag, stock epoch and clears (see [`Stock`]).
    /// A flag answers only buys without an Idempotency-Key: a keyed buy is
    /// always decided by Redis, which remembers its answer, so no key ever
    /// gets a final answer from a flag that may be stale.
    stock: moka::sync::Cache<String, Stock, Hasher>,
    /// Numbers the clears of every sale.
    clear_count: AtomicU64,
    missing: moka::future::Cache<String, MissingSale, Hasher>,
    /// Empty buckets of bucketed sales, by sale and bucket: set from a
    /// deduct's `sold_out` on a bucket or a transfer finding a bucket empty
    /// (here or announced), cleared when items move into the bucket. The
    /// sale's own flag (`sold_out`) is set only once every bucket was
    /// confirmed dry in Redis; these are hints for choosing donors.
    empty_buckets: moka::sync::Cache<(String, u32), (), Hasher>,
    /// Each sale's bucket count as last read: it never changes for a saved
    /// sale, so a buy answered locally finds its home bucket without Redis.
    bucket_counts: moka::sync::Cache<String, u32, Hasher>,
}

impl SaleCache {
    /// A cache whose views are at most `view_ttl` old (`pages.state_ttl_ms`).
    pub fn new(view_ttl: Duration) -> Self {
        Self {
            snapshots: moka::future::Cache::builder()
                .max_capacity(MAX_SALES)
                .time_to_live(view_ttl.max(WINDOW_TTL))
                .build_with_hasher(Hasher::new()),
            absent: moka::future::Cache::builder()
                .max_capacity(MAX_SALES)
                .time_to_live(view_ttl.max(WINDOW_TTL))
                .build_with_hasher(Hasher::new()),
            view_ttl,
            stock: moka::sync::Cache::builder()
                .max_capacity(MAX_SALES)
                .build_with_hasher(Hasher::new()),
            clear_count: AtomicU64::new(0),
            missing: moka::future::Cache::builder()
                .max_capacity(MAX_SALES)
                .time_to_live(MISSING_TTL)
                .build_with_hasher(Hasher::new()),
            empty_buckets: moka::sync::Cache::builder()
                .max_capacity(MAX_SALES * 4)
                .time_to_live(SOLD_OUT_TTL)
                .build_with_hasher(Hasher::new()),
            bucket_counts: moka::sync::Cache::builder()
                .max_capacity(MAX_SALES)
                .build_with_hasher(Hasher::new()),
        }
    }

    /// The sale's snapshot, at most `max_age` old: from memory, or one Redis
    /// read shared by every concurrent caller (moka's `try_get_with` is
    /// single-flight). A stale entry is dropped only if it is still the
    /// stale one, so callers that saw it stale together cause one read.
    ///
    /// # Errors
    /// When Redis cannot be read; nothing is cached then, every waiter gets
    /// the error and the next call retries.
    async fn snapshot(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        max_age: Duration,
    ) -> Result<Option<Arc<SaleSnapshot>>, Arc<RedisError>> {
        if let Some(read_at) = self.absent.get(sale_id).await {
            if read_at.elapsed() <= max_age {
                return Ok(None);
            }
        }
        if let Some(held) = self.snapshots.get(sale_id).await {
            if held.read_at.elapsed() <= max_age {
                return Ok(held.snapshot);
            }
            self.snapshots
                .entry_by_ref(sale_id)
                .and_compute_with(|entry| {
                    let stale = entry.is_some_and(|e| e.value().read_at.elapsed() > max_age);
                    std::future::ready(if stale { Op::Remove } else { Op::Nop })
                })
                .await;
        }
        // Boxed: moka's single-flight future is many kilobytes, and held
        // inline it would grow the future of every request that can reach
        // here (moved into its box on each request), where only a miss
        // needs it.
        let held = Box::pin(self.snapshots.try_get_with_by_ref(sale_id, async {
            let snapshot = read_snapshot(redis, sale_id).await?;
            Ok::<_, RedisError>(Held {
                snapshot: snapshot.map(Arc::new),
                read_at: Instant::now(),
            })
        }))
        .await?;
        if let Some(s) = &held.snapshot {
            self.bucket_counts
                .insert(sale_id.to_owned(), s.window.buckets);
        }
        if held.snapshot.is_none() {
            self.snapshots.invalidate(sale_id).await;
            self.absent.insert(sale_id.to_owned(), held.read_at).await;
        }
        Ok(held.snapshot)
    }

    /// The sale's window for a buy (`None`: not in Redis), at most
    /// [`WINDOW_TTL`] old.
    ///
    /// # Errors
    /// When Redis cannot be read.
    pub async fn window(
        &self,
        redis: &RedisClient,
        sale_id: &str,
    ) -> Result<Option<SaleWindow>, Arc<RedisError>> {
        Ok(self
            .snapshot(redis, sale_id, WINDOW_TTL)
            .await?
            .map(|s| s.window))
    }

    /// The sale's view at `now_ms`, from a snapshot at most
    /// `pages.state_ttl_ms` old.
    ///
    /// # Errors
    /// When Redis cannot be read.
    pub async fn view(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        now_ms: i64,
    ) -> Result<Option<SaleView>, Arc<RedisError>> {
        Ok(self
            .snapshot(redis, sale_id, self.view_ttl)
            .await?
            .and_then(|s| s.view(now_ms)))
    }

    /// Every preheated sale, sorted by start time. Each sale comes from its
    /// snapshot, so listing costs what reading each sale costs.
    ///
    /// # Errors
    /// When Redis fails or times out.
    pub async fn list(
        &self,
        redis: &RedisClient,
        now_ms: i64,
    ) -> Result<Vec<SaleSummary>, Arc<RedisError>> {
        let ids: Vec<String> = redis
            .call(|mut conn| async move {
                redis::cmd("SMEMBERS")
                    .arg(SALES_INDEX)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self
                .snapshot(redis, &id, self.view_ttl)
                .await?
                .and_then(|s| s.summary(now_ms))
            {
                out.push(s);
            }
        }
        out.sort_by(|a, b| a.starts_at.cmp(&b.starts_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Counts a win of this gateway's in the sale's snapshot, if held (no
    /// Redis call), so its own buyers' next view shows the item gone. Only
    /// a snapshot read before the win's script was sent (`sent_at`) is
    /// counted down: one read after it may already hold the win, and
    /// counting it twice would show items gone that are still for sale
    /// (an over-report until the next refresh is the lesser error).
    pub async fn took_one(&self, sale_id: &str, sent_at: Instant) {
        if let Some(Held {
            snapshot: Some(s),
            read_at,
        }) = self.snapshots.get(sale_id).await
        {
            if read_at < sent_at {
                s.took_one();
            }
        }
    }

    /// Whether the sale is flagged sold out here: an unkeyed buy is then
    /// answered without Redis.
    pub fn is_sold_out(&self, sale_id: &str) -> bool {
        self.stock.get(sale_id).is_some_and(|s| s.flagged())
    }

    /// Flags the sale sold out (or renews its flag) for a `sold_out`
    /// decided at stock `epoch`, unless stock came back after it was
    /// decided: a newer epoch is known, or the sale was cleared since
    /// `clears` was taken (before the call that found it) in a way its
    /// epoch cannot tell. Without an epoch (the draw's outcome, a bucketed
    /// sale confirmed dry) it is judged at the newest epoch known, by every
    /// clear since `clears`. The epoch flagged at when the sale was not
    /// flagged before (the caller announces it with that epoch).
    pub fn flag_sold_out(
        &self,
        sale_id: &str,
        epoch: Option<u64>,
        clears: Option<Clears>,
    ) -> Option<u64> {
        let mut newly = None;
        self.stock.entry_by_ref(sale_id).and_upsert_with(|held| {
            let mut stock = held.map(|e| e.into_value()).unwrap_or_default();
            let cleared = match clears {
                Some(c) if epoch.is_some() => c.blind != stock.clears.blind,
                Some(c) => c != stock.clears,
                // Announced by another gateway.
                None => stock.distrust_announced,
            };
            let carried = epoch.is_some();
            let epoch = epoch.unwrap_or(stock.epoch);
            if epoch >= stock.epoch && !cleared {
                newly = (!stock.flagged()).then_some(epoch);
                stock.distrust_announced &= !(carried && clears.is_some());
                stock.epoch = epoch;
                stock.sold_out_until = Some(Instant::now() + SOLD_OUT_TTL);
            }
            stock
        });
        newly
    }

    /// The script found `sale_id` sold out just now, at stock `epoch`, for
    /// a call sent at `clears`: flagged as [`SaleCache::flag_sold_out`]
    /// does, and its snapshot shows no stock left.
    pub async fn found_sold_out(
        &self,
        sale_id: &str,
        epoch: Option<u64>,
        clears: Clears,
    ) -> Option<u64> {
        let newly = self.flag_sold_out(sale_id, epoch, Some(clears));
        if self.is_sold_out(sale_id) {
            if let Some(Held {
                snapshot: Some(s), ..
            }) = self.snapshots.get(sale_id).await
            {
                s.sold_out();
            }
        }
        newly
    }

    /// Where the sale stands in its clears ([`Clears`]).
    pub fn clears(&self, sale_id: &str) -> Clears {
        self.stock
            .get(sale_id)
            .map(|s| s.clears)
            .unwrap_or_default()
    }

    /// Clears the sale's flag and counts a clear; the stock epoch rises to
    /// `epoch` when one is given (else the clear is a blind one).
    fn clear(&self, sale_id: &str, epoch: Option<u64>) {
        let number = self.clear_count.fetch_add(1, Ordering::Relaxed) + 1;
        self.stock.entry_by_ref(sale_id).and_upsert_with(|held| {
            let held = held.map(|e| e.into_value()).unwrap_or_default();
            let blind = if epoch.is_some() {
                held.clears.blind
            } else {
                number
            };
            Stock {
                epoch: held.epoch.max(epoch.unwrap_or(0)),
                sold_out_until: None,
                clears: Clears { all: number, blind },
                distrust_announced: epoch.is_none(),
            }
        });
    }

    /// Every sold-out flag cleared, the epochs kept: sale events may have
    /// been missed (the subscription was down), so no flag can be trusted.
    pub fn clear_all_flags(&self) {
        for (sale_id, _) in &self.stock {
            self.clear(&sale_id, None);
        }
        self.empty_buckets.invalidate_all();
    }

    /// The sale's bucket count, from its snapshot (at most [`WINDOW_TTL`]
    /// old; 1 when Redis cannot be read: the sale's own keys then sell
    /// nothing, its buys answer 503 fenced, never a wrong win).
    pub async fn buckets(&self, redis: &RedisClient, sale_id: &str) -> u32 {
        if let Some(n) = self.bucket_counts.get(sale_id) {
            return n;
        }
        self.window(redis, sale_id)
            .await
            .ok()
            .flatten()
            .map_or(1, |w| w.buckets)
    }

    /// Whether bucket `bucket` of `sale_id` is flagged empty here.
    pub fn bucket_empty(&self, sale_id: &str, bucket: u32) -> bool {
        self.empty_buckets
            .contains_key(&(sale_id.to_owned(), bucket))
    }

    /// Flags bucket `bucket` of a sale empty: a hint for choosing donors
    /// only. The sale itself is flagged sold out only after every bucket
    /// was confirmed dry in Redis (`crate::buy` refill).
    pub fn mark_bucket_empty(&self, sale_id: &str, bucket: u32) {
        self.empty_buckets.insert((sale_id.to_owned(), bucket), ());
    }

    /// Items moved into bucket `bucket` of `sale_id`: it is not empty, so
    /// neither is the sale. It counts as a clear ([`SaleCache::clears`]):
    /// a refill that confirmed every bucket dry before this then does not
    /// flag the sale sold out again.
    pub fn bucket_stocked(&self, sale_id: &str, bucket: u32) {
        self.clear(sale_id, None);
        self.empty_buckets.invalidate(&(sale_id.to_owned(), bucket));
    }

    /// Forgets everything about a sale: an operator changed it, or items
    /// went back to its stock (so someone may win in it again). `epoch`:
    /// the sale's stock epoch read after the change, when known.
    pub async fn forget(&self, sale_id: &str, epoch: Option<u64>) {
        self.clear(sale_id, epoch);
        self.snapshots.invalidate(sale_id).await;
        self.absent.invalidate(sale_id).await;
        self.bucket_counts.invalidate(sale_id);
        for k in 0..flashgate_common::buckets::MAX_BUCKETS as u32 {
            self.empty_buckets.invalidate(&(sale_id.to_owned(), k));
        }
    }

    /// What the backend says of a sale Redis does not have. One backend
    /// call per sale per [`MISSING_TTL`]; each call also drops the sale's
    /// snapshot, so a restored sale sells again at once.
    pub async fn missing(&self, backend: &OrderClient, sale_id: &str) -> MissingSale {
        // Boxed, as in `snapshot`.
        Box::pin(self.missing.get_with_by_ref(sale_id, async {
            self.snapshots.invalidate(sale_id).await;
            self.absent.invalidate(sale_id).await;
            match backend.sale_exists(sale_id).await {
                Ok(true) => MissingSale::Restoring,
                Ok(false) => MissingSale::Unknown,
                Err(error) => {
                    tracing::warn!(%error, sale = sale_id, "cannot ask the backend about a sale missing from redis");
                    MissingSale::NoAnswer
                }
            }
        }))
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sold_out_older_than_the_known_epoch_or_sent_before_a_clear_flags_nothing() {
        let sales = SaleCache::new(Duration::from_millis(250));
        assert_eq!(
            sales.flag_sold_out("s", Some(7), None),
            Some(7),
            "flagged, to be announced at its epoch"
        );
        assert_eq!(
            sales.flag_sold_out("s", Some(7), None),
            None,
            "renewed, not announced again"
        );
        // A change whose new epoch was read clears it; an older sold out is stale.
        sales.clear("s", Some(9));
        assert!(!sales.is_sold_out("s"));
        assert_eq!(sales.flag_sold_out("s", Some(8), None), None);
        assert!(!sales.is_sold_out("s"));
        // A call sent before a clear whose epoch was read is judged by its
        // epoch: decided after the change, it flags the sale.
        let clears = sales.clears("s");
        sales.clear("s", Some(9));
        assert_eq!(sales.flag_sold_out("s", Some(9), Some(clears)), Some(9));
        // Before a clear whose epoch is not known (its read failed): stale
        // whatever its epoch, as this gateway cannot tell.
        let clears = sales.clears("s");
        sales.clear("s", None);
        assert_eq!(sales.flag_sold_out("s", Some(9), Some(clears)), None);
        assert_eq!(
            sales.flag_sold_out("s", Some(9), Some(sales.clears("s"))),
            Some(9)
        );
        // Without an epoch of its own (the draw's): at the newest known,
        // and stale after any clear since its call was sent.
        let clears = sales.clears("s");
        sales.clear("s", Some(9));
        assert_eq!(sales.flag_sold_out("s", None, Some(clears)), None);
        assert_eq!(sales.flag_sold_out("s", None, None), Some(9));
        sales.clear_all_flags();
        assert!(!sales.is_sold_out("s"), "cleared with every flag");
        assert_eq!(
            sales.flag_sold_out("s", Some(8), Some(sales.clears("s"))),
            None,
            "the epoch outlives the flags"
        );
        // After a blind clear, an announced sold out cannot be judged: it
        // flags nothing until this gateway's own deduct (sent after the
        // clear) tells the epoch again.
        assert_eq!(sales.flag_sold_out("s", Some(10), None), None);
        assert_eq!(
            sales.flag_sold_out("s", Some(10), Some(sales.clears("s"))),
            Some(10)
        );
        sales.clear("s", Some(11));
        assert_eq!(
            sales.flag_sold_out("s", Some(11), None),
            Some(11),
            "announced, once the epoch is known"
        );
    }
}
