//! The dead-letter stream of a sale (`fg:{sale:ID}:dead`): reservation
//! entries the consumer could not turn into orders, each with its error,
//! kept for an operator instead of blocking the stream or being dropped.
//!
//! A dead entry keeps every field of the original and adds
//! `dead_error`, `dead_source_id` (its id in the sale's stream) and
//! `dead_deliveries`. The admin API lists them (with the reservation the
//! fields hold, when they parse as one) and retries one: the
//! original fields are appended to the sale's stream again and the dead
//! entry is deleted, in one `MULTI`, so the entry is never in both or lost.

use redis::aio::ConnectionLike;
use redis::streams::{StreamId, StreamRangeReply};
use redis::{RedisError, Value};
use serde::Serialize;

use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP};
use flashgate_common::reservation::Reservation;

/// Prefix of the fields the dead-letter stream adds to an entry.
const PREFIX: &str = "dead_";
/// Most entries one listing returns.
pub const MAX_LISTED: usize = 1000;

/// One dead-lettered entry as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Id in the dead-letter stream (what the retry endpoint takes).
    pub entry_id: String,
    /// Id the entry had in the sale's stream.
    pub source_id: String,
    pub error: String,
    pub deliveries: u64,
    /// The original fields, as text (invalid UTF-8 is replaced).
    pub fields: std::collections::BTreeMap<String, String>,
    /// The reservation those fields hold, when they parse as one (a
    /// record's one field `r` is hard to read by eye).
    pub reservation: Option<Reservation>,
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        _ => String::new(),
    }
}

/// Appends `entry` to the sale's dead-letter stream with `error`.
///
/// # Errors
/// Redis failed; the caller must then not acknowledge the entry.
pub async fn bury<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    entry: &StreamId,
    error: &str,
    deliveries: u64,
) -> Result<(), RedisError> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(SaleKeys::new(sale_id).dead).arg("*");
    for (k, v) in &entry.map {
        if !k.starts_with(PREFIX) {
            cmd.arg(k).arg(text(v));
        }
    }
    cmd.arg("dead_error")
        .arg(error)
        .arg("dead_source_id")
        .arg(&entry.id)
        .arg("dead_deliveries")
        .arg(deliveries);
    cmd.query_async::<String>(conn).await.map(drop)
}

/// How many times the group delivered entry `id` of `stream` (0 if not pending).
///
/// # Errors
/// Redis failed.
pub async fn deliveries<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    id: &str,
) -> Result<u64, RedisError> {
    let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(CONSUMER_GROUP)
        .arg(id)
        .arg(id)
        .arg(1)
        .query_async(conn)
        .await?;
    Ok(rows.first().map_or(0, |r| r.3))
}

/// The dead-lettered entries of a sale, oldest first, at most [`MAX_LISTED`].
///
/// # Errors
/// Redis failed.
pub async fn list<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
) -> Result<Vec<DeadLetter>, RedisError> {
    let reply: StreamRangeReply = redis::cmd("XRANGE")
        .arg(SaleKeys::new(sale_id).dead)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(MAX_LISTED)
        .query_async(conn)
        .await?;
    Ok(reply.ids.iter().map(view).collect())
}

/// An entry as operators see it: for a dead entry its source and error;
/// for a stream entry (no `dead_` field), its fields alone.
pub(crate) fn view(entry: &StreamId) -> DeadLetter {
    let mut fields = std::collections::BTreeMap::new();
    let mut dl = DeadLetter {
        entry_id: entry.id.clone(),
        source_id: String::new(),
        error: String::new(),
        deliveries: 0,
        fields: Default::default(),
        reservation: None,
    };
    for (k, v) in &entry.map {
        match k.as_str() {
            "dead_error" => dl.error = text(v),
            "dead_source_id" => dl.source_id = text(v),
            "dead_deliveries" => dl.deliveries = text(v).parse().unwrap_or(0),
            _ => {
                fields.insert(k.clone(), text(v));
            }
        }
    }
    dl.reservation = Reservation::from_fields(|name| fields.get(name).map(String::as_str)).ok();
    dl.fields = fields;
    dl
}

/// Whether a string can be a stream entry id (`ms-seq`), checked before it
/// reaches Redis.
pub fn valid_entry_id(id: &str) -> bool {
    let Some((ms, seq)) = id.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    digits(ms) && digits(seq)
}

/// Puts dead entry `entry_id` back on the sale's stream; returns its new
/// id there, or `None` when there is no such dead entry.
///
/// # Errors
/// Redis failed; then nothing moved.
pub async fn retry<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    entry_id: &str,
) -> Result<Option<String>, RedisError> {
    let keys = SaleKeys::new(sale_id);
    let reply: StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys.dead)
        .arg(entry_id)
        .arg(entry_id)
        .query_async(conn)
        .await?;
    let Some(entry) = reply.ids.first() else {
        return Ok(None);
    };
    let mut add = redis::cmd("XADD");
    add.arg(&keys.stream).arg("*");
    let mut any = false;
    for (k, v) in &entry.map {
        if !k.starts_with(PREFIX) {
            add.arg(k).arg(text(v));
            any = true;
        }
    }
    if !any {
        add.arg("rid").arg("");
    }
    let (new_id, _deleted): (String, i64) = redis::pipe()
        .atomic()
        .add_command(add)
        .cmd("XDEL")
        .arg(&keys.dead)
        .arg(entry_id)
        .query_async(conn)
        .await?;
    Ok(Some(new_id))
}

#[cfg(test)]
mod tests {
    use super::valid_entry_id;

    #[test]
    fn only_stream_ids_are_accepted() {
        assert!(valid_entry_id("1700000000000-0"));
        for bad in ["", "-", "1-", "-1", "a-1", "1-1-1", "1", &"9".repeat(30)] {
            assert!(!valid_entry_id(bad), "{bad}");
        }
    }
}
