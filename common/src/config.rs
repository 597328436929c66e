//! The TOML configuration shared by the gateway and the backend.
//!
//! Two layers: [`file`] is the serde shape of the file (unknown keys are
//! rejected, because a misspelled limit silently turns protection off), and
//! [`Config`] is the validated form built from it with typed values. Every
//! validation problem is reported at once, each prefixed with its key path.
//!
//! Secrets never need to be in the file: `FLASHGATE_JWT_SECRET`,
//! `FLASHGATE_ADMIN_TOKEN` and `FLASHGATE_DATABASE_URL` override it;
//! `FLASHGATE_INTERNAL_TOKEN` and `FLASHGATE_SHOP_TOKEN` come only from the
//! environment. Secrets under [`MIN_SECRET_BYTES`] are refused, named by
//! where they came from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sale::SaleSpec;

/// Environment variable holding the HS256 secret for buyer tokens.
pub const ENV_JWT_SECRET: &str = "FLASHGATE_JWT_SECRET";
/// Environment variable holding the admin API bearer token.
pub const ENV_ADMIN_TOKEN: &str = "FLASHGATE_ADMIN_TOKEN";
/// Environment variable holding the bearer token gateways present on the
/// backend's order API (`/internal/*` routes a gateway calls).
pub const ENV_INTERNAL_TOKEN: &str = "FLASHGATE_INTERNAL_TOKEN";
/// Environment variable holding the bearer token the shop presents to
/// confirm payments (`POST /internal/orders/{id}/pay`).
pub const ENV_SHOP_TOKEN: &str = "FLASHGATE_SHOP_TOKEN";
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

pub use crate::secret::MIN_SECRET_BYTES;
/// Longest `gateway.idempotency_ttl_seconds`: a week. Redis refuses an
/// `EX` past its own limit, and by then the buy has already run.
pub const MAX_IDEMPOTENCY_TTL_SECONDS: u64 = 7 * 86_400;
/// Longest `limits.idle_seconds`: a day. A bucket unused that long is full
/// again anyway; the cache panics on idle times of centuries.
pub const MAX_LIMITS_IDLE_SECONDS: u64 = 86_400;
/// Largest `per_second` of a bucket.
pub const MAX_BUCKET_PER_SECOND: u32 = 1_000_000;
/// Largest `burst` of a bucket.
pub const MAX_BUCKET_BURST: u32 = 10_000_000;
/// Longest `sales[].duration_seconds`: a year.
pub const MAX_SALE_DURATION_SECONDS: i64 = 365 * 86_400;

