//! Starting and stopping the backend.
//!
//! The backend starts in any order with Redis and the database: it checks
//! its configuration, listens on both ports at once, and then waits for
//! its dependencies (see [`crate::readiness`]) while every API route
//! answers `503 unavailable` and `GET /ready` says what is awaited:
//!
//! 1. the database: connect, create the schema, run the migrations;
//! 2. Redis: connect, then `PING` until it answers (not `LOADING`);
//! 3. the sales declared in the file: written to the database only if
//!    absent, then preheated into Redis only if absent.
//!
//! Each step retries with capped exponential backoff and jitter and logs
//! once per change of state. Then the APIs open, and the consumers, the
//! background loops (restoring sales Redis lost, payment timeouts, the
//! metrics' sale gauges, reconciliation) and the dependency monitor start. Nothing a dependency
//! does after that stops the process: readiness flips while it is away and
//! the loops pause. On SIGTERM or Ctrl-C the listeners stop accepting and
//! finish in-flight requests, the consumers finish their current batch,
//! and [`run`] returns `Ok`.

use std::sync::{Arc, OnceLock};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use flashgate_common::backoff::Backoff;
use flashgate_common::config::{Config, ENV_INTERNAL_TOKEN, ENV_SHOP_TOKEN};
use flashgate_common::dependency::{ping_redis, DepState};
use flashgate_common::redis_conn::RedisHandle;
use flashgate_common::secret;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::api::auth::{ApiTokens, TokenError};
use crate::api::error::ApiError;
use crate::api::{admin_router, order_router, AppState};
use crate::readiness::{self, sleep_or_stop, store_state, Readiness};
use crate::sales::{self, Preheat};
use crate::store::{Store, StoreError};
use crate::stream::consumer;

/// Why the backend could not start (configuration, not dependencies: those
/// are waited for).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "FLASHGATE_ADMIN_TOKEN is not set: the backend refuses to start with an open admin API"
    )]
    NoAdminToken,
    #[error("an order API token is empty: the backend refuses to start with an open order API")]
    NoApiToken,
    #[error("{0}: the backend refuses to start with a guessable order API token")]
    Secret(#[from] flashgate_common::secret::SecretError),
    #[error("sale `{sale}` declares stock {stock}, below the {sold} orders the database holds")]
    StockBelowSold { sale: String, stock: i64, sold: i64 },
    #[error("sales[{index}].buckets: sale `{sale}` was saved with {saved} bucket(s), the file declares {declared}; a saved sale's bucket count cannot change")]
    BucketsChanged {
        index: usize,
        sale: String,
        saved: u32,
        declared: u32,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Events(#[from] crate::events::EventsError),
    #[error(transparent)]
    RedisCaFile(#[from] flashgate_common::redis_conn::CaFileError),
}

impl From<TokenError> for StartError {
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::NoAdminToken => StartError::NoAdminToken,
            TokenError::NoApiToken => StartError::NoApiToken,
        }
    }
}

/// Runs the backend until SIGTERM or Ctrl-C.
///
/// # Errors
/// Any [`StartError`] at start; a listener failing while serving.
pub async fn run(config: Config) -> Result<(), StartError> {
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop.send(true);
    });
    run_until(config, stopped).await
}

