//! The TOML configuration shared by the gateway and the backend.
//!
//! Two layers: [`file`] is the serde shape of the file (unknown keys are
//! rejected, because a misspelled limit silently turns protection off), and
//! [`Config`] is the validated form built from it with typed values. Every
//! validation problem is reported at once, each prefixed with its key path.
//!
//! Secrets never need to be in the file: `FLASHGATE_JWT_SECRET`,
//! `FLASHGATE_ADMIN_TOKEN` and `FLASHGATE_DATABASE_URL` override it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sale::SaleSpec;

/// Environment variable holding the HS256 secret for buyer tokens.
pub const ENV_JWT_SECRET: &str = "FLASHGATE_JWT_SECRET";
/// Environment variable holding the admin API bearer token.
pub const ENV_ADMIN_TOKEN: &str = "FLASHGATE_ADMIN_TOKEN";
/// Environment variable overriding `backend.database_url`.
pub const ENV_DATABASE_URL: &str = "FLASHGATE_DATABASE_URL";

/// A configuration problem, with every bad key named.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// The serde shape of the TOML file, with the defaults of every key.
pub mod file {
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct File {
        pub redis: Redis,
        pub auth: Auth,
        pub gateway: Gateway,
        pub backend: Backend,
        pub limits: Limits,
        pub deny: Deny,
        pub sales: Vec<Sale>,
    }

    /// A token bucket: `per_second` sustained, up to `burst` at once.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Bucket {
        pub per_second: u32,
        pub burst: u32,
    }

    /// The buckets of one route class; an absent bucket is no limit.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct RouteLimits {
        pub user: Option<Bucket>,
        pub ip: Option<Bucket>,
        pub global: Option<Bucket>,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Limits {
        pub trusted_proxies: Vec<String>,
        pub max_tracked_keys: u64,
        pub idle_seconds: u64,
        pub buy: RouteLimits,
        pub read: RouteLimits,
    }

    impl Default for Limits {
        fn default() -> Self {
            Self {
                trusted_proxies: Vec::new(),
                max_tracked_keys: 100_000,
                idle_seconds: 120,
                buy: RouteLimits::default(),
                read: RouteLimits::default(),
            }
        }
    }

    #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Deny {
        pub users: Vec<String>,
        /// Addresses or CIDRs.
        pub ips: Vec<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Redis {
        pub url: String,
        pub timeout_ms: u64,
        pub breaker_failures: u32,
        pub breaker_cooldown_ms: u64,
    }

    impl Default for Redis {
        fn default() -> Self {
            Self { url: "redis://127.0.0.1:6379/".into(), timeout_ms: 250, breaker_failures: 5, breaker_cooldown_ms: 1000 }
        }
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Auth {
        pub jwt_secret: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Gateway {
        pub listen: String,
        pub threads: usize,
        pub shop_upstream: String,
        pub backend_url: String,
        pub forward_timeout_ms: u64,
        pub static_dir: String,
        pub idempotency_ttl_seconds: u64,
        pub keepalive_seconds: u64,
    }

    impl Default for Gateway {
        fn default() -> Self {
            Self {
                listen: "0.0.0.0:8080".into(),
                threads: 2,
                shop_upstream: "127.0.0.1:8000".into(),
                backend_url: "http://127.0.0.1:9090".into(),
                forward_timeout_ms: 500,
                static_dir: "static".into(),
                idempotency_ttl_seconds: 86_400,
                keepalive_seconds: 60,
            }
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Backend {
        pub listen: String,
        pub admin_listen: String,
        pub database_url: String,
        pub consumer_name: Option<String>,
        pub batch_size: usize,
        pub block_ms: u64,
        pub claim_idle_ms: u64,
        pub sale_poll_ms: u64,
    }

    impl Default for Backend {
        fn default() -> Self {
            Self {
                listen: "127.0.0.1:9090".into(),
                admin_listen: "127.0.0.1:9091".into(),
                database_url: "sqlite://data/flashgate.db".into(),
                consumer_name: None,
                batch_size: 500,
                block_ms: 1000,
                claim_idle_ms: 30_000,
                sale_poll_ms: 1000,
            }
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Sale {
        pub id: String,
        pub name: String,
        pub stock: i64,
        #[serde(default = "one")]
        pub per_user_limit: i64,
        /// RFC 3339; defaults to the moment the sale is first preheated.
        pub starts_at: Option<String>,
        /// RFC 3339; defaults to `starts_at + duration_seconds`.
        pub ends_at: Option<String>,
        #[serde(default = "hour")]
        pub duration_seconds: i64,
    }

    fn one() -> i64 {
        1
    }
    fn hour() -> i64 {
        3600
    }
}

/// Redis connection settings.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub url: String,
    /// Upper bound for one Redis call; past it a buyer gets 503.
    pub timeout: Duration,
    /// Consecutive failures that open the gateway's circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker answers 503 before probing Redis again.
    pub breaker_cooldown: Duration,
}

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    pub threads: usize,
    pub shop_upstream: SocketAddr,
    pub backend_url: String,
    pub forward_timeout: Duration,
    pub static_dir: PathBuf,
    pub idempotency_ttl: Duration,
    pub keepalive: Duration,
}

/// Backend settings.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub database_url: String,
    pub consumer_name: String,
    pub batch_size: usize,
    pub block: Duration,
    pub claim_idle: Duration,
    pub sale_poll: Duration,
}

/// Edge limits, validated: CIDRs parsed, buckets non-zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub max_tracked_keys: u64,
    pub idle: Duration,
    pub buy: file::RouteLimits,
    pub read: file::RouteLimits,
}

/// Deny lists, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyConfig {
    pub users: std::collections::HashSet<String>,
    pub nets: Vec<ipnet::IpNet>,
}

