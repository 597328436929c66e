//! The limits shipped in `config/flashgate.toml`, against the real stack
//! started from that file: one user hammering buy is turned away with 429
//! and the RateLimit headers, while what a sale page and the demo `curl`
//! send is never limited.

use flashgate_tests::{token, Stack, StackOptions};
use serde_json::Value;

/// The sale `config/flashgate.toml` declares.
const SALE: &str = "demo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_hammering_buy_on_the_shipped_config_gets_429_with_ratelimit_headers() {
    let stack = Stack::start(StackOptions::shipped()).await;
    let bearer = token("hammer");
    let url = stack.url(&format!("/flashgate/api/sales/{SALE}/buy"));
    let mut tasks = Vec::new();
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    for i in 0..400 {
        let (http, url, bearer, in_flight) = (
            stack.http.clone(),
            url.clone(),
            bearer.clone(),
            in_flight.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = in_flight.acquire_owned().await.unwrap();
            let resp = http
                .post(url)
                .bearer_auth(bearer)
                .header("Idempotency-Key", format!("hammer-{i}"))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            let headers = (
                header("retry-after"),
                header("ratelimit-policy"),
                header("ratelimit"),
            );
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, headers, body)
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let won = outcomes.iter().filter(|(s, ..)| *s == 202).count();
    assert_eq!(won, 1, "the per-user limit of the sale still holds");
    let limited: Vec<_> = outcomes.iter().filter(|(s, ..)| *s == 429).collect();
    assert!(!limited.is_empty(), "400 buys of one user and not one 429");
    for (_, (retry_after, policy, state), body) in limited {
        assert_eq!(body["code"], "rate_limited");
        assert!(
            retry_after
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|s| s >= 1),
            "{retry_after:?}"
        );
        assert!(
            policy
                .as_deref()
                .is_some_and(|p| p.starts_with("\"buy-") && p.contains(";q=") && p.contains(";w=")),
            "{policy:?}"
        );
        assert!(
            state
                .as_deref()
                .is_some_and(|s| s.starts_with("\"buy-") && s.contains(";r=0;t=")),
            "{state:?}"
        );
    }
}

/// What one buyer's sale page sends, faster than a page would: the page,
/// its state polls, a buy with its network retries (same key), and the
/// reservation polls; then the demo `curl`, twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_pages_traffic_and_the_demo_curl_on_the_shipped_config_are_never_limited() {
    let stack = Stack::start(StackOptions::shipped()).await;
    let buyers: Vec<String> = (0..10).map(|i| format!("page-buyer-{i}")).collect();
    let mut statuses = Vec::new();
    for user in &buyers {
        let bearer = token(user);
        let get = |path: String| stack.http.get(stack.url(&path)).bearer_auth(&bearer).send();
        statuses.push((
            "page",
            get(format!("/flashgate/sales/{SALE}"))
                .await
                .unwrap()
                .status()
                .as_u16(),
        ));
        for _ in 0..3 {
            statuses.push((
                "state",
                get(format!("/flashgate/api/sales/{SALE}"))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            ));
        }
        let key = format!("click-{user}");
        let mut rid = None;
        for _ in 0..3 {
            let (status, body) =
                flashgate_tests::buy(&stack.http, stack.gateway_addr, SALE, &bearer, Some(&key))
                    .await;
            statuses.push(("buy", status));
            rid = rid.or(body["reservation_id"].as_str().map(str::to_owned));
        }
        let rid = rid.expect("the buyer won");
        for _ in 0..3 {
            statuses.push((
                "reservation",
                get(format!("/flashgate/api/reservations/{rid}"))
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            ));
        }
    }
    for _ in 0..2 {
        let (status, _) = flashgate_tests::buy(
            &stack.http,
            stack.gateway_addr,
            SALE,
            &token("demo-user"),
            Some("demo-curl"),
        )
        .await;
        statuses.push(("curl", status));
    }
    let limited: Vec<_> = statuses.iter().filter(|(_, s)| *s == 429).collect();
    assert!(limited.is_empty(), "limited: {limited:?}");
    assert!(statuses.iter().all(|(_, s)| *s < 400), "{statuses:?}");
}
