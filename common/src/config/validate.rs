//! From the file's shape to the typed settings: one function per table,
//! each checking its keys through [`Check`] (the message is written from
//! the bound) and building its part of [`Config`]. A table with a bad value
//! still builds (with a placeholder), so every problem in the file is found
//! in one pass; [`validate`] then returns them all instead of the settings.
//!
//! Pure: the environment comes in as an [`Env`] and the time as `now_ms`;
//! nothing is read from the machine (the default consumer name, which needs
//! the host name, is chosen when the backend starts).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::check::Check;
use super::env::{
    self, Env, ENV_ADMIN_TOKEN, ENV_CHALLENGE_SECRET, ENV_CONSUMER_NAME, ENV_DATABASE_URL,
    ENV_HANDOFF_SECRET, ENV_INTERNAL_TOKEN, ENV_JWT_SECRET, ENV_SHOP_TOKEN,
    ENV_WAITING_ROOM_SECRET,
};
use super::file;
use super::origin::{valid_host, Origin};
use super::settings::{
    AuthConfig, BackendConfig, Bucket, ChallengeConfig, CompressionLevels, Config, DenyConfig,
    FairnessConfig, GatewayConfig, HostHeader, JwksConfig, JwksSource, LimitsConfig, PagesConfig,
    RedisConfig, RedisTarget, RouteLimits, ShopCacheConfig, ShopConfig, TlsConfig, TlsFiles,
};
use super::JwtAlgorithm;
use crate::sale::SaleSpec;

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
/// Most `redis.wait_replicas`: more replicas than one master would ever
/// feed is a typo.
pub const MAX_WAIT_REPLICAS: u32 = 16;
/// Most leading zero bits a challenge may ask: 2^32 hashes is minutes of
/// work even for native code, far past what a buyer would wait.
pub const MAX_CHALLENGE_BITS: u32 = 32;
/// Longest `max-age` of a page or asset: a year.
const MAX_AGE_SECONDS: u64 = 31_536_000;

/// Checks every value of `f` and builds the settings.
///
/// # Errors
/// Every problem found, each prefixed with its key path.
pub fn validate(f: file::File, env: &dyn Env, now_ms: i64) -> Result<Config, Vec<String>> {
    let mut check = Check::default();
    let (jwt_secret, admin_token) = secrets(&mut check, f.auth.jwt_secret.clone(), env);
    let idempotency_ttl_seconds = f.gateway.idempotency_ttl_seconds;
    let waiting_room_secret = waiting_room_secret(&mut check, &f.shop.waiting_rooms, env);
    let config = Config {
        limits: limits(&mut check, f.limits),
        deny: deny(&mut check, f.deny),
        redis: redis(&mut check, f.redis),
        auth: auth(&mut check, f.auth, jwt_secret.is_some()),
        jwt_secret,
        admin_token,
        internal_token: env.var(ENV_INTERNAL_TOKEN),
        shop_token: env.var(ENV_SHOP_TOKEN),
        shop: shop(&mut check, f.shop, &f.gateway.shop_upstream),
        gateway: gateway(&mut check, f.gateway, env),
        pages: pages(&mut check, f.pages),
        challenge: challenge(&mut check, f.challenge, idempotency_ttl_seconds),
        challenge_secret: challenge_secret(&mut check, env),
        handoff_secret: handoff_secret(&mut check, &f.sales, env),
        waiting_room_secret,
        fairness: fairness(&mut check, &f.fairness),
        backend: backend(&mut check, f.backend, env),
        events: super::events::events(&mut check, f.events, env),
        payment_timeouts: payment_timeouts(&mut check, &f.sales),
        sales: sales(&mut check, &f.sales, now_ms),
    };
    // A draw runs in one slot: a bucketed sale cannot follow the shared window.
    for (i, s) in config.sales.iter().enumerate() {
        if s.buckets > 1 && s.draw_window_ms.is_none() && config.fairness.window_ms != 0 {
            check.fail(
                format_args!("sales[{i}].buckets"),
                "must be 1 while fairness.window_ms is set (the draw runs in one slot), unless the sale sets draw_window_ms = 0",
            );
        }
    }
    // Draws are not offered on Redis Cluster (docs/RELIABILITY.md, known gaps).
    if matches!(config.redis.target, RedisTarget::Cluster { .. }) {
        if config.fairness.window_ms != 0 {
            check.fail(
                "fairness.window_ms",
                "must be 0 with redis.mode = \"cluster\" (no draws on Redis Cluster)",
            );
        }
        for (i, s) in config.sales.iter().enumerate() {
            if s.draw_window_ms.is_some_and(|w| w != 0) {
                check.fail(
                    format_args!("sales[{i}].draw_window_ms"),
                    "must be 0 with redis.mode = \"cluster\" (no draws on Redis Cluster)",
                );
            }
        }
    }
    check.finish().map(|()| config)
}

/// An `IP:port`; a bad one is a problem, and `0.0.0.0:0` stands in for it.
fn addr(check: &mut Check, key: &str, value: &str) -> SocketAddr {
    value.parse().unwrap_or_else(|_| {
        check.fail(key, format_args!("`{value}` is not an IP:port address"));
        SocketAddr::from(([0, 0, 0, 0], 0))
    })
}

fn redis(check: &mut Check, f: file::Redis) -> RedisConfig {
    check.between("redis.timeout_ms", f.timeout_ms, 1, 60_000);
    check.between("redis.breaker_failures", f.breaker_failures, 1, 1000);
    check.between(
        "redis.breaker_cooldown_ms",
        f.breaker_cooldown_ms,
        10,
        600_000,
    );
    check
        .at_most("redis.wait_replicas", f.wait_replicas, MAX_WAIT_REPLICAS)
        .note("0 = no WAIT");
    // WAIT with a timeout of 0 blocks for good.
    check.between("redis.wait_timeout_ms", f.wait_timeout_ms, 1, 60_000);
    let target = redis_target(check, &f);
    let ca_file = redis_ca_file(check, &f, &target);
    RedisConfig {
        target,
        timeout: Duration::from_millis(f.timeout_ms),
        breaker_failures: f.breaker_failures,
        breaker_cooldown: Duration::from_millis(f.breaker_cooldown_ms),
        wait_replicas: f.wait_replicas,
        wait_timeout: Duration::from_millis(f.wait_timeout_ms),
        ca_file,
    }
}

