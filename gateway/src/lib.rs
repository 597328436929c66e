//! Flashgate's edge gateway, on Pingora.
//!
//! It answers the flash-sale API and the product pages itself and proxies
//! every other path to the shop. A buy runs one atomic script in Redis; only
//! winners are forwarded to the order backend.
//!
//! Layout (a request's path: `proxy` → `route` → `admission` → `buy` /
//! `sales` / `reservations` → `reply`):
//! - [`server`]: builds the Pingora server from the config.
//! - [`proxy`]: the Pingora adapter, phase by phase (start reading here);
//!   `proxy::ctx` the per-request state and its typed labels,
//!   `proxy::session` what is read from and written to the session.
//! - [`route`]: method + path to a typed route.
//! - [`admission`]: deny lists, token buckets and the buyer's token; the
//!   hot-reloadable [`admission::Edge`].
//! - [`buy`]: the buy rules ([`buy::BuyService`]): admission, the local
//!   decision, the deduct, queueing winners and replays; no Pingora types.
//! - [`challenge`]: the optional proof-of-work a buy must carry
//!   (`Flashgate-Pow`), its signed challenges and adaptive difficulty.
//! - [`sales`]: the one sale cache per gateway: a snapshot per sale
//!   (window, listing, remaining), sold-out flags, winners, missing sales.
//! - [`reservations`]: `GET /api/reservations/{id}`.
//! - [`deduct`]: the deduct-and-reserve script call and its outcomes.
//! - [`deduct_batch`]: the concurrent deducts of a sale grouped into one
//!   script call.
//! - [`draw`]: the opening draw: buys of a sale's first `window_ms` held
//!   until one draw across all gateways decides them.
//! - [`auth`]: HS256 buyer tokens.
//! - [`forwarder`]: winners sent to the backend in batches, off the request path.
//! - [`orders`]: the client of the order backend.
//! - [`order_cache`]: reservations' orders, cached briefly for pollers.
//! - [`static_pages`]: in-memory product pages and assets (ETag, gzip/brotli, reload).
//! - [`upstreams`]: the shop's upstreams, health checks, hop-by-hop headers.
//! - [`shop_cache`]: the edge cache of the shop's responses (pingora-cache),
//!   its rules, its bounded store and the admin purge.
//! - [`tls`]: the HTTPS listener: certificates by SNI, their reload, the
//!   redirect of plain page requests.
//! - [`limits`]: user, IP and global token buckets in bounded caches.
//! - [`cluster_limit`]: the optional Redis-side global bucket shared by all gateways.
//! - [`client_ip`]: the client address, believing only trusted proxies.
//! - [`reload`]: live reload of limits and deny lists, and SIGHUP asking
//!   every watcher to reload at once.
//! - [`runtime_dir`]: the private directory of the upgrade socket and pid file.
//! - [`events`]: sale events between gateways over pub/sub.
//! - [`switches`]: global pause switch and backlog pause.
//! - [`breaker`]: the circuit breaker on Redis.
//! - [`task`]: long-running tasks, run by the server as Pingora background services.
//! - [`clock`]: the wall clock of the buy rules, settable in tests.
//! - [`readiness`]: what the gateway waits for (Redis, the backend); `/ready`.
//! - [`redis_client`]: the shared, lazily created Redis connection.
//! - [`replica_wait`]: wins held until `redis.wait_replicas` replicas have
//!   them, one shared `WAIT` per round.
//! - [`metrics`]: Prometheus metrics; [`admin`]: the listener serving them.
//! - [`rejection`]: every way a request is turned down, as values.
//! - [`reply`]: responses, and the HTTP status of every rejection and buy outcome.

// Product code: a panic is a bug. Handle the error, or `expect` with the
// invariant that makes it impossible (tests may unwrap: clippy.toml).
#![warn(clippy::unwrap_used)]
#![forbid(unsafe_code)]
// The request futures hold boxed sub-futures (kept out of line to keep the
// per-request future small); proving them `Send` nests deeper than the
// default limit.
#![recursion_limit = "256"]

pub mod admin;
pub mod admission;
pub mod auth;
pub mod breaker;
pub mod buy;
pub mod challenge;
pub mod client_ip;
pub mod clock;
pub mod cluster_limit;
pub mod deduct;
pub mod deduct_batch;
pub mod draw;
pub mod events;
pub mod forwarder;
pub mod limits;
pub mod metrics;
pub mod order_cache;
pub mod orders;
pub mod proxy;
pub mod readiness;
pub mod redis_client;
pub mod rejection;
pub mod reload;
pub mod replica_wait;
pub mod reply;
pub mod reservations;
pub mod route;
pub mod runtime_dir;
pub mod sales;
pub mod server;
pub mod shop_cache;
pub mod static_pages;
pub mod switches;
pub mod task;
#[cfg(test)]
mod testing;
pub mod tls;
pub mod upstreams;
