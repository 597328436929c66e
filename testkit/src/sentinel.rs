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
use crate::redis::{node_url, query};

/// Sentinels that must agree a primary is down before one fails it over.
const QUORUM: usize = 2;
const SENTINELS: usize = 3;

struct Server {
    port: u16,
    /// `None` once the test killed it.
    proc: Option<Proc>,
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
        let dir = TempDir::new("sentinel");
        let primary = free_port();
        let replica = free_port();
        let servers = vec![
            Server { port: primary, proc: Some(start_server(&dir.0, primary, None)) },
            Server { port: replica, proc: Some(start_server(&dir.0, replica, Some(primary))) },
        ];
        for s in &servers {
            assert!(wait_port(([127, 0, 0, 1], s.port).into(), Duration::from_secs(10)), "redis-server {} did not start", s.port);
        }
        let sentinels: Vec<Server> = (0..SENTINELS)
            .map(|_| {
                let port = free_port();
                Server { port, proc: Some(start_sentinel(&dir.0, port, master_name, primary)) }
            })
            .collect();
        for s in &sentinels {
            assert!(wait_port(([127, 0, 0, 1], s.port).into(), Duration::from_secs(10)), "sentinel {} did not start", s.port);
        }
        let set = Self { servers, sentinels, master_name: master_name.to_owned(), _dir: dir };
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
                    let _: String = query(s.port, redis::cmd("SENTINEL").arg("CKQUORUM").arg(&self.master_name))?;
                    let replicas: Vec<redis::Value> = query(s.port, redis::cmd("SENTINEL").arg("REPLICAS").arg(&self.master_name))?;
                    let peers: Vec<redis::Value> = query(s.port, redis::cmd("SENTINEL").arg("SENTINELS").arg(&self.master_name))?;
                    if replicas.is_empty() || peers.len() != SENTINELS - 1 {
                        return Ok(false);
                    }
                }
                Ok(true)
            })();
            if let Ok(true) = ready {
                return;
            }
            assert!(Instant::now() < deadline, "the sentinels did not settle in {limit:?}: {ready:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The name the Sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// URLs of the running Sentinels.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinels.iter().filter(|s| s.proc.is_some()).map(|s| node_url(s.port)).collect()
    }

    /// Ports of the running data servers (primary or replica, whichever is which now).
    pub fn servers(&self) -> Vec<u16> {
        self.servers.iter().filter(|s| s.proc.is_some()).map(|s| s.port).collect()
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
        self.servers().into_iter().find(|&p| p != master).unwrap_or_else(|| panic!("no running replica of {master}"))
    }

    /// Sends a signal by name to the running data server on `port`: `STOP`
    /// freezes it (a replica stops taking the primary's writes), `CONT`
    /// resumes it.
    pub fn signal(&self, port: u16, sig: &str) {
        let server = self.servers.iter().find(|s| s.port == port).unwrap_or_else(|| panic!("no server on {port}"));
        server.proc.as_ref().unwrap_or_else(|| panic!("server {port} was killed")).signal(sig);
    }

    /// Kills (SIGKILL) the server the Sentinels report as master; returns its port.
    pub async fn kill_primary(&mut self) -> u16 {
        let port = self.master_addr().await.port();
        let server = self.servers.iter_mut().find(|s| s.port == port).unwrap_or_else(|| panic!("the master {port} is not ours"));
        let mut proc = server.proc.take().unwrap_or_else(|| panic!("the master {port} is already dead"));
        let _ = proc.child.kill();
        let _ = proc.child.wait();
        port
    }

    /// Waits until every running Sentinel reports a running server as
    /// master and that server's `ROLE` says master; returns its address.
    pub async fn wait_failover(&self, limit: Duration) -> SocketAddr {
        let (ports, name, live) = (self.sentinel_ports(), self.master_name.clone(), self.servers());
        blocking(move || {
            let deadline = Instant::now() + limit;
            loop {
                let settled = (|| -> RedisResult<Option<SocketAddr>> {
                    let mut agreed = None;
                    for &port in &ports {
                        let addr = master_addr_from(port, &name)?;
                        if !live.contains(&addr.port()) || agreed.is_some_and(|a| a != addr) {
                            return Ok(None);
                        }
                        agreed = Some(addr);
                    }
                    let Some(addr) = agreed else { return Ok(None) };
                    let role: Vec<redis::Value> = query(addr.port(), &redis::cmd("ROLE"))?;
                    let is_master = matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
                    Ok(is_master.then_some(addr))
                })();
                if let Ok(Some(addr)) = settled {
                    return addr;
                }
                assert!(Instant::now() < deadline, "{name} not failed over in {limit:?}: {settled:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
    }

    fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().filter(|s| s.proc.is_some()).map(|s| s.port).collect()
    }
}

fn master_addr_from(sentinel: u16, name: &str) -> RedisResult<SocketAddr> {
    let (host, port): (String, u16) = query(sentinel, redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(name))?;
    host.parse().map(|ip| SocketAddr::new(ip, port)).map_err(|_| (redis::ErrorKind::Parse, "master host is not an IP", host).into())
}

fn start_server(dir: &Path, port: u16, replica_of: Option<u16>) -> Proc {
    let dir = dir.join(port.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        // Replicas sync at once, not after the default 5 s diskless delay.
        .args(["--logfile", "redis.log", "--repl-diskless-sync-delay", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(primary) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
    }
    Proc { child: cmd.spawn().expect("redis-server on PATH"), name: "redis-server (sentinel-managed)" }
}

fn start_sentinel(dir: &Path, port: u16, master_name: &str, primary: u16) -> Proc {
    let dir = dir.join(format!("sentinel-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile sentinel.log\n\
             sentinel monitor {master_name} 127.0.0.1 {primary} {QUORUM}\n\
             sentinel down-after-milliseconds {master_name} 1000\n\
             sentinel failover-timeout {master_name} 3000\n\
             sentinel parallel-syncs {master_name} 1\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new("redis-server");
    cmd.arg(&conf).arg("--sentinel").stdout(Stdio::null()).stderr(Stdio::null());
    Proc { child: cmd.spawn().expect("redis-server on PATH"), name: "redis-sentinel" }
}
