//! The two HTTP APIs of the backend.
//!
//! - [`order_router`] (`backend.listen`, private network): the gateway
//!   turns a winner's reservation into an order and looks orders up.
//!   - `POST /internal/orders`
//!   - `GET /internal/reservations/{rid}`
//!   - `POST /internal/orders/{order_id}/pay` (the shop confirms payment)
//!   - `GET /internal/sales/{id}` (does the database know this sale?)
//!   - `GET /healthz`
//!   - `GET /live`, `GET /ready` (served by [`crate::server`] from the
//!     start, before this router opens; see [`crate::readiness`])
//! - [`admin_router`] (`backend.admin_listen`, bearer token): operators
//!   create, change and inspect sales.
//!   - `PUT /admin/sales/{id}`
//!   - `GET /admin/sales/{id}`
//!   - `GET /admin/sales`
//!   - `GET /admin/sales/{id}/dead-letters`
//!   - `POST /admin/sales/{id}/dead-letters/{entry_id}/retry`
//!   - `POST /admin/sales/{id}/reconcile`

pub mod admin;
pub mod error;
pub mod orders;

use std::sync::Arc;

use axum::routing::{put, get, post};
use axum::Router;
use redis::aio::ConnectionManager;

use crate::store::Store;

/// What every handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// Shared reconnecting connection; its calls time out at `redis.timeout`.
    pub redis: ConnectionManager,
    /// Expected admin bearer token; never empty.
    admin_token: Arc<str>,
    /// Serialises sale changes, so two operators changing one sale cannot
    /// interleave the Redis update and the database write.
    sale_writes: Arc<tokio::sync::Mutex<()>>,
    /// Last stock drift of each sale, written by reconciliation.
    pub drift: crate::reconcile::Drift,
    /// Orders cancelled by the payment timeout since start (for the metrics).
    pub orders_expired: Arc<std::sync::atomic::AtomicU64>,
    /// Served at `GET /metrics`; shared with the stream consumers.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Group commit of forwarded winners.
    pub orders: crate::order_writer::OrderWriter,
}

impl AppState {
    /// # Errors
    /// `admin_token` is empty: the admin API would be open to anyone.
    pub fn new(store: Store, redis: ConnectionManager, admin_token: &str) -> Result<Self, crate::StartError> {
        if admin_token.is_empty() {
            return Err(crate::StartError::NoAdminToken);
        }
        let metrics = Arc::new(crate::metrics::Metrics::register());
        let orders = crate::order_writer::OrderWriter::start(store.clone(), metrics.clone());
        Ok(Self { store, redis, admin_token: admin_token.into(), sale_writes: Arc::default(), drift: Default::default(), orders_expired: Arc::default(), metrics, orders })
    }
}

/// The order API used by the gateway.
pub fn order_router(state: AppState) -> Router {
    Router::new()
        .route("/internal/orders", post(orders::create))
        .route("/internal/orders/batch", post(orders::create_batch))
        .route("/internal/reservations/{rid}", get(orders::by_reservation))
        .route("/internal/orders/{order_id}/pay", post(orders::pay))
        .route("/internal/sales/{id}", get(orders::sale_exists))
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
        .route("/admin/sales/{id}/dead-letters/{entry_id}/retry", post(admin::retry_dead_letter))
        .route("/admin/sales/{id}/reconcile", post(admin::reconcile))
        .route("/admin/sales/{id}/pause", post(admin::pause))
        .route("/admin/sales/{id}/resume", post(admin::resume))
        .route("/admin/switch", put(admin::switch))
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(axum::middleware::from_fn_with_state(state.clone(), admin::require_token))
        .with_state(state)
}

#[cfg(test)]
mod tests;