/// Which header names the client when the peer is a trusted proxy.
///
/// Only one is ever read: common proxies append to `X-Forwarded-For` but
/// pass a client's own `Forwarded` through unchanged, so believing both
/// would let a client choose its address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum ClientIpHeader {
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    #[serde(rename = "forwarded")]
    Forwarded,
}

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
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Default, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct File {
        pub redis: Redis,
        pub auth: Auth,
        pub gateway: Gateway,
        pub backend: Backend,
        pub limits: Limits,
        pub deny: Deny,
        pub shop: Shop,
        pub pages: Pages,
        pub sales: Vec<Sale>,
    }

    /// The shop behind the gateway.
    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Shop {
        /// When non-empty, replaces `gateway.shop_upstream`.
        pub upstreams: Vec<String>,
        pub health_check_interval_ms: u64,
        pub connect_timeout_ms: u64,
        pub read_timeout_ms: u64,
    }

    impl Default for Shop {
        fn default() -> Self {
            Self { upstreams: Vec::new(), health_check_interval_ms: 1000, connect_timeout_ms: 2000, read_timeout_ms: 30_000 }
        }
    }

    /// Product pages, assets and the sale state they poll.
    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Pages {
        pub page_max_age_seconds: u64,
        pub asset_max_age_seconds: u64,
        pub fingerprinted_max_age_seconds: u64,
        pub reload_interval_ms: u64,
        pub state_ttl_ms: u64,
    }

    impl Default for Pages {
        fn default() -> Self {
            Self {
                page_max_age_seconds: 10,
                asset_max_age_seconds: 60,
                fingerprinted_max_age_seconds: 31_536_000,
                reload_interval_ms: 1000,
                state_ttl_ms: 250,
            }
        }
    }

    /// A token bucket: `per_second` sustained, up to `burst` at once.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub struct Bucket {
        pub per_second: u32,
        pub burst: u32,
    }

    /// The buckets of one route class; an absent bucket is no limit.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct RouteLimits {
        pub user: Option<Bucket>,
        pub ip: Option<Bucket>,
        pub global: Option<Bucket>,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Limits {
        pub trusted_proxies: Vec<String>,
        /// The header believed from a trusted proxy.
        pub client_ip_header: super::ClientIpHeader,
        pub max_tracked_keys: u64,
        pub idle_seconds: u64,
        pub buy: RouteLimits,
        pub read: RouteLimits,
        /// One bucket in Redis shared by every gateway; absent = off.
        pub cluster_global: Option<Bucket>,
    }

    impl Default for Limits {
        fn default() -> Self {
            Self {
                trusted_proxies: Vec::new(),
                client_ip_header: super::ClientIpHeader::default(),
                max_tracked_keys: 100_000,
                idle_seconds: 120,
                buy: RouteLimits::default(),
                read: RouteLimits::default(),
                cluster_global: None,
            }
        }
    }

    #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Deny {
        pub users: Vec<String>,
        /// Addresses or CIDRs.
        pub ips: Vec<String>,
    }

    #[derive(Debug, Deserialize, Serialize)]
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

    #[derive(Debug, Default, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Auth {
        pub jwt_secret: Option<String>,
        /// When set, buyer tokens must carry this `aud`.
        pub audience: Option<String>,
        /// When set, buyer tokens must carry this `iss`.
        pub issuer: Option<String>,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Gateway {
        pub listen: String,
        pub admin_listen: String,
        pub threads: usize,
        pub shop_upstream: String,
        pub backend_url: String,
        pub forward_timeout_ms: u64,
        pub static_dir: String,
        pub idempotency_ttl_seconds: u64,
        pub keepalive_seconds: u64,
        pub backlog_pause_threshold: u64,
        pub backlog_check_ms: u64,
        pub body_read_timeout_ms: u64,
        /// Upgrade socket and pid file; unset = `$RUNTIME_DIRECTORY`, else
        /// `$XDG_RUNTIME_DIR/flashgate`, else `data/run`.
        pub runtime_dir: Option<String>,
    }

    impl Default for Gateway {
        fn default() -> Self {
            Self {
                listen: "0.0.0.0:8080".into(),
                admin_listen: "127.0.0.1:9092".into(),
                threads: 2,
                shop_upstream: "127.0.0.1:8000".into(),
                backend_url: "http://127.0.0.1:9090".into(),
                forward_timeout_ms: 500,
                static_dir: "static".into(),
                idempotency_ttl_seconds: 86_400,
                keepalive_seconds: 60,
                backlog_pause_threshold: 50_000,
                backlog_check_ms: 500,
                body_read_timeout_ms: 10_000,
                runtime_dir: None,
            }
        }
    }

    #[derive(Debug, Deserialize, Serialize)]
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
        pub max_deliveries: u32,
        pub expiry_poll_ms: u64,
        pub restore_poll_ms: u64,
        pub reconcile_interval_ms: u64,
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
                max_deliveries: 5,
                expiry_poll_ms: 1000,
                restore_poll_ms: 1000,
                reconcile_interval_ms: 60_000,
            }
        }
    }

    #[derive(Debug, Deserialize, Serialize)]
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
        /// Unpaid orders are cancelled this long after their reservation.
        #[serde(default = "payment_timeout")]
        pub payment_timeout_seconds: i64,
    }

    fn one() -> i64 {
        1
    }
    fn hour() -> i64 {
        3600
    }
    fn payment_timeout() -> i64 {
        crate::sale::DEFAULT_PAYMENT_TIMEOUT_SECONDS
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
    /// Metrics, liveness and readiness; keep it off public networks.
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub shop_upstream: SocketAddr,
    pub backend_url: String,
    pub forward_timeout: Duration,
    pub static_dir: PathBuf,
    pub idempotency_ttl: Duration,
    pub keepalive: Duration,
    /// Unpersisted reservations above which a sale pauses; 0 = never.
    pub backlog_pause_threshold: u64,
    /// How often the global switch and the backlogs are read.
    pub backlog_check: Duration,
    /// Longest wait for the next piece of a request body (slow clients).
    pub body_read_timeout: Duration,
    /// Private directory of the upgrade socket and the pid file; checked
    /// (owner, not world-writable) when the gateway starts.
    pub runtime_dir: PathBuf,
}

/// Optional claims every buyer token must carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    pub audience: Option<String>,
    pub issuer: Option<String>,
}

/// The shop's upstreams and how they are checked and reached.
#[derive(Debug, Clone)]
pub struct ShopConfig {
    /// `shop.upstreams`, or `[gateway.shop_upstream]` when that is empty.
    pub upstreams: Vec<SocketAddr>,
    /// How often each upstream gets a TCP health check; an upstream that
    /// fails one gets no requests until it passes one again.
    pub health_check_interval: Duration,
    pub connect_timeout: Duration,
    /// Longest wait for the shop's next bytes; past it the client gets 504.
    pub read_timeout: Duration,
}

