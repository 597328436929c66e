//! Redis over TLS (`rediss://`), in the three modes: the processes reach
//! the redis-servers (and the sentinels) only on their TLS ports, on a
//! certificate from a CA the test makes, trusted through `redis.ca_file`;
//! without it, or with another CA there, the certificate is refused.

use std::collections::HashSet;
use std::process::Command;
use std::time::Duration;

use flashgate_tests::pki::{write_replacing, TestCa};
use flashgate_tests::{
    bin, buy_all, get_json, random_user, Attempt, Outcome, RedisMode, Stack, StackOptions,
};

/// `flashgate --config FILE check --connect`.
fn check_connect(stack: &Stack) -> std::process::Output {
    Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&stack.config_path)
        .args(["check", "--connect"])
        .output()
        .unwrap()
}

/// A sale of `stock` through the stack: exactly the stock wins, one order
/// per winner. Buyers come in rounds until one is told sold out: a gateway
/// answers 503 `paused` until it has read the global sale switch, which on
/// a loaded machine may come after it reports ready; that is no answer
/// about the stock. A buy answered 503 `unavailable` (Redis slower than its
/// timeout on a loaded machine) is sent again with its Idempotency-Key, as
/// a client does, until it gets a final answer: a win the first try made
/// is answered again (`202`, or `201` once its order exists), never sold
/// twice.
async fn sells_exactly(stack: &Stack, sale: &str, stock: i64) {
    stack.open_sale(sale, stock, 1).await;
    let mut winners = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let attempts = (0..(stock as usize * 4))
            .map(|_| {
                let user = random_user();
                Attempt {
                    idempotency_key: Some(format!("k-{user}")),
                    user,
                }
            })
            .collect();
        let mut got = buy_all(stack.gateway_addr, sale, attempts, 16).await;
        let answered = |o: &Outcome, code: &str| o.status == 503 && o.body["code"] == code;
        for outcome in &mut got {
            for _ in 0..20 {
                if !answered(outcome, "unavailable") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                let again = buy_all(stack.gateway_addr, sale, vec![outcome.attempt.clone()], 1);
                *outcome = again.await.remove(0);
            }
        }
        let odd: Vec<(u16, &serde_json::Value)> = got
            .iter()
            .filter(|o| ![201, 202, 410].contains(&o.status) && !answered(o, "paused"))
            .map(|o| (o.status, &o.body))
            .collect();
        assert!(
            odd.is_empty(),
            "answers other than won, sold out or paused: {odd:?}\n{}",
            stack.log("flashgate")
        );
        winners.extend(
            got.iter()
                .filter(|o| o.won())
                .map(|o| o.attempt.user.clone()),
        );
        if got.iter().any(|o| o.status == 410) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sale {sale} never sold out: {} wins",
            winners.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(winners.len() as i64, stock, "exactly the stock wins");
    assert_eq!(
        stack
            .wait_orders(sale, stock, Duration::from_secs(20))
            .await,
        (stock, stock, 1),
        "one order per winner"
    );
}

/// `check --connect` passes, trusting the stack's CA through
/// `redis.ca_file`, and finds what `expect` says.
fn check_connect_trusts_the_ca_file(stack: &Stack, expect: &str) {
    let out = check_connect(stack);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("redis.ca_file: ok (1 CA certificates") && stdout.contains(expect),
        "{stdout}"
    );
}

/// Without `redis.ca_file` the processes trust the system's roots alone,
/// which do not know the stack's CA: `check --connect` is refused by the
/// certificate check, and a backend and a gateway started so are not
/// ready, say why in their logs, and sell nothing.
async fn without_the_ca_file_nothing_connects(stack: &mut Stack, sale: &str) {
    stack.kill_gateway();
    stack.kill_backend();
    stack.edit_config(|t| {
        t.lines()
            .filter(|l| !l.starts_with("ca_file = "))
            .map(|l| format!("{l}\n"))
            .collect()
    });
    let out = check_connect(stack);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("certificate verify failed"),
        "{stderr}"
    );

    // What each process logs from now on.
    let since = |name: &str| stack.log(name).len();
    let (gateway_from, backend_from) = (since("flashgate"), since("flashgate-backend"));
    stack.spawn_backend();
    stack.spawn_gateway();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let says_why =
            |name: &str, from: usize| stack.log(name)[from..].contains("certificate verify failed");
        if says_why("flashgate", gateway_from) && says_why("flashgate-backend", backend_from) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a process does not say why:\n{}\n{}",
            &stack.log("flashgate")[gateway_from..],
            &stack.log("flashgate-backend")[backend_from..]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for ready in [
        format!("http://{}/ready", stack.gateway_admin_addr),
        format!("http://{}/ready", stack.backend_addr),
    ] {
        let (status, body) = get_json(&stack.http, &ready).await;
        assert_eq!(status, 503, "{ready}: {body}");
    }
    let (status, body) = stack.buy(sale, &random_user(), None).await;
    assert_eq!(
        status, 503,
        "a Redis that cannot be verified is not used: {body}"
    );
}

