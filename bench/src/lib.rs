//! Flashgate's load generator and side-by-side benchmark.
//!
//! Layout:
//! - [`load`]: the HTTP/1.1 load generator (closed loop, open loop, burst),
//!   latencies in an HDR histogram.
//! - [`stack`]: starts Flashgate (Redis, backend on PostgreSQL, gateway) and
//!   the peers (nginx, OpenResty gateway + Redis) on loopback ports of their
//!   own; mints buyer tokens in-process.
//! - [`run`]: the scenarios in alternating rounds, the books after every buy
//!   run, the backend drain, profiles.
//! - [`buckets`]: the bucketed-stock rows, on a Redis Cluster of the
//!   bench's own.
//! - [`settings`], [`books`]: what a run is told, and the books check
//!   after every Flashgate buy run.
//! - [`results`]: what a run measured, written by [`run`] and read by
//!   [`report`] and [`chart`].
//! - [`report`], [`chart`]: `bench/REPORT.md` and its PNG chart.
//! - [`tls`]: the HTTPS rows (certificate, h2load).
//! - [`copy_floor`]: PostgreSQL's own cost of the drain's rows (`COPY`).
//! - [`sys`]: processes stopped by PID, CPU time from `/proc`.
#![forbid(unsafe_code)]

pub mod books;
pub mod buckets;
pub mod chart;
pub mod copy_floor;
pub mod load;
pub mod report;
pub mod results;
pub mod room_crowd;
pub mod run;
pub mod settings;
pub mod stack;
pub mod sys;
pub mod tls;
