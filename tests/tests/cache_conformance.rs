//! The shop cache against the HTTP caching test suite that reverse proxies
//! and CDNs are scored on (github.com/http-tests/cache-tests, the suite
//! behind cache-tests.fyi), as published on the npm registry
//! (`http-cache-tests`, pinned by `tests/cache-tests/package-lock.json`).
//!
//! The suite's origin server (node) runs on a loopback port of its own and
//! is the gateway's shop; the suite's client runs every test through the
//! gateway (`[shop.cache] enabled = true`); `tests/cache-tests/count.mjs`
//! scores the results as cache-tests.fyi does. The test pins the number of
//! required tests passed and that none fails in the privacy groups. The
//! tests that still fail, each with its reason, are listed in
//! docs/OPERATIONS.md ("The shop cache").

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flashgate_tests::{free_port, wait_port, Proc, Stack, StackOptions};
use serde_json::Value;

/// Required tests the gateway passes of the 168 of http-cache-tests 0.4.5
/// (the suite's npm release: its cli.mjs runs the surrogate-control tests
/// too), which a change must not lower. The gateway passes 138; one below,
/// as the suite's client has once seen a connection fail mid-run on a
/// loaded machine. The suite's repository head (163 required tests, the
/// figures of cache-tests.fyi: Traffic Server 9.2 132, Varnish 7.7 119)
/// scores the gateway 149; 0.4.5 predates RFC 9111 in the tests that
/// account for most of the difference (docs/OPERATIONS.md).
const REQUIRED_PASSED: u64 = 137;

/// A whole run takes about a minute; past this it is stuck.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Where `npm ci` in [`suite_dir`] puts the suite (package.json pins it).
const SUITE: &str = "node_modules/http-cache-tests";

fn suite_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cache-tests")
}

/// Privacy tests that ask the cache to share more than the gateway ever
/// does: `headers-store-Set-Cookie` wants a response with `Set-Cookie`
/// stored and replayed to the next client (a session cookie handed to
/// another buyer), `304-etag-update-response-Set-Cookie` one stored to be
/// revalidated; the gateway never stores one (docs/OPERATIONS.md).
const SHARES_LESS: [&str; 2] = [
    "headers-store-set-cookie",
    "304-etag-update-response-set-cookie",
];

/// A test about what must never be shared between users: requests with
/// `Authorization`, `private`, `no-store`, `Set-Cookie` and `Cookie`.
fn is_privacy(suite: &str, id: &str) -> bool {
    let id = id.to_ascii_lowercase();
    (suite == "auth"
        || ["private", "no-store", "set-cookie", "cookie"]
            .iter()
            .any(|word| id.contains(word)))
        && !SHARES_LESS.contains(&id.as_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shop_cache_passes_the_required_http_caching_tests() {
    let dir = suite_dir();
    assert!(
        dir.join(SUITE).exists(),
        "the suite is not installed: run `bash deploy/local/install-deps.sh --test`"
    );
    let origin_port = free_port();
    let pidfile = std::env::temp_dir().join(format!("cache-tests-{origin_port}.pid"));
    let origin = Proc {
        child: Command::new("node")
            .arg("server/server.mjs")
            .current_dir(dir.join(SUITE))
            .env("npm_config_protocol", "http")
            .env("npm_config_port", origin_port.to_string())
            .env("npm_config_pidfile", &pidfile)
            .stdout(Stdio::null())
            .spawn()
            .expect("node (install-deps.sh --test installs it)"),
        name: "cache-tests-server",
    };
    let origin_addr = format!("127.0.0.1:{origin_port}");
    assert!(
        wait_port(origin_addr.parse().unwrap(), Duration::from_secs(20)),
        "the suite's origin server did not start"
    );

    let stack = Stack::start(StackOptions {
        extra_toml: format!(
            "[shop]\nupstreams = [\"{origin_addr}\"]\nread_timeout_ms = 10000\n\n\
             [shop.cache]\nenabled = true\n"
        ),
        ..StackOptions::default()
    })
    .await;

    let results = stack.dir.0.join("cache-tests.json");
    let mut client = Proc {
        child: Command::new("node")
            .args(["--no-warnings", "cli.mjs"])
            .current_dir(dir.join(SUITE))
            .env("npm_config_base", stack.url("").trim_end_matches('/'))
            .env("npm_package_config_id", "")
            .stdout(std::fs::File::create(&results).unwrap())
            .spawn()
            .unwrap(),
        name: "cache-tests-client",
    };
    let started = Instant::now();
    let status = client.wait_exit(RUN_LIMIT);
    assert!(
        matches!(status, Some(s) if s.success()),
        "the suite's client did not finish in {RUN_LIMIT:?} ({status:?}, after {:?})",
        started.elapsed()
    );
    drop(origin);
    let _ = std::fs::remove_file(&pidfile);

    let out = Command::new("node")
        .arg("count.mjs")
        .arg(&results)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "count.mjs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let score: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failing = score["failing"].as_array().unwrap();
    for test in failing {
        println!(
            "failing {} {} ({}): {}",
            test["result"].as_str().unwrap_or(""),
            test["id"].as_str().unwrap_or(""),
            test["suite"].as_str().unwrap_or(""),
            test["detail"].as_str().unwrap_or("")
        );
    }
    let passed = score["passed"].as_u64().unwrap();
    let required = score["required"].as_u64().unwrap();
    println!("required tests passed: {passed} of {required}");

    let privacy: Vec<&str> = failing
        .iter()
        .filter(|t| t["browser_only"] != Value::Bool(true))
        .filter(|t| is_privacy(t["suite"].as_str().unwrap(), t["id"].as_str().unwrap()))
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(privacy.is_empty(), "privacy tests failing: {privacy:?}");
    assert!(
        passed >= REQUIRED_PASSED,
        "{passed} of {required} required tests passed, below {REQUIRED_PASSED}"
    );
}
