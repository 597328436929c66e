//! Winners handed to the order backend in batches, off the request path.
//!
//! A winner's reservation is durable in the sale's stream the moment the
//! deduct script returns, so the buyer is answered `202 queued` at once and
//! never waits for a database commit. The reservation is also queued here;
//! a background task sends whatever has queued up (up to [`MAX_BATCH`]) in
//! one `POST /internal/orders/batch`, which the backend writes in one
//! transaction. Usually that is well before the stream consumer would get
//! to it; if the backend is down or the queue is full, nothing is lost: the
//! consumer writes the order from the stream.

use std::sync::Arc;

use async_trait::async_trait;
use flashgate_common::dependency::{DepState, Dependency};
use flashgate_common::reservation::ForwardedWinner;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::{mpsc, Mutex};

use crate::metrics::Metrics;
use crate::orders::{BackendError, OrderClient};

/// Most winners sent in one request.
pub const MAX_BATCH: usize = 256;
/// Winners waiting to be sent; past this they are left to the stream.
const QUEUE: usize = 50_000;

/// The request path's end: cheap to clone, never blocks.
#[derive(Clone)]
pub struct Forwarder {
    tx: mpsc::Sender<ForwardedWinner>,
}

impl Forwarder {
    /// Queues a winner; false when the queue is full (the stream covers it).
    pub fn forward(&self, winner: ForwardedWinner) -> bool {
        self.tx.try_send(winner).is_ok()
    }
}

/// The background task that sends the batches.
pub struct ForwardWorker {
    rx: Mutex<mpsc::Receiver<ForwardedWinner>>,
    orders: Arc<OrderClient>,
    metrics: Arc<Metrics>,
}

/// A forwarder and the worker that drains it.
pub fn forwarder(orders: Arc<OrderClient>, metrics: Arc<Metrics>) -> (Forwarder, ForwardWorker) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Forwarder { tx }, ForwardWorker { rx: Mutex::new(rx), orders, metrics })
}

#[async_trait]
impl BackgroundService for ForwardWorker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut rx = self.rx.lock().await;
        let mut batch = Vec::with_capacity(MAX_BATCH);
        // While the backend restarts, one line when forwards start failing
        // and one when they work again, not one per batch (the failures
        // metric counts every winner).
        let forwarding = Dependency::assumed_ready("backend order API");
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                n = rx.recv_many(&mut batch, MAX_BATCH) => if n == 0 { return },
            }
            let timer = self.metrics.forward_duration.start_timer();
            let sent = self.orders.create_orders(&batch).await;
            timer.observe_duration();
            match sent {
                Ok(_) => forwarding.ready(),
                Err(error) => {
                    self.metrics.forward_failures.with_label_values(&[error.kind()]).inc_by(batch.len() as u64);
                    let state = if matches!(error, BackendError::Http(_)) { DepState::Unreachable } else { DepState::Failing };
                    forwarding.observe(state, format_args!("{error}; {} winners' orders will come from the stream", batch.len()));
                }
            }
            batch.clear();
        }
    }
}
