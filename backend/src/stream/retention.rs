//! What a sale's stream keeps, and when a sale stops costing anything.
//!
//! - [`trim_written`]: entries already written as orders (or copied to the
//!   dead-letter stream) are removed with `XTRIM MINID`, from the oldest
//!   up to the first entry that is not (verified against the database), and
//!   never past the group's oldest pending entry or its last-delivered
//!   entry (which is kept); `lua/trim.lua` re-checks both and trims in one
//!   step, so a group moved back meanwhile loses nothing. An entry not yet delivered, delivered and not
//!   acknowledged, or without an order for any reason (an entry the group
//!   skipped, waiting for reconciliation to write it) is never trimmed.
//! - [`try_archive`]: a sale whose window ended more than a grace ago (by
//!   Redis's clock, which the deduct script sells by), whose stream has
//!   nothing undelivered or pending (a stream without the group counts only
//!   when empty), whose dead-letter stream is empty, every reservation in
//!   `resv` of which has its order, and whose orders are all settled (paid,
//!   or cancelled with the item returned) is added to
//!   [`ARCHIVED_SALES`]. Nobody polls an archived sale any more: its stream
//!   consumer stops, gateways stop reading its backlog, reconciliation and
//!   the metrics skip it. [`unarchive`] undoes it (an operator changing the
//!   sale, a dead letter put back on the stream).
//!
//! A bucketed sale has a stream per bucket besides its own: each is
//! trimmed the same way ([`trim_all_written`]), and the sale is archived
//! only when every one of them is drained and every bucket's reservations
//! have their orders ([`try_archive_all`]).

use std::collections::HashSet;
use std::time::Duration;

use flashgate_common::keys::{SaleKeys, ARCHIVED_SALES, CONSUMER_GROUP};
use flashgate_common::scripts::TRIM;
use redis::aio::ConnectionLike;
use redis::{RedisError, RedisResult, Value};

use crate::error::SaleError;
use crate::store::Store;

/// How long after its end a sale stays live (consumed, polled,
/// reconciled) at least: covers clocks that disagree and stragglers.
pub const ARCHIVE_GRACE: Duration = Duration::from_secs(300);

/// How often the consumers' supervisor trims the streams of live sales
/// and looks for sales to archive.
pub const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(10);

/// A stream entry id `ms-seq`, comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryId(u64, u64);

impl EntryId {
    pub fn parse(id: &str) -> Option<Self> {
        let (ms, seq) = id.split_once('-')?;
        Some(Self(ms.parse().ok()?, seq.parse().ok()?))
    }

