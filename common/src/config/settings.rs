//! The validated settings: what the processes run on, in domain types
//! (addresses, durations, parsed networks, non-zero buckets). Nothing here
//! is deserialized: [`super::file`] is the file's shape, and
//! `validate` is the only way from one to the other.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use super::cache_rules::CacheRule;
use super::env::ENV_CHALLENGE_SECRET;
use super::file::{ChallengeMode, ClientIpHeader, JwtAlgorithm};
use super::origin::Origin;
use crate::sale::SaleSpec;

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
    /// The proof-of-work a buy must carry; off by default.
    pub challenge: ChallengeConfig,
    /// HMAC key that signs challenges, from the environment only; checked
    /// for length when set, required by the gateway when challenges are on.
    pub challenge_secret: Option<String>,
    /// HS256 key of checkout hand-off tokens, from the environment only;
    /// checked for length when set, required when a declared sale's
    /// `checkout_url` has `{handoff}`.
    pub handoff_secret: Option<String>,
    /// HS256 key of waiting-room cookies, from the environment only;
    /// required when a room is configured.
    pub waiting_room_secret: Option<String>,
    /// The opening draw; off by default.
    pub fairness: FairnessConfig,
    pub backend: BackendConfig,
    /// Order events to the shop; off unless a destination is set.
    pub events: super::events::EventsConfig,
    /// Sales declared in the file; preheated only when absent from Redis.
    pub sales: Vec<SaleSpec>,
    /// Payment timeout of each sale in [`Config::sales`], by sale id.
    pub payment_timeouts: HashMap<String, Duration>,
}

impl Config {
    /// The challenge signing secret the gateway needs: `None` when
    /// challenges are off, else `FLASHGATE_CHALLENGE_SECRET` (at least
    /// [`crate::secret::MIN_SECRET_BYTES`]).
    ///
    /// # Errors
    /// When challenges are on and the secret is missing or too short.
    pub fn required_challenge_secret(&self) -> Result<Option<&str>, crate::secret::SecretError> {
        match self.challenge.mode {
            ChallengeMode::Off => Ok(None),
            ChallengeMode::Always | ChallengeMode::Adaptive => {
                crate::secret::required(ENV_CHALLENGE_SECRET, self.challenge_secret.as_deref())
                    .map(Some)
            }
        }
    }
}

/// The proof-of-work challenge of buys (`[challenge]`), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeConfig {
    pub mode: ChallengeMode,
    /// The difficulty everyone pays (`always`), or the floor (`adaptive`).
    pub difficulty_bits: u8,
    /// The ceiling of the adaptive difficulty; at least `difficulty_bits`.
    pub max_difficulty_bits: u8,
    /// Lifetime of an issued challenge: long enough to be fetched while a
    /// countdown runs, short enough that hoarding them does not pay.
    pub ttl: Duration,
    /// Adaptive thresholds: the rate of one user, one IP (per minute) and
    /// one sale (per second) up to which the base difficulty applies.
    pub user_rate_per_minute: u32,
    pub ip_rate_per_minute: u32,
    pub sale_rate_per_second: u32,
}

/// The opening draw (`[fairness]`), validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FairnessConfig {
    /// The draw window of a sale without a `draw_window_ms` of its own,
    /// ms; 0 = no draw.
    pub window_ms: u64,
    /// The most an entrant's request is held after the window closes.
    pub settle: Duration,
}

/// Which Redis deployment the processes talk to (`redis.mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis (`redis.url`).
    Standalone { url: String },
    /// A Redis Cluster, found from its seed nodes (`redis.nodes`).
    Cluster { nodes: Vec<String> },
    /// The primary that the sentinels (`redis.sentinels`) know as
    /// `redis.master_name`, followed across failovers.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

impl RedisTarget {
    /// The `[redis]` keys that select this target, as TOML lines (for
    /// tools that write a config: the bench, the test harness).
    pub fn to_toml(&self) -> String {
        let list = |urls: &[String]| {
            urls.iter()
                .map(|u| format!("{u:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Self::Standalone { url } => format!("url = {url:?}"),
            Self::Cluster { nodes } => format!("mode = \"cluster\"\nnodes = [{}]", list(nodes)),
            Self::Sentinel {
                sentinels,
                master_name,
            } => {
                format!(
                    "mode = \"sentinel\"\nsentinels = [{}]\nmaster_name = {master_name:?}",
                    list(sentinels)
                )
            }
        }
    }

    /// The mode's name as written in the file.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Standalone { .. } => "standalone",
            Self::Cluster { .. } => "cluster",
            Self::Sentinel { .. } => "sentinel",
        }
    }
}

