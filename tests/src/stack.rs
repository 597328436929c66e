//! A whole Flashgate stack on loopback: its own redis-server, backend,
//! gateway and demo shop, with a generated config (or the shipped one with
//! only addresses and paths replaced), all stopped by PID on drop.
//!
//! `StackOptions::redis_mode` runs the stack on a Redis Cluster (3 masters,
//! 1 replica each) or a Sentinel set (primary, replica, 3 sentinels) of its
//! own instead; the standalone `Stack::redis` still runs then, unused by
//! the processes. [`Stack::redis_handle`] reaches whichever the processes use.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use flashgate_common::config::{RedisConfig, RedisTarget};
use flashgate_common::redis_conn::{RedisHandle, Tuning};
use flashgate_testkit::{RedisCluster, RedisSentinels};

use crate::client::{buy, token};
use crate::db::{db_order_rows, db_orders, OrderRow};
use crate::{
    bin, free_port, wait_http_ready, wait_port, Proc, RedisServer, TempDir, ADMIN_TOKEN,
    CHALLENGE_SECRET, INTERNAL_TOKEN, JWT_SECRET, SHOP_TOKEN,
};

/// Settings of a test stack.
#[derive(Clone)]
pub struct StackOptions {
    /// `None` for an SQLite file in the stack's dir.
    pub database_url: Option<String>,
    pub redis_timeout_ms: u64,
    pub appendonly: bool,
    pub claim_idle_ms: u64,
    /// `backend.forward_grace_ms`: short by default, so that tests whose
    /// forward fails do not wait a second for the consumer, yet long
    /// enough that the forward normally writes first.
    pub forward_grace_ms: u64,
    /// TOML appended to the generated config (limits, deny lists, ...).
    pub extra_toml: String,
    /// Start from the shipped `config/flashgate.toml` (its limits, timings
    /// and demo sale) instead of the test config; only what the harness
    /// must set is replaced: addresses, the Redis URL, the database, the
    /// static and runtime directories. `redis_timeout_ms` and
    /// `claim_idle_ms` and `forward_grace_ms` are then not applied.
    pub shipped_config: bool,
    /// `Stack::start` returns once every process listens, without waiting
    /// for `/ready` (for tests of a dependency that is away at start).
    pub skip_ready_wait: bool,
    /// The Redis deployment the processes use.
    pub redis_mode: RedisMode,
    /// TOML lines added to the generated config's `[redis]` table (e.g.
    /// `wait_replicas = 1`): `extra_toml` lands after `[backend]`, where a
    /// Redis key would be read as the backend's.
    pub redis_extra: String,
    /// The stack's Redis deployment also serves TLS, on certificates from
    /// a CA the stack makes (`redis-ca.pem` in its dir, which is
    /// `redis.ca_file`), and the processes reach it only there
    /// (`rediss://`), in every mode. The test's own checks keep the plain
    /// ports.
    pub redis_tls: bool,
    /// TOML lines added to the generated config's `[gateway]` table (e.g.
    /// `path_prefix = "/edge"`); not applied with `shipped_config`.
    pub gateway_extra: String,
}

/// Which Redis deployment a test stack runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedisMode {
    #[default]
    Standalone,
    /// `mode = "cluster"`: a [`RedisCluster`] of the stack's own.
    Cluster,
    /// `mode = "sentinel"`: a [`RedisSentinels`] set of the stack's own.
    Sentinel,
}

/// The cluster or sentinel set a stack runs on (stopped by PID on drop).
pub enum Deployment {
    Standalone,
    Cluster(RedisCluster),
    Sentinel(RedisSentinels),
}

impl Deployment {
    /// The deployment of `mode`, also serving TLS with `tls` (a small
    /// cluster then: three masters, no replicas).
    fn start_with(mode: RedisMode, tls: Option<&flashgate_testkit::TlsFiles>) -> Self {
        match (mode, tls) {
            (RedisMode::Standalone, _) => Self::Standalone,
            (RedisMode::Cluster, None) => Self::Cluster(RedisCluster::start()),
            (RedisMode::Cluster, Some(tls)) => Self::Cluster(RedisCluster::start_with(
                flashgate_testkit::ClusterOptions {
                    replicas_per_master: 0,
                    tls: Some(tls.clone()),
                    ..Default::default()
                },
            )),
            (RedisMode::Sentinel, None) => Self::Sentinel(RedisSentinels::start()),
            (RedisMode::Sentinel, Some(tls)) => Self::Sentinel(RedisSentinels::start_tls(tls)),
        }
    }