/// `redis.ca_file`: a path, for a deployment reached over TLS (`rediss://`
/// URLs), in any mode; with `redis://` URLs nothing would read it.
fn redis_ca_file(check: &mut Check, f: &file::Redis, target: &RedisTarget) -> Option<PathBuf> {
    let path = f.ca_file.as_deref()?;
    check
        .that(
            !path.trim().is_empty(),
            "redis.ca_file",
            "must not be empty",
        )
        .note("leave it out for the system's roots only");
    let tls = |urls: &[String]| urls.iter().any(|u| u.starts_with("rediss://"));
    let (urls, tls) = match target {
        RedisTarget::Standalone { url } => {
            ("a rediss:// redis.url", tls(std::slice::from_ref(url)))
        }
        RedisTarget::Cluster { nodes } => ("rediss:// redis.nodes", tls(nodes)),
        RedisTarget::Sentinel { sentinels, .. } => ("rediss:// redis.sentinels", tls(sentinels)),
    };
    check.that(tls, "redis.ca_file", format_args!("needs {urls} (TLS)"));
    Some(PathBuf::from(path))
}

/// Whether `url` asks the redis crate to skip the certificate check
/// (`rediss://host/#insecure`).
fn skips_verification(url: &str) -> bool {
    url.starts_with("rediss://")
        && url
            .split_once('#')
            .is_some_and(|(_, fragment)| fragment == "insecure")
}

/// Why `#insecure` is refused: a server that cannot be told from an
/// impostor would be handed every buy.
const INSECURE: &str =
    "`#insecure` turns off the check of the server's certificate; trust its CA instead (redis.ca_file, or the system's trust store)";

/// Whether `url` is a Redis URL the redis crate takes.
fn redis_url(url: &str) -> bool {
    (url.starts_with("redis://") || url.starts_with("rediss://"))
        && redis::IntoConnectionInfo::into_connection_info(url).is_ok()
}

/// The mode's keys, checked; the keys of the other modes must be left out
/// (a `url` beside `nodes` is a file half-way between two modes).
fn redis_target(check: &mut Check, f: &file::Redis) -> RedisTarget {
    use file::RedisMode;
    let mode = match f.mode {
        RedisMode::Standalone => "standalone",
        RedisMode::Cluster => "cluster",
        RedisMode::Sentinel => "sentinel",
    };
    let urls = |check: &mut Check, key: &str, urls: &[String]| {
        for (i, url) in urls.iter().enumerate() {
            check.that(
                redis_url(url),
                format_args!("{key}[{i}]"),
                format_args!("`{url}` is not a redis:// or rediss:// URL"),
            );
            check.that(
                !skips_verification(url),
                format_args!("{key}[{i}]"),
                INSECURE,
            );
        }
        // The client takes the first URL's scheme for every node it finds.
        let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
        check.that(
            tls == 0 || tls == urls.len(),
            key,
            "mixes redis:// and rediss:// URLs: use one scheme for every node",
        );
    };
    if f.mode != RedisMode::Standalone {
        check.that(
            f.url == file::DEFAULT_REDIS_URL,
            "redis.url",
            format_args!("not used in {mode} mode"),
        );
    }
    if f.mode != RedisMode::Cluster {
        check.that(
            f.nodes.is_empty(),
            "redis.nodes",
            "only used with mode = \"cluster\"",
        );
    }
    if f.mode != RedisMode::Sentinel {
        check.that(
            f.sentinels.is_empty(),
            "redis.sentinels",
            "only used with mode = \"sentinel\"",
        );
        check.that(
            f.master_name.is_none(),
            "redis.master_name",
            "only used with mode = \"sentinel\"",
        );
    }
    match f.mode {
        RedisMode::Standalone => {
            check.that(
                f.url.starts_with("redis://") || f.url.starts_with("rediss://"),
                "redis.url",
                "must start with redis:// or rediss://",
            );
            check.that(!skips_verification(&f.url), "redis.url", INSECURE);
            RedisTarget::Standalone { url: f.url.clone() }
        }
        RedisMode::Cluster => {
            check.that(
                !f.nodes.is_empty(),
                "redis.nodes",
                "cluster mode needs at least one seed node",
            );
            urls(check, "redis.nodes", &f.nodes);
            RedisTarget::Cluster {
                nodes: f.nodes.clone(),
            }
        }
        RedisMode::Sentinel => {
            check.that(
                !f.sentinels.is_empty(),
                "redis.sentinels",
                "sentinel mode needs at least one sentinel",
            );
            urls(check, "redis.sentinels", &f.sentinels);
            let master_name = f.master_name.clone().unwrap_or_default();
            check.that(
                !master_name.trim().is_empty(),
                "redis.master_name",
                "sentinel mode needs the name the sentinels monitor the primary under",
            );
            RedisTarget::Sentinel {
                sentinels: f.sentinels.clone(),
                master_name,
            }
        }
    }
}

