//! The opening draw (`[fairness] window_ms`), end to end: buys arriving
//! within the window after a sale starts are decided in one random order
//! for the whole sale, whatever gateway they came through, with the books
//! exact and one final answer per buyer; the record reproduces the order
//! from its seed.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use flashgate_common::draw::decided_order;
use flashgate_tests::{token, Stack, StackOptions};
use serde_json::{json, Value};

/// A stack whose sales have a 200 ms opening draw unless they say otherwise.
/// Redis calls may take up to 2 s: hundreds of buys at once keep the two
/// cores of a test machine busy (unoptimised build), and a call cut short
/// would be answered 503, not the outcome under test.
async fn stack_with_draws(extra: &str) -> Stack {
    Stack::start(StackOptions {
        extra_toml: format!("[fairness]\nwindow_ms = 200\n{extra}"),
        redis_timeout_ms: 2000,
        ..StackOptions::default()
    })
    .await
}

/// Creates sale `id` starting `starts_in` from now, for an hour, with the
/// given own draw window (`None`: the global one); returns its start (ms).
async fn put_sale(
    stack: &Stack,
    id: &str,
    stock: i64,
    per_user_limit: i64,
    starts_in: Duration,
    window: Option<i64>,
) -> i64 {
    let starts = flashgate_common::now_ms() + starts_in.as_millis() as i64;
    let mut body = json!({
        "name": format!("Sale {id}"),
        "stock": stock,
        "per_user_limit": per_user_limit,
        "starts_at": flashgate_common::rfc3339(starts),
        "ends_at": flashgate_common::rfc3339(starts + 3_600_000),
    });
    if let Some(w) = window {
        body["draw_window_ms"] = json!(w);
    }
    let (status, v) = stack
        .admin(
            reqwest::Method::PUT,
            &format!("/admin/sales/{id}"),
            Some(body),
        )
        .await;
    assert!(status == 200 || status == 201, "PUT {id}: {status} {v}");
    starts
}