/// Caching of the product pages and of the sale state they poll.
#[derive(Debug, Clone)]
pub struct PagesConfig {
    /// `max-age` of HTML pages: short, so a new page is seen soon.
    pub page_max_age: Duration,
    /// `max-age` of assets whose name carries no content hash.
    pub asset_max_age: Duration,
    /// `max-age` (with `immutable`) of assets named `name.<hash>.ext`: their
    /// content never changes under that name.
    pub fingerprinted_max_age: Duration,
    /// How often `gateway.static_dir` is checked for changed files; zero
    /// turns reloading off.
    pub reload_interval: Duration,
    /// How long `GET /api/sales/{id}` is answered from the edge cache: at
    /// most one Redis read per sale per this TTL per gateway.
    pub state_ttl: Duration,
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
    /// Deliveries after which a stream entry that keeps failing moves to
    /// the sale's dead-letter stream instead of blocking the ones behind it.
    pub max_deliveries: u32,
    /// How often unpaid orders past their sale's payment timeout are looked for.
    pub expiry_poll: Duration,
    /// How often the backend checks that every sale is still in Redis.
    pub restore_poll: Duration,
    /// How often Redis counters are reconciled with the order table.
    pub reconcile_interval: Duration,
}

/// Edge limits, validated: CIDRs parsed, buckets non-zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The one header believed when the peer is a trusted proxy.
    pub client_ip_header: ClientIpHeader,
    pub max_tracked_keys: u64,
    pub idle: Duration,
    pub buy: file::RouteLimits,
    pub read: file::RouteLimits,
    /// The optional cluster-wide buy bucket, kept in Redis.
    pub cluster_global: Option<file::Bucket>,
}

/// Deny lists, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyConfig {
    pub users: std::collections::HashSet<String>,
    pub nets: Vec<ipnet::IpNet>,
}