    fn is_zero(self) -> bool {
        self == Self(0, 0)
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Where the `orders` group stands on a stream, read in one atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPosition {
    /// The last entry delivered to any consumer of the group.
    pub last_delivered: EntryId,
    /// The oldest entry delivered and not acknowledged, if any.
    pub oldest_pending: Option<EntryId>,
    /// The newest entry of the stream, if any.
    pub newest: Option<EntryId>,
}

impl GroupPosition {
    /// Every entry delivered and acknowledged: nothing left to write.
    pub fn drained(&self) -> bool {
        self.oldest_pending.is_none() && self.newest.is_none_or(|n| n <= self.last_delivered)
    }

    /// Entries below this id are acknowledged; `None` when there are none.
    pub fn trim_below(&self) -> Option<EntryId> {
        let bound = match self.oldest_pending {
            Some(p) => p.min(self.last_delivered),
            None => self.last_delivered,
        };
        (!bound.is_zero()).then_some(bound)
    }
}

/// The group's position on `stream`; `None` when the stream or the group
/// does not exist (or Redis answers that the key is not a stream): callers
/// must not read `None` as "drained".
///
/// # Errors
/// Redis failed, or answered in a shape this version does not know.
pub async fn position<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
) -> RedisResult<Option<GroupPosition>> {
    let reply: RedisResult<(Value, Value, Value)> = redis::pipe()
        .atomic()
        .cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .cmd("XPENDING")
        .arg(stream)
        .arg(CONSUMER_GROUP)
        .cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await;
    let (groups, pending, newest) = match reply {
        Ok(r) => r,
        // No such stream or group: nothing to trim, nothing pending (the
        // transaction reports a missing group as one of its commands' errors).
        Err(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                || no_group(&e) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let bad = |what: &str| {
        RedisError::from((
            redis::ErrorKind::Client,
            "unexpected stream reply",
            what.to_owned(),
        ))
    };
    let Some(last_delivered) = group_last_delivered(groups) else {
        return Ok(None);
    };
    let last_delivered = EntryId::parse(&last_delivered).ok_or_else(|| bad("last-delivered-id"))?;
    // XPENDING summary: [count, smallest id, greatest id, consumers].
    let oldest_pending = match pending {
        Value::Array(items) => match items.get(1) {
            Some(Value::BulkString(id)) => {
                Some(EntryId::parse(&String::from_utf8_lossy(id)).ok_or_else(|| bad("XPENDING"))?)
            }
            _ => None,
        },
        _ => None,
    };
    let newest: redis::streams::StreamRangeReply = redis::FromRedisValue::from_redis_value(newest)?;
    let newest = match newest.ids.first() {
        Some(entry) => Some(EntryId::parse(&entry.id).ok_or_else(|| bad("XREVRANGE"))?),
        None => None,
    };
    Ok(Some(GroupPosition {
        last_delivered,
        oldest_pending,
        newest,
    }))
}

fn no_group(e: &RedisError) -> bool {
    e.code() == Some("NOGROUP")
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "NOGROUP"))
}

/// The `last-delivered-id` of the `orders` group in an `XINFO GROUPS` reply.
fn group_last_delivered(groups: Value) -> Option<String> {
    let Value::Array(groups) = groups else {
        return None;
    };
    groups.into_iter().find_map(|group| {
        let fields: Vec<(String, Value)> = redis::FromRedisValue::from_redis_value(group).ok()?;
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        (field("name").and_then(text)? == CONSUMER_GROUP)
            .then(|| field("last-delivered-id").and_then(text))
            .flatten()
    })
}

/// Stream entries checked against the database per page while trimming.
const TRIM_PAGE: usize = 500;

/// Removes the entries of the sale's stream that are already orders or
/// dead letters, oldest first (see the module doc); returns how many went,
/// or `None` when nothing could go and no script ran.
///
/// # Errors
/// Redis or the database failed; nothing was trimmed then.
pub async fn trim_written<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
) -> Result<Option<u64>, SaleError> {
    trim_stream(conn, store, sale_id, &SaleKeys::new(sale_id).stream).await
}

/// [`trim_written`] over every stream of sale `sale_id` of `buckets`
/// buckets: its own (where a retried dead letter goes) and, when bucketed,
/// each bucket's. Returns (trim scripts run, entries trimmed).
///
/// # Errors
/// Redis or the database failed on a stream: the first such error, after
/// every other stream was tried (one failing bucket does not stop the
/// others being trimmed); streams trimmed stay trimmed.
pub async fn trim_all_written<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    buckets: u32,
) -> Result<(u64, u64), SaleError> {
    let (mut scripts, mut entries) = (0, 0);
    let mut failed = None;
    for stream in streams(sale_id, buckets) {
        match trim_stream(conn, store, sale_id, &stream).await {
            Ok(Some(n)) => {
                scripts += 1;
                entries += n;
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, sale = sale_id, stream, "cannot trim a stream of the sale; the others go on");
                failed.get_or_insert(error);
            }
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok((scripts, entries)),
    }
}

/// The streams of sale `sale_id`: its own, then each bucket's.
fn streams(sale_id: &str, buckets: u32) -> Vec<String> {
    let buckets = if buckets > 1 { buckets } else { 0 };
    std::iter::once(SaleKeys::new(sale_id).stream)
        .chain((0..buckets).map(|k| SaleKeys::bucket(sale_id, k).stream))
        .collect()
}

