//! [`SaleCache`]: everything one gateway holds about its sales.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashgate_common::keys::{SaleKeys, SALES_INDEX};
use moka::ops::compute::Op;

use super::snapshot::{read_snapshot, SaleSnapshot, SaleSummary, SaleView, SaleWindow};
use crate::orders::OrderClient;
use crate::redis_client::{RedisClient, RedisError};

/// How old a snapshot may be for a buy's window check.
pub const WINDOW_TTL: Duration = Duration::from_secs(2);
/// How long a sold-out flag is trusted without news.
pub const SOLD_OUT_TTL: Duration = Duration::from_secs(30);
/// How long the backend's answer about a sale missing from Redis is trusted.
pub const MISSING_TTL: Duration = Duration::from_secs(1);
/// Most sales tracked at once.
const MAX_SALES: u64 = 10_000;
/// Most winners of one sale held in the winner sets; a sale with more has
/// every keyed sold-out buy ask Redis.
const MAX_WINNERS_HELD: usize = 200_000;

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

/// The users who ever won in a sale; `None` when there are too many to hold.
type Winners = Option<Arc<HashSet<String, Hasher>>>;

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
    /// Sold-out sales, each with the number of its flag: a flag set anew
    /// (after being cleared or expiring) gets a new number, so winners read
    /// under an earlier flag are never used under a later one.
    sold_out: moka::sync::Cache<String, u64, Hasher>,
    flags: AtomicU64,
    missing: moka::future::Cache<String, MissingSale, Hasher>,
    /// The number of each sale's last [`SaleCache::forget`] (from
    /// `flags`): a sold out decided before it (the draw's, read later) is
    /// stale and must not flag the sale again.
    cleared: moka::sync::Cache<String, u64, Hasher>,
    /// Winners of a sold-out sale, by flag number: each flag of any sale
    /// gets a number of its own, so the number alone names the sale's flag
    /// (and a lookup needs no key built from the sale id).
    winners: moka::future::Cache<u64, Winners, Hasher>,
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
            sold_out: moka::sync::Cache::builder().max_capacity(MAX_SALES).time_to_live(SOLD_OUT_TTL).build_with_hasher(Hasher::new()),
            flags: AtomicU64::new(0),
            missing: moka::future::Cache::builder().max_capacity(MAX_SALES).time_to_live(MISSING_TTL).build_with_hasher(Hasher::new()),
            cleared: moka::sync::Cache::builder().max_capacity(MAX_SALES).build_with_hasher(Hasher::new()),
            winners: moka::future::Cache::builder().max_capacity(MAX_SALES).time_to_live(SOLD_OUT_TTL).build_with_hasher(Hasher::new()),
            empty_buckets: moka::sync::Cache::builder()
                .max_capacity(MAX_SALES * 4)
                .time_to_live(SOLD_OUT_TTL)
                .build_with_hasher(Hasher::new()),
            bucket_counts: moka::sync::Cache::builder().max_capacity(MAX_SALES).build_with_hasher(Hasher::new()),
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
    async fn snapshot(&self, redis: &RedisClient, sale_id: &str, max_age: Duration) -> Result<Option<Arc<SaleSnapshot>>, Arc<RedisError>> {
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
            Ok::<_, RedisError>(Held { snapshot: snapshot.map(Arc::new), read_at: Instant::now() })
        }))
        .await?;
        if let Some(s) = &held.snapshot {
            self.bucket_counts.insert(sale_id.to_owned(), s.window.buckets);
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
    pub async fn window(&self, redis: &RedisClient, sale_id: &str) -> Result<Option<SaleWindow>, Arc<RedisError>> {
        Ok(self.snapshot(redis, sale_id, WINDOW_TTL).await?.map(|s| s.window))
    }

    /// The sale's view at `now_ms`, from a snapshot at most
    /// `pages.state_ttl_ms` old.
    ///
    /// # Errors
    /// When Redis cannot be read.
    pub async fn view(&self, redis: &RedisClient, sale_id: &str, now_ms: i64) -> Result<Option<SaleView>, Arc<RedisError>> {
        Ok(self.snapshot(redis, sale_id, self.view_ttl).await?.and_then(|s| s.view(now_ms)))
    }

    /// Every preheated sale, sorted by start time. Each sale comes from its
    /// snapshot, so listing costs what reading each sale costs.
    ///
    /// # Errors
    /// When Redis fails or times out.
    pub async fn list(&self, redis: &RedisClient, now_ms: i64) -> Result<Vec<SaleSummary>, Arc<RedisError>> {
        let mut conn = redis.conn().await?;
        let ids: Vec<String> = redis
            .bounded(redis::cmd("SMEMBERS").arg(SALES_INDEX).query_async(&mut conn))
            .await
            .and_then(|r| r.map_err(RedisError::from))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self.snapshot(redis, &id, self.view_ttl).await?.and_then(|s| s.summary(now_ms)) {
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
        if let Some(Held { snapshot: Some(s), read_at }) = self.snapshots.get(sale_id).await {
            if read_at < sent_at {
                s.took_one();
            }
        }
    }

    pub fn is_sold_out(&self, sale_id: &str) -> bool {
        self.sold_out.contains_key(sale_id)
    }

    /// Flags a sale sold out, or renews its flag (its TTL starts again; the
    /// flag keeps its number, as nobody can have won meanwhile).
    pub fn mark_sold_out(&self, sale_id: &str) {
        let flag = self.sold_out.get(sale_id).unwrap_or_else(|| self.flags.fetch_add(1, Ordering::Relaxed));
        self.sold_out.insert(sale_id.to_owned(), flag);
    }

    /// The script found `sale_id` sold out just now: flag it, and show no
    /// stock left in its snapshot.
    pub async fn found_sold_out(&self, sale_id: &str) {
        self.mark_sold_out(sale_id);
        if let Some(Held { snapshot: Some(s), .. }) = self.snapshots.get(sale_id).await {
            s.sold_out();
        }
    }

    /// Where the sale stands in its clears: [`SaleCache::forget`] and
    /// [`SaleCache::bucket_stocked`] change it. Taken before a call whose sold out is read later (a draw
    /// entrant's), it tells whether stock may have come back since.
    pub fn clears(&self, sale_id: &str) -> u64 {
        self.cleared.get(sale_id).unwrap_or(0)
    }

    /// The sale's bucket count, from its snapshot (at most [`WINDOW_TTL`]
    /// old; 1 when Redis cannot be read: the sale's own keys then sell
    /// nothing, its buys answer 503 fenced, never a wrong win).
    pub async fn buckets(&self, redis: &RedisClient, sale_id: &str) -> u32 {
        if let Some(n) = self.bucket_counts.get(sale_id) {
            return n;
        }
        self.window(redis, sale_id).await.ok().flatten().map_or(1, |w| w.buckets)
    }

    /// Whether bucket `bucket` of `sale_id` is flagged empty here.
    pub fn bucket_empty(&self, sale_id: &str, bucket: u32) -> bool {
        self.empty_buckets.contains_key(&(sale_id.to_owned(), bucket))
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
    pub async fn bucket_stocked(&self, sale_id: &str, bucket: u32) {
        self.cleared.insert(sale_id.to_owned(), self.flags.fetch_add(1, Ordering::Relaxed) + 1);
        self.empty_buckets.invalidate(&(sale_id.to_owned(), bucket));
        if let Some(flag) = self.sold_out.remove(sale_id) {
            self.winners.invalidate(&flag).await;
        }
    }

    /// Forgets everything about a sale: an operator changed it, or items
    /// went back to its stock (so someone may win in it again).
    pub async fn forget(&self, sale_id: &str) {
        self.cleared.insert(sale_id.to_owned(), self.flags.fetch_add(1, Ordering::Relaxed) + 1);
        if let Some(flag) = self.sold_out.remove(sale_id) {
            self.winners.invalidate(&flag).await;
        }
        self.snapshots.invalidate(sale_id).await;
        self.absent.invalidate(sale_id).await;
        self.bucket_counts.invalidate(sale_id);
        for k in 0..flashgate_common::buckets::MAX_BUCKETS as u32 {
            self.empty_buckets.invalidate(&(sale_id.to_owned(), k));
        }
    }

    /// Whether `user` ever won in sold-out `sale_id`, so may hold a won
    /// Idempotency-Key to replay. Read when the sale is flagged, again at
    /// most every [`SOLD_OUT_TTL`] while it stays flagged (a failed read is
    /// not kept) (`HLEN` then `HVALS` of the reservation index, which keeps a
    /// reservation after its item went back; shared by concurrent callers).
    /// Nobody wins in a sold-out sale until items come back, which clears
    /// the flag. Unsure (not flagged, Redis error, too many winners to hold)
    /// answers true: the caller then asks Redis.
    pub async fn ever_won(&self, redis: &RedisClient, sale_id: &str, buckets: u32, user: &str) -> bool {
        let Some(flag) = self.sold_out.get(sale_id) else { return true };
        let held = match self.winners.get(&flag).await {
            Some(held) => Ok(held),
            // Boxed, as in `snapshot`.
            None => Box::pin(self.winners.try_get_with(flag, read_winners(redis, sale_id, buckets))).await,
        };
        match held {
            Ok(Some(winners)) => winners.contains(user),
            Ok(None) => true,
            Err(error) => {
                tracing::debug!(%error, sale = sale_id, "cannot read a sold-out sale's winners; asking for the key");
                true
            }
        }
    }

    /// True only when `sale_id` is flagged sold out and its winners, already
    /// read by [`SaleCache::ever_won`], do not hold `user`. Never asks
    /// Redis: it answers before the buyer's buckets are taken, so it may
    /// not cost what they guard.
    pub async fn surely_never_won(&self, sale_id: &str, user: &str) -> bool {
        let Some(flag) = self.sold_out.get(sale_id) else { return false };
        matches!(self.winners.get(&flag).await, Some(Some(winners)) if !winners.contains(user))
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

/// Reads the winners of a sale from its reservation index, or from every
/// bucket's of a bucketed sale.
async fn read_winners(redis: &RedisClient, sale_id: &str, buckets: u32) -> Result<Winners, RedisError> {
    let indexes: Vec<SaleKeys> =
        if buckets > 1 { (0..buckets).map(|k| SaleKeys::bucket(sale_id, k)).collect() } else { vec![SaleKeys::new(sale_id)] };
    let mut conn = redis.conn().await?;
    let mut count = 0;
    for keys in &indexes {
        let n: usize = redis.bounded(redis::cmd("HLEN").arg(&keys.reservations).query_async(&mut conn)).await??;
        count += n;
    }
    if count > MAX_WINNERS_HELD {
        return Ok(None);
    }
    let mut winners = HashSet::with_capacity_and_hasher(count, Hasher::new());
    for keys in &indexes {
        let users: Vec<String> = redis.bounded(redis::cmd("HVALS").arg(&keys.reservations).query_async(&mut conn)).await??;
        winners.extend(users);
    }
    Ok(Some(Arc::new(winners)))
}
