//! Test harness: real processes on loopback.
//!
//! Each test starts its own `redis-server` on a free port (so fault tests may
//! kill or stop it), its own backend and gateway binaries, and a demo shop,
//! all under a private temp dir. Everything is stopped by PID on drop.
//!
//! The binaries are taken from the cargo target dir next to the test
//! executable; `make test` builds them first.
// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Secret the test gateways verify buyer tokens with (secrets under 32
/// bytes are refused at start).
pub const JWT_SECRET: &str = "test-jwt-secret-not-for-production-0000";
/// Admin token of the test backends.
pub const ADMIN_TOKEN: &str = "test-admin-token-not-for-production-000";
/// Token the test gateways present on the backend's order API.
pub const INTERNAL_TOKEN: &str = "test-internal-token-gateways-to-backend-0001";
/// Token the test shop presents to confirm payments.
pub const SHOP_TOKEN: &str = "test-shop-token-payments-to-backend-000001";

pub mod ports;
pub use ports::free_port;

/// A binary of this workspace, from the target dir the tests run from.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let dir = if dir.ends_with("deps") { dir.parent().unwrap() } else { dir };
    let path = dir.join(name);
    assert!(path.exists(), "{} not built: run `cargo build --workspace --bins` (make test does)", path.display());
    path
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (TERM, STOP, CONT, KILL).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status().unwrap();
        assert!(ok.success(), "kill -{sig} {} failed", self.name);
    }

    /// Waits for the process to exit, up to `limit`; kills it past that.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-CONT").arg(self.pid().to_string()).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_port(addr: SocketAddr, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