    /// Where the processes find Redis over TLS (`redis` serves the
    /// standalone mode).
    fn tls_target(&self, redis: &RedisServer) -> RedisTarget {
        match self {
            Self::Standalone => RedisTarget::Standalone {
                url: redis.tls_url(),
            },
            Self::Cluster(c) => RedisTarget::Cluster {
                nodes: c.tls_nodes(),
            },
            Self::Sentinel(s) => RedisTarget::Sentinel {
                sentinels: s.tls_sentinels(),
                master_name: s.master_name().to_owned(),
            },
        }
    }

    /// Where the processes find Redis; `standalone_port` in standalone mode.
    fn target(&self, standalone_port: u16) -> RedisTarget {
        match self {
            Self::Standalone => RedisTarget::Standalone {
                url: format!("redis://127.0.0.1:{standalone_port}/"),
            },
            Self::Cluster(c) => RedisTarget::Cluster { nodes: c.nodes() },
            Self::Sentinel(s) => RedisTarget::Sentinel {
                sentinels: s.sentinels(),
                master_name: s.master_name().to_owned(),
            },
        }
    }
}

/// The `[redis]` keys that name `target`, as TOML lines.
pub fn redis_toml(target: &RedisTarget) -> String {
    target.to_toml()
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            database_url: None,
            redis_timeout_ms: 300,
            appendonly: false,
            claim_idle_ms: 2000,
            forward_grace_ms: 200,
            extra_toml: String::new(),
            shipped_config: false,
            skip_ready_wait: false,
            redis_mode: RedisMode::Standalone,
            redis_extra: String::new(),
            redis_tls: false,
            gateway_extra: String::new(),
        }
    }
}

impl StackOptions {
    /// The shipped configuration, as `make run` starts it.
    pub fn shipped() -> Self {
        Self {
            shipped_config: true,
            ..Self::default()
        }
    }
}

/// The addresses and paths a test stack must own, whatever the config.
struct Placement<'a> {
    redis: RedisTarget,
    gateway_addr: SocketAddr,
    gateway_admin_addr: SocketAddr,
    shop_addr: SocketAddr,
    backend_addr: SocketAddr,
    admin_addr: SocketAddr,
    database_url: &'a str,
    static_dir: PathBuf,
    runtime_dir: PathBuf,
}

/// `config/flashgate.toml` with only the harness's placement replaced.
fn shipped_config(at: &Placement<'_>) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/flashgate.toml");
    let mut doc: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let mut set = |section: &str, key: &str, value: String| {
        let table = doc
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table
            .as_table_mut()
            .unwrap()
            .insert(key.to_owned(), toml::Value::String(value));
    };
    let RedisTarget::Standalone { url } = &at.redis else {
        panic!("the shipped config runs on a standalone Redis")
    };
    set("redis", "url", url.clone());
    set("gateway", "listen", at.gateway_addr.to_string());
    set("gateway", "admin_listen", at.gateway_admin_addr.to_string());
    set("gateway", "shop_upstream", at.shop_addr.to_string());
    set(
        "gateway",
        "backend_url",
        format!("http://{}", at.backend_addr),
    );
    set("gateway", "static_dir", at.static_dir.display().to_string());
    set(
        "gateway",
        "runtime_dir",
        at.runtime_dir.display().to_string(),
    );
    set("backend", "listen", at.backend_addr.to_string());
    set("backend", "admin_listen", at.admin_addr.to_string());
    set("backend", "database_url", at.database_url.to_owned());
    toml::to_string(&doc).unwrap()
}

/// A sale's books in Redis (see [`Stack::sale_in_redis`]).
#[derive(Debug, Clone, Default)]
pub struct SaleInRedis {
    /// `remaining`; -1 when the sale is not in Redis.
    pub remaining: i64,
    /// `resv`: reservation id -> user id.
    pub reservations: HashMap<String, String>,
    /// `released`: reservation ids whose item went back to the stock.
    pub released: HashSet<String>,
    /// `buyers`: user id -> items held.
    pub buyers: HashMap<String, i64>,
}

