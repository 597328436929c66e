//! Group commit of the orders the gateway forwards.
//!
//! Each forwarded winner would otherwise cost its own transaction (and, on
//! SQLite, its own fsync), which caps the rate of `201 confirmed` answers
//! at the database's commit rate. Instead every request hands its
//! reservation to one writer task and waits; the writer takes everything
//! queued so far (up to [`MAX_BATCH`]), writes it with one multi-row insert
//! in one transaction, reads the orders back with one `SELECT`, and answers
//! each waiter. Under load, batches grow by themselves while the previous
//! commit runs; when idle, a lone request is written at once.

use std::sync::Arc;

use flashgate_common::reservation::{OrderView, Reservation};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;
use crate::store::Store;

/// Most reservations written in one transaction.
pub const MAX_BATCH: usize = 500;
/// Requests waiting for the writer; past this, callers wait to enqueue.
const QUEUE: usize = 10_000;

type Reply = Result<(OrderView, bool), String>;

/// Handle to the writer task; cheap to clone.
#[derive(Clone, Debug)]
pub struct OrderWriter {
    tx: mpsc::Sender<(Reservation, oneshot::Sender<Reply>)>,
}

impl OrderWriter {
    /// Starts the writer task on the current runtime.
    pub fn start(store: Store, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(store, metrics, rx));
        Self { tx }
    }

    /// Writes one reservation's order (or finds it) and answers it, with
    /// whether this call created it.
    ///
    /// # Errors
    /// The database failed; the message says how.
    pub async fn create(&self, reservation: Reservation) -> Result<(OrderView, bool), String> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((reservation, reply)).await.map_err(|_| "order writer stopped".to_owned())?;
        answer.await.map_err(|_| "order writer stopped".to_owned())?
    }
}

async fn run(store: Store, metrics: Arc<Metrics>, mut rx: mpsc::Receiver<(Reservation, oneshot::Sender<Reply>)>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (reservations, waiters): (Vec<Reservation>, Vec<oneshot::Sender<Reply>>) = batch.drain(..).unzip();
        match store.create_orders(&reservations).await {
            Ok(results) => {
                let created = results.iter().filter(|(_, c)| *c).count() as u64;
                metrics.orders_created.with_label_values(&["forward"]).inc_by(created);
                for (waiter, result) in waiters.into_iter().zip(results) {
                    let _ = waiter.send(Ok(result));
                }
            }
            Err(error) => {
                tracing::warn!(%error, batch = reservations.len(), "forwarded orders not written; the stream will deliver them");
                let message = error.to_string();
                for waiter in waiters {
                    let _ = waiter.send(Err(message.clone()));
                }
            }
        }
    }
}
