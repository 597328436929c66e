//! Headless Chromium for the browser tests: the scripts in `tests/browser`
//! (playwright-core, installed there by `npm ci` when missing) and Debian's
//! chromium (`deploy/local/install-deps.sh --test`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/browser`, with playwright-core installed.
///
/// # Panics
/// When npm is missing or `npm ci` fails.
pub fn browser_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    if !dir.join("node_modules/playwright-core").exists() {
        let ok = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .expect("npm on PATH");
        assert!(ok.success(), "npm ci in tests/browser failed");
    }
    dir
}

/// The Chromium binary: `$CHROMIUM` or `/usr/bin/chromium`.
///
/// # Panics
/// When it is not there.
pub fn chromium() -> String {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} missing: run `bash deploy/local/install-deps.sh` (make test does)"
    );
    chromium
}

/// Runs `tests/browser/{script}` under node with `env`, `CHROMIUM` and
/// `ARTIFACTS` (where it leaves its screenshots) for at most `limit`, and
/// returns what it printed.
///
/// # Panics
/// When it fails or runs past `limit`: with its output and `context()`
/// (a server's log, say).
pub async fn run_script(
    script: &str,
    env: &[(&str, String)],
    artifacts: &Path,
    limit: std::time::Duration,
    context: impl FnOnce() -> String,
) -> String {
    let node = tokio::process::Command::new("node")
        .arg(browser_dir().join(script))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("ARTIFACTS", artifacts)
        .env("CHROMIUM", chromium())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, node)
        .await
        .unwrap_or_else(|_| panic!("{script} timed out"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} failed ({}), screenshots in {}:\n{stdout}\n{}\n{}",
        out.status,
        artifacts.display(),
        String::from_utf8_lossy(&out.stderr),
        context()
    );
    stdout
}