/// Redis, backend, gateway and demo shop, on loopback.
pub struct Stack {
    pub gateway: Option<Proc>,
    pub backend: Option<Proc>,
    pub shop: Option<Proc>,
    pub redis: RedisServer,
    /// The cluster or sentinel set the processes use, in those modes.
    pub deployment: Deployment,
    pub gateway_addr: SocketAddr,
    /// The gateway's admin listener (`/metrics`, `/live`, `/ready`).
    pub gateway_admin_addr: SocketAddr,
    pub backend_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub shop_addr: SocketAddr,
    pub database_url: String,
    pub config_path: PathBuf,
    pub http: reqwest::Client,
    pub dir: TempDir,
}

impl Stack {
    /// Starts everything and waits until each listener answers.
    pub async fn start(mut opts: StackOptions) -> Self {
        let dir = TempDir::new("stack");
        let tls = opts.redis_tls.then(|| redis_tls_files(&dir.0));
        let deployment = Deployment::start_with(opts.redis_mode, tls.as_ref());
        let (redis, target) = match &tls {
            None => {
                let redis = RedisServer::start(&dir.0, opts.appendonly);
                let target = deployment.target(redis.port);
                (redis, target)
            }
            Some(files) => {
                let redis = RedisServer::start_tls(&dir.0, opts.appendonly, files);
                let target = deployment.tls_target(&redis);
                opts.redis_extra.push_str(&format!(
                    "\nca_file = {:?}\n",
                    files.ca_file.display().to_string()
                ));
                (redis, target)
            }
        };
        let layout = Layout::new(&opts, &dir, target);
        let mut stack = layout.into_stack(dir, redis, deployment);
        if opts.skip_ready_wait {
            stack.spawn_backend();
            stack.spawn_gateway();
        } else {
            stack.start_backend();
            stack.start_gateway();
        }
        assert!(
            wait_port(stack.shop_addr, Duration::from_secs(10)),
            "demo shop did not start"
        );
        stack
    }

    /// Starts the shop, the backend and the gateway before their Redis
    /// exists (its port is chosen, nobody listens there), waits until both
    /// listen, then lets `start_redis` start it on that port (in the
    /// stack's dir, with the given `Early` view) and returns the stack.
    pub async fn start_redis_last<F, Fut>(opts: StackOptions, start_redis: F) -> Self
    where
        F: FnOnce(Early) -> Fut,
        Fut: std::future::Future<Output = RedisServer>,
    {
        let dir = TempDir::new("stack");
        let redis_port = free_port();
        assert_eq!(
            opts.redis_mode,
            RedisMode::Standalone,
            "Redis last: a standalone Redis only"
        );
        let layout = Layout::new(&opts, &dir, Deployment::Standalone.target(redis_port));
        let spawn =
            |name: &'static str, extra: &[&str]| spawn_in(&dir.0, &layout.config_path, name, extra);
        let backend = spawn("flashgate-backend", &[]);
        let gateway = spawn("flashgate", &["serve"]);
        let log = |name: &str| {
            std::fs::read_to_string(dir.0.join(format!("{name}.log"))).unwrap_or_default()
        };
        assert!(
            wait_port(layout.backend_addr, Duration::from_secs(30)),
            "backend did not listen:\n{}",
            log("flashgate-backend")
        );
        assert!(
            wait_port(layout.gateway_addr, Duration::from_secs(30)),
            "gateway did not listen:\n{}",
            log("flashgate")
        );
        let early = Early {
            dir: dir.0.clone(),
            redis_port,
            backend_addr: layout.backend_addr,
            gateway_addr: layout.gateway_addr,
            gateway_admin_addr: layout.gateway_admin_addr,
        };
        let redis = start_redis(early).await;
        assert_eq!(
            redis.port, redis_port,
            "start Redis on the port the stack was configured with"
        );
        let mut stack = layout.into_stack(dir, redis, Deployment::Standalone);
        stack.backend = Some(backend);
        stack.gateway = Some(gateway);
        assert!(
            wait_port(stack.shop_addr, Duration::from_secs(10)),
            "demo shop did not start"
        );
        stack
    }

