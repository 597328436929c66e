//! The two HTTP APIs of the backend; every route but `/healthz` and
//! `/metrics` requires a bearer token ([`auth`]).
//!
//! - [`order_router`] (`backend.listen`, private network):
//!   - gateways (`FLASHGATE_INTERNAL_TOKEN`) turn winners' reservations
//!     into orders and look orders up:
//!     - `POST /internal/orders/batch`
//!     - `GET /internal/reservations/{rid}`
//!     - `GET /internal/sales/{id}` (does the database know this sale?)
//!   - the shop (`FLASHGATE_SHOP_TOKEN`) confirms payments and cancels
//!     unpaid orders (docs/CHECKOUT.md):
//!     `POST /internal/orders/{order_id}/pay`,
//!     `POST /internal/orders/{order_id}/cancel`
//!   - `GET /healthz`, `GET /metrics` (no token: probes and Prometheus)
//!   - `GET /live`, `GET /ready` (served from the start, before this
//!     router opens; see [`crate::readiness`])
//! - [`admin_router`] (`backend.admin_listen`, `FLASHGATE_ADMIN_TOKEN`):
//!   operators create, change and inspect sales.
//!   - `PUT /admin/sales/{id}`
//!   - `GET /admin/sales/{id}`
//!   - `GET /admin/sales`
//!   - `GET /admin/sales/{id}/dead-letters`
//!   - `GET /admin/sales/{id}/draw` (the opening draw's record, for audits)
//!   - `POST /admin/sales/{id}/dead-letters/{entry_id}/retry`
//!   - `POST /admin/sales/{id}/reconcile`
//!   - `GET /admin/events/dead`, `POST /admin/events/{event_id}/retry`
//!     (order events given up on: [`events`])

pub mod admin;
pub mod auth;
pub mod error;
pub mod events;
pub mod orders;

use std::sync::Arc;

use axum::routing::{get, post, put};
use axum::Router;
use flashgate_common::redis_conn::RedisHandle;

use crate::store::Store;

/// What every handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// Shared reconnecting connection; its calls time out at `redis.timeout`.
    pub redis: RedisHandle,
    /// The bearer tokens of the admin, gateway and shop routes.
    tokens: auth::ApiTokens,
    /// Serialises sale changes, so two operators changing one sale cannot
    /// interleave the Redis update and the database write.
    sale_writes: Arc<tokio::sync::Mutex<()>>,
    /// Last stock drift of each sale, written by reconciliation.
    pub drift: crate::reconcile::Drift,
    /// Orders cancelled by the payment timeout since start (for the metrics).
    pub orders_expired: Arc<std::sync::atomic::AtomicU64>,
    /// Served at `GET /metrics`; shared with the stream consumers.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Re-syncs a sale the admin API (re)installed, which a restore leaves fenced.
    pub fence: crate::fence::Resyncer,
}

impl AppState {
    /// `idempotency_ttl`: how long a won Idempotency-Key is remembered
    /// (`gateway.idempotency_ttl_seconds`), for the keys a re-sync writes back.
    pub fn new(
        store: Store,
        redis: RedisHandle,
        tokens: auth::ApiTokens,
        idempotency_ttl: std::time::Duration,
    ) -> Self {
        let metrics = Arc::new(crate::metrics::Metrics::register());
        let fence = crate::fence::Resyncer::new(idempotency_ttl, metrics.fence_scripts.clone());
        Self {
            store,
            redis,
            tokens,
            sale_writes: Arc::default(),
            drift: Default::default(),
            orders_expired: Arc::default(),
            metrics,
            fence,
        }
    }
}

/// The order API: the gateways' routes, the shop's payment route, and the
/// unauthenticated probes.
pub fn order_router(state: AppState) -> Router {
    let guarded =
        |guard: &auth::Guard| axum::middleware::from_fn_with_state(guard.clone(), auth::require);
    let gateways = Router::new()
        .route("/internal/orders/batch", post(orders::create_batch))
        .route("/internal/reservations/{rid}", get(orders::by_reservation))
        .route("/internal/sales/{id}", get(orders::sale_exists))
        .route_layer(guarded(&state.tokens.gateway));
    let shop = Router::new()
        .route("/internal/orders/{order_id}/pay", post(orders::pay))
        .route("/internal/orders/{order_id}/cancel", post(orders::cancel))
        .route_layer(guarded(&state.tokens.shop));
    Router::new()
        .merge(gateways)
        .merge(shop)
        .route("/healthz", get(orders::healthz))
        .route("/metrics", get(orders::metrics))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .with_state(state)
}

/// The admin API; every route, known or not, requires the bearer token.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/admin/sales", get(admin::list))
        .route("/admin/sales/{id}", get(admin::show).put(admin::put))
        .route("/admin/sales/{id}/dead-letters", get(admin::dead_letters))
        .route("/admin/sales/{id}/draw", get(admin::draw))
        .route(
            "/admin/sales/{id}/dead-letters/{entry_id}/retry",
            post(admin::retry_dead_letter),
        )
        .route("/admin/sales/{id}/reconcile", post(admin::reconcile))
        .route("/admin/sales/{id}/pause", post(admin::pause))
        .route("/admin/sales/{id}/resume", post(admin::resume))
        .route("/admin/switch", put(admin::switch))
        .route("/admin/events/dead", get(events::dead))
        .route("/admin/events/{event_id}/retry", post(events::retry))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(axum::middleware::from_fn_with_state(
            state.tokens.admin.clone(),
            auth::require,
        ))
        .with_state(state)
}

#[cfg(test)]
mod tests;
