//! Starting and stopping the backend.
//!
//! Start order: database (schema), Redis, the sales declared in the file
//! (written to the database only if absent, then preheated into Redis only
//! if absent), then the consumers, the background loops (restoring sales
//! Redis lost, payment timeouts, the metrics' sale gauges, reconciliation)
//! and both listeners. On SIGTERM or Ctrl-C
//! the listeners stop accepting and finish in-flight requests, the
//! consumers finish their current batch, and [`run`] returns `Ok`.

use flashgate_common::config::{Config, ENV_INTERNAL_TOKEN, ENV_SHOP_TOKEN};
use flashgate_common::secret;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::auth::ApiTokens;
use crate::api::{admin_router, order_router, AppState};
use crate::sales::{self, Preheat};
use crate::store::{Store, StoreError};
use crate::stream::consumer;

/// Why the backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("FLASHGATE_ADMIN_TOKEN is not set: the backend refuses to start with an open admin API")]
    NoAdminToken,
    #[error("an order API token is empty: the backend refuses to start with an open order API")]
    NoApiToken,
    #[error("{0}: the backend refuses to start with a guessable order API token")]
    Secret(#[from] flashgate_common::secret::SecretError),
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("redis at {url}: {source}")]
    Redis { url: String, source: redis::RedisError },
    #[error("preheating sale `{sale}`: {source}")]
    Preheat { sale: String, source: sales::SaleError },
    #[error("sale `{sale}` declares stock {stock}, below the {sold} orders the database holds")]
    StockBelowSold { sale: String, stock: i64, sold: i64 },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("server error: {0}")]
    Serve(#[source] std::io::Error),
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
    let token = config.admin_token.clone().filter(|t| !t.is_empty()).ok_or(StartError::NoAdminToken)?;
    let tokens = ApiTokens::new(
        &token,
        secret::required(ENV_INTERNAL_TOKEN, config.internal_token.as_deref())?,
        secret::required(ENV_SHOP_TOKEN, config.shop_token.as_deref())?,
    )?;
    let store = Store::connect(&config.backend.database_url).await?;
    let redis_err = |source| StartError::Redis { url: config.redis.url.clone(), source };
    let mut redis = crate::redis_io::shared_connection(&config.redis).await.map_err(redis_err)?;

    for declared in &config.sales {
        if store.insert_sale_if_absent(declared).await? {
            if let Some(timeout) = config.payment_timeouts.get(&declared.id) {
                store.set_payment_timeout(&declared.id, timeout.as_secs() as i64).await?;
            }
            tracing::info!(sale = %declared.id, "sale from the configuration file written to the database");
        }
        // The row, not the file, is the truth once written.
        let spec = store.sale(&declared.id).await?.unwrap_or_else(|| declared.clone());
        match sales::preheat_from_store(&mut redis, &store, &spec).await {
            Ok(Preheat::Loaded { remaining }) => tracing::info!(sale = %spec.id, remaining, "sale preheated"),
            Ok(Preheat::AlreadyThere) => tracing::info!(sale = %spec.id, "sale already in redis; left as is"),
            Ok(Preheat::StockBelowSold { sold }) => {
                return Err(StartError::StockBelowSold { sale: spec.id, stock: spec.stock, sold })
            }
            Err(source) => return Err(StartError::Preheat { sale: spec.id, source }),
        }
    }

    let state = AppState::new(store.clone(), redis.clone(), tokens);
    let bind = |addr| async move { TcpListener::bind(addr).await.map_err(|source| StartError::Bind { addr, source }) };
    let orders = bind(config.backend.listen).await?;
    let admin = bind(config.backend.admin_listen).await?;
    tracing::info!(orders = %config.backend.listen, admin = %config.backend.admin_listen, "backend listening");

    let settings = consumer::Settings { metrics: state.metrics.clone(), ..consumer::Settings::new(&config.redis, &config.backend) };
    let consumers = tokio::spawn(consumer::run(store.clone(), settings, shutdown.clone()));
    let backend = &config.backend;
    let background = [
        tokio::spawn(crate::recovery::watch(redis.clone(), store.clone(), backend.restore_poll, shutdown.clone())),
        tokio::spawn(crate::timeout::run(
            redis.clone(),
            store.clone(),
            backend.expiry_poll,
            state.orders_expired.clone(),
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
            shutdown.clone(),
        )),
    ];
    let serve = |listener, router: axum::Router, mut shutdown: watch::Receiver<bool>| {
        axum::serve(listener, router).with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
    };
    let (orders, admin) = tokio::join!(
        serve(orders, order_router(state.clone()), shutdown.clone()),
        serve(admin, admin_router(state), shutdown.clone()),
    );
    if let Err(error) = consumers.await {
        tracing::error!(%error, "stream consumers panicked");
    }
    for task in background {
        if let Err(error) = task.await {
            tracing::error!(%error, "a background loop panicked");
        }
    }
    store.close().await;
    orders.and(admin).map_err(StartError::Serve)
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

    const INTERNAL: &str = "internal-token-of-the-backend-tests-0123";
    const SHOP: &str = "shop-token-of-the-backend-tests-012345678";

    /// The admin token given, and the order API tokens (`None`: unset).
    struct Token(Option<&'static str>, Option<&'static str>, Option<&'static str>);
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

    fn config(redis: &RedisServer, db: &str, sale: &str, token: Option<&'static str>, now_ms: i64) -> Config {
        config_with(redis, db, sale, &Token(token, Some(INTERNAL), Some(SHOP)), now_ms)
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
            (Token(Some("t"), None, Some(SHOP)), ENV_INTERNAL_TOKEN),
            (Token(Some("t"), Some(INTERNAL), None), ENV_SHOP_TOKEN),
            (Token(Some("t"), Some("short"), Some(SHOP)), ENV_INTERNAL_TOKEN),
            (Token(Some("t"), Some(INTERNAL), Some(&SHOP[..31])), ENV_SHOP_TOKEN),
        ];
        for (env, name) in cases {
            let (_stop, stopped) = watch::channel(false);
            let err = run_until(config_with(&redis, &sqlite_url(), "s", &env, 0), stopped).await.unwrap_err();
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
        let result = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops on shutdown").unwrap();
        result.unwrap();
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
    async fn restarting_never_resets_a_running_sale_or_moves_its_window() {
        let redis = RedisServer::start().await;
        let db = sqlite_url();
        let sale = unique("s");
        let first_start = flashgate_common::now_ms();
        run_briefly(config(&redis, &db, &sale, Some("t"), first_start)).await;

        let keys = SaleKeys::new(&sale);
        let mut conn = redis.conn().await;
        let remaining: i64 = conn.get(&keys.remaining).await.unwrap();
        assert_eq!(remaining, 10, "preheated at first start");
        let () = conn.decr(&keys.remaining, 4).await.unwrap();

        // A later start whose file leaves starts_at to "now".
        run_briefly(config(&redis, &db, &sale, Some("t"), first_start + 60_000)).await;
        let remaining: i64 = conn.get(&keys.remaining).await.unwrap();
        assert_eq!(remaining, 6, "a restart must not reset the stock");
        let starts: i64 = conn.hget(&keys.meta, "starts_at_ms").await.unwrap();
        assert_eq!(starts, first_start);
        let store = Store::connect(&db).await.unwrap();
        assert_eq!(store.sale(&sale).await.unwrap().unwrap().starts_at_ms, first_start);
    }
}
