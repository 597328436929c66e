//! What each gateway knows about a sale without asking Redis.
//!
//! - The sale window (start, end, pause flag), cached for
//!   [`WINDOW_TTL`] and refreshed with one Redis read per sale shared by all
//!   concurrent requests (moka's `get_with` is single-flight). Requests
//!   before the start or after the end are answered here.
//! - The sold-out flag: set when the deduct script answers sold out, here
//!   or on another gateway (announced on the events channel). While it is
//!   set, buys get `410 sold_out` without running the script. An
//!   operator's change to the sale, or items of cancelled orders going back
//!   to its stock, clears it everywhere (the backend announces both as
//!   "changed"). It also expires after [`SOLD_OUT_TTL`], so a missed
//!   "changed" event costs one script call per gateway per TTL, never a
//!   sale that stays closed.
//! - The users who ever won in a sold-out sale ([`LocalSales::ever_won`]):
//!   only they can have a won Idempotency-Key to replay, so only their
//!   keyed buys read that key's outcome from Redis; anyone else's is
//!   answered `410 sold_out` here. Read once per sale per sold-out flag.
//! - Whether a sale missing from Redis exists in the backend's database
//!   ([`LocalSales::missing`]): if it does, Redis lost it and the backend
//!   is restoring it, so buyers get `503` with `Retry-After` rather than
//!   `404`. The answer is cached for [`MISSING_TTL`], so a flood of buys
//!   costs one backend call per sale per TTL.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flashgate_common::keys::SaleKeys;

use crate::orders::OrderClient;
use crate::redis_client::{RedisClient, RedisError};
use crate::reply::Rejection;

/// How long a cached sale window is trusted.
pub const WINDOW_TTL: Duration = Duration::from_secs(2);
/// How long a sold-out flag is trusted without news.
pub const SOLD_OUT_TTL: Duration = Duration::from_secs(30);
/// How long the backend's answer about a sale missing from Redis is trusted.
pub const MISSING_TTL: Duration = Duration::from_secs(1);
/// Most sales tracked at once.
const MAX_SALES: u64 = 10_000;

/// A sale's window as the gateway caches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleWindow {
    pub starts_at_ms: i64,
    pub ends_at_ms: i64,
    pub paused: bool,
}

/// `None` inside the cache: the sale does not exist (cached too, so a flood
/// of buys for an unknown sale costs one Redis read per TTL).
type CachedWindow = Option<SaleWindow>;

/// What the backend said about a sale Redis does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// The database has it: Redis lost it and it is being restored.
    Restoring,
    /// Nobody knows this sale.
    Unknown,
    /// The backend did not answer: refuse to sell, but do not say 404.
    NoAnswer,
}

/// Most winners of one sale held in [`LocalSales`]'s winner sets; a sale
/// with more has every keyed sold-out buy ask Redis.
const MAX_WINNERS_HELD: usize = 200_000;

/// The users who ever won in a sale; `None` when there are too many to hold.
type Winners = Option<Arc<HashSet<String>>>;

pub struct LocalSales {
    windows: moka::future::Cache<String, CachedWindow>,
    /// Sold-out sales, each with the number of its flag: a flag set anew
    /// (after being cleared or expiring) gets a new number, so winners read
    /// under an earlier flag are never used under a later one.
    sold_out: moka::sync::Cache<String, u64>,
    flags: AtomicU64,
    missing: moka::future::Cache<String, Missing>,
    /// Winners of a sold-out sale, by sale and flag number.
    winners: moka::future::Cache<(String, u64), Winners>,
}

impl Default for LocalSales {
    fn default() -> Self {
        Self {
            windows: moka::future::Cache::builder().max_capacity(MAX_SALES).time_to_live(WINDOW_TTL).build(),
            sold_out: moka::sync::Cache::builder().max_capacity(MAX_SALES).time_to_live(SOLD_OUT_TTL).build(),
            flags: AtomicU64::new(0),
            missing: moka::future::Cache::builder().max_capacity(MAX_SALES).time_to_live(MISSING_TTL).build(),
            winners: moka::future::Cache::builder().max_capacity(MAX_SALES).time_to_live(SOLD_OUT_TTL).build(),
        }
    }
}

impl LocalSales {
    pub fn is_sold_out(&self, sale_id: &str) -> bool {
        self.sold_out.contains_key(sale_id)
    }

