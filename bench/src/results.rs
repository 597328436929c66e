//! What a bench run measured: the scenarios, each round's figures and
//! books, the drain, the profiles and the machine. [`crate::run`] fills it
//! in; [`crate::report`] and [`crate::chart`] read it.

use serde::Serialize;

use crate::load::Summary;
use crate::stack::CommandStat;
use crate::sys::CpuUse;

/// Which side of the comparison a round ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Side {
    Flashgate,
    Peer,
    /// Flashgate's own static page, run on the same gateway right after
    /// each Flashgate round of a rejection row (and of row d°, see
    /// [`crate::report::beside_static`]): the rate that row is held to,
    /// measured beside it rather than minutes earlier.
    Reference,
    /// Pingora's floor answering every request of a rejection row with the
    /// gateway's own answer (`pingora_floor --status 429`), run after
    /// each Flashgate round of row e: the least a Pingora server spends
    /// on that rejection.
    Floor,
}

/// A scenario of the comparison.
pub struct Scenario {
    pub id: &'static str,
    pub title: &'static str,
    /// The peer run against, if the protocol allows one.
    pub peer: Option<&'static str>,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario { id: "a_static", title: "a. Static sale page (GET, same 6.7 KB page on both sides)", peer: Some("nginx-static") },
    Scenario {
        id: "a_floor",
        title: "a⁰. Static sale page beside Pingora's floor (`pingora_floor`: the same bytes, nothing else done)",
        peer: Some("pingora-floor"),
    },
    Scenario {
        id: "a_floor_tuned",
        title: "a⁺. Static sale page beside Pingora's floor with Pingora's server options (`pingora_floor --no-work-stealing --listeners N`: one SO_REUSEPORT listener per thread, each thread its own runtime)",
        peer: Some("pingora-floor-tuned"),
    },
    Scenario { id: "b_state", title: "b. Sale-state JSON (GET /flashgate/api/sales/{id})", peer: None },
    Scenario { id: "c_buy", title: "c. Buy while in stock (closed loop)", peer: Some("openresty-gateway") },
    Scenario { id: "c_buy_open", title: "c'. Buy while in stock (open loop, fixed rate)", peer: Some("openresty-gateway") },
    Scenario { id: "d_soldout", title: "d. Buy after sold out", peer: Some("openresty-gateway") },
    Scenario {
        id: "d_soldout_seen",
        title: "d°. Buy after sold out, from few buyers, each token remembered after its first buy (nearly no request pays a signature check)",
        peer: None,
    },
    Scenario { id: "e_hammer", title: "e. One user hammering (rate-limited)", peer: Some("openresty-gateway") },
    Scenario { id: "j_not_started", title: "j. Buy before the sale starts (not started)", peer: None },
    Scenario { id: "j_unauth", title: "j'. Buy without a token (401)", peer: None },
    Scenario { id: "j_bad_input", title: "j''. Buy whose body is not a JSON object (400)", peer: None },
    Scenario { id: "d_soldout_pow", title: "d*. Buy after sold out, challenge on (`[challenge] mode = \"always\"`)", peer: None },
    Scenario { id: "e_hammer_pow", title: "e*. One user hammering (rate-limited), challenge on", peer: None },
    Scenario { id: "i_shop_cache", title: "i. A shop page through the edge cache (GET, the same 6.7 KB page from the same origin nginx)", peer: Some("nginx-proxy-cache") },
    Scenario {
        id: "j_room_admitted",
        title: "j. A visitor inside a waiting room: the shop's page with a valid room cookie (no Redis call), through the gateway to the same origin nginx",
        peer: None,
    },
    Scenario {
        id: "j_room_queued",
        title: "j'. A visitor waiting in a waiting room: the queue page (one `lua/room_visit.lua` call each)",
        peer: None,
    },
    Scenario {
        id: "l_tls_page",
        title: "l. Sale page over TLS 1.3 + HTTP/2 (h2load, 64 connections × 10 streams; latency columns: h2load's mean as p50, its longest as p99)",
        peer: Some("nginx-tls"),
    },
    Scenario {
        id: "l_tls_handshake",
        title: "l'. Full TLS 1.3 handshakes (h2load, every connection new with one request; latency columns as l.)",
        peer: Some("nginx-tls"),
    },
    Scenario {
        id: "l_tls_page_floor",
        title: "l⁰. Sale page over TLS 1.3 + HTTP/2 beside Pingora's TLS floor (`pingora_floor --tls-cert --tls-key`: the same bytes, nothing else done, Pingora's own TLS listener; h2load as l.)",
        peer: Some("pingora-floor-tls"),
    },
    Scenario {
        id: "l_tls_handshake_floor",
        title: "l'⁰. Full TLS 1.3 handshakes beside Pingora's TLS floor (as l'.)",
        peer: Some("pingora-floor-tls"),
    },
    Scenario { id: "f_burst", title: "f. Burst: 100,000 users, 1,000 items, impatient retries", peer: Some("openresty-gateway") },
];

/// What a durability setting costs, Flashgate against itself: "buy in
/// stock" (closed loop, as `c_buy`) under each setting, shorter rounds,
/// rounds alternating within each pair. `g_*` run with a replica attached
/// to the bench's Redis, `h_*` without one and with the AOF on.
pub const DURABILITY: &[Scenario] = &[
    Scenario {
        id: "g_wait0",
        title: "redis.wait_replicas = 0 (a replica attached)",
        peer: None,
    },
    Scenario {
        id: "g_wait1",
        title: "redis.wait_replicas = 1 (shared WAIT)",
        peer: None,
    },
    Scenario {
        id: "h_fsync_everysec",
        title: "appendonly yes, appendfsync everysec",
        peer: None,
    },
    Scenario {
        id: "h_fsync_always",
        title: "appendonly yes, appendfsync always",
        peer: None,
    },
];

