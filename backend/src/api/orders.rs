//! The order API: the gateway hands over a winner's reservation, which
//! becomes an order exactly once, whether it arrives here or through the
//! stream first.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::{sale_of_reservation, OrderView, Reservation};
use redis::AsyncCommands;

use super::error::{parse_json, ApiError};
use super::AppState;

/// `POST /internal/orders`: 201 with the order when this call created it,
/// 200 with the existing order when it was already there, 422
/// `unknown_reservation` when Redis has no such reservation for this user.
pub async fn create(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let reservation: Reservation = parse_json(&body?)?;
    if sale_of_reservation(&reservation.reservation_id) != Some(reservation.sale_id.as_str()) {
        return Err(unknown_reservation());
    }
    let keys = SaleKeys::new(&reservation.sale_id);
    let mut redis = state.redis.clone();
    let holder: Option<String> = redis.hget(&keys.reservations, &reservation.reservation_id).await?;
    if holder.as_deref() != Some(reservation.user_id.as_str()) {
        return Err(unknown_reservation());
    }
    let inserted = state.store.insert_orders(std::slice::from_ref(&reservation)).await?;
    let order = state
        .store
        .order_by_reservation(&reservation.reservation_id)
        .await?
        .ok_or_else(|| ApiError::unavailable("the order vanished right after it was written"))?;
    let status = if inserted == 1 { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(order)).into_response())
}

fn unknown_reservation() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_reservation",
        "no such reservation for this user and sale",
    )
}

/// `GET /internal/reservations/{rid}`: the order made from a reservation.
pub async fn by_reservation(
    State(state): State<AppState>,
    rid: Result<Path<String>, PathRejection>,
) -> Result<Json<OrderView>, ApiError> {
    let Path(rid) = rid?;
    match state.store.order_by_reservation(&rid).await? {
        Some(order) => Ok(Json(order)),
        None => Err(ApiError::not_found("no order for this reservation")),
    }
}

/// `GET /healthz`: 200 when the database answers.
pub async fn healthz(State(state): State<AppState>) -> Response {
    if state.store.ping().await {
        Json(serde_json::json!({"status": "ok"})).into_response()
    } else {
        ApiError::unavailable("the order database does not answer").into_response()
    }
}