impl DenyConfig {
    pub fn denies_ip(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
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
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
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

/// Parses an address or CIDR into a network (an address is a /32 or /128).
/// An IPv4-mapped IPv6 network (`::ffff:192.0.2.0/120`) becomes its IPv4
/// network, since client addresses are compared in their IPv4 form.
///
/// # Errors
/// The reason, for a value that is not an address or CIDR, or an IPv6
/// network shorter than /96 that holds the IPv4-mapped range
/// (`::ffff:0:0/96`): IPv4 clients are compared in IPv4 form, so it would
/// look as if it covered them and never match one.
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    let net: ipnet::IpNet = s
        .parse()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
        .ok_or_else(|| format!("`{s}` is not an IP address or CIDR"))?;
    if let ipnet::IpNet::V6(v6) = net {
        if let (Some(v4), Some(prefix)) = (v6.addr().to_ipv4_mapped(), v6.prefix_len().checked_sub(96)) {
            if let Ok(v4) = ipnet::Ipv4Net::new(v4, prefix) {
                return Ok(ipnet::IpNet::V4(v4));
            }
        }
        let mapped = ipnet::Ipv6Net::new(std::net::Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96).expect("/96 is a valid prefix");
        if v6.prefix_len() < 96 && v6.contains(&mapped) {
            return Err(format!(
                "`{s}` holds the IPv4-mapped range ::ffff:0:0/96, which never matches: IPv4 clients are compared in IPv4 form; add IPv4 entries (e.g. 0.0.0.0/0) for them"
            ));
        }
    }
    Ok(net)
}

/// Checks a secret's length ([`crate::secret::required`]); the error names
/// where it came from.
fn check_secret(name: &'static str, secret: &str) -> Result<(), String> {
    crate::secret::required(name, Some(secret)).map(drop).map_err(|e| e.to_string())
}

/// `gateway.runtime_dir` as set, else systemd's `RuntimeDirectory=` (the
/// first one), else `$XDG_RUNTIME_DIR/flashgate`, else `data/run`.
fn runtime_dir(set: Option<String>, env: &dyn Env) -> PathBuf {
    if let Some(dir) = set {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env.var(ENV_RUNTIME_DIRECTORY).and_then(|v| v.split(':').next().map(str::to_owned)).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match env.var(ENV_XDG_RUNTIME_DIR) {
        Some(dir) => Path::new(&dir).join("flashgate"),
        None => PathBuf::from(DEFAULT_RUNTIME_DIR),
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub limits: LimitsConfig,
    pub deny: DenyConfig,
    pub redis: RedisConfig,
    /// HS256 secret for buyer tokens; `None` when neither file nor env sets it.
    pub jwt_secret: Option<String>,
    /// Claims checked on buyer tokens besides `sub` and `exp`.
    pub auth: AuthConfig,
    /// Admin bearer token, from the environment only.
    pub admin_token: Option<String>,
    /// Bearer token between gateways and the backend's order API, from the
    /// environment only.
    pub internal_token: Option<String>,
    /// Bearer token of the shop's payment calls, from the environment only.
    pub shop_token: Option<String>,
    pub gateway: GatewayConfig,
    pub shop: ShopConfig,
    pub pages: PagesConfig,
    pub backend: BackendConfig,
    /// Sales declared in the file; preheated only when absent from Redis.
    pub sales: Vec<SaleSpec>,
    /// Payment timeout of each sale in [`Config::sales`], by sale id.
    pub payment_timeouts: std::collections::HashMap<String, Duration>,
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
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
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
        let gateway_admin_listen = addr("gateway.admin_listen", &f.gateway.admin_listen);
        let shop_upstream = addr("gateway.shop_upstream", &f.gateway.shop_upstream);
        let backend_listen = addr("backend.listen", &f.backend.listen);
        let admin_listen = addr("backend.admin_listen", &f.backend.admin_listen);
        let mut shop_upstreams: Vec<SocketAddr> =
            f.shop.upstreams.iter().enumerate().map(|(i, v)| addr(&format!("shop.upstreams[{i}]"), v)).collect();
        if shop_upstreams.is_empty() {
            shop_upstreams.push(shop_upstream);
        }

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
        check(f.gateway.backend_url.starts_with("http://"), "gateway.backend_url: must be an http:// URL");
        check((1..=60_000).contains(&f.gateway.forward_timeout_ms), "gateway.forward_timeout_ms: must be between 1 and 60000");
        check(
            (1..=MAX_IDEMPOTENCY_TTL_SECONDS).contains(&f.gateway.idempotency_ttl_seconds),
            "gateway.idempotency_ttl_seconds: must be between 1 and 604800 (7 days)",
        );
        check(
            f.gateway.backlog_pause_threshold <= 1_000_000_000,
            "gateway.backlog_pause_threshold: must be at most 1000000000 (0 = never)",
        );
        check(
            f.gateway.runtime_dir.as_deref().is_none_or(|d| !d.trim().is_empty()),
            "gateway.runtime_dir: must not be empty (leave it out for the default)",
        );
        check((100..=600_000).contains(&f.gateway.body_read_timeout_ms), "gateway.body_read_timeout_ms: must be between 100 and 600000");
        check((50..=60_000).contains(&f.gateway.backlog_check_ms), "gateway.backlog_check_ms: must be between 50 and 60000");
        check((1..=3600).contains(&f.gateway.keepalive_seconds), "gateway.keepalive_seconds: must be between 1 and 3600");
        check((1..=10_000).contains(&f.backend.batch_size), "backend.batch_size: must be between 1 and 10000");
        check((1..=60_000).contains(&f.backend.block_ms), "backend.block_ms: must be between 1 and 60000");
        check((100..=86_400_000).contains(&f.backend.claim_idle_ms), "backend.claim_idle_ms: must be between 100 and 86400000");
        check((10..=60_000).contains(&f.backend.sale_poll_ms), "backend.sale_poll_ms: must be between 10 and 60000");
        check(shop_upstreams.len() <= 64, "shop.upstreams: at most 64 upstreams");
        check((100..=600_000).contains(&f.shop.health_check_interval_ms), "shop.health_check_interval_ms: must be between 100 and 600000");
        check((1..=60_000).contains(&f.shop.connect_timeout_ms), "shop.connect_timeout_ms: must be between 1 and 60000");
        check((1..=3_600_000).contains(&f.shop.read_timeout_ms), "shop.read_timeout_ms: must be between 1 and 3600000");
        let max_age = 31_536_000;
        check(f.pages.page_max_age_seconds <= max_age, "pages.page_max_age_seconds: must be at most 31536000");
        check(f.pages.asset_max_age_seconds <= max_age, "pages.asset_max_age_seconds: must be at most 31536000");
        check(f.pages.fingerprinted_max_age_seconds <= max_age, "pages.fingerprinted_max_age_seconds: must be at most 31536000");
        check(f.pages.reload_interval_ms <= 3_600_000, "pages.reload_interval_ms: must be at most 3600000 (0 turns reloading off)");
        check((1..=60_000).contains(&f.pages.state_ttl_ms), "pages.state_ttl_ms: must be between 1 and 60000");
        check((1..=1000).contains(&f.backend.max_deliveries), "backend.max_deliveries: must be between 1 and 1000");
        check((10..=600_000).contains(&f.backend.expiry_poll_ms), "backend.expiry_poll_ms: must be between 10 and 600000");
        check((10..=600_000).contains(&f.backend.restore_poll_ms), "backend.restore_poll_ms: must be between 10 and 600000");
        check(
            (10..=86_400_000).contains(&f.backend.reconcile_interval_ms),
            "backend.reconcile_interval_ms: must be between 10 and 86400000",
        );

        let mut nets = |key: &str, list: &[String]| -> Vec<ipnet::IpNet> {
            list.iter()
                .enumerate()
                .filter_map(|(i, v)| parse_net(v).map_err(|why| errors.push(format!("{key}[{i}]: {why}"))).ok())
                .collect()
        };
        let trusted_proxies = nets("limits.trusted_proxies", &f.limits.trusted_proxies);
        let deny_nets = nets("deny.ips", &f.deny.ips);
        let mut buckets: Vec<(String, file::Bucket)> = Vec::new();
        for (class, route) in [("buy", &f.limits.buy), ("read", &f.limits.read)] {
            for (scope, bucket) in [("user", route.user), ("ip", route.ip), ("global", route.global)] {
                buckets.extend(bucket.map(|b| (format!("limits.{class}.{scope}"), b)));
            }
        }
        buckets.extend(f.limits.cluster_global.map(|b| ("limits.cluster_global".to_owned(), b)));
        for (key, b) in buckets {
            if !(1..=MAX_BUCKET_PER_SECOND).contains(&b.per_second) {
                errors.push(format!("{key}.per_second: must be between 1 and {MAX_BUCKET_PER_SECOND} (leave the bucket out for no limit)"));
            }
            if !(1..=MAX_BUCKET_BURST).contains(&b.burst) {
                errors.push(format!("{key}.burst: must be between 1 and {MAX_BUCKET_BURST} (leave the bucket out for no limit)"));
            }
        }
        if !(1..=100_000_000).contains(&f.limits.max_tracked_keys) {
            errors.push("limits.max_tracked_keys: must be between 1 and 100000000".into());
        }
        if !(1..=MAX_LIMITS_IDLE_SECONDS).contains(&f.limits.idle_seconds) {
            errors.push(format!("limits.idle_seconds: must be between 1 and {MAX_LIMITS_IDLE_SECONDS}"));
        }

        let jwt_secret = match env.var(ENV_JWT_SECRET) {
            Some(s) => Some((ENV_JWT_SECRET, s)),
            None => f.auth.jwt_secret.filter(|s| !s.is_empty()).map(|s| ("auth.jwt_secret", s)),
        };
        let admin_token = env.var(ENV_ADMIN_TOKEN);
        // The order API's tokens are checked where they are required, at
        // start (`secret::required`): only the process that uses one needs it.
        for (name, secret) in jwt_secret.iter().map(|(n, s)| (*n, s)).chain(admin_token.iter().map(|s| (ENV_ADMIN_TOKEN, s))) {
            if let Err(e) = check_secret(name, secret) {
                errors.push(e);
            }
        }
        for (key, claim) in [("auth.audience", &f.auth.audience), ("auth.issuer", &f.auth.issuer)] {
            if claim.as_ref().is_some_and(|c| c.is_empty() || c.len() > 256) {
                errors.push(format!("{key}: must be 1 to 256 characters (leave it out for no check)"));
            }
        }

        let mut sales = Vec::with_capacity(f.sales.len());
        let mut payment_timeouts = std::collections::HashMap::new();
        for (i, s) in f.sales.iter().enumerate() {
            match crate::sale::payment_timeout(s.payment_timeout_seconds) {
                Ok(t) => {
                    payment_timeouts.insert(s.id.clone(), t);
                }
                Err(e) => errors.push(format!("sales[{i}].{e}")),
            }
            if !(1..=MAX_SALE_DURATION_SECONDS).contains(&s.duration_seconds) {
                errors.push(format!("sales[{i}].duration_seconds: must be between 1 and {MAX_SALE_DURATION_SECONDS}"));
            }
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
                client_ip_header: f.limits.client_ip_header,
                max_tracked_keys: f.limits.max_tracked_keys,
                idle: Duration::from_secs(f.limits.idle_seconds),
                buy: f.limits.buy,
                read: f.limits.read,
                cluster_global: f.limits.cluster_global,
            },
            deny: DenyConfig { users: f.deny.users.into_iter().collect(), nets: deny_nets },
            redis: RedisConfig {
                url: f.redis.url,
                timeout: Duration::from_millis(f.redis.timeout_ms),
                breaker_failures: f.redis.breaker_failures,
                breaker_cooldown: Duration::from_millis(f.redis.breaker_cooldown_ms),
            },
            jwt_secret: jwt_secret.map(|(_, s)| s),
            auth: AuthConfig { audience: f.auth.audience, issuer: f.auth.issuer },
            admin_token,
            internal_token: env.var(ENV_INTERNAL_TOKEN),
            shop_token: env.var(ENV_SHOP_TOKEN),
            gateway: GatewayConfig {
                listen: gateway_listen,
                admin_listen: gateway_admin_listen,
                threads: f.gateway.threads,
                shop_upstream,
                backend_url: f.gateway.backend_url.trim_end_matches('/').to_owned(),
                forward_timeout: Duration::from_millis(f.gateway.forward_timeout_ms),
                static_dir: PathBuf::from(f.gateway.static_dir),
                idempotency_ttl: Duration::from_secs(f.gateway.idempotency_ttl_seconds),
                keepalive: Duration::from_secs(f.gateway.keepalive_seconds),
                backlog_pause_threshold: f.gateway.backlog_pause_threshold,
                backlog_check: Duration::from_millis(f.gateway.backlog_check_ms),
                body_read_timeout: Duration::from_millis(f.gateway.body_read_timeout_ms),
                runtime_dir: runtime_dir(f.gateway.runtime_dir, env),
            },
            shop: ShopConfig {
                upstreams: shop_upstreams,
                health_check_interval: Duration::from_millis(f.shop.health_check_interval_ms),
                connect_timeout: Duration::from_millis(f.shop.connect_timeout_ms),
                read_timeout: Duration::from_millis(f.shop.read_timeout_ms),
            },
            pages: PagesConfig {
                page_max_age: Duration::from_secs(f.pages.page_max_age_seconds),
                asset_max_age: Duration::from_secs(f.pages.asset_max_age_seconds),
                fingerprinted_max_age: Duration::from_secs(f.pages.fingerprinted_max_age_seconds),
                reload_interval: Duration::from_millis(f.pages.reload_interval_ms),
                state_ttl: Duration::from_millis(f.pages.state_ttl_ms),
            },
            backend: BackendConfig {
                listen: backend_listen,
                admin_listen,
                database_url,
                consumer_name: env.var(ENV_CONSUMER_NAME).or(f.backend.consumer_name).unwrap_or_else(default_consumer_name),
                batch_size: f.backend.batch_size,
                block: Duration::from_millis(f.backend.block_ms),
                claim_idle: Duration::from_millis(f.backend.claim_idle_ms),
                sale_poll: Duration::from_millis(f.backend.sale_poll_ms),
                max_deliveries: f.backend.max_deliveries,
                expiry_poll: Duration::from_millis(f.backend.expiry_poll_ms),
                restore_poll: Duration::from_millis(f.backend.restore_poll_ms),
                reconcile_interval: Duration::from_millis(f.backend.reconcile_interval_ms),
            },
            sales,
            payment_timeouts,
        })
    }
}