fn gateway(check: &mut Check, f: file::Gateway, env: &dyn Env) -> GatewayConfig {
    check.between("gateway.threads", f.threads, 1, 256);
    check.that(
        f.backend_url.starts_with("http://"),
        "gateway.backend_url",
        "must be an http:// URL",
    );
    check.between(
        "gateway.forward_timeout_ms",
        f.forward_timeout_ms,
        1,
        60_000,
    );
    check
        .between(
            "gateway.idempotency_ttl_seconds",
            f.idempotency_ttl_seconds,
            1,
            MAX_IDEMPOTENCY_TTL_SECONDS,
        )
        .note("7 days");
    check
        .at_most(
            "gateway.backlog_pause_threshold",
            f.backlog_pause_threshold,
            1_000_000_000,
        )
        .note("0 = never");
    check
        .that(
            f.runtime_dir
                .as_deref()
                .is_none_or(|d| !d.trim().is_empty()),
            "gateway.runtime_dir",
            "must not be empty",
        )
        .note("leave it out for the default");
    check.between(
        "gateway.body_read_timeout_ms",
        f.body_read_timeout_ms,
        100,
        600_000,
    );
    check.between("gateway.backlog_check_ms", f.backlog_check_ms, 50, 60_000);
    check.between("gateway.keepalive_seconds", f.keepalive_seconds, 1, 3600);
    check.between(
        "gateway.handoff_ttl_seconds",
        f.handoff_ttl_seconds,
        10,
        86_400,
    );
    let listen = addr(check, "gateway.listen", &f.listen);
    let admin_listen = addr(check, "gateway.admin_listen", &f.admin_listen);
    let tls = tls(check, f.tls);
    if let Some(t) = &tls {
        let clash = t.listen.port() != 0 && (t.listen == listen || t.listen == admin_listen);
        check.that(
            !clash,
            "gateway.tls.listen",
            format_args!(
                "must differ from gateway.listen and gateway.admin_listen, got {}",
                t.listen
            ),
        );
    }
    GatewayConfig {
        listen,
        admin_listen,
        threads: f.threads,
        backend_url: f.backend_url.trim_end_matches('/').to_owned(),
        forward_timeout: Duration::from_millis(f.forward_timeout_ms),
        static_dir: PathBuf::from(f.static_dir),
        sale_page_path: f
            .sale_page_path
            .as_deref()
            .and_then(|p| sale_page_path(check, p, &f.path_prefix)),
        path_prefix: path_prefix(check, &f.path_prefix),
        idempotency_ttl: Duration::from_secs(f.idempotency_ttl_seconds),
        keepalive: Duration::from_secs(f.keepalive_seconds),
        backlog_pause_threshold: f.backlog_pause_threshold,
        backlog_check: Duration::from_millis(f.backlog_check_ms),
        body_read_timeout: Duration::from_millis(f.body_read_timeout_ms),
        handoff_ttl: Duration::from_secs(f.handoff_ttl_seconds),
        runtime_dir: env::runtime_dir(f.runtime_dir, env),
        tls,
    }
}

/// `[gateway.tls]`: off unless `cert_file` is set; every other key of the
/// table needs it.
fn tls(check: &mut Check, f: file::Tls) -> Option<TlsConfig> {
    check.between(
        "gateway.tls.reload_interval_ms",
        f.reload_interval_ms,
        100,
        3_600_000,
    );
    let listen = addr(check, "gateway.tls.listen", &f.listen);
    let nonempty = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
    for (key, value) in [
        ("gateway.tls.cert_file", &f.cert_file),
        ("gateway.tls.key_file", &f.key_file),
    ] {
        check
            .that(value.is_none() || nonempty(value), key, "must not be empty")
            .note("leave it out for no TLS");
    }
    let Some(cert_file) = f.cert_file.filter(|v| !v.trim().is_empty()) else {
        check.that(
            f.key_file.is_none(),
            "gateway.tls.key_file",
            "needs gateway.tls.cert_file",
        );
        check.that(
            f.certificates.is_empty(),
            "gateway.tls.certificates",
            "need gateway.tls.cert_file (the default certificate)",
        );
        check.that(
            !f.redirect_http,
            "gateway.tls.redirect_http",
            "needs gateway.tls.cert_file (no HTTPS listener to redirect to)",
        );
        check.that(
            f.redirect_port.is_none(),
            "gateway.tls.redirect_port",
            "needs gateway.tls.cert_file (no HTTPS listener to redirect to)",
        );
        let unset = file::Tls::default();
        check.that(
            f.listen == unset.listen,
            "gateway.tls.listen",
            "needs gateway.tls.cert_file (HTTPS is off without it)",
        );
        check.that(
            f.reload_interval_ms == unset.reload_interval_ms,
            "gateway.tls.reload_interval_ms",
            "needs gateway.tls.cert_file (no certificates to reload)",
        );
        return None;
    };
    let Some(key_file) = f.key_file.filter(|v| !v.trim().is_empty()) else {
        check.fail(
            "gateway.tls.key_file",
            "must be set with gateway.tls.cert_file",
        );
        return None;
    };
    check.that(
        f.certificates.len() <= 256,
        "gateway.tls.certificates",
        format_args!("must hold at most 256, got {}", f.certificates.len()),
    );
    let mut certificates = Vec::with_capacity(f.certificates.len());
    for (i, c) in f.certificates.into_iter().enumerate() {
        let key_path = format!("gateway.tls.certificates[{i}]");
        check.that(
            !c.cert_file.trim().is_empty(),
            format_args!("{key_path}.cert_file"),
            "must not be empty",
        );
        check.that(
            !c.key_file.trim().is_empty(),
            format_args!("{key_path}.key_file"),
            "must not be empty",
        );
        certificates.push(TlsFiles {
            key_path,
            cert_file: c.cert_file.into(),
            key_file: c.key_file.into(),
        });
    }
    check
        .that(
            f.redirect_port != Some(0),
            "gateway.tls.redirect_port",
            "must be a port between 1 and 65535, got 0",
        )
        .note("leave it out for the port of gateway.tls.listen");
    let redirect_port = f.redirect_port.unwrap_or(listen.port());
    Some(TlsConfig {
        listen,
        redirect_port,
        default: TlsFiles {
            key_path: "gateway.tls".into(),
            cert_file: cert_file.into(),
            key_file: key_file.into(),
        },
        certificates,
        redirect_http: f.redirect_http,
        reload_interval: Duration::from_millis(f.reload_interval_ms),
    })
}

