//! Who may ask: deny lists, token buckets (local and cluster-wide), the
//! buyer's token, the client address, the proof-of-work challenge, and
//! the hot reload of limits and deny lists.

pub mod auth;
pub mod challenge;
pub mod client_ip;
pub mod cluster_limit;
mod gate;
pub mod limits;
pub mod reload;

pub use gate::{Admission, Edge};
