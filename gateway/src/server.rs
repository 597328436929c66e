//! Builds and runs the Pingora server from the validated config.

use std::sync::Arc;

use anyhow::Context;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use flashgate_common::config::{
    Config, JwksSource, JwtAlgorithm, ENV_INTERNAL_TOKEN, ENV_JWT_SECRET,
};
use flashgate_common::secret;
use pingora::apps::HttpServerOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{Server, ShutdownWatch};
use pingora::services::background::BackgroundService;

use crate::admission::ChallengeGate;
use crate::admission::{Admission, Edge};
use crate::admission::{ConfigWatcher, Hangup};
use crate::admission::{CsrfCheck, Jwks, JwksRefresher, Verifier};
use crate::buy::{BuyDeps, BuyService, ForwardWorker};
use crate::edge::AdminServer;
use crate::edge::Upstreams;
use crate::edge::{CertSet, CertWatcher};
use crate::edge::{Gateway, Routes};
use crate::edge::{PagesWatcher, StaticPages};
use crate::infra::Breaker;
use crate::infra::Metrics;
use crate::infra::OrderClient;
use crate::infra::RedisClient;
use crate::infra::RuntimePaths;
use crate::infra::SystemClock;
use crate::infra::Task;
use crate::infra::{DependencyWatcher, Readiness};
use crate::sales::SaleCache;
use crate::sales::{AnnouncedPurges, EventListener};
use crate::sales::{SwitchWatcher, Switches};

/// A layer's [`Task`] run as one of Pingora's background services.
struct Background<T>(T);

#[async_trait]
impl<T: Task> BackgroundService for Background<T> {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.run(shutdown).await;
    }
}

/// The token verifier of `[auth]`: HS256 needs the secret, the other
/// algorithms the JWKS (a file is read now: a bad one stops the start).
fn verifier(config: &Config, metrics: &Metrics) -> anyhow::Result<Verifier> {
    let auth = &config.auth;
    let hs256 = auth.algorithms.contains(&JwtAlgorithm::HS256);
    let secret = match &config.jwt_secret {
        Some(secret) => Some(secret.as_bytes()),
        None if hs256 => anyhow::bail!(
            "no JWT secret: set {ENV_JWT_SECRET} (or auth.jwt_secret), or leave HS256 out of auth.algorithms"
        ),
        None => None,
    };
    let jwks = match &auth.jwks {
        Some(jwks) => {
            let key = match jwks.source {
                JwksSource::Url(_) => "auth.jwks_url",
                JwksSource::File(_) => "auth.jwks_file",
            };
            Some(Arc::new(
                Jwks::new(jwks, metrics.jwks_loads.clone()).with_context(|| key)?,
            ))
        }
        None => None,
    };
    Ok(Verifier::with_keys(secret, auth, jwks))
}

