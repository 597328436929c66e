//! Processes the bench starts, and the CPU accounting of a run.
//!
//! Every process is held as a [`Proc`] and stopped by its PID when dropped
//! (SIGTERM, then SIGKILL after 5 s); nothing is ever stopped by name.
//! CPU time comes from `/proc/PID/stat` (utime + stime, all threads), the
//! machine's busy time from `/proc/stat`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A process of ours: a child, or a daemon known by its pidfile (nginx).
pub struct Proc {
    pub name: String,
    pub pid: u32,
    child: Option<Child>,
}

impl Proc {
    pub fn child(name: &str, child: Child) -> Self {
        Self {
            name: name.to_owned(),
            pid: child.id(),
            child: Some(child),
        }
    }

    /// A daemon that wrote its PID into `pidfile`; waits up to 5 s for it.
    pub fn from_pidfile(name: &str, pidfile: &Path) -> anyhow::Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return Ok(Self {
                    name: name.to_owned(),
                    pid,
                    child: None,
                });
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name}: no pid in {}",
                pidfile.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => Path::new(&format!("/proc/{}", self.pid)).exists(),
        }
    }

    /// SIGTERM, wait up to 5 s, then SIGKILL; reaps a child.
    pub fn stop(&mut self) {
        if !self.alive() {
            return;
        }
        signal(self.pid, "TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.alive() {
            eprintln!(
                "bench: {} (pid {}) ignored SIGTERM; sending SIGKILL",
                self.name, self.pid
            );
            signal(self.pid, "KILL");
        }
        if let Some(c) = &mut self.child {
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status();
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits until `addr` accepts connections.
pub async fn wait_port(addr: SocketAddr, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// Clock ticks per second of `/proc` times.
pub fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// utime + stime of a process in ticks (0 when it is gone).
pub fn pid_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// PIDs whose parent is `ppid` (nginx workers of a master).
pub fn children_of(ppid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if parent == Some(ppid) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// Busy and total ticks of the whole machine (all cores), from `/proc/stat`.
pub fn machine_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let g = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = g(0) + g(1) + g(2) + g(5) + g(6);
    (busy, busy + g(3) + g(4) + g(7))
}

/// The first three fields of `/proc/loadavg`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The watched group of the order database's server processes.
pub const DATABASE: &str = "database";

/// A named group of PIDs whose CPU is summed.
#[derive(Clone, Debug)]
pub struct Watched {
    pub name: String,
    pub pids: Vec<u32>,
    /// Also every process of this command name alive at each reading (a
    /// database server forks a process per connection and helpers of its
    /// own, so its PIDs are not known up front).
    pub comm: Option<&'static str>,
}

impl Watched {
    pub fn pids(name: &str, pids: Vec<u32>) -> Self {
        Self {
            name: name.to_owned(),
            pids,
            comm: None,
        }
    }

    /// Every process named `comm` (e.g. `postgres`: the server and its
    /// per-connection backends).
    pub fn command(name: &str, comm: &'static str) -> Self {
        Self {
            name: name.to_owned(),
            pids: Vec::new(),
            comm: Some(comm),
        }
    }

    /// Ticks per PID of the group now.
    fn read(&self) -> Vec<(u32, u64)> {
        let mut pids = self.pids.clone();
        if let Some(comm) = self.comm {
            pids.extend(processes_named(comm));
        }
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter().map(|p| (p, pid_ticks(p))).collect()
    }
}

/// PIDs of the processes whose command name (`/proc/PID/comm`) is `comm`.
pub fn processes_named(comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// CPU readings at one instant.
#[derive(Clone, Debug)]
pub struct Snap {
    pub at: Instant,
    /// Ticks per PID of each watched group, in the order watched.
    pub ticks: Vec<(String, Vec<(u32, u64)>)>,
    /// This process (the load generator).
    pub own: u64,
    pub machine: (u64, u64),
}

pub fn snap(watched: &[Watched]) -> Snap {
    Snap {
        at: Instant::now(),
        ticks: watched.iter().map(|w| (w.name.clone(), w.read())).collect(),
        own: pid_ticks(std::process::id()),
        machine: machine_ticks(),
    }
}

/// Ticks a group spent between two readings: per PID, so a process that
/// started in between counts from its start, not from a total of another
/// set of PIDs.
fn group_ticks(a: &[(u32, u64)], b: &[(u32, u64)]) -> u64 {
    b.iter()
        .map(|(pid, t)| t.saturating_sub(a.iter().find(|(p, _)| p == pid).map_or(0, |(_, t0)| *t0)))
        .sum()
}

/// CPU use between two snaps.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CpuUse {
    /// CPU seconds per watched group, then `loadgen`.
    pub secs: Vec<(String, f64)>,
    /// Machine busy, in cores (2.0 = both cores of a 2-core machine).
    pub machine_busy_cores: f64,
    /// Busy time not accounted to any process of this run, in cores:
    /// other tenants' builds and tests.
    pub other_cores: f64,
}

impl CpuUse {
    pub fn between(a: &Snap, b: &Snap) -> Self {
        let tck = clk_tck();
        let mut secs: Vec<(String, f64)> = a
            .ticks
            .iter()
            .zip(&b.ticks)
            .map(|((n, x), (_, y))| (n.clone(), group_ticks(x, y) as f64 / tck))
            .collect();
        secs.push(("loadgen".into(), b.own.saturating_sub(a.own) as f64 / tck));
        let wall = b.at.duration_since(a.at).as_secs_f64().max(1e-6);
        let (busy, total) = (
            b.machine.0.saturating_sub(a.machine.0),
            b.machine.1.saturating_sub(a.machine.1).max(1),
        );
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let machine_busy_cores = ncpu * busy as f64 / total as f64;
        let ours: f64 = secs.iter().map(|(_, s)| s).sum::<f64>() / wall;
        Self {
            secs,
            machine_busy_cores,
            other_cores: (machine_busy_cores - ours).max(0.0),
        }
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.secs.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// CPU milliseconds per 1,000 requests of a group.
    pub fn ms_per_k(&self, name: &str, requests: u64) -> Option<f64> {
        (requests > 0)
            .then(|| {
                self.get(name)
                    .map(|s| s * 1000.0 * 1000.0 / requests as f64)
            })
            .flatten()
    }
}

/// A private temp dir, removed on drop unless `KEEP_WORK=1`.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn new() -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!(
            "flashgate-bench-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if std::env::var("KEEP_WORK").as_deref() == Ok("1") {
            eprintln!("bench: kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// First line of a command's output (stdout, else stderr), for versions.
pub fn version_of(cmd: &str, args: &[&str]) -> String {
    match Command::new(cmd).args(args).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        }
        Err(_) => "not found".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_ticks_are_readable() {
        let t0 = pid_ticks(std::process::id());
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(pid_ticks(std::process::id()) >= t0);
        assert_eq!(pid_ticks(u32::MAX), 0);
    }

    #[test]
    fn a_group_by_command_name_finds_processes_started_after_it_was_named() {
        let group = Watched::command("sleepers", "sleep");
        let before = group.read();
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let after = group.read();
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        assert!(!before.iter().any(|(p, _)| *p == pid));
        assert!(
            after.iter().any(|(p, _)| *p == pid),
            "the sleep started after the group was named is in it"
        );
    }

    #[test]
    fn a_group_counts_each_process_from_its_own_earlier_reading() {
        // PID 1 ran 100 ticks in the window, PID 2 started in it and ran 7,
        // PID 3 ended in it (its ticks are not known).
        let a = [(1, 1000), (3, 50)];
        let b = [(1, 1100), (2, 7)];
        assert_eq!(group_ticks(&a, &b), 107);
    }
}
