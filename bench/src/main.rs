//! `flashgate-bench`: `run` the side-by-side benchmark (what `make bench`
//! does), or `load` one address of your own with one scenario.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use flashgate_bench::load::{self, LoadSpec, Pace, Pick, Target, Users};
use flashgate_bench::run::{self, Profiling, Settings};
use flashgate_bench::{chart, report, stack};

#[derive(Parser)]
#[command(
    name = "flashgate-bench",
    version,
    about = "Flashgate load generator and benchmark"
)]
struct Cli {
    /// Worker threads of the load generator.
    #[arg(long, global = true, default_value_t = 2)]
    loadgen_threads: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start Flashgate and the peers, run every scenario, write the report.
    Run(Box<RunArgs>),
    /// Load one deployment (one you own) with one scenario; prints a summary.
    Load(LoadArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Measured seconds per round.
    #[arg(long, default_value_t = 8.0)]
    secs: f64,
    #[arg(long, default_value_t = 1.5)]
    warmup: f64,
    #[arg(long, default_value_t = 64)]
    conns: usize,
    /// Gateway threads, and nginx workers of each peer (default: cores).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Open-loop buy rate (default: half the slower side's closed-loop rate).
    #[arg(long)]
    open_rate: Option<f64>,
    /// Distinct users (tokens minted before the load).
    #[arg(long, default_value_t = 300_000)]
    users: usize,
    #[arg(long, default_value_t = 100_000)]
    burst_users: usize,
    #[arg(long, default_value_t = 1_000)]
    burst_stock: i64,
    /// Reservations preloaded for the drain measurement (0 = skip).
    #[arg(long, default_value_t = 100_000)]
    drain_orders: usize,
    /// `[limits.buy] user` per_second of the bench's gateway.
    #[arg(long, default_value_t = 1)]
    user_per_second: u32,
    /// `[limits.buy] user` burst of the bench's gateway.
    #[arg(long, default_value_t = 10)]
    user_burst: u32,
    #[arg(long, default_value = "../shared/peers")]
    peers_dir: PathBuf,
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    #[arg(long, default_value = "bench")]
    out_dir: PathBuf,
    /// A database on the server the bench creates its own database on.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pg_url: String,
    #[arg(long, default_value = "flashgate_bench")]
    db_name: String,
    /// MySQL/MariaDB server for the drain into MySQL (a database
    /// `flashgate_bench` is made there); empty to skip it.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,
    /// Skip the peers' redis-evalsha ceiling.
    #[arg(long)]
    no_evalsha: bool,
    #[arg(long, default_value_t = 200_000)]
    evalsha_n_p1: u64,
    #[arg(long, default_value_t = 500_000)]
    evalsha_n_p16: u64,
    #[arg(long, value_enum, default_value_t = Profiling::Auto)]
    profile: Profiling,
    /// Only these scenarios (a_static, a_floor, a_floor_tuned, b_state, c_buy, c_buy_open,
    /// d_soldout, d_soldout_seen, e_hammer, j_not_started, j_unauth, j_bad_input, d_soldout_pow, e_hammer_pow,
    /// i_shop_cache, j_room_admitted, j_room_queued, j_room_crowd (a waiting room under 100,000
    /// visitors), l_tls_page, l_tls_handshake, l_tls_page_floor, l_tls_handshake_floor, f_burst, and the durability rows g_wait0, g_wait1,
    /// h_fsync_everysec, h_fsync_always, and k_buckets: 1 vs 6 buckets on a
    /// 3-master Redis Cluster).
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// A TOML file whose `[redis]` table (`mode = "standalone" | "cluster" |
    /// "sentinel"` and its keys, as in docs/CONFIG.md) names a Redis
    /// deployment to run Flashgate on, instead of a redis-server of the
    /// bench's own (the bench creates its sales there: use a scratch one).
    #[arg(long)]
    redis_config: Option<PathBuf>,
    /// The output of `cargo bench -p flashgate --bench challenge_verify`,
    /// quoted in the report (bench/run.sh writes it).
    #[arg(long)]
    challenge_verify: Option<PathBuf>,
    /// The output of `cargo bench -p flashgate --bench token_verify`,
    /// quoted in the report (bench/run.sh writes it).
    #[arg(long)]
    token_verify: Option<PathBuf>,
    /// The output of `cargo bench -p flashgate --bench user_buckets`,
    /// quoted in the report (bench/run.sh writes it).
    #[arg(long)]
    user_buckets: Option<PathBuf>,
}

/// The "... per call" lines of a micro-benchmark's output file.
fn per_call_lines(path: Option<&PathBuf>) -> anyhow::Result<Vec<String>> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| l.contains("per call"))
        .map(str::to_owned)
        .collect())
}