    /// Flags a sale sold out, or renews its flag (its TTL starts again; the
    /// flag keeps its number, as nobody can have won meanwhile).
    pub fn mark_sold_out(&self, sale_id: &str) {
        let flag = self.sold_out.get(sale_id).unwrap_or_else(|| self.flags.fetch_add(1, Ordering::Relaxed));
        self.sold_out.insert(sale_id.to_owned(), flag);
    }

    /// Forgets everything about a sale: an operator changed it, or items
    /// went back to its stock (so someone may win in it again).
    pub async fn forget(&self, sale_id: &str) {
        if let Some(flag) = self.sold_out.remove(sale_id) {
            self.winners.invalidate(&(sale_id.to_owned(), flag)).await;
        }
        self.windows.invalidate(sale_id).await;
    }

    /// Whether `user` ever won in sold-out `sale_id`, so may hold a won
    /// Idempotency-Key to replay. Read once per sale while it stays flagged
    /// (`HLEN` then `HVALS` of the reservation index, which keeps a
    /// reservation after its item went back; shared by concurrent callers).
    /// Nobody wins in a sold-out sale until items come back, which clears
    /// the flag. Unsure (not flagged, Redis error, too many winners to hold)
    /// answers true: the caller then asks Redis.
    pub async fn ever_won(&self, redis: &RedisClient, sale_id: &str, user: &str) -> bool {
        let Some(flag) = self.sold_out.get(sale_id) else { return true };
        let held = self.winners.try_get_with((sale_id.to_owned(), flag), read_winners(redis, sale_id)).await;
        match held {
            Ok(Some(winners)) => winners.contains(user),
            Ok(None) => true,
            Err(error) => {
                tracing::debug!(%error, sale = sale_id, "cannot read a sold-out sale's winners; asking for the key");
                true
            }
        }
    }

    /// The answer to a buy for a sale Redis does not have: `503
    /// unavailable` (with Retry-After) while the backend's database knows
    /// it or cannot be asked, `404` only when the backend says it does not
    /// exist. One backend call per sale per [`MISSING_TTL`]; each call also
    /// drops the cached window, so a restored sale sells again at once.
    pub async fn missing(&self, backend: &OrderClient, sale_id: &str) -> Rejection {
        let answer = self
            .missing
            .get_with(sale_id.to_owned(), async {
                self.windows.invalidate(sale_id).await;
                match backend.sale_exists(sale_id).await {
                    Ok(true) => Missing::Restoring,
                    Ok(false) => Missing::Unknown,
                    Err(error) => {
                        tracing::warn!(%error, sale = sale_id, "cannot ask the backend about a sale missing from redis");
                        Missing::NoAnswer
                    }
                }
            })
            .await;
        match answer {
            Missing::Restoring | Missing::NoAnswer => Rejection::Unavailable,
            Missing::Unknown => Rejection::NotFound("no such sale"),
        }
    }

    /// The sale's window, from the cache or one shared Redis read.
    ///
    /// # Errors
    /// When Redis cannot be read (nothing is cached then).
    pub async fn window(&self, redis: &RedisClient, sale_id: &str) -> Result<CachedWindow, Arc<RedisError>> {
        if let Some(w) = self.windows.get(sale_id).await {
            return Ok(w);
        }
        self.windows.try_get_with(sale_id.to_owned(), read_window(redis, sale_id)).await
    }
}

async fn read_winners(redis: &RedisClient, sale_id: &str) -> Result<Winners, RedisError> {
    let keys = SaleKeys::new(sale_id);
    let mut conn = redis.conn().await?;
    let count: usize = redis.bounded(redis::cmd("HLEN").arg(&keys.reservations).query_async(&mut conn)).await??;
    if count > MAX_WINNERS_HELD {
        return Ok(None);
    }
    let users: Vec<String> = redis.bounded(redis::cmd("HVALS").arg(&keys.reservations).query_async(&mut conn)).await??;
    Ok(Some(Arc::new(users.into_iter().collect())))
}

async fn read_window(redis: &RedisClient, sale_id: &str) -> Result<CachedWindow, RedisError> {
    let keys = SaleKeys::new(sale_id);
    let mut conn = redis.conn().await?;
    let (starts, ends, paused): (Option<i64>, Option<i64>, Option<String>) =
        redis.bounded(redis::cmd("HMGET").arg(&keys.meta).arg(&["starts_at_ms", "ends_at_ms", "paused"]).query_async(&mut conn)).await??;
    Ok(match (starts, ends) {
        (Some(starts_at_ms), Some(ends_at_ms)) => Some(SaleWindow { starts_at_ms, ends_at_ms, paused: paused.as_deref() == Some("1") }),
        _ => None,
    })
}
