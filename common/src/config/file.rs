//! The serde shape of the TOML file, and the default of every key.
//!
//! Every table rejects unknown keys (`deny_unknown_fields`): a misspelled
//! limit would otherwise silently turn protection off. The defaults live
//! here, in the `Default` impls, and nowhere else: `docs/CONFIG.md` lists
//! them (see [`super::documented_defaults`]). Values are taken as written;
//! `validate` checks them and builds the typed settings.

use serde::{Deserialize, Serialize};

/// Which header names the client when the peer is a trusted proxy.
///
/// Only one is ever read: common proxies append to `X-Forwarded-For` but
/// pass a client's own `Forwarded` through unchanged, so believing both
/// would let a client choose its address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum ClientIpHeader {
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    #[serde(rename = "forwarded")]
    Forwarded,
}

/// The whole file; every table may be left out.
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
    pub challenge: Challenge,
    /// Order events to the shop (`super::events`).
    pub events: super::events::Events,
    pub fairness: Fairness,
    pub sales: Vec<Sale>,
}

/// `[fairness]`: the random draw among the buys of a sale's opening (see
/// `common/src/draw.rs`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Fairness {
    /// Buys arriving within this many ms after a sale starts enter one
    /// draw instead of first come, first served; 0 = off. A sale's own
    /// `draw_window_ms` overrides it.
    pub window_ms: i64,
    /// How long after the window closes a gateway holds an entrant's
    /// request for its outcome; past it the buyer gets 503 and a retry with
    /// the same Idempotency-Key answers the outcome.
    pub settle_ms: u64,
}

impl Default for Fairness {
    fn default() -> Self {
        Self {
            window_ms: 0,
            settle_ms: 5000,
        }
    }
}

/// When a buy must carry a proof-of-work solution (`challenge.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChallengeMode {
    /// No challenge: buys are admitted as before.
    #[default]
    Off,
    /// Every buy solves a challenge of `difficulty_bits`.
    Always,
    /// Every buy solves a challenge whose difficulty rises with the request
    /// rate of its user, its IP and its sale.
    Adaptive,
}

impl ChallengeMode {
    /// The mode as written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeMode::Off => "off",
            ChallengeMode::Always => "always",
            ChallengeMode::Adaptive => "adaptive",
        }
    }
}

/// `[challenge]`: the proof-of-work a buy must carry (see
/// `gateway/src/admission/challenge/`). The signing secret comes from the
/// environment only (`FLASHGATE_CHALLENGE_SECRET`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Challenge {
    pub mode: ChallengeMode,
    /// Leading zero bits of SHA-256 a solution needs when nothing is hot.
    pub difficulty_bits: u32,
    /// The most the adaptive mode ever asks.
    pub max_difficulty_bits: u32,
    /// How long a challenge may be solved and used after it is issued.
    pub ttl_seconds: u64,
    /// Adaptive: one user's requests per minute that still get the base
    /// difficulty; each doubling above adds a bit.
    pub user_rate_per_minute: u32,
    /// Adaptive: the same for one client IP (IPv6 by /64).
    pub ip_rate_per_minute: u32,
    /// Adaptive: the same for all buyers of one sale, per second.
    pub sale_rate_per_second: u32,
}

impl Default for Challenge {
    fn default() -> Self {
        Self {
            mode: ChallengeMode::Off,
            difficulty_bits: 14,
            max_difficulty_bits: 24,
            ttl_seconds: 300,
            user_rate_per_minute: 6,
            ip_rate_per_minute: 60,
            sale_rate_per_second: 2000,
        }
    }
}

