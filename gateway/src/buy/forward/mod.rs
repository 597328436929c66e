//! Winners to the order backend, off the request path (`worker`), and the
//! orders of replayed wins and reservations, cached briefly
//! (`order_cache`).

mod order_cache;
mod worker;

pub use order_cache::OrderLookups;
pub use worker::{forwarder, ForwardWorker, Forwarder};
