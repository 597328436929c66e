//! The buy layer: the pipeline behind [`BuyService`], which decides a
//! `POST /flashgate/api/sales/{id}/buy` from plain inputs (no Pingora, no HTTP) and
//! looks reservations up. It exports the service, what it is built from
//! ([`BuyDeps`]), the task forwarding its winners ([`ForwardWorker`]) and
//! its value types; every submodule is private.
//!
//! How a buy is decided, step by step: [`decide`](self) (`decide.rs`).
//!
//! A win is answered `202 queued` at once: its reservation is durable in
//! the sale's stream already, and the forwarder (`forward`) hands it to the
//! backend off the request path, with the reservation time the script
//! returned (the stream record's `ts`). A retry with the same
//! Idempotency-Key ([`BuyOutcome::Replayed`]) is not forwarded again: it is
//! answered from the order once it exists (`201 confirmed`, or `410
//! order_cancelled`), else `202 queued` again. A `fenced` answer (the
//! sale's Redis became a master since it last agreed with the database,
//! `backend/src/fence.rs`) is `503` with `Retry-After`, neither remembered
//! under the key nor cached, until the backend has re-synced the sale
//! (`flashgate_fenced_buys_total`).
//!
//! A win's answer (`202`, and a replay's `201`) carries the sale's
//! `checkout_url` filled in for the winner, its `{handoff}` token minted
//! by `checkout` (docs/CHECKOUT.md).

mod checkout;
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

pub use checkout::Checkout;
pub use forward::ForwardWorker;
pub use outcome::{idempotency_key, Admitted, BuyOutcome, BuyRequest, MAX_IDEMPOTENCY_KEY_LEN};
pub use reservations::ReservationView;
pub use service::{BuyDeps, BuyService};
