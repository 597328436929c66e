//! Where secrets and overrides come from: the process environment, or in
//! tests an [`Env`] of their own, so parsing never reads the real one.

use std::path::{Path, PathBuf};

/// Environment variable holding the HS256 secret for buyer tokens.
pub const ENV_JWT_SECRET: &str = "FLASHGATE_JWT_SECRET";
/// Environment variable holding the HMAC key that signs proof-of-work
/// challenges (required by the gateway when `challenge.mode` is not off).
pub const ENV_CHALLENGE_SECRET: &str = "FLASHGATE_CHALLENGE_SECRET";
/// Environment variable holding the admin API bearer token.
pub const ENV_ADMIN_TOKEN: &str = "FLASHGATE_ADMIN_TOKEN";
/// Environment variable holding the bearer token gateways present on the
/// backend's order API (`/internal/*` routes a gateway calls).
pub const ENV_INTERNAL_TOKEN: &str = "FLASHGATE_INTERNAL_TOKEN";
/// Environment variable holding the bearer token the shop presents to
/// confirm payments (`POST /internal/orders/{id}/pay`).
pub const ENV_SHOP_TOKEN: &str = "FLASHGATE_SHOP_TOKEN";
/// Environment variable holding the HMAC-SHA256 key that signs order event
/// webhooks (required by the backend when `events.webhook_url` is set).
pub const ENV_WEBHOOK_SECRET: &str = "FLASHGATE_WEBHOOK_SECRET";
/// Environment variable holding the HS256 key of checkout hand-off tokens
/// (`{handoff}` in a sale's `checkout_url`), shared with the shop.
pub const ENV_HANDOFF_SECRET: &str = "FLASHGATE_HANDOFF_SECRET";
/// Environment variable holding the HS256 key that signs waiting-room
/// cookies (required by the gateway when `[[shop.waiting_rooms]]` is set).
pub const ENV_WAITING_ROOM_SECRET: &str = "FLASHGATE_WAITING_ROOM_SECRET";
/// Environment variable overriding `backend.database_url`.
pub const ENV_DATABASE_URL: &str = "FLASHGATE_DATABASE_URL";
/// Environment variable overriding `backend.consumer_name` (e.g. a pod name).
pub const ENV_CONSUMER_NAME: &str = "FLASHGATE_CONSUMER_NAME";
/// Set by systemd's `RuntimeDirectory=`: the default `gateway.runtime_dir`.
pub const ENV_RUNTIME_DIRECTORY: &str = "RUNTIME_DIRECTORY";
/// The user's private runtime directory; `flashgate` under it is the
/// default `gateway.runtime_dir` outside systemd.
pub const ENV_XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";
/// `gateway.runtime_dir` when neither variable is set (relative to the
/// working directory, like the default database).
pub const DEFAULT_RUNTIME_DIR: &str = "data/run";

/// Where secrets and overrides come from; tests pass their own.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

/// No environment at all.
pub struct NoEnv;

impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// `gateway.runtime_dir` as set, else systemd's `RuntimeDirectory=` (the
/// first one), else `$XDG_RUNTIME_DIR/flashgate`, else `data/run`.
pub fn runtime_dir(set: Option<String>, env: &dyn Env) -> PathBuf {
    if let Some(dir) = set {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env
        .var(ENV_RUNTIME_DIRECTORY)
        .and_then(|v| v.split(':').next().map(str::to_owned))
        .filter(|d| !d.is_empty())
    {
        return PathBuf::from(dir);
    }
    match env.var(ENV_XDG_RUNTIME_DIR) {
        Some(dir) => Path::new(&dir).join("flashgate"),
        None => PathBuf::from(DEFAULT_RUNTIME_DIR),
    }
}
