//! The side-by-side benchmark: starts both sides, runs every scenario in
//! alternating rounds (Flashgate, peer, Flashgate, peer), checks the books
//! after every buy run, measures the backend's drain, profiles what misses
//! its target, and hands everything to [`crate::report`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use flashgate_common::keys::SaleKeys;
use flashgate_common::reservation::{fields, reservation_id, Reservation};
use http::HeaderValue;

use crate::books::check_flashgate;
use crate::load::{self, BurstSpec, LoadSpec, Pace, Pick, Target, Users};
use crate::results::{
    Check, Drain, Machine, Profile, RedisCommands, Results, RoundResult, Side, DURABILITY,
    DURABILITY_ROUNDS, DURABILITY_SECS, SCENARIOS,
};
use crate::stack::{
    calls_of, command_stats, mint_bearers, random_users, script_calls, start_replica, Flashgate,
    FlashgateOptions, Peers,
};
use crate::sys::{self, snap, CpuUse, Proc, Snap, Watched, WorkDir};

pub use crate::settings::{Profiling, Settings};

/// Shared state of a run.
struct Ctx {
    s: Settings,
    fg: Flashgate,
    /// `None` when no selected scenario runs against a peer.
    peers: Option<Peers>,
    pg: sqlx::PgPool,
    bearers: Users,
    peer_ids: Users,
    /// One fresh user per hammer round and side.
    hammer_bearers: Users,
    hammer_ids: Users,
    tag: String,
    /// The gateway with `redis.wait_replicas = 1` (address, pid), while the
    /// durability rows run.
    wait_gateway: Option<(std::net::SocketAddr, u32)>,
    /// The gateway with `[challenge] mode = "always"` (address, pid),
    /// while the `*_pow` rows run.
    challenge_gateway: Option<(std::net::SocketAddr, u32)>,
    /// The gateway whose shop is the peers' static nginx, with
    /// `[shop.cache]` on (address, pid), for `i_shop_cache`.
    shop_cache_gateway: Option<(std::net::SocketAddr, u32)>,
    /// The gateway whose one-seat waiting room guards the peers' static
    /// page (address, pid), and the cookies of the visitor inside and of
    /// one waiting, for the `j_room_*` rows.
    room_gateway: Option<(std::net::SocketAddr, u32)>,
    room_cookies: Option<(HeaderValue, HeaderValue)>,
    /// The gateway with `[gateway.tls]` on (its HTTPS address, pid), for
    /// the HTTPS rows.
    tls_gateway: Option<(std::net::SocketAddr, u32)>,
}

/// The rows run against the gateway that asks every buy for a proof of
/// work; the scenario each repeats.
/// The shop page through the edge cache, beside nginx `proxy_cache`.
const SHOP_CACHE: &str = "i_shop_cache";

/// The rows run against the gateway with a one-seat waiting room.
const ROOM_ROWS: [&str; 2] = ["j_room_admitted", "j_room_queued"];

/// Starts the gateway whose one-seat room guards the peers' static page,
/// and takes its visitors' cookies.
async fn start_room_gateway(ctx: &mut Ctx) -> anyhow::Result<Proc> {
    let peers = ctx.peers.as_ref().context("the peers were not started")?;
    let room = format!(
        "[shop]\nupstreams = [\"{}\"]\n[[shop.waiting_rooms]]\nname = \"seat\"\npaths = [\"/p/\"]\n\
         active_users = 1\nsession_seconds = 86400\n",
        peers.static_addr
    );
    let (gateway, addr) = ctx
        .fg
        .start_gateway_with("flashgate-room", "", &room)
        .await?;
    ctx.room_gateway = Some((addr, gateway.pid));
    ctx.room_cookies = Some(room_cookies(&ctx.fg.http, addr).await?);
    Ok(gateway)
}

/// The cookies of the visitor let into the one-seat room (renewed to a
/// whole session by their second request) and of the one waiting behind
/// them.
async fn room_cookies(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
) -> anyhow::Result<(HeaderValue, HeaderValue)> {
    let visit = |cookie: Option<HeaderValue>| async move {
        let mut req = http.get(format!("http://{addr}/p/1001.html"));
        if let Some(cookie) = cookie {
            req = req.header(http::header::COOKIE, cookie);
        }
        let resp = req.send().await?;
        let cookie = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .context("the room gave no cookie")?
            .to_owned();
        anyhow::Ok(HeaderValue::from_str(&cookie)?)
    };
    let arrived = visit(None).await?;
    let inside = visit(Some(arrived)).await?;
    let queued = visit(None).await?;
    Ok((inside, queued))
}

/// The HTTPS rows (h2load, [`crate::tls`]).
const TLS_ROWS: &[(&str, crate::tls::Mode)] = &[
    ("l_tls_page", crate::tls::Mode::Page),
    ("l_tls_handshake", crate::tls::Mode::Handshake),
    ("l_tls_page_floor", crate::tls::Mode::Page),
    ("l_tls_handshake_floor", crate::tls::Mode::Handshake),
];

/// A buy body the gateway refuses (valid JSON, not an object).
const BAD_BODY: &[u8] = b"[1]";

const CHALLENGED: &[(&str, &str)] = &[("d_soldout_pow", "d_soldout"), ("e_hammer_pow", "e_hammer")];

fn probe(watched: Vec<Watched>) -> impl Fn() -> Snap + Send + Sync {
    move || snap(&watched)
}

const BIG_STOCK: i64 = 10_000_000;
const SALE_PAGE_PATH: &str = "/flashgate/sales/bench";

/// Runs the whole benchmark.
///
/// # Errors
/// When a side cannot be started or the database cannot be created.
pub async fn run(s: Settings) -> anyhow::Result<Results> {
    let started = Instant::now();
    let machine = machine();
    let work = WorkDir::new()?;
    eprintln!("bench: work dir {}", work.0.display());

    // The bench's own database, dropped at the end.
    let admin_pg = sqlx::PgPool::connect(&s.pg_url)
        .await
        .with_context(|| format!("connect {}", s.pg_url))?;
    sqlx::query(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        s.db_name
    ))
    .execute(&admin_pg)
    .await?;
    sqlx::query(&format!("CREATE DATABASE {}", s.db_name))
        .execute(&admin_pg)
        .await?;
    let db_url = match s.pg_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{}", s.db_name),
        None => anyhow::bail!("pg url without a database: {}", s.pg_url),
    };
    let result = run_with_db(&s, &work, &db_url, machine, started).await;
    let _ = sqlx::query(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        s.db_name
    ))
    .execute(&admin_pg)
    .await;
    admin_pg.close().await;
    result
}