/// Sleeps until wall time `at_ms`.
async fn sleep_until_ms(at_ms: i64) {
    let left = at_ms - flashgate_common::now_ms();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

/// One buy with an Idempotency-Key; status and body (0 when nothing answered).
async fn buy(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    user: &str,
    key: &str,
) -> (u16, Value) {
    let resp = http
        .post(format!("http://{gateway}/flashgate/api/sales/{sale}/buy"))
        .bearer_auth(token(user))
        .header("Idempotency-Key", key)
        .timeout(Duration::from_secs(20))
        .send()
        .await;
    match resp {
        Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
        Err(_) => (0, Value::Null),
    }
}

/// Sends one buy per user at once (each with key `k-<user>`), all at the
/// same moment; answers (user, status, body).
fn send_group(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    users: Vec<String>,
) -> Vec<tokio::task::JoinHandle<(String, u16, Value)>> {
    users
        .into_iter()
        .map(|user| {
            let (http, sale) = (http.clone(), sale.to_owned());
            tokio::spawn(async move {
                let (status, body) = buy(&http, gateway, &sale, &user, &format!("k-{user}")).await;
                (user, status, body)
            })
        })
        .collect()
}

/// A client with a connection open to `gateway` per user already, and
/// each user's token verified (and cached) by the gateway, so a burst of
/// their buys waits for neither.
async fn warm_client(gateway: SocketAddr, sale: &str, users: &[String]) -> reqwest::Client {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(users.len())
        .build()
        .unwrap();
    let warm: Vec<_> = users
        .iter()
        .map(|user| {
            let (http, url, bearer) = (
                http.clone(),
                format!("http://{gateway}/flashgate/api/sales/{sale}/challenge"),
                token(user),
            );
            tokio::spawn(async move {
                http.get(url)
                    .bearer_auth(bearer)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            })
        })
        .collect();
    for w in warm {
        w.await.unwrap();
    }
    http
}

/// What a burst of two groups came to.
struct Burst {
    /// Winners of group A and B.
    won: (usize, usize),
    /// Every answer: user -> (status, reservation id of a win).
    answers: HashMap<String, (u16, Option<String>)>,
}

/// Two groups of `size` buyers of `sale`, and a client warmed for them.
async fn groups(
    stack: &Stack,
    sale: &str,
    size: usize,
) -> (Vec<String>, Vec<String>, reqwest::Client) {
    let group = |tag: &str| {
        (0..size)
            .map(|i| format!("{sale}-{tag}{i:03}"))
            .collect::<Vec<_>>()
    };
    let (a, b) = (group("a"), group("b"));
    let http = warm_client(stack.gateway_addr, sale, &[a.clone(), b.clone()].concat()).await;
    (a, b, http)
}

/// Group A buys at the sale's start, group B `gap` later; every buyer
/// must get a final answer (won or sold out).
async fn two_groups(
    stack: &Stack,
    sale: &str,
    starts: i64,
    gap: Duration,
    (a, b, http): (Vec<String>, Vec<String>, reqwest::Client),
) -> Burst {
    // The gateway reads the new sale now, not when the burst arrives.
    let (status, _) = flashgate_tests::client::get_json(
        &http,
        &stack.url(&format!("/flashgate/api/sales/{sale}")),
    )
    .await;
    assert_eq!(status, 200);
    sleep_until_ms(starts + 5).await;
    let first = send_group(&http, stack.gateway_addr, sale, a.clone());
    tokio::time::sleep(gap).await;
    let second = send_group(&http, stack.gateway_addr, sale, b);
    let mut answers = HashMap::new();
    let mut won = (0, 0);
    for task in first.into_iter().chain(second) {
        let (user, status, body) = task.await.unwrap();
        if !(status == 202 || status == 410) {
            let m = stack.gateway_metrics_text().await;
            let m: Vec<&str> = m
                .lines()
                .filter(|l| {
                    l.contains("draw") || l.contains("redis_errors") || l.contains("buy_outcomes")
                })
                .collect();
            panic!(
                "{user}: no final answer: {status} {body}\n{}\n{}",
                m.join("\n"),
                stack.log("flashgate")
            );
        }
        if status == 202 {
            if a.contains(&user) {
                won.0 += 1;
            } else {
                won.1 += 1;
            }
        } else {
            assert_eq!(body["code"], "sold_out", "{user}: {body}");
        }
        answers.insert(
            user,
            (status, body["reservation_id"].as_str().map(str::to_owned)),
        );
    }
    Burst { won, answers }
}

/// The sale's draw record from the admin API.
async fn record(stack: &Stack, sale: &str) -> Value {
    let (status, v) = stack
        .admin(
            reqwest::Method::GET,
            &format!("/admin/sales/{sale}/draw"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

/// The books of a sale after a burst: winners = stock = stream records =
/// orders, nothing left, and every answer replayed by a retry with its key.
async fn assert_exact_books(stack: &Stack, sale: &str, stock: i64, burst: &Burst) {
    let winners = (burst.won.0 + burst.won.1) as i64;
    assert_eq!(winners, stock, "every item sold, once");
    assert_eq!(stack.remaining(sale).await, 0);
    assert_eq!(stack.stream_len(sale).await, stock);
    let books = stack.sale_in_redis(sale).await;
    assert_eq!(books.reservations.len() as i64, stock);
    let won: HashSet<&str> = burst
        .answers
        .values()
        .filter_map(|(_, rid)| rid.as_deref())
        .collect();
    assert_eq!(won.len() as i64, stock, "one reservation per winner");
    assert!(
        won.iter().all(|rid| books.reservations.contains_key(*rid)),
        "every answered win is in the books"
    );
    let (orders, _, _) = stack
        .wait_orders(sale, stock, Duration::from_secs(20))
        .await;
    assert_eq!(orders, stock, "one order per winner");
    // A retry with the same key after the draw: the same final answer.
    for (user, (status, rid)) in burst.answers.iter().take(40) {
        let (again, body) = buy(
            &stack.http,
            stack.gateway_addr,
            sale,
            user,
            &format!("k-{user}"),
        )
        .await;
        if *status == 202 {
            assert!(
                again == 201 || again == 202,
                "{user}: a winner's retry: {again} {body}"
            );
            assert_eq!(body["reservation_id"].as_str(), rid.as_deref(), "{user}");
        } else {
            assert_eq!(
                (again, body["code"].as_str()),
                (410, Some("sold_out")),
                "{user}: {body}"
            );
        }
    }
}

/// Group A's winners of `stock` drawn without replacement from `ka` + `kb`
/// entrants are hypergeometric: their mean and 5 standard deviations.
fn five_sigma_band(stock: f64, ka: f64, kb: f64) -> (f64, f64) {
    let n = ka + kb;
    let mean = stock * ka / n;
    let sigma = (stock * (ka / n) * (kb / n) * (n - stock) / (n - 1.0))
        .max(0.0)
        .sqrt();
    (mean, 5.0 * sigma)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_gives_early_and_late_buyers_of_its_window_even_chances() {
    let stack = stack_with_draws("").await;
    // Two groups of 80 buyers for 100 items: 160 buys, so the draw must
    // turn 60 away, and few enough to reach Redis quickly.
    const SIZE: usize = 80;
    const STOCK: i64 = 100;
    // The issue asks for a 200 ms window. Measured on the two-core test
    // machine running the debug build under other builds (load average
    // about 8), 200 ms is too small: within it only 21 to 80 of A's 80
    // and 0 to 24 of B's 80 buys entered (group B, sent 50 ms after A,
    // queues behind A's buys), too few for the draw to decide anything
    // (fewer entrants than items). The full bursts reached Redis 250 to
    // 420 ms after the start. No window between 420 and 1000 ms was run;
    // 1000 ms leaves more than twice the slowest burst measured. The draw
    // is the same for any window: only which buys are in it depends on
    // the machine.
    const WINDOW_MS: i64 = 1000;

    let buyers = groups(&stack, "fair", SIZE).await;
    let starts = put_sale(
        &stack,
        "fair",
        STOCK,
        1,
        Duration::from_millis(1500),
        Some(WINDOW_MS),
    )
    .await;
    let drawn = two_groups(&stack, "fair", starts, Duration::from_millis(50), buyers).await;
    let rec = record(&stack, "fair").await;
    let seed = rec["state"]["seed"].as_str().unwrap().to_owned();
    let entrants: usize = rec["state"]["entrants"].as_str().unwrap().parse().unwrap();
    // Entrants of each group (a buy of the window's tail may come late on
    // a loaded machine, then it is first come, first served after the draw).
    let entered_a = rec["entrants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e[1]["user"].as_str().unwrap().starts_with("fair-a"))
        .count();
    let entered_b = entrants - entered_a;
    eprintln!(
        "draw seed {seed}: entrants A {entered_a} B {entered_b}, winners A {} B {}",
        drawn.won.0, drawn.won.1
    );
    // At least half of each group: then at least 120 entrants for the 100
    // items, so the draw decides who goes without.
    assert!(
        entered_a >= SIZE / 2 && entered_b >= SIZE / 2,
        "too few buys arrived within the window: A {entered_a}, B {entered_b}"
    );
    // 100 winners drawn without replacement from the entrants: group A's
    // count is hypergeometric, mean 100·Ka/N, variance
    // 100·(Ka/N)·(Kb/N)·(N-100)/(N-1): with every buyer in (80 + 80) that
    // is 50 ± 3.07, and 5 sigma is ±15.4 (a false alarm about once in 1.7
    // million runs). The seed above reproduces a failure.
    let (mean, band) = five_sigma_band(STOCK as f64, entered_a as f64, entered_b as f64);
    let a = drawn.won.0 as f64;
    assert!(
        (a - mean).abs() <= band,
        "group A won {a} of {STOCK}, expected {mean:.1} ± {band:.1} (5 sigma); seed {seed}"
    );
    assert_eq!(rec["order_matches_seed"], true);
    assert_exact_books(&stack, "fair", STOCK, &drawn).await;

    // The same load without a draw (the sale's own window 0): first come,
    // first served, so the group 300 ms ahead takes nearly everything it
    // asks for. At most 80 (one item each); on the loaded machine it won
    // 76 to 80 (B's first buys mingle with A's last). 70 leaves room for
    // more mingling and is still far above the draw's bound with every
    // buyer in (50 + 15.4 = 65.4): the check above would catch a draw
    // that served arrival order.
    let buyers = groups(&stack, "fcfs", SIZE).await;
    let starts = put_sale(
        &stack,
        "fcfs",
        STOCK,
        1,
        Duration::from_millis(1500),
        Some(0),
    )
    .await;
    // B 300 ms behind: on a loaded machine A's 80 sends can take longer
    // than 50 ms, and the control is about arrival order, not the gap.
    let first_come = two_groups(&stack, "fcfs", starts, Duration::from_millis(300), buyers).await;
    eprintln!(
        "no draw: winners A {} B {}",
        first_come.won.0, first_come.won.1
    );
    let (_, all_in_band) = five_sigma_band(STOCK as f64, SIZE as f64, SIZE as f64);
    assert!(
        70.0 > 50.0 + all_in_band,
        "the threshold below must lie outside the draw's band"
    );
    assert!(
        first_come.won.0 >= 70,
        "without a draw the early group should win nearly all of its {SIZE}, won {}",
        first_come.won.0
    );
    let (status, _) = stack
        .admin(reqwest::Method::GET, "/admin/sales/fcfs/draw", None)
        .await;
    assert_eq!(status, 404, "a sale without a draw has no record");
    assert_exact_books(&stack, "fcfs", STOCK, &first_come).await;

    // The gateway counts what it did.
    let metrics = stack.gateway_metrics_text().await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name}: {metrics}"))
    };
    assert_eq!(value("flashgate_draw_entrants_total "), entrants as f64);
    assert_eq!(value("flashgate_draw_winners_total "), STOCK as f64);
    assert_eq!(
        value("flashgate_draw_settle_seconds_count "),
        entrants as f64
    );
}

/// Decides the entrants in `order` by the buy rules (per-user limit, then
/// stock), as the draw must: entry number -> outcome.
fn expected_outcomes(
    order: &[u64],
    users: &HashMap<u64, String>,
    stock: i64,
    limit: i64,
) -> HashMap<u64, &'static str> {
    let (mut left, mut bought) = (stock, HashMap::<&str, i64>::new());
    let mut out = HashMap::new();
    for e in order {
        let user = users[e].as_str();
        let outcome = if *bought.get(user).unwrap_or(&0) >= limit {
            "limit_reached"
        } else if left <= 0 {
            "sold_out"
        } else {
            left -= 1;
            *bought.entry(user).or_default() += 1;
            "won"
        };
        out.insert(*e, outcome);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_share_one_draw_that_keeps_limits_replays_and_its_audit() {
    let stack = stack_with_draws("").await;
    let (_second, second_addr) = stack.start_second_gateway();

    // Bad windows are refused by name and change nothing.
    for bad in [-1, 60_001] {
        let body = json!({"name": "x", "stock": 1, "starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-02T00:00:00Z", "draw_window_ms": bad});
        let (status, v) = stack
            .admin(reqwest::Method::PUT, "/admin/sales/bad", Some(body))
            .await;
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("bad_request")),
            "{v}"
        );
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("draw_window_ms:"),
            "{v}"
        );
    }
    let (status, _) = stack
        .admin(reqwest::Method::GET, "/admin/sales/bad", None)
        .await;
    assert_eq!(status, 404);

    // 6 items, at most 2 per user, a 400 ms window of the sale's own.
    const STOCK: i64 = 6;
    let starts = put_sale(
        &stack,
        "shared",
        STOCK,
        2,
        Duration::from_millis(2000),
        Some(400),
    )
    .await;
    let gateways = [stack.gateway_addr, second_addr];
    let http = reqwest::Client::new();
    sleep_until_ms(starts + 5).await;
    // 12 users on alternating gateways; "greedy" sends 4 keys, 2 through
    // each gateway (only 2 may enter: the per-user limit caps a user's
    // entries); "twice" sends one key to both gateways at once.
    let mut sends = Vec::new();
    for i in 0..12 {
        sends.push((
            format!("user{i:02}"),
            format!("k-user{i:02}"),
            gateways[i % 2],
        ));
    }
    for i in 0..4 {
        sends.push((
            "greedy".to_owned(),
            format!("k-greedy-{i}"),
            gateways[i % 2],
        ));
    }
    sends.push(("twice".to_owned(), "k-twice".to_owned(), gateways[0]));
    sends.push(("twice".to_owned(), "k-twice".to_owned(), gateways[1]));
    let tasks: Vec<_> = sends
        .iter()
        .cloned()
        .map(|(user, key, gateway)| {
            let http = http.clone();
            tokio::spawn(async move { buy(&http, gateway, "shared", &user, &key).await })
        })
        .collect();
    // A retry of a held buy while the draw is still open joins its entry.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let retried = buy(&http, gateways[1], "shared", "user00", "k-user00").await;
    let mut answers = Vec::new();
    for (task, (user, key, _)) in tasks.into_iter().zip(&sends) {
        let (status, body) = task.await.unwrap();
        assert!(
            matches!(status, 202 | 201 | 409 | 410),
            "{user}/{key}: no final answer: {status} {body}"
        );
        answers.push((user.clone(), key.clone(), status, body));
    }
    let first_user00 = answers.iter().find(|(u, ..)| u == "user00").unwrap();
    let won = |s: u16| s == 201 || s == 202;
    assert_eq!(
        won(retried.0),
        won(first_user00.2),
        "the retry joined the entry: {retried:?} {first_user00:?}"
    );
    assert_eq!(
        retried.1["reservation_id"],
        first_user00.3["reservation_id"]
    );

    // The record: every buy entered once (the re-sends joined), across
    // both gateways, greedy's with no more entries than its limit, and its
    // order is the one its seed gives.
    let rec = record(&stack, "shared").await;
    let entrants = rec["entrants"].as_array().unwrap();
    assert_eq!(
        entrants.len(),
        12 + 2 + 1,
        "one entry per buy, whatever gateway, re-sends joined, at most 2 per user"
    );
    let seed = rec["state"]["seed"].as_str().unwrap();
    let order: Vec<u64> = rec["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        order,
        decided_order(seed, entrants.len() as u64),
        "the order recomputed from the seed (docs/RELIABILITY.md)"
    );
    assert_eq!(rec["order_matches_seed"], true);
    // Each outcome is what the buy rules give in that order.
    let users: HashMap<u64, String> = entrants
        .iter()
        .map(|e| {
            (
                e[0].as_u64().unwrap(),
                e[1]["user"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = expected_outcomes(&order, &users, STOCK, 2);
    let recorded: HashMap<u64, String> = rec["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o[0].as_u64().unwrap(),
                o[1]["o"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(recorded.len(), entrants.len());
    for (e, outcome) in &expected {
        assert_eq!(recorded[e], *outcome, "entry {e} ({})", users[e]);
    }
    // What buyers were told matches the record; the per-user limit held.
    let by_key: HashMap<String, u64> = entrants
        .iter()
        .map(|e| {
            (
                format!(
                    "{}/{}",
                    e[1]["user"].as_str().unwrap(),
                    e[1]["idem"].as_str().unwrap()
                ),
                e[0].as_u64().unwrap(),
            )
        })
        .collect();
    for (user, key, status, body) in &answers {
        let Some(&e) = by_key.get(&format!("{user}/{key}")) else {
            // Not entered: a user already holding their limit of entries.
            assert_eq!(
                (user.as_str(), *status, body["code"].as_str()),
                ("greedy", 409, Some("limit_reached")),
                "{key}: {body}"
            );
            continue;
        };
        let want = match expected[&e] {
            "won" => vec![201, 202],
            "limit_reached" => vec![409],
            _ => vec![410],
        };
        assert!(
            want.contains(status),
            "{user}/{key}: told {status} {body}, the draw says {}",
            expected[&e]
        );
    }
    let greedy_won = answers
        .iter()
        .filter(|(u, _, s, _)| u == "greedy" && (*s == 201 || *s == 202))
        .count();
    assert!(
        greedy_won <= 2,
        "the per-user limit holds in the draw: greedy won {greedy_won}"
    );
    let twice: Vec<_> = answers.iter().filter(|(u, ..)| u == "twice").collect();
    assert_eq!(
        twice[0].2 == 410,
        twice[1].2 == 410,
        "one key, one answer: {twice:?}"
    );
    assert_eq!(twice[0].3["reservation_id"], twice[1].3["reservation_id"]);

    // Exact books; after the draw the sale is first come, first served.
    assert_eq!(stack.remaining("shared").await, 0);
    assert_eq!(stack.stream_len("shared").await, STOCK);
    let (orders, _, _) = stack
        .wait_orders("shared", STOCK, Duration::from_secs(20))
        .await;
    assert_eq!(orders, STOCK);
    let (late, body) = buy(&http, gateways[1], "shared", "late", "k-late").await;
    assert_eq!(
        (late, body["code"].as_str()),
        (410, Some("sold_out")),
        "{body}"
    );
    // This gateway counted its share of the entrants.
    let text = stack.gateway_metrics_text().await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("flashgate_draw_entrants_total ") && !l.ends_with(" 0")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entrant_held_past_the_settle_time_gets_503_and_its_retry_the_outcome() {
    let stack = stack_with_draws("settle_ms = 300\n").await;
    // A window of the sale's own, 1 s: the pause sent 80 ms after the buy
    // lands within it even when a loaded machine is slow to apply it.
    let starts = put_sale(
        &stack,
        "held",
        1,
        1,
        Duration::from_millis(1500),
        Some(1000),
    )
    .await;
    sleep_until_ms(starts + 5).await;
    let http = reqwest::Client::new();
    let task = {
        let (http, gateway) = (http.clone(), stack.gateway_addr);
        tokio::spawn(async move { buy(&http, gateway, "held", "solo", "k-solo").await })
    };
    // Paused within the window: the draw decides nothing until resumed.
    tokio::time::sleep(Duration::from_millis(80)).await;
    let (status, v) = stack
        .admin(reqwest::Method::POST, "/admin/sales/held/pause", None)
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, body) = task.await.unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert_eq!(
        stack.remaining("held").await,
        1,
        "nothing decided while paused"
    );
    let (status, v) = stack
        .admin(reqwest::Method::POST, "/admin/sales/held/resume", None)
        .await;
    assert_eq!(status, 200, "{v}");
    // The retry joins the entry; the draw runs and it wins.
    let mut answer = (0, Value::Null);
    for _ in 0..20 {
        answer = buy(&http, stack.gateway_addr, "held", "solo", "k-solo").await;
        if answer.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answer.0 == 201 || answer.0 == 202, "{:?}", answer);
    let rec = record(&stack, "held").await;
    assert_eq!(
        rec["entrants"].as_array().unwrap().len(),
        1,
        "the retry joined the entry"
    );
    assert_eq!(stack.stream_len("held").await, 1);
}
