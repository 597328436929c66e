//! Start in any order, ride out every restart: the backend and the gateway
//! start before Redis or the database exists, wait for them while saying so
//! on `GET /ready`, and sell exactly once they are there; a Redis that
//! restarts mid-sale and loads a large AOF is ridden out with `503` and
//! `Retry-After`; `make run` (deploy/local/run.sh) starts on a `data/`
//! holding a large AOF, twice in a row, and uses the secrets of the
//! environment over its own file.
//!
//! The large AOF is about 215 MB of plain commands (no RDB preamble), made
//! in a couple of seconds by a throwaway redis-server with `DEBUG POPULATE`;
//! each test prints its size and how long Redis took to load it.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use flashgate_tests::local_run::LocalRun;
use flashgate_tests::{
    aof_bytes, buy_all, free_port, get_json, prepare_large_aof, random_user, token, wait_ready,
    Attempt, PrivatePostgres, RedisServer, Stack, StackOptions, TempDir, ADMIN_TOKEN,
};

/// Keys x bytes of filler in the prepared AOF: about 215 MB on disk.
const AOF_KEYS: u64 = 1_600_000;
const AOF_VALUE_BYTES: u64 = 100;
const MIN_AOF_BYTES: u64 = 200 * 1000 * 1000;
/// Readiness may take this long: a Redis loading the AOF, on a busy 2-core box.
const READY_LIMIT: Duration = Duration::from_secs(90);

/// Makes the large AOF in a dir of its own (moved into place later, so the
/// stack's clock does not include making it); the dir and the AOF's size.
fn large_aof() -> (TempDir, u64) {
    let dir = TempDir::new("aof");
    let bytes = prepare_large_aof(&dir.0, AOF_KEYS, AOF_VALUE_BYTES);
    assert!(
        bytes >= MIN_AOF_BYTES,
        "the prepared AOF is only {bytes} bytes"
    );
    (dir, bytes)
}

/// Moves the prepared AOF into `dir` (same file system: a rename).
fn install_aof(aof: &TempDir, dir: &Path) {
    std::fs::rename(aof.0.join("appendonlydir"), dir.join("appendonlydir")).unwrap();
}