/// Polls `GET http://addr/ready` until it answers 200, for at most `limit`.
/// A blocking probe so the synchronous start helpers can wait on it: a
/// process listens before its dependencies are ready (it answers `503`
/// until then), and a test's first call must not race that.
pub fn wait_http_ready(addr: SocketAddr, limit: Duration) -> bool {
    use std::io::{Read, Write};
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let mut head = [0u8; 12];
            let asked = s.write_all(format!("GET /ready HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes());
            if asked.is_ok() && s.read_exact(&mut head).is_ok() && head.ends_with(b" 200") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A private temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!("fg-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A redis-server of the test's own.
pub struct RedisServer {
    pub proc: Proc,
    pub port: u16,
    pub dir: PathBuf,
    appendonly: bool,
}

impl RedisServer {
    /// Starts redis-server on a free port with its files under `dir`.
    /// `appendonly` turns on AOF with fsync always (for restart tests).
    pub fn start(dir: &Path, appendonly: bool) -> Self {
        Self::start_on(dir, free_port(), appendonly)
    }

    /// Starts redis-server on `port` with its files under `dir`; returns
    /// once the port is open (a Redis loading its AOF still answers `LOADING`).
    pub fn start_on(dir: &Path, port: u16, appendonly: bool) -> Self {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--dir"])
            .arg(dir)
            .args(["--appendonly", if appendonly { "yes" } else { "no" }, "--appendfsync", "always"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let proc = Proc { child: cmd.spawn().expect("redis-server on PATH"), name: "redis-server" };
        assert!(wait_port(([127, 0, 0, 1], port).into(), Duration::from_secs(10)), "redis-server did not start");
        Self { proc, port, dir: dir.to_owned(), appendonly }
    }

    /// Kills the server (SIGKILL) and starts a new one on the same port and dir.
    pub fn restart(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
        let fresh = Self::start_on(&self.dir.clone(), self.port, self.appendonly);
        *self = fresh;
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client().get_multiplexed_async_connection().await.unwrap()
    }

    /// Starts watching every command this server runs (`MONITOR`); see
    /// [`Monitor::commands`].
    pub async fn monitor(&self) -> Monitor {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        stream.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(stream).lines();
        let ok = lines.next_line().await.unwrap();
        assert_eq!(ok.as_deref(), Some("+OK"), "MONITOR refused");
        Monitor { lines }
    }

    /// `calls` of one command from INFO commandstats (0 when never called).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut self.conn().await).await.unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|rest| rest.split(',').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
    }
}

/// The commands a Redis runs, as `MONITOR` prints them: one line each,
/// `<time> [<db> <client>] "COMMAND" "arg" ...`, scripts' commands included.
pub struct Monitor {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>,
}

impl Monitor {
    /// Every command `redis` ran since [`RedisServer::monitor`], up to a
    /// marker sent now: nothing run before this call is missed.
    pub async fn commands(mut self, redis: &RedisServer) -> Vec<String> {
        let marker = format!("fg-monitor-end-{}", rand::random::<u64>());
        let _: String = redis::cmd("ECHO").arg(&marker).query_async(&mut redis.conn().await).await.unwrap();
        let mut seen = Vec::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("MONITOR fell silent before the marker")
                .unwrap()
                .expect("MONITOR connection closed");
            if line.contains(&marker) {
                return seen;
            }
            seen.push(line);
        }
    }
}

/// Settings of a test stack.
#[derive(Clone)]
pub struct StackOptions {
    /// `None` for an SQLite file in the stack's dir.
    pub database_url: Option<String>,
    pub redis_timeout_ms: u64,
    pub appendonly: bool,
    pub claim_idle_ms: u64,
    /// TOML appended to the generated config (limits, deny lists, ...).
    pub extra_toml: String,
    /// Start from the shipped `config/flashgate.toml` (its limits, timings
    /// and demo sale) instead of the test config; only what the harness
    /// must set is replaced: addresses, the Redis URL, the database, the
    /// static and runtime directories. `redis_timeout_ms` and
    /// `claim_idle_ms` are then not applied.
    pub shipped_config: bool,
    /// `Stack::start` returns once every process listens, without waiting
    /// for `/ready` (for tests of a dependency that is away at start).
    pub skip_ready_wait: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            database_url: None,
            redis_timeout_ms: 300,
            appendonly: false,
            claim_idle_ms: 2000,
            extra_toml: String::new(),
            shipped_config: false,
            skip_ready_wait: false,
        }
    }
}

impl StackOptions {
    /// The shipped configuration, as `make run` starts it.
    pub fn shipped() -> Self {
        Self { shipped_config: true, ..Self::default() }
    }
}

/// The addresses and paths a test stack must own, whatever the config.
struct Placement<'a> {
    redis_url: String,
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
        let table = doc.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table.as_table_mut().unwrap().insert(key.to_owned(), toml::Value::String(value));
    };
    set("redis", "url", at.redis_url.clone());
    set("gateway", "listen", at.gateway_addr.to_string());
    set("gateway", "admin_listen", at.gateway_admin_addr.to_string());
    set("gateway", "shop_upstream", at.shop_addr.to_string());
    set("gateway", "backend_url", format!("http://{}", at.backend_addr));
    set("gateway", "static_dir", at.static_dir.display().to_string());
    set("gateway", "runtime_dir", at.runtime_dir.display().to_string());
    set("backend", "listen", at.backend_addr.to_string());
    set("backend", "admin_listen", at.admin_addr.to_string());
    set("backend", "database_url", at.database_url.to_owned());
    toml::to_string(&doc).unwrap()
}

/// Redis, backend, gateway and demo shop, on loopback.
pub struct Stack {
    pub gateway: Option<Proc>,
    pub backend: Option<Proc>,
    pub shop: Option<Proc>,
    pub redis: RedisServer,
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
    pub async fn start(opts: StackOptions) -> Self {
        let dir = TempDir::new("stack");
        let redis = RedisServer::start(&dir.0, opts.appendonly);
        let layout = Layout::new(&opts, &dir, redis.port);
        let mut stack = layout.into_stack(dir, redis);
        if opts.skip_ready_wait {
            stack.spawn_backend();
            stack.spawn_gateway();
        } else {
            stack.start_backend();
            stack.start_gateway();
        }
        assert!(wait_port(stack.shop_addr, Duration::from_secs(10)), "demo shop did not start");
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
        let layout = Layout::new(&opts, &dir, redis_port);
        let spawn = |name: &'static str, extra: &[&str]| spawn_in(&dir.0, &layout.config_path, name, extra);
        let backend = spawn("flashgate-backend", &[]);
        let gateway = spawn("flashgate", &["serve"]);
        let log = |name: &str| std::fs::read_to_string(dir.0.join(format!("{name}.log"))).unwrap_or_default();
        assert!(wait_port(layout.backend_addr, Duration::from_secs(30)), "backend did not listen:\n{}", log("flashgate-backend"));
        assert!(wait_port(layout.gateway_addr, Duration::from_secs(30)), "gateway did not listen:\n{}", log("flashgate"));
        let early = Early {
            dir: dir.0.clone(),
            redis_port,
            backend_addr: layout.backend_addr,
            gateway_addr: layout.gateway_addr,
            gateway_admin_addr: layout.gateway_admin_addr,
        };
        let redis = start_redis(early).await;
        assert_eq!(redis.port, redis_port, "start Redis on the port the stack was configured with");
        let mut stack = layout.into_stack(dir, redis);
        stack.backend = Some(backend);
        stack.gateway = Some(gateway);
        assert!(wait_port(stack.shop_addr, Duration::from_secs(10)), "demo shop did not start");
        stack
    }

