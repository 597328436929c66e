//! Redis connections and the Lua scripts the backend runs.
//!
//! Two kinds of connection, on purpose: the HTTP handlers share one
//! reconnecting multiplexed [`ConnectionManager`] whose calls are cut at
//! `redis.timeout`, while every stream consumer opens its own connection
//! (see [`consumer_connection`]) because a blocking `XREADGROUP` would stall
//! every other call queued on a shared one.

use std::sync::LazyLock;
use std::time::Duration;

use flashgate_common::config::RedisConfig;
use flashgate_common::keys::SaleEvent;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, RedisError, Script};

/// Changes a preheated sale and moves its remaining stock (`lua/update_sale.lua`).
pub static UPDATE_SALE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/update_sale.lua")));

/// Extra time a blocking read may take beyond its `BLOCK` before the client
/// gives up on the connection.
const BLOCK_MARGIN: Duration = Duration::from_secs(5);

/// Opens the shared connection used by the HTTP handlers.
///
/// # Errors
/// The URL is invalid or Redis does not answer.
pub async fn shared_connection(config: &RedisConfig) -> Result<ConnectionManager, RedisError> {
    let client = Client::open(config.url.as_str())?;
    let settings = ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.timeout))
        .set_connection_timeout(Some(config.timeout.max(Duration::from_secs(1))))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, settings).await
}

/// Opens a dedicated connection for one stream consumer, with a response
/// timeout longer than its `BLOCK` (redis-rs would otherwise cut every
/// blocking read at its default of 500 ms).
///
/// # Errors
/// The URL is invalid or Redis does not answer.
pub async fn consumer_connection(config: &RedisConfig, block: Duration) -> Result<MultiplexedConnection, RedisError> {
    let client = Client::open(config.url.as_str())?;
    let settings = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.timeout.max(Duration::from_secs(1))))
        .set_response_timeout(Some(block + BLOCK_MARGIN));
    client.get_multiplexed_async_connection_with_config(&settings).await
}

/// Publishes `event` to every gateway. A failure is logged, not returned:
/// gateways also re-read what they cache on their own schedule.
pub async fn announce<C: ConnectionLike + Send>(conn: &mut C, event: &SaleEvent) {
    if let Err(error) = flashgate_common::keys::publish(conn, event).await {
        tracing::warn!(%error, event = event.encode(), "could not announce to gateways");
    }
}