/// Polls Redis on `port` until it answers PING; how long it loaded.
async fn redis_load_time(port: u16) -> Duration {
    let started = Instant::now();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    loop {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            if redis::cmd("PING")
                .query_async::<String>(&mut c)
                .await
                .is_ok()
            {
                return started.elapsed();
            }
        }
        assert!(
            started.elapsed() < READY_LIMIT,
            "redis on {port} did not finish loading"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET url` once the readiness body reports `dependency` checked at least once.
async fn first_check(
    http: &reqwest::Client,
    url: &str,
    dependency: &str,
) -> (u16, serde_json::Value) {
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        let (status, body) = get_json(http, url).await;
        if body[dependency].as_str().is_some_and(|s| s != "starting") || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The states a log gave `dependency`, in order: the word after
/// "waiting for {dependency}: ", or "ready" for "{dependency} is ready".
fn logged_states(log: &str, dependency: &str) -> Vec<String> {
    let waiting = format!("waiting for {dependency}: ");
    let ready = format!("{dependency} is ready");
    log.lines()
        .filter_map(|line| {
            if let Some((_, rest)) = line.split_once(&waiting) {
                Some(
                    rest.chars()
                        .take_while(|c| c.is_ascii_alphabetic() || *c == '_')
                        .collect(),
                )
            } else if line.contains(&ready) {
                Some("ready".to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// What the log says of `dependency` starts with a wait (`first`, when
/// given) and changes with every line: one line per change of state,
/// however many retries (a Redis starved while loading may time out a
/// check and be logged as unreachable again, but never twice in a row).
fn assert_logged_once_per_change(log: &str, dependency: &str, first: Option<&str>) {
    let states = logged_states(log, dependency);
    let said = states.first().map(String::as_str);
    assert!(
        said.is_some_and(|s| s != "ready" && first.is_none_or(|f| f == s)),
        "the log says `waiting for {dependency}: {}` first; states logged {states:?}:\n{log}",
        first.unwrap_or("...")
    );
    assert!(
        states.windows(2).all(|w| w[0] != w[1]),
        "one line per change of state, not per retry; states logged {states:?}:\n{log}"
    );
}

fn declared_sale(id: &str, stock: i64) -> String {
    format!("\n[[sales]]\nid = \"{id}\"\nname = \"Declared {id}\"\nstock = {stock}\nper_user_limit = 1\nduration_seconds = 3600\n")
}

fn attempts(n: usize) -> Vec<Attempt> {
    (0..n)
        .map(|_| Attempt {
            user: random_user(),
            idempotency_key: None,
        })
        .collect()
}

/// Sells `sale` to `buyers` distinct users and checks the books: exactly
/// `stock` winners, one order each, nothing left.
async fn sells_exactly(stack: &Stack, sale: &str, stock: i64, buyers: usize) {
    let outcomes = buy_all(stack.gateway_addr, sale, attempts(buyers), 16).await;
    let winners: Vec<_> = outcomes.iter().filter(|o| o.won()).collect();
    let statuses: HashSet<u16> = outcomes.iter().map(|o| o.status).collect();
    assert_eq!(
        winners.len() as i64,
        stock,
        "winners; statuses seen {statuses:?}"
    );
    let (orders, users, most) = stack
        .wait_orders(sale, stock, Duration::from_secs(30))
        .await;
    assert_eq!(
        (orders, users, most),
        (stock, stock, 1),
        "orders, distinct buyers, most per buyer"
    );
    assert_eq!(stack.remaining(sale).await, 0);
}

fn still_running(stack: &mut Stack) {
    for (name, proc) in [
        ("backend", stack.backend.as_mut()),
        ("gateway", stack.gateway.as_mut()),
    ] {
        let proc = proc.expect("started");
        assert!(
            proc.child.try_wait().unwrap().is_none(),
            "the {name} exited"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_and_gateway_started_before_redis_become_ready_once_it_has_loaded_a_large_aof_and_sell_exactly(
) {
    const STOCK: i64 = 20;
    let (aof, aof_size) = large_aof();
    let opts = StackOptions {
        appendonly: true,
        extra_toml: declared_sale("early", STOCK),
        ..StackOptions::default()
    };
    let http = reqwest::Client::new();
    let mut stack = Stack::start_redis_last(opts, |early| async move {
        let started = Instant::now();
        // No Redis yet: both run, neither is ready, and each says why.
        let (status, body) = get_json(&http, &format!("http://{}/ready", early.backend_addr)).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["ready"], false);
        let (status, body) = first_check(
            &http,
            &format!("http://{}/ready", early.gateway_admin_addr),
            "redis",
        )
        .await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["redis"], "unreachable", "{body}");
        let (status, _) =
            get_json(&http, &format!("http://{}/live", early.gateway_admin_addr)).await;
        assert_eq!(status, 200, "a gateway waiting for Redis is alive");
        let (status, _) = get_json(&http, &format!("http://{}/live", early.backend_addr)).await;
        assert_eq!(status, 200, "a backend waiting for Redis is alive");
        // What needs no Redis is served; a buy is told to come back.
        let page = http
            .get(format!(
                "http://{}/flashgate/sales/early",
                early.gateway_addr
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status().as_u16(), 200, "the sale page needs no Redis");
        let shop = http
            .get(format!("http://{}/", early.gateway_addr))
            .send()
            .await
            .unwrap();
        assert_eq!(shop.status().as_u16(), 200, "the shop proxy needs no Redis");
        let buy = http
            .post(format!(
                "http://{}/flashgate/api/sales/early/buy",
                early.gateway_addr
            ))
            .bearer_auth(token("u-early"))
            .send()
            .await
            .unwrap();
        assert_eq!(buy.status().as_u16(), 503);
        assert!(buy.headers().contains_key("retry-after"));

        tokio::time::sleep(Duration::from_secs(3).saturating_sub(started.elapsed())).await;
        install_aof(&aof, &early.dir);
        let redis = RedisServer::start_on(&early.dir, early.redis_port, true);
        let load = redis_load_time(redis.port).await;
        println!(
            "aof_bytes={aof_size} load_seconds={:.2}",
            load.as_secs_f64()
        );
        redis
    })
    .await;

    let (status, body) = wait_ready(&stack.http, &stack.backend_ready_url(), READY_LIMIT).await;
    assert_eq!(
        status,
        200,
        "backend not ready: {body}\n{}",
        stack.log("flashgate-backend")
    );
    let (status, body) = wait_ready(&stack.http, &stack.gateway_ready_url(), READY_LIMIT).await;
    assert_eq!(
        status,
        200,
        "gateway not ready: {body}\n{}",
        stack.log("flashgate")
    );
    still_running(&mut stack);

    let log = stack.log("flashgate-backend");
    assert_eq!(
        log.matches("sale preheated").count(),
        1,
        "the declared sale is preheated exactly once:\n{log}"
    );
    assert_logged_once_per_change(&log, "redis", Some("unreachable"));
    assert_eq!(stack.remaining("early").await, STOCK);
    sells_exactly(&stack, "early", STOCK, 60).await;
    assert!(aof_bytes(&stack.dir.0) >= MIN_AOF_BYTES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_started_while_postgresql_is_absent_waits_and_becomes_ready_and_rides_out_its_restart(
) {
    let mut pg = PrivatePostgres::init(free_port())
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (make test installs them)");
    let opts = StackOptions {
        database_url: Some(pg.url()),
        skip_ready_wait: true,
        ..StackOptions::default()
    };
    let mut stack = Stack::start(opts).await;

    let (status, body) = first_check(&stack.http, &stack.backend_ready_url(), "database").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["database"], "unreachable", "{body}");
    let (status, body) = stack
        .admin(reqwest::Method::GET, "/admin/sales", None)
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("unavailable")),
        "the admin API waits for the database"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    still_running(&mut stack);

    pg.start();
    let (status, body) = wait_ready(&stack.http, &stack.backend_ready_url(), READY_LIMIT).await;
    assert_eq!(
        status,
        200,
        "backend not ready: {body}\n{}",
        stack.log("flashgate-backend")
    );
    assert_logged_once_per_change(
        &stack.log("flashgate-backend"),
        "database",
        Some("unreachable"),
    );
    stack.open_sale("pg", 5, 1).await;
    let (status, body) = wait_ready(&stack.http, &stack.gateway_ready_url(), READY_LIMIT).await;
    assert_eq!(status, 200, "{body}");
    sells_exactly(&stack, "pg", 5, 10).await;

    // PostgreSQL restarting mid-run: readiness flips and comes back.
    pg.stop();
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        let (status, body) = get_json(&stack.http, &stack.backend_ready_url()).await;
        if status == 503 && body["database"] != "ready" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the backend never noticed the database was gone: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The consumers' supervisor, listing the sales every poll, says once
    // that it cannot, however many polls fail.
    while !stack
        .log("flashgate-backend")
        .contains("waiting for sale list")
    {
        assert!(
            Instant::now() < deadline,
            "the sale list never failed while the database was away:\n{}",
            stack.log("flashgate-backend")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.start();
    let (status, body) = wait_ready(&stack.http, &stack.backend_ready_url(), READY_LIMIT).await;
    assert_eq!(
        status,
        200,
        "backend not ready again: {body}\n{}",
        stack.log("flashgate-backend")
    );
    still_running(&mut stack);
    let log = stack.log("flashgate-backend");
    assert_logged_once_per_change(&log, "database", Some("unreachable"));
    assert_logged_once_per_change(&log, "sale list", None);
    stack.open_sale("pg2", 3, 1).await;
    sells_exactly(&stack, "pg2", 3, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_sale_with_a_large_aof_answers_503_with_retry_after_while_loading_and_the_books_stay_exact(
) {
    const STOCK: i64 = 60;
    let (aof, aof_size) = large_aof();
    let opts = StackOptions {
        appendonly: true,
        ..StackOptions::default()
    };
    let mut stack = Stack::start_redis_last(opts, |early| async move {
        install_aof(&aof, &early.dir);
        let redis = RedisServer::start_on(&early.dir, early.redis_port, true);
        redis_load_time(redis.port).await;
        redis
    })
    .await;
    for url in [stack.backend_ready_url(), stack.gateway_ready_url()] {
        let (status, body) = wait_ready(&stack.http, &url, READY_LIMIT).await;
        assert_eq!(status, 200, "{url}: {body}");
    }
    stack.open_sale("mid", STOCK, 1).await;

    // Buyers keep buying, one new user at a time, until the sale is sold
    // out. Like a real client, a buyer told 503 (or not answered: Redis may
    // die after deducting, before replying) retries with the same
    // Idempotency-Key until it gets a final answer, so every item sold has
    // exactly one buyer told so.
    let (addr, http) = (stack.gateway_addr, stack.http.clone());
    let buyers: Vec<_> = (0..4)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(120);
                'users: while Instant::now() < deadline {
                    let (user, key) = (random_user(), random_user());
                    while Instant::now() < deadline {
                        let resp = http
                            .post(format!("http://{addr}/flashgate/api/sales/mid/buy"))
                            .bearer_auth(token(&user))
                            .header("Idempotency-Key", &key)
                            .timeout(Duration::from_secs(10))
                            .send()
                            .await;
                        let Ok(resp) = resp else { continue };
                        let status = resp.status().as_u16();
                        let retry_after = resp.headers().contains_key("retry-after");
                        let body: serde_json::Value = resp.json().await.unwrap_or_default();
                        seen.push((user.clone(), status, retry_after, body));
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        match status {
                            503 => continue,
                            410 => break 'users,
                            _ => continue 'users,
                        }
                    }
                }
                seen
            })
        })
        .collect();

    // Restart Redis once some items are sold.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack.remaining("mid").await > STOCK / 2 {
        assert!(Instant::now() < deadline, "the buyers sold nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What the gateway's /ready says while Redis reloads.
    let (watching, mut watched) = tokio::sync::watch::channel(false);
    let ready_states = {
        let (http, url) = (stack.http.clone(), stack.gateway_ready_url());
        tokio::spawn(async move {
            let mut states = HashSet::new();
            while !*watched.borrow_and_update() {
                let (_, body) = get_json(&http, &url).await;
                states.insert(body["redis"].as_str().unwrap_or_default().to_owned());
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(25)) => {}
                    _ = watched.changed() => {}
                }
            }
            states
        })
    };
    stack.redis.restart();
    let load = redis_load_time(stack.redis.port).await;
    println!(
        "aof_bytes={aof_size} reload_seconds_mid_sale={:.2}",
        load.as_secs_f64()
    );
    watching.send(true).unwrap();
    let ready_states = ready_states.await.unwrap();
    assert!(
        ready_states.contains("loading"),
        "the gateway's /ready said `\"redis\":\"loading\"` while Redis reloaded; it said {ready_states:?}"
    );

    let mut seen = Vec::new();
    for b in buyers {
        seen.extend(b.await.unwrap());
    }
    let unavailable: Vec<_> = seen.iter().filter(|s| s.1 == 503).collect();
    assert!(
        !unavailable.is_empty(),
        "buyers kept buying while Redis loaded: some must have got 503"
    );
    assert!(
        unavailable
            .iter()
            .all(|s| s.2 && s.3["code"] == "unavailable"),
        "every 503 is `unavailable` with Retry-After"
    );
    let winners: Vec<_> = seen.iter().filter(|s| s.1 == 201 || s.1 == 202).collect();
    let mut statuses: Vec<u16> = seen.iter().map(|s| s.1).collect();
    statuses.dedup();
    assert_eq!(
        winners.len() as i64,
        STOCK,
        "exactly the stock was sold; statuses in order {statuses:?}; remaining {}",
        stack.remaining("mid").await
    );
    let rows = stack
        .wait_orders("mid", STOCK, Duration::from_secs(30))
        .await;
    assert_eq!(
        rows,
        (STOCK, STOCK, 1),
        "orders, distinct buyers, most per buyer"
    );
    let orders = stack.order_rows("mid").await;
    let with_order: HashSet<&str> = orders.iter().map(|o| o.reservation_id.as_str()).collect();
    for w in &winners {
        let rid = w.3["reservation_id"]
            .as_str()
            .expect("a winner has its reservation id");
        assert!(with_order.contains(rid), "winner {} has no order", w.0);
    }
    assert_eq!(stack.remaining("mid").await, 0);
    for url in [stack.backend_ready_url(), stack.gateway_ready_url()] {
        let (status, body) = wait_ready(&stack.http, &url, READY_LIMIT).await;
        assert_eq!(status, 200, "{url}: {body}");
    }
    still_running(&mut stack);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_run_starts_twice_in_a_row_on_a_data_dir_holding_a_large_aof() {
    let data = TempDir::new("run-data");
    let (aof, aof_size) = large_aof();
    install_aof(&aof, &data.0);
    let run = LocalRun::new(&data.0, &declared_sale("demo", 10));
    for attempt in 1..=2 {
        let started = Instant::now();
        let (guard, out) = run.start(&[]);
        println!(
            "aof_bytes={aof_size} run_{attempt}_ready_seconds={:.2}\n{out}",
            started.elapsed().as_secs_f64()
        );
        assert!(
            out.contains("waiting for backend to be ready"),
            "run.sh says what it waits for:\n{out}"
        );
        drop(guard);
        assert!(aof_bytes(&data.0) >= MIN_AOF_BYTES);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_run_uses_the_secrets_exported_in_the_environment_over_its_file() {
    let data = TempDir::new("run-secrets");
    std::fs::write(
        data.0.join("secrets.env"),
        "FLASHGATE_JWT_SECRET=from-the-file-jwt-secret-000000000000\nFLASHGATE_ADMIN_TOKEN=from-the-file-admin-token-0000000000\n",
    )
    .unwrap();
    let run = LocalRun::new(&data.0, &declared_sale("demo", 10));
    let (guard, _) = run.start(&[("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)]);
    let http = reqwest::Client::new();
    let url = format!("http://{}/admin/sales/demo", run.admin_addr());
    let status = |resp: reqwest::Response| resp.status().as_u16();
    assert_eq!(
        status(
            http.get(&url)
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap()
        ),
        200,
        "the exported token is used"
    );
    let from_file = http
        .get(&url)
        .bearer_auth("from-the-file-admin-token-0000000000")
        .send()
        .await
        .unwrap();
    assert_eq!(
        status(from_file),
        401,
        "the file does not override the environment"
    );
    drop(guard);

    // A file written by hand: `export`, quotes, a base64 secret ending in
    // `=`, a last line without its newline. Each value is used whole.
    const BASE64_TOKEN: &str = "YWRtaW4tdG9rZW4tZnJvbS10aGUtZmlsZS1pbi1iYXNlNjQ=";
    let secrets = data.0.join("secrets.env");
    std::fs::write(
        &secrets,
        format!("export FLASHGATE_JWT_SECRET='from-the-file-jwt-secret-000000000000'\nexport FLASHGATE_ADMIN_TOKEN={BASE64_TOKEN}"),
    )
    .unwrap();
    let (guard, _) = run.start(&[]);
    assert_eq!(
        status(
            http.get(&url)
                .bearer_auth(BASE64_TOKEN)
                .send()
                .await
                .unwrap()
        ),
        200,
        "the file's base64 token is used with its trailing `=`"
    );
    drop(guard);
    let text = std::fs::read_to_string(&secrets).unwrap();
    assert_eq!(
        text.matches("FLASHGATE_ADMIN_TOKEN=").count(),
        1,
        "an exported secret in the file is not added again:\n{text}"
    );
    assert!(
        text.contains(&format!("{BASE64_TOKEN}\n")),
        "the secrets added go on lines of their own:\n{text}"
    );
    // The secrets and what the stack writes are the user's alone.
    use std::os::unix::fs::PermissionsExt;
    for file in ["secrets.env", "backend.log", "redis.log", "flashgate.db"] {
        let mode = std::fs::metadata(data.0.join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is readable by others: {mode:o}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_run_stops_at_once_naming_redis_and_its_log_when_redis_cannot_start() {
    let data = TempDir::new("run-redis-dead");
    let run = LocalRun::new(&data.0, &declared_sale("demo", 10));
    // Something else holds Redis's port: redis-server exits at start,
    // while the backend connects to the squatter and waits for an answer.
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", run.ports[0])).unwrap();
    let (status, stderr) = run.run_to_exit(&[]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("redis exited; see {}/redis.log", data.0.display())),
        "run.sh names the process that exited and its log:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_backend_is_away_logs_its_failing_forwards_once_per_change() {
    let mut stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("fwd", 10, 1).await;
    let (status, body) = wait_ready(&stack.http, &stack.gateway_ready_url(), READY_LIMIT).await;
    assert_eq!(status, 200, "{body}");
    stack.kill_backend();
    // Winners one at a time: each forward is a batch of its own, failing.
    for _ in 0..4 {
        let (status, body) = stack.buy("fwd", &random_user(), None).await;
        assert!(status == 201 || status == 202, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stack.start_backend();
    let (status, body) = wait_ready(&stack.http, &stack.backend_ready_url(), READY_LIMIT).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = stack.buy("fwd", &random_user(), None).await;
    assert!(status == 201 || status == 202, "{status} {body}");
    assert_eq!(
        stack.wait_orders("fwd", 5, Duration::from_secs(30)).await,
        (5, 5, 1),
        "every winner's order is written"
    );
    assert_logged_once_per_change(&stack.log("flashgate"), "backend order API", None);
}
