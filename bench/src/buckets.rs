//! The bucketed-stock rows: one hot sale on a Redis Cluster of the bench's
//! own (3 masters, no replicas), sold from 1 bucket (one slot, so one
//! master decides every buy) and from 6 buckets (two slots per master),
//! rounds alternating. Each round measures buys/s, latency, every master's
//! CPU per buy, and the transfers between buckets per 1,000 buys; the
//! report projects, from the per-master CPU, what more masters would sell.
//!
//! A second Flashgate (gateway and backend, on a PostgreSQL database of
//! its own) runs on the cluster; the first, on the bench's standalone
//! Redis, is idle meanwhile.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use flashgate_common::config::{RedisConfig, RedisTarget};
use flashgate_common::keys::SaleKeys;
use flashgate_testkit::cluster::{ClusterOptions, RedisCluster};

use crate::books::check_flashgate;
use crate::load::{self, LoadSpec, Pace, Pick, Target, Users};
use crate::results::BucketRound;
use crate::settings::Settings;
use crate::stack::{mint_bearers, random_users, script_calls, Flashgate, FlashgateOptions};
use crate::sys::{snap, CpuUse, Watched};

/// The scenario id that selects these rows (`--scenario k_buckets`).
pub const SCENARIO: &str = "k_buckets";

/// The bucket counts compared, in the order each round runs them.
pub const BUCKET_COUNTS: [u32; 2] = [1, 6];

/// Masters of the bench's cluster.
pub const MASTERS: usize = 3;

/// Stock of each round's sale: never sold out within a round.
const STOCK: i64 = 10_000_000;

/// Starts the cluster and a Flashgate on it, runs `rounds` rounds of each
/// bucket count, and stops everything it started.
///
/// # Errors
/// When the cluster or Flashgate cannot be started, or a round fails.
pub async fn run(s: &Settings, dir: &Path) -> anyhow::Result<Vec<BucketRound>> {
    // A database of its own: on the run's database the backend would see
    // the other scenarios' sales, restore them into the cluster and poll
    // their streams, which would count as the buys' Redis work.
    let admin = sqlx::PgPool::connect(&s.pg_url)
        .await
        .with_context(|| format!("connect {}", s.pg_url))?;
    let name = format!("{}_buckets", s.db_name);
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await?;
    let database_url = match s.pg_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => anyhow::bail!("pg url without a database: {}", s.pg_url),
    };
    let pg = sqlx::PgPool::connect(&database_url).await?;
    let rounds = run_on(s, dir, &database_url, &pg).await;
    pg.close().await;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&admin)
        .await;
    admin.close().await;
    rounds
}

async fn run_on(
    s: &Settings,
    dir: &Path,
    database_url: &str,
    pg: &sqlx::PgPool,
) -> anyhow::Result<Vec<BucketRound>> {
    let cluster = tokio::task::spawn_blocking(|| {
        RedisCluster::start_with(ClusterOptions {
            masters: MASTERS,
            replicas_per_master: 0,
            node_timeout: Duration::from_secs(15),
            appendonly: false,
            tls: None,
        })
    })
    .await
    .context("starting the bench's Redis Cluster")?;
    let mut redis = RedisConfig::standalone("");
    redis.target = RedisTarget::Cluster {
        nodes: cluster.nodes(),
    };
    let dir = dir.join("buckets");
    std::fs::create_dir_all(&dir)?;
    let fg = Flashgate::start(
        &dir,
        &FlashgateOptions {
            bin_dir: s.bin_dir.clone(),
            threads: s.threads,
            page: s.peers_dir.join("html/p/1001.html"),
            database_url: database_url.to_owned(),
            user_bucket: s.user_bucket,
            redis: Some(redis),
        },
    )
    .await?;
    let ids = random_users(s.user_pool);
    let users = Users {
        headers: std::sync::Arc::new(mint_bearers(&fg.jwt_secret, &ids, 7200)),
    };
    let masters = cluster.masters().await;
    let mut nodes = Vec::new();
    for port in &masters {
        let pid = cluster
            .pid(*port)
            .context("a master of the bench's cluster is not running")?;
        let conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
            .get_multiplexed_async_connection()
            .await?;
        nodes.push((*port, pid, conn));
    }
    eprintln!(
        "bench: bucketed stock on a cluster of masters {masters:?}, gateway {}",
        fg.gateway_addr
    );

    let mut rounds = Vec::new();
    for round in 1..=s.rounds {
        for buckets in BUCKET_COUNTS {
            let r = bucket_round(s, &fg, pg, &cluster, &mut nodes, &users, buckets, round)
                .await
                .with_context(|| format!("{SCENARIO} {buckets} bucket(s) round {round}"))?;
            eprintln!(
                "{SCENARIO} b{buckets} r{round}: {:.0} req/s p99 {:.2} ms, master ms/1k {:?}, transfers/1k {:.2}, books {}",
                r.summary.rps,
                r.summary.p99_ms,
                r.master_ms_per_k().iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>(),
                r.transfers_per_k(),
                if r.check.ok { "ok" } else { "WRONG" },
            );
            rounds.push(r);
        }
    }
    Ok(rounds)
}

