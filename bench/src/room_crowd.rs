//! The waiting room under a crowd: a gateway whose room (`active_users`
//! seats, short sessions) guards the shop's page, 100,000 visitors who
//! join it, then as many of them as the load generator can drive coming
//! back in turn with their own cookie (an app's poll, `Accept:
//! application/json`). Measured: the gateway's answers per second, the
//! requests that reached the shop per second beside the rate seats free
//! (`active_users / session_seconds`), and the most visitors Redis ever
//! held inside, sampled.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use flashgate_common::redis_conn::RedisHandle;
use serde::Serialize;

use crate::stack::Flashgate;

/// The row's id (`--scenario`).
pub const SCENARIO: &str = "j_room_crowd";
/// The crowd's room.
pub const ACTIVE_USERS: u64 = 100;
pub const SESSION_SECONDS: u64 = 2;
/// The path the room guards: the peers' static page (the shop).
const PAGE: &str = "/p/1001.html";
/// Concurrent requests while joining and polling.
const CONCURRENCY: usize = 128;

/// What the crowd run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Crowd {
    pub visitors: usize,
    pub join_s: f64,
    /// Places given when the polls began (the room's last ticket).
    pub waiting_at_start: u64,
    pub poll_s: f64,
    /// Answers the gateway gave in the poll window, and how many were the
    /// shop's page (the request reached the shop).
    pub answers: u64,
    pub to_shop: u64,
    /// Most visitors inside, sampled from Redis every 50 ms.
    pub most_inside: u64,
    /// Failed requests (network errors or other statuses).
    pub errors: u64,
}

impl Crowd {
    pub fn answers_per_s(&self) -> f64 {
        self.answers as f64 / self.poll_s
    }

    pub fn shop_per_s(&self) -> f64 {
        self.to_shop as f64 / self.poll_s
    }

    /// The rate at which seats free: the most new visitors per second the
    /// room may let through.
    pub fn bound_per_s() -> f64 {
        ACTIVE_USERS as f64 / SESSION_SECONDS as f64
    }

    /// Held: never more inside than the seats, and the shop's rate within
    /// 10% of the rate seats free.
    pub fn held(&self) -> bool {
        self.errors == 0
            && self.most_inside <= ACTIVE_USERS
            && self.shop_per_s() <= Self::bound_per_s() * 1.1
    }
}

/// The room's tables for a gateway whose shop is `shop`.
pub fn room_toml(shop: SocketAddr) -> String {
    format!(
        "[shop]\nupstreams = [\"{shop}\"]\n[[shop.waiting_rooms]]\nname = \"crowd\"\npaths = [\"/p/\"]\n\
         active_users = {ACTIVE_USERS}\nsession_seconds = {SESSION_SECONDS}\nrefresh_seconds = 1\n"
    )
}

/// One request of a visitor: whether the shop answered, and the room's
/// cookie to keep (the visitor's new one, if it gave one).
async fn visit(
    http: &reqwest::Client,
    url: &str,
    cookie: Option<&str>,
) -> anyhow::Result<(bool, Option<String>)> {
    let mut req = http.get(url).header("accept", "application/json");
    if let Some(cookie) = cookie {
        req = req.header("cookie", cookie);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let set = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    let html = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/html"));
    resp.bytes().await?;
    anyhow::ensure!(status == 200, "status {status}");
    Ok((html, set))
}

/// What a sweep counted.
#[derive(Default)]
struct Counts {
    answers: AtomicU64,
    to_shop: AtomicU64,
    errors: AtomicU64,
}

/// The visitors in turn, each with their own cookie (none yet: an
/// arrival), kept as the gateway renews it; [`CONCURRENCY`] at once, once
/// each, or round and round until `until`.
async fn sweep(
    http: &reqwest::Client,
    url: &str,
    cookies: &Arc<Vec<Mutex<Option<String>>>>,
    until: Option<Instant>,
) -> anyhow::Result<Counts> {
    let (next, counts) = (Arc::new(AtomicUsize::new(0)), Arc::new(Counts::default()));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (http, url, cookies) = (http.clone(), url.to_owned(), cookies.clone());
            let (next, counts) = (next.clone(), counts.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let done = match until {
                        Some(until) => Instant::now() >= until,
                        None => n >= cookies.len(),
                    };
                    if done {
                        return;
                    }
                    let i = n % cookies.len();
                    let cookie = cookies[i].lock().unwrap_or_else(|p| p.into_inner()).clone();
                    match visit(&http, &url, cookie.as_deref()).await {
                        Ok((shop, set)) => {
                            counts.answers.fetch_add(1, Ordering::Relaxed);
                            if shop {
                                counts.to_shop.fetch_add(1, Ordering::Relaxed);
                            }
                            if set.is_some() {
                                *cookies[i].lock().unwrap_or_else(|p| p.into_inner()) = set;
                            }
                        }
                        Err(_) => {
                            counts.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await?;
    }
    Arc::try_unwrap(counts).map_err(|_| anyhow::anyhow!("a sweep's worker outlived it"))
}

/// Joins `visitors`, then polls them in turn for `poll`.
pub async fn measure(
    fg: &Flashgate,
    addr: SocketAddr,
    visitors: usize,
    poll: Duration,
) -> anyhow::Result<Crowd> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()?;
    let url = format!("http://{addr}{PAGE}");
    let cookies: Arc<Vec<Mutex<Option<String>>>> =
        Arc::new((0..visitors).map(|_| Mutex::new(None)).collect());

    let started = Instant::now();
    let joined = sweep(&http, &url, &cookies, None).await?;
    let join_s = started.elapsed().as_secs_f64();
    let mut conn = RedisHandle::connect(
        &fg.redis_config,
        &flashgate_common::redis_conn::Tuning::new(Duration::from_secs(5)),
    )
    .await
    .context("the crowd's Redis")?;
    let tickets: Option<u64> = redis::cmd("HGET")
        .arg("fg:{room:crowd}:state")
        .arg("seq")
        .query_async(&mut conn)
        .await?;

    let most_inside = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + poll;
    let sampler = {
        let most = most_inside.clone();
        tokio::spawn(async move {
            while Instant::now() < until {
                let n: u64 = redis::cmd("ZCARD")
                    .arg("fg:{room:crowd}:inside")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or(0);
                most.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let polled = Instant::now();
    let polls = sweep(&http, &url, &cookies, Some(until)).await?;
    let poll_s = polled.elapsed().as_secs_f64();
    sampler.await?;
    Ok(Crowd {
        visitors,
        join_s,
        waiting_at_start: tickets.unwrap_or(0),
        poll_s,
        answers: polls.answers.into_inner(),
        to_shop: polls.to_shop.into_inner(),
        most_inside: most_inside.load(Ordering::Relaxed),
        errors: joined.errors.into_inner() + polls.errors.into_inner(),
    })
}
