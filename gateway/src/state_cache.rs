//! The live-stock micro-cache behind `GET /api/sales/{id}`.
//!
//! Sale pages poll their sale's state, so during a sale every open page
//! reads it every second or two. The gateway keeps each sale's raw state
//! (its meta hash and remaining stock, one pipelined Redis round trip) for
//! `pages.state_ttl_ms`, about a quarter of a second. A miss is
//! single-flight: moka's `try_get_with` runs one read per sale and every
//! concurrent reader of that sale waits for it. So any number of readers
//! costs at most one Redis read per sale per TTL per gateway, and remaining
//! stock is never more than one TTL old.
//!
//! The view is rendered per request from the cached snapshot, so the state
//! flips to open exactly at the start time and `server_time` (which the
//! page's countdown syncs to) is always the current time. An unknown sale is
//! cached too, so a flood of reads for it costs no more than for a real one.
//! A Redis error is not cached: every waiter gets it, the next read retries.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flashgate_common::keys::SaleKeys;
use flashgate_common::sale::{SaleSpec, SaleState};
use flashgate_common::{now_ms, rfc3339};

use crate::redis_client::{RedisClient, RedisError};
use crate::sales::SaleView;

/// Most sales cached at once.
const MAX_SALES: u64 = 10_000;

/// What Redis said about a sale, as read.
#[derive(Debug, Clone)]
pub struct SaleSnapshot {
    pub spec: SaleSpec,
    pub paused: bool,
    pub remaining: i64,
}

impl SaleSnapshot {
    /// The view buyers see at `now_ms`.
    pub fn view(&self, now_ms: i64) -> SaleView {
        SaleView {
            id: self.spec.id.clone(),
            name: self.spec.name.clone(),
            state: SaleState::at(now_ms, &self.spec, self.paused, self.remaining),
            starts_at: rfc3339(self.spec.starts_at_ms),
            ends_at: rfc3339(self.spec.ends_at_ms),
            server_time: rfc3339(now_ms),
            stock: self.spec.stock,
            remaining: self.remaining.max(0),
        }
    }
}

/// `None` inside the cache: no such sale.
type Cached = Option<Arc<SaleSnapshot>>;

/// Sale snapshots with a short TTL and single-flight refresh.
pub struct SaleStateCache {
    cache: moka::future::Cache<String, Cached>,
}

impl SaleStateCache {
    pub fn new(ttl: Duration) -> Self {
        Self { cache: moka::future::Cache::builder().max_capacity(MAX_SALES).time_to_live(ttl).build() }
    }

    /// The sale's view now, from the cache or one shared Redis read.
    ///
    /// # Errors
    /// When Redis cannot be read (nothing is cached then).
    pub async fn view(&self, redis: &RedisClient, sale_id: &str) -> Result<Option<SaleView>, Arc<RedisError>> {
        let snapshot = match self.cache.get(sale_id).await {
            Some(hit) => hit,
            None => self.cache.try_get_with_by_ref(sale_id, read_snapshot(redis, sale_id)).await?,
        };
        Ok(snapshot.map(|s| s.view(now_ms())))
    }

    /// Drops a sale's snapshot (an operator changed the sale).
    pub async fn forget(&self, sale_id: &str) {
        self.cache.invalidate(sale_id).await;
    }
}

/// Reads a sale's meta hash and remaining stock in one round trip.
async fn read_snapshot(redis: &RedisClient, sale_id: &str) -> Result<Cached, RedisError> {
    let keys = SaleKeys::new(sale_id);
    let mut conn = redis.conn().await?;
    let mut pipe = redis::pipe();
    pipe.hgetall(&keys.meta).get(&keys.remaining);
    let (meta, remaining): (HashMap<String, String>, Option<i64>) = redis.bounded(pipe.query_async(&mut conn)).await??;
    Ok(snapshot(sale_id, &meta, remaining.unwrap_or(0)).map(Arc::new))
}

fn snapshot(sale_id: &str, meta: &HashMap<String, String>, remaining: i64) -> Option<SaleSnapshot> {
    let int = |k: &str| meta.get(k).and_then(|v| v.parse::<i64>().ok());
    Some(SaleSnapshot {
        spec: SaleSpec {
            id: sale_id.to_owned(),
            name: meta.get("name")?.clone(),
            stock: int("stock")?,
            per_user_limit: int("per_user_limit")?,
            starts_at_ms: int("starts_at_ms")?,
            ends_at_ms: int("ends_at_ms")?,
        },
        paused: meta.get("paused").is_some_and(|p| p == "1"),
        remaining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_is_rendered_at_request_time() {
        let meta: HashMap<String, String> =
            [("name", "Sneaker"), ("stock", "10"), ("per_user_limit", "1"), ("starts_at_ms", "1000"), ("ends_at_ms", "5000")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        let s = snapshot("s", &meta, 3).unwrap();
        assert_eq!(s.view(999).state, SaleState::Upcoming);
        let open = s.view(1000);
        assert_eq!((open.state, open.remaining, open.stock), (SaleState::Open, 3, 10));
        assert_eq!(open.server_time, rfc3339(1000));
        assert_eq!(snapshot("s", &meta, 0).unwrap().view(2000).state, SaleState::SoldOut);
        assert!(snapshot("s", &HashMap::new(), 3).is_none());
    }
}