impl DenyConfig {
    pub fn denies_ip(&self, ip: std::net::IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

/// Parses an address or CIDR into a network (an address is a /32 or /128).
fn parse_net(s: &str) -> Option<ipnet::IpNet> {
    s.parse().ok().or_else(|| s.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub limits: LimitsConfig,
    pub deny: DenyConfig,
    pub redis: RedisConfig,
    /// HS256 secret for buyer tokens; `None` when neither file nor env sets it.
    pub jwt_secret: Option<String>,
    /// Admin bearer token, from the environment only.
    pub admin_token: Option<String>,
    pub gateway: GatewayConfig,
    pub backend: BackendConfig,
    /// Sales declared in the file; preheated only when absent from Redis.
    pub sales: Vec<SaleSpec>,
}

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

impl Config {
    /// Reads and validates `path`, with secrets from the process environment.
    ///
    /// # Errors
    /// An unreadable file, a TOML error (with line and column) or every
    /// invalid value, each named by its key.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::from_toml_str(&text, &ProcessEnv, crate::now_ms())
    }

    /// Parses and validates a TOML document. `now_ms` fills in sale start
    /// times that the file leaves out.
    ///
    /// # Errors
    /// See [`Config::load`].
    pub fn from_toml_str(text: &str, env: &dyn Env, now_ms: i64) -> Result<Self, ConfigError> {
        let f: file::File = toml::from_str(text)?;
        let mut errors = Vec::new();

        let mut addr = |key: &str, value: &str| -> SocketAddr {
            value.parse().unwrap_or_else(|_| {
                errors.push(format!("{key}: `{value}` is not an IP:port address"));
                SocketAddr::from(([0, 0, 0, 0], 0))
            })
        };
        let gateway_listen = addr("gateway.listen", &f.gateway.listen);
        let shop_upstream = addr("gateway.shop_upstream", &f.gateway.shop_upstream);
        let backend_listen = addr("backend.listen", &f.backend.listen);
        let admin_listen = addr("backend.admin_listen", &f.backend.admin_listen);

        let mut check = |ok: bool, msg: &str| {
            if !ok {
                errors.push(msg.to_owned());
            }
        };
        let database_url = env.var(ENV_DATABASE_URL).unwrap_or(f.backend.database_url);
        check(
            database_url.starts_with("sqlite:") || database_url.starts_with("postgres://") || database_url.starts_with("postgresql://"),
            "backend.database_url: must be a sqlite: or postgres:// URL",
        );
        check(
            f.redis.url.starts_with("redis://") || f.redis.url.starts_with("rediss://"),
            "redis.url: must start with redis:// or rediss://",
        );
        check((1..=60_000).contains(&f.redis.timeout_ms), "redis.timeout_ms: must be between 1 and 60000");
        check((1..=1000).contains(&f.redis.breaker_failures), "redis.breaker_failures: must be between 1 and 1000");
        check((10..=600_000).contains(&f.redis.breaker_cooldown_ms), "redis.breaker_cooldown_ms: must be between 10 and 600000");
        check((1..=256).contains(&f.gateway.threads), "gateway.threads: must be between 1 and 256");
        check(
            f.gateway.backend_url.starts_with("http://"),
            "gateway.backend_url: must be an http:// URL",
        );
        check(
            (1..=60_000).contains(&f.gateway.forward_timeout_ms),
            "gateway.forward_timeout_ms: must be between 1 and 60000",
        );
        check(f.gateway.idempotency_ttl_seconds >= 1, "gateway.idempotency_ttl_seconds: must be at least 1");
        check((1..=3600).contains(&f.gateway.keepalive_seconds), "gateway.keepalive_seconds: must be between 1 and 3600");
        check((1..=10_000).contains(&f.backend.batch_size), "backend.batch_size: must be between 1 and 10000");
        check((1..=60_000).contains(&f.backend.block_ms), "backend.block_ms: must be between 1 and 60000");
        check(f.backend.claim_idle_ms >= 100, "backend.claim_idle_ms: must be at least 100");
        check((10..=60_000).contains(&f.backend.sale_poll_ms), "backend.sale_poll_ms: must be between 10 and 60000");

        let mut nets = |key: &str, list: &[String]| -> Vec<ipnet::IpNet> {
            list.iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    let net = parse_net(v);
                    if net.is_none() {
                        errors.push(format!("{key}[{i}]: `{v}` is not an IP address or CIDR"));
                    }
                    net
                })
                .collect()
        };
        let trusted_proxies = nets("limits.trusted_proxies", &f.limits.trusted_proxies);
        let deny_nets = nets("deny.ips", &f.deny.ips);
        for (class, route) in [("buy", &f.limits.buy), ("read", &f.limits.read)] {
            for (scope, bucket) in [("user", route.user), ("ip", route.ip), ("global", route.global)] {
                if let Some(b) = bucket {
                    if b.per_second == 0 || b.burst == 0 {
                        errors.push(format!("limits.{class}.{scope}: per_second and burst must be > 0 (leave the bucket out for no limit)"));
                    }
                }
            }
        }
        if f.limits.max_tracked_keys < 1 {
            errors.push("limits.max_tracked_keys: must be at least 1".into());
        }
        if f.limits.idle_seconds < 1 {
            errors.push("limits.idle_seconds: must be at least 1".into());
        }

        let mut sales = Vec::with_capacity(f.sales.len());
        for (i, s) in f.sales.iter().enumerate() {
            match sale_spec(s, now_ms) {
                Ok(spec) => match spec.validate() {
                    Ok(()) if sales.iter().any(|o: &SaleSpec| o.id == spec.id) => {
                        errors.push(format!("sales[{i}].id: `{}` is declared twice", spec.id))
                    }
                    Ok(()) => sales.push(spec),
                    Err(e) => errors.push(format!("sales[{i}].{e}")),
                },
                Err(e) => errors.push(format!("sales[{i}].{e}")),
            }
        }
        if !errors.is_empty() {
            return Err(ConfigError::Invalid(errors));
        }
        Ok(Config {
            limits: LimitsConfig {
                trusted_proxies,
                max_tracked_keys: f.limits.max_tracked_keys,
                idle: Duration::from_secs(f.limits.idle_seconds),
                buy: f.limits.buy,
                read: f.limits.read,
            },
            deny: DenyConfig { users: f.deny.users.into_iter().collect(), nets: deny_nets },
            redis: RedisConfig {
                url: f.redis.url,
                timeout: Duration::from_millis(f.redis.timeout_ms),
                breaker_failures: f.redis.breaker_failures,
                breaker_cooldown: Duration::from_millis(f.redis.breaker_cooldown_ms),
            },
            jwt_secret: env.var(ENV_JWT_SECRET).or(f.auth.jwt_secret).filter(|s| !s.is_empty()),
            admin_token: env.var(ENV_ADMIN_TOKEN),
            gateway: GatewayConfig {
                listen: gateway_listen,
                threads: f.gateway.threads,
                shop_upstream,
                backend_url: f.gateway.backend_url.trim_end_matches('/').to_owned(),
                forward_timeout: Duration::from_millis(f.gateway.forward_timeout_ms),
                static_dir: PathBuf::from(f.gateway.static_dir),
                idempotency_ttl: Duration::from_secs(f.gateway.idempotency_ttl_seconds),
                keepalive: Duration::from_secs(f.gateway.keepalive_seconds),
            },
            backend: BackendConfig {
                listen: backend_listen,
                admin_listen,
                database_url,
                consumer_name: f.backend.consumer_name.unwrap_or_else(default_consumer_name),
                batch_size: f.backend.batch_size,
                block: Duration::from_millis(f.backend.block_ms),
                claim_idle: Duration::from_millis(f.backend.claim_idle_ms),
                sale_poll: Duration::from_millis(f.backend.sale_poll_ms),
            },
            sales,
        })
    }
}