/// A consumer name unique per process on a host: `<host>-<pid>`.
fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
    format!("{}-{}", host.trim(), std::process::id())
}

fn parse_time(key: &str, value: &str) -> Result<i64, String> {
    crate::parse_rfc3339(key, value).map_err(|e| e.to_string())
}

fn sale_spec(s: &file::Sale, now_ms: i64) -> Result<SaleSpec, String> {
    let starts_at_ms = match &s.starts_at {
        Some(t) => parse_time("starts_at", t)?,
        None => now_ms,
    };
    let ends_at_ms = match &s.ends_at {
        Some(t) => parse_time("ends_at", t)?,
        None => starts_at_ms.saturating_add(s.duration_seconds.saturating_mul(1000)),
    };
    Ok(SaleSpec { id: s.id.clone(), name: s.name.clone(), stock: s.stock, per_user_limit: s.per_user_limit, starts_at_ms, ends_at_ms })
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

    /// Keys that default to unset, so serializing the defaults omits them.
    const OPTIONAL_KEYS: &[&str] = &[
        "auth.jwt_secret",
        "auth.audience",
        "auth.issuer",
        "gateway.runtime_dir",
        "backend.consumer_name",
        "limits.buy.user",
        "limits.buy.ip",
        "limits.buy.global",
        "limits.read.user",
        "limits.read.ip",
        "limits.read.global",
        "limits.cluster_global",
    ];

    #[test]
    fn the_config_reference_lists_every_key_with_its_default() {
        let doc = include_str!("../../docs/CONFIG.md");
        let rows: Vec<(String, String)> = doc
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let default = cells.get(2)?.trim_matches('`');
                (key.contains('.') && !key.starts_with("sales")).then(|| (key.to_owned(), default.to_owned()))
            })
            .collect();
        let defaults = documented_defaults();
        for (key, default) in &defaults {
            let row = rows.iter().find(|(k, _)| k == key);
            assert_eq!(
                row.map(|(_, d)| d.as_str()),
                Some(default.as_str()),
                "docs/CONFIG.md: `{key}` missing or its default is not {default}"
            );
        }
        for (key, default) in &rows {
            let known = defaults.iter().any(|(k, _)| k == key) || (OPTIONAL_KEYS.contains(&key.as_str()) && default == "(unset)");
            assert!(known, "docs/CONFIG.md lists `{key}`, which the config does not take (or an optional key not marked (unset))");
        }
        for key in OPTIONAL_KEYS {
            assert!(rows.iter().any(|(k, _)| k == key), "docs/CONFIG.md: optional `{key}` missing");
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
        let text = "[auth]\njwt_secret = \"file-secret-file-secret-file-secret\"\n";
        let env = MapEnv(&[("FLASHGATE_JWT_SECRET", ENV_SECRET), ("FLASHGATE_ADMIN_TOKEN", ADMIN_SECRET)]);
        let c = Config::from_toml_str(text, &env, 0).unwrap();
        assert_eq!(c.jwt_secret.as_deref(), Some(ENV_SECRET));
        assert_eq!(c.admin_token.as_deref(), Some(ADMIN_SECRET));
    }

    const ENV_SECRET: &str = "env-secret-env-secret-env-secret-env";
    const ADMIN_SECRET: &str = "admin-token-admin-token-admin-token";

    #[test]
    fn secrets_under_32_bytes_are_refused_naming_where_they_came_from() {
        let short = MapEnv(&[("FLASHGATE_JWT_SECRET", "replace-me"), ("FLASHGATE_ADMIN_TOKEN", "replace-me")]);
        let msg = Config::from_toml_str("", &short, 0).unwrap_err().to_string();
        assert!(msg.contains("FLASHGATE_JWT_SECRET: must be at least 32 bytes"), "{msg}");
        assert!(msg.contains("FLASHGATE_ADMIN_TOKEN: must be at least 32 bytes"), "{msg}");
        let msg = Config::from_toml_str("[auth]\njwt_secret = \"short\"\n", &NoEnv, 0).unwrap_err().to_string();
        assert!(msg.contains("auth.jwt_secret: must be at least 32 bytes"), "{msg}");
        let exactly = "x".repeat(MIN_SECRET_BYTES);
        let c = Config::from_toml_str(&format!("[auth]\njwt_secret = \"{exactly}\"\n"), &NoEnv, 0).unwrap();
        assert_eq!(c.jwt_secret.as_deref(), Some(exactly.as_str()));
    }

    #[test]
    fn every_numeric_key_is_bounded_and_named() {
        let cases = [
            ("[gateway]\nidempotency_ttl_seconds = 604801\n", "gateway.idempotency_ttl_seconds"),
            ("[gateway]\nidempotency_ttl_seconds = 18446744073709551615\n", "gateway.idempotency_ttl_seconds"),
            ("[gateway]\nbacklog_pause_threshold = 1000000001\n", "gateway.backlog_pause_threshold"),
            ("[gateway]\nruntime_dir = \"\"\n", "gateway.runtime_dir"),
            ("[limits]\nidle_seconds = 86401\n", "limits.idle_seconds"),
            ("[limits]\nidle_seconds = 31536000000\n", "limits.idle_seconds"),
            ("[limits]\nmax_tracked_keys = 100000001\n", "limits.max_tracked_keys"),
            ("[limits.buy]\nuser = { per_second = 1000001, burst = 1 }\n", "limits.buy.user.per_second"),
            ("[limits.read]\nglobal = { per_second = 1, burst = 10000001 }\n", "limits.read.global.burst"),
            ("[limits]\ncluster_global = { per_second = 4294967295, burst = 1 }\n", "limits.cluster_global.per_second"),
            ("[backend]\nclaim_idle_ms = 86400001\n", "backend.claim_idle_ms"),
            ("[auth]\naudience = \"\"\n", "auth.audience"),
            ("[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 1\nduration_seconds = 31536001\n", "sales[0].duration_seconds"),
        ];
        for (text, key) in cases {
            let msg = Config::from_toml_str(text, &NoEnv, 0).unwrap_err().to_string();
            assert!(msg.contains(key), "{key} missing from {msg}");
        }
        let top = "[gateway]\nidempotency_ttl_seconds = 604800\n[limits]\nidle_seconds = 86400\n";
        let c = Config::from_toml_str(top, &NoEnv, 0).unwrap();
        assert_eq!((c.gateway.idempotency_ttl.as_secs(), c.limits.idle.as_secs()), (604_800, 86_400));
    }

    #[test]
    fn the_client_ip_header_is_one_setting_x_forwarded_for_by_default() {
        assert_eq!(Config::from_toml_str("", &NoEnv, 0).unwrap().limits.client_ip_header, ClientIpHeader::XForwardedFor);
        let c = Config::from_toml_str("[limits]\nclient_ip_header = \"forwarded\"\n", &NoEnv, 0).unwrap();
        assert_eq!(c.limits.client_ip_header, ClientIpHeader::Forwarded);
        let msg = Config::from_toml_str("[limits]\nclient_ip_header = \"x-real-ip\"\n", &NoEnv, 0).unwrap_err().to_string();
        assert!(msg.contains("client_ip_header"), "{msg}");
    }

    #[test]
    fn an_ipv6_entry_that_would_hold_ipv4_clients_is_refused_naming_the_key() {
        for (key, section) in [("deny.ips", "[deny]\nips"), ("limits.trusted_proxies", "[limits]\ntrusted_proxies")] {
            for net in ["::/0", "::ffff:0:0/80", "::ffff:0:0/95"] {
                let text = format!("{section} = [\"2001:db8::/32\", \"{net}\"]\n");
                let msg = Config::from_toml_str(&text, &NoEnv, 0).unwrap_err().to_string();
                assert!(msg.contains(&format!("{key}[1]")) && msg.contains("IPv4"), "{msg}");
            }
        }
        // Narrower IPv6 networks, and the mapped range itself, are fine.
        let c = Config::from_toml_str("[deny]\nips = [\"2001:db8::/32\", \"::ffff:0:0/96\", \"64:ff9b::/96\"]\n", &NoEnv, 0).unwrap();
        assert!(c.deny.denies_ip("203.0.113.1".parse().unwrap()));
        assert!(c.deny.denies_ip("2001:db8::1".parse().unwrap()));
    }

    #[test]
    fn ipv4_mapped_addresses_match_ipv4_deny_entries_and_back() {
        let c = Config::from_toml_str("[deny]\nips = [\"192.0.2.0/24\", \"::ffff:198.51.100.0/120\"]\n", &NoEnv, 0).unwrap();
        assert!(c.deny.denies_ip("::ffff:192.0.2.9".parse().unwrap()));
        assert!(c.deny.denies_ip("198.51.100.9".parse().unwrap()));
        assert!(!c.deny.denies_ip("::ffff:203.0.113.1".parse().unwrap()));
    }

    #[test]
    fn the_runtime_dir_comes_from_the_setting_then_systemd_then_xdg() {
        let dir = |text: &str, env: &dyn Env| Config::from_toml_str(text, env, 0).unwrap().gateway.runtime_dir;
        let systemd = MapEnv(&[("RUNTIME_DIRECTORY", "/run/flashgate:/run/other"), ("XDG_RUNTIME_DIR", "/run/user/1000")]);
        assert_eq!(dir("[gateway]\nruntime_dir = \"/srv/fg/run\"\n", &systemd), PathBuf::from("/srv/fg/run"));
        assert_eq!(dir("", &systemd), PathBuf::from("/run/flashgate"));
        assert_eq!(dir("", &MapEnv(&[("XDG_RUNTIME_DIR", "/run/user/1000")])), PathBuf::from("/run/user/1000/flashgate"));
        assert_eq!(dir("", &NoEnv), PathBuf::from("data/run"));
    }

    #[test]
    fn audience_and_issuer_are_optional_claims() {
        let c = Config::from_toml_str("", &NoEnv, 0).unwrap();
        assert_eq!(c.auth, AuthConfig::default());
        let c = Config::from_toml_str("[auth]\naudience = \"shop\"\nissuer = \"https://shop.example\"\n", &NoEnv, 0).unwrap();
        assert_eq!(c.auth.audience.as_deref(), Some("shop"));
        assert_eq!(c.auth.issuer.as_deref(), Some("https://shop.example"));
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
    fn shop_upstreams_and_page_caching_default_and_are_checked() {
        let c = Config::from_toml_str("[gateway]\nshop_upstream = \"127.0.0.1:8000\"\n", &NoEnv, 0).unwrap();
        assert_eq!(c.shop.upstreams, vec!["127.0.0.1:8000".parse::<SocketAddr>().unwrap()]);
        assert_eq!(c.pages.state_ttl, Duration::from_millis(250));
        assert_eq!(c.pages.fingerprinted_max_age, Duration::from_secs(31_536_000));
        let text = "[shop]\nupstreams = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n[pages]\nstate_ttl_ms = 100\n";
        let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
        assert_eq!(c.shop.upstreams.len(), 2);
        assert_eq!(c.pages.state_ttl, Duration::from_millis(100));
        let bad = "[shop]\nupstreams = [\"nope\"]\nconnect_timeout_ms = 0\n[pages]\nstate_ttl_ms = 0\npage_max_age_seconds = 99999999\n";
        let msg = Config::from_toml_str(bad, &NoEnv, 0).unwrap_err().to_string();
        for key in ["shop.upstreams[0]", "shop.connect_timeout_ms", "pages.state_ttl_ms", "pages.page_max_age_seconds"] {
            assert!(msg.contains(key), "{key} missing from {msg}");
        }
    }

    #[test]
    fn sale_window_defaults_to_now_plus_duration() {
        let text = "[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\nduration_seconds = 10\n";
        let c = Config::from_toml_str(text, &NoEnv, 1000).unwrap();
        assert_eq!((c.sales[0].starts_at_ms, c.sales[0].ends_at_ms), (1000, 11_000));
        assert_eq!(c.sales[0].per_user_limit, 1);
    }

    #[test]
    fn payment_timeout_and_recovery_keys_default_and_are_checked() {
        let text = "[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\n[[sales]]\nid = \"t\"\nname = \"y\"\nstock = 5\npayment_timeout_seconds = 30\n";
        let c = Config::from_toml_str(text, &NoEnv, 0).unwrap();
        assert_eq!(c.payment_timeouts["s"], Duration::from_secs(900));
        assert_eq!(c.payment_timeouts["t"], Duration::from_secs(30));
        assert_eq!(c.backend.max_deliveries, 5);
        assert_eq!(c.backend.reconcile_interval, Duration::from_secs(60));
        let bad = "[backend]\nmax_deliveries = 0\nexpiry_poll_ms = 0\nrestore_poll_ms = 0\nreconcile_interval_ms = 0\n[[sales]]\nid = \"s\"\nname = \"x\"\nstock = 5\npayment_timeout_seconds = 0\n";
        let msg = Config::from_toml_str(bad, &NoEnv, 0).unwrap_err().to_string();
        for key in [
            "backend.max_deliveries",
            "backend.expiry_poll_ms",
            "backend.restore_poll_ms",
            "backend.reconcile_interval_ms",
            "sales[0].payment_timeout_seconds",
        ] {
            assert!(msg.contains(key), "{key} missing from {msg}");
        }
    }
}
