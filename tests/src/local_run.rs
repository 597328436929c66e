//! `make run` in a test: `deploy/local/run.sh` on ports and a data dir of
//! its own, with the debug binaries, stopped like Ctrl-C does.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{bin, free_port};

/// Readiness may take this long: a Redis loading a large AOF, on a busy 2-core box.
pub const READY_LIMIT: Duration = Duration::from_secs(90);

/// `deploy/local/run.sh` on its own ports and data dir, with the debug binaries.
pub struct LocalRun {
    data: PathBuf,
    config: PathBuf,
    /// Redis, shop, gateway, gateway admin, backend, backend admin.
    pub ports: [u16; 6],
}

impl LocalRun {
    /// Ports of its own; `extra` is appended to the config (sales, ...).
    pub fn new(data: &Path, extra: &str) -> Self {
        let ports = [
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        ];
        let [redis, shop, gateway, gateway_admin, backend, backend_admin] = ports;
        let static_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../static");
        let config = data.join("run.toml");
        std::fs::write(
            &config,
            format!(
                "[redis]\nurl = \"redis://127.0.0.1:{redis}/\"\n\
                 [gateway]\nlisten = \"127.0.0.1:{gateway}\"\nadmin_listen = \"127.0.0.1:{gateway_admin}\"\n\
                 shop_upstream = \"127.0.0.1:{shop}\"\nbackend_url = \"http://127.0.0.1:{backend}\"\nstatic_dir = \"{}\"\n\
                 [backend]\nlisten = \"127.0.0.1:{backend}\"\nadmin_listen = \"127.0.0.1:{backend_admin}\"\n\
                 database_url = \"sqlite://{}/flashgate.db\"\n{}",
                static_dir.display(),
                data.display(),
                extra
            ),
        )
        .unwrap();
        Self {
            data: data.to_owned(),
            config,
            ports,
        }
    }

    /// The script, on this run's ports and data dir, with `env` on top.
    pub fn command(&self, env: &[(&str, &str)]) -> Command {
        let [redis, shop, gateway, gateway_admin, backend, backend_admin] = self.ports;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/run.sh");
        let bin_dir = bin("flashgate").parent().unwrap().to_owned();
        let mut cmd = Command::new("bash");
        cmd.arg(script)
            .env("FLASHGATE_BIN_DIR", bin_dir)
            .env("FLASHGATE_CONFIG", &self.config)
            .env("FLASHGATE_DATA_DIR", &self.data)
            .env("FLASHGATE_REDIS_PORT", redis.to_string())
            .env("FLASHGATE_SHOP_ADDR", format!("127.0.0.1:{shop}"))
            .env("FLASHGATE_GATEWAY_ADDR", format!("127.0.0.1:{gateway}"))
            .env(
                "FLASHGATE_GATEWAY_ADMIN_ADDR",
                format!("127.0.0.1:{gateway_admin}"),
            )
            .env("FLASHGATE_BACKEND_ADDR", format!("127.0.0.1:{backend}"))
            .env(
                "FLASHGATE_BACKEND_ADMIN_ADDR",
                format!("127.0.0.1:{backend_admin}"),
            )
            .env("FLASHGATE_READY_TIMEOUT", READY_LIMIT.as_secs().to_string())
            .env_remove("FLASHGATE_JWT_SECRET")
            .env_remove("FLASHGATE_ADMIN_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the script until it exits (it is expected to fail); its exit
    /// status and what it wrote to stderr.
    pub fn run_to_exit(&self, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
        let out = self.command(env).stdout(Stdio::null()).output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the script until it prints its URLs; its output so far. The
    /// script and everything it started are stopped when the guard drops.
    pub fn start(&self, env: &[(&str, &str)]) -> (RunGuard, String) {
        let mut child = self.command(env).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let guard = RunGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let errors =
            std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        let mut out = String::new();
        let deadline = Instant::now() + READY_LIMIT;
        while Instant::now() < deadline {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    out.push_str(&line);
                    out.push('\n');
                    if line.contains("Ctrl-C stops everything") {
                        return (guard, out);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        drop(guard);
        panic!(
            "run.sh did not print its URLs:\n{out}\nstderr:\n{}",
            errors.join().unwrap_or_default()
        );
    }

    /// The config file the script runs with.
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The secrets the script made or took (`DATA/secrets.env`), as
    /// name and value pairs.
    pub fn secrets(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(self.data.join("secrets.env"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim_start_matches("export ").split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    pub fn admin_addr(&self) -> String {
        format!("127.0.0.1:{}", self.ports[5])
    }
}

/// Stops a `run.sh` like Ctrl-C does (SIGINT to its process group), then
/// makes sure nothing of it is left.
pub struct RunGuard(std::process::Child);

impl Drop for RunGuard {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-INT", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && self.0.try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.wait();
    }
}