fn tls_stack() -> StackOptions {
    StackOptions {
        redis_tls: true,
        redis_timeout_ms: 2000,
        ..StackOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_rediss_with_redis_ca_file_a_sale_sells_exactly() {
    let stack = Stack::start(tls_stack()).await;
    let text = std::fs::read_to_string(&stack.config_path).unwrap();
    assert!(
        text.contains("url = \"rediss://127.0.0.1:") && text.contains("ca_file = "),
        "{text}"
    );

    sells_exactly(&stack, "tls", 50).await;
    assert_eq!(stack.remaining("tls").await, 0);

    let out = check_connect(&stack);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("redis.ca_file: ok (1 CA certificates")
            && stdout.contains("rediss://127.0.0.1:"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_whose_certificate_no_trusted_ca_signed_is_refused_and_nothing_sells() {
    let mut stack = Stack::start(tls_stack()).await;
    stack.open_sale("guarded", 10, 1).await;
    // Sent again with its key while a loaded machine answers 503.
    let (user, mut answer) = (random_user(), (503, serde_json::Value::Null));
    for _ in 0..50 {
        answer = stack.buy("guarded", &user, Some("k-guarded")).await;
        if answer.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(answer.0, 202, "the trusted CA: a buy is won: {}", answer.1);

    // Another CA in redis.ca_file: the server's certificate chains to
    // none the processes trust (the system's roots do not know it either).
    let other = stack.dir.0.join("other-ca.pem");
    write_replacing(&other, &TestCa::root("some other CA").pem());
    let ca = stack.dir.0.join("redis-ca.pem").display().to_string();
    stack.edit_config(|t| t.replace(&ca, &other.display().to_string()));
    let out = check_connect(&stack);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("redis.url: rediss://127.0.0.1:")
            && stderr.contains("certificate verify failed"),
        "{stderr}"
    );

    stack.kill_gateway();
    stack.kill_backend();
    stack.spawn_gateway();
    for _ in 0..5 {
        let (status, body) = stack.buy("guarded", &random_user(), None).await;
        assert_eq!(
            status, 503,
            "a Redis that cannot be verified is not used: {body}"
        );
    }
    assert_eq!(
        stack.remaining("guarded").await,
        9,
        "nothing sold past the refused handshake"
    );
    // The readiness check says why, once it has tried.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !stack.log("flashgate").contains("certificate verify failed") {
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway does not say why: {}",
            stack.log("flashgate")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // No redis.ca_file: the system's roots alone do not know the test CA.
    stack.kill_gateway();
    stack.edit_config(|t| {
        t.lines()
            .filter(|l| !l.starts_with("ca_file = "))
            .map(|l| format!("{l}\n"))
            .collect()
    });
    let out = check_connect(&stack);
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("certificate verify failed")
    );

    // A redis.ca_file that cannot be read stops the gateway at start, by key.
    let missing = stack.dir.0.join("missing-ca.pem");
    stack.edit_config(|t| {
        t.replacen(
            "[redis]\n",
            &format!("[redis]\nca_file = {:?}\n", missing.display().to_string()),
            1,
        )
    });
    let mut gateway = flashgate_tests::spawn_as(
        &stack.dir.0,
        &stack.config_path,
        "flashgate",
        "flashgate-bad-ca",
        &["serve"],
    );
    let exit = gateway
        .wait_exit(Duration::from_secs(20))
        .expect("the gateway starts with an unreadable redis.ca_file");
    assert!(!exit.success());
    let log = stack.log("flashgate-bad-ca");
    assert!(
        log.contains(&format!("redis.ca_file: cannot read {}", missing.display())),
        "{log}"
    );
    let out = check_connect(&stack);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("redis.ca_file: cannot read"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_tls_cluster_trusting_redis_ca_file_a_sale_sells_exactly_and_without_it_nothing_connects(
) {
    let mut stack = Stack::start(StackOptions {
        redis_mode: RedisMode::Cluster,
        ..tls_stack()
    })
    .await;
    let text = std::fs::read_to_string(&stack.config_path).unwrap();
    assert!(
        text.contains("nodes = [\"rediss://127.0.0.1:")
            && !text.contains("\"redis://")
            && text.contains("ca_file = "),
        "{text}"
    );
    sells_exactly(&stack, "tls-cluster", 30).await;
    assert_eq!(
        stack.remaining("tls-cluster").await,
        0,
        "read over the plain ports"
    );
    check_connect_trusts_the_ca_file(&stack, "every script loaded");
    without_the_ca_file_nothing_connects(&mut stack, "tls-cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_tls_sentinel_set_trusting_redis_ca_file_a_sale_sells_exactly_and_without_it_nothing_connects(
) {
    let mut stack = Stack::start(StackOptions {
        redis_mode: RedisMode::Sentinel,
        ..tls_stack()
    })
    .await;
    let text = std::fs::read_to_string(&stack.config_path).unwrap();
    assert!(
        text.contains("sentinels = [\"rediss://127.0.0.1:")
            && !text.contains("\"redis://")
            && text.contains("ca_file = "),
        "{text}"
    );
    sells_exactly(&stack, "tls-sentinel", 30).await;
    check_connect_trusts_the_ca_file(&stack, "ROLE master, every script loaded");
    without_the_ca_file_nothing_connects(&mut stack, "tls-sentinel").await;
}