async fn run_with_db(
    s: &Settings,
    work: &WorkDir,
    db_url: &str,
    mut machine: Machine,
    started: Instant,
) -> anyhow::Result<Results> {
    let page = s.peers_dir.join("html/p/1001.html");
    let cert = crate::tls::make_cert(&work.0).context("the HTTPS rows' certificate")?;
    let fg = Flashgate::start(
        &work.0,
        &FlashgateOptions {
            bin_dir: s.bin_dir.clone(),
            threads: s.threads,
            page,
            database_url: db_url.to_owned(),
            user_bucket: s.user_bucket,
            redis: s.redis.clone(),
        },
    )
    .await?;
    let wanted = |id: &str| s.scenarios.is_empty() || s.scenarios.iter().any(|x| x == id);
    let peers = if SCENARIOS
        .iter()
        .any(|sc| sc.peer.is_some() && wanted(sc.id))
    {
        let peers = Peers::start(&work.0, &s.peers_dir, &s.bin_dir, s.threads, &cert).await?;
        eprintln!(
            "bench: flashgate on {}, nginx-static on {}, pingora-floor on {}, openresty-gateway on {}",
            fg.gateway_addr, peers.static_addr, peers.floor_addr, peers.gw_addr
        );
        Some(peers)
    } else {
        eprintln!(
            "bench: flashgate on {}; no peer needed by the selected scenarios",
            fg.gateway_addr
        );
        None
    };
    let pg = sqlx::PgPool::connect(db_url).await?;
    if let Ok((v,)) = sqlx::query_as::<_, (String,)>("SHOW server_version")
        .fetch_one(&pg)
        .await
    {
        machine.versions.push(("PostgreSQL".into(), v));
    }

    let t = Instant::now();
    let ids = random_users(s.user_pool.max(s.burst_users));
    let bearers = mint_bearers(&fg.jwt_secret, &ids, 7200);
    // Two per round (Flashgate, peer), one per round of the challenged row.
    let hammer = random_users(3 * s.rounds + 3);
    let hammer_bearers = mint_bearers(&fg.jwt_secret, &hammer, 7200);
    eprintln!(
        "bench: minted {} tokens in {:.2}s",
        bearers.len() + hammer_bearers.len(),
        t.elapsed().as_secs_f64()
    );
    let header_values = |v: &[String]| Users {
        headers: std::sync::Arc::new(
            v.iter()
                .map(|u| HeaderValue::from_str(u).expect("uuid"))
                .collect(),
        ),
    };
    let mut ctx = Ctx {
        s: s.clone(),
        peer_ids: header_values(&ids),
        bearers: Users {
            headers: std::sync::Arc::new(bearers),
        },
        hammer_ids: header_values(&hammer),
        hammer_bearers: Users {
            headers: std::sync::Arc::new(hammer_bearers),
        },
        fg,
        peers,
        pg,
        tag: crate::stack::random_hex(4),
        wait_gateway: None,
        challenge_gateway: None,
        shop_cache_gateway: None,
        room_gateway: None,
        room_cookies: None,
        tls_gateway: None,
    };
    // Stopped when dropped, at the end of the run.
    let _tls_gateway = if TLS_ROWS.iter().any(|(id, _)| wanted(id)) {
        anyhow::ensure!(
            crate::tls::h2load_available(),
            "h2load not found (Debian package nghttp2-client; bench/run.sh installs it)"
        );
        let tls_addr = sys::loopback(sys::free_port());
        let tables = format!(
            "[gateway.tls]\nlisten = \"{tls_addr}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            cert.cert.display(),
            cert.key.display()
        );
        let (gateway, _) = ctx
            .fg
            .start_gateway_with("flashgate-tls", "", &tables)
            .await?;
        anyhow::ensure!(
            sys::wait_port(tls_addr, Duration::from_secs(30)).await,
            "the TLS gateway does not listen on {tls_addr}"
        );
        ctx.tls_gateway = Some((tls_addr, gateway.pid));
        Some(gateway)
    } else {
        None
    };
    // Stopped when dropped, at the end of the run.
    let _challenge_gateway = if CHALLENGED.iter().any(|(id, _)| wanted(id)) {
        let (gateway, addr) = ctx
            .fg
            .start_gateway_with(
                "flashgate-pow",
                "",
                "[challenge]\nmode = \"always\"\ndifficulty_bits = 14\n",
            )
            .await?;
        ctx.challenge_gateway = Some((addr, gateway.pid));
        Some(gateway)
    } else {
        None
    };
    // Stopped when dropped, at the end of the run.
    let _shop_cache_gateway = match (&ctx.peers, wanted(SHOP_CACHE)) {
        (Some(peers), true) => {
            let shop = format!(
                "[shop]\nupstreams = [\"{}\"]\n[shop.cache]\nenabled = true\n",
                peers.static_addr
            );
            let (gateway, addr) = ctx
                .fg
                .start_gateway_with("flashgate-shop-cache", "", &shop)
                .await?;
            ctx.shop_cache_gateway = Some((addr, gateway.pid));
            Some(gateway)
        }
        _ => None,
    };
    ctx.fg.put_sale("bench", BIG_STOCK, 1).await?;
    ctx.fg.put_sale("state", BIG_STOCK, 1).await?;

    let mut rounds = Vec::new();
    let mut open_rate = s.open_rate.unwrap_or(0.0);
    // The waiting-room gateway's ticks are script calls on the bench's
    // Redis: it runs beside its own rows only, never beside a buy run
    // whose script calls are counted. Stopped when dropped.
    let mut room_gateway = None;
    for sc in SCENARIOS {
        if !s.scenarios.is_empty() && !s.scenarios.iter().any(|x| x == sc.id) {
            continue;
        }
        if !ROOM_ROWS.contains(&sc.id) {
            room_gateway = None;
        } else if room_gateway.is_none() {
            room_gateway = Some(start_room_gateway(&mut ctx).await?);
        }
        if sc.id == "c_buy_open" && s.open_rate.is_none() {
            open_rate = auto_open_rate(&rounds);
            eprintln!("bench: open-loop buy rate {open_rate:.0}/s (half the slower side's closed-loop rate)");
        }
        for round in 1..=s.rounds {
            let r = flashgate_round(&ctx, sc.id, round, open_rate)
                .await
                .with_context(|| format!("{} flashgate round {round}", sc.id))?;
            eprintln!("{}", line(&r));
            rounds.push(r);
            if crate::report::beside_static(sc.id) {
                let r = RoundResult {
                    side: Side::Reference,
                    scenario: sc.id,
                    ..flashgate_round(&ctx, "a_static", round, open_rate)
                        .await
                        .with_context(|| format!("{} reference round {round}", sc.id))?
                };
                eprintln!("{}", line(&r));
                rounds.push(r);
            }
            if sc.id == "e_hammer" && ctx.peers.is_some() {
                let r = rejection_floor_round(&ctx, sc.id, round)
                    .await
                    .with_context(|| format!("{} floor round {round}", sc.id))?;
                eprintln!("{}", line(&r));
                rounds.push(r);
            }
            if sc.peer.is_some() {
                let r = peer_round(&ctx, sc.id, round, open_rate)
                    .await
                    .with_context(|| format!("{} peer round {round}", sc.id))?;
                eprintln!("{}", line(&r));
                rounds.push(r);
            }
        }
    }

    drop(room_gateway);

    if DURABILITY.iter().any(|sc| wanted(sc.id)) {
        if ctx.fg.redis.is_some() {
            rounds.extend(
                durability(&mut ctx, &work.0, &wanted)
                    .await
                    .context("durability rows")?,
            );
        } else {
            eprintln!("bench: durability rows skipped: they change the bench's own Redis, not one given with --redis-config");
        }
    }

    let buckets = if wanted(crate::buckets::SCENARIO) {
        crate::buckets::run(s, &work.0)
            .await
            .context("bucketed stock rows")?
    } else {
        Vec::new()
    };

    let room_crowd = match &ctx.peers {
        Some(peers) if wanted(crate::room_crowd::SCENARIO) => {
            let (gateway, addr) = ctx
                .fg
                .start_gateway_with(
                    "flashgate-crowd",
                    "",
                    &crate::room_crowd::room_toml(peers.static_addr),
                )
                .await?;
            let crowd = crate::room_crowd::measure(&ctx.fg, addr, 100_000, Duration::from_secs(10))
                .await
                .context("the waiting room crowd")?;
            drop(gateway);
            eprintln!(
                "bench: room crowd: {} joined in {:.1}s, {:.0} answers/s, {:.1} to the shop/s, most inside {}",
                crowd.visitors,
                crowd.join_s,
                crowd.answers_per_s(),
                crowd.shop_per_s(),
                crowd.most_inside
            );
            Some(crowd)
        }
        _ => None,
    };

    // The drain and its COPY floor alternate, `s.rounds` of each, so the
    // order-cost target compares figures measured side by side: either
    // alone swings by a fifth between runs on this shared machine. Each
    // starts on an empty `orders` table (the buy rows' books were checked
    // already): a table grown by the run before would make every later
    // insert dearer than the first.
    let mut order_costs = Vec::new();
    if s.drain_orders > 0 {
        let counter = OrderCounter::Postgres(ctx.pg.clone());
        for round in 1..=s.rounds.max(1) {
            let sale = if round == 1 {
                "drain".to_owned()
            } else {
                format!("drain-{round}")
            };
            empty_orders(&ctx.pg).await?;
            let d = measure_drain(&mut ctx, &sale, s.drain_orders, None, &counter).await?;
            empty_orders(&ctx.pg).await?;
            eprintln!(
                "bench: drain {} orders in {:.2}s = {:.0}/s (ok={})",
                d.orders,
                d.total_s,
                d.rate(),
                d.ok
            );
            let f = crate::copy_floor::measure(&ctx.pg, s.drain_orders, crate::stack::ORDER_BATCH)
                .await
                .context("the COPY floor")?;
            eprintln!(
                "bench: COPY floor {} rows in batches of {} in {:.2}s, database CPU {:.2}s = {:.1} µs per row",
                f.rows,
                f.batch,
                f.secs,
                f.database_cpu_s,
                f.us_per_row()
            );
            order_costs.push((d, f));
        }
    }
    let drain_mysql = match (&s.mysql_url, s.drain_orders) {
        (Some(url), n) if n > 0 => {
            let d = mysql_drain(&mut ctx, url, n, &mut machine)
                .await
                .context("the MySQL drain")?;
            eprintln!(
                "bench: drain into MySQL {} orders in {:.2}s = {:.0}/s (ok={})",
                d.orders,
                d.total_s,
                d.rate(),
                d.ok
            );
            Some(d)
        }
        _ => None,
    };

    let mut results = Results {
        machine,
        settings: Vec::new(),
        open_rate,
        rounds,
        drain: order_costs.first().map(|(d, _)| d.clone()),
        drain_mysql,
        evalsha: Vec::new(),
        profiles: Vec::new(),
        perf_available: perf_available(),
        wall_s: 0.0,
        pow_verify: Vec::new(),
        token_verify: Vec::new(),
        user_buckets: Vec::new(),
        buckets,
        room_crowd,
        order_costs,
    };

    if s.profile != Profiling::Never && results.perf_available {
        let targets = crate::report::targets(&results);
        let missed = |id: &str| {
            s.profile == Profiling::Always
                || targets.iter().any(|t| t.id == id && t.met == Some(false))
        };
        if missed("static") || missed("floor") {
            results
                .profiles
                .extend(taken("a_static", profile_load(&ctx, "a_static").await));
        }
        if missed("buy") || missed("buy_cpu") || missed("open_tail") {
            results
                .profiles
                .extend(taken("c_buy", profile_load(&ctx, "c_buy").await));
        }
        if missed("soldout") || missed("moonshot") {
            results
                .profiles
                .extend(taken("d_soldout", profile_load(&ctx, "d_soldout").await));
        }
        if missed("ratelimited") || missed("ratelimited_peer") || missed("moonshot") {
            results
                .profiles
                .extend(taken("e_hammer", profile_load(&ctx, "e_hammer").await));
        }
        for (id, scenario) in [
            ("not_started", "j_not_started"),
            ("unauth", "j_unauth"),
            ("bad_input", "j_bad_input"),
        ] {
            if missed(id) {
                results
                    .profiles
                    .extend(taken(scenario, profile_load(&ctx, scenario).await));
            }
        }
        for (id, mode) in TLS_ROWS {
            if missed(id.trim_start_matches("l_")) && ctx.tls_gateway.is_some() {
                let profile = profile_tls(&ctx, *mode, id).await.map(|p| vec![p]);
                results.profiles.extend(taken(id, profile));
            }
        }
        if missed("drain") || missed("order_cpu") {
            let n = (s.drain_orders / 3).max(1000);
            let mut lines = Vec::new();
            let counter = OrderCounter::Postgres(ctx.pg.clone());
            measure_drain(&mut ctx, "drain-profiled", n, Some(&mut lines), &counter).await?;
            results.profiles.push(Profile {
                what: format!("backend draining {n} preloaded reservations (perf, self time)"),
                lines,
            });
        }
    }

    // Both sides off before the Redis ceiling runs, so it has the machine.
    drop(ctx);
    if s.evalsha {
        results.evalsha = evalsha(s, &work.0);
    }
    results.settings = vec![
        ("measured seconds per round".into(), format!("{}", s.secs)),
        ("warmup seconds".into(), format!("{}", s.warmup)),
        ("connections".into(), s.conns.to_string()),
        (
            "gateway threads = nginx workers".into(),
            s.threads.to_string(),
        ),
        ("rounds per side".into(), s.rounds.to_string()),
        ("load generator threads".into(), "2 (tokio)".into()),
        ("open-loop buy rate".into(), format!("{open_rate:.0}/s")),
        (
            "distinct users (tokens minted)".into(),
            s.user_pool.max(s.burst_users).to_string(),
        ),
        (
            "Flashgate [limits.buy] user".into(),
            format!(
                "per_second = {}, burst = {}",
                s.user_bucket.0, s.user_bucket.1
            ),
        ),
        (
            "peer limits".into(),
            "user 30 per 60 s, IP and global 1e9 (as in its own scenarios)".into(),
        ),
    ];
    results.wall_s = started.elapsed().as_secs_f64();
    Ok(results)
}

