//! Test harness: real processes on loopback.
//!
//! Each test starts its own `redis-server` on a free port (so fault tests may
//! kill or stop it), its own backend and gateway binaries, and a demo shop,
//! all under a private temp dir. Everything is stopped by PID on drop.
//!
//! The binaries are taken from the cargo target dir next to the test
//! executable; `make test` builds them first.
//!
//! Layout:
//! - `flashgate_testkit` (re-exported here): ports, processes, a
//!   redis-server and a PostgreSQL of the test's own.
//! - [`stack`]: a whole stack (Redis, backend, gateway, demo shop) and what
//!   a test does to it (restart, kill, admin calls, books).
//! - [`browser`]: headless Chromium and the scripts in `tests/browser`.
//! - [`client`]: buyer tokens, one buy, a burst of buys, JSON GETs.
//! - [`db`]: what the tests read straight from an order database.
//! - [`local_run`]: `make run` (deploy/local/run.sh) on ports of its own.
//! - [`oscar`]: a real open-source shop (django-oscar), installed and
//!   run by `tests/shop/oscar.sh`.
//! - [`pki`]: a CA of the test's own and certificates for the HTTPS listener.
//! - [`python`]: a venv with PyPI packages and scripts a shop would run.

pub mod browser;
pub mod client;
pub mod db;
pub mod local_run;
pub mod oscar;
pub mod pki;
pub mod python;
pub mod stack;
pub mod test_shop;

pub use client::{
    buy, buy_all, get_json, header, random_user, token, token_with, try_buy, wait_ready, Attempt,
    Outcome,
};
pub use db::{db_order_rows, db_orders, MysqlDatabase, OrderRow, PostgresDatabase};
pub use flashgate_testkit::*;
pub use stack::{
    node, redis_tls_files, redis_toml, spawn_as, spawn_wrapped, wait_subscribers, Deployment,
    Early, RedisMode, SaleInRedis, Stack, StackOptions,
};

/// Secret the test gateways verify buyer tokens with (secrets under 32
/// bytes are refused at start).
pub const JWT_SECRET: &str = "test-jwt-secret-not-for-production-0000";
/// Admin token of the test backends.
pub const ADMIN_TOKEN: &str = "test-admin-token-not-for-production-000";
/// Token the test gateways present on the backend's order API.
pub const INTERNAL_TOKEN: &str = "test-internal-token-gateways-to-backend-0001";
/// Key the test gateways sign proof-of-work challenges with (used only by
/// stacks whose config turns `[challenge]` on).
pub const CHALLENGE_SECRET: &str = "test-challenge-secret-not-for-production-01";
/// Key the test gateways sign waiting-room cookies with (used only by
/// stacks whose config has `[[shop.waiting_rooms]]`).
pub const WAITING_ROOM_SECRET: &str = "test-waiting-room-secret-not-for-production";
/// Token the test shop presents to confirm payments.
pub const SHOP_TOKEN: &str = "test-shop-token-payments-to-backend-000001";
/// Key the test backends sign order event webhooks with (used only by
/// stacks whose config sets `events.webhook_url`).
/// Written as Standard Webhooks writes secrets: `whsec_` and the base64 of
/// the key (here the 32 bytes `test-webhook-key-not-for-prod-01`).
pub const WEBHOOK_SECRET: &str = "whsec_dGVzdC13ZWJob29rLWtleS1ub3QtZm9yLXByb2QtMDE=";
/// Key the test gateways sign checkout hand-off tokens with (the shop's
/// copy verifies them: docs/CHECKOUT.md).
pub const HANDOFF_SECRET: &str = "test-handoff-secret-not-for-production-01";