/// The shop behind the gateway.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shop {
    /// `host:port`, `http://host[:port]` or `https://host[:port]`; when
    /// non-empty, replaces `gateway.shop_upstream`.
    pub upstreams: Vec<String>,
    /// How often the names in `upstreams` are resolved again.
    pub resolve_interval_ms: u64,
    /// CA certificates trusted for `https://` upstreams besides the system's.
    pub ca_file: Option<String>,
    /// `"client"` (the client's `Host`) or the fixed name the shop expects.
    pub host_header: String,
    /// An HTTP `GET` of this path checks each upstream (2xx/3xx healthy);
    /// unset, a TCP connect does.
    pub health_check_path: Option<String>,
    pub health_check_interval_ms: u64,
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    /// Speak HTTP/2 to the shop: h2c with prior knowledge to `http://`
    /// origins, by ALPN to `https://` ones.
    pub h2: bool,
    /// `[shop.cache]`: the edge cache of the shop's responses.
    pub cache: ShopCache,
    /// `[shop.compression]`: what the shop sends uncompressed, compressed here.
    pub compression: ShopCompression,
    /// `[[shop.waiting_rooms]]`: bounded admission to the shop's own pages.
    pub waiting_rooms: Vec<WaitingRoom>,
}

impl Default for Shop {
    fn default() -> Self {
        Self {
            upstreams: Vec::new(),
            resolve_interval_ms: 5000,
            ca_file: None,
            host_header: "client".into(),
            health_check_path: None,
            health_check_interval_ms: 1000,
            connect_timeout_ms: 2000,
            read_timeout_ms: 30_000,
            h2: false,
            cache: ShopCache::default(),
            compression: ShopCompression::default(),
            waiting_rooms: Vec::new(),
        }
    }
}

/// One `[[shop.waiting_rooms]]` table (see `config/waiting_rooms.rs` and
/// docs/SHOP.md, "A waiting room in front of the shop").
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WaitingRoom {
    /// Names the room in its cookie, its Redis keys, metrics and the admin API.
    pub name: String,
    /// Shop paths it guards: prefixes, or globs of the whole path with `*`.
    pub paths: Vec<String>,
    /// Visitors inside at once.
    pub active_users: u32,
    /// Visitors let in per minute at most (0: only `active_users` bounds it).
    pub new_users_per_minute: u32,
    /// How long an admitted visitor stays inside after their last request.
    pub session_seconds: u64,
    /// `"fifo"`, or `"random"`: arrivals before `starts_at` (and within
    /// `random_window_seconds` after it) get a random place.
    pub queueing: String,
    pub random_window_seconds: u64,
    /// RFC 3339: admission begins; before it, visitors wait in a pre-queue.
    pub starts_at: Option<String>,
    /// RFC 3339: the room lets everyone through from then on.
    pub ends_at: Option<String>,
    /// `"queue"`, `"passthrough"` or `"reject"`; the admin API switches it live.
    pub mode: String,
    /// How often the queue page asks again (its `Retry-After`).
    pub refresh_seconds: u64,
    /// An HTML file replacing the built-in queue page (placeholders in docs/SHOP.md).
    pub template: Option<String>,
    /// A place is given only for a solved proof of work (`[challenge]`'s difficulty).
    pub challenge: bool,
}

impl Default for WaitingRoom {
    fn default() -> Self {
        Self {
            name: String::new(),
            paths: Vec::new(),
            active_users: 0,
            new_users_per_minute: 0,
            session_seconds: 300,
            queueing: "fifo".into(),
            random_window_seconds: 0,
            starts_at: None,
            ends_at: None,
            mode: "queue".into(),
            refresh_seconds: 10,
            template: None,
            challenge: false,
        }
    }
}

/// `[shop.compression]`: text responses the shop sends uncompressed are
/// compressed for clients that accept it, before the edge cache stores them
/// (so each encoding is compressed once per cached copy).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShopCompression {
    /// Off unless asked for: the shop's bytes pass as they are.
    pub enabled: bool,
    /// Level of each encoding; 0 turns that one off.
    pub gzip_level: u32,
    pub brotli_level: u32,
    pub zstd_level: u32,
}

impl Default for ShopCompression {
    fn default() -> Self {
        Self {
            enabled: false,
            gzip_level: 6,
            brotli_level: 5,
            zstd_level: 3,
        }
    }
}

