//! Flashgate's edge gateway, on Pingora.
//!
//! It answers the flash-sale API and the product pages itself and proxies
//! every other path to the shop. A buy runs one atomic script in Redis; only
//! winners are forwarded to the order backend.
//!
//! Layout, one folder per layer (a request's path: `edge::proxy` →
//! `edge::route` → `admission` → `buy` / `sales` → `edge::reply`); a layer
//! uses the ones below it, never the edge:
//! - [`edge`]: Pingora and HTTP. `proxy` the adapter, phase by phase (start
//!   reading here); `route` method + path to a typed route; `reply` every
//!   answer's status and body; `static_pages`, `shop_cache`, `upstreams`,
//!   `tls`, and `admin` (the listener of `/metrics`, `/ready`, purges).
//! - [`admission`]: who may ask: deny lists, token buckets (`limits`,
//!   `cluster_limit`), buyer tokens (`auth`), the client address
//!   (`client_ip`), the proof of work (`challenge`), and the live `reload`
//!   of limits and deny lists ([`admission::Edge`]).
//! - [`buy`]: the buy rules ([`buy::BuyService`]): the local decision, the
//!   deduct script (`deduct`, batched per sale), the opening `draw`, bucket
//!   `refill`s, `replica_wait`, winners `forward`ed to the backend, and
//!   reservation lookups; no Pingora types.
//! - [`sales`]: the one sale cache per gateway (a snapshot per sale,
//!   sold-out flags, missing sales), the pause `switches` and the sale
//!   `events` between gateways.
//! - [`infra`]: the Redis client and its breaker, the order backend's
//!   client, readiness, metrics, the clock, the runtime directory, and
//!   `task` (what a long-running task implements; the server runs each).
//! - [`rejection`]: every way a request is turned down, as values.
//! - [`server`]: builds the layers from the config and runs them.
//! - [`cli`]: the operator commands (`flashgate sale|cache|events`), HTTP
//!   calls to the admin APIs; no layer, beside them rather than in them.

// Product code: a panic is a bug. Handle the error, or `expect` with the
// invariant that makes it impossible (tests may unwrap: clippy.toml).
#![warn(clippy::unwrap_used)]
#![forbid(unsafe_code)]
// The request futures hold boxed sub-futures (kept out of line to keep the
// per-request future small); proving them `Send` nests deeper than the
// default limit.
#![recursion_limit = "256"]

pub mod admission;
pub mod buy;
pub mod cli;
pub mod edge;
pub mod infra;
pub mod rejection;
pub mod sales;
pub mod server;
