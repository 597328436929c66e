//! A Sentinel-managed Redis of the test's own: one primary, one replica
//! (`replicaof`) and three Sentinels (quorum 2), all on 127.0.0.1, stopped
//! by PID on drop.
//!
//! A Sentinel rewrites its config file as it learns the topology, so each
//! gets its own writable copy in its own dir. `down-after-milliseconds` and
//! `failover-timeout` are short so a failover takes seconds. Queries run
//! on blocking connections inside `spawn_blocking`, like the cluster's.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::ports::free_port;
use crate::process::{blocking, wait_port, Proc, TempDir};
use crate::redis::{node_url, query, TlsFiles};

/// Sentinels that must agree a primary is down before one fails it over.
const QUORUM: usize = 2;
const SENTINELS: usize = 3;

struct Server {
    port: u16,
    /// Its TLS port, in a set started with [`RedisSentinels::start_tls`].
    tls_port: Option<u16>,
    /// `None` once the test killed it.
    proc: Option<Proc>,
}

impl Server {
    /// Whether `port` is this server's (plain or TLS).
    fn has_port(&self, port: u16) -> bool {
        self.port == port || self.tls_port == Some(port)
    }
}

/// One primary, one replica, three Sentinels watching them.
pub struct RedisSentinels {
    /// The primary the set started with, then its replica.
    servers: Vec<Server>,
    sentinels: Vec<Server>,
    master_name: String,
    /// Dropped after the processes.
    _dir: TempDir,
}

impl RedisSentinels {
    /// A set whose master is named `flashgate`.
    pub fn start() -> Self {
        Self::start_named("flashgate")
    }

    /// Starts the primary, its replica and the Sentinels; returns once the
    /// replica has synced and every Sentinel sees the replica and enough
    /// other Sentinels to authorize a failover (`SENTINEL CKQUORUM`).
    pub fn start_named(master_name: &str) -> Self {
        Self::start_with(master_name, None)
    }

    /// A set whose servers and Sentinels also serve TLS with `tls`, each on
    /// a port of its own, and reach each other over TLS
    /// (`tls-replication`): the Sentinels monitor the TLS ports and name
    /// those ([`RedisSentinels::tls_sentinels`]); the plain ports keep
    /// working for the test's own checks.
    pub fn start_tls(tls: &TlsFiles) -> Self {
        Self::start_with("flashgate", Some(tls))
    }

    fn start_with(master_name: &str, tls: Option<&TlsFiles>) -> Self {
        let dir = TempDir::new("sentinel");
        let ports = || (free_port(), tls.map(|_| free_port()));
        let (primary, primary_tls) = ports();
        let (replica, replica_tls) = ports();
        // What the others reach the primary at.
        let primary_at = primary_tls.unwrap_or(primary);
        let servers = vec![
            Server {
                port: primary,
                tls_port: primary_tls,
                proc: Some(start_server(&dir.0, (primary, primary_tls), None, tls)),
            },
            Server {
                port: replica,
                tls_port: replica_tls,
                proc: Some(start_server(
                    &dir.0,
                    (replica, replica_tls),
                    Some(primary_at),
                    tls,
                )),
            },
        ];
        for s in &servers {
            assert!(
                wait_port(([127, 0, 0, 1], s.port).into(), Duration::from_secs(10)),
                "redis-server {} did not start",
                s.port
            );
        }
        let sentinels: Vec<Server> = (0..SENTINELS)
            .map(|_| {
                let (port, tls_port) = ports();
                Server {
                    port,
                    tls_port,
                    proc: Some(start_sentinel(
                        &dir.0,
                        (port, tls_port),
                        master_name,
                        primary_at,
                        tls,
                    )),
                }
            })
            .collect();
        for s in &sentinels {
            assert!(
                wait_port(([127, 0, 0, 1], s.port).into(), Duration::from_secs(10)),
                "sentinel {} did not start",
                s.port
            );
        }
        let set = Self {
            servers,
            sentinels,
            master_name: master_name.to_owned(),
            _dir: dir,
        };
        set.wait_ready(replica, Duration::from_secs(30));
        set
    }