/// Redis connection settings.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub target: RedisTarget,
    /// Upper bound for one Redis call; past it a buyer gets 503.
    pub timeout: Duration,
    /// Consecutive failures that open the gateway's circuit breaker.
    pub breaker_failures: u32,
    /// How long an open breaker answers 503 before probing Redis again.
    pub breaker_cooldown: Duration,
    /// Replicas that must hold a win before its buyer is answered; 0 = no
    /// `WAIT` (the master alone holds a win when it is answered).
    pub wait_replicas: u32,
    /// How long a win waits for `wait_replicas` before its buyer gets 503.
    pub wait_timeout: Duration,
    /// CA certificates (PEM) trusted besides the system's roots for the
    /// `rediss://` servers of any mode (standalone, cluster nodes,
    /// sentinels and the primary they name); read when a connection is
    /// made, and checked at start by [`crate::redis_conn::check_ca_file`]
    /// (parsing the config reads no file).
    pub ca_file: Option<PathBuf>,
}

impl RedisConfig {
    /// Standalone settings for `url` with the default timeouts (tests, tools).
    pub fn standalone(url: impl Into<String>) -> Self {
        Self {
            target: RedisTarget::Standalone { url: url.into() },
            timeout: Duration::from_millis(250),
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(1),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(500),
            ca_file: None,
        }
    }

    /// The longest a call on the shared connection may take. With
    /// `wait_replicas` set, a call can queue behind a `WAIT` on that
    /// connection (Redis answers one client's commands in order), so it may
    /// take up to `wait_timeout` longer than `timeout`.
    pub fn call_timeout(&self) -> Duration {
        if self.wait_replicas > 0 {
            self.timeout + self.wait_timeout
        } else {
            self.timeout
        }
    }
}

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    /// Metrics, liveness and readiness; keep it off public networks.
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub backend_url: String,
    pub forward_timeout: Duration,
    pub static_dir: PathBuf,
    /// `gateway.path_prefix`: `/segment[/segment…]`, no trailing slash.
    pub path_prefix: String,
    /// `gateway.sale_page_path`: the path before `{id}`, e.g. `/drops/`.
    pub sale_page_path: Option<String>,
    pub idempotency_ttl: Duration,
    pub keepalive: Duration,
    /// Unpersisted reservations above which a sale pauses; 0 = never.
    pub backlog_pause_threshold: u64,
    /// How often the global switch and the backlogs are read.
    pub backlog_check: Duration,
    /// Longest wait for the next piece of a request body (slow clients).
    pub body_read_timeout: Duration,
    /// Lifetime of a checkout hand-off token.
    pub handoff_ttl: Duration,
    /// Private directory of the upgrade socket and the pid file; checked
    /// (owner, not world-writable) when the gateway starts.
    pub runtime_dir: PathBuf,
    /// The HTTPS listener; `None` when `gateway.tls.cert_file` is unset.
    pub tls: Option<TlsConfig>,
}

/// `[gateway.tls]`, validated. The files are only named here: the gateway
/// reads them at start (and `flashgate check`), naming the key of a bad one.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub listen: SocketAddr,
    /// `gateway.tls.cert_file` / `key_file`: for clients without SNI or
    /// with a name no other certificate covers.
    pub default: TlsFiles,
    /// `gateway.tls.certificates`, chosen by the SAN names of each.
    pub certificates: Vec<TlsFiles>,
    pub redirect_http: bool,
    /// `gateway.tls.redirect_port`, else the port of `listen`.
    pub redirect_port: u16,
    pub reload_interval: Duration,
}

/// A certificate chain and its key, with the config keys that name them
/// (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `gateway.tls` or `gateway.tls.certificates[i]`.
    pub key_path: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// How buyer tokens are checked: the claims they must carry, the
/// algorithms accepted, where the public keys come from, and the sign-in
/// cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    pub audience: Option<String>,
    pub issuer: Option<String>,
    /// Never empty; HS256 alone by default.
    pub algorithms: Vec<JwtAlgorithm>,
    /// Set whenever an asymmetric algorithm is allowed.
    pub jwks: Option<JwksConfig>,
    /// The name of the sign-in cookie that may carry the token.
    pub cookie: Option<String>,
    /// The sale page's origin (`scheme://host[:port]`), for the CSRF check
    /// of cookie-signed buys; `None`: the request's own host.
    pub public_origin: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            audience: None,
            issuer: None,
            algorithms: vec![JwtAlgorithm::HS256],
            jwks: None,
            cookie: None,
            public_origin: None,
        }
    }
}

/// Where the identity provider's public keys (a JWKS) come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// `auth.jwks_url`: an `http://` or `https://` URL.
    Url(String),
    /// `auth.jwks_file`.
    File(PathBuf),
}

/// The JWKS and how it is kept fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksConfig {
    pub source: JwksSource,
    /// Least time between fetches caused by an unknown `kid`.
    pub refetch_interval: Duration,
    /// Longest wait for the URL's answer.
    pub timeout: Duration,
    /// Time between periodic refreshes.
    pub refresh: Duration,
}

