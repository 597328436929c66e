//! The two sides of the comparison, each on loopback ports of its own.
//!
//! - [`Flashgate`]: its own `redis-server` (or the Redis deployment of
//!   `--redis-config`, in any `redis.mode`), the backend on a PostgreSQL
//!   database the bench creates (and drops), and the gateway, from the
//!   release binaries. Secrets are generated per run and passed in the
//!   environment only.
//! - [`Peers`]: plain nginx serving the static page, and the OpenResty
//!   gateway (nginx + lua module) with its own `redis-server`, started from
//!   the peers' own config templates and Lua, the way their scripts do.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use flashgate_common::config::RedisConfig;
use flashgate_common::redis_conn::{RedisHandle, Tuning};
use http::HeaderValue;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

use crate::sys::{children_of, free_port, loopback, wait_port, Proc, Watched, DATABASE};

/// A random hex string of `bytes` random bytes.
pub fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// `n` random, UUID-like user ids.
pub fn random_users(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect()
}

/// HS256 buyer tokens (`sub`, `exp`, `iat`), minted in-process with the
/// gateway's secret, as `Bearer …` header values. Uses every core.
pub fn mint_bearers(secret: &str, users: &[String], ttl_secs: i64) -> Vec<HeaderValue> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        sub: &'a str,
        exp: i64,
        iat: i64,
    }
    let now = flashgate_common::now_ms() / 1000;
    let key = EncodingKey::from_secret(secret.as_bytes());
    let header = Header::new(Algorithm::HS256);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = users.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = users
            .chunks(chunk)
            .map(|part| {
                let (key, header) = (&key, &header);
                s.spawn(move || {
                    part.iter()
                        .map(|u| {
                            let t = jsonwebtoken::encode(
                                header,
                                &Claims {
                                    sub: u,
                                    exp: now + ttl_secs,
                                    iat: now,
                                },
                                key,
                            )
                            .expect("HS256 encoding cannot fail");
                            HeaderValue::from_str(&format!("Bearer {t}"))
                                .expect("a JWT is a valid header value")
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("minting thread"))
            .collect()
    })
}

fn log_file(dir: &Path, name: &str) -> anyhow::Result<(Stdio, Stdio)> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))?;
    Ok((Stdio::from(f.try_clone()?), Stdio::from(f)))
}

/// A `redis-server` in the foreground on a free port, nothing persisted.
pub async fn start_redis(dir: &Path, name: &str) -> anyhow::Result<(Proc, u16)> {
    spawn_redis(dir, dir, name, &[]).await
}

/// `redis-server` on a free port with its files under `data_dir`, nothing
/// persisted, `extra` appended to its arguments; returns once it listens.
async fn spawn_redis(
    dir: &Path,
    data_dir: &Path,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<(Proc, u16)> {
    let port = free_port();
    let (out, err) = log_file(dir, name)?;
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ])
        .arg(data_dir)
        .args(extra)
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("redis-server on PATH")?;
    let proc = Proc::child(name, child);
    ensure!(
        wait_port(loopback(port), Duration::from_secs(10)).await,
        "{name} did not start"
    );
    Ok((proc, port))
}