/// The durability rows: `wait_replicas` 0 and 1 with a replica attached to
/// the bench's Redis (a second gateway carries the 1), then the AOF with
/// `appendfsync` everysec and always (replica gone, switched live with
/// `CONFIG SET`); rounds alternate within each pair. Redis is left as it
/// was found (no AOF, no replica).
async fn durability(
    ctx: &mut Ctx,
    dir: &std::path::Path,
    wanted: &dyn Fn(&str) -> bool,
) -> anyhow::Result<Vec<RoundResult>> {
    let mut rounds = Vec::new();
    let port = match &ctx.fg.redis_config.target {
        flashgate_common::config::RedisTarget::Standalone { url } => url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok()),
        _ => None,
    }
    .context("the bench's own Redis has a port")?;
    if wanted("g_wait0") || wanted("g_wait1") {
        let (mut replica, _) = start_replica(dir, "flashgate-redis-replica", port).await?;
        let (mut gateway, addr) = ctx
            .fg
            .start_gateway_with("flashgate-wait1", "wait_replicas = 1", "")
            .await?;
        ctx.wait_gateway = Some((addr, gateway.pid));
        let result = durability_pair(ctx, ["g_wait0", "g_wait1"], wanted, &mut rounds).await;
        ctx.wait_gateway = None;
        gateway.stop();
        replica.stop();
        result?;
    }
    if wanted("h_fsync_everysec") || wanted("h_fsync_always") {
        let mut redis = ctx.fg.redis().await?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendonly")
            .arg("yes")
            .query_async::<()>(&mut redis)
            .await?;
        // Turning the AOF on rewrites it in the background first.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut redis)
                .await?;
            if info.contains("aof_enabled:1")
                && info.contains("aof_rewrite_in_progress:0")
                && !info.contains("aof_rewrite_scheduled:1")
            {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the AOF rewrite did not finish in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let result = durability_pair(
            ctx,
            ["h_fsync_everysec", "h_fsync_always"],
            wanted,
            &mut rounds,
        )
        .await;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendonly")
            .arg("no")
            .query_async::<()>(&mut redis)
            .await?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendfsync")
            .arg("everysec")
            .query_async::<()>(&mut redis)
            .await?;
        result?;
    }
    Ok(rounds)
}