/// `[shop.cache]`: the shop's cacheable `GET`/`HEAD` responses, kept in the
/// gateway's memory (pingora-cache; see `gateway/src/edge/shop_cache/`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShopCache {
    /// Off unless asked for: a shop that sends `max-age` on a personal page
    /// without `private` would otherwise have it shared.
    pub enabled: bool,
    /// Bytes of responses (headers and bodies) held; the least recently used
    /// are evicted past it.
    pub max_bytes: u64,
    /// Larger responses are passed through, not stored.
    pub max_object_bytes: u64,
    /// How long a stale response may still answer while the shop fails, when
    /// the shop's `Cache-Control` names no `stale-if-error` (0 = not at all).
    pub stale_if_error_seconds: u64,
    /// How long requests for a page being fetched wait for that one fetch
    /// before going to the shop themselves; at least `shop.read_timeout_ms`,
    /// so a slow shop does not release the crowd.
    pub lock_timeout_ms: u64,
    /// The response header by which the shop tags a page for purges by
    /// tag (`Surrogate-Key`, or `Cache-Tag`); tags are separated by spaces
    /// or commas.
    pub tag_header: String,
    /// Whether clients see the tag header; off, as CDNs do: the tags name
    /// the shop's internals.
    pub forward_tag_header: bool,
    /// `[[shop.cache.rules]]`: what makes pages cacheable that the shop's
    /// own headers leave personal or without a lifetime; first match wins.
    pub rules: Vec<ShopCacheRule>,
}

/// One `[[shop.cache.rules]]` table (see `config/cache_rules.rs`).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShopCacheRule {
    /// A path prefix (`/static/`), or a glob of the whole path when it holds
    /// `*` (`/products/*/reviews`; `*` stays within one segment).
    pub path: String,
    /// Unset: `GET` and `HEAD`.
    pub methods: Option<Vec<String>>,
    /// Statuses `ttl_seconds` applies to; unset: `200`.
    pub statuses: Option<Vec<u16>>,
    /// Lifetime of a response that carries none (no `max-age`, `s-maxage`,
    /// `Expires`): shops built on PHP or Django send none on most pages.
    pub ttl_seconds: Option<u64>,
    /// Cookie names (a trailing `*` matches a prefix) that do not make a
    /// request personal: analytics and consent cookies.
    pub ignore_cookies: Vec<String>,
    /// Cookie names whose values pick the variant of a page (currency,
    /// store view), so a request carrying them is still cacheable.
    pub key_cookies: Vec<String>,
    /// Never cached: neither looked up nor stored.
    pub bypass: bool,
    /// Windows for matching responses whose `Cache-Control` names none.
    pub stale_if_error_seconds: Option<u64>,
    pub stale_while_revalidate_seconds: Option<u64>,
}

impl Default for ShopCache {
    fn default() -> Self {
        Self {
            enabled: false,
            max_bytes: 128 * 1024 * 1024,
            max_object_bytes: 8 * 1024 * 1024,
            stale_if_error_seconds: 60,
            lock_timeout_ms: 30_000,
            tag_header: "Surrogate-Key".into(),
            forward_tag_header: false,
            rules: Vec::new(),
        }
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

/// A token bucket: `per_second` sustained, up to `burst` at once (both
/// non-zero once validated).
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

/// `[limits]`: the edge's token buckets and whose address they key on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub trusted_proxies: Vec<String>,
    /// The header believed from a trusted proxy.
    pub client_ip_header: ClientIpHeader,
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
            client_ip_header: ClientIpHeader::default(),
            max_tracked_keys: 100_000,
            idle_seconds: 120,
            buy: RouteLimits::default(),
            read: RouteLimits::default(),
            cluster_global: None,
        }
    }
}

/// `[deny]`: users and addresses refused with 403.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Deny {
    pub users: Vec<String>,
    /// Addresses or CIDRs.
    pub ips: Vec<String>,
}

/// How the processes reach Redis: `mode = "standalone" | "cluster" |
/// "sentinel"`; the keys of the other modes are refused, so a half-edited
/// table is caught at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One Redis at `url`.
    #[default]
    Standalone,
    /// A Redis Cluster found from the seed `nodes`.
    Cluster,
    /// The primary the `sentinels` know as `master_name`.
    Sentinel,
}

