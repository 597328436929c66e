//! The buy layer: the pipeline behind [`BuyService`], which decides a
//! `POST /api/sales/{id}/buy` from plain inputs (no Pingora, no HTTP) and
//! looks reservations up. It exports the service, what it is built from
//! ([`BuyDeps`]), the task forwarding its winners ([`ForwardWorker`]) and
//! its value types; every submodule is private.

mod decide;
mod deduct;
mod draw;
#[cfg(test)]
mod draw_tests;
mod forward;
mod outcome;
mod refill;
mod replica_wait;
mod reservations;
mod service;
#[cfg(test)]
mod tests;

pub use forward::ForwardWorker;
pub use outcome::{idempotency_key, Admitted, BuyOutcome, BuyRequest, MAX_IDEMPOTENCY_KEY_LEN};
pub use reservations::ReservationView;
pub use service::{BuyDeps, BuyService};