#[allow(clippy::too_many_arguments)]
async fn bucket_round(
    s: &Settings,
    fg: &Flashgate,
    pg: &sqlx::PgPool,
    cluster: &RedisCluster,
    nodes: &mut [(u16, u32, redis::aio::MultiplexedConnection)],
    users: &Users,
    buckets: u32,
    round: usize,
) -> anyhow::Result<BucketRound> {
    let sale = format!("hot{buckets}-r{round}");
    fg.put_bucketed_sale(&sale, STOCK, 1, buckets).await?;
    let mut buckets_per_master = vec![0; nodes.len()];
    for k in 0..buckets {
        let key = if buckets > 1 {
            SaleKeys::bucket(&sale, k).meta
        } else {
            SaleKeys::new(&sale).meta
        };
        let port = cluster.master_for_key(&key).await;
        if let Some(i) = nodes.iter().position(|(p, _, _)| *p == port) {
            buckets_per_master[i] += 1;
        }
    }
    for (_, _, conn) in nodes.iter_mut() {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(conn)
            .await?;
    }
    let moved_before = fg
        .gateway_metric("flashgate_bucket_transfers_total", "result=\"moved\"")
        .await;
    let trims_before = fg.timed_scripts().await;
    let mut watched = fg.watched();
    watched.extend(
        nodes
            .iter()
            .map(|(port, pid, _)| Watched::pids(&format!("m{port}"), vec![*pid])),
    );
    let spec = LoadSpec {
        addr: fg.gateway_addr,
        conns: s.conns,
        pace: Pace::Closed,
        warmup: Duration::from_secs_f64(s.warmup),
        duration: Duration::from_secs_f64(s.secs),
        timeout: Duration::from_secs(5),
        target: Target::FlashBuy {
            path: format!("/flashgate/api/sales/{sale}/buy"),
            users: users.clone(),
            pick: Pick::Distinct,
        },
        tag: format!("k{buckets}r{round}{}", crate::stack::random_hex(3)),
    };
    let (summary, a, b) = load::run(spec, move || snap(&watched)).await;
    let cpu = CpuUse::between(&a, &b);
    let mut calls = 0;
    for (_, _, conn) in nodes.iter_mut() {
        calls += script_calls(conn).await?;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let trims = fg.timed_scripts().await.saturating_sub(trims_before);
    let transfers = (fg
        .gateway_metric("flashgate_bucket_transfers_total", "result=\"moved\"")
        .await
        - moved_before)
        .max(0.0) as u64;
    let clean = summary.errors == 0 && summary.timeouts == 0;
    // Every buy of one bucket runs one script; a bucketed sale's also runs
    // the transfers' scripts (three per transfer) when a bucket runs dry.
    let reached =
        clean.then(|| summary.total_in(200..=299) + summary.total_of(409) + summary.total_of(410));
    let winners = summary.total_in(200..=299);
    let mut check = check_flashgate(
        fg,
        pg,
        &sale,
        STOCK,
        winners,
        (calls.saturating_sub(3 * transfers), trims),
        reached,
    )
    .await?;
    check.text.push_str(&format!(", transfers {transfers}"));
    Ok(BucketRound {
        buckets,
        round,
        summary,
        cpu,
        masters: nodes.iter().map(|(p, _, _)| *p).collect(),
        buckets_per_master,
        transfers,
        check,
    })
}