/// `[shop]`; `gateway.shop_upstream` (one `host:port`, the form before
/// `shop.upstreams`) is the one upstream when `shop.upstreams` is empty.
fn shop(check: &mut Check, f: file::Shop, shop_upstream: &str) -> ShopConfig {
    let mut origin = |key: &str, v: &str| match Origin::parse(v) {
        Ok(o) if o.tls() && o.ip().is_some() => {
            check.fail(
                key,
                format_args!("`{v}`: an https:// origin needs a host name to verify its certificate against, not an IP address"),
            );
            None
        }
        Ok(o) => Some(o),
        Err(e) => {
            check.fail(key, e);
            None
        }
    };
    let legacy = origin("gateway.shop_upstream", shop_upstream);
    let mut upstreams: Vec<Origin> = f
        .upstreams
        .iter()
        .enumerate()
        .filter_map(|(i, v)| origin(&format!("shop.upstreams[{i}]"), v))
        .collect();
    if f.upstreams.is_empty() {
        upstreams.extend(legacy);
    }
    check.that(
        upstreams.len() <= 64,
        "shop.upstreams",
        format_args!("must hold at most 64 upstreams, got {}", upstreams.len()),
    );
    check.between(
        "shop.resolve_interval_ms",
        f.resolve_interval_ms,
        100,
        3_600_000,
    );
    let ca_file = f.ca_file.as_deref().and_then(|path| {
        check
            .that(
                !path.trim().is_empty(),
                "shop.ca_file",
                "must name a PEM file",
            )
            .ok()
            .then(|| PathBuf::from(path))
    });
    let host_header =
        match f.host_header.as_str() {
            "client" => HostHeader::Client,
            name => {
                let host = name.rsplit_once(':').map_or(name, |(h, p)| {
                    if p.parse::<u16>().is_ok() {
                        h
                    } else {
                        name
                    }
                });
                check.that(
                    valid_host(host) && !host.contains(':'),
                    "shop.host_header",
                    format_args!(
                        "must be \"client\" or a host name (host or host:port), got `{name}`"
                    ),
                );
                HostHeader::Fixed(name.to_ascii_lowercase())
            }
        };
    let health_check_path = f.health_check_path.inspect(|p| {
        check.that(
            p.starts_with('/') && p.len() <= 1024 && p.bytes().all(|b| b.is_ascii_graphic()),
            "shop.health_check_path",
            format_args!(
                "must be a path starting with / (visible ASCII, at most 1024 bytes), got `{p}`"
            ),
        );
    });
    check.between(
        "shop.health_check_interval_ms",
        f.health_check_interval_ms,
        100,
        600_000,
    );
    check.between("shop.connect_timeout_ms", f.connect_timeout_ms, 1, 60_000);
    check.between("shop.read_timeout_ms", f.read_timeout_ms, 1, 3_600_000);
    ShopConfig {
        upstreams,
        resolve_interval: Duration::from_millis(f.resolve_interval_ms),
        ca_file,
        host_header,
        health_check_path,
        health_check_interval: Duration::from_millis(f.health_check_interval_ms),
        connect_timeout: Duration::from_millis(f.connect_timeout_ms),
        read_timeout: Duration::from_millis(f.read_timeout_ms),
        h2: f.h2,
        cache: shop_cache(check, f.cache, f.read_timeout_ms),
        compression: shop_compression(check, f.compression),
        waiting_rooms: super::waiting_rooms::validate(check, f.waiting_rooms),
    }
}

/// `[shop.compression]`: each level within its encoder's range, 0 = off.
fn shop_compression(check: &mut Check, f: file::ShopCompression) -> Option<CompressionLevels> {
    check.at_most("shop.compression.gzip_level", f.gzip_level, 9);
    // Higher levels cost far more CPU (and zstd memory) per response than
    // they save on pages the shop renders on each request.
    check.at_most("shop.compression.brotli_level", f.brotli_level, 6);
    check.at_most("shop.compression.zstd_level", f.zstd_level, 9);
    if f.enabled && f.gzip_level == 0 && f.brotli_level == 0 && f.zstd_level == 0 {
        check.fail(
            "shop.compression.enabled",
            "every level is 0: set one of gzip_level, brotli_level, zstd_level",
        );
    }
    f.enabled.then_some(CompressionLevels {
        gzip: f.gzip_level,
        brotli: f.brotli_level,
        zstd: f.zstd_level,
    })
}

/// Largest `shop.cache.max_bytes`: 64 GiB, past any gateway's memory.
pub const MAX_SHOP_CACHE_BYTES: u64 = 64 << 30;

/// `[shop.cache]`.
fn shop_cache(check: &mut Check, f: file::ShopCache, shop_read_timeout_ms: u64) -> ShopCacheConfig {
    check
        .between(
            "shop.cache.max_bytes",
            f.max_bytes,
            1 << 20,
            MAX_SHOP_CACHE_BYTES,
        )
        .note("1 MiB to 64 GiB");
    // A quarter of max_bytes bounds the fills in progress (gateway shop_cache).
    check
        .between(
            "shop.cache.max_object_bytes",
            f.max_object_bytes,
            1024,
            (f.max_bytes / 4).clamp(1024, MAX_SHOP_CACHE_BYTES),
        )
        .note("at most a quarter of shop.cache.max_bytes");
    check
        .at_most(
            "shop.cache.stale_if_error_seconds",
            f.stale_if_error_seconds,
            86_400,
        )
        .note("0 = only when the shop allows it");
    // Shorter than the shop's read timeout, a slow fetch would release the
    // whole crowd waiting on it to the shop.
    let lock_min = shop_read_timeout_ms.max(10);
    check
        .between(
            "shop.cache.lock_timeout_ms",
            f.lock_timeout_ms,
            lock_min,
            lock_min.max(60_000),
        )
        .note("at least shop.read_timeout_ms");
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if f.tag_header.is_empty() || f.tag_header.len() > 64 || !f.tag_header.bytes().all(token) {
        check.fail(
            "shop.cache.tag_header",
            "must be a header name (1 to 64 letters, digits or -), e.g. Surrogate-Key",
        );
    }
    let bytes = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    ShopCacheConfig {
        tag_header: f.tag_header.to_ascii_lowercase(),
        forward_tag_header: f.forward_tag_header,
        enabled: f.enabled,
        max_bytes: bytes(f.max_bytes),
        max_object_bytes: bytes(f.max_object_bytes),
        stale_if_error: Duration::from_secs(f.stale_if_error_seconds),
        lock_timeout: Duration::from_millis(f.lock_timeout_ms),
        rules: super::cache_rules::validate(check, f.rules),
    }
}