    fn spawn(&self, name: &'static str, extra: &[&str]) -> Proc {
        spawn_in(&self.dir.0, &self.config_path, name, extra)
    }
}

/// A CA of the stack's own (`redis-ca.pem`) and a certificate it signed
/// for 127.0.0.1 and localhost (server and client use: cluster nodes and
/// replicas show it to each other), written under `dir` for redis-server.
pub fn redis_tls_files(dir: &Path) -> flashgate_testkit::TlsFiles {
    let ca = crate::pki::TestCa::root("flashgate test Redis CA");
    let files = flashgate_testkit::TlsFiles {
        cert_file: dir.join("redis.crt"),
        key_file: dir.join("redis.key"),
        ca_file: dir.join("redis-ca.pem"),
    };
    ca.peer_leaf("127.0.0.1", &["localhost"], &["127.0.0.1"])
        .write(&files.cert_file, &files.key_file);
    crate::pki::write_replacing(&files.ca_file, &ca.pem());
    files
}

/// What a test stack is told about itself before its Redis runs.
pub struct Early {
    pub dir: PathBuf,
    pub redis_port: u16,
    pub backend_addr: SocketAddr,
    pub gateway_addr: SocketAddr,
    pub gateway_admin_addr: SocketAddr,
}

/// The addresses and config file of a stack, and its demo shop.
struct Layout {
    gateway_addr: SocketAddr,
    gateway_admin_addr: SocketAddr,
    backend_addr: SocketAddr,
    admin_addr: SocketAddr,
    shop_addr: SocketAddr,
    database_url: String,
    config_path: PathBuf,
    shop: Proc,
}

impl Layout {
    /// Picks the ports, writes the config, starts the demo shop.
    fn new(opts: &StackOptions, dir: &TempDir, redis: RedisTarget) -> Self {
        let port = |_| -> SocketAddr { ([127, 0, 0, 1], free_port()).into() };
        let (gateway_addr, backend_addr, admin_addr, shop_addr) =
            (port(0), port(1), port(2), port(3));
        let gateway_admin_addr = port(4);
        let database_url = opts
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}/flashgate.db", dir.0.display()));
        let config_path = dir.0.join("flashgate.toml");
        let static_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../static");
        let runtime_dir = dir.0.join("run");
        let placement = Placement {
            redis: redis.clone(),
            gateway_addr,
            gateway_admin_addr,
            shop_addr,
            backend_addr,
            admin_addr,
            database_url: &database_url,
            static_dir: static_dir.clone(),
            runtime_dir: runtime_dir.clone(),
        };
        let text = if opts.shipped_config {
            format!("{}\n{}", shipped_config(&placement), opts.extra_toml)
        } else {
            format!(
                r#"
[redis]
{redis}
timeout_ms = {timeout}
{redis_extra}

[gateway]
listen = "{gateway_addr}"
admin_listen = "{gateway_admin_addr}"
threads = 2
shop_upstream = "{shop_addr}"
backend_url = "http://{backend_addr}"
forward_timeout_ms = 1000
static_dir = "{static_dir}"
runtime_dir = "{runtime_dir}"
{gateway_extra}

[backend]
listen = "{backend_addr}"
admin_listen = "{admin_addr}"
database_url = "{database_url}"
consumer_name = "backend-1"
batch_size = 200
block_ms = 200
claim_idle_ms = {claim}
forward_grace_ms = {grace}
sale_poll_ms = 100
{extra}
"#,
                extra = opts.extra_toml,
                redis = redis_toml(&redis),
                redis_extra = opts.redis_extra,
                gateway_extra = opts.gateway_extra,
                timeout = opts.redis_timeout_ms,
                static_dir = static_dir.display(),
                runtime_dir = runtime_dir.display(),
                claim = opts.claim_idle_ms,
                grace = opts.forward_grace_ms,
            )
        };
        std::fs::write(&config_path, text).unwrap();
        let shop = Command::new(bin("demo-shop"))
            .arg(shop_addr.to_string())
            .env_remove("FLASHGATE_DEMO_SIGNIN")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let shop = Proc {
            child: shop,
            name: "demo-shop",
        };
        Self {
            gateway_addr,
            gateway_admin_addr,
            backend_addr,
            admin_addr,
            shop_addr,
            database_url,
            config_path,
            shop,
        }
    }

    fn into_stack(self, dir: TempDir, redis: RedisServer, deployment: Deployment) -> Stack {
        Stack {
            gateway: None,
            backend: None,
            shop: Some(self.shop),
            redis,
            deployment,
            gateway_addr: self.gateway_addr,
            gateway_admin_addr: self.gateway_admin_addr,
            backend_addr: self.backend_addr,
            admin_addr: self.admin_addr,
            shop_addr: self.shop_addr,
            database_url: self.database_url,
            config_path: self.config_path,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(256)
                .build()
                .unwrap(),
            dir,
        }
    }
}

