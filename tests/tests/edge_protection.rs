//! Edge protection against the real stack: token buckets with their
//! headers, trusted-proxy handling, deny lists reloaded live, the sold-out
//! short-circuit across gateways (keyed buys included) and its end when
//! items come back, and a stalled Redis.

use std::time::{Duration, Instant};

use flashgate_tests::{buy_all, random_user, token, token_with, Attempt, Stack, StackOptions};
use serde_json::Value;

async fn buy_status(stack: &Stack, user: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = stack
        .http
        .post(stack.url("/flashgate/api/sales/edge/buy"))
        .bearer_auth(token(user));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn assert_limited(resp: &reqwest::Response, policy: &str) {
    assert_eq!(resp.status().as_u16(), 429);
    let h = resp.headers();
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    let p = h["ratelimit-policy"].to_str().unwrap();
    assert!(p.starts_with(&format!("\"{policy}\";q=")), "{p}");
    let state = h["ratelimit"].to_str().unwrap();
    assert!(
        state.starts_with(&format!("\"{policy}\";r=0;t=")),
        "{state}"
    );
}

async fn stack_with(extra: &str) -> Stack {
    let stack = Stack::start(StackOptions {
        extra_toml: extra.into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("edge", 1_000_000, 1_000_000).await;
    stack
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_their_bucket_gets_429_with_ratelimit_headers() {
    let stack = stack_with("[limits.buy]\nuser = { per_second = 1, burst = 2 }\n").await;
    for _ in 0..2 {
        assert_eq!(
            buy_status(&stack, "hammer", &[]).await.status().as_u16(),
            202
        );
    }
    let resp = buy_status(&stack, "hammer", &[]).await;
    assert_limited(&resp, "buy-user");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(
        buy_status(&stack, "someone-else", &[])
            .await
            .status()
            .as_u16(),
        202
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buy_with_a_bad_body_spends_no_token_of_the_users_bucket() {
    let stack = stack_with("[limits.buy]\nuser = { per_second = 1, burst = 2 }\n").await;
    for _ in 0..5 {
        let resp = stack
            .http
            .post(stack.url("/flashgate/api/sales/edge/buy"))
            .bearer_auth(token("careless"))
            .body("[1]")
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            400,
            "a bad body is a 400, never a 429"
        );
    }
    for _ in 0..2 {
        assert_eq!(
            buy_status(&stack, "careless", &[]).await.status().as_u16(),
            202,
            "the whole burst is left for good buys"
        );
    }
    assert_limited(&buy_status(&stack, "careless", &[]).await, "buy-user");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ip_over_its_bucket_gets_429_whoever_the_user() {
    let stack = stack_with("[limits.buy]\nip = { per_second = 1, burst = 3 }\n").await;
    for i in 0..3 {
        assert_eq!(
            buy_status(&stack, &format!("u{i}"), &[])
                .await
                .status()
                .as_u16(),
            202
        );
    }
    assert_limited(&buy_status(&stack, "u9", &[]).await, "buy-ip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_buy_body_is_refused_after_the_ip_bucket_but_before_the_token_is_checked() {
    let stack = stack_with("[limits.buy]\nip = { per_second = 1, burst = 3 }\n").await;
    let bad_body = |authorization: Option<String>| {
        let mut req = stack
            .http
            .post(stack.url("/flashgate/api/sales/edge/buy"))
            .body("\"not an object\"");
        if let Some(a) = authorization {
            req = req.header("Authorization", a);
        }
        req.send()
    };
    let forged = format!("Bearer {}", token_with("u0", "not-the-secret", 3600));
    for authorization in [None, Some(forged), Some(format!("Bearer {}", token("u0")))] {
        let resp = bad_body(authorization).await.unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert_eq!(
            (status, v["code"].as_str()),
            (400, Some("bad_request")),
            "{v}"
        );
    }
    // The IP's burst of three went to them: the next body is not read.
    assert_limited(&bad_body(None).await.unwrap(), "buy-ip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_bucket_limits_all_users_together() {
    let stack = stack_with("[limits.buy]\nglobal = { per_second = 1, burst = 4 }\n").await;
    for i in 0..4 {
        assert_eq!(
            buy_status(&stack, &format!("g{i}"), &[])
                .await
                .status()
                .as_u16(),
            202
        );
    }
    assert_limited(&buy_status(&stack, "g9", &[]).await, "buy-global");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy() {
    // Untrusted peer (loopback is not in 10.0.0.0/8): the header cannot change the key.
    let stack = stack_with("[limits]\ntrusted_proxies = [\"10.0.0.0/8\"]\n[limits.read]\nip = { per_second = 1, burst = 1 }\n").await;
    let get = |xff: &'static str| {
        stack
            .http
            .get(stack.url("/flashgate/api/sales/edge"))
            .header("X-Forwarded-For", xff)
            .send()
    };
    assert_eq!(get("198.51.100.1").await.unwrap().status().as_u16(), 200);
    assert_limited(&get("198.51.100.2").await.unwrap(), "read-ip");
    drop(stack);

    // Trusted peer: each forwarded client gets its own bucket.
    let stack = stack_with("[limits]\ntrusted_proxies = [\"127.0.0.1/32\"]\n[limits.read]\nip = { per_second = 1, burst = 1 }\n").await;
    let get = |xff: &'static str| {
        stack
            .http
            .get(stack.url("/flashgate/api/sales/edge"))
            .header("X-Forwarded-For", xff)
            .send()
    };
    assert_eq!(get("198.51.100.1").await.unwrap().status().as_u16(), 200);
    assert_eq!(get("198.51.100.2").await.unwrap().status().as_u16(), 200);
    assert_limited(&get("198.51.100.1").await.unwrap(), "read-ip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_lists_apply_without_restart() {
    let stack = stack_with("").await;
    assert_eq!(buy_status(&stack, "eve", &[]).await.status().as_u16(), 202);
    stack.edit_config(|t| format!("{t}\n[deny]\nusers = [\"eve\"]\nips = [\"203.0.113.0/24\"]\n"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    while Instant::now() < deadline {
        status = buy_status(&stack, "eve", &[]).await.status().as_u16();
        if status == 403 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 403, "deny list not applied");
    assert_eq!(buy_status(&stack, "adam", &[]).await.status().as_u16(), 202);
    assert!(stack.log("flashgate").contains("config reloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sell_out_buys_never_reach_the_script_on_any_gateway() {
    let stack = Stack::start(StackOptions::default()).await;
    let (_second, second_addr) = stack.start_second_gateway();
    // Both gateways subscribed to sale events.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("fg:events")
            .query_async(&mut stack.redis.conn().await)
            .await
            .unwrap();
        if subs[0].1 >= 2 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.open_sale("gone", 5, 1).await;
    let sellout = buy_all(
        stack.gateway_addr,
        "gone",
        (0..50)
            .map(|_| Attempt {
                user: random_user(),
                idempotency_key: None,
            })
            .collect(),
        16,
    )
    .await;
    assert_eq!(sellout.iter().filter(|o| o.won()).count(), 5);
    assert!(sellout.iter().any(|o| o.status == 410));

    // Only the deduct script counts: the backend runs its own scripts on timers.
    // The buy path's deduct script (`lua/deduct_batch.lua`).
    let deduct_sha = flashgate_common::scripts::DEDUCT_BATCH
        .get_hash()
        .to_owned();
    let monitor = stack.redis.monitor().await;
    let attempts = || {
        (0..10_000)
            .map(|_| Attempt {
                user: random_user(),
                idempotency_key: None,
            })
            .collect::<Vec<_>>()
    };
    let first = buy_all(stack.gateway_addr, "gone", attempts(), 64).await;
    let second = buy_all(second_addr, "gone", attempts(), 64).await;
    assert!(
        first.iter().chain(&second).all(|o| o.status == 410),
        "every late buyer is told sold out"
    );
    let deducts = monitor
        .commands()
        .await
        .into_iter()
        .filter(|c| c.contains(&deduct_sha))
        .count();
    assert_eq!(deducts, 0, "a sold-out buy ran the deduct script");

    // An operator restock clears the flag everywhere.
    stack.open_sale("gone", 6, 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    while Instant::now() < deadline && status != 202 {
        status = flashgate_tests::buy(
            &stack.http,
            second_addr,
            "gone",
            &token(&random_user()),
            None,
        )
        .await
        .0;
    }
    assert_eq!(
        status, 202,
        "restock did not reopen the sale on the second gateway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_sale_answers_late_buyers_without_the_script_while_a_winners_retry_replays() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("kept", 3, 1).await;
    let winners: Vec<String> = (0..3).map(|_| random_user()).collect();
    for w in &winners {
        assert_eq!(stack.buy("kept", w, Some("k1")).await.0, 202);
    }
    let (status, v) = stack.buy("kept", &random_user(), None).await;
    assert_eq!((status, v["code"].as_str()), (410, Some("sold_out")), "{v}");

    // The backend is frozen while the calls are counted: its stream
    // maintenance (a script of its own, every ten seconds) would otherwise
    // land in the window now and then. Late buys never reach it.
    let backend = stack.backend.as_ref().expect("the stack's backend");
    backend.signal("STOP");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let scripts_before = stack.redis.command_calls("evalsha").await;
    let unkeyed = (0..50)
        .map(|_| Attempt {
            user: random_user(),
            idempotency_key: None,
        })
        .collect();
    let late = buy_all(stack.gateway_addr, "kept", unkeyed, 16).await;
    assert!(
        late.iter()
            .all(|o| o.status == 410 && o.body["code"] == "sold_out"),
        "every late buyer is told sold out"
    );
    assert_eq!(
        stack.redis.command_calls("evalsha").await,
        scripts_before,
        "an unkeyed buy is answered by the flag"
    );
    backend.signal("CONT");

    // Keyed buys of users who never reserved: answered by the flag and the
    // sale's buyers (checked again with Redis each second, so a slow run
    // may send a few to the script, never most of them).
    let local = |text: String| {
        text.lines()
            .find_map(|l| l.strip_prefix("flashgate_local_decisions_total{decision=\"sold_out\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let local_before = local(stack.gateway_metrics_text().await);
    let late_users: Vec<String> = (0..50).map(|_| random_user()).collect();
    let keyed = late_users
        .iter()
        .map(|u| Attempt {
            user: u.clone(),
            idempotency_key: Some("late".into()),
        })
        .collect();
    let late = buy_all(stack.gateway_addr, "kept", keyed, 16).await;
    assert!(
        late.iter()
            .all(|o| o.status == 410 && o.body["code"] == "sold_out"),
        "every late keyed buyer is told sold out"
    );
    let answered_here = local(stack.gateway_metrics_text().await) - local_before;
    assert!(
        answered_here >= 25.0,
        "{answered_here} of 50 late keyed buys answered without the script"
    );
    // A winner's retry replays its win.
    let (status, v) = stack.buy("kept", &winners[0], Some("k1")).await;
    assert!(
        matches!(status, 201 | 202) && v["reservation_id"].is_string(),
        "{status} {v}"
    );
    // An item comes back: a new key buys it.
    stack
        .put_sale(
            "kept",
            4,
            1,
            std::time::Duration::ZERO,
            std::time::Duration::from_secs(3600),
        )
        .await;
    let mut won = 0;
    for _ in 0..50 {
        if stack.buy("kept", &late_users[1], Some("fresh")).await.0 == 202 {
            won += 1;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(won, 1, "the restocked item is sold to a new key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_sold_out_sale_a_forged_token_is_refused_alike_whoever_it_names_and_the_winner_replays(
) {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("claims", 1, 1).await;
    let winner = random_user();
    assert_eq!(stack.buy("claims", &winner, Some("k1")).await.0, 202);
    // A signed-in non-buyer's keyed buy: the script proves the sale sold
    // out and the gateway reads its buyers.
    let (status, v) = stack.buy("claims", &random_user(), Some("late")).await;
    assert_eq!((status, v["code"].as_str()), (410, Some("sold_out")), "{v}");
    let send = |token: String, key: &'static str, body: &'static str| {
        stack
            .http
            .post(stack.url("/flashgate/api/sales/claims/buy"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .body(body)
            .send()
    };
    let forged = |user: &str| token_with(user, "not-the-secret", 3600);
    // No answer to a token nobody signed may depend on whether the user it
    // names bought: not its status, not whether its body was read.
    for (body, refusal) in [("", (401, "unauthorized")), ("\"x\"", (400, "bad_request"))] {
        let mut answers = Vec::new();
        for (user, key) in [(random_user(), "late"), (winner.clone(), "k1")] {
            let resp = send(forged(&user), key, body).await.unwrap();
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap();
            answers.push((status, v["code"].as_str().map(str::to_owned)));
        }
        let refusal = (refusal.0, Some(refusal.1.to_owned()));
        assert_eq!(answers, [refusal.clone(), refusal], "body {body:?}");
    }
    // The winner's own token replays the win.
    let (status, v) = stack.buy("claims", &winner, Some("k1")).await;
    assert!(
        matches!(status, 201 | 202) && v["reservation_id"].is_string(),
        "{status} {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_sale_sells_again_soon_after_an_unpaid_orders_item_comes_back() {
    let stack = Stack::start(StackOptions::default()).await;
    let now = flashgate_common::now_ms();
    let body = serde_json::json!({
        "name": "Back", "stock": 1, "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(now - 1000), "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        "payment_timeout_seconds": 1,
    });
    let (status, v) = stack
        .admin(reqwest::Method::PUT, "/admin/sales/back", Some(body))
        .await;
    assert_eq!(status, 201, "{v}");
    let (status, won) = stack.buy("back", &random_user(), None).await;
    assert_eq!(status, 202, "{won}");
    let (status, v) = stack.buy("back", &random_user(), None).await;
    assert_eq!((status, v["code"].as_str()), (410, Some("sold_out")), "{v}");

    // Not paid in time: the item goes back to the stock.
    let deadline = Instant::now() + Duration::from_secs(20);
    while stack.remaining("back").await != 1 {
        assert!(
            Instant::now() < deadline,
            "the unpaid order's item did not come back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every gateway hears of it: the sale is not answered sold out for the
    // rest of the flag's life.
    let buyer = random_user();
    let deadline = Instant::now() + Duration::from_secs(3);
    let (mut status, mut v) = (0, Value::Null);
    while Instant::now() < deadline && status != 202 {
        (status, v) = stack.buy("back", &buyer, None).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 202, "the returned item is not on sale: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_gets_503s_not_hangs_and_sales_resume_after() {
    let stack = Stack::start(StackOptions {
        redis_timeout_ms: 200,
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("stall", 100, 1).await;
    // Warm the gateway's local copy of the window.
    assert_eq!(stack.buy("stall", &random_user(), None).await.0, 202);

    stack.redis.proc.signal("STOP");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for _ in 0..10 {
        let (status, body) = flashgate_tests::buy(
            &client,
            stack.gateway_addr,
            "stall",
            &token(&random_user()),
            None,
        )
        .await;
        assert_eq!((status, body["code"].as_str()), (503, Some("unavailable")));
    }
    stack.redis.proc.signal("CONT");

    let deadline = Instant::now() + Duration::from_secs(15);
    let mut status = 0;
    while Instant::now() < deadline && status != 202 {
        status = stack.buy("stall", &random_user(), None).await.0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 202, "sales did not resume after SIGCONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_pauses_while_its_unpersisted_backlog_is_too_large_and_resumes_when_it_drains() {
    pauses_on_its_backlog_and_resumes("backlog", 1).await;
}

/// A bucketed sale's reservations wait in its buckets' streams: the pause
/// counts them all, and the backend's gauges show each bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_sale_pauses_on_the_backlog_of_all_its_buckets_streams() {
    let stack = pauses_on_its_backlog_and_resumes("backlog-b", 3).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = stack.backend_metrics_text().await;
        let gauge = |name: &str, bucket: u32| -> Option<i64> {
            let prefix = format!("{name}{{bucket=\"{bucket}\",sale=\"backlog-b\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.parse().ok())
        };
        let left: Option<Vec<i64>> = (0..3)
            .map(|k| gauge("flashgate_sale_bucket_remaining_items", k))
            .collect();
        let backlog: Option<Vec<i64>> = (0..3)
            .map(|k| gauge("flashgate_sale_bucket_backlog_reservations", k))
            .collect();
        let remaining =
            flashgate_common::transfer::left(&mut stack.redis_handle().await, "backlog-b", 3)
                .await
                .unwrap();
        if let (Some(left), Some(backlog)) = (left, backlog) {
            if left.iter().sum::<i64>() == remaining && backlog.iter().all(|b| *b == 0) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "per-bucket gauges never matched the sale ({remaining} left): {text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Pauses sale `id` (of `buckets` buckets) by letting its winners pile up
/// unpersisted, then resumes it by starting the backend again.
async fn pauses_on_its_backlog_and_resumes(id: &str, buckets: u32) -> Stack {
    let mut stack = Stack::start(StackOptions {
        extra_toml: String::new(),
        ..StackOptions::default()
    })
    .await;
    stack.edit_config(|t| {
        t.replace(
            "[gateway]\n",
            "[gateway]\nbacklog_pause_threshold = 4\nbacklog_check_ms = 50\n",
        )
    });
    stack.kill_gateway();
    stack.start_gateway();
    if buckets > 1 {
        stack.open_bucketed_sale(id, 100, 1, buckets).await;
    } else {
        stack.open_sale(id, 100, 1).await;
    }
    stack.kill_backend();

    // Winners pile up in the stream with nobody persisting them.
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        let (status, _) = stack.buy(id, &random_user(), None).await;
        statuses.push(status);
        if status == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        statuses.last(),
        Some(&503),
        "the sale never paused: {statuses:?}"
    );
    let (status, body) = stack.buy(id, &random_user(), None).await;
    assert_eq!((status, body["code"].as_str()), (503, Some("paused")));

    stack.start_backend();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    while Instant::now() < deadline && status != 202 {
        status = stack.buy(id, &random_user(), None).await.0;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status, 202,
        "the sale did not resume after the backlog drained"
    );
    stack
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_switch_pauses_every_sale_at_once() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("sw", 100, 1).await;
    assert_eq!(stack.buy("sw", &random_user(), None).await.0, 202);
    let resp = stack
        .http
        .put(stack.admin_url("/admin/switch"))
        .bearer_auth(flashgate_tests::ADMIN_TOKEN)
        .json(&serde_json::json!({"paused": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut code = String::new();
    while Instant::now() < deadline && code != "paused" {
        code = stack.buy("sw", &random_user(), None).await.1["code"]
            .as_str()
            .unwrap_or("")
            .to_owned();
    }
    assert_eq!(code, "paused");
    stack
        .http
        .put(stack.admin_url("/admin/switch"))
        .bearer_auth(flashgate_tests::ADMIN_TOKEN)
        .json(&serde_json::json!({"paused": false}))
        .send()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    while Instant::now() < deadline && status != 202 {
        status = stack.buy("sw", &random_user(), None).await.0;
    }
    assert_eq!(status, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_pauses_and_resumes_one_sale() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("p1", 100, 1).await;
    stack.open_sale("p2", 100, 1).await;
    let admin = |path: &str| {
        stack
            .http
            .post(stack.admin_url(path))
            .bearer_auth(flashgate_tests::ADMIN_TOKEN)
            .send()
    };
    assert_eq!(
        admin("/admin/sales/p1/pause")
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let (status, body) = stack.buy("p1", &random_user(), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("paused")),
        "{body}"
    );
    assert_eq!(
        stack.buy("p2", &random_user(), None).await.0,
        202,
        "only the paused sale stops"
    );
    let state: serde_json::Value = stack
        .http
        .get(stack.url("/flashgate/api/sales/p1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["state"], "paused");
    assert_eq!(
        admin("/admin/sales/p1/resume")
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    // The gateway answers from its cached window until the resume's
    // announcement reaches it (milliseconds; bounded here by 10 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = stack.buy("p1", &random_user(), None).await;
        if body["code"] != "paused" || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        admin("/admin/sales/nosuch/pause")
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_wide_limit_is_shared_by_every_gateway() {
    let stack = stack_with("[limits.cluster_global]\nper_second = 1\nburst = 2\n").await;
    let (_second, second_addr) = stack.start_second_gateway();
    assert_eq!(stack.buy("edge", "c1", None).await.0, 202);
    assert_eq!(
        flashgate_tests::buy(&stack.http, second_addr, "edge", &token("c2"), None)
            .await
            .0,
        202
    );
    let resp = stack
        .http
        .post(format!("http://{second_addr}/flashgate/api/sales/edge/buy"))
        .bearer_auth(token("c3"))
        .send()
        .await
        .unwrap();
    assert_limited(&resp, "buy-cluster");
}