fn pages(check: &mut Check, f: file::Pages) -> PagesConfig {
    check.at_most(
        "pages.page_max_age_seconds",
        f.page_max_age_seconds,
        MAX_AGE_SECONDS,
    );
    check.at_most(
        "pages.asset_max_age_seconds",
        f.asset_max_age_seconds,
        MAX_AGE_SECONDS,
    );
    check.at_most(
        "pages.fingerprinted_max_age_seconds",
        f.fingerprinted_max_age_seconds,
        MAX_AGE_SECONDS,
    );
    check
        .at_most("pages.reload_interval_ms", f.reload_interval_ms, 3_600_000)
        .note("0 turns reloading off");
    check.between("pages.state_ttl_ms", f.state_ttl_ms, 1, 60_000);
    PagesConfig {
        page_max_age: Duration::from_secs(f.page_max_age_seconds),
        asset_max_age: Duration::from_secs(f.asset_max_age_seconds),
        fingerprinted_max_age: Duration::from_secs(f.fingerprinted_max_age_seconds),
        reload_interval: Duration::from_millis(f.reload_interval_ms),
        state_ttl: Duration::from_millis(f.state_ttl_ms),
    }
}

fn challenge(
    check: &mut Check,
    f: file::Challenge,
    idempotency_ttl_seconds: u64,
) -> ChallengeConfig {
    check
        .between(
            "challenge.difficulty_bits",
            f.difficulty_bits,
            0,
            MAX_CHALLENGE_BITS,
        )
        .note("each bit doubles the work");
    // A buy may re-send its solution with its key while the solution is
    // remembered (its TTL and a minute): its won key must outlive that, or
    // the re-send would buy again.
    if f.mode != file::ChallengeMode::Off {
        check.that(
            idempotency_ttl_seconds >= f.ttl_seconds + 60,
            "challenge.ttl_seconds",
            format_args!(
                "must be at least 60 s below gateway.idempotency_ttl_seconds ({idempotency_ttl_seconds}) while challenges are on, got {}",
                f.ttl_seconds
            ),
        );
    }
    check.between(
        "challenge.max_difficulty_bits",
        f.max_difficulty_bits,
        f.difficulty_bits.min(MAX_CHALLENGE_BITS),
        MAX_CHALLENGE_BITS,
    );
    check.between("challenge.ttl_seconds", f.ttl_seconds, 10, 3600);
    check.between(
        "challenge.user_rate_per_minute",
        f.user_rate_per_minute,
        1,
        1_000_000,
    );
    check.between(
        "challenge.ip_rate_per_minute",
        f.ip_rate_per_minute,
        1,
        1_000_000,
    );
    check.between(
        "challenge.sale_rate_per_second",
        f.sale_rate_per_second,
        1,
        1_000_000,
    );
    let bits = |b: u32| u8::try_from(b.min(MAX_CHALLENGE_BITS)).unwrap_or(0);
    ChallengeConfig {
        mode: f.mode,
        difficulty_bits: bits(f.difficulty_bits),
        max_difficulty_bits: bits(f.max_difficulty_bits.max(f.difficulty_bits)),
        ttl: Duration::from_secs(f.ttl_seconds),
        user_rate_per_minute: f.user_rate_per_minute,
        ip_rate_per_minute: f.ip_rate_per_minute,
        sale_rate_per_second: f.sale_rate_per_second,
    }
}

/// `FLASHGATE_CHALLENGE_SECRET`, refused when set but too short; whether
/// it is required depends on the mode, and only the gateway needs it
/// ([`Config::required_challenge_secret`]).
fn challenge_secret(check: &mut Check, env: &dyn Env) -> Option<String> {
    let secret = env.var(ENV_CHALLENGE_SECRET);
    if let Some(s) = &secret {
        if let Err(e) = crate::secret::required(ENV_CHALLENGE_SECRET, Some(s)) {
            check.problem(e);
        }
    }
    secret
}

/// `FLASHGATE_WAITING_ROOM_SECRET`: refused when set but too short,
/// required when a room is configured (its cookies are signed with it).
/// A room that asks for a proof of work needs the challenge secret too.
fn waiting_room_secret(
    check: &mut Check,
    rooms: &[file::WaitingRoom],
    env: &dyn Env,
) -> Option<String> {
    let secret = env.var(ENV_WAITING_ROOM_SECRET);
    match (&secret, rooms.is_empty()) {
        (Some(s), _) => {
            if let Err(e) = crate::secret::required(ENV_WAITING_ROOM_SECRET, Some(s)) {
                check.problem(e);
            }
        }
        (None, false) => check.fail(
            "shop.waiting_rooms",
            format_args!("needs {ENV_WAITING_ROOM_SECRET} (not set): it signs the rooms' cookies"),
        ),
        (None, true) => {}
    }
    for (i, room) in rooms.iter().enumerate() {
        if room.challenge && env.var(ENV_CHALLENGE_SECRET).is_none() {
            check.fail(
                format_args!("shop.waiting_rooms[{i}].challenge"),
                format_args!("needs {ENV_CHALLENGE_SECRET} (not set): it signs the proofs of work"),
            );
        }
    }
    secret
}

