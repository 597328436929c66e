//! The sale page in a real browser (headless Chromium, driven by
//! playwright-core from `tests/browser/sale.mjs`) against the real stack.
//! Screenshots land in `target/browser-artifacts/`.
//!
//! Also: the page over HTTPS and HTTP/2 (a certificate of the test's own
//! CA, trusted by its key hash), and the demo a newcomer gets from
//! `make run` (`tests/browser/demo.mjs`): the printed URL signs in a demo
//! shopper, whose click on Buy wins.
//!
//! Needs `/usr/bin/chromium` and node; `make test` installs both
//! (`deploy/local/install-deps.sh`) and this test runs `npm ci` in
//! `tests/browser` when playwright-core is missing.

use std::path::Path;
use std::time::Duration;

use flashgate_tests::browser::{browser_dir, run_script};
use flashgate_tests::local_run::LocalRun;
use flashgate_tests::pki::TestCa;
use flashgate_tests::{free_port, token, Stack, StackOptions, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_watches_the_countdown_buys_and_a_latecomer_sees_sold_out() {
    // The shipped configuration, limits included: the page must work on it.
    let stack = Stack::start(StackOptions::shipped()).await;
    run_sale_page(&stack, "browser-drop", false, &Https::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sale_page_works_in_chromium_over_https_and_http2() {
    // The shipped configuration with the HTTPS listener on and plain page
    // requests redirected: the page, its assets and its API calls all go
    // over HTTPS, HTTP/2 by ALPN, with a certificate of the test's own CA.
    let certs = TempDir::new("browser-tls");
    let ca = TestCa::root("Flashgate Browser Test Root");
    let leaf = ca.leaf("localhost", &["localhost"], &["127.0.0.1"]);
    let (cert, key) = (certs.0.join("cert.pem"), certs.0.join("key.pem"));
    leaf.write(&cert, &key);
    let port = free_port();
    let extra = format!(
        "[gateway.tls]\nlisten = \"127.0.0.1:{port}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\nredirect_http = true\n",
        cert.display(),
        key.display()
    );
    let stack = Stack::start(StackOptions {
        extra_toml: extra,
        ..StackOptions::shipped()
    })
    .await;
    let https = Https::On {
        base: format!("https://localhost:{port}"),
        spki: leaf.spki_sha256,
    };
    run_sale_page(&stack, "browser-https-drop", false, &https).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_proof_of_work_asked_the_page_solves_it_during_the_countdown_and_buys() {
    // The shipped configuration with `[challenge] mode = "always"` at its
    // shipped difficulty; the mode needs a restart.
    let mut stack = Stack::start(StackOptions::shipped()).await;
    stack.kill_gateway();
    stack.edit_config(|text| {
        assert_eq!(
            text.matches("mode = \"off\"").count(),
            1,
            "one [challenge] mode in the shipped file"
        );
        text.replace("mode = \"off\"", "mode = \"always\"")
    });
    stack.start_gateway();
    run_sale_page(&stack, "browser-pow-drop", true, &Https::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_stack_signs_in_a_shopper_whose_click_on_buy_wins() {
    // `make run` as a newcomer starts it, opened at the URL it prints.
    let data = TempDir::new("demo-run");
    let run = LocalRun::new(
        &data.0,
        "\n[[sales]]\nid = \"demo\"\nname = \"Flashgate demo sneaker\"\nstock = 3\nper_user_limit = 1\nduration_seconds = 3600\n",
    );
    let (guard, out) = run.start(&[]);
    // With the sign-in on, the shop's home page leads to it.
    let home = reqwest::get(format!("http://127.0.0.1:{}/", run.ports[2]))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        home.contains("/demo/sign-in?next=/flashgate/sales/demo"),
        "{home}"
    );
    // The shop's own assets under /static/ reach the shop through the
    // gateway (its own live under /flashgate/).
    let css = reqwest::get(format!(
        "http://127.0.0.1:{}/static/css/shop.css",
        run.ports[2]
    ))
    .await
    .unwrap();
    assert_eq!(css.status().as_u16(), 200);
    let css = css.text().await.unwrap();
    assert!(
        css.contains("the demo shop's own /static/css/shop.css"),
        "{css}"
    );
    let url = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("sale page").map(str::trim))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("run.sh printed no sale page URL:\n{out}"))
        .to_owned();
    let artifacts = browser_dir().join("../../target/browser-artifacts/demo");
    let stdout = run_script(
        "demo.mjs",
        &[("SALE_URL", url)],
        &artifacts,
        Duration::from_secs(120),
        String::new,
    )
    .await;
    drop(guard);
    assert!(stdout.contains("won as demo-shopper-"), "{stdout}");
}

/// Whether a sale page test goes through the HTTPS listener.
enum Https {
    Off,
    /// `base` (https://host:port) with a certificate whose public key hash
    /// (`spki`) Chromium is told to trust.
    On {
        base: String,
        spki: String,
    },
}

/// Runs `tests/browser/sale.mjs` on a one-item sale `sale` of `stack` that
/// starts in 12 s; `expect_pow`: the gateway asks a proof of work.
async fn run_sale_page(stack: &Stack, sale: &str, expect_pow: bool, https: &Https) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (base, args, protocol) = match https {
        Https::Off => (format!("http://{}", stack.gateway_addr), String::new(), ""),
        Https::On { base, spki } => (
            base.clone(),
            format!("--ignore-certificate-errors-spki-list={spki}"),
            "h2",
        ),
    };

    // One item; the start leaves time for the browser to open the page first.
    stack
        .put_sale(
            sale,
            1,
            1,
            Duration::from_secs(12),
            Duration::from_secs(3600),
        )
        .await;
    let artifacts = root.join("target/browser-artifacts").join(sale);
    run_script(
        "sale.mjs",
        &[
            ("GATEWAY_URL", base),
            ("CHROMIUM_ARGS", args),
            ("EXPECT_PROTOCOL", protocol.into()),
            ("SALE_ID", sale.into()),
            ("TOKEN_A", token("browser-buyer-a")),
            ("TOKEN_B", token("browser-buyer-b")),
            ("EXPECT_POW", if expect_pow { "1" } else { "0" }.into()),
        ],
        &artifacts,
        Duration::from_secs(180),
        String::new,
    )
    .await;

    let (orders, users, _) = stack.wait_orders(sale, 1, Duration::from_secs(10)).await;
    assert_eq!((orders, users), (1, 1), "exactly one order, for buyer A");
}

/// A waiting room's queue page in Chromium: one seat, held by a visitor
/// let in just before (a 4-second session); the page shows place 1, counts
/// down, and lets the browser into the shop by itself once the seat frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_shows_the_place_counts_down_and_lets_the_visitor_in() {
    const SHOP_TEXT: &str = "Welcome to the shop";
    let shop = flashgate_tests::test_shop::TestShop::start(|_req, _n| async {
        axum::response::Response::builder()
            .header("content-type", "text/html")
            .body(axum::body::Body::from(format!(
                "<!doctype html><title>shop</title><h1>{SHOP_TEXT}</h1>"
            )))
            .unwrap()
    })
    .await;
    let stack = Stack::start(StackOptions {
        extra_toml: format!(
            "[shop]\nupstreams = [\"{}\"]\n[[shop.waiting_rooms]]\nname = \"front\"\npaths = [\"/shop/\"]\n\
             active_users = 1\nsession_seconds = 4\nrefresh_seconds = 3\n",
            shop.addr
        ),
        ..StackOptions::default()
    })
    .await;
    let holder = stack
        .http
        .get(stack.url("/shop/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        holder.contains(SHOP_TEXT),
        "the first visitor is let in: {holder}"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    run_script(
        "room.mjs",
        &[
            ("GATEWAY_URL", format!("http://{}", stack.gateway_addr)),
            ("ROOM_PATH", "/shop/".into()),
            ("SHOP_TEXT", SHOP_TEXT.into()),
        ],
        &root.join("target/browser-artifacts/room"),
        Duration::from_secs(120),
        || stack.log("flashgate"),
    )
    .await;
}
