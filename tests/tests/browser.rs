//! The sale page in a real browser (headless Chromium, driven by
//! playwright-core from `tests/browser/sale.mjs`) against the real stack.
//! Screenshots land in `target/browser-artifacts/`.
//!
//! Needs `/usr/bin/chromium` and node; `make test` installs both
//! (`deploy/local/install-deps.sh`) and this test runs `npm ci` in
//! `tests/browser` when playwright-core is missing.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use flashgate_tests::{token, Stack, StackOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_watches_the_countdown_buys_and_a_latecomer_sees_sold_out() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("tests/browser");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(Path::new(&chromium).exists(), "{chromium} missing: run `bash deploy/local/install-deps.sh` (make test does)");
    if !dir.join("node_modules/playwright-core").exists() {
        let ok = Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&dir).status().expect("npm on PATH");
        assert!(ok.success(), "npm ci in tests/browser failed");
    }

    // The shipped configuration, limits included: the page must work on it.
    let stack = Stack::start(StackOptions::shipped()).await;
    // One item; the start leaves time for the browser to open the page first.
    stack.put_sale("browser-drop", 1, 1, Duration::from_secs(12), Duration::from_secs(3600)).await;
    let artifacts = root.join("target/browser-artifacts");
    let node = tokio::process::Command::new("node")
        .arg(dir.join("sale.mjs"))
        .env("GATEWAY_URL", format!("http://{}", stack.gateway_addr))
        .env("SALE_ID", "browser-drop")
        .env("TOKEN_A", token("browser-buyer-a"))
        .env("TOKEN_B", token("browser-buyer-b"))
        .env("ARTIFACTS", &artifacts)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), node).await.expect("browser test timed out").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "sale.mjs failed ({}), screenshots in {}:\n{stdout}\n{stderr}", out.status, artifacts.display());

    let (orders, users, _) = stack.wait_orders("browser-drop", 1, Duration::from_secs(10)).await;
    assert_eq!((orders, users), (1, 1), "exactly one order, for buyer A");
}
