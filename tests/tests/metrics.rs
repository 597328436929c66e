//! Metrics tell the truth: a scripted sale's outcomes, as the clients saw
//! them, equal the counters scraped from the gateway's and the backend's
//! `/metrics`, and both expositions pass `promtool check metrics`.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use flashgate_tests::{token, Stack, StackOptions};

/// The outcome label a client can infer from a buy answer.
fn client_label(
    resp_status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &serde_json::Value,
) -> String {
    if headers.get("idempotent-replayed").is_some() {
        return "replay".into();
    }
    if resp_status == 201 || resp_status == 202 {
        return "won".into();
    }
    let code = body["code"].as_str().unwrap_or("none").to_owned();
    if code == "rate_limited" {
        let policy = headers["ratelimit-policy"].to_str().unwrap();
        let scope = policy
            .trim_start_matches("\"buy-")
            .split('"')
            .next()
            .unwrap();
        return format!("rate_limited_{scope}");
    }
    code
}

/// `name{label="value"} N` lines of one metric, keyed by the label value.
fn counters(text: &str, metric: &str, label: &str) -> BTreeMap<String, f64> {
    let prefix = format!("{metric}{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once("} ")?;
            let key = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{label}=\"")))?
                .trim_end_matches('"');
            Some((key.to_owned(), value.parse::<f64>().ok()?))
        })
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_insert(0.0) += v;
            m
        })
}

fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (make test installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_counters_equal_what_clients_saw() {
    let stack = Stack::start(StackOptions {
        extra_toml: "[limits.buy]\nuser = { per_second = 1, burst = 3 }\n".into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("metered", 3, 1).await;
    stack.open_sale("plenty", 100, 100).await;
    stack
        .put_sale(
            "soon",
            5,
            1,
            Duration::from_secs(600),
            Duration::from_secs(600),
        )
        .await;

    let mut seen: BTreeMap<String, f64> = BTreeMap::new();
    let send = |sale: &'static str, auth: Option<String>, key: Option<&'static str>| {
        let mut req = stack
            .http
            .post(stack.url(&format!("/flashgate/api/sales/{sale}/buy")));
        if let Some(t) = auth {
            req = req.bearer_auth(t);
        }
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        async move {
            let resp = req.send().await.unwrap();
            let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            client_label(status, &headers, &body)
        }
    };
    let mut record = |label: String| *seen.entry(label).or_insert(0.0) += 1.0;

    record(send("metered", Some(token("alice")), Some("a1")).await); // won
    record(send("metered", Some(token("alice")), Some("a1")).await); // replay
    record(send("metered", Some(token("alice")), Some("a2")).await); // limit_reached
    for user in ["b", "c", "d", "e", "f"] {
        record(send("metered", Some(token(user)), None).await); // 2 won, then sold_out
    }
    for _ in 0..4 {
        record(send("plenty", Some(token("hammer")), None).await); // 3 won, then rate_limited_user
    }
    record(send("plenty", None, None).await); // unauthorized
    record(send("nosuch", Some(token("g")), None).await); // not_found
    record(send("soon", Some(token("h")), None).await); // not_started

    for expected in [
        "won",
        "replay",
        "limit_reached",
        "sold_out",
        "rate_limited_user",
        "unauthorized",
        "not_found",
        "not_started",
    ] {
        assert!(
            seen.contains_key(expected),
            "the script did not produce {expected}: {seen:?}"
        );
    }

    // A request is counted once its answer is written: the last answer
    // can reach the client a moment before its counts.
    let answered = seen.values().sum::<f64>();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let gateway_text = loop {
        let text = stack.gateway_metrics_text().await;
        let counted = counters(&text, "flashgate_requests_total", "route").get("buy")
            == Some(&answered)
            && counters(&text, "flashgate_buy_outcomes_total", "outcome") == seen;
        if counted || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let scraped = counters(&gateway_text, "flashgate_buy_outcomes_total", "outcome");
    assert_eq!(
        scraped, seen,
        "gateway buy outcome counters differ from what clients saw"
    );
    let requests = counters(&gateway_text, "flashgate_requests_total", "route");
    assert_eq!(requests.get("buy").copied(), Some(answered));
    promtool_check(&gateway_text);

    // Every winner is persisted, and the backend counts it once.
    let winners = seen["won"] as i64;
    assert_eq!(
        stack
            .wait_orders("metered", 3, Duration::from_secs(20))
            .await
            .0
            + stack
                .wait_orders("plenty", 3, Duration::from_secs(20))
                .await
                .0,
        winners
    );
    let backend_text = stack.backend_metrics_text().await;
    let created: f64 = counters(
        &backend_text,
        "flashgate_backend_orders_created_total",
        "source",
    )
    .values()
    .sum();
    assert_eq!(created as i64, winners, "{backend_text}");
    promtool_check(&backend_text);
}

/// Endings OpenMetrics gives a family's series (and drops from a counter's
/// family name): a family named as another plus one of them is one family
/// with it to an OpenMetrics or OpenTelemetry scraper, and invalid.
const RESERVED_SUFFIXES: [&str; 5] = ["_total", "_count", "_sum", "_bucket", "_created"];

/// Every family of the gateway's registry as the server builds it (the
/// shop cache on, so its families are there too).
fn gateway_families() -> Vec<String> {
    struct Secrets;
    impl flashgate_common::config::Env for Secrets {
        fn var(&self, name: &str) -> Option<String> {
            match name {
                flashgate_common::config::ENV_JWT_SECRET => {
                    Some(flashgate_tests::JWT_SECRET.into())
                }
                flashgate_common::config::ENV_INTERNAL_TOKEN => {
                    Some(flashgate_tests::INTERNAL_TOKEN.into())
                }
                _ => None,
            }
        }
    }
    let static_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../static");
    let text = format!(
        "[gateway]\nstatic_dir = \"{}\"\n[shop.cache]\nenabled = true\n",
        static_dir.display()
    );
    let config = flashgate_common::config::Config::from_toml_str(&text, &Secrets, 0).unwrap();
    let (gateway, _worker) =
        flashgate_gateway::server::build_gateway(std::sync::Arc::new(config)).unwrap();
    gateway.metrics.registry.family_names()
}

#[test]
fn no_metric_family_is_named_as_another_plus_an_openmetrics_suffix() {
    let gateway = gateway_families();
    let backend = flashgate_backend::metrics::Metrics::register()
        .registry
        .family_names();
    // Families with no series yet are listed too.
    for name in [
        "flashgate_tls_reloads_total",
        "flashgate_shop_cache_evictions_total",
        "flashgate_draw_runs_total",
    ] {
        assert!(
            gateway.iter().any(|n| n == name),
            "{name} missing from {gateway:?}"
        );
    }
    assert!(
        backend
            .iter()
            .any(|n| n == "flashgate_sale_bucket_backlog_reservations"),
        "{backend:?}"
    );
    let all: std::collections::BTreeSet<&str> =
        gateway.iter().chain(&backend).map(String::as_str).collect();
    let clashes: Vec<String> = all
        .iter()
        .flat_map(|base| RESERVED_SUFFIXES.iter().map(move |suffix| (base, suffix)))
        .filter(|(base, suffix)| all.contains(format!("{base}{suffix}").as_str()))
        .map(|(base, suffix)| format!("{base} and {base}{suffix}"))
        .collect();
    assert!(
        clashes.is_empty(),
        "families named as another plus an OpenMetrics suffix: {clashes:?}"
    );
}