/// `[redis]`: where stock, buyers and streams live.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Redis {
    pub mode: RedisMode,
    /// Standalone only.
    pub url: String,
    /// Cluster seed nodes (`redis://host:port`); any reachable one finds
    /// the others.
    pub nodes: Vec<String>,
    /// Sentinel addresses (`redis://host:port`).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub master_name: Option<String>,
    pub timeout_ms: u64,
    pub breaker_failures: u32,
    pub breaker_cooldown_ms: u64,
    /// Replicas that must acknowledge a win before its buyer is answered
    /// (Redis `WAIT`); 0 = answer as soon as the master has it.
    pub wait_replicas: u32,
    /// How long a win waits for those replicas before its buyer gets 503.
    pub wait_timeout_ms: u64,
    /// PEM file of CA certificates trusted, besides the system's roots, for
    /// a `rediss://` server's certificate: a Redis behind a private CA.
    pub ca_file: Option<String>,
}

/// The default of `redis.url`; another value in cluster or sentinel mode
/// is refused (it would be ignored).
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

impl Default for Redis {
    fn default() -> Self {
        Self {
            mode: RedisMode::Standalone,
            url: DEFAULT_REDIS_URL.into(),
            nodes: Vec::new(),
            sentinels: Vec::new(),
            master_name: None,
            timeout_ms: 250,
            breaker_failures: 5,
            breaker_cooldown_ms: 1000,
            wait_replicas: 0,
            wait_timeout_ms: 500,
            ca_file: None,
        }
    }
}

/// A signature algorithm of buyer tokens (`auth.algorithms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
pub enum JwtAlgorithm {
    /// HMAC with the shared secret (`FLASHGATE_JWT_SECRET`).
    HS256,
    /// RSA PKCS#1 v1.5 with SHA-256, a key of the JWKS.
    RS256,
    /// ECDSA on P-256 with SHA-256, a key of the JWKS.
    ES256,
    /// Ed25519, a key of the JWKS.
    EdDSA,
}

impl JwtAlgorithm {
    /// The name a token's `alg` header carries.
    pub fn as_str(self) -> &'static str {
        match self {
            JwtAlgorithm::HS256 => "HS256",
            JwtAlgorithm::RS256 => "RS256",
            JwtAlgorithm::ES256 => "ES256",
            JwtAlgorithm::EdDSA => "EdDSA",
        }
    }

    /// Whether a token of this algorithm is checked against the JWKS (a
    /// public key) rather than the shared secret.
    pub fn is_asymmetric(self) -> bool {
        self != JwtAlgorithm::HS256
    }
}

/// `[auth]`: how buyer tokens are checked.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Auth {
    pub jwt_secret: Option<String>,
    /// When set, buyer tokens must carry this `aud`.
    pub audience: Option<String>,
    /// When set, buyer tokens must carry this `iss`.
    pub issuer: Option<String>,
    /// The `alg`s accepted; unset: HS256 when a secret is set (or no JWKS
    /// is), and RS256, ES256 and EdDSA when a JWKS is.
    pub algorithms: Option<Vec<JwtAlgorithm>>,
    /// The identity provider's public keys, fetched over HTTP(S).
    pub jwks_url: Option<String>,
    /// The public keys from a local file (instead of `jwks_url`).
    pub jwks_file: Option<String>,
    /// Least time between two fetches caused by a token whose `kid` the
    /// set lacks (a rotated key): a stream of made-up `kid`s costs the
    /// identity provider one fetch per interval at most.
    pub jwks_refetch_interval_ms: u64,
    /// Longest wait for the JWKS URL to answer.
    pub jwks_timeout_ms: u64,
    /// How often the JWKS is fetched (or the file read) again.
    pub jwks_refresh_seconds: u64,
    /// The cookie the shop sets at sign-in that carries the buyer's token,
    /// read when a request has no `Authorization: Bearer`.
    pub cookie: Option<String>,
    /// The origin the sale page is served from (`https://shop.example`),
    /// which a cookie-signed buy's `Origin` must name; unset, the `Origin`
    /// must name the request's own host.
    pub public_origin: Option<String>,
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            jwt_secret: None,
            audience: None,
            issuer: None,
            algorithms: None,
            jwks_url: None,
            jwks_file: None,
            jwks_refetch_interval_ms: 10_000,
            jwks_timeout_ms: 2_000,
            jwks_refresh_seconds: 300,
            cookie: None,
            public_origin: None,
        }
    }
}

