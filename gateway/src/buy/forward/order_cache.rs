//! A reservation's order as buyers ask for it (`GET /flashgate/api/reservations/{id}`
//! and the replay of a won Idempotency-Key), cached briefly so that a
//! polling or retrying winner costs the backend one lookup per
//! [`ORDER_TTL`], not one per request.
//!
//! Only orders that exist are cached. A reservation whose order is not
//! written yet is asked again on the next request, so a winner sees
//! `confirmed` as soon as the backend has the order. A cached order may
//! show a status up to [`ORDER_TTL`] old (e.g. `confirmed` just after it
//! was cancelled). Concurrent lookups of one reservation share one backend
//! call (moka's `optionally_get_with` is single-flight).

use std::sync::Arc;
use std::time::Duration;

use flashgate_common::reservation::OrderView;
use tracing::debug;

use crate::infra::OrderClient;

/// How long an order found in the backend is answered from memory.
pub const ORDER_TTL: Duration = Duration::from_secs(1);
/// Most orders held at once; each is a few hundred bytes.
const MAX_ORDERS: u64 = 100_000;

pub struct OrderLookups {
    backend: Arc<OrderClient>,
    orders: moka::future::Cache<String, OrderView>,
}

impl OrderLookups {
    pub fn new(backend: Arc<OrderClient>) -> Self {
        let orders = moka::future::Cache::builder()
            .max_capacity(MAX_ORDERS)
            .time_to_live(ORDER_TTL)
            .build();
        Self { backend, orders }
    }

    /// The order of `reservation_id`; `None` while it is not written yet or
    /// when the backend does not answer (the buyer is then told `queued`).
    pub async fn order(&self, reservation_id: &str) -> Option<OrderView> {
        self.orders
            .optionally_get_with_by_ref(reservation_id, async {
                match self.backend.order(reservation_id).await {
                    Ok(order) => order,
                    Err(error) => {
                        debug!(%error, reservation = reservation_id, "order lookup failed; reporting queued");
                        None
                    }
                }
            })
            .await
    }
}