/// A replica (`--replicaof`) of the redis-server on `primary`, nothing
/// persisted; returns once its link to the primary is up.
///
/// # Errors
/// When it does not start or never links within 10 s.
pub async fn start_replica(dir: &Path, name: &str, primary: u16) -> anyhow::Result<(Proc, u16)> {
    // The first sync starts at once, not after the default 5 s wait for
    // more replicas.
    let mut primary_conn = redis::Client::open(format!("redis://127.0.0.1:{primary}/"))?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query_async::<()>(&mut primary_conn)
        .await?;
    let replica_dir = dir.join(name);
    std::fs::create_dir_all(&replica_dir)?;
    let (proc, port) = spawn_redis(
        dir,
        &replica_dir,
        name,
        &["--replicaof", "127.0.0.1", &primary.to_string()],
    )
    .await?;
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_multiplexed_async_connection()
        .await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await?;
        if info.contains("master_link_status:up") {
            return Ok((proc, port));
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{name} never linked to its primary on {primary}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Orders the backend writes per batch (`backend.batch_size`, written
/// into the bench's config): the COPY floor writes its rows in batches of
/// this size too.
pub const ORDER_BATCH: usize = 500;

/// The Flashgate side.
pub struct Flashgate {
    pub gateway: Proc,
    pub backend: Option<Proc>,
    /// The bench's own redis-server; `None` on a deployment given with
    /// `--redis-config`.
    pub redis: Option<Proc>,
    /// Where the processes find Redis.
    pub redis_config: RedisConfig,
    pub gateway_addr: std::net::SocketAddr,
    /// The gateway's admin listener (its `/metrics`).
    pub gateway_admin_addr: std::net::SocketAddr,
    /// The backend's order API (and its `/metrics`).
    pub backend_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    pub database_url: String,
    pub jwt_secret: String,
    admin_token: String,
    /// Gateways' token on the backend's order API.
    internal_token: String,
    /// The shop's payment token (the backend needs one to start).
    shop_token: String,
    config_path: PathBuf,
    bin_dir: PathBuf,
    dir: PathBuf,
    pub http: reqwest::Client,
    /// `FLASHGATE_DATABASE_URL` of the next backend start, instead of the
    /// file's database (the MySQL drain).
    pub database_override: Option<String>,
}

/// How the Flashgate side is set up.
pub struct FlashgateOptions {
    pub bin_dir: PathBuf,
    pub threads: usize,
    /// The page served as `/flashgate/sales/{id}` (the peers' static page, so both
    /// sides send the same bytes).
    pub page: PathBuf,
    pub database_url: String,
    /// `[limits.buy] user` bucket: (per_second, burst).
    pub user_bucket: (u32, u32),
    /// A Redis deployment (any `redis.mode`) to use instead of a
    /// redis-server of the bench's own.
    pub redis: Option<RedisConfig>,
}

impl Flashgate {
    /// Starts Redis, the backend and the gateway.
    ///
    /// # Errors
    /// When a binary is missing or a process does not come up.
    pub async fn start(dir: &Path, opts: &FlashgateOptions) -> anyhow::Result<Self> {
        for b in ["flashgate", "flashgate-backend"] {
            ensure!(
                opts.bin_dir.join(b).exists(),
                "{} not built (cargo build --release)",
                opts.bin_dir.join(b).display()
            );
        }
        let (redis, redis_config) = match &opts.redis {
            Some(config) => (None, config.clone()),
            None => {
                let (redis, port) = start_redis(dir, "flashgate-redis").await?;
                (
                    Some(redis),
                    RedisConfig::standalone(format!("redis://127.0.0.1:{port}/")),
                )
            }
        };
        let static_dir = dir.join("static");
        std::fs::create_dir_all(&static_dir)?;
        std::fs::copy(&opts.page, static_dir.join("sale.html"))
            .with_context(|| format!("copy {}", opts.page.display()))?;
        let gateway_addr = loopback(free_port());
        let gateway_admin_addr = loopback(free_port());
        let backend_addr = loopback(free_port());
        let admin_addr = loopback(free_port());
        // Nothing listens there: the bench never requests a shop path.
        let shop_addr = loopback(free_port());
        let config_path = dir.join("flashgate.toml");
        let (per_second, burst) = opts.user_bucket;
        std::fs::write(
            &config_path,
            format!(
                r#"# Written by flashgate-bench for one run; secrets come from the environment.
[redis]
{redis_keys}
timeout_ms = 1000

[gateway]
listen = "{gateway_addr}"
admin_listen = "{gateway_admin_addr}"
threads = {threads}
shop_upstream = "{shop_addr}"
backend_url = "http://{backend_addr}"
forward_timeout_ms = 500
static_dir = "{static_dir}"
runtime_dir = "{runtime_dir}"

[backend]
listen = "{backend_addr}"
admin_listen = "{admin_addr}"
database_url = "{db}"
consumer_name = "bench-backend"
batch_size = {order_batch}

[limits.buy]
user = {{ per_second = {per_second}, burst = {burst} }}
"#,
                threads = opts.threads,
                redis_keys = redis_config.target.to_toml(),
                runtime_dir = dir.join("run").display(),
                static_dir = static_dir.display(),
                db = opts.database_url,
                order_batch = ORDER_BATCH,
            ),
        )?;
        let (out, err) = log_file(dir, "flashgate")?;
        let jwt_secret = random_hex(32);
        let admin_token = random_hex(32);
        let internal_token = random_hex(32);
        let shop_token = random_hex(32);
        let gateway = Command::new(opts.bin_dir.join("flashgate"))
            .arg("--config")
            .arg(&config_path)
            .arg("serve")
            .env("FLASHGATE_JWT_SECRET", &jwt_secret)
            .env("FLASHGATE_ADMIN_TOKEN", &admin_token)
            .env("FLASHGATE_INTERNAL_TOKEN", &internal_token)
            .env("RUST_LOG", "warn")
            .stdout(out)
            .stderr(err)
            .spawn()?;
        let gateway = Proc::child("flashgate", gateway);
        let mut fg = Self {
            gateway,
            backend: None,
            redis,
            redis_config,
            gateway_addr,
            gateway_admin_addr,
            backend_addr,
            admin_addr,
            database_url: opts.database_url.clone(),
            jwt_secret,
            admin_token,
            internal_token,
            shop_token,
            config_path,
            bin_dir: opts.bin_dir.clone(),
            dir: dir.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            database_override: None,
        };
        fg.start_backend().await?;
        if !wait_port(gateway_addr, Duration::from_secs(30)).await {
            bail!(
                "gateway did not start:\n{}",
                std::fs::read_to_string(dir.join("flashgate.log")).unwrap_or_default()
            );
        }
        Ok(fg)
    }

    /// A second gateway beside the first, on the same Redis and backend,
    /// with `redis_keys` added to its `[redis]` table (e.g.
    /// `wait_replicas = 1`) and `tables` (TOML tables the first gateway's
    /// config lacks, e.g. `[challenge]`) at the end; its address once it
    /// listens. It has a challenge signing secret of its own.
    ///
    /// # Errors
    /// When it does not come up within 30 s.
    pub async fn start_gateway_with(
        &self,
        name: &str,
        redis_keys: &str,
        tables: &str,
    ) -> anyhow::Result<(Proc, std::net::SocketAddr)> {
        let addr = loopback(free_port());
        let admin = loopback(free_port());
        let config = std::fs::read_to_string(&self.config_path)?
            .replace(
                &format!("listen = \"{}\"", self.gateway_addr),
                &format!("listen = \"{addr}\""),
            )
            .replace(
                &format!("admin_listen = \"{}\"", self.gateway_admin_addr),
                &format!("admin_listen = \"{admin}\""),
            )
            .replace(
                "timeout_ms = 1000\n",
                &format!("timeout_ms = 1000\n{redis_keys}\n"),
            )
            .replace(
                &self.dir.join("run").display().to_string(),
                &self.dir.join(format!("run-{name}")).display().to_string(),
            );
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, format!("{config}\n{tables}\n"))?;
        let child = self
            .command("flashgate", &path, name)?
            .env("FLASHGATE_CHALLENGE_SECRET", random_hex(32))
            .env("FLASHGATE_WAITING_ROOM_SECRET", random_hex(32))
            .arg("serve")
            .spawn()?;
        let gateway = Proc::child(name, child);
        if !wait_port(addr, Duration::from_secs(30)).await {
            bail!(
                "{name} did not start:\n{}",
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
            );
        }
        Ok((gateway, addr))
    }

    /// A command running binary `bin` with config file `config`, the run's
    /// secrets in its environment and its output in `<log>.log`.
    fn command(&self, bin: &str, config: &std::path::Path, log: &str) -> anyhow::Result<Command> {
        let (out, err) = log_file(&self.dir, log)?;
        let mut cmd = Command::new(self.bin_dir.join(bin));
        cmd.arg("--config")
            .arg(config)
            .env("FLASHGATE_JWT_SECRET", &self.jwt_secret)
            .env("FLASHGATE_ADMIN_TOKEN", &self.admin_token)
            .env("FLASHGATE_INTERNAL_TOKEN", &self.internal_token)
            .env("FLASHGATE_SHOP_TOKEN", &self.shop_token)
            .env("RUST_LOG", "warn")
            .stdout(out)
            .stderr(err);
        if let Some(url) = &self.database_override {
            cmd.env("FLASHGATE_DATABASE_URL", url);
        }
        Ok(cmd)
    }

    /// Starts the backend and waits for its admin listener.
    ///
    /// # Errors
    /// When it does not come up within 30 s.
    pub async fn start_backend(&mut self) -> anyhow::Result<()> {
        let child = self
            .command("flashgate-backend", &self.config_path, "flashgate-backend")?
            .spawn()?;
        self.backend = Some(Proc::child("flashgate-backend", child));
        if !wait_port(self.admin_addr, Duration::from_secs(30)).await {
            bail!(
                "backend did not start:\n{}",
                std::fs::read_to_string(self.dir.join("flashgate-backend.log")).unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Stops the backend (SIGTERM, graceful).
    pub fn stop_backend(&mut self) {
        if let Some(mut b) = self.backend.take() {
            b.stop();
        }
    }

    pub fn backend_pid(&self) -> u32 {
        self.backend.as_ref().map_or(0, |b| b.pid)
    }

    /// Processes whose CPU a run reports.
    pub fn watched(&self) -> Vec<Watched> {
        let mut watched = vec![Watched::pids("gateway", vec![self.gateway.pid])];
        if let Some(redis) = &self.redis {
            watched.push(Watched::pids("redis", vec![redis.pid]));
        }
        watched.push(Watched::pids("backend", vec![self.backend_pid()]));
        // The order database is part of what a buy costs: every PostgreSQL
        // process (the bench's database is on the machine's server, which
        // nothing else uses during a run).
        watched.push(Watched::command(DATABASE, "postgres"));
        watched
    }

    pub fn redis_pid(&self) -> u32 {
        self.redis.as_ref().map_or(0, |r| r.pid)
    }

    /// A connection to the Redis the processes use, in its mode.
    pub async fn redis(&self) -> anyhow::Result<RedisHandle> {
        Ok(RedisHandle::connect(&self.redis_config, &Tuning::new(Duration::from_secs(5))).await?)
    }

    /// Creates or replaces a sale through the admin API: open now, for an hour.
    ///
    /// # Errors
    /// When the admin API refuses.
    pub async fn put_sale(&self, id: &str, stock: i64, per_user_limit: i64) -> anyhow::Result<()> {
        self.put_bucketed_sale(id, stock, per_user_limit, 1).await
    }

    /// An open sale whose stock is split over `buckets` buckets.
    ///
    /// # Errors
    /// When the admin API refuses it.
    pub async fn put_bucketed_sale(
        &self,
        id: &str,
        stock: i64,
        per_user_limit: i64,
        buckets: u32,
    ) -> anyhow::Result<()> {
        self.put_sale_with(id, stock, per_user_limit, buckets, -1000)
            .await
    }

    /// A sale that opens an hour from now (its buys are answered "not
    /// started").
    ///
    /// # Errors
    /// When the admin API refuses it.
    pub async fn put_future_sale(&self, id: &str, stock: i64) -> anyhow::Result<()> {
        self.put_sale_with(id, stock, 1, 1, 3_600_000).await
    }

    async fn put_sale_with(
        &self,
        id: &str,
        stock: i64,
        per_user_limit: i64,
        buckets: u32,
        starts_in_ms: i64,
    ) -> anyhow::Result<()> {
        let now = flashgate_common::now_ms();
        let body = serde_json::json!({
            "name": format!("Bench sale {id}"),
            "stock": stock,
            "per_user_limit": per_user_limit,
            "starts_at": flashgate_common::rfc3339(now + starts_in_ms),
            "ends_at": flashgate_common::rfc3339(now + starts_in_ms.max(0) + 3_600_000),
            "buckets": buckets,
        });
        let resp = self
            .http
            .put(format!("http://{}/admin/sales/{id}", self.admin_addr))
            .bearer_auth(&self.admin_token)
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        ensure!(
            status.is_success(),
            "PUT /admin/sales/{id}: {status} {}",
            resp.text().await.unwrap_or_default()
        );
        Ok(())
    }

    /// Runs of the backend's timed scripts so far (stream trims, fence
    /// checks), from its `/metrics` (0 while it cannot be read): the
    /// scripts Flashgate runs on a timer, not per buy.
    pub async fn timed_scripts(&self) -> u64 {
        let Ok(resp) = self
            .http
            .get(format!("http://{}/metrics", self.backend_addr))
            .send()
            .await
        else {
            return 0;
        };
        let text = resp.text().await.unwrap_or_default();
        [
            "flashgate_backend_stream_trim_scripts_total ",
            "flashgate_backend_fence_scripts_total ",
        ]
        .iter()
        .filter_map(|name| text.lines().find_map(|l| l.strip_prefix(name)))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
    }

    /// The sum of the backend's samples of `metric` whose labels contain
    /// `labels`, from its `/metrics`; 0 while it cannot be read.
    pub async fn backend_metric(&self, metric: &str, labels: &str) -> f64 {
        self.metric_at(self.backend_addr, metric, labels).await
    }

    /// The sum of the gateway's samples of `metric` whose labels contain
    /// `labels` (e.g. `result="moved"`), from its `/metrics`; 0 while it
    /// cannot be read.
    pub async fn gateway_metric(&self, metric: &str, labels: &str) -> f64 {
        self.metric_at(self.gateway_admin_addr, metric, labels)
            .await
    }

    async fn metric_at(&self, addr: std::net::SocketAddr, metric: &str, labels: &str) -> f64 {
        let Ok(resp) = self.http.get(format!("http://{addr}/metrics")).send().await else {
            return 0.0;
        };
        let text = resp.text().await.unwrap_or_default();
        sum_samples(&text, metric, labels)
    }

    /// `GET /admin/sales/{id}`.
    ///
    /// # Errors
    /// When the admin API does not answer 200.
    pub async fn admin_sale(&self, id: &str) -> anyhow::Result<serde_json::Value> {
        let resp = self
            .http
            .get(format!("http://{}/admin/sales/{id}", self.admin_addr))
            .bearer_auth(&self.admin_token)
            .send()
            .await?;
        ensure!(
            resp.status().is_success(),
            "GET /admin/sales/{id}: {}",
            resp.status()
        );
        Ok(resp.json().await?)
    }
}

/// The sum of the samples of `metric` in a Prometheus text page whose
/// labels contain `labels`.
fn sum_samples(text: &str, metric: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// The body of the gateway's 429 to a buy over the user's bucket
/// (`Reply::from(Rejection::RateLimited)` in gateway/src/edge/reply.rs),
/// answered by the rejection floor.
pub const RATE_LIMITED_BODY: &str =
    r#"{"code":"rate_limited","message":"too many requests, slow down"}"#;

/// The headers the gateway adds to that 429 under the bench's
/// `[limits.buy] user = { per_second = 1, burst = 10 }` (its request id
/// aside, which the floor adds too).
const RATE_LIMITED_HEADERS: &[&str] = &[
    "Cache-Control: no-store",
    "Retry-After: 1",
    r#"RateLimit-Policy: "buy-user";q=10;w=10"#,
    r#"RateLimit: "buy-user";r=0;t=1"#,
];

/// The peers: nginx (static page) and the OpenResty gateway with its Redis.
pub struct Peers {
    pub static_nginx: Proc,
    /// `pingora_floor` (bench/src/bin): the least a Pingora server does to
    /// answer the same page.
    pub floor: Proc,
    pub floor_addr: std::net::SocketAddr,
    /// The same floor under Pingora's own server options: no work
    /// stealing, one SO_REUSEPORT listener per thread.
    pub floor_tuned: Proc,
    pub floor_tuned_addr: std::net::SocketAddr,
    /// The floor answering every request with the gateway's 429 of a buy
    /// over its user bucket ([`RATE_LIMITED_BODY`]).
    pub floor_429: Proc,
    pub floor_429_addr: std::net::SocketAddr,
    /// The floor over HTTPS, with the run's certificate.
    pub floor_tls: Proc,
    pub floor_tls_addr: std::net::SocketAddr,
    /// nginx serving the page over HTTPS with the run's certificate.
    pub tls_nginx: Proc,
    pub tls_addr: std::net::SocketAddr,
    pub gw_nginx: Proc,
    pub redis: Proc,
    pub redis_port: u16,
    pub static_addr: std::net::SocketAddr,
    pub gw_addr: std::net::SocketAddr,
    /// nginx `proxy_cache` in front of `static_nginx` (the peer of the
    /// shop cache).
    pub cache_nginx: Proc,
    pub cache_addr: std::net::SocketAddr,
}

/// Renders a peers' nginx template the way `peers/lib/common.sh` does.
fn render_conf(
    template: &Path,
    work: &Path,
    port: u16,
    workers: usize,
    peers: &Path,
    out: &Path,
) -> anyhow::Result<()> {
    let t = std::fs::read_to_string(template)
        .with_context(|| format!("read {}", template.display()))?;
    let text = t
        .replace("@WORK@", &work.display().to_string())
        .replace("@WORKERS@", &workers.to_string())
        .replace("@PORT@", &port.to_string())
        .replace("@PEERS@", &peers.display().to_string());
    std::fs::write(out, text)?;
    Ok(())
}

/// Starts `pingora_floor` serving `page` with `threads` threads and
/// `extra` arguments.
async fn start_floor(
    bin_dir: &Path,
    page: &Path,
    threads: usize,
    extra: &[String],
) -> anyhow::Result<(Proc, std::net::SocketAddr)> {
    let bin = bin_dir.join("pingora_floor");
    ensure!(
        bin.exists(),
        "{} not built (cargo build --release -p flashgate-bench --bins)",
        bin.display()
    );
    let addr = loopback(free_port());
    let child = Command::new(bin)
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--page")
        .arg(page)
        .arg("--threads")
        .arg(threads.to_string())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let floor = Proc::child("pingora-floor", child);
    ensure!(
        wait_port(addr, Duration::from_secs(10)).await,
        "pingora_floor did not listen on {addr}"
    );
    Ok((floor, addr))
}

async fn start_nginx(
    name: &str,
    work: &Path,
    conf: &Path,
    port: u16,
    env: &[(&str, String)],
) -> anyhow::Result<Proc> {
    std::fs::create_dir_all(work.join("tmp"))?;
    let test = Command::new("nginx")
        .arg("-t")
        .arg("-q")
        .arg("-p")
        .arg(work)
        .arg("-c")
        .arg(conf)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .status()?;
    ensure!(
        test.success(),
        "{name}: nginx config test failed ({})",
        conf.display()
    );
    let started = Command::new("nginx")
        .arg("-p")
        .arg(work)
        .arg("-c")
        .arg(conf)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .status()?;
    ensure!(
        started.success(),
        "{name}: nginx did not start (see {}/error.log)",
        work.display()
    );
    let proc = Proc::from_pidfile(name, &work.join("nginx.pid"))?;
    ensure!(
        wait_port(loopback(port), Duration::from_secs(10)).await,
        "{name}: nothing listening on {port}"
    );
    for _ in 0..100 {
        if !children_of(proc.pid).is_empty() {
            return Ok(proc);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{name}: no worker process appeared")
}

impl Peers {
    /// Starts both peers with `workers` nginx workers each. The OpenResty
    /// gateway runs with the settings of the peers' own load scenarios:
    /// user limit 30 per 60 s window, IP limit and global bucket effectively
    /// off (1e9), so every check still runs but none rejects by accident.
    ///
    /// # Errors
    /// When nginx or its modules are missing, or a process does not come up.
    pub async fn start(
        dir: &Path,
        peers_dir: &Path,
        bin_dir: &Path,
        workers: usize,
        cert: &crate::tls::Cert,
    ) -> anyhow::Result<Self> {
        let (redis, redis_port) = start_redis(dir, "peer-redis").await?;
        let static_port = free_port();
        let work = dir.join("nginx-static");
        std::fs::create_dir_all(&work)?;
        render_conf(
            &peers_dir.join("conf/nginx-static.conf.in"),
            &work,
            static_port,
            workers,
            peers_dir,
            &work.join("nginx.conf"),
        )?;
        let static_nginx = start_nginx(
            "nginx-static",
            &work,
            &work.join("nginx.conf"),
            static_port,
            &[],
        )
        .await?;

        let gw_port = free_port();
        let work = dir.join("openresty-gateway");
        std::fs::create_dir_all(&work)?;
        render_conf(
            &peers_dir.join("conf/openresty-gateway.conf.in"),
            &work,
            gw_port,
            workers,
            peers_dir,
            &work.join("nginx.conf"),
        )?;
        let high = "1000000000".to_owned();
        let env = [
            ("GW_USER_LIMIT", "30".to_owned()),
            ("GW_IP_LIMIT", high.clone()),
            ("GW_GLOBAL_RATE", high),
            ("GW_REDIS_HOST", "127.0.0.1".to_owned()),
            ("GW_REDIS_PORT", redis_port.to_string()),
        ];
        let gw_nginx = start_nginx(
            "openresty-gateway",
            &work,
            &work.join("nginx.conf"),
            gw_port,
            &env,
        )
        .await?;
        let page = peers_dir.join("html/p/1001.html");
        let (floor, floor_addr) = start_floor(bin_dir, &page, workers, &[]).await?;
        let tuned = [
            "--no-work-stealing".to_owned(),
            "--listeners".to_owned(),
            workers.to_string(),
        ];
        let (floor_tuned, floor_tuned_addr) = start_floor(bin_dir, &page, workers, &tuned).await?;
        let rejection = dir.join("rate-limited.json");
        std::fs::write(&rejection, RATE_LIMITED_BODY)?;
        let mut args = vec![
            "--status".to_owned(),
            "429".to_owned(),
            "--content-type".to_owned(),
            "application/json".to_owned(),
        ];
        for header in RATE_LIMITED_HEADERS {
            args.extend(["--header".to_owned(), (*header).to_owned()]);
        }
        let (floor_429, floor_429_addr) = start_floor(bin_dir, &rejection, workers, &args).await?;
        let tls = [
            "--tls-cert".to_owned(),
            cert.cert.display().to_string(),
            "--tls-key".to_owned(),
            cert.key.display().to_string(),
        ];
        let (floor_tls, floor_tls_addr) = start_floor(bin_dir, &page, workers, &tls).await?;
        let tls_port = free_port();
        let work = dir.join("nginx-tls");
        std::fs::create_dir_all(&work)?;
        let conf = include_str!("../conf/nginx-tls.conf.in")
            .replace("@WORK@", &work.display().to_string())
            .replace("@WORKERS@", &workers.to_string())
            .replace("@PORT@", &tls_port.to_string())
            .replace("@PEERS@", &peers_dir.display().to_string())
            .replace("@CERT@", &cert.cert.display().to_string())
            .replace("@KEY@", &cert.key.display().to_string());
        std::fs::write(work.join("nginx.conf"), conf)?;
        let tls_nginx =
            start_nginx("nginx-tls", &work, &work.join("nginx.conf"), tls_port, &[]).await?;
        let cache_port = free_port();
        let work = dir.join("nginx-proxy-cache");
        std::fs::create_dir_all(&work)?;
        let conf = include_str!("../conf/nginx-proxy-cache.conf.in")
            .replace("@WORK@", &work.display().to_string())
            .replace("@WORKERS@", &workers.to_string())
            .replace("@PORT@", &cache_port.to_string())
            .replace("@ORIGIN@", &loopback(static_port).to_string());
        std::fs::write(work.join("nginx.conf"), conf)?;
        let cache_nginx = start_nginx(
            "nginx-proxy-cache",
            &work,
            &work.join("nginx.conf"),
            cache_port,
            &[],
        )
        .await?;
        Ok(Self {
            cache_nginx,
            cache_addr: loopback(cache_port),
            static_nginx,
            floor,
            floor_addr,
            floor_tuned,
            floor_tuned_addr,
            floor_429,
            floor_429_addr,
            floor_tls,
            floor_tls_addr,
            tls_nginx,
            tls_addr: loopback(tls_port),
            gw_nginx,
            redis,
            redis_port,
            static_addr: loopback(static_port),
            gw_addr: loopback(gw_port),
        })
    }

    pub fn floor_watched(&self) -> Vec<Watched> {
        vec![Watched::pids("gateway", vec![self.floor.pid])]
    }

    pub fn floor_tuned_watched(&self) -> Vec<Watched> {
        vec![Watched::pids("gateway", vec![self.floor_tuned.pid])]
    }

    pub fn floor_429_watched(&self) -> Vec<Watched> {
        vec![Watched::pids("gateway", vec![self.floor_429.pid])]
    }

    pub fn floor_tls_watched(&self) -> Vec<Watched> {
        vec![Watched::pids("gateway", vec![self.floor_tls.pid])]
    }

    pub fn tls_watched(&self) -> Vec<Watched> {
        let mut pids = children_of(self.tls_nginx.pid);
        pids.push(self.tls_nginx.pid);
        vec![Watched::pids("gateway", pids)]
    }

    pub fn static_watched(&self) -> Vec<Watched> {
        let mut pids = children_of(self.static_nginx.pid);
        pids.push(self.static_nginx.pid);
        vec![Watched::pids("gateway", pids)]
    }

    pub fn cache_watched(&self) -> Vec<Watched> {
        let mut pids = children_of(self.cache_nginx.pid);
        pids.push(self.cache_nginx.pid);
        vec![Watched::pids("gateway", pids)]
    }

    pub fn gw_watched(&self) -> Vec<Watched> {
        let mut pids = children_of(self.gw_nginx.pid);
        pids.push(self.gw_nginx.pid);
        vec![
            Watched::pids("gateway", pids),
            Watched::pids("redis", vec![self.redis.pid]),
        ]
    }

    pub async fn redis(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.redis_port))?;
        Ok(client.get_multiplexed_async_connection().await?)
    }

    /// The peer's reset between runs: empty Redis (scripts too, so its
    /// EVALSHA → NOSCRIPT → EVAL path runs as in its own script) and `stock`.
    ///
    /// # Errors
    /// When Redis fails.
    pub async fn reset(&self, stock: i64) -> anyhow::Result<()> {
        let mut c = self.redis().await?;
        redis::cmd("FLUSHALL").query_async::<()>(&mut c).await?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut c)
            .await?;
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async::<()>(&mut c)
            .await?;
        redis::cmd("SET")
            .arg("seckill:stock:1001")
            .arg(stock)
            .query_async::<()>(&mut c)
            .await?;
        Ok(())
    }
}

/// One command's line of `INFO commandstats`: its calls, those of them
/// that answered an error, and the time of all of them, which for a script
/// includes the commands it called (also counted on their own lines).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CommandStat {
    pub name: String,
    pub calls: u64,
    pub failed: u64,
    pub usec: u64,
}

/// Calls of `command` in `stats` that did not answer an error (0 when
/// never called): an `EVALSHA` answered NOSCRIPT (the first call of a
/// script on a Redis that has not cached it, which the client follows by
/// loading it) ran nothing.
pub fn calls_of(stats: &[CommandStat], command: &str) -> u64 {
    stats
        .iter()
        .find(|c| c.name == command)
        .map_or(0, |c| c.calls.saturating_sub(c.failed))
}

/// Script calls (`EVALSHA` and `EVAL`) that ran, from one read of INFO
/// commandstats.
pub async fn script_calls(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
) -> anyhow::Result<u64> {
    let stats = command_stats(conn).await?;
    Ok(calls_of(&stats, "evalsha") + calls_of(&stats, "eval"))
}

/// Every command of INFO commandstats.
pub async fn command_stats(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
) -> anyhow::Result<Vec<CommandStat>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(parse_command_stats(&info))
}

/// The `cmdstat_<name>:calls=..,usec=..,..,failed_calls=..` lines of
/// INFO commandstats, each field read by its exact name.
pub fn parse_command_stats(info: &str) -> Vec<CommandStat> {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(name, stats)| {
            let field = |key: &str| -> u64 {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                    .unwrap_or(0)
            };
            CommandStat {
                name: name.to_owned(),
                calls: field("calls"),
                failed: field("failed_calls"),
                usec: field("usec"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_stats_read_each_field_by_its_exact_name() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=6948,usec=3462567,usec_per_call=498.35,rejected_calls=7,failed_calls=1\r\n\
            cmdstat_xinfo|groups:usec_per_call=11.58,failed_calls=0,rejected_calls=3,usec=880,calls=76\r\n";
        assert_eq!(
            parse_command_stats(info),
            vec![
                CommandStat {
                    name: "evalsha".into(),
                    calls: 6948,
                    failed: 1,
                    usec: 3_462_567
                },
                CommandStat {
                    name: "xinfo|groups".into(),
                    calls: 76,
                    failed: 0,
                    usec: 880
                },
            ]
        );
    }

    #[test]
    fn calls_of_a_command_leave_out_its_failed_ones_and_are_zero_when_never_called() {
        let stats = parse_command_stats(
            "cmdstat_evalsha:calls=10,usec=50,failed_calls=3\r\ncmdstat_eval:calls=2,usec=9,failed_calls=0\r\n",
        );
        assert_eq!(
            calls_of(&stats, "evalsha"),
            7,
            "a NOSCRIPT answer ran nothing"
        );
        assert_eq!(calls_of(&stats, "eval"), 2);
        assert_eq!(calls_of(&stats, "wait"), 0);
    }
}
