//! `GET /flashgate/api/reservations/{id}`: a reservation's state, for its own user
//! only. The owner comes from the sale's reservation index in Redis, the
//! order (once written) from the briefly cached backend lookup.

use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::{sale_of_reservation, ReservationStatus};
use serde::Serialize;

use super::forward::OrderLookups;
use crate::infra::Metrics;
use crate::infra::RedisClient;
use crate::rejection::{unavailable, Rejection};

/// A reservation as its buyer sees it.
#[derive(Debug, Serialize)]
pub struct ReservationView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
    pub reservation_id: String,
    pub status: ReservationStatus,
}

/// The reservation `rid` of `user`. Someone else's reservation is reported
/// exactly like a missing one.
///
/// # Errors
/// `BadRequest` for an id naming no sale, `NotFound`, or `Unavailable`
/// when Redis cannot be read.
pub async fn lookup(
    redis: &RedisClient,
    sales: &crate::sales::SaleCache,
    orders: &OrderLookups,
    metrics: &Metrics,
    user: &str,
    rid: &str,
) -> Result<ReservationView, Rejection> {
    let sale = sale_of_reservation(rid).ok_or(Rejection::BadRequest("malformed reservation id"))?;
    // A bucketed sale indexes a reservation in its owner's home bucket.
    let buckets = sales.buckets(redis, sale).await;
    let keys = SaleKeys::home(sale, buckets, user);
    let owner: Option<String> = redis
        .call(|mut conn| async move {
            redis::AsyncCommands::hget(&mut conn, &keys.reservations, rid).await
        })
        .await
        .map_err(|e| unavailable(metrics, &e))?;
    if owner.as_deref() != Some(user) {
        return Err(Rejection::NotFound("no such reservation"));
    }
    Ok(match orders.order(rid).await {
        Some(order) => ReservationView {
            order_id: Some(order.order_id),
            reservation_id: rid.to_owned(),
            status: order.status,
        },
        None => ReservationView {
            order_id: None,
            reservation_id: rid.to_owned(),
            status: ReservationStatus::Queued,
        },
    })
}
