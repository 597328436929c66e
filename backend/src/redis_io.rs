//! Redis connections, the sale update script (`lua/update_sale.lua`), and
//! announcing sale events. Every other script is run by the module it
//! serves, built from `flashgate_common::scripts`.
//!
//! Two kinds of connection, on purpose, both [`RedisHandle`]s in the
//! configured `redis.mode`: the HTTP handlers and background loops share one
//! whose calls are cut at `redis.timeout`, while every stream consumer
//! opens its own connection
//! (see [`consumer_connection`]) because a blocking `XREADGROUP` would stall
//! every other call queued on a shared one.

use std::time::Duration;

use flashgate_common::config::RedisConfig;
use flashgate_common::keys::SaleEvent;
use flashgate_common::redis_conn::{RedisHandle, Tuning};
use flashgate_common::scripts::UPDATE_SALE;
use redis::aio::ConnectionLike;
use redis::RedisError;

/// What `lua/update_sale.lua` does with a stock change on a fenced sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfFenced {
    /// Refuse it (`[-3, 0]`): the fenced count may lack the last deducts,
    /// so what is sold is not known yet. An operator's change and
    /// reconciliation's repair.
    Refuse,
    /// Apply it: the re-sync, which has just counted every order and is
    /// the one that lifts the fence.
    Apply,
}

/// Runs `lua/update_sale.lua` with `spec`: `[1, remaining]` changed,
/// `[0, sold]` the stock is below what is sold (nothing changed),
/// `[-1, 0]` the sale is absent, `[-2, held]` Redis holds another bucket
/// count, `[-3, 0]` the stock would change on a fenced sale
/// ([`IfFenced::Refuse`] only; nothing changed).
///
/// # Errors
/// Redis failed.
pub async fn update_sale<C: ConnectionLike + Send>(
    conn: &mut C,
    spec: &flashgate_common::sale::SaleSpec,
    fenced: IfFenced,
) -> Result<Vec<i64>, RedisError> {
    let keys = flashgate_common::keys::SaleKeys::new(&spec.id);
    let mut call = UPDATE_SALE.key(&keys.meta);
    call.key(&keys.remaining);
    if fenced == IfFenced::Refuse {
        call.key(&keys.synced);
    }
    call.arg(&spec.name)
        .arg(spec.stock)
        .arg(spec.per_user_limit)
        .arg(spec.starts_at_ms)
        .arg(spec.ends_at_ms)
        .arg(
            spec.draw_window_ms
                .map(|w| w.to_string())
                .unwrap_or_default(),
        )
        .arg(spec.buckets)
        .arg(spec.checkout_url.as_deref().unwrap_or_default())
        .invoke_async(conn)
        .await
}

/// Extra time a blocking read may take beyond its `BLOCK` before the client
/// gives up on the connection.
const BLOCK_MARGIN: Duration = Duration::from_secs(5);

/// Opens the shared connection used by the HTTP handlers.
///
/// # Errors
/// The URL is invalid or Redis does not answer.
pub async fn shared_connection(config: &RedisConfig) -> Result<RedisHandle, RedisError> {
    let tuning = Tuning {
        connection_timeout: config.timeout.max(Duration::from_secs(1)),
        ..Tuning::new(config.timeout)
    };
    RedisHandle::connect(config, &tuning).await
}

/// Opens a dedicated connection for one stream consumer, with a response
/// timeout longer than its `BLOCK` (redis-rs would otherwise cut every
/// blocking read at its default of 500 ms). On a cluster it is a cluster
/// connection of its own: a `BLOCK`ing read on the shared one would stall
/// every call to that master.
///
/// # Errors
/// The URL is invalid or Redis does not answer.
pub async fn consumer_connection(
    config: &RedisConfig,
    block: Duration,
) -> Result<RedisHandle, RedisError> {
    RedisHandle::dedicated(
        config,
        config.timeout.max(Duration::from_secs(1)),
        block + BLOCK_MARGIN,
    )
    .await
}

/// Publishes `event` to every gateway. A failure is logged, not returned:
/// gateways also re-read what they cache on their own schedule.
pub async fn announce<C: ConnectionLike + Send>(conn: &mut C, event: &SaleEvent) {
    if let Err(error) = flashgate_common::keys::publish(conn, event).await {
        tracing::warn!(%error, event = event.encode(), "could not announce to gateways");
    }
}
