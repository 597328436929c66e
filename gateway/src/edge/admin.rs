//! The gateway's admin listener (default 127.0.0.1:9092), for operators and
//! Prometheus only; keep it off public networks.
//!
//! - `GET /metrics`: Prometheus text exposition.
//! - `GET /live`: 200 while the process runs.
//! - `GET /ready`: 200 while Redis answers (not absent, not `LOADING`) and
//!   its circuit is not open, else 503, so a load balancer stops sending
//!   buyers to a gateway that cannot sell; the JSON body names each
//!   dependency's state (see [`crate::infra::Readiness`]).
//! - `POST /cache/purge`: removes cached shop responses by URL or prefix;
//!   needs the admin token (see [`crate::edge::shop_cache::purge_api`]).
//! - `GET /waiting-rooms`, `GET /waiting-rooms/{name}`, `POST
//!   /waiting-rooms/{name}/mode`: each room's state and its mode switch;
//!   need the admin token (see [`crate::edge::waiting_room::admin`]).

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::edge::shop_cache::purge_api::{self, PurgeApi};
use crate::edge::waiting_room::admin::{self as rooms_admin, RoomsApi};
use crate::infra::Metrics;
use crate::infra::Readiness;
use crate::infra::{Breaker, BreakerState};

pub struct AdminServer {
    pub listen: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub breaker: Arc<Breaker>,
    pub readiness: Arc<Readiness>,
    /// The shop cache's purge route.
    pub purge: PurgeApi,
    /// The waiting rooms' routes.
    pub rooms: RoomsApi,
}

impl AdminServer {
    fn router(&self) -> Router {
        let (metrics, breaker) = (self.metrics.clone(), self.breaker.clone());
        let (ready_breaker, readiness) = (self.breaker.clone(), self.readiness.clone());
        Router::new()
            .route(
                "/metrics",
                get(move || {
                    let (metrics, breaker) = (metrics.clone(), breaker.clone());
                    async move {
                        metrics.circuit_state.set(match breaker.state() {
                            BreakerState::Closed => 0,
                            BreakerState::Open => 1,
                            BreakerState::HalfOpen => 2,
                        });
                        (
                            [("content-type", "text/plain; version=0.0.4")],
                            metrics.render(),
                        )
                    }
                }),
            )
            .route("/live", get(|| async { "ok" }))
            .route(
                "/cache/purge",
                post(purge_api::purge).with_state(self.purge.clone()),
            )
            .merge(rooms_admin::router(self.rooms.clone()))
            .route(
                "/ready",
                get(move || {
                    let (breaker, readiness) = (ready_breaker.clone(), readiness.clone());
                    async move {
                        let status = if readiness.is_ready(&breaker) {
                            StatusCode::OK
                        } else {
                            StatusCode::SERVICE_UNAVAILABLE
                        };
                        (status, axum::Json(readiness.report(&breaker))).into_response()
                    }
                }),
            )
    }
}

#[async_trait]
impl BackgroundService for AdminServer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let listener = match tokio::net::TcpListener::bind(self.listen).await {
            Ok(l) => l,
            Err(error) => {
                tracing::error!(%error, listen = %self.listen, "gateway.admin_listen: cannot listen; metrics unavailable");
                return;
            }
        };
        tracing::info!(listen = %self.listen, "admin listener (metrics, live, ready)");
        let serve = axum::serve(listener, self.router()).with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        });
        if let Err(error) = serve.await {
            tracing::error!(%error, "admin listener failed");
        }
    }
}
