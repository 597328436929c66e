//! A redis-server of the test's own, and what tests do to one: watch its
//! commands, fill its AOF, wait for it to load.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::free_port;
use crate::process::{wait_port, Proc, TempDir};

/// The certificate files a redis-server serves TLS with; the test makes
/// them (a CA of its own and a certificate for 127.0.0.1).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA redis-server trusts for client certificates and, with
    /// `tls-replication`/`tls-cluster`, for its peers.
    pub ca_file: PathBuf,
}

impl TlsFiles {
    /// redis-server arguments for TLS on `tls_port` (beside its plain
    /// port, which the tests' own checks keep using); clients need no
    /// certificate of their own.
    pub fn args(&self, tls_port: u16) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> =
            vec!["--tls-port".into(), tls_port.to_string().into()];
        for (flag, path) in [
            ("--tls-cert-file", &self.cert_file),
            ("--tls-key-file", &self.key_file),
            ("--tls-ca-cert-file", &self.ca_file),
        ] {
            args.push(flag.into());
            args.push(path.into());
        }
        args.extend(["--tls-auth-clients", "no"].map(Into::into));
        args
    }
}

/// A redis-server of the test's own.
pub struct RedisServer {
    pub proc: Proc,
    pub port: u16,
    pub dir: PathBuf,
    /// The port it also serves TLS on ([`RedisServer::start_tls`]).
    pub tls_port: Option<u16>,
    tls: Option<TlsFiles>,
    appendonly: bool,
    /// The temp dir of a server started by [`RedisServer::private`],
    /// removed after the server is killed (fields drop in order).
    owned_dir: Option<TempDir>,
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
        Self::spawn(dir, port, appendonly, None)
    }

    /// Starts redis-server on a free port with its files under `dir`, also
    /// serving TLS with `tls` on another free port ([`RedisServer::tls_url`]).
    pub fn start_tls(dir: &Path, appendonly: bool, tls: &TlsFiles) -> Self {
        Self::spawn(
            dir,
            free_port(),
            appendonly,
            Some((tls.clone(), free_port())),
        )
    }

    fn spawn(dir: &Path, port: u16, appendonly: bool, tls: Option<(TlsFiles, u16)>) -> Self {
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
        ])
        .arg(dir)
        .args([
            "--appendonly",
            if appendonly { "yes" } else { "no" },
            "--appendfsync",
            "always",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some((files, tls_port)) = &tls {
            cmd.args(files.args(*tls_port));
        }
        let proc = Proc {
            child: cmd.spawn().expect("redis-server on PATH"),
            name: "redis-server",
        };
        assert!(
            wait_port(([127, 0, 0, 1], port).into(), Duration::from_secs(10)),
            "redis-server did not start"
        );
        if let Some((_, tls_port)) = &tls {
            assert!(
                wait_port(([127, 0, 0, 1], *tls_port).into(), Duration::from_secs(10)),
                "redis-server did not listen for TLS"
            );
        }
        let (tls, tls_port) = tls.map_or((None, None), |(files, port)| (Some(files), Some(port)));
        Self {
            proc,
            port,
            dir: dir.to_owned(),
            tls_port,
            tls,
            appendonly,
            owned_dir: None,
        }
    }

    /// `rediss://127.0.0.1:TLS_PORT/`, for a server started with TLS.
    ///
    /// # Panics
    /// The server was started without TLS.
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://127.0.0.1:{}/",
            self.tls_port.expect("a server started with TLS")
        )
    }

    /// A throwaway server (no persistence) in a temp dir of its own;
    /// returns once it answers `PING`. For unit tests of code that talks
    /// to Redis.
    pub fn private() -> Self {
        let dir = TempDir::new("redis");
        let mut server = Self::start(&dir.0, false);
        server.owned_dir = Some(dir);
        wait_redis_loaded(server.port, Duration::from_secs(10));
        server
    }

    /// A replica of this server (`--replicaof`, no persistence), in a temp
    /// dir of its own; returns once its link to this server is up. (Its
    /// [`RedisServer::restart`] brings it back as a primary.)
    pub fn start_replica(&self) -> Self {
        Self::replica_of(self.port)
    }

    /// A replica of the Redis on `primary` (any node of a deployment, as
    /// [`RedisServer::start_replica`]); returns once its link is up.
    pub fn replica_of(primary: u16) -> Self {
        // The first sync starts at once, not after the default 5 s wait for
        // more replicas.
        let _: () = query(
            primary,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("repl-diskless-sync-delay")
                .arg(0),
        )
        .unwrap();
        let dir = TempDir::new("redis-replica");
        let port = free_port();
        let mut cmd = Command::new("redis-server");
        cmd.args([
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
        .arg(&dir.0)
        .args(["--replicaof", "127.0.0.1", &primary.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let proc = Proc {
            child: cmd.spawn().expect("redis-server on PATH"),
            name: "redis-server",
        };
        assert!(
            wait_port(([127, 0, 0, 1], port).into(), Duration::from_secs(10)),
            "redis replica did not start"
        );
        let replica = Self {
            proc,
            port,
            dir: dir.0.clone(),
            tls_port: None,
            tls: None,
            appendonly: false,
            owned_dir: Some(dir),
        };
        let started = Instant::now();
        while !replica.replication_info().contains("master_link_status:up") {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "replica on {port} never linked to {primary}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }

    /// `INFO replication`, empty when the server does not answer.
    pub fn replication_info(&self) -> String {
        query(self.port, redis::cmd("INFO").arg("replication")).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and starts a new one on the same port and dir.
    pub fn restart(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
        let tls = self.tls.take().zip(self.tls_port);
        let mut fresh = Self::spawn(&self.dir.clone(), self.port, self.appendonly, tls);
        fresh.owned_dir = self.owned_dir.take();
        *self = fresh;
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Starts watching every command this server runs (`MONITOR`); see
    /// [`Monitor::commands`].
    pub async fn monitor(&self) -> Monitor {
        Monitor::start(self.port).await
    }

    /// `calls` of one command from INFO commandstats (0 when never called).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn().await)
            .await
            .unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

/// The replication id (`master_replid`) of the Redis behind `conn`: new
/// whenever a Redis becomes a master, what the failover fence compares.
pub async fn master_replid(conn: &mut (impl redis::aio::ConnectionLike + Send)) -> String {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("master_replid:"))
        .expect("a replication id")
        .trim()
        .to_owned()
}

/// The commands a Redis runs, as `MONITOR` prints them: one line each,
/// `<time> [<db> <client>] "COMMAND" "arg" ...`, scripts' commands included.
pub struct Monitor {
    port: u16,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::TcpStream>>,
}

impl Monitor {
    /// Starts watching every command the Redis on `port` runs (any node of
    /// a deployment).
    pub async fn start(port: u16) -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        stream.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(stream).lines();
        let ok = lines.next_line().await.unwrap();
        assert_eq!(ok.as_deref(), Some("+OK"), "MONITOR refused");
        Monitor { port, lines }
    }

    /// Every command the Redis ran since [`Monitor::start`], up to a marker
    /// sent now: nothing run before this call is missed.
    pub async fn commands(mut self) -> Vec<String> {
        let marker = format!("fg-monitor-end-{}", rand::random::<u64>());
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: String = redis::cmd("ECHO")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();
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

/// Writes a Redis AOF of about `keys * value_bytes` bytes of filler into
/// `dir/appendonlydir` (a plain-command AOF, no RDB preamble: the slowest
/// to load, as an AOF grown by months of writes is). A throwaway
/// redis-server fills itself with `DEBUG POPULATE`, rewrites its AOF and
/// stops. Returns the AOF's size in bytes.
pub fn prepare_large_aof(dir: &Path, keys: u64, value_bytes: u64) -> u64 {
    let port = free_port();
    let mut proc = Proc {
        child: Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
            ])
            .arg(dir)
            .args([
                "--appendonly",
                "yes",
                "--aof-use-rdb-preamble",
                "no",
                "--enable-debug-command",
                "yes",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH"),
        name: "redis-server (AOF filler)",
    };
    assert!(
        wait_port(([127, 0, 0, 1], port).into(), Duration::from_secs(10)),
        "filler redis-server did not start"
    );
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut conn = client.get_connection().unwrap();
    let () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(keys)
        .arg("filler")
        .arg(value_bytes)
        .query(&mut conn)
        .unwrap();
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut conn).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut conn)
            .unwrap();
        let busy =
            info.contains("aof_rewrite_in_progress:1") || info.contains("aof_rewrite_scheduled:1");
        if !busy && info.contains("aof_last_bgrewrite_status:ok") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "AOF rewrite did not finish: {info}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<()>(&mut conn);
    let _ = proc.wait_exit(Duration::from_secs(30));
    aof_bytes(dir)
}

/// Size of the AOF files under `dir/appendonlydir`.
pub fn aof_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("appendonlydir"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Waits until the Redis on `port` answers `PING` (done loading); how long it took.
pub fn wait_redis_loaded(port: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    loop {
        let pong = client
            .get_connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if pong.is_ok() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "redis on {port} still not loaded: {pong:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis://127.0.0.1:PORT/`.
pub(crate) fn node_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// A blocking connection with short timeouts, so a killed node fails fast.
pub(crate) fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let conn = redis::Client::open(node_url(port))?
        .get_connection_with_timeout(Duration::from_millis(500))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}

/// One command on a fresh blocking connection to the node on `port`.
pub(crate) fn query<T: redis::FromRedisValue>(
    port: u16,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    cmd.query(&mut connect(port)?)
}