/// A consumer name unique per process on a host: `<host>-<pid>`.
fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
    format!("{}-{}", host.trim(), std::process::id())
}

fn parse_time(key: &str, value: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{key}: `{value}` is not an RFC 3339 time ({e})"))
}

fn sale_spec(s: &file::Sale, now_ms: i64) -> Result<SaleSpec, String> {
    let starts_at_ms = match &s.starts_at {
        Some(t) => parse_time("starts_at", t)?,
        None => now_ms,
    };
    if s.duration_seconds < 1 {
        return Err("duration_seconds: must be at least 1".into());
    }
    let ends_at_ms = match &s.ends_at {
        Some(t) => parse_time("ends_at", t)?,
        None => starts_at_ms.saturating_add(s.duration_seconds.saturating_mul(1000)),
    };
    Ok(SaleSpec {
        id: s.id.clone(),
        name: s.name.clone(),
        stock: s.stock,
        per_user_limit: s.per_user_limit,
        starts_at_ms,
        ends_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct MapEnv(&'static [(&'static str, &'static str)]);
    impl Env for MapEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn shipped_config_is_valid() {
        let text = include_str!("../../config/flashgate.toml");
        let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
        assert!(!c.sales.is_empty());
        assert!(c.jwt_secret.is_none(), "the shipped file must not carry a secret");
    }

    #[test]
    fn unknown_key_is_rejected_with_its_name_and_line() {
        let err = Config::from_toml_str("[gateway]\nthreads = 2\nthredas = 4\n", &NoEnv, 0).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("thredas"), "{msg}");
        assert!(msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn every_bad_value_is_reported_with_its_key() {
        let text = "[redis]\ntimeout_ms = 0\n[gateway]\nlisten = \"nope\"\n[[sales]]\nid = \"a b\"\nname = \"x\"\nstock = 1\n";
        let msg = Config::from_toml_str(text, &NoEnv, 0).unwrap_err().to_string();
        for key in ["redis.timeout_ms", "gateway.listen", "sales[0].id"] {
            assert!(msg.contains(key), "{key} missing from {msg}");
        }
    }

    #[test]
    fn secrets_come_from_the_environment_over_the_file() {
        let text = "[auth]\njwt_secret = \"file\"\n";
        let env = MapEnv(&[("FLASHGATE_JWT_SECRET", "env"), ("FLASHGATE_ADMIN_TOKEN", "adm")]);
        let c = Config::from_toml_str(text, &env, 0).unwrap();
        assert_eq!(c.jwt_secret.as_deref(), Some("env"));
        assert_eq!(c.admin_token.as_deref(), Some("adm"));
    }

    #[test]
    fn limits_and_deny_lists_are_parsed_and_checked() {
        let text = "[limits]\ntrusted_proxies = [\"10.0.0.0/8\"]\n[limits.buy]\nuser = { per_second = 2, burst = 5 }\n[deny]\nips = [\"192.0.2.7\", \"198.51.100.0/24\"]\n";
        let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
        assert_eq!(c.limits.buy.user, Some(file::Bucket { per_second: 2, burst: 5 }));
        assert!(c.limits.buy.ip.is_none());
        assert!(c.deny.denies_ip("198.51.100.9".parse().unwrap()));
        assert!(c.deny.denies_ip("192.0.2.7".parse().unwrap()));
        assert!(!c.deny.denies_ip("192.0.2.8".parse().unwrap()));
        let bad = "[limits]\ntrusted_proxies = [\"nope\"]\n[limits.read]\nip = { per_second = 0, burst = 1 }\n";
        let msg = Config::from_toml_str(bad, &NoEnv, 0).unwrap_err().to_string();
        assert!(msg.contains("limits.trusted_proxies[0]") && msg.contains("limits.read.ip"), "{msg}");
    }

    #[test]
    fn sale_window_defaults_to_now_plus_duration() {
        let text = "[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\nduration_seconds = 10\n";
        let c = Config::from_toml_str(text, &NoEnv, 1000).unwrap();
        assert_eq!((c.sales[0].starts_at_ms, c.sales[0].ends_at_ms), (1000, 11_000));
        assert_eq!(c.sales[0].per_user_limit, 1);
    }
}