/// Starts a binary of the stack with its config, secrets and log file.
fn spawn_in(dir: &Path, config_path: &Path, name: &'static str, extra: &[&str]) -> Proc {
    spawn_as(dir, config_path, name, name, extra)
}

/// Starts `binary` with a config file and the test secrets; its output goes
/// to `DIR/NAME.log` and `name` tells it apart from another instance.
pub fn spawn_as(
    dir: &Path,
    config_path: &Path,
    binary: &str,
    name: &'static str,
    extra: &[&str],
) -> Proc {
    spawn_wrapped(dir, config_path, &[], binary, name, extra)
}

/// As [`spawn_as`], started through `wrapper` (a program and its arguments,
/// the binary's command line appended; it must `exec` it, so the PID is the
/// binary's): e.g. `unshare --mount` for a private `/etc/hosts`.
pub fn spawn_wrapped(
    dir: &Path,
    config_path: &Path,
    wrapper: &[&str],
    binary: &str,
    name: &'static str,
    extra: &[&str],
) -> Proc {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin(binary));
            c
        }
        None => Command::new(bin(binary)),
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .unwrap();
    let child = command
        .arg("--config")
        .arg(config_path)
        .args(extra)
        .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
        .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("FLASHGATE_INTERNAL_TOKEN", INTERNAL_TOKEN)
        .env("FLASHGATE_SHOP_TOKEN", SHOP_TOKEN)
        .env("FLASHGATE_CHALLENGE_SECRET", CHALLENGE_SECRET)
        .env("FLASHGATE_WEBHOOK_SECRET", crate::WEBHOOK_SECRET)
        .env("FLASHGATE_HANDOFF_SECRET", crate::HANDOFF_SECRET)
        .env("FLASHGATE_WAITING_ROOM_SECRET", crate::WAITING_ROOM_SECRET)
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc { child, name }
}

impl Stack {
    /// The gateway's `/metrics` exposition.
    pub async fn gateway_metrics_text(&self) -> String {
        self.metrics_text(self.gateway_admin_addr).await
    }

    /// The backend's `/metrics` exposition.
    pub async fn backend_metrics_text(&self) -> String {
        self.metrics_text(self.backend_addr).await
    }

