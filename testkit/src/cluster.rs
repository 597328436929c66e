//! A local Redis Cluster of the test's own, and what tests do to one: find
//! the master of a key, kill it and wait for its replica to take over, move
//! a slot to another master while clients use it.
//!
//! Every node is a `redis-server --cluster-enabled yes` on 127.0.0.1 with
//! its own dir; `redis-cli --cluster create` assigns the slots and the
//! replicas. Nodes are stopped by PID (SIGKILL) on drop. The topology is
//! always read from the nodes themselves (`CLUSTER NODES`), never assumed
//! from the start order: `redis-cli` chooses which node is a master.
//!
//! Queries run on blocking connections inside `spawn_blocking`, so the
//! async methods can be awaited next to a running load without stalling
//! the test's runtime.

use std::ops::RangeInclusive;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::ports::free_port_with_bus;
use crate::process::{blocking, wait_port, Proc, TempDir};
use crate::redis::{connect, node_url, query};

/// Shape and timing of a [`RedisCluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub masters: usize,
    pub replicas_per_master: usize,
    /// `cluster-node-timeout`: how long a node may be unreachable before it
    /// is failed over. Short, so failover tests take seconds.
    pub node_timeout: Duration,
    /// AOF with `appendfsync always` on every node (for restart tests).
    pub appendonly: bool,
    /// Every node also serves TLS with these files, on a port of its own
    /// ([`RedisCluster::tls_nodes`]), and the nodes talk to each other over
    /// TLS (`tls-cluster`, `tls-replication`). Redis answers `CLUSTER
    /// SLOTS` with the ports of the connection's kind, so the plain ports
    /// keep working for the test's own checks.
    pub tls: Option<crate::redis::TlsFiles>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            masters: 3,
            replicas_per_master: 1,
            node_timeout: Duration::from_millis(1000),
            appendonly: false,
            tls: None,
        }
    }
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    /// `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`, ...
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Slots this node serves (only masters have any); slots being
    /// imported or migrated (`[slot-<-id]`) are not listed.
    pub slots: Vec<RangeInclusive<u16>>,
}

impl NodeInfo {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    /// Flagged `fail` or `fail?` by the node that answered.
    pub fn is_failing(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }

    /// Parses one line of `CLUSTER NODES`:
    /// `<id> <ip:port@cport[,hostname]> <flags> <master|-> <ping> <pong> <epoch> <link> <slot>...`
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        let addr = fields[1].split(['@', ',']).next()?;
        let port = addr.rsplit_once(':')?.1.parse().ok()?;
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
                None => s.parse().ok().map(|n| n..=n),
            })
            .collect();
        Some(Self {
            id: fields[0].to_owned(),
            port,
            flags: fields[2].split(',').map(str::to_owned).collect(),
            master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
            slots,
        })
    }
}

struct Node {
    port: u16,
    /// Its TLS port, in a cluster started with [`ClusterOptions::tls`].
    tls_port: Option<u16>,
    /// `None` once the test killed it.
    proc: Option<Proc>,
}

/// A Redis Cluster of the test's own on 127.0.0.1.
pub struct RedisCluster {
    nodes: Vec<Node>,
    pub options: ClusterOptions,
    /// Dropped after `nodes`: the processes stop before their files go.
    _dir: TempDir,
}

impl RedisCluster {
    /// 3 masters with 1 replica each.
    pub fn start() -> Self {
        Self::start_with(ClusterOptions::default())
    }

