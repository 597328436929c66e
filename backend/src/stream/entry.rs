//! A stream entry read back as the reservation the deduct script wrote,
//! for the consumer, retention and reconciliation alike.

use flashgate_common::reservation::Reservation;
use redis::streams::StreamId;
use redis::Value;

/// A reservation from one stream entry, or the name of its bad field.
/// Each field is looked up in the entry's own map (no second map per
/// entry: the consumer parses every reservation it writes).
pub fn parse(entry: &StreamId) -> Result<Reservation, &'static str> {
    Reservation::from_fields(|name| match entry.map.get(name)? {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s.as_str()),
        _ => None,
    })
}
