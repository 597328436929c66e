//! How far the backend is behind on a sale's stream, read from Redis.

use crate::keys::CONSUMER_GROUP;

/// The `orders` group's `lag` (entries never delivered) and `pending`
/// (delivered, not acknowledged) from `XINFO GROUPS`; zeros when the stream
/// or the group does not exist yet. Unpersisted reservations = lag + pending.
///
/// # Errors
/// Redis failed (other than the stream being absent).
pub async fn group_backlog<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
) -> redis::RedisResult<(i64, i64)> {
    let groups: redis::Value = match redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await
    {
        Ok(v) => v,
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {
            return Ok((0, 0))
        }
        Err(e) => return Err(e),
    };
    let redis::Value::Array(groups) = groups else {
        return Ok((0, 0));
    };
    for group in groups {
        let Ok(fields) =
            <Vec<(String, redis::Value)> as redis::FromRedisValue>::from_redis_value(group)
        else {
            continue;
        };
        let int = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| match v {
                    redis::Value::Int(n) => Some((*n).max(0)),
                    _ => None,
                })
        };
        let is_orders = fields.iter().any(|(k, v)| {
            k == "name"
                && matches!(v, redis::Value::BulkString(b) if b == CONSUMER_GROUP.as_bytes())
        });
        if is_orders {
            // `lag` is nil when Redis cannot compute it; count pending alone then.
            return Ok((int("lag").unwrap_or(0), int("pending").unwrap_or(0)));
        }
    }
    Ok((0, 0))
}

/// Entries of `stream` delivered to the `orders` group and not acknowledged
/// yet (the `XPENDING` summary's count); 0 before the group exists
/// (`NOGROUP`).
///
/// # Errors
/// Redis failed.
pub async fn pending<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
) -> redis::RedisResult<i64> {
    match redis::cmd("XPENDING")
        .arg(stream)
        .arg(CONSUMER_GROUP)
        .query_async::<redis::Value>(conn)
        .await
    {
        Ok(redis::Value::Array(items)) => match items.first() {
            Some(redis::Value::Int(n)) => Ok(*n),
            _ => Ok(0),
        },
        Ok(_) => Ok(0),
        Err(e) if e.code() == Some("NOGROUP") => Ok(0),
        Err(e) => Err(e),
    }
}

/// One stream's backlog: the `orders` group's lag and pending.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    pub lag: i64,
    pub pending: i64,
}

impl Backlog {
    /// Reservations not persisted yet: `lag + pending`.
    pub fn unpersisted(&self) -> i64 {
        self.lag + self.pending
    }
}

/// The backlog of every stream sale `sale_id` writes, read stream by
/// stream: index 0 is the sale's own stream (a sale of one bucket writes
/// only there; a bucketed sale's retried dead letters go there), then one
/// per bucket, 0 to `buckets - 1` (none when `buckets` <= 1). The backlog
/// pause and the gauges sum them: a bucketed sale's reservations wait in
/// its buckets' streams, which is where a slow backend shows.
///
/// # Errors
/// Redis failed (other than a stream being absent).
pub async fn sale_backlogs<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
) -> redis::RedisResult<Vec<Backlog>> {
    let mut streams = vec![crate::keys::SaleKeys::new(sale_id).stream];
    if buckets > 1 {
        streams.extend((0..buckets).map(|k| crate::keys::SaleKeys::bucket(sale_id, k).stream));
    }
    let mut out = Vec::with_capacity(streams.len());
    for stream in streams {
        let (lag, pending) = group_backlog(conn, &stream).await?;
        out.push(Backlog { lag, pending });
    }
    Ok(out)
}