    async fn metrics_text(&self, addr: SocketAddr) -> String {
        self.http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The sum of the gateway's `/metrics` samples of the family `name`
    /// (every label set), 0 when it has none yet.
    pub async fn gateway_metric(&self, name: &str) -> f64 {
        let text = self.gateway_metrics_text().await;
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with(['{', ' ']))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The log a process of this stack wrote so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.0.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Starts the backend; returns once it listens and `/ready` answers 200.
    pub fn start_backend(&mut self) {
        self.spawn_backend();
        if !wait_http_ready(self.backend_addr, Duration::from_secs(30)) {
            panic!(
                "backend did not get ready:\n{}",
                self.log("flashgate-backend")
            );
        }
    }

    /// Starts the backend; returns once it listens, ready or not (for
    /// tests of what it does while its dependencies are away).
    pub fn spawn_backend(&mut self) {
        self.backend = Some(self.spawn("flashgate-backend", &[]));
        if !wait_port(self.backend_addr, Duration::from_secs(30))
            || !wait_port(self.admin_addr, Duration::from_secs(5))
        {
            panic!("backend did not start:\n{}", self.log("flashgate-backend"));
        }
    }

    /// Starts the gateway; returns once it listens and `/ready` answers 200.
    pub fn start_gateway(&mut self) {
        self.spawn_gateway();
        if !wait_http_ready(self.gateway_admin_addr, Duration::from_secs(30)) {
            panic!("gateway did not get ready:\n{}", self.log("flashgate"));
        }
    }

    /// Starts the gateway; returns once it listens, ready or not.
    pub fn spawn_gateway(&mut self) {
        self.gateway = Some(self.spawn("flashgate", &["serve"]));
        if !wait_port(self.gateway_addr, Duration::from_secs(30)) {
            panic!("gateway did not start:\n{}", self.log("flashgate"));
        }
    }

    /// Starts one more gateway on its own port, same Redis and backend
    /// (many gateways share one Redis in production). Returns it and its address.
    pub fn start_second_gateway(&self) -> (Proc, SocketAddr) {
        self.start_gateway_via(self.backend_addr)
    }

    /// Starts one more gateway on its own port, same Redis, forwarding its
    /// winners to the backend at `backend`; returns once it listens and
    /// `/ready` answers 200.
    pub fn start_gateway_via(&self, backend: SocketAddr) -> (Proc, SocketAddr) {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        let text = text.replacen(
            &format!("backend_url = \"http://{}\"", self.backend_addr),
            &format!("backend_url = \"http://{backend}\""),
            1,
        );
        let text = text.replacen(
            &format!("listen = \"{}\"", self.gateway_addr),
            &format!("listen = \"{addr}\""),
            1,
        );
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let text = text.replacen(
            &format!("admin_listen = \"{}\"", self.gateway_admin_addr),
            &format!("admin_listen = \"{admin}\""),
            1,
        );
        let path = self.dir.0.join("flashgate-2.toml");
        std::fs::write(&path, text).unwrap();
        let proc = spawn_as(&self.dir.0, &path, "flashgate", "flashgate-2", &["serve"]);
        assert!(
            wait_port(addr, Duration::from_secs(30))
                && wait_http_ready(admin, Duration::from_secs(30)),
            "second gateway did not start or get ready:\n{}",
            self.log("flashgate-2")
        );
        (proc, addr)
    }

    /// Starts a second backend (consumer `backend-2`) on its own ports, same
    /// Redis and database; returns it once ready, and its order API address.
    pub fn start_second_backend(&self) -> (Proc, SocketAddr) {
        let (addr, admin): (SocketAddr, SocketAddr) = (
            ([127, 0, 0, 1], free_port()).into(),
            ([127, 0, 0, 1], free_port()).into(),
        );
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        let text = text.replacen(
            &format!("listen = \"{}\"", self.backend_addr),
            &format!("listen = \"{addr}\""),
            1,
        );
        let text = text.replacen(
            &format!("admin_listen = \"{}\"", self.admin_addr),
            &format!("admin_listen = \"{admin}\""),
            1,
        );
        let text = text.replacen(
            "consumer_name = \"backend-1\"",
            "consumer_name = \"backend-2\"",
            1,
        );
        let path = self.dir.0.join("flashgate-backend-2.toml");
        std::fs::write(&path, text).unwrap();
        let proc = spawn_as(
            &self.dir.0,
            &path,
            "flashgate-backend",
            "flashgate-backend-2",
            &[],
        );
        assert!(
            wait_http_ready(addr, Duration::from_secs(30)),
            "second backend did not get ready:\n{}",
            self.log("flashgate-backend-2")
        );
        (proc, addr)
    }

    /// Where the processes find Redis, in the stack's mode.
    pub fn redis_config(&self) -> RedisConfig {
        RedisConfig {
            timeout: Duration::from_secs(5),
            target: self.deployment.target(self.redis.port),
            ..RedisConfig::standalone("")
        }
    }

    /// A connection to the Redis the processes use, in the stack's mode.
    pub async fn redis_handle(&self) -> RedisHandle {
        match self.deployment {
            Deployment::Standalone => RedisHandle::Direct(self.redis.conn().await),
            _ => RedisHandle::connect(&self.redis_config(), &Tuning::new(Duration::from_secs(5)))
                .await
                .unwrap(),
        }
    }

    /// Rewrites the stack's config file (the gateway reloads limits and deny lists from it).
    pub fn edit_config(&self, edit: impl FnOnce(String) -> String) {
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        std::fs::write(&self.config_path, edit(text)).unwrap();
    }

    /// Kills the backend with SIGKILL.
    pub fn kill_backend(&mut self) {
        if let Some(mut p) = self.backend.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Kills the gateway with SIGKILL.
    pub fn kill_gateway(&mut self) {
        if let Some(mut p) = self.gateway.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.gateway_addr, path)
    }

    /// What the shop saw of `GET path` (an `/echo/…` path of the demo shop)
    /// sent through the gateway with `headers`: its JSON echo (`path`,
    /// `headers`); the answer must be 200.
    pub async fn shop_echo(&self, path: &str, headers: &[(&str, &str)]) -> serde_json::Value {
        let mut req = self.http.get(self.url(path));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{}", self.log("flashgate"));
        resp.json().await.unwrap()
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin_addr, path)
    }

