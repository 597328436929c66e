//! Builds and runs the Pingora server from the validated config.

use std::sync::Arc;

use anyhow::Context;
use flashgate_common::config::{Config, ENV_JWT_SECRET};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;

use crate::auth::Verifier;
use crate::orders::OrderClient;
use crate::proxy::{shop_peer, Gateway};
use crate::redis_client::RedisClient;
use crate::static_pages::StaticPages;

/// Builds the gateway state. Fails on anything that would only break later:
/// no JWT secret, an unreadable static dir, a bad Redis URL.
///
/// # Errors
/// With a message naming what is missing or wrong.
pub fn build_gateway(config: Arc<Config>) -> anyhow::Result<Gateway> {
    let secret = config
        .jwt_secret
        .clone()
        .with_context(|| format!("no JWT secret: set {ENV_JWT_SECRET} (or auth.jwt_secret)"))?;
    let pages = StaticPages::load(&config.gateway.static_dir)
        .with_context(|| format!("gateway.static_dir: cannot read {}", config.gateway.static_dir.display()))?;
    Ok(Gateway {
        verifier: Verifier::new(secret.as_bytes()),
        redis: RedisClient::new(&config.redis.url, config.redis.timeout).context("redis.url")?,
        orders: OrderClient::new(&config.gateway.backend_url, config.gateway.forward_timeout)
            .context("gateway.backend_url")?,
        pages,
        shop: shop_peer(config.gateway.shop_upstream),
        config,
    })
}

/// Runs the gateway until SIGTERM (graceful) or SIGINT (immediate).
///
/// # Errors
/// When the gateway cannot be built.
pub fn run(config: Config) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let gateway = build_gateway(config.clone())?;
    let port = config.gateway.listen.port();
    let conf = ServerConf {
        threads: config.gateway.threads,
        pid_file: format!("/tmp/flashgate-{port}.pid"),
        upgrade_sock: format!("/tmp/flashgate-{port}-upgrade.sock"),
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(5),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut service = pingora::proxy::http_proxy_service(&server.configuration, gateway);
    service.add_tcp(&config.gateway.listen.to_string());
    server.add_service(service);
    tracing::info!(listen = %config.gateway.listen, shop = %config.gateway.shop_upstream, "flashgate listening");
    server.run_forever()
}