/// Builds the gateway state. Fails on anything that would only break later:
/// no JWT secret, no backend token of 32 bytes, no challenge secret of 32
/// bytes while challenges are on, an unreadable static dir.
///
/// # Errors
/// With a message naming what is missing or wrong.
pub fn build_gateway(config: Arc<Config>) -> anyhow::Result<(Gateway, ForwardWorker)> {
    let pages = StaticPages::load_with(
        &config.gateway.static_dir,
        (&config.pages).into(),
        &config.gateway.path_prefix,
    )
    .with_context(|| {
        format!(
            "gateway.static_dir: cannot read {}",
            config.gateway.static_dir.display()
        )
    })?;
    let metrics = Arc::new(Metrics::register());
    let verifier = verifier(&config, &metrics)?;
    let backend_token = secret::required(ENV_INTERNAL_TOKEN, config.internal_token.as_deref())
        .context("the backend's order API needs the gateways' token")?;
    let orders = Arc::new(
        OrderClient::new(
            &config.gateway.backend_url,
            config.gateway.forward_timeout,
            backend_token,
        )
        .context("gateway.backend_url")?,
    );
    let redis = Arc::new(RedisClient::new(
        config.redis.clone(),
        Breaker::new(config.redis.breaker_failures, config.redis.breaker_cooldown),
    ));
    let admission = Arc::new(Admission {
        edge: Arc::new(arc_swap::ArcSwap::from_pointee(Edge::new(&config))),
        verifier,
        csrf: CsrfCheck::new(config.auth.public_origin.as_deref()),
    });
    let sales = Arc::new(SaleCache::new(config.pages.state_ttl));
    let switches = Arc::new(Switches::default());
    let challenge_secret = config.required_challenge_secret().with_context(|| {
        format!(
            "challenge.mode = \"{}\" needs a signing secret",
            config.challenge.mode.as_str()
        )
    })?;
    let challenge = match challenge_secret {
        Some(secret) => ChallengeGate::new(
            &config.challenge,
            secret,
            config.limits.max_tracked_keys,
            metrics.clone(),
        ),
        None => ChallengeGate::off(metrics.clone()),
    };
    let challenge = Arc::new(challenge);
    let (buy, forward_worker) = BuyService::new(
        BuyDeps {
            admission: admission.clone(),
            challenge: challenge.clone(),
            redis: redis.clone(),
            sales: sales.clone(),
            switches: switches.clone(),
            orders: orders.clone(),
            metrics: metrics.clone(),
            idempotency_ttl: config.gateway.idempotency_ttl,
            fairness: config.fairness,
            wait_replicas: config.redis.wait_replicas,
            wait_timeout: config.redis.wait_timeout,
            checkout: crate::buy::Checkout::new(
                config.handoff_secret.as_deref(),
                config.gateway.handoff_ttl,
            ),
        },
        SystemClock,
    );
    let shop_cache = config.shop.cache.enabled.then(|| {
        Arc::new(crate::edge::ShopCache::new(
            &config.shop.cache,
            &metrics.registry,
        ))
    });
    let rooms = crate::edge::WaitingRooms::new(&config, &metrics.registry)?.map(Arc::new);
    let gateway = Gateway {
        shop_cache,
        rooms,
        admission,
        buy,
        challenge,
        sales,
        redis,
        orders,
        routes: Routes::from_config(&config.gateway),
        pages: Arc::new(pages),
        shop: Upstreams::new(&config.shop, metrics.shop_resolve_failures.clone())?,
        metrics,
        switches,
        certs: None,
        config,
    };
    Ok((gateway, forward_worker))
}

/// Each connection's read buffer: room for a whole TLS 1.3 record (16 KiB
/// of data, its 5-byte header and at most 256 bytes of expansion).
/// Pingora's default, 64 KiB, is zeroed for every new connection: in the
/// opening second of a sale, when the crowd connects at once, that was
/// 2–3% of a TLS handshake's CPU in its profile (bench row l'), and
/// 100,000 open connections would hold 6.5 GB of it (1.7 GB now).
const READ_BUFFER_BYTES: usize = 17 * 1024;

/// Each connection's write buffer. Pingora flushes an answer with a
/// `Content-Length` only once it is complete, so a head and a body that
/// fit leave in one send; Pingora's default, one MSS (1,460 bytes), sent
/// the sale page (6.7 KB) as two: the head alone, then the body past the
/// buffer. The cost: such an answer that the shop sends slowly reaches
/// the buyer up to this much at a time (chunked answers are flushed piece
/// by piece whatever the size). 16 KiB is one of the allocator's size
/// classes, and a full TLS record (larger) goes straight to the socket.
/// Once filled it stays: 100,000 connections can hold 1.6 GB of it.
const WRITE_BUFFER_BYTES: usize = 16 * 1024;

/// Both listeners' L4 buffers.
fn l4_buffers() -> L4BufferSettings {
    L4BufferSettings::new(READ_BUFFER_BYTES, WRITE_BUFFER_BYTES)
}

