//! Payment timeout: orders still unpaid when their sale's
//! `payment_timeout_seconds` has passed since the reservation are
//! cancelled, and their item goes back to the stock.
//!
//! Each cancellation is a conditional `UPDATE ... WHERE status = 'created'`,
//! the same row a payment updates with the same condition, so a payment
//! racing the timeout is decided once, by the database: exactly one of the
//! two changes the row. The item is then returned by
//! [`crate::recovery::return_stock`], which is idempotent and retried on the
//! next pass until Redis has it back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::watch;

use crate::error::SaleError;
use crate::recovery::return_stock;
use crate::store::Store;

/// Unpaid orders examined per query.
const EXPIRY_BATCH: i64 = 500;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpiryPass {
    /// Orders this pass cancelled.
    pub cancelled: u64,
    /// Items this pass put back in Redis (cancelled now or earlier).
    pub returned: u64,
}

/// Cancels every order unpaid past its sale's timeout at `now_ms`, then
/// returns the items of all cancelled orders not returned yet.
///
/// # Errors
/// Redis or the database failed; what was done stays done and the next
/// pass carries on.
pub async fn expire_once<C: ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    now_ms: i64,
) -> Result<ExpiryPass, SaleError> {
    let mut pass = ExpiryPass::default();
    loop {
        let expired = store.orders().expired(now_ms, EXPIRY_BATCH).await?;
        let full = expired.len() as i64 == EXPIRY_BATCH;
        for order in &expired {
            if store.orders().cancel_if_unpaid(&order.order_id).await? {
                pass.cancelled += 1;
                tracing::info!(order = %order.order_id, sale = %order.sale_id, "order unpaid in time; cancelled");
            }
        }
        if !full {
            break;
        }
    }
    pass.returned = return_stock(conn, store).await?;
    Ok(pass)
}

/// Runs [`expire_once`] every `interval` until `shutdown`; counts the
/// cancelled orders into `expired_total` (for the metrics).
pub async fn run<C: ConnectionLike + Send + Clone>(
    conn: C,
    store: Store,
    interval: Duration,
    expired_total: Arc<AtomicU64>,
    readiness: crate::readiness::Readiness,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if !readiness.wait_dependencies(&mut shutdown).await {
            return;
        }
        let mut c = conn.clone();
        match expire_once(&mut c, &store, flashgate_common::now_ms()).await {
            Ok(pass) => {
                expired_total.fetch_add(pass.cancelled, Ordering::Relaxed);
            }
            Err(error) => tracing::warn!(%error, "payment timeout pass failed; will retry"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}
