//! Types shared by the Flashgate gateway (`flashgate`) and the order backend
//! (`flashgate-backend`). Both processes read the same TOML file and meet in
//! Redis, so the file shape, the Redis key layout and the reservation record
//! are defined once, here.
//!
//! Layout:
//! - [`config`]: the TOML file (`config::file`), validated
//!   (`config::validate`, every problem named by its key) into typed
//!   settings ([`config::Config`]); parsing reads no file nor environment.
//! - [`draw`]: the opening draw's record and its order, recomputed for audits.
//! - [`keys`]: the Redis key layout of a sale (all keys share one hash tag).
//! - [`buckets`]: a sale's stock split over several hash tags (`buckets = N`),
//!   and [`transfer`]: items moving between them.
//! - [`redis_conn`]: one connection type for the three `redis.mode`s
//!   (standalone, cluster, sentinel), and the sale-events subscription.
//! - [`scripts`]: the one registry of Lua scripts: every `redis::Script`
//!   the gateway and the backend run, the cluster's `NOSCRIPT` fallback and
//!   what `flashgate check --connect` loads.
//! - [`reservation`]: the record the deduct script appends to a sale's stream,
//!   and the order API between gateway and backend.
//! - [`sale`]: a sale's definition and the state a buyer sees.
//! - [`checkout`]: the checkout hand-off: `checkout_url` templates and the
//!   claims of the `{handoff}` token.
//! - [`stream_info`]: a sale stream's unpersisted backlog.
//! - [`secret`]: constant-time comparison of bearer tokens.
//! - [`ca_file`]: the CA certificates of a `*.ca_file` key, errors named by it.
//! - [`backoff`]: capped exponential backoff with jitter.
//! - [`dependency`]: what a process waits for, checked and logged once per change.
//! - [`metrics`]: the Prometheus registry, which also lists every family's name.

// Product code: a panic is a bug. Handle the error, or `expect` with the
// invariant that makes it impossible (tests may unwrap: clippy.toml).
#![warn(clippy::unwrap_used)]
#![forbid(unsafe_code)]

pub mod backoff;
pub mod buckets;
pub mod ca_file;
pub mod checkout;
pub mod config;
pub mod dependency;
pub mod draw;
pub mod keys;
pub mod metrics;
pub mod redis_conn;
pub mod reservation;
pub mod sale;
pub mod scripts;
pub mod secret;
pub mod stream_info;
pub mod transfer;

/// Milliseconds since the Unix epoch, the time unit stored in Redis and SQL.
/// Read from the system clock directly: a buy reads it several times, and
/// a calendar date (`chrono::Utc::now`) is not needed for a count.
pub fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// A time that is not RFC 3339, named by the field it was given for.
#[derive(Debug, thiserror::Error)]
#[error("{field}: `{value}` is not an RFC 3339 time ({source})")]
pub struct BadTime {
    pub field: String,
    pub value: String,
    pub source: chrono::ParseError,
}

/// Parses an RFC 3339 time given for `field` (a config key, an API field)
/// into Unix milliseconds: the one parser of the times operators write.
///
/// # Errors
/// `value` is not RFC 3339; the error names `field` and `value`.
pub fn parse_rfc3339(field: &str, value: &str) -> Result<i64, BadTime> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|source| BadTime {
            field: field.to_owned(),
            value: value.to_owned(),
            source,
        })
}

/// Formats Unix milliseconds as an RFC 3339 UTC timestamp.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