    /// Creates (or updates) a sale through the admin API.
    pub async fn put_sale(
        &self,
        id: &str,
        stock: i64,
        per_user_limit: i64,
        starts_in: Duration,
        lasts: Duration,
    ) -> Value {
        let now = flashgate_common::now_ms();
        let starts = now + starts_in.as_millis() as i64;
        let body = serde_json::json!({
            "name": format!("Sale {id}"),
            "stock": stock,
            "per_user_limit": per_user_limit,
            "starts_at": flashgate_common::rfc3339(starts),
            "ends_at": flashgate_common::rfc3339(starts + lasts.as_millis() as i64),
        });
        let resp = self
            .http
            .put(self.admin_url(&format!("/admin/sales/{id}")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert!(
            status == 200 || status == 201,
            "PUT sale {id}: {status} {v}"
        );
        v
    }

    /// An open sale: started a second ago, lasting an hour.
    pub async fn open_sale(&self, id: &str, stock: i64, per_user_limit: i64) {
        self.put_sale(
            id,
            stock,
            per_user_limit,
            Duration::ZERO,
            Duration::from_secs(3600),
        )
        .await;
    }

    /// An open sale with its stock split over `buckets` buckets (`"buckets"`
    /// on `PUT /admin/sales/{id}`); asserts it was created so.
    pub async fn open_bucketed_sale(
        &self,
        id: &str,
        stock: i64,
        per_user_limit: i64,
        buckets: u32,
    ) {
        let now = flashgate_common::now_ms();
        let body = serde_json::json!({
            "name": format!("Sale {id}"),
            "stock": stock,
            "per_user_limit": per_user_limit,
            "starts_at": flashgate_common::rfc3339(now - 1000),
            "ends_at": flashgate_common::rfc3339(now + 3_600_000),
            "buckets": buckets,
        });
        let (status, v) = self
            .admin(
                reqwest::Method::PUT,
                &format!("/admin/sales/{id}"),
                Some(body),
            )
            .await;
        assert_eq!(status, 201, "PUT sale {id}: {v}");
        assert_eq!(
            (v["buckets"].as_u64(), v["remaining"].as_i64()),
            (Some(u64::from(buckets)), Some(stock)),
            "{v}"
        );
    }

    /// `POST /flashgate/api/sales/{sale}/buy` as `user`; returns status and JSON body.
    pub async fn buy(&self, sale: &str, user: &str, idempotency_key: Option<&str>) -> (u16, Value) {
        buy(
            &self.http,
            self.gateway_addr,
            sale,
            &token(user),
            idempotency_key,
        )
        .await
    }

    /// The order id of `user`'s reservation `rid`, once the backend has
    /// written it (polls `GET /flashgate/api/reservations/{rid}` for up to 20 s).
    pub async fn order_id_of(&self, user: &str, rid: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let resp = self
                .http
                .get(self.url(&format!("/flashgate/api/reservations/{rid}")))
                .bearer_auth(token(user))
                .send()
                .await
                .unwrap();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            if let Some(order) = v["order_id"].as_str() {
                return order.to_owned();
            }
            assert!(Instant::now() < deadline, "no order for {rid}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Admin view of a sale.
    pub async fn admin_sale(&self, id: &str) -> Value {
        self.http
            .get(self.admin_url(&format!("/admin/sales/{id}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Orders of a sale in the database: (orders, distinct users, most orders of one user).
    pub async fn db_orders(&self, sale: &str) -> (i64, i64, i64) {
        db_orders(&self.database_url, sale).await
    }

    /// Waits until the database holds `n` orders for `sale` (or `limit` passes).
    pub async fn wait_orders(&self, sale: &str, n: i64, limit: Duration) -> (i64, i64, i64) {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.db_orders(sale).await;
            if got.0 >= n || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Remaining stock in Redis.
    pub async fn remaining(&self, sale: &str) -> i64 {
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        redis::cmd("GET")
            .arg(&keys.remaining)
            .query_async::<Option<i64>>(&mut self.redis_handle().await)
            .await
            .unwrap()
            .unwrap_or(-1)
    }

    /// Entries in the sale's reservation stream.
    /// Reservation records ever appended to the sale's stream (Redis's
    /// `entries-added`: the backend trims written entries, so `XLEN` is
    /// not this); 0 when there is no stream.
    pub async fn stream_len(&self, sale: &str) -> i64 {
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        let info: redis::RedisResult<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("XINFO")
                .arg("STREAM")
                .arg(&keys.stream)
                .query_async(&mut self.redis_handle().await)
                .await;
        match info.ok().and_then(|i| i.get("entries-added").cloned()) {
            Some(redis::Value::Int(n)) => n,
            _ => 0,
        }
    }

    /// What Redis counts of a sale now: `remaining`, the reservation index,
    /// the returned items and the buyers, read in one `MULTI` (every key of
    /// a sale shares one slot, so this works on a cluster too).
    pub async fn sale_in_redis(&self, sale: &str) -> SaleInRedis {
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        type Reply = (
            Option<i64>,
            HashMap<String, String>,
            HashSet<String>,
            HashMap<String, i64>,
        );
        let (remaining, reservations, released, buyers): Reply = redis::pipe()
            .atomic()
            .get(&keys.remaining)
            .hgetall(&keys.reservations)
            .smembers(&keys.released)
            .hgetall(&keys.buyers)
            .query_async(&mut self.redis_handle().await)
            .await
            .unwrap();
        SaleInRedis {
            remaining: remaining.unwrap_or(-1),
            reservations,
            released,
            buyers,
        }
    }

    /// Entries the sale's stream holds now (`XLEN`).
    pub async fn stream_entries_kept(&self, sale: &str) -> i64 {
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        redis::cmd("XLEN")
            .arg(&keys.stream)
            .query_async(&mut self.redis_handle().await)
            .await
            .unwrap()
    }
}

impl Stack {
    /// Every order of a sale in this stack's database.
    pub async fn order_rows(&self, sale: &str) -> Vec<OrderRow> {
        db_order_rows(&self.database_url, sale).await
    }

    /// Waits until the backend's order API answers again (after a restart).
    pub async fn wait_backend(&self, limit: Duration) -> bool {
        wait_port(self.backend_addr, limit)
    }

    /// `POST` to the backend's order API as the shop (a payment, with
    /// [`SHOP_TOKEN`]); status and JSON.
    pub async fn backend_post(&self, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("http://{}{}", self.backend_addr, path))
            .bearer_auth(SHOP_TOKEN)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A request to the admin API with the admin token; status and JSON.
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, self.admin_url(path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

impl Stack {
    /// The backend's readiness endpoint (`GET /ready` on its order listener).
    pub fn backend_ready_url(&self) -> String {
        format!("http://{}/ready", self.backend_addr)
    }

    /// The gateway's readiness endpoint (`GET /ready` on its admin listener).
    pub fn gateway_ready_url(&self) -> String {
        format!("http://{}/ready", self.gateway_admin_addr)
    }
}

/// A plain connection to one Redis node on 127.0.0.1 (a cluster node, a
/// replica): for reading or changing that node alone.
pub async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Waits until `n` gateways are subscribed to sale events, over the
/// cluster's running nodes (a gateway subscribes on one of them).
pub async fn wait_subscribers(cluster: &RedisCluster, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut total = 0;
        for port in cluster
            .topology()
            .await
            .into_iter()
            .filter(|t| !t.is_failing())
            .map(|t| t.port)
        {
            let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("fg:events")
                .query_async(&mut node(port).await)
                .await
                .unwrap();
            total += subs[0].1;
        }
        if total >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{total} of {n} gateways subscribed to sale events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