    /// Starts the nodes, creates the cluster and returns once every node
    /// reports `cluster_state:ok`, knows every other node, and every replica
    /// has synced with its master.
    pub fn start_with(options: ClusterOptions) -> Self {
        assert!(
            options.masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let dir = TempDir::new("cluster");
        let count = options.masters * (1 + options.replicas_per_master);
        let nodes: Vec<Node> = (0..count)
            .map(|_| {
                let port = free_port_with_bus();
                let tls_port = options.tls.as_ref().map(|_| crate::ports::free_port());
                let node_dir = dir.0.join(port.to_string());
                std::fs::create_dir_all(&node_dir).unwrap();
                Node {
                    port,
                    tls_port,
                    proc: Some(start_node(&node_dir, port, tls_port, &options)),
                }
            })
            .collect();
        for node in &nodes {
            assert!(
                wait_port(([127, 0, 0, 1], node.port).into(), Duration::from_secs(10)),
                "cluster node {} did not start",
                node.port
            );
        }
        // Bounded: redis-cli waits for good for nodes that cannot meet
        // (a cluster bus whose TLS handshake fails, say).
        let out_file = dir.0.join("create.out");
        let mut create = Proc {
            child: Command::new("redis-cli")
                .arg("--cluster")
                .arg("create")
                .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
                .args([
                    "--cluster-replicas",
                    &options.replicas_per_master.to_string(),
                    "--cluster-yes",
                ])
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&out_file).unwrap())
                .spawn()
                .expect("redis-cli on PATH"),
            name: "redis-cli --cluster create",
        };
        let status = create.wait_exit(Duration::from_secs(60));
        let out = std::fs::read_to_string(&out_file).unwrap_or_default();
        assert!(
            status.is_some_and(|s| s.success()),
            "redis-cli --cluster create failed or hung: {out}"
        );
        let cluster = Self {
            nodes,
            options,
            _dir: dir,
        };
        cluster.wait_formed(Duration::from_secs(30));
        cluster
    }

    fn wait_formed(&self, limit: Duration) {
        let ports = self.live_ports();
        let (masters, replicas) = (self.options.masters, self.options.replicas_per_master);
        let deadline = Instant::now() + limit;
        loop {
            let formed = (|| -> RedisResult<bool> {
                for &port in &ports {
                    let info: String = query(port, redis::cmd("CLUSTER").arg("INFO"))?;
                    let known = format!("cluster_known_nodes:{}", ports.len());
                    if !info.contains("cluster_state:ok")
                        || !info.contains(&known)
                        || !info.contains("cluster_slots_ok:16384")
                    {
                        return Ok(false);
                    }
                }
                let nodes = cluster_nodes(ports[0])?;
                let owners: Vec<&NodeInfo> = nodes
                    .iter()
                    .filter(|n| n.is_master() && !n.slots.is_empty())
                    .collect();
                let full = owners.len() == masters
                    && owners.iter().all(|m| {
                        nodes
                            .iter()
                            .filter(|n| n.master_id.as_ref() == Some(&m.id))
                            .count()
                            == replicas
                    });
                if !full {
                    return Ok(false);
                }
                for replica in nodes.iter().filter(|n| n.master_id.is_some()) {
                    let info: String = query(replica.port, redis::cmd("INFO").arg("replication"))?;
                    if !info.contains("master_link_status:up") {
                        return Ok(false);
                    }
                }
                Ok(true)
            })();
            if let Ok(true) = formed {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not form in {limit:?}: {formed:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.proc.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Seed URLs of every running node, for `redis::cluster::ClusterClient`.
    pub fn nodes(&self) -> Vec<String> {
        self.live_ports().into_iter().map(node_url).collect()
    }

    /// `rediss://` seed URLs of every running node, in a cluster started
    /// with [`ClusterOptions::tls`].
    pub fn tls_nodes(&self) -> Vec<String> {
        let tls_url = |port| format!("rediss://127.0.0.1:{port}/");
        self.nodes
            .iter()
            .filter(|n| n.proc.is_some())
            .filter_map(|n| n.tls_port)
            .map(tls_url)
            .collect()
    }

    /// A cluster client seeded with every running node.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.nodes()).unwrap()
    }

    /// An async cluster connection (slot routing, `MOVED`/`ASK` handled by
    /// the redis crate).
    pub async fn conn(&self) -> redis::cluster_async::ClusterConnection {
        self.client().get_async_connection().await.unwrap()
    }

    /// The nodes as a running node sees them.
    pub async fn topology(&self) -> Vec<NodeInfo> {
        let ports = self.live_ports();
        blocking(move || topology(&ports)).await
    }

    /// Ports of the masters serving slots, as a running node sees them.
    pub async fn masters(&self) -> Vec<u16> {
        self.topology()
            .await
            .into_iter()
            .filter(|n| n.is_master() && !n.slots.is_empty())
            .map(|n| n.port)
            .collect()
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, so hash tags count as Redis
    /// counts them).
    pub async fn slot_of(&self, key: &str) -> u16 {
        let (port, key) = (self.live_ports()[0], key.to_owned());
        blocking(move || query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).unwrap()).await
    }

    /// Port of the master serving `slot`.
    pub async fn master_for_slot(&self, slot: u16) -> u16 {
        let nodes = self.topology().await;
        owner(&nodes, slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {nodes:?}"))
            .port
    }

    /// Port of the master serving `key`'s slot.
    pub async fn master_for_key(&self, key: &str) -> u16 {
        self.master_for_slot(self.slot_of(key).await).await
    }

    /// Kills (SIGKILL) the master serving `key`; returns its port. Its
    /// replica is promoted after `node_timeout`: see [`Self::wait_failover`].
    pub async fn kill_master_for_key(&mut self, key: &str) -> u16 {
        let port = self.master_for_key(key).await;
        self.kill(port);
        port
    }

    /// Port of the (first) replica of the master on `master`.
    pub async fn replica_of(&self, master: u16) -> u16 {
        let nodes = self.topology().await;
        let id = &nodes
            .iter()
            .find(|n| n.port == master)
            .unwrap_or_else(|| panic!("no node on {master}"))
            .id;
        nodes
            .iter()
            .find(|n| n.master_id.as_ref() == Some(id))
            .unwrap_or_else(|| panic!("master {master} has no replica: {nodes:?}"))
            .port
    }

    /// Sends a signal by name to the running node on `port`: `STOP` freezes
    /// it (a replica stops taking its master's writes), `CONT` resumes it.
    pub fn signal(&self, port: u16, sig: &str) {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        node.proc
            .as_ref()
            .unwrap_or_else(|| panic!("node {port} was killed"))
            .signal(sig);
    }

    /// The process id of the running node on `port` (`None` once killed),
    /// for measuring its CPU.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.proc.as_ref())
            .map(Proc::pid)
    }

    /// Kills (SIGKILL) the node on `port` and reaps it.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        let mut proc = node
            .proc
            .take()
            .unwrap_or_else(|| panic!("node {port} already killed"));
        let _ = proc.child.kill();
        let _ = proc.child.wait();
    }

    /// Waits until a running node serves `key`'s slot as master in the view
    /// of every running node, and every running node reports
    /// `cluster_state:ok`; returns the new master's port.
    pub async fn wait_failover(&self, key: &str, limit: Duration) -> u16 {
        let slot = self.slot_of(key).await;
        let ports = self.live_ports();
        blocking(move || {
            let deadline = Instant::now() + limit;
            loop {
                let settled = (|| -> RedisResult<Option<u16>> {
                    let mut agreed = None;
                    for &port in &ports {
                        let info: String = query(port, redis::cmd("CLUSTER").arg("INFO"))?;
                        let nodes = cluster_nodes(port)?;
                        let Some(master) = owner(&nodes, slot)
                            .filter(|m| ports.contains(&m.port) && !m.is_failing())
                        else {
                            return Ok(None);
                        };
                        if !info.contains("cluster_state:ok")
                            || agreed.is_some_and(|p| p != master.port)
                        {
                            return Ok(None);
                        }
                        agreed = Some(master.port);
                    }
                    Ok(agreed)
                })();
                if let Ok(Some(port)) = settled {
                    return port;
                }
                assert!(
                    Instant::now() < deadline,
                    "slot {slot} not failed over in {limit:?}: {settled:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
    }

    /// Waits until every running replica has received everything its master
    /// wrote (`INFO replication` offsets equal), so a kill loses nothing.
    pub async fn wait_replicas_caught_up(&self, limit: Duration) {
        let ports = self.live_ports();
        blocking(move || {
            let deadline = Instant::now() + limit;
            let offset = |info: &str, field: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            loop {
                let behind = (|| -> RedisResult<Vec<u16>> {
                    let nodes = topology(&ports);
                    let mut behind = Vec::new();
                    for replica in nodes
                        .iter()
                        .filter(|n| n.master_id.is_some() && ports.contains(&n.port))
                    {
                        let Some(master) = nodes
                            .iter()
                            .find(|m| Some(&m.id) == replica.master_id.as_ref())
                        else {
                            continue;
                        };
                        if !ports.contains(&master.port) {
                            continue;
                        }
                        let m: String = query(master.port, redis::cmd("INFO").arg("replication"))?;
                        let r: String = query(replica.port, redis::cmd("INFO").arg("replication"))?;
                        let wrote = offset(&m, "master_repl_offset:");
                        if wrote.is_none() || wrote != offset(&r, "slave_repl_offset:") {
                            behind.push(replica.port);
                        }
                    }
                    Ok(behind)
                })();
                if behind.as_ref().is_ok_and(Vec::is_empty) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "replicas did not catch up in {limit:?}: {behind:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
    }

    /// Moves `slot` with its keys to the master on `to`, live: see
    /// [`SlotMigration`] to stop halfway.
    pub async fn migrate_slot(&self, slot: u16, to: u16) {
        let migration = self.begin_migration(slot, to).await;
        migration.finish().await;
    }

    /// Marks `slot` as migrating from its master to the master on `to`
    /// (`CLUSTER SETSLOT ... IMPORTING` on the target, `MIGRATING` on the
    /// source). Until [`SlotMigration::finish`], the source answers `ASK`
    /// for the slot's keys it no longer has.
    pub async fn begin_migration(&self, slot: u16, to: u16) -> SlotMigration {
        let ports = self.live_ports();
        blocking(move || {
            let nodes = topology(&ports);
            let source = owner(&nodes, slot)
                .unwrap_or_else(|| panic!("no master serves slot {slot}"))
                .clone();
            let target = nodes
                .iter()
                .find(|n| n.port == to && n.is_master())
                .unwrap_or_else(|| panic!("{to} is not a master"))
                .clone();
            assert_ne!(source.port, target.port, "slot {slot} is already on {to}");
            let others = nodes
                .iter()
                .filter(|n| {
                    n.is_master()
                        && !n.is_failing()
                        && ports.contains(&n.port)
                        && n.port != source.port
                        && n.port != target.port
                })
                .map(|n| n.port)
                .collect();
            let setslot = |port: u16, state: &str, id: &str| {
                let () = query(
                    port,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg(state)
                        .arg(id),
                )
                .unwrap();
            };
            setslot(target.port, "IMPORTING", &source.id);
            setslot(source.port, "MIGRATING", &target.id);
            SlotMigration {
                slot,
                source: source.port,
                target: target.port,
                target_id: target.id,
                others,
            }
        })
        .await
    }

    /// `n` sale ids whose hash tags `{sale:ID}` (the tag of every key of a
    /// sale, see `common/src/keys.rs`) land on `n` different masters.
    pub async fn tags_on_distinct_masters(&self, n: usize) -> Vec<String> {
        let ports = self.live_ports();
        blocking(move || {
            let nodes = topology(&ports);
            let mut conn = connect(ports[0]).unwrap();
            let (mut ids, mut used) = (Vec::new(), Vec::new());
            for id in 1..10_000u32 {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(format!("{{sale:{id}}}"))
                    .query(&mut conn)
                    .unwrap();
                let master = owner(&nodes, slot).unwrap().port;
                if !used.contains(&master) {
                    used.push(master);
                    ids.push(id.to_string());
                    if ids.len() == n {
                        return ids;
                    }
                }
            }
            panic!("fewer than {n} masters serve slots: {nodes:?}");
        })
        .await
    }
}

/// A slot on its way from one master to another, keys moved in batches
/// (`MIGRATE`), as `redis-cli --cluster reshard` does it.
#[derive(Debug)]
pub struct SlotMigration {
    pub slot: u16,
    pub source: u16,
    pub target: u16,
    target_id: String,
    /// The other masters, told the new owner last.
    others: Vec<u16>,
}

impl SlotMigration {
    /// Moves up to `max_keys` of the slot's keys to the target; returns how
    /// many moved (0 once the source has none left).
    pub async fn move_keys(&self, max_keys: usize) -> usize {
        let (slot, source, target) = (self.slot, self.source, self.target);
        blocking(move || move_keys(slot, source, target, max_keys)).await
    }

    /// Moves the remaining keys and hands the slot to the target
    /// (`SETSLOT NODE` on the target, the source, then every other master):
    /// from here on the source answers `MOVED`.
    pub async fn finish(self) {
        blocking(move || {
            while move_keys(self.slot, self.source, self.target, 100) > 0 {}
            for port in [self.target, self.source].into_iter().chain(self.others) {
                let () = query(
                    port,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(self.slot)
                        .arg("NODE")
                        .arg(&self.target_id),
                )
                .unwrap();
            }
        })
        .await
    }
}

fn move_keys(slot: u16, source: u16, target: u16, max_keys: usize) -> usize {
    let keys: Vec<String> = query(
        source,
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(max_keys),
    )
    .unwrap();
    if !keys.is_empty() {
        let () = query(
            source,
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(target)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys),
        )
        .unwrap();
    }
    keys.len()
}

fn start_node(dir: &Path, port: u16, tls_port: Option<u16>, options: &ClusterOptions) -> Proc {
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
        "--logfile",
        "redis.log",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ])
    .args([
        "--cluster-node-timeout",
        &options.node_timeout.as_millis().to_string(),
    ])
    // A replica takes over however long it was cut off, and stays
    // with its master: failover tests know who replaces whom.
    .args([
        "--cluster-replica-validity-factor",
        "0",
        "--cluster-allow-replica-migration",
        "no",
    ])
    // Replicas sync at once, not after the default 5 s diskless delay.
    .args(["--repl-diskless-sync-delay", "0"])
    .args([
        "--appendonly",
        if options.appendonly { "yes" } else { "no" },
        "--appendfsync",
        "always",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let (Some(files), Some(tls_port)) = (&options.tls, tls_port) {
        // The bus stays on port + 10000 (what `free_port_with_bus` keeps
        // free); with `tls-cluster` Redis would otherwise put it beside the
        // TLS port.
        cmd.args(files.args(tls_port)).args([
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
            "--cluster-port",
            &(port + 10_000).to_string(),
        ]);
    }
    Proc {
        child: cmd.spawn().expect("redis-server on PATH"),
        name: "redis-server (cluster node)",
    }
}

fn cluster_nodes(port: u16) -> RedisResult<Vec<NodeInfo>> {
    let text: String = query(port, redis::cmd("CLUSTER").arg("NODES"))?;
    Ok(text.lines().filter_map(NodeInfo::parse).collect())
}

/// `CLUSTER NODES` from the first of `ports` that answers.
fn topology(ports: &[u16]) -> Vec<NodeInfo> {
    let mut last = None;
    for &port in ports {
        match cluster_nodes(port) {
            Ok(nodes) => return nodes,
            Err(e) => last = Some(e),
        }
    }
    panic!("no cluster node answers CLUSTER NODES: {last:?}");
}

/// The master serving `slot`.
fn owner(nodes: &[NodeInfo], slot: u16) -> Option<&NodeInfo> {
    nodes.iter().find(|n| n.is_master() && n.serves(slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes_lines() {
        let master =
            NodeInfo::parse("e7d1 127.0.0.1:20001@30001 myself,master - 0 1426238316232 2 connected 0-5460 5461 [5462->-07c3]").unwrap();
        assert_eq!(master.port, 20001);
        assert!(master.is_master() && !master.is_failing());
        assert_eq!(master.slots, vec![0..=5460, 5461..=5461]);
        assert!(master.serves(5461) && !master.serves(5462));
        let replica = NodeInfo::parse(
            "07c3 127.0.0.1:20004@30004,host slave e7d1 0 1426238317239 4 connected",
        )
        .unwrap();
        assert_eq!(
            (replica.port, replica.master_id.as_deref()),
            (20004, Some("e7d1"))
        );
        let failed = NodeInfo::parse("9a1b :0@0 master,fail - 1 2 3 disconnected").unwrap();
        assert!(failed.is_failing() && failed.slots.is_empty());
    }
}
