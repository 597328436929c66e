//! What buyers see of sales: `GET /api/sales` and `GET /api/sales/{id}`
//! (the latter rendered by `state_cache`).

use std::sync::Arc;

use flashgate_common::keys::SALES_INDEX;
use flashgate_common::sale::SaleState;
use serde::Serialize;

use crate::redis_client::{RedisClient, RedisError};
use crate::state_cache::SaleStateCache;

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

/// Reads every preheated sale, sorted by start time. Each sale comes from
/// the state micro-cache, so listing costs what reading each sale costs.
///
/// # Errors
/// When Redis fails or times out.
pub async fn list_sales(redis: &RedisClient, states: &SaleStateCache) -> Result<Vec<SaleSummary>, Arc<RedisError>> {
    let mut conn = redis.conn().await?;
    let ids: Vec<String> =
        redis.bounded(redis::cmd("SMEMBERS").arg(SALES_INDEX).query_async(&mut conn)).await.and_then(|r| r.map_err(RedisError::from))?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(v) = states.view(redis, &id).await? {
            out.push(SaleSummary { id: v.id, name: v.name, state: v.state, starts_at: v.starts_at, ends_at: v.ends_at });
        }
    }
    out.sort_by(|a, b| a.starts_at.cmp(&b.starts_at).then(a.id.cmp(&b.id)));
    Ok(out)
}