    fn spawn(&self, name: &'static str, extra: &[&str]) -> Proc {
        spawn_in(&self.dir.0, &self.config_path, name, extra)
    }
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
    fn new(opts: &StackOptions, dir: &TempDir, redis_port: u16) -> Self {
        let redis_url = format!("redis://127.0.0.1:{redis_port}/");
        let port = |_| -> SocketAddr { ([127, 0, 0, 1], free_port()).into() };
        let (gateway_addr, backend_addr, admin_addr, shop_addr) = (port(0), port(1), port(2), port(3));
        let gateway_admin_addr = port(4);
        let database_url = opts.database_url.clone().unwrap_or_else(|| format!("sqlite://{}/flashgate.db", dir.0.display()));
        let config_path = dir.0.join("flashgate.toml");
        let static_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../static");
        let runtime_dir = dir.0.join("run");
        let placement = Placement {
            redis_url: redis_url.clone(),
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
url = "{redis}"
timeout_ms = {timeout}

[gateway]
listen = "{gateway_addr}"
admin_listen = "{gateway_admin_addr}"
threads = 2
shop_upstream = "{shop_addr}"
backend_url = "http://{backend_addr}"
forward_timeout_ms = 1000
static_dir = "{static_dir}"
runtime_dir = "{runtime_dir}"

[backend]
listen = "{backend_addr}"
admin_listen = "{admin_addr}"
database_url = "{database_url}"
consumer_name = "backend-1"
batch_size = 200
block_ms = 200
claim_idle_ms = {claim}
sale_poll_ms = 100
{extra}
"#,
                extra = opts.extra_toml,
                redis = redis_url,
                timeout = opts.redis_timeout_ms,
                static_dir = static_dir.display(),
                runtime_dir = runtime_dir.display(),
                claim = opts.claim_idle_ms,
            )
        };
        std::fs::write(&config_path, text).unwrap();
        let shop = Command::new(bin("demo-shop")).arg(shop_addr.to_string()).stdout(Stdio::null()).spawn().unwrap();
        let shop = Proc { child: shop, name: "demo-shop" };
        Self { gateway_addr, gateway_admin_addr, backend_addr, admin_addr, shop_addr, database_url, config_path, shop }
    }

    fn into_stack(self, dir: TempDir, redis: RedisServer) -> Stack {
        Stack {
            gateway: None,
            backend: None,
            shop: Some(self.shop),
            redis,
            gateway_addr: self.gateway_addr,
            gateway_admin_addr: self.gateway_admin_addr,
            backend_addr: self.backend_addr,
            admin_addr: self.admin_addr,
            shop_addr: self.shop_addr,
            database_url: self.database_url,
            config_path: self.config_path,
            http: reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap(),
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
pub fn spawn_as(dir: &Path, config_path: &Path, binary: &str, name: &'static str, extra: &[&str]) -> Proc {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new(bin(binary))
        .arg("--config")
        .arg(config_path)
        .args(extra)
        .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
        .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("FLASHGATE_INTERNAL_TOKEN", INTERNAL_TOKEN)
        .env("FLASHGATE_SHOP_TOKEN", SHOP_TOKEN)
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc { child, name }
}

impl Stack {
    /// The log a process of this stack wrote so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.0.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Starts the backend; returns once it listens and `/ready` answers 200.
    pub fn start_backend(&mut self) {
        self.spawn_backend();
        if !wait_http_ready(self.backend_addr, Duration::from_secs(30)) {
            panic!("backend did not get ready:\n{}", self.log("flashgate-backend"));
        }
    }

    /// Starts the backend; returns once it listens, ready or not (for
    /// tests of what it does while its dependencies are away).
    pub fn spawn_backend(&mut self) {
        self.backend = Some(self.spawn("flashgate-backend", &[]));
        if !wait_port(self.backend_addr, Duration::from_secs(30)) || !wait_port(self.admin_addr, Duration::from_secs(5)) {
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
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        let text = text.replacen(&format!("listen = \"{}\"", self.gateway_addr), &format!("listen = \"{addr}\""), 1);
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let text = text.replacen(&format!("admin_listen = \"{}\"", self.gateway_admin_addr), &format!("admin_listen = \"{admin}\""), 1);
        let path = self.dir.0.join("flashgate-2.toml");
        std::fs::write(&path, text).unwrap();
        let proc = spawn_as(&self.dir.0, &path, "flashgate", "flashgate-2", &["serve"]);
        assert!(wait_port(addr, Duration::from_secs(30)), "second gateway did not start");
        (proc, addr)
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

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin_addr, path)
    }

    /// Creates (or updates) a sale through the admin API.
    pub async fn put_sale(&self, id: &str, stock: i64, per_user_limit: i64, starts_in: Duration, lasts: Duration) -> Value {
        let now = chrono_like_now_ms();
        let starts = now + starts_in.as_millis() as i64;
        let body = serde_json::json!({
            "name": format!("Sale {id}"),
            "stock": stock,
            "per_user_limit": per_user_limit,
            "starts_at": rfc3339(starts),
            "ends_at": rfc3339(starts + lasts.as_millis() as i64),
        });
        let resp = self.http.put(self.admin_url(&format!("/admin/sales/{id}"))).bearer_auth(ADMIN_TOKEN).json(&body).send().await.unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert!(status == 200 || status == 201, "PUT sale {id}: {status} {v}");
        v
    }

    /// An open sale: started a second ago, lasting an hour.
    pub async fn open_sale(&self, id: &str, stock: i64, per_user_limit: i64) {
        self.put_sale(id, stock, per_user_limit, Duration::ZERO, Duration::from_secs(3600)).await;
    }

    /// `POST /api/sales/{sale}/buy` as `user`; returns status and JSON body.
    pub async fn buy(&self, sale: &str, user: &str, idempotency_key: Option<&str>) -> (u16, Value) {
        buy(&self.http, self.gateway_addr, sale, &token(user), idempotency_key).await
    }

    /// The order id of `user`'s reservation `rid`, once the backend has
    /// written it (polls `GET /api/reservations/{rid}` for up to 20 s).
    pub async fn order_id_of(&self, user: &str, rid: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let resp = self.http.get(self.url(&format!("/api/reservations/{rid}"))).bearer_auth(token(user)).send().await.unwrap();
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
        self.http.get(self.admin_url(&format!("/admin/sales/{id}"))).bearer_auth(ADMIN_TOKEN).send().await.unwrap().json().await.unwrap()
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
        redis::cmd("GET").arg(&keys.remaining).query_async::<Option<i64>>(&mut self.redis.conn().await).await.unwrap().unwrap_or(-1)
    }

    /// Entries in the sale's reservation stream.
    /// Reservation records ever appended to the sale's stream (Redis's
    /// `entries-added`: the backend trims written entries, so `XLEN` is
    /// not this); 0 when there is no stream.
    pub async fn stream_len(&self, sale: &str) -> i64 {
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        let info: redis::RedisResult<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("XINFO").arg("STREAM").arg(&keys.stream).query_async(&mut self.redis.conn().await).await;
        match info.ok().and_then(|i| i.get("entries-added").cloned()) {
            Some(redis::Value::Int(n)) => n,
            _ => 0,
        }
    }

    /// Entries the sale's stream holds now (`XLEN`).
    pub async fn stream_entries_kept(&self, sale: &str) -> i64 {
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        redis::cmd("XLEN").arg(&keys.stream).query_async(&mut self.redis.conn().await).await.unwrap()
    }
}

/// `POST /api/sales/{sale}/buy` with a bearer token; returns status and JSON body.
pub async fn buy(http: &reqwest::Client, gateway: SocketAddr, sale: &str, token: &str, idempotency_key: Option<&str>) -> (u16, Value) {
    let mut req = http.post(format!("http://{gateway}/api/sales/{sale}/buy")).bearer_auth(token);
    if let Some(k) = idempotency_key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// Orders of a sale in a database: (orders, distinct users, most orders of one user).
pub async fn db_orders(database_url: &str, sale: &str) -> (i64, i64, i64) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    let (total,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE sale_id = $1").bind(sale).fetch_one(&pool).await.unwrap();
    let (users, most): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COALESCE(MAX(n), 0) FROM \
         (SELECT user_id, COUNT(*) AS n FROM orders WHERE sale_id = $1 GROUP BY user_id) AS per_user",
    )
    .bind(sale)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    (total, users, most)
}

/// A buyer token signed with [`JWT_SECRET`], valid for an hour.
pub fn token(user: &str) -> String {
    token_with(user, JWT_SECRET, 3600)
}

/// A buyer token with any secret and lifetime (negative = already expired).
pub fn token_with(user: &str, secret: &str, ttl_seconds: i64) -> String {
    let exp = chrono_like_now_ms() / 1000 + ttl_seconds;
    let claims = serde_json::json!({ "sub": user, "exp": exp });
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes())).unwrap()
}