/// The rounds of two durability settings, alternating; an `h_fsync_*`
/// row sets its `appendfsync` first.
async fn durability_pair(
    ctx: &Ctx,
    pair: [&'static str; 2],
    wanted: &dyn Fn(&str) -> bool,
    rounds: &mut Vec<RoundResult>,
) -> anyhow::Result<()> {
    for round in 1..=DURABILITY_ROUNDS {
        for scenario in pair.into_iter().filter(|id| wanted(id)) {
            if let Some(mode) = scenario.strip_prefix("h_fsync_") {
                let mut redis = ctx.fg.redis().await?;
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("appendfsync")
                    .arg(mode)
                    .query_async::<()>(&mut redis)
                    .await?;
            }
            let r = flashgate_round(ctx, scenario, round, 0.0)
                .await
                .with_context(|| format!("{scenario} round {round}"))?;
            eprintln!("{}", line(&r));
            rounds.push(r);
        }
    }
    Ok(())
}

fn line(r: &RoundResult) -> String {
    format!(
        "bench: {:<11} {:<9} r{} load {:<15} {:>9.0} req/s p50 {:.2} p99 {:.2} p999 {:.2} ms  {}{}",
        r.scenario,
        format!("{:?}", r.side),
        r.round,
        r.loadavg_before,
        r.summary.rps,
        r.summary.p50_ms,
        r.summary.p99_ms,
        r.summary.p999_ms,
        r.summary.statuses_text(),
        r.check.as_ref().map_or(String::new(), |c| format!(
            "  check {}: {}",
            if c.ok { "OK" } else { "FAIL" },
            c.text
        )),
    )
}

fn auto_open_rate(rounds: &[RoundResult]) -> f64 {
    let mean = |side| {
        let v: Vec<f64> = rounds
            .iter()
            .filter(|r| r.scenario == "c_buy" && r.side == side)
            .map(|r| r.summary.rps)
            .collect();
        if v.is_empty() {
            f64::INFINITY
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let slower = mean(Side::Flashgate).min(mean(Side::Peer));
    if slower.is_finite() {
        ((slower * 0.5 / 100.0).floor() * 100.0).max(100.0)
    } else {
        1000.0
    }
}

impl Ctx {
    fn spec(
        &self,
        addr: std::net::SocketAddr,
        target: Target,
        pace: Pace,
        tag: String,
    ) -> LoadSpec {
        LoadSpec {
            addr,
            conns: self.s.conns,
            pace,
            warmup: Duration::from_secs_f64(self.s.warmup),
            duration: Duration::from_secs_f64(self.s.secs),
            timeout: Duration::from_secs(5),
            target,
            tag,
        }
    }

    fn burst(&self, addr: std::net::SocketAddr, target: Target, tag: String) -> BurstSpec {
        BurstSpec {
            addr,
            conns: self.s.conns,
            target,
            users: self.s.burst_users,
            patience: Duration::from_millis(300),
            max_attempts: 4,
            double_click: 0.3,
            deadline: Duration::from_secs(120),
            tag,
        }
    }
}

async fn reset_script_stats(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
) -> anyhow::Result<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(conn)
        .await?;
    Ok(())
}

async fn flashgate_round(
    ctx: &Ctx,
    scenario: &'static str,
    round: usize,
    open_rate: f64,
) -> anyhow::Result<RoundResult> {
    let fg = &ctx.fg;
    let mut addr = fg.gateway_addr;
    let mut watched = fg.watched();
    if let (Some((wait_addr, pid)), "g_wait1") = (ctx.wait_gateway, scenario) {
        addr = wait_addr;
        watched
            .iter_mut()
            .filter(|w| w.name == "gateway")
            .for_each(|w| w.pids = vec![pid]);
    }
    let challenged = CHALLENGED.iter().any(|(id, _)| *id == scenario);
    if challenged {
        let (pow_addr, pid) = ctx
            .challenge_gateway
            .context("the challenge gateway was not started")?;
        addr = pow_addr;
        watched
            .iter_mut()
            .filter(|w| w.name == "gateway")
            .for_each(|w| w.pids = vec![pid]);
    }
    let other_gateway = match scenario {
        SHOP_CACHE => Some(
            ctx.shop_cache_gateway
                .context("the shop-cache gateway was not started")?,
        ),
        id if ROOM_ROWS.contains(&id) => Some(
            ctx.room_gateway
                .context("the waiting-room gateway was not started")?,
        ),
        _ => None,
    };
    if let Some((other_addr, pid)) = other_gateway {
        addr = other_addr;
        watched
            .iter_mut()
            .filter(|w| w.name == "gateway")
            .for_each(|w| w.pids = vec![pid]);
    }
    if let Some((_, mode)) = TLS_ROWS.iter().find(|(id, _)| *id == scenario) {
        let (tls_addr, pid) = ctx.tls_gateway.context("the TLS gateway was not started")?;
        watched
            .iter_mut()
            .filter(|w| w.name == "gateway")
            .for_each(|w| w.pids = vec![pid]);
        let loadavg_before = sys::loadavg();
        let (summary, a, b) = crate::tls::round(
            tls_addr,
            SALE_PAGE_PATH,
            *mode,
            Duration::from_secs_f64(ctx.s.warmup),
            Duration::from_secs_f64(ctx.s.secs),
            probe(watched),
        )
        .await?;
        return Ok(RoundResult {
            scenario,
            side: Side::Flashgate,
            round,
            loadavg_before,
            summary,
            cpu: CpuUse::between(&a, &b),
            check: None,
        });
    }
    let tag = format!("{}{}f{round}", ctx.tag, &scenario[..1]);
    let sale = format!("{}-r{round}", scenario.replace('_', "-"));
    let buy_path = format!("/flashgate/api/sales/{sale}/buy");
    let bearers = ctx.bearers.clone();
    let hammer_user = if challenged {
        2 * ctx.s.rounds + 2 + round
    } else {
        2 * round
    };
    let (stock, target, pace): (i64, Target, Pace) = match scenario {
        "a_static" | "a_floor" | "a_floor_tuned" => (
            0,
            Target::Get {
                path: SALE_PAGE_PATH.into(),
            },
            Pace::Closed,
        ),
        SHOP_CACHE => (
            0,
            Target::Get {
                path: "/p/1001.html".into(),
            },
            Pace::Closed,
        ),
        "j_room_admitted" | "j_room_queued" => {
            let (inside, queued) = ctx
                .room_cookies
                .clone()
                .context("the room's cookies were not taken")?;
            (
                0,
                Target::GetWithCookie {
                    path: "/p/1001.html".into(),
                    cookie: if scenario == "j_room_admitted" {
                        inside
                    } else {
                        queued
                    },
                },
                Pace::Closed,
            )
        }
        "b_state" => (
            0,
            Target::Get {
                path: "/flashgate/api/sales/state".into(),
            },
            Pace::Closed,
        ),
        "c_buy" | "g_wait0" | "g_wait1" | "h_fsync_everysec" | "h_fsync_always" => (
            BIG_STOCK,
            Target::FlashBuy {
                path: buy_path,
                users: bearers,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        "c_buy_open" => (
            BIG_STOCK,
            Target::FlashBuy {
                path: buy_path,
                users: bearers,
                pick: Pick::Distinct,
            },
            Pace::Open { rate: open_rate },
        ),
        "d_soldout" | "d_soldout_pow" => (
            0,
            Target::FlashBuy {
                path: buy_path,
                users: bearers,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        "d_soldout_seen" => (
            0,
            Target::FlashBuy {
                path: buy_path,
                users: Users {
                    headers: std::sync::Arc::new(
                        ctx.bearers.headers
                            [..crate::report::SEEN_BUYERS.min(ctx.bearers.headers.len())]
                            .to_vec(),
                    ),
                },
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        "e_hammer" | "e_hammer_pow" => (
            BIG_STOCK,
            Target::FlashBuy {
                path: buy_path,
                users: ctx.hammer_bearers.clone(),
                pick: Pick::One(hammer_user),
            },
            Pace::Closed,
        ),
        "j_not_started" => (
            BIG_STOCK,
            Target::FlashBuy {
                path: buy_path,
                users: bearers,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        // Refused before any sale is read: the open sale "bench" is named.
        "j_unauth" => (
            0,
            Target::RefusedBuy {
                path: "/flashgate/api/sales/bench/buy".into(),
                users: None,
                body: br#"{"qty":1}"#,
            },
            Pace::Closed,
        ),
        "j_bad_input" => (
            0,
            Target::RefusedBuy {
                path: "/flashgate/api/sales/bench/buy".into(),
                users: Some(bearers),
                body: BAD_BODY,
            },
            Pace::Closed,
        ),
        "f_burst" => (
            ctx.s.burst_stock,
            Target::FlashBuy {
                path: buy_path,
                users: bearers,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        other => anyhow::bail!("unknown scenario {other}"),
    };
    let is_buy = matches!(target, Target::FlashBuy { .. });
    let mut redis = fg.redis().await?;
    if scenario == "j_not_started" {
        fg.put_future_sale(&sale, stock).await?;
    } else if is_buy {
        fg.put_sale(&sale, stock, 1).await?;
    }
    if scenario == "d_soldout_pow" {
        // As in a real sale: another gateway's buy finds it sold out and
        // announces it; the challenged gateway then answers 410 before any
        // challenge (a buy it sent to the script would need a solution).
        announce_sold_out(ctx, &sale).await?;
    }
    let trims_before = fg.timed_scripts().await;
    reset_script_stats(&mut redis).await?;
    let loadavg_before = sys::loadavg();
    let (summary, a, b) = if scenario == "f_burst" {
        load::burst(ctx.burst(addr, target, tag), probe(watched)).await
    } else {
        let mut spec = ctx.spec(addr, target, pace, tag);
        if DURABILITY.iter().any(|d| d.id == scenario) {
            spec.duration = spec.duration.min(Duration::from_secs_f64(DURABILITY_SECS));
        }
        load::run(spec, probe(watched)).await
    };
    let cpu = CpuUse::between(&a, &b);
    let check = if is_buy {
        let calls = script_calls(&mut redis).await?;
        // The backend's stream maintenance and fence checks run scripts on
        // a timer, whatever the load: not a buy's script calls. Counted over a window
        // that encloses Redis's (read before the reset, and after the count
        // once a trim in flight has been counted), so the trims Redis saw
        // are at most these.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Read once after the settle above, before the books' drain: the
        // replica waits and, for the buy row, its Redis command by command
        // (the report's breakdown per win).
        let settled = command_stats(&mut redis).await?;
        // A replica-wait round writes its mark with one EVAL before each
        // WAIT: not a buy's script call either.
        let marks = calls_of(&settled, "wait");
        let commands = if scenario == "c_buy" {
            settled
        } else {
            Vec::new()
        };
        let trims = fg.timed_scripts().await.saturating_sub(trims_before) + marks;
        let clean = summary.errors == 0 && summary.timeouts == 0;
        // Buys whose answer could only come from the script.
        let reached = match scenario {
            "c_buy" | "c_buy_open" | "g_wait0" | "g_wait1" | "h_fsync_everysec"
            | "h_fsync_always" => clean.then(|| {
                summary.total_in(200..=299) + summary.total_of(409) + summary.total_of(410)
            }),
            "e_hammer" => clean.then(|| summary.total_in(200..=299) + summary.total_of(409)),
            _ => None,
        };
        let winners = summary
            .winners
            .unwrap_or_else(|| summary.total_in(200..=299));
        let mut check = check_flashgate(
            &ctx.fg,
            &ctx.pg,
            &sale,
            stock,
            winners,
            (calls, trims),
            reached,
        )
        .await?;
        if !commands.is_empty() {
            check.redis = Some(RedisCommands {
                wins: winners,
                commands,
            });
        }
        match scenario {
            "e_hammer" | "e_hammer_pow" => {
                // Admitted by the user bucket: at most burst + rate × time (+1 for rounding).
                let admitted = summary
                    .total_statuses
                    .iter()
                    .filter(|(s, _)| **s != 429)
                    .map(|(_, n)| n)
                    .sum::<u64>();
                let secs = ctx.s.warmup + summary.elapsed_s + 0.1;
                let bound =
                    f64::from(ctx.s.user_bucket.1) + f64::from(ctx.s.user_bucket.0) * secs + 1.0;
                // Challenged, the admitted buys are asked for a proof (428)
                // the load does not solve: none wins.
                let ok = admitted as f64 <= bound && winners == u64::from(scenario == "e_hammer");
                check.ok &= ok;
                check.text.push_str(&format!(
                    ", admitted past the user bucket {admitted} (bound {bound:.0})"
                ));
            }
            "g_wait0" | "g_wait1" => {
                // The sharing, visible: WAITs sent for the round's winners.
                check.ok &= (scenario == "g_wait0") == (marks == 0);
                check.text.push_str(&format!(", WAIT calls {marks}"));
            }
            "f_burst" => {
                let sold_out = winners as i64 == stock;
                check.ok &= sold_out || summary.users_done.unwrap_or(0) < ctx.s.burst_users as u64;
                check.text.push_str(&format!(
                    ", users done {}/{}",
                    summary.users_done.unwrap_or(0),
                    ctx.s.burst_users
                ));
            }
            _ => {}
        }
        Some(check)
    } else {
        None
    };
    Ok(RoundResult {
        scenario,
        side: Side::Flashgate,
        round,
        loadavg_before,
        summary,
        cpu,
        check,
    })
}

/// Sends one buy of `sale` through the bench's first gateway (no
/// challenge) and waits until the sale's sold-out announcement has reached
/// the other gateways.
async fn announce_sold_out(ctx: &Ctx, sale: &str) -> anyhow::Result<()> {
    let bearer = ctx
        .bearers
        .headers
        .first()
        .context("no bearer minted")?
        .clone();
    let resp = ctx
        .fg
        .http
        .post(format!(
            "http://{}/flashgate/api/sales/{sale}/buy",
            ctx.fg.gateway_addr
        ))
        .header(http::header::AUTHORIZATION, bearer)
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().as_u16() == 410,
        "a buy of the empty sale {sale}: {}",
        resp.status()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

/// Row e's load (one user's buys) against Pingora's floor answering each
/// with the gateway's 429 ([`crate::stack::RATE_LIMITED_BODY`]).
async fn rejection_floor_round(
    ctx: &Ctx,
    scenario: &'static str,
    round: usize,
) -> anyhow::Result<RoundResult> {
    let peers = ctx.peers.as_ref().context("the peers were not started")?;
    let target = Target::FlashBuy {
        path: "/flashgate/api/sales/bench/buy".into(),
        users: ctx.hammer_bearers.clone(),
        pick: Pick::One(0),
    };
    let tag = format!("{}{}r{round}", ctx.tag, &scenario[..1]);
    let loadavg_before = sys::loadavg();
    let (summary, a, b) = load::run(
        ctx.spec(peers.floor_429_addr, target, Pace::Closed, tag),
        probe(peers.floor_429_watched()),
    )
    .await;
    Ok(RoundResult {
        scenario,
        side: Side::Floor,
        round,
        loadavg_before,
        summary,
        cpu: CpuUse::between(&a, &b),
        check: None,
    })
}

async fn peer_round(
    ctx: &Ctx,
    scenario: &'static str,
    round: usize,
    open_rate: f64,
) -> anyhow::Result<RoundResult> {
    let peers = ctx.peers.as_ref().context("the peers were not started")?;
    if let Some((_, mode)) = TLS_ROWS.iter().find(|(id, _)| *id == scenario) {
        let (addr, watched) = if scenario.ends_with("_floor") {
            (peers.floor_tls_addr, peers.floor_tls_watched())
        } else {
            (peers.tls_addr, peers.tls_watched())
        };
        let loadavg_before = sys::loadavg();
        let (summary, a, b) = crate::tls::round(
            addr,
            "/p/1001.html",
            *mode,
            Duration::from_secs_f64(ctx.s.warmup),
            Duration::from_secs_f64(ctx.s.secs),
            probe(watched),
        )
        .await?;
        return Ok(RoundResult {
            scenario,
            side: Side::Peer,
            round,
            loadavg_before,
            summary,
            cpu: CpuUse::between(&a, &b),
            check: None,
        });
    }
    let tag = format!("{}{}p{round}", ctx.tag, &scenario[..1]);
    let path = "/api/seckill/1001/buy".to_owned();
    let ids = ctx.peer_ids.clone();
    let hammer_user = 2 * round + 1;
    let (stock, target, pace): (i64, Target, Pace) = match scenario {
        "a_static" | "a_floor" | "a_floor_tuned" | SHOP_CACHE => (
            0,
            Target::Get {
                path: "/p/1001.html".into(),
            },
            Pace::Closed,
        ),
        "c_buy" => (
            BIG_STOCK,
            Target::PeerBuy {
                path,
                users: ids,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        "c_buy_open" => (
            BIG_STOCK,
            Target::PeerBuy {
                path,
                users: ids,
                pick: Pick::Distinct,
            },
            Pace::Open { rate: open_rate },
        ),
        "d_soldout" => (
            0,
            Target::PeerBuy {
                path,
                users: ids,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        "e_hammer" => (
            BIG_STOCK,
            Target::PeerBuy {
                path,
                users: ctx.hammer_ids.clone(),
                pick: Pick::One(hammer_user),
            },
            Pace::Closed,
        ),
        "f_burst" => (
            ctx.s.burst_stock,
            Target::PeerBuy {
                path,
                users: ids,
                pick: Pick::Distinct,
            },
            Pace::Closed,
        ),
        other => anyhow::bail!("no peer for {other}"),
    };
    let is_buy = matches!(target, Target::PeerBuy { .. });
    let (addr, watched) = match scenario {
        _ if is_buy => (peers.gw_addr, peers.gw_watched()),
        "a_floor" => (peers.floor_addr, peers.floor_watched()),
        "a_floor_tuned" => (peers.floor_tuned_addr, peers.floor_tuned_watched()),
        SHOP_CACHE => (peers.cache_addr, peers.cache_watched()),
        _ => (peers.static_addr, peers.static_watched()),
    };
    if is_buy {
        peers.reset(stock).await?;
    }
    let loadavg_before = sys::loadavg();
    let (summary, a, b) = if scenario == "f_burst" {
        load::burst(ctx.burst(addr, target, tag), probe(watched)).await
    } else {
        load::run(ctx.spec(addr, target, pace, tag), probe(watched)).await
    };
    let cpu = CpuUse::between(&a, &b);
    let check = if is_buy {
        let mut c = peers.redis().await?;
        let left: i64 = redis::cmd("GET")
            .arg("seckill:stock:1001")
            .query_async::<Option<i64>>(&mut c)
            .await?
            .unwrap_or(-1);
        let buyers: i64 = redis::cmd("SCARD")
            .arg("seckill:users:1001")
            .query_async(&mut c)
            .await?;
        let stream: i64 = redis::cmd("XLEN")
            .arg("seckill:stream:1001")
            .query_async(&mut c)
            .await?;
        let winners = summary.winners.unwrap_or_else(|| summary.total_of(200));
        let decrements = stock - left;
        let mut ok =
            left >= 0 && winners as i64 == decrements && decrements == buyers && buyers == stream;
        if scenario == "e_hammer" {
            ok &= winners == 1;
        }
        if scenario == "f_burst" {
            ok &= winners as i64 == stock
                || summary.users_done.unwrap_or(0) < ctx.s.burst_users as u64;
        }
        let calls = script_calls(&mut c).await?;
        Some(Check {
            ok,
            text: format!(
                "winners {winners} = decrements {decrements} = buyers set {buyers} = stream {stream} (one per user by its set); script calls {calls} (bucket + deduct, EVAL after NOSCRIPT included){}",
                summary.users_done.map_or(String::new(), |d| format!(", users done {d}/{}", ctx.s.burst_users))
            ),
            script_calls: None,
            redis: None,
        })
    } else {
        None
    };
    Ok(RoundResult {
        scenario,
        side: Side::Peer,
        round,
        loadavg_before,
        summary,
        cpu,
        check,
    })
}

/// Empties the bench database's `orders` table, for a drain or a COPY
/// that starts as the one before it did.
async fn empty_orders(pg: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE orders")
        .execute(pg)
        .await
        .context("TRUNCATE orders")?;
    Ok(())
}

/// Preloads `n` reservations into a sale's stream in the gateway's record
/// format, then times a freshly started backend turning them into orders.
/// With `profile`, the backend runs under `perf record` and its top frames
/// are put there.
async fn measure_drain(
    ctx: &mut Ctx,
    sale: &str,
    n: usize,
    profile: Option<&mut Vec<String>>,
    counter: &OrderCounter,
) -> anyhow::Result<Drain> {
    ctx.fg.put_sale(sale, n as i64, 1).await?;
    ctx.fg.stop_backend();
    let keys = SaleKeys::new(sale);
    let mut redis = ctx.fg.redis().await?;
    let t = Instant::now();
    let now = flashgate_common::now_ms();
    for chunk_start in (0..n).step_by(2000) {
        let mut pipe = redis::pipe();
        for _ in chunk_start..(chunk_start + 2000).min(n) {
            let r = Reservation {
                reservation_id: reservation_id(sale, rand::random()),
                sale_id: sale.to_owned(),
                user_id: uuid::Uuid::new_v4().to_string(),
                idempotency_key: String::new(),
                reserved_at_ms: now,
            };
            pipe.cmd("XADD")
                .arg(&keys.stream)
                .arg("*")
                .arg(fields::RECORD)
                .arg(r.record())
                .ignore();
            pipe.cmd("HSET")
                .arg(&keys.reservations)
                .arg(&r.reservation_id)
                .arg(&r.user_id)
                .ignore();
        }
        pipe.query_async::<()>(&mut redis).await?;
    }
    redis::cmd("DECRBY")
        .arg(&keys.remaining)
        .arg(n)
        .query_async::<()>(&mut redis)
        .await?;
    let preload_s = t.elapsed().as_secs_f64();

    let t0 = Instant::now();
    ctx.fg.start_backend().await?;
    let pid = ctx.fg.backend_pid();
    let perf = match profile.is_some() {
        true => Some(start_perf(
            pid,
            &std::env::temp_dir()
                .join(format!("flashgate-bench-drain-{}.data", std::process::id())),
            60,
        )?),
        false => None,
    };
    let cpu0 = sys::pid_ticks(pid);
    let database = [Watched::command(sys::DATABASE, "postgres")];
    let db0 = snap(&database);
    let mut first: Option<Instant> = None;
    let deadline = t0 + Duration::from_secs(180);
    // Progress from the backend's own counter (a fresh process: its
    // orders are this drain's), so the polling costs the database
    // nothing; the rows are then counted once in the database, and again
    // only if they fall short.
    let count = loop {
        let created = ctx
            .fg
            .backend_metric("flashgate_backend_orders_created_total", "")
            .await as usize;
        if created > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        if created >= n || Instant::now() > deadline {
            let c = counter.count(sale).await?;
            if c as usize >= n || Instant::now() > deadline {
                break c;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let done = Instant::now();
    let backend_cpu_s = sys::pid_ticks(pid).saturating_sub(cpu0) as f64 / sys::clk_tck();
    let database_cpu_s = match counter {
        OrderCounter::Postgres(_) => CpuUse::between(&db0, &snap(&database)).get(sys::DATABASE),
        OrderCounter::Mysql(_) => None,
    };
    if let (Some((mut p, file)), Some(lines)) = (perf, profile) {
        p.stop_interrupt();
        *lines = perf_top(&file, 18);
        let _ = std::fs::remove_file(&file);
    }
    Ok(Drain {
        orders: count as usize,
        preload_s,
        total_s: done.duration_since(t0).as_secs_f64(),
        after_first_s: first.map_or(0.0, |f| done.duration_since(f).as_secs_f64()),
        backend_cpu_s,
        database_cpu_s,
        ok: count as usize == n,
    })
}

/// Where a drain's orders are counted.
enum OrderCounter {
    Postgres(sqlx::PgPool),
    Mysql(sqlx::AnyPool),
}

impl OrderCounter {
    async fn count(&self, sale: &str) -> anyhow::Result<i64> {
        const COUNT: &str = "SELECT COUNT(*) FROM orders WHERE sale_id = ";
        Ok(match self {
            Self::Postgres(pg) => {
                sqlx::query_as::<_, (i64,)>(&format!("{COUNT}$1"))
                    .bind(sale)
                    .fetch_one(pg)
                    .await?
                    .0
            }
            Self::Mysql(my) => {
                sqlx::query_as::<_, (i64,)>(&format!("{COUNT}?"))
                    .bind(sale)
                    .fetch_one(my)
                    .await?
                    .0
            }
        })
    }
}

/// The backend drain again, into a fresh MySQL/MariaDB database on
/// `server` (`flashgate_bench`, dropped after): the backend is restarted on
/// it (`FLASHGATE_DATABASE_URL`), drains, and goes back to PostgreSQL.
async fn mysql_drain(
    ctx: &mut Ctx,
    server: &str,
    n: usize,
    machine: &mut Machine,
) -> anyhow::Result<Drain> {
    sqlx::any::install_default_drivers();
    let server = server.trim_end_matches('/');
    let admin = sqlx::AnyPool::connect(server)
        .await
        .with_context(|| format!("connect {server}"))?;
    if let Ok(row) = sqlx::query("SELECT CAST(VERSION() AS CHAR)")
        .fetch_one(&admin)
        .await
    {
        machine.versions.push((
            "MySQL/MariaDB".into(),
            sqlx::Row::try_get::<String, _>(&row, 0).unwrap_or_default(),
        ));
    }
    let db = "flashgate_bench";
    sqlx::query(&format!("DROP DATABASE IF EXISTS {db}"))
        .execute(&admin)
        .await?;
    sqlx::query(&format!(
        "CREATE DATABASE {db} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    ))
    .execute(&admin)
    .await?;
    let url = format!("{server}/{db}");
    ctx.fg.stop_backend();
    ctx.fg.database_override = Some(url.clone());
    let result = async {
        ctx.fg.start_backend().await?;
        // Migrating the new database comes first: the admin API answers 503 until then.
        let ready = format!("http://{}/ready", ctx.fg.backend_addr);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ctx
            .fg
            .http
            .get(&ready)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the backend on MySQL did not get ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let counter = OrderCounter::Mysql(sqlx::AnyPool::connect(&url).await?);
        measure_drain(ctx, "drain-mysql", n, None, &counter).await
    }
    .await;
    ctx.fg.stop_backend();
    ctx.fg.database_override = None;
    ctx.fg.start_backend().await?;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db}"))
        .execute(&admin)
        .await;
    admin.close().await;
    result
}

fn perf_available() -> bool {
    std::process::Command::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-o",
            "/dev/null",
            "-q",
            "--",
            "true",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `perf record` (software clock, 499 Hz, self time) on one PID.
fn start_perf(pid: u32, file: &std::path::Path, secs: u64) -> anyhow::Result<(Proc, PathBuf)> {
    let child = std::process::Command::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-F",
            "499",
            "-q",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(file)
        .args(["--", "sleep", &secs.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    Ok((Proc::child("perf", child), file.to_owned()))
}

impl Proc {
    /// Ends a `perf record` early (SIGINT writes its data) and waits.
    fn stop_interrupt(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-INT")
            .arg(self.pid.to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The top `n` symbols by self time of a perf data file.
fn perf_top(file: &std::path::Path, n: usize) -> Vec<String> {
    let out = std::process::Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "dso,symbol",
            "-i",
        ])
        .arg(file)
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else {
        return vec!["perf report failed".into()];
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && l.trim_start()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
        })
        .take(n)
        .map(|l| {
            let l = l.split_whitespace().collect::<Vec<_>>().join(" ");
            let l = l.as_str();
            if l.len() > 150 {
                format!(
                    "{}…",
                    &l[..l
                        .char_indices()
                        .take_while(|(i, _)| *i < 150)
                        .last()
                        .map_or(0, |(i, _)| i)]
                )
            } else {
                l.to_owned()
            }
        })
        .collect()
}

/// Runs one more Flashgate round of `scenario` with perf on the gateway,
/// backend and Redis.
async fn profile_load(ctx: &Ctx, scenario: &'static str) -> anyhow::Result<Vec<Profile>> {
    let secs = 6;
    let targets = [
        ("gateway", ctx.fg.gateway.pid),
        ("backend", ctx.fg.backend_pid()),
        ("redis", ctx.fg.redis_pid()),
    ];
    let mut perfs = Vec::new();
    for (name, pid) in targets {
        let file = std::env::temp_dir().join(format!(
            "flashgate-bench-{scenario}-{name}-{}.data",
            std::process::id()
        ));
        perfs.push((name, start_perf(pid, &file, secs)?));
    }
    let sale = format!("profile-{}", scenario.replace('_', "-"));
    let stock = if scenario == "d_soldout" {
        0
    } else {
        BIG_STOCK
    };
    let target = match scenario {
        "a_static" => Target::Get {
            path: SALE_PAGE_PATH.into(),
        },
        "j_not_started" => {
            ctx.fg.put_future_sale(&sale, stock).await?;
            Target::FlashBuy {
                path: format!("/flashgate/api/sales/{sale}/buy"),
                users: ctx.bearers.clone(),
                pick: Pick::Distinct,
            }
        }
        "j_unauth" | "j_bad_input" => Target::RefusedBuy {
            path: "/flashgate/api/sales/bench/buy".into(),
            users: (scenario == "j_bad_input").then(|| ctx.bearers.clone()),
            body: if scenario == "j_bad_input" {
                BAD_BODY
            } else {
                br#"{"qty":1}"#
            },
        },
        "e_hammer" => {
            ctx.fg.put_sale(&sale, stock, 1).await?;
            Target::FlashBuy {
                path: format!("/flashgate/api/sales/{sale}/buy"),
                users: ctx.hammer_bearers.clone(),
                pick: Pick::One(0),
            }
        }
        _ => {
            ctx.fg.put_sale(&sale, stock, 1).await?;
            Target::FlashBuy {
                path: format!("/flashgate/api/sales/{sale}/buy"),
                users: ctx.bearers.clone(),
                pick: Pick::Distinct,
            }
        }
    };
    let mut spec = ctx.spec(
        ctx.fg.gateway_addr,
        target,
        Pace::Closed,
        format!("{}prof{}", ctx.tag, &scenario[..1]),
    );
    spec.warmup = Duration::from_millis(300);
    spec.duration = Duration::from_secs(secs - 1);
    let (summary, _, _) = load::run(spec, || ()).await;
    let mut out = Vec::new();
    for (name, (mut p, file)) in perfs {
        p.stop_interrupt();
        let lines = perf_top(&file, if name == "gateway" { 25 } else { 12 });
        let _ = std::fs::remove_file(&file);
        out.push(Profile {
            what: format!(
                "{name} during {scenario} ({:.0} req/s under perf, {} s, self time by symbol)",
                summary.rps, secs
            ),
            lines,
        });
    }
    Ok(out)
}

/// The profiles of a scenario, or, when its load failed under `perf` (a
/// process sampled with call graphs runs slower, and a client may time
/// out), one entry saying so: the measured rounds stand without it.
fn taken(scenario: &str, profiles: anyhow::Result<Vec<Profile>>) -> Vec<Profile> {
    profiles.unwrap_or_else(|e| {
        eprintln!("bench: profile of {scenario} not taken: {e:#}");
        vec![Profile {
            what: format!("{scenario}: not profiled, its load failed under perf"),
            lines: vec![format!("{e:#}")],
        }]
    })
}

/// One more HTTPS round of `scenario` on the TLS gateway with perf on it.
async fn profile_tls(ctx: &Ctx, mode: crate::tls::Mode, scenario: &str) -> anyhow::Result<Profile> {
    let secs = 6;
    let (addr, pid) = ctx.tls_gateway.context("the TLS gateway was not started")?;
    let file = std::env::temp_dir().join(format!(
        "flashgate-bench-{scenario}-gateway-{}.data",
        std::process::id()
    ));
    let (mut perf, file) = start_perf(pid, &file, secs)?;
    let (summary, (), ()) = crate::tls::round(
        addr,
        SALE_PAGE_PATH,
        mode,
        Duration::from_millis(300),
        Duration::from_secs(secs - 1),
        || (),
    )
    .await?;
    perf.stop_interrupt();
    let lines = perf_top(&file, 25);
    let _ = std::fs::remove_file(&file);
    Ok(Profile {
        what: format!(
            "TLS gateway during {scenario} ({:.0} req/s under perf, {secs} s, self time by symbol)",
            summary.rps
        ),
        lines,
    })
}

/// Runs the peers' `redis-evalsha` script and keeps its RESULT/CHECK lines.
fn evalsha(s: &Settings, work: &std::path::Path) -> Vec<String> {
    let port = sys::free_port();
    eprintln!("bench: peers/redis-evalsha on port {port}");
    let log = std::fs::File::create(work.join("redis-evalsha.log")).ok();
    let out = std::process::Command::new(s.peers_dir.join("redis-evalsha"))
        .env("REDIS_PORT", port.to_string())
        .env("N_P1", s.evalsha_n_p1.to_string())
        .env("N_P16", s.evalsha_n_p16.to_string())
        .env("BENCH_TIMEOUT", "40")
        .stderr(log.map_or(std::process::Stdio::null(), std::process::Stdio::from))
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("RESULT") || l.starts_with("CHECK"))
            .map(str::to_owned)
            .collect(),
        Err(e) => vec![format!("redis-evalsha did not run: {e}")],
    }
}

fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"))
        .unwrap_or_default();
    let lock_version = |name: &str| {
        let needle = format!("name = \"{name}\"\nversion = \"");
        lock.split(&needle)
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("?")
            .to_owned()
    };
    let git = sys::version_of(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    );
    let dirty = std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "status",
            "--porcelain",
            "--",
            "../gateway",
            "../backend",
            "../common",
            "../lua",
        ])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    Machine {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        kernel: sys::version_of("uname", &["-sr"]),
        versions: vec![
            (
                "Flashgate (git)".into(),
                format!("{git}{}", if dirty { " + uncommitted changes" } else { "" }),
            ),
            ("Pingora".into(), lock_version("pingora")),
            ("rustc".into(), sys::version_of("rustc", &["--version"])),
            ("nginx".into(), sys::version_of("nginx", &["-v"])),
            (
                "redis-server".into(),
                sys::version_of("redis-server", &["--version"]),
            ),
        ],
    }
}
