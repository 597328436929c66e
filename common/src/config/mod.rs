//! The TOML configuration shared by the gateway and the backend.
//!
//! Layout:
//! - [`file`](mod@file): the serde shape of the file and the default of every key
//!   (unknown keys are rejected: a misspelled limit would silently turn
//!   protection off).
//! - `validate`: one function per table, from the file to the settings;
//!   every problem is reported at once, each prefixed with its key path.
//! - `cache_rules`: `[[shop.cache.rules]]`, validated and matched.
//! - `waiting_rooms`: `[[shop.waiting_rooms]]`, validated.
//! - `check`: the validation helper, which writes each message from the
//!   bound it enforces (`limits.buy.user.burst: must be between 1 and
//!   10000000 (leave the bucket out for no limit), got 0`).
//! - `settings`: the validated [`Config`], in domain types (addresses,
//!   durations, networks, non-zero [`Bucket`]s).
//! - `env`: where secrets and overrides come from ([`Env`]).
//!
//! Parsing is pure: [`Config::from_toml_str`] reads neither files nor the
//! process environment (it is given an [`Env`] and the time), so tests never
//! touch either; [`Config::load`] is the one entry point that does.
//!
//! Secrets never need to be in the file: `FLASHGATE_JWT_SECRET`,
//! `FLASHGATE_ADMIN_TOKEN` and `FLASHGATE_DATABASE_URL` override it;
//! `FLASHGATE_INTERNAL_TOKEN` and `FLASHGATE_SHOP_TOKEN` come only from the
//! environment, and so does `FLASHGATE_CHALLENGE_SECRET` (needed by the
//! gateway only when `challenge.mode` is not off). Secrets under
//! [`MIN_SECRET_BYTES`] are refused, named by where they came from.

use std::path::{Path, PathBuf};

mod cache_rules;
mod check;
mod env;
mod events;
pub mod file;
mod origin;
mod settings;
mod validate;
mod waiting_rooms;

pub use cache_rules::{
    CacheRule, CookieName, PathPattern, RuleMethod, MAX_CACHE_RULES, MAX_RULE_COOKIES,
};
pub use env::{
    Env, NoEnv, ProcessEnv, DEFAULT_RUNTIME_DIR, ENV_ADMIN_TOKEN, ENV_CHALLENGE_SECRET,
    ENV_CONSUMER_NAME, ENV_DATABASE_URL, ENV_HANDOFF_SECRET, ENV_INTERNAL_TOKEN, ENV_JWT_SECRET,
    ENV_RUNTIME_DIRECTORY, ENV_SHOP_TOKEN, ENV_WAITING_ROOM_SECRET, ENV_WEBHOOK_SECRET,
    ENV_XDG_RUNTIME_DIR,
};
pub use events::{webhook_key, AmqpConfig, EventsConfig, WebhookConfig};
pub use file::{ChallengeMode, ClientIpHeader, JwtAlgorithm, RedisMode, DEFAULT_PATH_PREFIX};
pub use origin::{valid_host, Origin, OriginError, Scheme};
pub use settings::{
    AuthConfig, BackendConfig, Bucket, ChallengeConfig, CompressionLevels, Config, DenyConfig,
    FairnessConfig, GatewayConfig, HostHeader, JwksConfig, JwksSource, LimitsConfig, PagesConfig,
    RedisConfig, RedisTarget, RouteLimits, ShopCacheConfig, ShopConfig, TlsConfig, TlsFiles,
};
pub use validate::{
    MAX_BUCKET_BURST, MAX_BUCKET_PER_SECOND, MAX_CHALLENGE_BITS, MAX_IDEMPOTENCY_TTL_SECONDS,
    MAX_LIMITS_IDLE_SECONDS, MAX_SALE_DURATION_SECONDS, MAX_SHOP_CACHE_BYTES,
};
pub use waiting_rooms::{
    valid_room_name, Queueing, RoomMode, WaitingRoomConfig, MAX_WAITING_ROOMS,
};

pub use crate::secret::MIN_SECRET_BYTES;

/// A configuration problem, with every bad key named.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

impl Config {
    /// Reads and validates `path`, with secrets from the process environment.
    ///
    /// # Errors
    /// An unreadable file, a TOML error (with line and column) or every
    /// invalid value, each named by its key.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text, &ProcessEnv, crate::now_ms())
    }

    /// Parses and validates a TOML document, reading nothing else: `env`
    /// gives the secrets and overrides, `now_ms` fills in sale start times
    /// that the file leaves out.
    ///
    /// # Errors
    /// See [`Config::load`].
    pub fn from_toml_str(text: &str, env: &dyn Env, now_ms: i64) -> Result<Self, ConfigError> {
        let f: file::File = toml::from_str(text)?;
        validate::validate(f, env, now_ms).map_err(ConfigError::Invalid)
    }
}

/// Every key the file takes that has a default, as `section.key` with its
/// default in TOML syntax. `docs/CONFIG.md` lists exactly these (a test
/// keeps them in sync), plus the optional keys that default to unset.
pub fn documented_defaults() -> Vec<(String, String)> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
        match value {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => out.push((prefix.to_owned(), other.to_string())),
        }
    }
    let mut out = Vec::new();
    // Serializing plain structs of strings, numbers and lists cannot fail.
    if let Ok(v) = toml::Value::try_from(file::File::default()) {
        walk("", &v, &mut out);
    }
    out.retain(|(k, _)| k != "sales");
    out.sort();
    out
}

#[cfg(test)]
mod tests;