fn chrono_like_now_ms() -> i64 {
    flashgate_common::now_ms()
}

fn rfc3339(ms: i64) -> String {
    flashgate_common::rfc3339(ms)
}

/// A random, non-sequential user id.
pub fn random_user() -> String {
    format!("u-{:016x}", rand::random::<u64>())
}

/// One buy attempt of a load: who, with which Idempotency-Key.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub user: String,
    pub idempotency_key: Option<String>,
}

/// What one attempt got back.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub attempt: Attempt,
    pub status: u16,
    pub body: Value,
}

impl Outcome {
    /// A winner: 201 confirmed or 202 queued.
    pub fn won(&self) -> bool {
        self.status == 201 || self.status == 202
    }

    pub fn reservation_id(&self) -> Option<&str> {
        self.body["reservation_id"].as_str()
    }
}

/// Sends every attempt at `gateway`, at most `concurrency` in flight, and
/// returns the outcomes in the order given. Tokens are minted beforehand.
pub async fn buy_all(gateway: SocketAddr, sale: &str, attempts: Vec<Attempt>, concurrency: usize) -> Vec<Outcome> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(concurrency).build().unwrap();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(attempts.len());
    for attempt in attempts {
        let (http, sem, sale) = (http.clone(), sem.clone(), sale.to_owned());
        let tok = token(&attempt.user);
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let (status, body) = buy(&http, gateway, &sale, &tok, attempt.idempotency_key.as_deref()).await;
            Outcome { attempt, status, body }
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// One order row as the reliability tests check it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderRow {
    pub order_id: String,
    pub reservation_id: String,
    pub user_id: String,
    pub status: String,
}