#[derive(clap::Args)]
struct LoadArgs {
    /// Base URL, e.g. http://127.0.0.1:8080 (plain HTTP/1.1).
    #[arg(long)]
    url: String,
    /// GET this path (e.g. /flashgate/sales/demo or /flashgate/api/sales/demo).
    #[arg(long, conflicts_with = "buy")]
    get: Option<String>,
    /// Buy in this sale (POST /flashgate/api/sales/{id}/buy) with tokens minted from
    /// FLASHGATE_JWT_SECRET.
    #[arg(long)]
    buy: Option<String>,
    /// Every buy from one user (rate-limit test).
    #[arg(long)]
    one_user: bool,
    #[arg(long, default_value_t = 10_000)]
    users: usize,
    #[arg(long, default_value_t = 64)]
    conns: usize,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Open loop at this many requests per second (default: closed loop).
    #[arg(long)]
    rate: Option<f64>,
    /// Allow a target outside 127.0.0.0/8 and ::1. Point it only at
    /// deployments you own.
    #[arg(long)]
    allow_remote: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.loadgen_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flashgate-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let work = async {
            match cli.command {
                Command::Run(a) => run_all(*a).await,
                Command::Load(a) => load_one(a).await,
            }
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // Dropping `work` stops every process it started (by PID).
        tokio::select! {
            r = work => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            _ = term.recv() => Err(anyhow::anyhow!("terminated")),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flashgate-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_all(a: RunArgs) -> anyhow::Result<()> {
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let out_dir = a.out_dir.clone();
    let settings = Settings {
        secs: a.secs,
        warmup: a.warmup,
        conns: a.conns,
        threads,
        rounds: a.rounds.max(1),
        open_rate: a.open_rate,
        user_pool: a.users,
        burst_users: a.burst_users,
        burst_stock: a.burst_stock,
        drain_orders: a.drain_orders,
        user_bucket: (a.user_per_second.max(1), a.user_burst.max(1)),
        peers_dir: std::fs::canonicalize(&a.peers_dir)
            .map_err(|e| anyhow::anyhow!("peers dir {}: {e}", a.peers_dir.display()))?,
        bin_dir: std::fs::canonicalize(&a.bin_dir)
            .map_err(|e| anyhow::anyhow!("bin dir {}: {e}", a.bin_dir.display()))?,
        out_dir: out_dir.clone(),
        pg_url: a.pg_url,
        mysql_url: Some(a.mysql_url).filter(|u| !u.is_empty()),
        db_name: a.db_name,
        evalsha: !a.no_evalsha,
        evalsha_n_p1: a.evalsha_n_p1,
        evalsha_n_p16: a.evalsha_n_p16,
        profile: a.profile,
        scenarios: a.scenarios,
        redis: match &a.redis_config {
            Some(path) => Some(
                flashgate_common::config::Config::load(path)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                    .redis,
            ),
            None => None,
        },
    };
    let mut results = run::run(settings).await?;
    results.pow_verify = per_call_lines(a.challenge_verify.as_ref())?;
    results.token_verify = per_call_lines(a.token_verify.as_ref())?;
    results.user_buckets = per_call_lines(a.user_buckets.as_ref())?;
    std::fs::create_dir_all(&out_dir)?;
    let png = out_dir.join("bench.png");
    let chart = match chart::draw(&results, &png) {
        Ok(()) => Some("bench.png"),
        Err(e) => {
            eprintln!("flashgate-bench: chart not drawn: {e:#}");
            None
        }
    };
    let md = report::markdown(&results, chart);
    std::fs::write(out_dir.join("REPORT.md"), &md)?;
    eprintln!(
        "flashgate-bench: wrote {} and {}",
        out_dir.join("REPORT.md").display(),
        png.display()
    );
    for t in report::targets(&results) {
        eprintln!(
            "target {:<48} {:<10} {}",
            t.name,
            t.met.map_or("n/a", |m| if m { "met" } else { "MISSED" }),
            t.figures
        );
    }
    Ok(())
}

async fn load_one(a: LoadArgs) -> anyhow::Result<()> {
    let hostport = a
        .url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--url must be http://host:port"))?
        .trim_end_matches('/');
    let addr = hostport
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{hostport} does not resolve"))?;
    anyhow::ensure!(
        addr.ip().is_loopback() || a.allow_remote,
        "{addr} is not loopback; pass --allow-remote for a deployment you own"
    );
    let target = match (&a.get, &a.buy) {
        (Some(path), _) => Target::Get { path: path.clone() },
        (None, Some(sale)) => {
            let secret = std::env::var("FLASHGATE_JWT_SECRET").map_err(|_| {
                anyhow::anyhow!("--buy needs FLASHGATE_JWT_SECRET (the gateway's token secret)")
            })?;
            let users = stack::random_users(if a.one_user { 1 } else { a.users.max(1) });
            let headers = stack::mint_bearers(&secret, &users, 3600);
            let pick = if a.one_user {
                Pick::One(0)
            } else {
                Pick::Distinct
            };
            Target::FlashBuy {
                path: format!("/flashgate/api/sales/{sale}/buy"),
                users: Users {
                    headers: std::sync::Arc::new(headers),
                },
                pick,
            }
        }
        (None, None) => anyhow::bail!("give --get PATH or --buy SALE"),
    };
    let spec = LoadSpec {
        addr,
        conns: a.conns,
        pace: a.rate.map_or(Pace::Closed, |rate| Pace::Open { rate }),
        warmup: Duration::from_secs_f64(a.warmup),
        duration: Duration::from_secs_f64(a.secs),
        timeout: Duration::from_secs(5),
        target,
        tag: stack::random_hex(4),
    };
    let (s, _, _) = load::run(spec, || ()).await;
    println!(
        "RESULT requests={} rps={:.1} p50_ms={:.3} p90_ms={:.3} p99_ms={:.3} p999_ms={:.3} max_ms={:.3} errors={} timeouts={} unsent={} statuses={}",
        s.requests, s.rps, s.p50_ms, s.p90_ms, s.p99_ms, s.p999_ms, s.max_ms, s.errors, s.timeouts, s.missed,
        s.statuses.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(",")
    );
    Ok(())
}
