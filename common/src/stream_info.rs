//! How far the backend is behind on a sale's stream, read from Redis.

use crate::keys::CONSUMER_GROUP;

/// The `orders` group's `lag` (entries never delivered) and `pending`
/// (delivered, not acknowledged) from `XINFO GROUPS`; zeros when the stream
/// or the group does not exist yet. Unpersisted reservations = lag + pending.
///
/// # Errors
/// Redis failed (other than the stream being absent).
pub async fn group_backlog<C: redis::aio::ConnectionLike + Send>(conn: &mut C, stream: &str) -> redis::RedisResult<(i64, i64)> {
    let groups: redis::Value = match redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(conn).await {
        Ok(v) => v,
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => return Ok((0, 0)),
        Err(e) => return Err(e),
    };
    let redis::Value::Array(groups) = groups else { return Ok((0, 0)) };
    for group in groups {
        let Ok(fields) = <Vec<(String, redis::Value)> as redis::FromRedisValue>::from_redis_value(group) else { continue };
        let int = |name: &str| {
            fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
                redis::Value::Int(n) => Some((*n).max(0)),
                _ => None,
            })
        };
        let is_orders =
            fields.iter().any(|(k, v)| k == "name" && matches!(v, redis::Value::BulkString(b) if b == CONSUMER_GROUP.as_bytes()));
        if is_orders {
            // `lag` is nil when Redis cannot compute it; count pending alone then.
            return Ok((int("lag").unwrap_or(0), int("pending").unwrap_or(0)));
        }
    }
    Ok((0, 0))
}