/// Measured seconds of a durability round (at most the run's `--secs`).
pub const DURABILITY_SECS: f64 = 5.0;
/// Rounds of each durability setting; the report shows their median.
pub const DURABILITY_ROUNDS: usize = 3;

/// The books after a buy run.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub ok: bool,
    pub text: String,
    /// Redis script calls and the buys that reached Redis, when both are known.
    pub script_calls: Option<(u64, u64)>,
    /// Redis's commands over the round, for the buy row's breakdown.
    pub redis: Option<RedisCommands>,
}

/// What Redis's commands cost over one buy round (`INFO commandstats`,
/// reset before it, warmup included), and the wins of that same window.
#[derive(Debug, Clone, Serialize)]
pub struct RedisCommands {
    pub wins: u64,
    pub commands: Vec<CommandStat>,
}

/// One round of one scenario on one side.
#[derive(Debug, Clone, Serialize)]
pub struct RoundResult {
    pub scenario: &'static str,
    pub side: Side,
    pub round: usize,
    pub loadavg_before: String,
    pub summary: Summary,
    pub cpu: CpuUse,
    pub check: Option<Check>,
}

/// The backend's drain of preloaded reservations.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    pub orders: usize,
    pub preload_s: f64,
    /// From starting the backend to the last order row.
    pub total_s: f64,
    /// From the first order row to the last.
    pub after_first_s: f64,
    pub backend_cpu_s: f64,
    /// Every PostgreSQL server process over the drain (`None`: another
    /// database).
    pub database_cpu_s: Option<f64>,
    pub ok: bool,
}

impl Drain {
    pub fn rate(&self) -> f64 {
        self.orders as f64 / self.total_s.max(1e-9)
    }

    /// Backend + database CPU µs per order (`None` without the database's).
    pub fn us_per_order(&self) -> Option<f64> {
        self.database_cpu_s
            .map(|db| self.per_order(self.backend_cpu_s + db))
    }

    /// `cpu_s` seconds of CPU over the drain, in µs per order.
    pub fn per_order(&self, cpu_s: f64) -> f64 {
        cpu_s * 1e6 / self.orders.max(1) as f64
    }
}

/// Top frames of one profiled process.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub what: String,
    pub lines: Vec<String>,
}

/// Facts about the machine and the software measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    pub date: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub versions: Vec<(String, String)>,
}

/// Everything the report is written from.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Results {
    pub machine: Machine,
    pub settings: Vec<(String, String)>,
    pub open_rate: f64,
    pub rounds: Vec<RoundResult>,
    pub drain: Option<Drain>,
    /// The same drain into MySQL/MariaDB.
    pub drain_mysql: Option<Drain>,
    pub evalsha: Vec<String>,
    pub profiles: Vec<Profile>,
    pub perf_available: bool,
    pub wall_s: f64,
    /// `cargo bench -p flashgate --bench challenge_verify` output, quoted.
    pub pow_verify: Vec<String>,
    /// `cargo bench -p flashgate --bench token_verify` output, quoted.
    pub token_verify: Vec<String>,
    /// `cargo bench -p flashgate --bench user_buckets` output, quoted.
    pub user_buckets: Vec<String>,
    /// The bucketed-stock rows ([`crate::buckets`]).
    pub buckets: Vec<BucketRound>,
    /// The waiting room under 100,000 visitors ([`crate::room_crowd`]).
    pub room_crowd: Option<crate::room_crowd::Crowd>,
    /// Each drain into PostgreSQL (the first is `drain`) and the COPY
    /// floor measured right after it ([`crate::copy_floor`]), in the
    /// order run.
    pub order_costs: Vec<(Drain, crate::copy_floor::CopyFloor)>,
}

impl Results {
    pub fn of(&self, scenario: &str, side: Side) -> Vec<&RoundResult> {
        self.rounds
            .iter()
            .filter(|r| r.scenario == scenario && r.side == side)
            .collect()
    }
}

/// One round of one bucket count.
#[derive(Debug, Clone, Serialize)]
pub struct BucketRound {
    pub buckets: u32,
    pub round: usize,
    pub summary: Summary,
    /// CPU in the measured window: `gateway`, `backend`, then each master
    /// as `m<port>`, then `loadgen`.
    pub cpu: CpuUse,
    /// Ports of the masters, in the order of their CPU entries.
    pub masters: Vec<u16>,
    /// Buckets whose slot each master serves.
    pub buckets_per_master: Vec<u32>,
    /// Transfers between buckets that moved items during the round
    /// (`flashgate_bucket_transfers_total{result="moved"}`).
    pub transfers: u64,
    pub check: Check,
}

impl BucketRound {
    /// Each master's Redis CPU milliseconds per 1,000 buys of the measured
    /// window, in the order of [`Self::masters`].
    pub fn master_ms_per_k(&self) -> Vec<f64> {
        self.masters
            .iter()
            .map(|p| {
                self.cpu
                    .ms_per_k(&format!("m{p}"), self.summary.requests)
                    .unwrap_or(0.0)
            })
            .collect()
    }

    /// Transfers per 1,000 buys answered in the round (warmup included, as
    /// the transfer counter is).
    pub fn transfers_per_k(&self) -> f64 {
        let buys = self.summary.total_statuses.values().sum::<u64>().max(1);
        self.transfers as f64 * 1000.0 / buys as f64
    }
}