/// Runs the backend until `shutdown` turns true (what [`run`] does with
/// the process signals; tests drive it directly).
///
/// # Errors
/// See [`run`].
pub async fn run_until(config: Config, shutdown: watch::Receiver<bool>) -> Result<(), StartError> {
    let token = config
        .admin_token
        .clone()
        .filter(|t| !t.is_empty())
        .ok_or(StartError::NoAdminToken)?;
    let tokens = ApiTokens::new(
        &token,
        secret::required(ENV_INTERNAL_TOKEN, config.internal_token.as_deref())?,
        secret::required(ENV_SHOP_TOKEN, config.shop_token.as_deref())?,
    )?;
    // `redis.ca_file` likewise: read now, a bad one stops the start.
    if let Some(certificates) = flashgate_common::redis_conn::check_ca_file(&config.redis)? {
        tracing::info!(
            certificates,
            "redis: trusting the CA certificates of redis.ca_file besides the system's"
        );
    }
    // Order event destinations: `events.ca_file` is read now, so a bad one
    // stops the backend before it waits for anything.
    let destinations = config
        .events
        .enabled()
        .then(|| crate::events::Destinations::new(&config.events))
        .transpose()?;
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let orders = bind(config.backend.listen).await?;
    let admin = bind(config.backend.admin_listen).await?;
    tracing::info!(orders = %config.backend.listen, admin = %config.backend.admin_listen, "backend listening; waiting for its dependencies");

    // One stop signal for the listeners: the caller's shutdown, or a fatal
    // error while starting.
    let (stop, stopping) = watch::channel(false);
    let forward = stop.clone();
    let mut outer = shutdown.clone();
    tokio::spawn(async move {
        let _ = outer.wait_for(|s| *s).await;
        let _ = forward.send(true);
    });

    let readiness = Readiness::default();
    let order_api = Arc::new(OnceLock::new());
    let admin_api = Arc::new(OnceLock::new());
    let probes = Router::new()
        .route("/live", get(readiness::live))
        .route("/ready", get(readiness::ready))
        .with_state(readiness.clone());
    let serve = |listener, router: Router, mut stopping: watch::Receiver<bool>| {
        axum::serve(listener, router).with_graceful_shutdown(async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        })
    };
    let work = async {
        let result = start_and_run(
            &config,
            &tokens,
            destinations,
            &readiness,
            &order_api,
            &admin_api,
            shutdown.clone(),
        )
        .await;
        if result.is_err() {
            let _ = stop.send(true);
        }
        result
    };
    let (orders, admin, work) = tokio::join!(
        serve(
            orders,
            probes.fallback(gate(order_api.clone())),
            stopping.clone()
        ),
        serve(
            admin,
            Router::new().fallback(gate(admin_api.clone())),
            stopping.clone()
        ),
        work,
    );
    work?;
    orders.and(admin).map_err(StartError::Serve)
}

/// The future of a gated request.
type BoxedResponse = std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>;

/// A fallback that hands every request to the API in `cell` once it is
/// set, and answers `503 unavailable` until then.
fn gate(cell: Arc<OnceLock<Router>>) -> impl Fn(Request) -> BoxedResponse + Clone {
    move |request: Request| {
        let api = cell.get().cloned();
        Box::pin(async move {
            match api {
                Some(api) => match api.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                },
                None => {
                    let mut response = ApiError::unavailable(
                        "the backend is starting: waiting for its dependencies (see GET /ready)",
                    )
                    .into_response();
                    response
                        .headers_mut()
                        .insert("retry-after", axum::http::HeaderValue::from_static("1"));
                    response
                }
            }
        })
    }
}

