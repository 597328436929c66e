//! Flashgate's edge gateway, on Pingora.
//!
//! It answers the flash-sale API and the product pages itself and proxies
//! every other path to the shop. A buy runs one atomic script in Redis; only
//! winners are forwarded to the order backend.
//!
//! Layout:
//! - [`server`]: builds the Pingora server from the config.
//! - [`proxy`]: the request path, phase by phase (start reading here).
//! - [`route`]: method + path to a typed route.
//! - [`auth`]: HS256 buyer tokens.
//! - [`deduct`]: the deduct-and-reserve script call and its outcomes.
//! - [`sales`]: sale state read from Redis.
//! - [`state_cache`]: the live-stock micro-cache behind `GET /api/sales/{id}`.
//! - [`forwarder`]: winners sent to the backend in batches, off the request path.
//! - [`orders`]: the client of the order backend.
//! - [`order_cache`]: reservations' orders, cached briefly for pollers.
//! - [`static_pages`]: in-memory product pages and assets (ETag, gzip/brotli, reload).
//! - [`upstreams`]: the shop's upstreams, health checks, hop-by-hop headers.
//! - [`limits`]: user, IP and global token buckets in bounded caches.
//! - [`cluster_limit`]: the optional Redis-side global bucket shared by all gateways.
//! - [`client_ip`]: the client address, believing only trusted proxies.
//! - [`reload`]: live reload of limits and deny lists.
//! - [`runtime_dir`]: the private directory of the upgrade socket and pid file.
//! - [`local_state`]: sale windows and sold-out flags kept at the edge.
//! - [`events`]: sale events between gateways over pub/sub.
//! - [`switches`]: global pause switch and backlog pause.
//! - [`breaker`]: the circuit breaker on Redis.
//! - [`readiness`]: what the gateway waits for (Redis, the backend); `/ready`.
//! - [`redis_client`]: the shared, lazily created Redis connection.
//! - [`metrics`]: Prometheus metrics; [`admin`]: the listener serving them.
//! - [`reply`]: responses and the status of every rejection.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod breaker;
pub mod client_ip;
pub mod cluster_limit;
pub mod deduct;
pub mod events;
pub mod forwarder;
pub mod limits;
pub mod local_state;
pub mod metrics;
pub mod order_cache;
pub mod orders;
pub mod proxy;
pub mod readiness;
pub mod redis_client;
pub mod reload;
pub mod reply;
pub mod route;
pub mod runtime_dir;
pub mod sales;
pub mod server;
pub mod state_cache;
pub mod static_pages;
pub mod switches;
pub mod upstreams;
