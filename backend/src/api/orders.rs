//! The order API: the gateway hands over its winners' reservations in
//! batches; each becomes an order exactly once, whether it arrives here or
//! through the stream first.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::{HashMap, HashSet};

use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::{sale_of_reservation, ForwardedWinner, OrderView, Reservation};

use super::error::{parse_json, ApiError};
use super::AppState;
use crate::counted::write_counted;
use crate::store::{OrderStatus, Payment};

/// Most winners accepted in one batch.
pub const MAX_BATCH: usize = 1000;

/// `POST /internal/orders/batch`: the gateway's batch of winners
/// (`[{reservation..., request_id}]`), written in one transaction.
/// Reservations Redis does not count for that user are skipped (counted in
/// `rejected`; see [`crate::counted`]); the rest become orders once. A
/// reservation listed more than once counts once: its first copy Redis
/// knows for that user, or, when none is, one rejection. Answers
/// `{"created", "existing", "rejected"}`.
pub async fn create_batch(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let winners: Vec<ForwardedWinner> = parse_json(&body?)?;
    if winners.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "at most {MAX_BATCH} winners per batch"
        )));
    }
    let total = winners
        .iter()
        .map(|w| w.reservation.reservation_id.as_str())
        .collect::<HashSet<_>>()
        .len();
    let mut request_ids: HashMap<String, String> = HashMap::with_capacity(winners.len());
    let reservations: Vec<Reservation> = winners
        .into_iter()
        .filter(|w| {
            sale_of_reservation(&w.reservation.reservation_id)
                == Some(w.reservation.sale_id.as_str())
        })
        .map(|w| {
            request_ids
                .entry(w.reservation.reservation_id.clone())
                .or_insert(w.request_id);
            w.reservation
        })
        .collect();
    let written = write_counted(&state.store, &mut state.redis.clone(), &reservations).await?;
    for rid in &written.created {
        let sale = sale_of_reservation(rid).unwrap_or_default();
        let request_id = request_ids.get(rid).map_or("", String::as_str);
        tracing::info!(request_id = %request_id, sale = %sale, reservation = %rid, "order created from the gateway's forward");
    }
    let created = written.created.len() as u64;
    state
        .metrics
        .orders_created
        .with_label_values(&["forward"])
        .inc_by(created);
    let existing = written.counted.len() as u64 - created;
    state
        .metrics
        .orders_existing
        .with_label_values(&["forward"])
        .inc_by(existing);
    let rejected = total - written.counted.len();
    if rejected > 0 {
        tracing::warn!(
            rejected,
            "forwarded winners redis does not count were skipped"
        );
    }
    Ok(
        Json(serde_json::json!({"created": created, "existing": existing, "rejected": rejected}))
            .into_response(),
    )
}

/// `GET /internal/reservations/{rid}`: the order made from a reservation.
pub async fn by_reservation(
    State(state): State<AppState>,
    rid: Result<Path<String>, PathRejection>,
) -> Result<Json<OrderView>, ApiError> {
    let Path(rid) = rid?;
    state.metrics.order_lookups.inc();
    match state.store.orders().by_reservation(&rid).await? {
        Some(order) => Ok(Json(order)),
        None => Err(ApiError::not_found("no order for this reservation")),
    }
}

/// An order's payment state, as `POST /internal/orders/{order_id}/pay`
/// and `POST /internal/orders/{order_id}/cancel` answer it.
#[derive(Debug, serde::Serialize)]
pub struct PaymentView {
    pub order_id: String,
    pub reservation_id: String,
    pub sale_id: String,
    pub user_id: String,
    /// `paid` or `cancelled`.
    pub status: &'static str,
}

impl PaymentView {
    fn new(o: crate::store::OrderRow) -> Self {
        Self {
            status: o.status.as_str(),
            order_id: o.order_id,
            reservation_id: o.reservation_id,
            sale_id: o.sale_id,
            user_id: o.user_id,
        }
    }
}

/// `POST /internal/orders/{order_id}/pay`: the shop confirms a payment.
/// 200 when the order is paid (by this call or an earlier one: calling
/// again is harmless), 409 `order_cancelled` when the payment timeout or
/// the shop's own cancel came first (the item is already back on sale: the
/// shop refunds the payment), 404 otherwise.
pub async fn pay(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let order_id = order_id(id)?;
    match state.store.orders().pay(&order_id).await? {
        Payment::Paid(order) => Ok(Json(PaymentView::new(order)).into_response()),
        Payment::Cancelled(order) => {
            let body = serde_json::json!({
                "code": "order_cancelled",
                "message": "the order was cancelled (unpaid in time, or by the shop) before this payment; refund it",
                "order": PaymentView::new(order),
            });
            Ok((StatusCode::CONFLICT, Json(body)).into_response())
        }
        Payment::Unknown => Err(ApiError::not_found("no such order")),
    }
}