/// `FLASHGATE_HANDOFF_SECRET`, the HS256 key of checkout hand-off tokens:
/// refused when set but too short, required when a declared sale's
/// `checkout_url` asks for `{handoff}` (a sale the admin API adds later
/// gets no token from a gateway without it, see docs/CHECKOUT.md).
fn handoff_secret(check: &mut Check, sales: &[file::Sale], env: &dyn Env) -> Option<String> {
    let secret = env.var(ENV_HANDOFF_SECRET);
    if let Some(s) = &secret {
        if let Err(e) = crate::secret::required(ENV_HANDOFF_SECRET, Some(s)) {
            check.problem(e);
        }
    }
    for (i, s) in sales.iter().enumerate() {
        if secret.is_none()
            && s.checkout_url
                .as_deref()
                .is_some_and(crate::checkout::needs_handoff)
        {
            check.fail(
                format_args!("sales[{i}].checkout_url"),
                format_args!("uses {{handoff}}, which needs {ENV_HANDOFF_SECRET} (not set)"),
            );
        }
    }
    secret
}

fn backend(check: &mut Check, f: file::Backend, env: &dyn Env) -> BackendConfig {
    let database_url = env.var(ENV_DATABASE_URL).unwrap_or(f.database_url);
    check.that(
        ["sqlite:", "postgres://", "postgresql://", "mysql://"]
            .iter()
            .any(|scheme| database_url.starts_with(scheme)),
        "backend.database_url",
        "must be a sqlite:, postgres:// or mysql:// URL",
    );
    check.between("backend.batch_size", f.batch_size, 1, 10_000);
    check.between("backend.block_ms", f.block_ms, 1, 60_000);
    check.between("backend.claim_idle_ms", f.claim_idle_ms, 100, 86_400_000);
    check
        .at_most("backend.forward_grace_ms", f.forward_grace_ms, 60_000)
        .note("0 = the consumer writes at once");
    // An entry held for the grace is pending on its consumer, its idle
    // time growing: the grace and then the write must end well before
    // `claim_idle_ms`, or another backend claims the entries held for it
    // and writes them a second time (harmless, but the work the grace
    // saves). At most half of it, less a second, leaves the write the rest.
    let grace_room = f.claim_idle_ms.saturating_sub(1000) / 2;
    check.that(
        f.forward_grace_ms == 0 || f.forward_grace_ms <= grace_room,
        "backend.forward_grace_ms",
        format_args!(
            "must be at most (backend.claim_idle_ms - 1000) / 2 = {grace_room}, so a batch held for it is written before other consumers claim it"
        ),
    );
    check.between("backend.sale_poll_ms", f.sale_poll_ms, 10, 60_000);
    check.between("backend.max_deliveries", f.max_deliveries, 1, 1000);
    check.between("backend.expiry_poll_ms", f.expiry_poll_ms, 10, 600_000);
    check.between("backend.restore_poll_ms", f.restore_poll_ms, 10, 600_000);
    check.between(
        "backend.reconcile_interval_ms",
        f.reconcile_interval_ms,
        10,
        86_400_000,
    );
    BackendConfig {
        listen: addr(check, "backend.listen", &f.listen),
        admin_listen: addr(check, "backend.admin_listen", &f.admin_listen),
        database_url,
        consumer_name: env.var(ENV_CONSUMER_NAME).or(f.consumer_name),
        batch_size: f.batch_size,
        block: Duration::from_millis(f.block_ms),
        claim_idle: Duration::from_millis(f.claim_idle_ms),
        forward_grace: Duration::from_millis(f.forward_grace_ms),
        sale_poll: Duration::from_millis(f.sale_poll_ms),
        max_deliveries: f.max_deliveries,
        expiry_poll: Duration::from_millis(f.expiry_poll_ms),
        restore_poll: Duration::from_millis(f.restore_poll_ms),
        reconcile_interval: Duration::from_millis(f.reconcile_interval_ms),
    }
}

/// A bucket with both numbers in range, or `None` (and the problems).
fn bucket(check: &mut Check, key: &str, b: file::Bucket) -> Option<Bucket> {
    const NOTE: &str = "leave the bucket out for no limit";
    let per_second = check.non_zero(
        format_args!("{key}.per_second"),
        b.per_second,
        MAX_BUCKET_PER_SECOND,
        NOTE,
    );
    let burst = check.non_zero(format_args!("{key}.burst"), b.burst, MAX_BUCKET_BURST, NOTE);
    Some(Bucket {
        per_second: per_second?,
        burst: burst?,
    })
}

fn route_limits(check: &mut Check, class: &str, f: file::RouteLimits) -> RouteLimits {
    let mut one = |scope: &str, b: Option<file::Bucket>| {
        b.and_then(|b| bucket(check, &format!("limits.{class}.{scope}"), b))
    };
    RouteLimits {
        user: one("user", f.user),
        ip: one("ip", f.ip),
        global: one("global", f.global),
    }
}

fn limits(check: &mut Check, f: file::Limits) -> LimitsConfig {
    check.between(
        "limits.max_tracked_keys",
        f.max_tracked_keys,
        1,
        100_000_000,
    );
    check.between(
        "limits.idle_seconds",
        f.idle_seconds,
        1,
        MAX_LIMITS_IDLE_SECONDS,
    );
    LimitsConfig {
        trusted_proxies: nets(check, "limits.trusted_proxies", &f.trusted_proxies),
        client_ip_header: f.client_ip_header,
        max_tracked_keys: f.max_tracked_keys,
        idle: Duration::from_secs(f.idle_seconds),
        buy: route_limits(check, "buy", f.buy),
        read: route_limits(check, "read", f.read),
        cluster_global: f
            .cluster_global
            .and_then(|b| bucket(check, "limits.cluster_global", b)),
    }
}

