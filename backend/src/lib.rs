//! Flashgate order backend: turns the reservations the gateway makes in
//! Redis into order rows, exactly once, and lets operators manage sales.
//!
//! Reservations reach it two ways: the gateway forwards each winner to the
//! order API, and every reservation is also appended to its sale's Redis
//! Stream, which the consumer drains. Both paths insert idempotently on the
//! reservation id, so whichever arrives second is a no-op.
//!
//! Layout:
//! - [`server`]: [`run`], which wires everything and handles shutdown.
//! - [`api`]: the order API (for the gateway) and the admin API, with one
//!   error-to-HTTP mapping in [`api::error`].
//! - [`readiness`]: what the backend waits for; `GET /live`, `GET /ready`.
//! - [`store`]: the SQL database (SQLite, PostgreSQL or MySQL/MariaDB),
//!   one view per table on one handle (`store.orders()`, `.sales()`,
//!   `.switch()`, `.outbox()`, `.locks()`); [`store::schema`] runs the
//!   migrations of `backend/migrations/<flavour>/` at start;
//!   [`store::outbox`] holds the order events for the shop.
//! - [`events`]: delivers the outbox to the shop (signed webhook, AMQP).
//! - [`stream::consumer`]: per-sale Redis Stream consumers;
//!   [`stream::entry`] reads an entry back as a reservation.
//! - [`stream::retention`]: trimming written entries, archiving finished sales.
//! - [`sales`]: preheating sales into Redis, changing them, operator views.
//! - [`switches`]: per-sale pauses and the global switch, database first,
//!   and the sync that brings Redis's copies in line.
//! - [`counted`]: the one way an order enters the database, only while
//!   the sale's Redis counts its reservation (check and insert in one
//!   transaction).
//! - [`fence`]: the failover fence: sales whose Redis may have gone back in
//!   time sell nothing until re-synced from the database (bucket by bucket
//!   for a bucketed sale).
//! - [`redis_io`]: Redis connections, the sale update script, announcing
//!   sale events (each module builds its own scripts from
//!   `flashgate_common::scripts`).
//! - [`recovery`]: restoring a sale Redis lost; returning cancelled items.
//! - [`buckets`]: bucketed sales: installing their buckets, copying the
//!   definition to them, the transit repair of transfers between them,
//!   and [`buckets::stock`], their bases (stock changes, their repair).
//! - [`error`]: [`error::SaleError`], shared by the modules working on sales.
//! - [`timeout`]: cancelling orders unpaid past their sale's timeout.
//! - [`reconcile`]: Redis counters against the order table, and the drift.
//! - [`metrics`]: Prometheus metrics, served at `GET /metrics`.
//! - [`stream::dead_letter`]: entries that could not become orders.
//!
//! No two modules import each other: [`server`] wires the rest, [`api`]
//! calls into [`sales`], [`switches`], [`reconcile`], [`buckets`] and [`stream`],
//! [`reconcile`] into [`buckets`],
//! [`sales`] preheats through [`recovery`], orders are written through
//! [`counted`], sales re-synced through [`fence`], and everything uses [`store`],
//! [`redis_io`] and [`error`], which import nothing above them.

// Product code: a panic is a bug. Handle the error, or `expect` with the
// invariant that makes it impossible (tests may unwrap: clippy.toml).
#![warn(clippy::unwrap_used)]
#![forbid(unsafe_code)]

pub mod api;
pub mod buckets;
pub mod counted;
pub mod error;
pub mod events;
pub mod fence;
pub mod metrics;
pub mod readiness;
pub mod reconcile;
pub mod recovery;
pub mod redis_io;
pub mod sales;
pub mod server;
pub mod store;
pub mod stream;
pub mod switches;
pub mod timeout;

pub use server::{run, StartError};

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    #[test]
    fn the_layout_names_every_module() {
        let lib = include_str!("lib.rs");
        let layout = lib
            .split("\n//! Layout:")
            .nth(1)
            .and_then(|l| l.split("\n//!\n").next())
            .expect("a Layout list");
        let missing: Vec<&str> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
            .filter(|m| {
                !layout.contains(&format!("[`{m}`]")) && !layout.contains(&format!("[`{m}::"))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "modules missing from the Layout list of backend/src/lib.rs: {missing:?}"
        );
    }
}
