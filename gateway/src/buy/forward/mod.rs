//! Winners to the order backend, off the request path, and the orders of
//! replayed wins, cached briefly.

pub mod order_cache;
pub mod worker;