    fn wait_ready(&self, replica: u16, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ready = (|| -> RedisResult<bool> {
                let info: String = query(replica, redis::cmd("INFO").arg("replication"))?;
                if !info.contains("master_link_status:up") {
                    return Ok(false);
                }
                for s in &self.sentinels {
                    let _: String = query(
                        s.port,
                        redis::cmd("SENTINEL")
                            .arg("CKQUORUM")
                            .arg(&self.master_name),
                    )?;
                    let replicas: Vec<redis::Value> = query(
                        s.port,
                        redis::cmd("SENTINEL")
                            .arg("REPLICAS")
                            .arg(&self.master_name),
                    )?;
                    let peers: Vec<redis::Value> = query(
                        s.port,
                        redis::cmd("SENTINEL")
                            .arg("SENTINELS")
                            .arg(&self.master_name),
                    )?;
                    if replicas.is_empty() || peers.len() != SENTINELS - 1 {
                        return Ok(false);
                    }
                }
                Ok(true)
            })();
            if let Ok(true) = ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not settle in {limit:?}: {ready:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The name the Sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// URLs of the running Sentinels.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter(|s| s.proc.is_some())
            .map(|s| node_url(s.port))
            .collect()
    }

    /// `rediss://` URLs of the running Sentinels, in a set started with
    /// [`RedisSentinels::start_tls`].
    pub fn tls_sentinels(&self) -> Vec<String> {
        let tls_url = |port| format!("rediss://127.0.0.1:{port}/");
        self.sentinels
            .iter()
            .filter(|s| s.proc.is_some())
            .filter_map(|s| s.tls_port)
            .map(tls_url)
            .collect()
    }

    /// Ports of the running data servers (primary or replica, whichever is which now).
    pub fn servers(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|s| s.proc.is_some())
            .map(|s| s.port)
            .collect()
    }

    /// A client of the redis crate that asks the Sentinels for the master.
    pub fn client(&self) -> redis::sentinel::SentinelClient {
        redis::sentinel::SentinelClient::build(
            self.sentinels(),
            self.master_name.clone(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .unwrap()
    }

    /// The master's address as the first Sentinel that answers reports it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub async fn master_addr(&self) -> SocketAddr {
        let (ports, name) = (self.sentinel_ports(), self.master_name.clone());
        blocking(move || {
            let mut last = None;
            for port in ports {
                match master_addr_from(port, &name) {
                    Ok(addr) => return addr,
                    Err(e) => last = Some(e),
                }
            }
            panic!("no sentinel knows {name}: {last:?}");
        })
        .await
    }

    /// Port of a running data server the Sentinels do not report as
    /// master (the replica).
    pub async fn replica(&self) -> u16 {
        let master = self.master_addr().await.port();
        let replica = self
            .servers
            .iter()
            .find(|s| s.proc.is_some() && !s.has_port(master));
        replica
            .map(|s| s.port)
            .unwrap_or_else(|| panic!("no running replica of {master}"))
    }

    /// Sends a signal by name to the running data server on `port`: `STOP`
    /// freezes it (a replica stops taking the primary's writes), `CONT`
    /// resumes it.
    pub fn signal(&self, port: u16, sig: &str) {
        let server = self
            .servers
            .iter()
            .find(|s| s.has_port(port))
            .unwrap_or_else(|| panic!("no server on {port}"));
        server
            .proc
            .as_ref()
            .unwrap_or_else(|| panic!("server {port} was killed"))
            .signal(sig);
    }

    /// Kills (SIGKILL) the server the Sentinels report as master; returns its port.
    pub async fn kill_primary(&mut self) -> u16 {
        let port = self.master_addr().await.port();
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.has_port(port))
            .unwrap_or_else(|| panic!("the master {port} is not ours"));
        let mut proc = server
            .proc
            .take()
            .unwrap_or_else(|| panic!("the master {port} is already dead"));
        let _ = proc.child.kill();
        let _ = proc.child.wait();
        port
    }