fn deny(check: &mut Check, f: file::Deny) -> DenyConfig {
    DenyConfig {
        nets: nets(check, "deny.ips", &f.ips),
        users: f.users.into_iter().collect(),
    }
}

/// The parsed networks of a list; each bad entry is a problem at `key[i]`.
fn nets(check: &mut Check, key: &str, list: &[String]) -> Vec<IpNet> {
    list.iter()
        .enumerate()
        .filter_map(|(i, v)| {
            parse_net(v)
                .map_err(|why| check.fail(format_args!("{key}[{i}]"), why))
                .ok()
        })
        .collect()
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
fn parse_net(s: &str) -> Result<IpNet, String> {
    let net: IpNet = s
        .parse()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
        .ok_or_else(|| format!("`{s}` is not an IP address or CIDR"))?;
    if let IpNet::V6(v6) = net {
        if let (Some(v4), Some(prefix)) =
            (v6.addr().to_ipv4_mapped(), v6.prefix_len().checked_sub(96))
        {
            if let Ok(v4) = Ipv4Net::new(v4, prefix) {
                return Ok(IpNet::V4(v4));
            }
        }
        let mapped = Ipv6Net::new(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96)
            .expect("/96 is a valid prefix");
        if v6.prefix_len() < 96 && v6.contains(&mapped) {
            return Err(format!(
                "`{s}` holds the IPv4-mapped range ::ffff:0:0/96, which never matches: IPv4 clients are compared in IPv4 form; add IPv4 entries (e.g. 0.0.0.0/0) for them"
            ));
        }
    }
    Ok(net)
}

/// The JWT secret (environment over file) and the admin token, each
/// refused when too short ([`crate::secret::required`]), named by where it
/// came from. The order API's tokens are checked where they are required,
/// at start: only the process that uses one needs it.
fn secrets(
    check: &mut Check,
    file_secret: Option<String>,
    env: &dyn Env,
) -> (Option<String>, Option<String>) {
    let jwt_secret = match env.var(ENV_JWT_SECRET) {
        Some(s) => Some((ENV_JWT_SECRET, s)),
        None => file_secret
            .filter(|s| !s.is_empty())
            .map(|s| ("auth.jwt_secret", s)),
    };
    let admin_token = env.var(ENV_ADMIN_TOKEN);
    for (name, secret) in jwt_secret
        .iter()
        .map(|(n, s)| (*n, s))
        .chain(admin_token.iter().map(|s| (ENV_ADMIN_TOKEN, s)))
    {
        if let Err(e) = crate::secret::required(name, Some(secret)) {
            check.problem(e);
        }
    }
    (jwt_secret.map(|(_, s)| s), admin_token)
}

fn auth(check: &mut Check, f: file::Auth, has_secret: bool) -> AuthConfig {
    for (key, claim) in [("auth.audience", &f.audience), ("auth.issuer", &f.issuer)] {
        if let Some(claim) = claim {
            check
                .that(
                    (1..=256).contains(&claim.len()),
                    key,
                    "must be 1 to 256 characters",
                )
                .note("leave it out for no check");
        }
    }
    let source = match (f.jwks_url, f.jwks_file) {
        (Some(_), Some(_)) => {
            check.fail(
                "auth.jwks_file",
                "set auth.jwks_url or auth.jwks_file, not both",
            );
            None
        }
        (Some(url), None) => {
            check.that(
                jwks_url_ok(&url),
                "auth.jwks_url",
                "must be an https:// URL (http:// only to a loopback address: whoever \
                 answers the fetch chooses the keys tokens are checked with)",
            );
            Some(JwksSource::Url(url))
        }
        (None, Some(path)) => {
            check.that(!path.is_empty(), "auth.jwks_file", "must not be empty");
            Some(JwksSource::File(PathBuf::from(path)))
        }
        (None, None) => None,
    };
    check.between(
        "auth.jwks_refetch_interval_ms",
        f.jwks_refetch_interval_ms,
        100,
        3_600_000,
    );
    check.between("auth.jwks_timeout_ms", f.jwks_timeout_ms, 100, 60_000);
    check.between(
        "auth.jwks_refresh_seconds",
        f.jwks_refresh_seconds,
        10,
        86_400,
    );
    let algorithms = match f.algorithms {
        Some(list) => {
            check.that(
                !list.is_empty(),
                "auth.algorithms",
                "must name at least one algorithm",
            );
            for alg in &list {
                if alg.is_asymmetric() && source.is_none() {
                    check.fail(
                        "auth.algorithms",
                        format_args!("{} needs auth.jwks_url or auth.jwks_file", alg.as_str()),
                    );
                } else if !alg.is_asymmetric() && !has_secret {
                    check.fail(
                        "auth.algorithms",
                        format_args!("HS256 needs {ENV_JWT_SECRET} (or auth.jwt_secret)"),
                    );
                }
            }
            if source.is_some() && !list.iter().any(|a| a.is_asymmetric()) {
                check.fail(
                    if matches!(source, Some(JwksSource::Url(_))) {
                        "auth.jwks_url"
                    } else {
                        "auth.jwks_file"
                    },
                    "is set, but auth.algorithms allows none of RS256, ES256, EdDSA",
                );
            }
            list
        }
        None => {
            let mut list = Vec::new();
            if has_secret || source.is_none() {
                list.push(JwtAlgorithm::HS256);
            }
            if source.is_some() {
                list.extend([
                    JwtAlgorithm::RS256,
                    JwtAlgorithm::ES256,
                    JwtAlgorithm::EdDSA,
                ]);
            }
            list
        }
    };
    if let Some(name) = &f.cookie {
        check.that(
            !name.is_empty()
                && name.len() <= 128
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)),
            "auth.cookie",
            "must be a cookie name: 1 to 128 letters, digits or !#$%&'*+-.^_`|~",
        );
    }
    if let Some(origin) = &f.public_origin {
        check.that(
            valid_origin(origin),
            "auth.public_origin",
            "must be an origin: http:// or https://, a host and an optional port, no path (e.g. \"https://shop.example\")",
        );
    }
    AuthConfig {
        audience: f.audience,
        issuer: f.issuer,
        algorithms,
        jwks: source.map(|source| JwksConfig {
            source,
            refetch_interval: Duration::from_millis(f.jwks_refetch_interval_ms),
            timeout: Duration::from_millis(f.jwks_timeout_ms),
            refresh: Duration::from_secs(f.jwks_refresh_seconds),
        }),
        cookie: f.cookie,
        public_origin: f.public_origin.map(|o| o.to_ascii_lowercase()),
    }
}

