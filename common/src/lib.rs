//! Types shared by the Flashgate gateway (`flashgate`) and the order backend
//! (`flashgate-backend`). Both processes read the same TOML file and meet in
//! Redis, so the file shape, the Redis key layout and the reservation record
//! are defined once, here.
//!
//! Layout:
//! - [`config`]: the TOML file (`config::file`), validated
//!   (`config::validate`, every problem named by its key) into typed
//!   settings ([`config::Config`]); parsing reads no file nor environment.
//! - [`keys`]: the Redis key layout of a sale (all keys share one hash tag).
//! - [`reservation`]: the record the deduct script appends to a sale's stream,
//!   and the order API between gateway and backend.
//! - [`sale`]: a sale's definition and the state a buyer sees.
//! - [`stream_info`]: a sale stream's unpersisted backlog.
//! - [`secret`]: constant-time comparison of bearer tokens.
//! - [`backoff`]: capped exponential backoff with jitter.
//! - [`dependency`]: what a process waits for, checked and logged once per change.
#![forbid(unsafe_code)]

pub mod backoff;
pub mod config;
pub mod dependency;
pub mod keys;
pub mod reservation;
pub mod sale;
pub mod secret;
pub mod stream_info;

/// Milliseconds since the Unix epoch, the time unit stored in Redis and SQL.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Formats Unix milliseconds as an RFC 3339 UTC timestamp.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