    /// Waits until every running Sentinel reports a running server as
    /// master and that server's `ROLE` says master; returns its address.
    pub async fn wait_failover(&self, limit: Duration) -> SocketAddr {
        // Where the Sentinels name each running server (its TLS port in a
        // TLS set), and its plain port for the check of its role.
        let live: Vec<(u16, u16)> = self
            .servers
            .iter()
            .filter(|s| s.proc.is_some())
            .map(|s| (s.tls_port.unwrap_or(s.port), s.port))
            .collect();
        let (ports, name) = (self.sentinel_ports(), self.master_name.clone());
        blocking(move || {
            let deadline = Instant::now() + limit;
            loop {
                let settled = (|| -> RedisResult<Option<SocketAddr>> {
                    let mut agreed = None;
                    for &port in &ports {
                        let addr = master_addr_from(port, &name)?;
                        if !live.iter().any(|(at, _)| *at == addr.port())
                            || agreed.is_some_and(|a| a != addr)
                        {
                            return Ok(None);
                        }
                        agreed = Some(addr);
                    }
                    let Some(addr) = agreed else { return Ok(None) };
                    let Some(&(_, plain)) = live.iter().find(|(at, _)| *at == addr.port()) else {
                        return Ok(None);
                    };
                    let role: Vec<redis::Value> = query(plain, &redis::cmd("ROLE"))?;
                    let is_master =
                        matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
                    Ok(is_master.then_some(addr))
                })();
                if let Ok(Some(addr)) = settled {
                    return addr;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} not failed over in {limit:?}: {settled:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
    }

    fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .filter(|s| s.proc.is_some())
            .map(|s| s.port)
            .collect()
    }
}

fn master_addr_from(sentinel: u16, name: &str) -> RedisResult<SocketAddr> {
    let (host, port): (String, u16) = query(
        sentinel,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name),
    )?;
    host.parse()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| (redis::ErrorKind::Parse, "master host is not an IP", host).into())
}

/// A data server on `port` (and TLS port), a replica of `replica_of`.
fn start_server(
    dir: &Path,
    (port, tls_port): (u16, Option<u16>),
    replica_of: Option<u16>,
    tls: Option<&TlsFiles>,
) -> Proc {
    let dir = dir.join(port.to_string());
    std::fs::create_dir_all(&dir).unwrap();
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
    .arg(&dir)
    // Replicas sync at once, not after the default 5 s diskless delay.
    .args(["--logfile", "redis.log", "--repl-diskless-sync-delay", "0"])
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(primary) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
    }
    if let (Some(files), Some(tls_port)) = (tls, tls_port) {
        cmd.args(files.args(tls_port))
            .args(["--tls-replication", "yes"]);
    }
    Proc {
        child: cmd.spawn().expect("redis-server on PATH"),
        name: "redis-server (sentinel-managed)",
    }
}

fn start_sentinel(
    dir: &Path,
    (port, tls_port): (u16, Option<u16>),
    master_name: &str,
    primary: u16,
    tls: Option<&TlsFiles>,
) -> Proc {
    let dir = dir.join(format!("sentinel-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("sentinel.conf");
    // TLS for clients, and towards the servers (`tls-replication`).
    let tls = match (tls, tls_port) {
        (Some(f), Some(tls_port)) => format!(
            "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
            f.cert_file.display(),
            f.key_file.display(),
            f.ca_file.display()
        ),
        _ => String::new(),
    };
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile sentinel.log\n{tls}\
             sentinel monitor {master_name} 127.0.0.1 {primary} {QUORUM}\n\
             sentinel down-after-milliseconds {master_name} 1000\n\
             sentinel failover-timeout {master_name} 3000\n\
             sentinel parallel-syncs {master_name} 1\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Proc {
        child: cmd.spawn().expect("redis-server on PATH"),
        name: "redis-sentinel",
    }
}