/// Runs the gateway until SIGTERM (graceful), SIGINT (immediate) or
/// SIGQUIT (hand the sockets to a new process started with `upgrade`);
/// SIGHUP reloads what the watchers reload ([`crate::admission::Hangup`]).
///
/// # Errors
/// When the gateway cannot be built.
pub fn run(config: Config, config_path: &std::path::Path, upgrade: bool) -> anyhow::Result<()> {
    // `redis.ca_file` is read now: a bad one stops the start with its key,
    // not every connection afterwards.
    if let Some(certificates) = flashgate_common::redis_conn::check_ca_file(&config.redis)? {
        tracing::info!(
            certificates,
            "redis: trusting the CA certificates of redis.ca_file besides the system's"
        );
    }
    let config = Arc::new(config);
    let (mut gateway, forward_worker) = build_gateway(config.clone())?;
    // Read and checked before anything listens: a bad file stops the start
    // with the key that names it.
    let certs = config
        .gateway
        .tls
        .as_ref()
        .map(CertSet::load)
        .transpose()?
        .map(|set| Arc::new(ArcSwap::from_pointee(set)));
    gateway.certs.clone_from(&certs);
    let (hangup, requests) = Hangup::new();
    let watcher = ConfigWatcher {
        path: config_path.to_owned(),
        edge: gateway.admission.edge.clone(),
        interval: std::time::Duration::from_secs(1),
        requests: requests.clone(),
    };
    // Checked before the server exists: the upgrade socket must not be
    // somewhere another user can reach first.
    crate::infra::prepare_runtime_dir(&config.gateway.runtime_dir)?;
    let paths = RuntimePaths::new(&config.gateway.runtime_dir, config.gateway.listen.port());
    let conf = ServerConf {
        threads: config.gateway.threads,
        pid_file: paths.pid_file.to_string_lossy().into_owned(),
        upgrade_sock: paths.upgrade_sock.to_string_lossy().into_owned(),
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(5),
        ..ServerConf::default()
    };
    let opt = Opt {
        upgrade,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    let events = EventListener {
        redis: config.redis.clone(),
        // Its own connection, on its runtime: the buys' one stays on the
        // proxy's (a sale change announced before the first buy would
        // otherwise make it here).
        client: Arc::new(gateway.redis.sibling()),
        sales: gateway.sales.clone(),
        switches: gateway.switches.clone(),
        shop_cache: gateway
            .shop_cache
            .clone()
            .map(|cache| cache as Arc<dyn AnnouncedPurges>),
    };
    let switch_watcher = SwitchWatcher {
        redis: config.redis.clone(),
        switches: gateway.switches.clone(),
        backlog_threshold: config.gateway.backlog_pause_threshold,
        interval: config.gateway.backlog_check,
        timeout: config.redis.timeout,
    };
    let pages_watcher = PagesWatcher {
        pages: gateway.pages.clone(),
        interval: config.pages.reload_interval,
        requests: requests.clone(),
    };
    let shop_health = pingora::services::background::GenBackgroundService::new(
        "BG shop health check".into(),
        gateway.shop.lb.clone(),
    );
    let readiness = Arc::new(Readiness::default());
    let dependencies = DependencyWatcher {
        redis: config.redis.clone(),
        timeout: config.redis.timeout,
        orders: gateway.orders.clone(),
        readiness: readiness.clone(),
    };
    let admin = AdminServer {
        listen: config.gateway.admin_listen,
        metrics: gateway.metrics.clone(),
        breaker: gateway.redis.breaker.clone(),
        readiness,
        rooms: crate::edge::RoomsApi {
            rooms: gateway.rooms.clone(),
            admin_token: config.admin_token.as_deref().map(Arc::from),
            redis: config.redis.clone(),
        },
        purge: crate::edge::PurgeApi {
            cache: gateway.shop_cache.clone(),
            admin_token: config.admin_token.as_deref().map(Arc::from),
            redis: config.redis.clone(),
        },
    };
    let (tls_reloads, tls_expiry, tls_failing) = (
        gateway.metrics.tls_reloads.clone(),
        gateway.metrics.tls_certificate_expiry.clone(),
        gateway.metrics.tls_reload_failing.clone(),
    );
    // HTTP/1.1 connections get the idle timeout per request (keepalive);
    // HTTP/2 ones only through this option, or an idle client would hold
    // its connection forever.
    let mut options = HttpServerOptions::default();
    options.h2_idle_timeout = Some(config.gateway.keepalive);
    let jwks = gateway.admission.verifier.jwks();
    let gateway_rooms = gateway.rooms.clone();
    let mut proxy = pingora::proxy::http_proxy(&server.configuration, gateway);
    proxy.server_options = Some(options);
    let mut service = pingora::services::listening::Service::new(
        "flashgate proxy".into(),
        crate::edge::CoalescedApp::new(proxy),
    );
    service.add_listener(
        ListenerConfig::tcp(config.gateway.listen.to_string()).l4_buffer(l4_buffers()),
    );
    if let (Some(tls), Some(certs)) = (&config.gateway.tls, certs) {
        let settings = crate::edge::listener_settings(certs.clone())
            .map_err(|e| anyhow::anyhow!("gateway.tls: {e}"))?;
        service.add_listener(
            ListenerConfig::tcp(tls.listen.to_string())
                .tls(settings)
                .l4_buffer(l4_buffers()),
        );
        let watcher = CertWatcher {
            config: tls.clone(),
            certs,
            reloads: tls_reloads,
            expiry: tls_expiry,
            failing: tls_failing,
            requests,
        };
        server.add_service(pingora::services::background::background_service(
            "TLS certificate watcher",
            watcher,
        ));
        tracing::info!(listen = %tls.listen, redirect_http = tls.redirect_http, "flashgate listening for HTTPS (HTTP/2 and HTTP/1.1)");
    }
    server.add_service(service);
    if let Some(jwks) = jwks {
        server.add_service(pingora::services::background::background_service(
            "jwks refresher",
            Background(JwksRefresher(jwks)),
        ));
    }
    server.add_service(pingora::services::background::background_service(
        "winner forwarder",
        Background(forward_worker),
    ));
    server.add_service(pingora::services::background::background_service(
        "admin listener",
        admin,
    ));
    server.add_service(pingora::services::background::background_service(
        "dependencies",
        Background(dependencies),
    ));
    server.add_service(pingora::services::background::background_service(
        "switches",
        Background(switch_watcher),
    ));
    server.add_service(pingora::services::background::background_service(
        "sale events",
        Background(events),
    ));
    server.add_service(pingora::services::background::background_service(
        "config watcher",
        Background(watcher),
    ));
    server.add_service(pingora::services::background::background_service(
        "static pages watcher",
        pages_watcher,
    ));
    server.add_service(shop_health);
    if let Some(rooms) = gateway_rooms {
        server.add_service(pingora::services::background::background_service(
            "waiting rooms",
            Background(crate::edge::RoomTicker {
                rooms,
                redis: config.redis.clone(),
            }),
        ));
    }
    // Added last, so started first (Pingora starts the last added first):
    // SIGHUP stops ending the process as early as it can.
    server.add_service(pingora::services::background::background_service(
        "SIGHUP reload",
        Background(hangup),
    ));
    if config.limits.buy.user.is_none()
        && config.limits.buy.ip.is_none()
        && config.limits.buy.global.is_none()
    {
        tracing::warn!(
            "no [limits.buy] bucket is configured: buys are not rate-limited (see docs/CONFIG.md)"
        );
    }
    let shop: Vec<String> = config
        .shop
        .upstreams
        .iter()
        .map(ToString::to_string)
        .collect();
    tracing::info!(listen = %config.gateway.listen, ?shop, "flashgate listening");
    server.run_forever()
}