/// Every order of a sale in a database.
pub async fn db_order_rows(database_url: &str, sale: &str) -> Vec<OrderRow> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    let rows: Vec<(String, String, String, String)> =
        sqlx::query_as("SELECT order_id, reservation_id, user_id, status FROM orders WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().map(|(order_id, reservation_id, user_id, status)| OrderRow { order_id, reservation_id, user_id, status }).collect()
}

/// A buy that never panics: status 0 when no answer came (connection
/// refused or cut, as when the gateway dies mid-request).
pub async fn try_buy(http: &reqwest::Client, gateway: SocketAddr, sale: &str, token: &str) -> (u16, Value) {
    let req = http.post(format!("http://{gateway}/api/sales/{sale}/buy")).bearer_auth(token).timeout(Duration::from_secs(10));
    match req.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Like [`buy_all`], with one attempt per user and [`try_buy`]: survives a
/// gateway that dies mid-burst.
pub async fn try_buy_all(gateway: SocketAddr, sale: &str, users: &[String], concurrency: usize) -> Vec<Outcome> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(concurrency).build().unwrap();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(users.len());
    for user in users {
        let (http, sem, sale, user) = (http.clone(), sem.clone(), sale.to_owned(), user.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let (status, body) = try_buy(&http, gateway, &sale, &token(&user)).await;
            Outcome { attempt: Attempt { user, idempotency_key: None }, status, body }
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
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
        let resp = self.http.post(format!("http://{}{}", self.backend_addr, path)).bearer_auth(SHOP_TOKEN).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A request to the admin API with the admin token; status and JSON.
    pub async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.http.request(method, self.admin_url(path)).bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

/// `GET url`; status and JSON body (`Null` when not JSON). Status 0 when
/// nothing answered.
pub async fn get_json(http: &reqwest::Client, url: &str) -> (u16, Value) {
    match http.get(url).timeout(Duration::from_secs(5)).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Polls `url` until it answers 200 (or `limit` passes); the last answer.
pub async fn wait_ready(http: &reqwest::Client, url: &str, limit: Duration) -> (u16, Value) {
    let deadline = Instant::now() + limit;
    loop {
        let got = get_json(http, url).await;
        if got.0 == 200 || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
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

/// Writes a Redis AOF of about `keys * value_bytes` bytes of filler into
/// `dir/appendonlydir` (a plain-command AOF, no RDB preamble: the slowest
/// to load, as an AOF grown by months of writes is). A throwaway
/// redis-server fills itself with `DEBUG POPULATE`, rewrites its AOF and
/// stops. Returns the AOF's size in bytes.
pub fn prepare_large_aof(dir: &Path, keys: u64, value_bytes: u64) -> u64 {
    let port = free_port();
    let mut proc = Proc {
        child: Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--dir"])
            .arg(dir)
            .args(["--appendonly", "yes", "--aof-use-rdb-preamble", "no", "--enable-debug-command", "yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH"),
        name: "redis-server (AOF filler)",
    };
    assert!(wait_port(([127, 0, 0, 1], port).into(), Duration::from_secs(10)), "filler redis-server did not start");
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut conn = client.get_connection().unwrap();
    let () = redis::cmd("DEBUG").arg("POPULATE").arg(keys).arg("filler").arg(value_bytes).query(&mut conn).unwrap();
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut conn).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let info: String = redis::cmd("INFO").arg("persistence").query(&mut conn).unwrap();
        let busy = info.contains("aof_rewrite_in_progress:1") || info.contains("aof_rewrite_scheduled:1");
        if !busy && info.contains("aof_last_bgrewrite_status:ok") {
            break;
        }
        assert!(Instant::now() < deadline, "AOF rewrite did not finish: {info}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut conn);
    let _ = proc.wait_exit(Duration::from_secs(30));
    aof_bytes(dir)
}

/// Size of the AOF files under `dir/appendonlydir`.
pub fn aof_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("appendonlydir"))
        .map(|entries| entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Waits until the Redis on `port` answers `PING` (done loading); how long it took.
pub fn wait_redis_loaded(port: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    loop {
        let pong = client.get_connection().and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if pong.is_ok() {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "redis on {port} still not loaded: {pong:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private PostgreSQL cluster in a temp dir (`initdb` + `postgres`), for
/// tests that need a database that is absent, then starts, or restarts.
/// Runs as the `postgres` system user when the tests run as root
/// (PostgreSQL refuses to run as root).
pub struct PrivatePostgres {
    pub port: u16,
    pub dir: TempDir,
    bin: PathBuf,
    running: bool,
}

impl PrivatePostgres {
    /// `initdb` in a fresh temp dir, trust auth for local connections, on
    /// `port`; the server is not started. `None` when no PostgreSQL server
    /// binaries are installed.
    pub fn init(port: u16) -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .find(|b| b.join("initdb").exists())?;
        let dir = TempDir::new("pg");
        let data = dir.0.join("data");
        let pg = Self { port, dir, bin, running: false };
        if is_root() {
            let ok = Command::new("chown").arg("-R").arg("postgres").arg(&pg.dir.0).status().unwrap();
            assert!(ok.success(), "chown of the PostgreSQL dir failed");
        }
        let out = pg.command("initdb").args(["-A", "trust", "-U", "postgres", "-D"]).arg(&data).output().unwrap();
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        Some(pg)
    }

    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// The URL of database `postgres` on this cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (`pg_ctl start`) and waits until it accepts connections.
    pub fn start(&mut self) {
        let data = self.dir.0.join("data");
        let options = format!("-p {} -c listen_addresses=127.0.0.1 -k {}", self.port, self.dir.0.display());
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-o", &options, "-l"])
            .arg(self.dir.0.join("postgres.log"))
            .args(["-w", "-t", "60", "start"])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start failed: {}", String::from_utf8_lossy(&out.stderr));
        self.running = true;
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`).
    pub fn stop(&mut self) {
        if std::mem::take(&mut self.running) {
            let data = self.dir.0.join("data");
            let _ = self.command("pg_ctl").arg("-D").arg(&data).args(["-m", "immediate", "-w", "stop"]).output();
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
