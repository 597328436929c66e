//! Sale state read from Redis for `GET /api/sales[/{id}]`.

use flashgate_common::keys::{SaleKeys, SALES_INDEX};
use flashgate_common::sale::{SaleSpec, SaleState};
use flashgate_common::{now_ms, rfc3339};
use serde::Serialize;

use crate::redis_client::{RedisClient, RedisError};

/// A sale as buyers see it.
#[derive(Debug, Serialize)]
pub struct SaleView {
    pub id: String,
    pub name: String,
    pub state: SaleState,
    pub starts_at: String,
    pub ends_at: String,
    pub server_time: String,
    pub stock: i64,
    pub remaining: i64,
}

/// One entry of the sale list.
#[derive(Debug, Serialize)]
pub struct SaleSummary {
    pub id: String,
    pub name: String,
    pub state: SaleState,
    pub starts_at: String,
    pub ends_at: String,
}

/// Reads one sale: its meta hash and remaining stock in one round trip.
///
/// # Errors
/// When Redis fails or times out. An absent sale is `Ok(None)`.
pub async fn read_sale(redis: &RedisClient, sale_id: &str) -> Result<Option<SaleView>, RedisError> {
    let keys = SaleKeys::new(sale_id);
    let mut conn = redis.conn().await?;
    let mut pipe = redis::pipe();
    pipe.hgetall(&keys.meta).get(&keys.remaining);
    let (meta, remaining): (std::collections::HashMap<String, String>, Option<i64>) =
        redis.bounded(pipe.query_async(&mut conn)).await??;
    Ok(view(sale_id, &meta, remaining.unwrap_or(0)))
}

/// Reads every preheated sale, sorted by start time.
///
/// # Errors
/// When Redis fails or times out.
pub async fn list_sales(redis: &RedisClient) -> Result<Vec<SaleSummary>, RedisError> {
    let mut conn = redis.conn().await?;
    let ids: Vec<String> = redis.bounded(redis::cmd("SMEMBERS").arg(SALES_INDEX).query_async(&mut conn)).await??;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(v) = read_sale(redis, &id).await? {
            out.push(SaleSummary { id: v.id, name: v.name, state: v.state, starts_at: v.starts_at, ends_at: v.ends_at });
        }
    }
    out.sort_by(|a, b| a.starts_at.cmp(&b.starts_at).then(a.id.cmp(&b.id)));
    Ok(out)
}

fn view(sale_id: &str, meta: &std::collections::HashMap<String, String>, remaining: i64) -> Option<SaleView> {
    let int = |k: &str| meta.get(k).and_then(|v| v.parse::<i64>().ok());
    let spec = SaleSpec {
        id: sale_id.to_owned(),
        name: meta.get("name")?.clone(),
        stock: int("stock")?,
        per_user_limit: int("per_user_limit")?,
        starts_at_ms: int("starts_at_ms")?,
        ends_at_ms: int("ends_at_ms")?,
    };
    let now = now_ms();
    let paused = meta.get("paused").is_some_and(|p| p == "1");
    Some(SaleView {
        state: SaleState::at(now, &spec, paused, remaining),
        starts_at: rfc3339(spec.starts_at_ms),
        ends_at: rfc3339(spec.ends_at_ms),
        server_time: rfc3339(now),
        stock: spec.stock,
        remaining: remaining.max(0),
        id: spec.id,
        name: spec.name,
    })
}