/// Trims `stream`, one of sale `sale_id`'s (see [`trim_written`]). A
/// dead letter stands for an entry with its id and the same fields: the
/// dead-letter stream is the sale's, shared by every stream of a bucketed
/// sale, whose ids may coincide.
async fn trim_stream<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    stream: &str,
) -> Result<Option<u64>, SaleError> {
    let Some(bound) = position(conn, stream).await?.and_then(|p| p.trim_below()) else {
        return Ok(None);
    };
    let mut dead: Option<Vec<super::dead_letter::DeadLetter>> = None;
    let mut start = "-".to_owned();
    let keep_from = 'scan: loop {
        let page: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg(format!("({bound}"))
            .arg("COUNT")
            .arg(TRIM_PAGE)
            .query_async(conn)
            .await?;
        let rids: Vec<Option<String>> = page
            .ids
            .iter()
            .map(|e| super::entry::parse(e).ok().map(|r| r.reservation_id))
            .collect();
        let wanted: Vec<&str> = rids.iter().flatten().map(String::as_str).collect();
        let with_orders = store.orders().existing(&wanted).await?;
        for (entry, rid) in page.ids.iter().zip(&rids) {
            if rid.as_ref().is_some_and(|r| with_orders.contains(r)) {
                continue;
            }
            if dead.is_none() {
                dead = Some(super::dead_letter::list(conn, sale_id).await?);
            }
            let fields = super::dead_letter::view(entry).fields;
            if !dead.as_ref().is_some_and(|d| {
                d.iter()
                    .any(|d| d.source_id == entry.id && d.fields == fields)
            }) {
                break 'scan EntryId::parse(&entry.id);
            }
        }
        match page.ids.last() {
            Some(last) if page.ids.len() == TRIM_PAGE => start = format!("({}", last.id),
            _ => break Some(bound),
        }
    };
    let Some(keep_from) = keep_from else {
        return Ok(None);
    };
    let trimmed: i64 = TRIM
        .key(stream)
        .arg(CONSUMER_GROUP)
        .arg(keep_from.to_string())
        .invoke_async(conn)
        .await?;
    // -1: the group moved back or went away since it was read; next time.
    Ok(Some(u64::try_from(trimmed).unwrap_or(0)))
}

/// The ids of the archived sales.
///
/// # Errors
/// Redis failed.
pub async fn archived<C: ConnectionLike + Send>(conn: &mut C) -> RedisResult<HashSet<String>> {
    redis::cmd("SMEMBERS")
        .arg(ARCHIVED_SALES)
        .query_async(conn)
        .await
}

/// Makes `sale_id` live again (its consumer restarts within
/// `backend.sale_poll_ms`). Called after the change that needs it, so an
/// archiving racing the change is undone.
///
/// # Errors
/// Redis failed.
pub async fn unarchive<C: ConnectionLike + Send>(conn: &mut C, sale_id: &str) -> RedisResult<()> {
    redis::cmd("SREM")
        .arg(ARCHIVED_SALES)
        .arg(sale_id)
        .query_async::<i64>(conn)
        .await
        .map(drop)
}

/// Archives `sale_id` when it is finished (see the module doc): ended
/// before Redis's clock minus `grace` by its Redis window (the clock the
/// deduct script sells by), drained, nothing dead-lettered, every
/// reservation in `resv` with its order, every order settled. Answers
/// whether it is archived now.
///
/// # Errors
/// Redis or the database failed; nothing was archived then.
pub async fn try_archive<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    grace: Duration,
) -> Result<bool, SaleError> {
    try_archive_all(conn, store, sale_id, 1, grace).await
}

/// [`try_archive`] of sale `sale_id` of `buckets` buckets: when bucketed,
/// every bucket's stream must be drained too, and every bucket's `resv`
/// have its orders (the window is the sale's own meta's).
///
/// # Errors
/// Redis or the database failed; nothing was archived then.
pub async fn try_archive_all<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    sale_id: &str,
    buckets: u32,
    grace: Duration,
) -> Result<bool, SaleError> {
    let keys = SaleKeys::new(sale_id);
    let mut all = vec![keys.clone()];
    if buckets > 1 {
        all.extend((0..buckets).map(|k| SaleKeys::bucket(sale_id, k)));
    }
    if !ended_long_ago(conn, &keys, grace).await? || !streams_done(conn, &all).await? {
        return Ok(false);
    }
    if store.orders().unsettled(sale_id).await? > 0 {
        return Ok(false);
    }
    for k in &all {
        if !every_reservation_has_its_order(conn, store, k).await? {
            return Ok(false);
        }
    }
    redis::cmd("SADD")
        .arg(ARCHIVED_SALES)
        .arg(sale_id)
        .query_async::<i64>(conn)
        .await?;
    // A change racing this one unarchives after it writes (an operator
    // reopening the window, a dead letter put back on the stream); these
    // re-reads after the SADD catch the other order.
    if !ended_long_ago(conn, &keys, grace).await? || !streams_done(conn, &all).await? {
        unarchive(conn, sale_id).await?;
        return Ok(false);
    }
    Ok(true)
}

