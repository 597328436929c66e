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
