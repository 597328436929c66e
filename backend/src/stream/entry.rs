//! A stream entry read back as the reservation the deduct script wrote,
//! for the consumer, retention and reconciliation alike.

use std::collections::HashMap;

use flashgate_common::reservation::Reservation;
use redis::streams::StreamId;
use redis::Value;

/// A reservation from one stream entry, or the name of its bad field.
pub fn parse(entry: &StreamId) -> Result<Reservation, &'static str> {
    let fields: HashMap<&str, &[u8]> = entry
        .map
        .iter()
        .filter_map(|(k, v)| match v {
            Value::BulkString(bytes) => Some((k.as_str(), bytes.as_slice())),
            Value::SimpleString(s) => Some((k.as_str(), s.as_bytes())),
            _ => None,
        })
        .collect();
    Reservation::from_fields(|name| fields.get(name).and_then(|v| std::str::from_utf8(v).ok()))
}