/// The shop's upstreams and how they are checked and reached.
#[derive(Debug, Clone)]
pub struct ShopConfig {
    /// `shop.upstreams`, or `[gateway.shop_upstream]` when that is empty.
    pub upstreams: Vec<Origin>,
    /// How often the names among them are resolved again.
    pub resolve_interval: Duration,
    /// `shop.ca_file`: trusted for `https://` upstreams besides the system's
    /// roots; read when the gateway starts.
    pub ca_file: Option<PathBuf>,
    /// The `Host` the shop receives.
    pub host_header: HostHeader,
    /// `shop.health_check_path`: HTTP health checks of this path; `None`
    /// for TCP checks.
    pub health_check_path: Option<String>,
    /// How often each upstream gets a TCP health check; an upstream that
    /// fails one gets no requests until it passes one again.
    pub health_check_interval: Duration,
    pub connect_timeout: Duration,
    /// Longest wait for the shop's next bytes; past it the client gets 504.
    pub read_timeout: Duration,
    /// HTTP/2 to the shop, prior knowledge (h2c).
    pub h2: bool,
    /// The edge cache of the shop's responses.
    pub cache: ShopCacheConfig,
    /// `[shop.compression]`; `None` while `shop.compression.enabled` is false.
    pub compression: Option<CompressionLevels>,
    /// `[[shop.waiting_rooms]]`, in order: a path guarded by two is the first's.
    pub waiting_rooms: Vec<super::waiting_rooms::WaitingRoomConfig>,
}

/// `[shop.compression]`, validated: the level of each encoding (0: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionLevels {
    pub gzip: u32,
    pub brotli: u32,
    pub zstd: u32,
}

/// `shop.host_header`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostHeader {
    /// The client's `Host` (the origin's name when the client sent none).
    Client,
    /// This name, whatever the client asked for (`host` or `host:port`).
    Fixed(String),
}

/// `[shop.cache]`, validated: sizes in bytes, windows as durations.
#[derive(Debug, Clone)]
pub struct ShopCacheConfig {
    pub enabled: bool,
    /// Bound of the bytes held (headers and bodies); LRU eviction past it.
    pub max_bytes: usize,
    /// Larger responses are not stored (at most `max_bytes`).
    pub max_object_bytes: usize,
    /// Stale-if-error window when the shop's `Cache-Control` names none.
    pub stale_if_error: Duration,
    /// How long concurrent misses of one page wait for its single fetch.
    pub lock_timeout: Duration,
    /// The response header that tags a page (lower case, a valid name).
    pub tag_header: String,
    /// Whether clients see the tag header.
    pub forward_tag_header: bool,
    /// `[[shop.cache.rules]]`, in order: the first that matches applies.
    pub rules: Vec<CacheRule>,
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
    /// How long `GET /flashgate/api/sales/{id}` is answered from the edge cache: at
    /// most one Redis read per sale per this TTL per gateway.
    pub state_ttl: Duration,
}

/// Backend settings.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub database_url: String,
    /// The stream consumer name, from `FLASHGATE_CONSUMER_NAME` or the
    /// file; `None` leaves it to the backend's start (`<host>-<pid>`).
    pub consumer_name: Option<String>,
    pub batch_size: usize,
    pub block: Duration,
    pub claim_idle: Duration,
    /// How old a stream entry must be before the consumer writes its
    /// order: the gateway's forward normally commits it well within this,
    /// so each order is written once, by the forward; the consumer writes
    /// only what the forward missed. Zero: at once.
    pub forward_grace: Duration,
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

/// A token bucket: `per_second` sustained, up to `burst` at once. Both are
/// non-zero, as the limiters need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

impl Bucket {
    /// A bucket, or `None` when either number is zero.
    pub fn new(per_second: u32, burst: u32) -> Option<Self> {
        Some(Self {
            per_second: NonZeroU32::new(per_second)?,
            burst: NonZeroU32::new(burst)?,
        })
    }
}

/// The buckets of one route class; an absent bucket is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteLimits {
    pub user: Option<Bucket>,
    pub ip: Option<Bucket>,
    pub global: Option<Bucket>,
}

/// Edge limits, validated: CIDRs parsed, buckets non-zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The one header believed when the peer is a trusted proxy.
    pub client_ip_header: ClientIpHeader,
    pub max_tracked_keys: u64,
    pub idle: Duration,
    pub buy: RouteLimits,
    pub read: RouteLimits,
    /// The optional cluster-wide buy bucket, kept in Redis.
    pub cluster_global: Option<Bucket>,
}

/// Deny lists, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyConfig {
    pub users: HashSet<String>,
    pub nets: Vec<ipnet::IpNet>,
}

impl DenyConfig {
    pub fn denies_ip(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }
}