/// `POST /internal/orders/{order_id}/cancel`: the shop cancels an unpaid
/// order (the buyer gave up at checkout). Cancelled exactly as the payment
/// timeout cancels ([`crate::timeout`]): one conditional update decides
/// it against a racing payment, then that order's item goes back to the
/// sale's stock at once ([`crate::recovery::return_cancelled`]), which also
/// writes `order.cancelled`. 200 when the order is cancelled (by this call or an
/// earlier one: calling again is harmless), 409 `order_paid` when it was
/// paid first, 404 when unknown. Should Redis fail here, the cancellation
/// stands and the timeout loop's next pass returns the item.
pub async fn cancel(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let order_id = order_id(id)?;
    let cancelled = state.store.orders().cancel_if_unpaid(&order_id).await?;
    let order = state.store.orders().get(&order_id).await?;
    if let (true, Some(order)) = (cancelled, &order) {
        tracing::info!(order = %order_id, "order cancelled by the shop");
        let mut redis = state.redis.clone();
        if let Err(error) = crate::recovery::return_cancelled(&mut redis, &state.store, order).await
        {
            tracing::warn!(%error, order = %order_id, "cancelled; its item goes back on the next timeout pass");
        }
    }
    match order {
        Some(order) if order.status == OrderStatus::Paid => Err(ApiError::new(
            StatusCode::CONFLICT,
            "order_paid",
            "the order was paid before this cancellation; refund it instead",
        )),
        Some(order) if order.status == OrderStatus::Cancelled => {
            Ok(Json(PaymentView::new(order)).into_response())
        }
        // Still created: only a database that lost the update would say so.
        Some(_) => Err(ApiError::unavailable(
            "the cancellation did not stick; retry",
        )),
        None => Err(ApiError::not_found("no such order")),
    }
}

/// The `{order_id}` of a shop's call, checked.
fn order_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(order_id) = id?;
    if !valid_order_id(&order_id) {
        return Err(ApiError::bad_request(
            "order_id: must be `o-` and 32 hex digits",
        ));
    }
    Ok(order_id)
}

/// Order ids are `o-` and 32 lowercase hex digits (see the store).
fn valid_order_id(id: &str) -> bool {
    id.strip_prefix("o-")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `GET /internal/sales/{id}`: whether the database knows the sale, for a
/// gateway that finds it missing in Redis (then it is being restored and
/// buyers get 503, not 404). 200 `{"id", "exists": true, "in_redis"}` or
/// 404.
pub async fn sale_exists(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    if !flashgate_common::sale::valid_sale_id(&id) {
        return Err(ApiError::bad_request(
            "id: must be 1 to 64 characters of A-Z a-z 0-9 _ -",
        ));
    }
    if state.store.sales().get(&id).await?.is_none() {
        return Err(ApiError::not_found("no such sale"));
    }
    let mut redis = state.redis.clone();
    let in_redis: Option<bool> = redis::cmd("EXISTS")
        .arg(SaleKeys::new(&id).meta)
        .query_async(&mut redis)
        .await
        .ok();
    Ok(Json(serde_json::json!({"id": id, "exists": true, "in_redis": in_redis})).into_response())
}

/// `GET /healthz`: 200 when the database answers.
pub async fn healthz(State(state): State<AppState>) -> Response {
    if state.store.ping().await {
        Json(serde_json::json!({"status": "ok"})).into_response()
    } else {
        ApiError::unavailable("the order database does not answer").into_response()
    }
}

/// `GET /metrics`: what the process holds in memory, nothing read now (the
/// Redis gauges are refreshed in the background, see [`crate::metrics`]).
pub async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.metrics;
    let expired = state
        .orders_expired
        .load(std::sync::atomic::Ordering::Relaxed);
    m.orders_expired
        .inc_by(expired.saturating_sub(m.orders_expired.get()));
    for (sale, drift) in state.drift.snapshot() {
        m.drift.with_label_values(&[&sale]).set(drift);
    }
    ([("content-type", "text/plain; version=0.0.4")], m.render()).into_response()
}
