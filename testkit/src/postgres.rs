//! A private PostgreSQL cluster for tests that stop and start their database.

use std::path::PathBuf;
use std::process::Command;

use crate::process::{is_root, TempDir};

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
        let pg = Self {
            port,
            dir,
            bin,
            running: false,
        };
        if is_root() {
            let ok = Command::new("chown")
                .arg("-R")
                .arg("postgres")
                .arg(&pg.dir.0)
                .status()
                .unwrap();
            assert!(ok.success(), "chown of the PostgreSQL dir failed");
        }
        let out = pg
            .command("initdb")
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.dir.0.display()
        );
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-o", &options, "-l"])
            .arg(self.dir.0.join("postgres.log"))
            .args(["-w", "-t", "60", "start"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.running = true;
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`).
    pub fn stop(&mut self) {
        if std::mem::take(&mut self.running) {
            let data = self.dir.0.join("data");
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop();
    }
}