/// Waits for the dependencies, opens the APIs, runs the background work
/// until `shutdown`. `Ok` on a shutdown at any point.
async fn start_and_run(
    config: &Config,
    tokens: &ApiTokens,
    destinations: Option<crate::events::Destinations>,
    readiness: &Readiness,
    order_api: &OnceLock<Router>,
    admin_api: &OnceLock<Router>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), StartError> {
    let Some(store) = connect_store(&config.backend.database_url, readiness, &mut shutdown).await
    else {
        return Ok(());
    };
    let store = store.with_order_events(config.events.enabled());
    let Some(redis) = connect_redis(config, readiness, &mut shutdown).await else {
        store.close().await;
        return Ok(());
    };
    let state = AppState::new(
        store.clone(),
        redis.clone(),
        tokens.clone(),
        config.gateway.idempotency_ttl,
    );
    if !preheat_declared(
        config,
        &store,
        &redis,
        &state.fence,
        readiness,
        &mut shutdown,
    )
    .await?
    {
        store.close().await;
        return Ok(());
    }

    let settings = consumer::Settings {
        readiness: Some(readiness.clone()),
        ..consumer::Settings::new(&config.redis, &config.backend, state.metrics.clone())
    };
    // Order events to the shop, when a destination is configured.
    let deliverer = destinations.map(|d| {
        crate::events::Deliverer::with_destinations(
            store.clone(),
            d,
            &config.events,
            state.metrics.events.clone(),
        )
    });
    let _ = order_api.set(order_router(state.clone()));
    let _ = admin_api.set(admin_router(state.clone()));
    tracing::info!("backend ready");

    let consumers = tokio::spawn(consumer::run(store.clone(), settings, shutdown.clone()));
    let events = deliverer.map(|d| tokio::spawn(d.run(readiness.clone(), shutdown.clone())));
    let backend = &config.backend;
    let background = [
        tokio::spawn(readiness::monitor(
            readiness.clone(),
            store.clone(),
            redis.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::recovery::watch(
            redis.clone(),
            store.clone(),
            backend.restore_poll,
            state.fence.clone(),
            readiness.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::timeout::run(
            redis.clone(),
            store.clone(),
            backend.expiry_poll,
            state.orders_expired.clone(),
            readiness.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::metrics::run_refresh(
            redis.clone(),
            store.clone(),
            state.metrics.clone(),
            crate::metrics::REFRESH_INTERVAL,
            shutdown.clone(),
        )),
        tokio::spawn(crate::reconcile::run(
            redis.clone(),
            store.clone(),
            backend.reconcile_interval,
            state.drift.clone(),
            readiness.clone(),
            shutdown.clone(),
        )),
    ];
    let _ = shutdown.wait_for(|s| *s).await;
    if let Err(error) = consumers.await {
        tracing::error!(%error, "stream consumers panicked");
    }
    for task in background.into_iter().chain(events) {
        if let Err(error) = task.await {
            tracing::error!(%error, "a background loop panicked");
        }
    }
    store.close().await;
    Ok(())
}

/// Connects to the database and migrates it, retrying until it works;
/// `None` on shutdown.
async fn connect_store(
    url: &str,
    readiness: &Readiness,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Store> {
    let mut backoff = Backoff::default();
    loop {
        match Store::connect(url).await {
            Ok(store) => {
                readiness.database().ready();
                return Some(store);
            }
            Err(error) => readiness.database().observe(store_state(&error), &error),
        }
        if sleep_or_stop(backoff.next_wait(), shutdown).await {
            return None;
        }
    }
}

/// Connects to Redis and waits until it answers `PING` (a Redis loading
/// its dataset answers `LOADING`: not yet); `None` on shutdown.
async fn connect_redis(
    config: &Config,
    readiness: &Readiness,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<RedisHandle> {
    let mut backoff = Backoff::default();
    let mut conn = None;
    loop {
        if conn.is_none() {
            match crate::redis_io::shared_connection(&config.redis).await {
                Ok(c) => conn = Some(c),
                Err(error) => readiness.redis().redis_failed(&error),
            }
        }
        if let Some(c) = conn.as_mut() {
            match ping_redis(c).await {
                Ok(()) => {
                    readiness.redis().ready();
                    return conn;
                }
                Err(error) => readiness.redis().redis_failed(&error),
            }
        }
        if sleep_or_stop(backoff.next_wait(), shutdown).await {
            return None;
        }
    }
}

/// Why one declared sale is not preheated yet.
enum PreheatFailure {
    /// The database failed; try again.
    Database(StoreError),
    /// Redis failed (or is loading again); try again.
    Redis(redis::RedisError),
    /// Something else is not there yet; try again.
    Retry(DepState, String),
    Fatal(StartError),
}

/// Writes the sales declared in the file to the database (only if absent)
/// and preheats them into Redis (only if absent), retrying what a
/// dependency makes fail. `Ok(false)` on shutdown.
async fn preheat_declared(
    config: &Config,
    store: &Store,
    redis: &RedisHandle,
    fence: &crate::fence::Resyncer,
    readiness: &Readiness,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<bool, StartError> {
    let mut backoff = Backoff::default();
    for (index, declared) in config.sales.iter().enumerate() {
        loop {
            // What failed is recorded on the dependency too, so `/ready`
            // never shows it ready beside the sales failing because of it.
            match preheat_one(config, store, &mut redis.clone(), fence, index, declared).await {
                Ok(()) => {
                    readiness.database().ready();
                    readiness.redis().ready();
                    break;
                }
                Err(PreheatFailure::Fatal(error)) => return Err(error),
                Err(PreheatFailure::Database(error)) => {
                    let state = store_state(&error);
                    readiness.database().observe(state, &error);
                    readiness
                        .sales()
                        .observe(state, format_args!("sale `{}`: {error}", declared.id));
                }
                Err(PreheatFailure::Redis(error)) => {
                    readiness.redis().redis_failed(&error);
                    let state = flashgate_common::dependency::redis_state(&error);
                    readiness.sales().observe(
                        state,
                        format_args!("sale `{}`: redis: {error}", declared.id),
                    );
                }
                Err(PreheatFailure::Retry(state, error)) => {
                    readiness
                        .sales()
                        .observe(state, format_args!("sale `{}`: {error}", declared.id));
                }
            }
            if sleep_or_stop(backoff.next_wait(), shutdown).await {
                return Ok(false);
            }
        }
    }
    readiness.sales().ready();
    Ok(true)
}

async fn preheat_one(
    config: &Config,
    store: &Store,
    redis: &mut RedisHandle,
    fence: &crate::fence::Resyncer,
    index: usize,
    declared: &flashgate_common::sale::SaleSpec,
) -> Result<(), PreheatFailure> {
    let db = PreheatFailure::Database;
    if store.sales().insert_if_absent(declared).await.map_err(db)? {
        if let Some(timeout) = config.payment_timeouts.get(&declared.id) {
            store
                .sales()
                .set_payment_timeout(&declared.id, timeout.as_secs() as i64)
                .await
                .map_err(db)?;
        }
        tracing::info!(sale = %declared.id, "sale from the configuration file written to the database");
    }
    // The row, not the file, is the truth once written.
    let spec = store
        .sales()
        .get(&declared.id)
        .await
        .map_err(db)?
        .unwrap_or_else(|| declared.clone());
    // Gateways and backends must agree on where a sale's items are: a saved
    // sale's bucket count never changes, and the file saying otherwise is
    // refused rather than silently ignored.
    if spec.buckets != declared.buckets {
        return Err(PreheatFailure::Fatal(StartError::BucketsChanged {
            index,
            sale: spec.id,
            saved: spec.buckets,
            declared: declared.buckets,
        }));
    }
    match sales::preheat_from_store(redis, store, &spec).await {
        Ok(Preheat::Loaded { remaining }) => {
            tracing::info!(sale = %spec.id, remaining, "sale preheated")
        }
        Ok(Preheat::AlreadyThere) => {
            tracing::info!(sale = %spec.id, "sale already in redis; left as is")
        }
        Ok(Preheat::StockBelowSold { sold }) => {
            return Err(PreheatFailure::Fatal(StartError::StockBelowSold {
                sale: spec.id,
                stock: spec.stock,
                sold,
            }))
        }
        Err(crate::error::SaleError::Redis(error)) => return Err(PreheatFailure::Redis(error)),
        Err(crate::error::SaleError::Store(error)) => return Err(PreheatFailure::Database(error)),
        // Another backend is restoring it: once it is done the next try
        // finds it loaded; if that backend dies, its lock expires and this
        // one restores it.
        Err(crate::error::SaleError::Restoring) => {
            return Err(PreheatFailure::Retry(
                DepState::Starting,
                "another backend is loading the sale".into(),
            ))
        }
        // Fail closed, without blocking the start: the sale answers 503.
        Err(crate::error::SaleError::LeftAbsent) => {
            tracing::error!(sale = %spec.id, "bucketed sale lost by redis cannot be restored in phase 1; left absent");
            return Ok(());
        }
        Err(error) => return Err(PreheatFailure::Retry(DepState::Failing, error.to_string())),
    }
    // A sale just installed is fenced, and one already there may be (this
    // start may follow a failover): it sells once re-synced.
    match fence.resync(redis, store, &spec.id).await {
        Ok(_) => Ok(()),
        Err(crate::error::SaleError::Redis(error)) => Err(PreheatFailure::Redis(error)),
        Err(crate::error::SaleError::Store(error)) => Err(PreheatFailure::Database(error)),
        Err(error) => Err(PreheatFailure::Retry(DepState::Failing, error.to_string())),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flashgate_common::config::{Config, Env};
    use flashgate_common::keys::SaleKeys;
    use redis::AsyncCommands;

    use super::*;
    use crate::testing::{sqlite_url, unique, RedisServer};

    /// An admin token long enough to be accepted (32 bytes at least).
    const ADMIN_TOKEN: &str = "backend-test-admin-token-0123456789";
    const INTERNAL: &str = "internal-token-of-the-backend-tests-0123";
    const SHOP: &str = "shop-token-of-the-backend-tests-012345678";

    /// The admin token given, and the order API tokens (`None`: unset).
    struct Token(
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
    );
    impl Env for Token {
        fn var(&self, name: &str) -> Option<String> {
            use flashgate_common::config::ENV_ADMIN_TOKEN;
            let value = match name {
                ENV_ADMIN_TOKEN => self.0,
                ENV_INTERNAL_TOKEN => self.1,
                ENV_SHOP_TOKEN => self.2,
                _ => None,
            };
            value.map(str::to_owned)
        }
    }

    fn config(
        redis: &RedisServer,
        db: &str,
        sale: &str,
        token: Option<&'static str>,
        now_ms: i64,
    ) -> Config {
        config_with(
            redis,
            db,
            sale,
            &Token(token, Some(INTERNAL), Some(SHOP)),
            now_ms,
        )
    }

    fn config_with(redis: &RedisServer, db: &str, sale: &str, env: &Token, now_ms: i64) -> Config {
        let text = format!(
            "[redis]\nurl = \"{}\"\n[backend]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndatabase_url = \"{db}\"\nblock_ms = 100\n\
             [[sales]]\nid = \"{sale}\"\nname = \"x\"\nstock = 10\nduration_seconds = 3600\n",
            redis.url
        );
        Config::from_toml_str(&text, env, now_ms).unwrap()
    }

    #[tokio::test]
    async fn the_backend_refuses_to_start_without_order_api_tokens_of_32_bytes() {
        let redis = RedisServer::start().await;
        let cases = [
            (
                Token(Some(ADMIN_TOKEN), None, Some(SHOP)),
                ENV_INTERNAL_TOKEN,
            ),
            (
                Token(Some(ADMIN_TOKEN), Some(INTERNAL), None),
                ENV_SHOP_TOKEN,
            ),
            (
                Token(Some(ADMIN_TOKEN), Some("short"), Some(SHOP)),
                ENV_INTERNAL_TOKEN,
            ),
            (
                Token(Some(ADMIN_TOKEN), Some(INTERNAL), Some(&SHOP[..31])),
                ENV_SHOP_TOKEN,
            ),
        ];
        for (env, name) in cases {
            let (_stop, stopped) = watch::channel(false);
            let err = run_until(config_with(&redis, &sqlite_url(), "s", &env, 0), stopped)
                .await
                .unwrap_err();
            assert!(matches!(err, StartError::Secret(_)), "{err}");
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    /// Runs the backend briefly, then shuts it down; it must exit cleanly.
    async fn run_briefly(config: Config) {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run_until(config, stopped));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!task.is_finished(), "{:?}", task.await);
        stop.send(true).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
        result.unwrap();
    }

    #[tokio::test]
    async fn a_redis_failure_while_preheating_is_reported_on_redis_not_only_on_the_sales() {
        let redis = RedisServer::start().await;
        let config = config(
            &redis,
            &sqlite_url(),
            &unique("s"),
            Some(ADMIN_TOKEN),
            flashgate_common::now_ms(),
        );
        let store = Store::connect(&config.backend.database_url).await.unwrap();
        let conn = crate::redis_io::shared_connection(&config.redis)
            .await
            .unwrap();
        let readiness = Readiness::default();
        // As the start leaves it: both answered, then Redis goes away
        // before the declared sale is preheated.
        readiness.database().ready();
        readiness.redis().ready();
        drop(redis);
        let (stop, mut stopped) = watch::channel(false);
        let task = {
            let readiness = readiness.clone();
            let fence = crate::fence::Resyncer::new(
                Duration::from_secs(600),
                prometheus::IntCounter::new("s", "s").unwrap(),
            );
            tokio::spawn(async move {
                preheat_declared(&config, &store, &conn, &fence, &readiness, &mut stopped).await
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while readiness.sales().state() == DepState::Starting {
            assert!(
                std::time::Instant::now() < deadline,
                "preheating never failed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(readiness.redis().state(), DepState::Unreachable);
        assert_eq!(readiness.database().state(), DepState::Ready);
        assert!(
            !readiness.dependencies_ready(),
            "the background loops wait for Redis"
        );
        stop.send(true).unwrap();
        let preheated = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap();
        assert!(!preheated.unwrap());
    }

    #[tokio::test]
    async fn the_backend_refuses_to_start_without_an_admin_token() {
        let redis = RedisServer::start().await;
        let config = config(&redis, &sqlite_url(), "s", None, 0);
        let (_stop, stopped) = watch::channel(false);
        let err = run_until(config, stopped).await.unwrap_err();
        assert!(matches!(err, StartError::NoAdminToken));
        assert!(err.to_string().contains("FLASHGATE_ADMIN_TOKEN"));
    }

    #[tokio::test]
    async fn a_backend_starts_while_another_restores_its_sale_and_the_sale_is_then_loaded() {
        let redis = RedisServer::start().await;
        let sale = unique("s");
        let keys = SaleKeys::new(&sale);
        let mut conn = redis.conn().await;
        // Another backend, started at the same moment on the empty Redis,
        // holds the restore lock.
        let () = conn.set(&keys.restoring, "another-backend").await.unwrap();
        let mut config = config(
            &redis,
            &sqlite_url(),
            &sale,
            Some(ADMIN_TOKEN),
            flashgate_common::now_ms(),
        );
        config.backend.restore_poll = Duration::from_millis(50);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run_until(config, stopped));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!task.is_finished(), "{:?}", task.await);
        // That backend goes away; this one's restore loop loads the sale.
        let () = conn.del(&keys.restoring).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !conn.exists::<_, bool>(&keys.meta).await.unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the sale was never loaded"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(conn.get::<_, i64>(&keys.remaining).await.unwrap(), 10);
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops on shutdown")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn restarting_never_resets_a_running_sale_or_moves_its_window() {
        let redis = RedisServer::start().await;
        let db = sqlite_url();
        let sale = unique("s");
        let first_start = flashgate_common::now_ms();
        run_briefly(config(&redis, &db, &sale, Some(ADMIN_TOKEN), first_start)).await;

        let keys = SaleKeys::new(&sale);
        let mut conn = redis.conn().await;
        let remaining: i64 = conn.get(&keys.remaining).await.unwrap();
        assert_eq!(remaining, 10, "preheated at first start");
        let () = conn.decr(&keys.remaining, 4).await.unwrap();

        // A later start whose file leaves starts_at to "now".
        run_briefly(config(
            &redis,
            &db,
            &sale,
            Some(ADMIN_TOKEN),
            first_start + 60_000,
        ))
        .await;
        let remaining: i64 = conn.get(&keys.remaining).await.unwrap();
        assert_eq!(remaining, 6, "a restart must not reset the stock");
        let starts: i64 = conn.hget(&keys.meta, "starts_at_ms").await.unwrap();
        assert_eq!(starts, first_start);
        let store = Store::connect(&db).await.unwrap();
        assert_eq!(
            store
                .sales()
                .get(&sale)
                .await
                .unwrap()
                .unwrap()
                .starts_at_ms,
            first_start
        );
    }
}