/// `gateway.path_prefix` when the file sets none.
pub const DEFAULT_PATH_PREFIX: &str = "/flashgate";

/// `[gateway]`: the edge process.
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
    /// Where the gateway's own paths live; every other path is the shop's.
    pub path_prefix: String,
    /// An extra mount of the sale page outside the prefix, ending `/{id}`.
    pub sale_page_path: Option<String>,
    pub idempotency_ttl_seconds: u64,
    pub keepalive_seconds: u64,
    pub backlog_pause_threshold: u64,
    pub backlog_check_ms: u64,
    pub body_read_timeout_ms: u64,
    /// Lifetime of a checkout hand-off token (`{handoff}` in a sale's
    /// `checkout_url`).
    pub handoff_ttl_seconds: u64,
    /// Upgrade socket and pid file; unset = `$RUNTIME_DIRECTORY`, else
    /// `$XDG_RUNTIME_DIR/flashgate`, else `data/run`.
    pub runtime_dir: Option<String>,
    pub tls: Tls,
}

/// `[gateway.tls]`: the HTTPS listener, on when `cert_file` is set.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tls {
    pub listen: String,
    /// PEM, leaf first then the intermediates: the certificate of clients
    /// that send no SNI or a name no other certificate covers.
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    /// More certificates, each chosen for the DNS names in its SAN.
    pub certificates: Vec<TlsCertificate>,
    /// Page routes on the plain listener answer 308 to HTTPS; the API
    /// keeps working on both.
    pub redirect_http: bool,
    /// The public HTTPS port redirects name (a load balancer may listen on
    /// 443 in front of `listen`); unset: the port of `listen`.
    pub redirect_port: Option<u16>,
    /// How often the certificate files are checked for changes.
    pub reload_interval_ms: u64,
}

/// One `[[gateway.tls.certificates]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsCertificate {
    pub cert_file: String,
    pub key_file: String,
}

impl Default for Tls {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8443".into(),
            cert_file: None,
            key_file: None,
            certificates: Vec::new(),
            redirect_http: false,
            redirect_port: None,
            reload_interval_ms: 1000,
        }
    }
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
            path_prefix: DEFAULT_PATH_PREFIX.into(),
            sale_page_path: None,
            idempotency_ttl_seconds: 86_400,
            keepalive_seconds: 60,
            backlog_pause_threshold: 50_000,
            backlog_check_ms: 500,
            body_read_timeout_ms: 10_000,
            handoff_ttl_seconds: 600,
            runtime_dir: None,
            tls: Tls::default(),
        }
    }
}

/// `[backend]`: the order backend process.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backend {
    pub listen: String,
    pub admin_listen: String,
    pub database_url: String,
    /// Unset: `<host>-<pid>`, chosen when the backend starts.
    pub consumer_name: Option<String>,
    pub batch_size: usize,
    pub block_ms: u64,
    pub claim_idle_ms: u64,
    pub forward_grace_ms: u64,
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
            forward_grace_ms: 1000,
            sale_poll_ms: 1000,
            max_deliveries: 5,
            expiry_poll_ms: 1000,
            restore_poll_ms: 1000,
            reconcile_interval_ms: 60_000,
        }
    }
}

/// One `[[sales]]` entry: `id`, `name` and `stock` are required.
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
    /// This sale's opening draw window, ms (0 = no draw); left out, the
    /// sale follows `fairness.window_ms`.
    pub draw_window_ms: Option<i64>,
    /// How many buckets (hash tags) the stock is split over, 1 to 64; 1
    /// keeps the sale in one slot (see `crate::buckets`).
    #[serde(default = "one")]
    pub buckets: i64,
    /// Where winners pay: a URL template with `{sale_id}`,
    /// `{reservation_id}`, `{order_id}` and `{handoff}` (see
    /// `crate::checkout`); left out, no checkout hand-off.
    pub checkout_url: Option<String>,
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
