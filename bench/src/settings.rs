//! What `flashgate-bench run` is told (its command line, parsed by
//! `main.rs`): read by the run and by each section of it.

use std::path::PathBuf;

/// Everything `flashgate-bench run` is told.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Measured seconds per round (after the warmup).
    pub secs: f64,
    pub warmup: f64,
    pub conns: usize,
    /// Gateway threads = nginx workers of each peer.
    pub threads: usize,
    pub rounds: usize,
    /// Open-loop buy rate; `None`: half the slower side's closed-loop rate.
    pub open_rate: Option<f64>,
    pub user_pool: usize,
    pub burst_users: usize,
    pub burst_stock: i64,
    pub drain_orders: usize,
    /// `[limits.buy] user` of the bench's gateway: (per_second, burst).
    pub user_bucket: (u32, u32),
    /// `--redis-config`: the `[redis]` table of a deployment to run on.
    pub redis: Option<flashgate_common::config::RedisConfig>,
    pub peers_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub out_dir: PathBuf,
    /// Server to create the bench database on (its `postgres` database).
    pub pg_url: String,
    /// MySQL/MariaDB server (no database in the URL) for a second drain,
    /// into a database of the bench's own; `None`: that drain is skipped.
    pub mysql_url: Option<String>,
    pub db_name: String,
    pub evalsha: bool,
    pub evalsha_n_p1: u64,
    pub evalsha_n_p16: u64,
    pub profile: Profiling,
    pub scenarios: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profiling {
    /// Profile the scenarios whose target was missed.
    Auto,
    Always,
    Never,
}