/// [`stream_done`] for every key set of `all`.
async fn streams_done<C: ConnectionLike + Send>(
    conn: &mut C,
    all: &[SaleKeys],
) -> RedisResult<bool> {
    for keys in all {
        if !stream_done(conn, keys).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Nothing left for the stream consumer: the stream is drained by the
/// group (or absent, or empty), and the dead-letter stream is empty.
async fn stream_done<C: ConnectionLike + Send>(conn: &mut C, keys: &SaleKeys) -> RedisResult<bool> {
    let drained = match position(conn, &keys.stream).await? {
        Some(p) => p.drained(),
        // No group to read it (or an unexpected reply): done only if
        // there is nothing to read.
        None => {
            redis::cmd("XLEN")
                .arg(&keys.stream)
                .query_async::<i64>(conn)
                .await?
                == 0
        }
    };
    Ok(drained
        && redis::cmd("XLEN")
            .arg(&keys.dead)
            .query_async::<i64>(conn)
            .await?
            == 0)
}

/// Reservations of `resv` checked against the database per page.
const RESERVATION_PAGE: usize = 500;

/// Whether every reservation Redis counted (`resv`, read page by page with
/// `HSCAN`, never in one atomic step) has its order. Compared member by
/// member, not by count: an order Redis never counted must not stand in
/// for a reservation without one.
async fn every_reservation_has_its_order<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    keys: &SaleKeys,
) -> Result<bool, SaleError> {
    let mut cursor = 0_u64;
    loop {
        let (next, flat): (u64, Vec<String>) = redis::cmd("HSCAN")
            .arg(&keys.reservations)
            .arg(cursor)
            .arg("COUNT")
            .arg(RESERVATION_PAGE)
            .query_async(conn)
            .await?;
        // HSCAN answers field, value, field, value...
        let rids: Vec<&str> = flat.iter().step_by(2).map(String::as_str).collect();
        if store.orders().existing(&rids).await?.len() < rids.iter().collect::<HashSet<_>>().len() {
            return Ok(false);
        }
        if next == 0 {
            return Ok(true);
        }
        cursor = next;
    }
}

/// Whether the sale's window in Redis ended before Redis's clock minus
/// `grace`; false when the sale is not in Redis (it is being restored).
async fn ended_long_ago<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
    grace: Duration,
) -> RedisResult<bool> {
    let ends_at_ms: Option<i64> = redis::cmd("HGET")
        .arg(&keys.meta)
        .arg("ends_at_ms")
        .query_async(conn)
        .await?;
    let Some(end) = ends_at_ms else {
        return Ok(false);
    };
    Ok(!within_grace(end, grace, redis_now_ms(conn).await?))
}

/// Whether a sale ending at `ends_at_ms` is still within `grace` of its end
/// (or not ended) at `now_ms`: such a sale must be live.
pub fn within_grace(ends_at_ms: i64, grace: Duration, now_ms: i64) -> bool {
    ends_at_ms.saturating_add(grace.as_millis() as i64) >= now_ms
}

/// Redis's clock (`TIME`), in ms: the one the deduct script opens and
/// closes sales by, so every archiving decision reads it too.
///
/// # Errors
/// Redis failed.
pub async fn redis_now_ms<C: ConnectionLike + Send>(conn: &mut C) -> RedisResult<i64> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs.saturating_mul(1000).saturating_add(micros / 1000))
}

#[cfg(test)]
mod tests;
