//! Winners handed to the order backend in batches, off the request path.
//!
//! A winner's reservation is durable in the sale's stream the moment the
//! deduct script returns, so the buyer is answered `202 queued` at once and
//! never waits for a database commit. The reservation is also queued here;
//! a background task sends whatever has queued up (up to [`MAX_BATCH`],
//! waiting [`LINGER`] for more when there are fewer) in
//! one `POST /internal/orders/batch`, which the backend writes in one
//! transaction. Usually that is well before the stream consumer would get
//! to it; if the backend is down or the queue is full, nothing is lost: the
//! consumer writes the order from the stream.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashgate_common::dependency::{DepState, Dependency};
use flashgate_common::reservation::ForwardedWinner;
use tokio::sync::{mpsc, Mutex};

use crate::infra::Metrics;
use crate::infra::{BackendError, OrderClient};
use crate::infra::{Shutdown, Task};

/// Most winners sent in one request.
pub const MAX_BATCH: usize = 256;
/// How long a batch that is not full waits for more winners. The buyers
/// are answered already, so the wait costs them nothing; it saves the
/// database a commit per few winners when they trickle in (an open sale
/// at a steady rate), which was most of its CPU per buy there.
const LINGER: Duration = Duration::from_millis(10);
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
    (
        Forwarder { tx },
        ForwardWorker {
            rx: Mutex::new(rx),
            orders,
            metrics,
        },
    )
}

#[async_trait]
impl Task for ForwardWorker {
    async fn run(&self, mut shutdown: Shutdown) {
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
            let stopping = linger(&mut rx, &mut batch, &mut shutdown).await;
            let timer = self.metrics.forward_duration.start_timer();
            let sent = self.orders.create_orders(&batch).await;
            timer.observe_duration();
            match sent {
                Ok(_) => forwarding.ready(),
                Err(error) => {
                    self.metrics
                        .forward_failures
                        .with_label_values(&[error.kind()])
                        .inc_by(batch.len() as u64);
                    let state = if matches!(error, BackendError::Http(_)) {
                        DepState::Unreachable
                    } else {
                        DepState::Failing
                    };
                    forwarding.observe(
                        state,
                        format_args!(
                            "{error}; {} winners' orders will come from the stream",
                            batch.len()
                        ),
                    );
                }
            }
            batch.clear();
            if stopping {
                return;
            }
        }
    }
}

/// Adds to `batch` what arrives within [`LINGER`], up to [`MAX_BATCH`].
/// True when the gateway is stopping or the queue closed: the batch is
/// then sent as it is, and nothing after it.
async fn linger(
    rx: &mut mpsc::Receiver<ForwardedWinner>,
    batch: &mut Vec<ForwardedWinner>,
    shutdown: &mut Shutdown,
) -> bool {
    let until = tokio::time::Instant::now() + LINGER;
    while batch.len() < MAX_BATCH {
        let room = MAX_BATCH - batch.len();
        tokio::select! {
            _ = shutdown.changed() => return true,
            () = tokio::time::sleep_until(until) => return false,
            n = rx.recv_many(batch, room) => if n == 0 { return true },
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use flashgate_common::reservation::Reservation;
    use tokio::sync::watch;

    use super::*;

    fn winner(n: usize) -> ForwardedWinner {
        let reservation = Reservation {
            reservation_id: format!("s.{n}"),
            sale_id: "s".into(),
            user_id: format!("u{n}"),
            idempotency_key: String::new(),
            reserved_at_ms: 1,
        };
        ForwardedWinner {
            reservation,
            request_id: String::new(),
        }
    }

    fn ids(batch: &[ForwardedWinner]) -> Vec<&str> {
        batch
            .iter()
            .map(|w| w.reservation.reservation_id.as_str())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_takes_the_winners_that_arrive_within_the_linger_and_no_later_one() {
        let (tx, mut rx) = mpsc::channel(16);
        let (_stop, mut shutdown) = watch::channel(false);
        tx.send(winner(0)).await.unwrap();
        let late = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LINGER / 2).await;
            late.send(winner(1)).await.unwrap();
            tokio::time::sleep(LINGER).await;
            late.send(winner(2)).await.unwrap();
        });
        let mut batch = Vec::new();
        rx.recv_many(&mut batch, MAX_BATCH).await;
        assert!(!linger(&mut rx, &mut batch, &mut shutdown).await);
        assert_eq!(ids(&batch), ["s.0", "s.1"]);
        batch.clear();
        rx.recv_many(&mut batch, MAX_BATCH).await;
        assert_eq!(
            ids(&batch),
            ["s.2"],
            "the next batch starts with the one that came too late"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_is_sent_without_lingering() {
        let (tx, mut rx) = mpsc::channel(2 * MAX_BATCH);
        let (_stop, mut shutdown) = watch::channel(false);
        for n in 0..MAX_BATCH + 1 {
            tx.send(winner(n)).await.unwrap();
        }
        let mut batch = Vec::new();
        rx.recv_many(&mut batch, 1).await;
        let start = tokio::time::Instant::now();
        assert!(!linger(&mut rx, &mut batch, &mut shutdown).await);
        assert_eq!(batch.len(), MAX_BATCH);
        assert_eq!(start.elapsed(), Duration::ZERO, "a full batch waited");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_gateway_keeps_the_batch_it_holds_and_says_so() {
        let (tx, mut rx) = mpsc::channel(16);
        let (stop, mut shutdown) = watch::channel(false);
        tx.send(winner(0)).await.unwrap();
        let mut batch = Vec::new();
        rx.recv_many(&mut batch, MAX_BATCH).await;
        stop.send(true).unwrap();
        assert!(linger(&mut rx, &mut batch, &mut shutdown).await);
        assert_eq!(ids(&batch), ["s.0"]);
        drop(tx);
        let mut closed = Vec::new();
        rx.recv_many(&mut closed, 1).await;
        let (_stop, mut shutdown) = watch::channel(false);
        assert!(
            linger(&mut rx, &mut closed, &mut shutdown).await,
            "a closed queue ends the worker"
        );
    }
}