/// `http://` or `https://`, then a host of letters, digits, `.` and `-`
/// (or a bracketed IPv6 address), then an optional `:port`: what a
/// browser sends as `Origin`.
fn valid_origin(origin: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && !rest.ends_with(']') => (host, Some(port)),
        _ => (rest, None),
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    host_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p != 0))
}

fn fairness(check: &mut Check, f: &file::Fairness) -> FairnessConfig {
    // The rule is the admin API's too (`draw_window_ms`): `sale` owns it.
    let window_ms =
        crate::sale::draw_window_ms("fairness.window_ms", f.window_ms).unwrap_or_else(|e| {
            check.problem(e);
            0
        });
    check.between("fairness.settle_ms", f.settle_ms, 100, 60_000);
    FairnessConfig {
        window_ms,
        settle: Duration::from_millis(f.settle_ms),
    }
}

/// The payment timeout of each sale, by id.
fn payment_timeouts(check: &mut Check, sales: &[file::Sale]) -> HashMap<String, Duration> {
    let mut out = HashMap::new();
    for (i, s) in sales.iter().enumerate() {
        // The rule is the admin API's too: `sale::payment_timeout` owns it.
        match crate::sale::payment_timeout(s.payment_timeout_seconds) {
            Ok(t) => {
                out.insert(s.id.clone(), t);
            }
            Err(e) => check.problem(format_args!("sales[{i}].{e}")),
        }
    }
    out
}

/// The sales, each checked by [`SaleSpec::validate`] (the admin API's
/// rule too), with their windows filled in from `now_ms`.
fn sales(check: &mut Check, sales: &[file::Sale], now_ms: i64) -> Vec<SaleSpec> {
    let mut out: Vec<SaleSpec> = Vec::with_capacity(sales.len());
    for (i, s) in sales.iter().enumerate() {
        check.between(
            format_args!("sales[{i}].duration_seconds"),
            s.duration_seconds,
            1,
            MAX_SALE_DURATION_SECONDS,
        );
        match sale_spec(s, now_ms).and_then(|spec| spec.validate().map(|()| spec)) {
            Ok(spec) if out.iter().any(|o| o.id == spec.id) => check.fail(
                format_args!("sales[{i}].id"),
                format_args!("`{}` is declared twice", spec.id),
            ),
            Ok(spec) => out.push(spec),
            Err(e) => check.problem(format_args!("sales[{i}].{e}")),
        }
    }
    out
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
    Ok(SaleSpec {
        id: s.id.clone(),
        name: s.name.clone(),
        stock: s.stock,
        per_user_limit: s.per_user_limit,
        starts_at_ms,
        ends_at_ms,
        draw_window_ms: s.draw_window_ms,
        buckets: crate::buckets::validate("buckets", s.buckets)?,
        checkout_url: s.checkout_url.clone(),
    })
}

/// A path segment an operator may use in a mount: no encoding needed, no
/// dot segments.
fn plain_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
}

/// `gateway.path_prefix`: `/segment[/segment…]`.
fn path_prefix(check: &mut Check, v: &str) -> String {
    let ok = v
        .strip_prefix('/')
        .is_some_and(|rest| rest.split('/').all(plain_segment));
    check.that(
        ok,
        "gateway.path_prefix",
        format_args!(
            "must be `/` and one or more plain path segments (letters, digits, `-_.~`), \
             no trailing `/`, e.g. \"/flashgate\"; got {v:?}"
        ),
    );
    v.to_owned()
}

/// `gateway.sale_page_path`: `/segment[/segment…]/{id}`, outside the
/// prefix; returns the part before `{id}`.
fn sale_page_path(check: &mut Check, v: &str, prefix: &str) -> Option<String> {
    let base = v.strip_suffix("{id}").filter(|b| {
        b.strip_prefix('/')
            .and_then(|r| r.strip_suffix('/'))
            .is_some_and(|r| r.split('/').all(plain_segment))
    });
    let Some(base) = base else {
        check.that(
            false,
            "gateway.sale_page_path",
            format_args!(
                "must be plain path segments ending in `/{{id}}`, e.g. \"/drops/{{id}}\"; got {v:?}"
            ),
        );
        return None;
    };
    let inside = base == format!("{prefix}/") || base.starts_with(&format!("{prefix}/"));
    check.that(
        !inside,
        "gateway.sale_page_path",
        format_args!("must be outside gateway.path_prefix ({prefix}), which has its own sale pages; got {v:?}"),
    );
    Some(base.to_owned())
}

/// `auth.jwks_url`: https, or plain http to a loopback host only.
fn jwks_url_ok(url: &str) -> bool {
    if url.chars().any(char::is_whitespace) {
        return false;
    }
    let authority = |rest: &str| rest.split(['/', '?', '#']).next().unwrap_or("").to_owned();
    if let Some(rest) = url.strip_prefix("https://") {
        return !authority(rest).is_empty();
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = authority(rest);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
