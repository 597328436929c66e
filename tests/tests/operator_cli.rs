//! The operator CLI (`flashgate sale|cache|events`), the real binary
//! against a real stack: what each command prints, `--json`, and errors
//! that name what failed.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashgate_tests::local_run::LocalRun;
use flashgate_tests::{bin, free_port, Stack, StackOptions, TempDir, ADMIN_TOKEN};
use serde_json::Value;

/// A token of the right length that no server takes.
const WRONG_TOKEN: &str = "wrong-admin-token-0000000000000000000000";

/// `flashgate --config CONFIG ARGS` with `token` as FLASHGATE_ADMIN_TOKEN.
fn flashgate(config: &Path, token: &str, args: &[&str]) -> Output {
    Command::new(bin("flashgate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("FLASHGATE_ADMIN_TOKEN", token)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Its stdout; asserts it succeeded.
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its stderr; asserts it failed.
fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The value of `key:` in a `sale show` listing.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(str::trim)
}

/// Buys of `sale` by new users until one answers `status` (the pause
/// switch reaches the gateway through Redis), or 10 s pass.
async fn buys_answer(stack: &Stack, sale: &str, status: u16) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = stack.buy(sale, &flashgate_tests::random_user(), None).await;
        if got.0 == status || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sale_commands_put_list_show_pause_resume_and_reconcile_through_the_admin_api() {
    let stack = Stack::start(StackOptions::default()).await;
    let config = stack.config_path.clone();
    let run = |args: &[&str]| flashgate(&config, ADMIN_TOKEN, args);

    // Created from TOML with the keys of a `[[sales]]` entry.
    let toml = stack.dir.0.join("drop.toml");
    std::fs::write(
        &toml,
        "id = \"drop\"\nname = \"Spring drop\"\nstock = 5\nper_user_limit = 1\nduration_seconds = 3600\n",
    )
    .unwrap();
    let out = ok(&run(&["sale", "put", "drop", toml.to_str().unwrap()]));
    assert!(out.starts_with("sale drop created\n"), "{out}");
    assert_eq!(field(&out, "stock"), Some("5"), "{out}");
    assert_eq!(stack.admin_sale("drop").await["stock"], 5);

    // Changed from JSON.
    let json = stack.dir.0.join("drop.json");
    let now = flashgate_common::now_ms();
    let body = serde_json::json!({
        "name": "Spring drop", "stock": 8, "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(now - 1000),
        "ends_at": flashgate_common::rfc3339(now + 3_600_000),
    });
    std::fs::write(&json, body.to_string()).unwrap();
    let out = ok(&run(&["sale", "put", "drop", json.to_str().unwrap()]));
    assert!(out.starts_with("sale drop changed\n"), "{out}");
    assert_eq!(stack.admin_sale("drop").await["stock"], 8);
    stack.open_sale("second", 3, 1).await;

    // A table with aligned columns, a line per sale.
    let out = ok(&run(&["sale", "list"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("ID "), "{out}");
    let drop = lines.iter().find(|l| l.starts_with("drop ")).expect(&out);
    for (column, value) in [("NAME", "Spring drop"), ("STATE", "open"), ("STOCK", "8")] {
        assert_eq!(
            lines[0].find(column),
            drop.find(value),
            "{column} not above {value}:\n{out}"
        );
    }
    assert!(lines.iter().any(|l| l.starts_with("second ")), "{out}");

    let out = ok(&run(&["sale", "show", "drop"]));
    assert_eq!(field(&out, "id"), Some("drop"), "{out}");
    assert_eq!(field(&out, "remaining"), Some("8"), "{out}");
    assert_eq!(field(&out, "state"), Some("open"), "{out}");

    // --json prints the API's JSON.
    let shown: Value =
        serde_json::from_str(&ok(&run(&["sale", "show", "drop", "--json"]))).unwrap();
    assert_eq!(shown, stack.admin_sale("drop").await);
    let listed: Value = serde_json::from_str(&ok(&run(&["sale", "--json", "list"]))).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");

    // Pause and resume reach the gateways.
    let out = ok(&run(&["sale", "pause", "drop"]));
    assert!(out.contains("sale drop paused"), "{out}");
    let (status, body) = buys_answer(&stack, "drop", 503).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("paused")),
        "{body}"
    );
    let out = ok(&run(&["sale", "show", "drop"]));
    assert_eq!(field(&out, "state"), Some("paused"), "{out}");
    let out = ok(&run(&["sale", "resume", "drop"]));
    assert!(out.contains("sale drop resumed"), "{out}");
    let (status, body) = buys_answer(&stack, "drop", 202).await;
    assert_eq!(status, 202, "{body}");

    // The reconciliation report, the verdict first.
    let out = ok(&run(&["sale", "reconcile", "drop"]));
    assert!(out.starts_with("sale_id:"), "{out}");
    assert_eq!(field(&out, "drift"), Some("0"), "{out}");
    assert_eq!(field(&out, "stock"), Some("8"), "{out}");
    let report: Value =
        serde_json::from_str(&ok(&run(&["sale", "reconcile", "drop", "--json"]))).unwrap();
    assert_eq!(report["sale_id"], "drop");

    // A refusal names the URL, the status and the API's code.
    let err = failed(&run(&["sale", "show", "nope"]));
    let url = format!("GET http://{}/admin/sales/nope", stack.admin_addr);
    assert!(err.contains(&url), "{err}");
    assert!(err.contains("404 Not Found (not_found)"), "{err}");
    let bad = stack.dir.0.join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\nstock = -1\n").unwrap();
    let err = failed(&run(&["sale", "put", "bad", bad.to_str().unwrap()]));
    assert!(
        err.contains("400 Bad Request (bad_request)") && err.contains("stock"),
        "{err}"
    );
    assert_eq!(
        stack
            .admin("GET".parse().unwrap(), "/admin/sales/bad", None)
            .await
            .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_or_an_api_away_is_named_with_its_url() {
    let stack = Stack::start(StackOptions::default()).await;
    let config = stack.config_path.clone();

    let err = failed(&flashgate(&config, WRONG_TOKEN, &["sale", "list"]));
    assert!(
        err.contains(&format!(
            "GET http://{}/admin/sales: 401 Unauthorized (unauthorized)",
            stack.admin_addr
        )),
        "{err}"
    );
    let err = failed(&flashgate(
        &config,
        WRONG_TOKEN,
        &["cache", "purge", "--prefix", "/"],
    ));
    assert!(
        err.contains(&format!(
            "POST http://{}/cache/purge: 401 Unauthorized (unauthorized)",
            stack.gateway_admin_addr
        )),
        "{err}"
    );

    // No token at all: said before any call.
    let out = Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&config)
        .args(["sale", "list"])
        .env_remove("FLASHGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    let err = failed(&out);
    assert!(err.contains("FLASHGATE_ADMIN_TOKEN is not set"), "{err}");

    // Nothing listening: the URL and the reason.
    let away: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let err = failed(&flashgate(
        &config,
        ADMIN_TOKEN,
        &["sale", "list", "--backend-admin", &format!("http://{away}")],
    ));
    assert!(
        err.contains(&format!(
            "GET http://{away}/admin/sales: cannot reach the API"
        )),
        "{err}"
    );
    assert!(err.to_lowercase().contains("connect"), "{err}");

    // The flags take the place of the config file, which is then not read.
    let out = ok(&flashgate(
        Path::new("/nonexistent/flashgate.toml"),
        ADMIN_TOKEN,
        &[
            "sale",
            "list",
            "--backend-admin",
            &stack.admin_addr.to_string(),
        ],
    ));
    assert_eq!(out, "no sales\n");
}

/// A shop whose pages may be cached for a minute; counts its requests.
async fn cacheable_shop() -> (SocketAddr, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let app = axum::Router::new().fallback(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { ([("cache-control", "max-age=60")], format!("page #{n}")) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_purge_removes_a_cached_shop_page_from_the_gateway() {
    let (shop, served) = cacheable_shop().await;
    let stack = Stack::start(StackOptions {
        extra_toml: format!("[shop]\nupstreams = [\"{shop}\"]\n[shop.cache]\nenabled = true\n"),
        ..StackOptions::default()
    })
    .await;
    let page = || async {
        let resp = stack
            .http
            .get(stack.url("/products/1"))
            .send()
            .await
            .unwrap();
        resp.text().await.unwrap()
    };
    assert_eq!(page().await, "page #1");
    assert_eq!(page().await, "page #1", "served from the cache");

    let run = |args: &[&str]| flashgate(&stack.config_path, ADMIN_TOKEN, args);
    let out = ok(&run(&["cache", "purge", "--url", "/products/1"]));
    assert_eq!(
        out,
        "purged 1 cached responses by url /products/1; announced to the other gateways\n"
    );
    assert_eq!(page().await, "page #2", "fetched from the shop again");
    assert_eq!(served.load(Ordering::SeqCst), 2);

    let answer: Value = serde_json::from_str(&ok(&run(&[
        "cache",
        "purge",
        "--prefix",
        "/products/",
        "--json",
    ])))
    .unwrap();
    assert_eq!(
        answer,
        serde_json::json!({"kind": "prefix", "purged": 1, "recorded": true, "announced": true})
    );
    let err = failed(&run(&["cache", "purge", "--url", "products"]));
    assert!(err.contains("400 Bad Request (bad_request)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_dead_lists_a_dead_order_event_and_retry_puts_it_back_in_line() {
    // Order events go to a webhook where nothing listens: each is dead
    // after one attempt.
    let nowhere = free_port();
    let stack = Stack::start(StackOptions {
        extra_toml: format!(
            "[events]\nwebhook_url = \"http://127.0.0.1:{nowhere}/hook\"\nmax_attempts = 1\npoll_ms = 50\nsend_timeout_ms = 2000\n"
        ),
        ..StackOptions::default()
    })
    .await;
    let run = |args: &[&str]| flashgate(&stack.config_path, ADMIN_TOKEN, args);
    assert_eq!(ok(&run(&["events", "dead"])), "no dead events\n");

    stack.open_sale("ev", 3, 1).await;
    let user = flashgate_tests::random_user();
    let (status, body) = stack.buy("ev", &user, None).await;
    assert_eq!(status, 202, "{body}");
    let order = stack
        .order_id_of(&user, body["reservation_id"].as_str().unwrap())
        .await;

    let deadline = Instant::now() + Duration::from_secs(20);
    let table = loop {
        let out = ok(&run(&["events", "dead"]));
        if out.contains(&order) || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("EVENT "), "{table}");
    let row = lines.iter().find(|l| l.contains(&order)).expect(&table);
    assert!(row.contains("order.created"), "{table}");
    let event_id = row.split_whitespace().next().unwrap().to_owned();
    assert!(event_id.starts_with("ev-"), "{table}");

    let dead: Value =
        serde_json::from_str(&ok(&run(&["events", "dead", "--json", "--limit", "5"]))).unwrap();
    assert_eq!(
        dead["dead_events"][0]["event_id"],
        event_id.as_str(),
        "{dead}"
    );

    let out = ok(&run(&["events", "retry", &event_id]));
    assert_eq!(
        out,
        format!("event {event_id}: pending; the outbox sends it again\n")
    );
    let err = failed(&run(&[
        "events",
        "retry",
        "ev-00000000000000000000000000000000",
    ]));
    assert!(err.contains("404 Not Found (not_found)"), "{err}");
}

/// `make run`, then `flashgate sale show demo` with the admin token of
/// the stack's secrets file prints the demo sale.
#[test]
fn after_make_run_sale_show_demo_prints_the_demo_sale() {
    let data = TempDir::new("run-cli");
    let run = LocalRun::new(
        &data.0,
        "\n[[sales]]\nid = \"demo\"\nname = \"Flashgate demo sneaker\"\nstock = 100\nper_user_limit = 1\nduration_seconds = 86400\n",
    );
    let (_guard, printed) = run.start(&[]);
    assert!(
        printed.contains("sale show demo"),
        "run.sh says how: {printed}"
    );
    let secrets = run.secrets();
    let token = secrets
        .iter()
        .find(|(k, _)| k == "FLASHGATE_ADMIN_TOKEN")
        .map(|(_, v)| v.as_str())
        .expect("run.sh writes the admin token to secrets.env");
    let out = ok(&flashgate(run.config(), token, &["sale", "show", "demo"]));
    assert_eq!(field(&out, "id"), Some("demo"), "{out}");
    assert_eq!(field(&out, "name"), Some("Flashgate demo sneaker"), "{out}");
    assert_eq!(field(&out, "stock"), Some("100"), "{out}");
    assert_eq!(field(&out, "remaining"), Some("100"), "{out}");
}
