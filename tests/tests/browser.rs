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
    // The shipped configuration, limits included: the page must work on it.
    let stack = Stack::start(StackOptions::shipped()).await;
    run_sale_page(&stack, "browser-drop", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_proof_of_work_asked_the_page_solves_it_during_the_countdown_and_buys() {
    // The shipped configuration with `[challenge] mode = "always"` at its
    // shipped difficulty; the mode needs a restart.
    let mut stack = Stack::start(StackOptions::shipped()).await;
    stack.kill_gateway();
    stack.edit_config(|text| {
        assert_eq!(text.matches("mode = \"off\"").count(), 1, "one [challenge] mode in the shipped file");
        text.replace("mode = \"off\"", "mode = \"always\"")
    });
    stack.start_gateway();
    run_sale_page(&stack, "browser-pow-drop", true).await;
}

/// Runs `tests/browser/sale.mjs` on a one-item sale `sale` of `stack` that
/// starts in 12 s; `expect_pow`: the gateway asks a proof of work.
async fn run_sale_page(stack: &Stack, sale: &str, expect_pow: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("tests/browser");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(Path::new(&chromium).exists(), "{chromium} missing: run `bash deploy/local/install-deps.sh` (make test does)");
    if !dir.join("node_modules/playwright-core").exists() {
        let ok = Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&dir).status().expect("npm on PATH");
        assert!(ok.success(), "npm ci in tests/browser failed");
    }

    // One item; the start leaves time for the browser to open the page first.
    stack.put_sale(sale, 1, 1, Duration::from_secs(12), Duration::from_secs(3600)).await;
    let artifacts = root.join("target/browser-artifacts").join(sale);
    let node = tokio::process::Command::new("node")
        .arg(dir.join("sale.mjs"))
        .env("GATEWAY_URL", format!("http://{}", stack.gateway_addr))
        .env("SALE_ID", sale)
        .env("TOKEN_A", token("browser-buyer-a"))
        .env("TOKEN_B", token("browser-buyer-b"))
        .env("ARTIFACTS", &artifacts)
        .env("CHROMIUM", &chromium)
        .env("EXPECT_POW", if expect_pow { "1" } else { "0" })
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), node).await.expect("browser test timed out").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "sale.mjs failed ({}), screenshots in {}:\n{stdout}\n{stderr}", out.status, artifacts.display());

    let (orders, users, _) = stack.wait_orders(sale, 1, Duration::from_secs(10)).await;
    assert_eq!((orders, users), (1, 1), "exactly one order, for buyer A");
}
