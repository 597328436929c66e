//! Order events to the shop, end to end: real stacks over loopback send
//! `order.created`, `order.paid` and `order.cancelled` to a real HTTP
//! receiver that fails at random (seeded) and to RabbitMQ; every order's
//! events arrive, in order per order, across a backend killed with
//! SIGKILL, and a repeated event carries the id and bytes it had.
//!
//! Over TLS too: an `https://` receiver and an `amqps://` proxy in front of
//! RabbitMQ, each with a certificate from a CA the test makes
//! (`flashgate_tests::pki`): nothing is delivered until `events.ca_file`
//! names that CA.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashgate_tests::pki::{write_replacing, Leaf, TestCa};
use flashgate_tests::{random_user, spawn_as, MysqlDatabase, Stack, StackOptions, WEBHOOK_SECRET};
use hmac::{Hmac, Mac};
use openssl::pkey::PKey;
use openssl::ssl::{Ssl, SslAcceptor, SslMethod};
use openssl::x509::X509;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::Sha256;

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Delivery {
    event_id: String,
    body: String,
    /// Whether the receiver answered 2xx (took it).
    accepted: bool,
    /// Whether the signature verified (the documented algorithm).
    signed: bool,
    timestamp: String,
    signature: String,
    /// Taken (stored) but answered only after the backend's
    /// `send_timeout_ms`: the backend counts it failed and sends it again.
    late: bool,
}

/// A webhook receiver on 127.0.0.1:0 that verifies every request as
/// docs/EVENTS.md tells a shop to, fails a share of them at random (seeded),
/// and records them all in arrival order.
struct Receiver {
    url: String,
    log: Arc<Mutex<Vec<Delivery>>>,
    /// Share of requests answered 503, in percent.
    failing: Arc<Mutex<u32>>,
    /// Armed: the next request taken is answered only 3 s later, and
    /// `holding` is notified when it arrives (a send in flight to kill the
    /// backend under).
    hold_next: Arc<std::sync::atomic::AtomicBool>,
    holding: Arc<tokio::sync::Notify>,
    /// Requests still to answer late: taken, then answered after
    /// [`LATE_ANSWER`], past the backend's send timeout.
    late_next: Arc<std::sync::atomic::AtomicUsize>,
    /// Over TLS: connections whose handshake failed (the client refused
    /// the certificate), and those that completed.
    handshakes: Handshakes,
}

/// TLS handshakes a test server saw.
#[derive(Clone, Default)]
struct Handshakes {
    failed: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
}

impl Handshakes {
    fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }

    fn done(&self) -> usize {
        self.done.load(Ordering::SeqCst)
    }

    /// Completes the server side of a handshake on `tcp` with `acceptor`
    /// (bounded: a client that stalls is dropped), counting it.
    async fn accept(
        &self,
        acceptor: &SslAcceptor,
        tcp: tokio::net::TcpStream,
    ) -> Option<tokio_openssl::SslStream<tokio::net::TcpStream>> {
        let mut stream =
            tokio_openssl::SslStream::new(Ssl::new(acceptor.context()).ok()?, tcp).ok()?;
        let handshake =
            tokio::time::timeout(Duration::from_secs(10), Pin::new(&mut stream).accept()).await;
        if matches!(handshake, Ok(Ok(()))) {
            self.done.fetch_add(1, Ordering::SeqCst);
            Some(stream)
        } else {
            self.failed.fetch_add(1, Ordering::SeqCst);
            None
        }
    }
}

/// A TLS server's side with `leaf` (its chain and key).
fn acceptor(leaf: &Leaf) -> SslAcceptor {
    let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    let chain = X509::stack_from_pem(&leaf.cert_pem).unwrap();
    builder.set_certificate(&chain[0]).unwrap();
    for intermediate in &chain[1..] {
        builder.add_extra_chain_cert(intermediate.clone()).unwrap();
    }
    builder
        .set_private_key(&PKey::private_key_from_pem(&leaf.key_pem).unwrap())
        .unwrap();
    builder.build()
}

/// The receiver's HTTPS listener for `axum::serve`: a TCP listener whose
/// connections are handed over once their TLS handshake completed (one
/// at a time, enough for one backend).
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: SslAcceptor,
    handshakes: Handshakes,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_openssl::SslStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Some(stream) = self.handshakes.accept(&self.acceptor, tcp).await {
                return (stream, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// Longer than `send_timeout_ms` in [`events_toml`].
const LATE_ANSWER: Duration = Duration::from_millis(2600);

/// The signature as docs/EVENTS.md describes it, written here from the doc:
/// `v1,` + base64(HMAC-SHA256(key, id + "." + timestamp + "." + body)),
/// the key being what follows `whsec_` in the secret, base64-decoded
/// (Standard Webhooks, as docs/EVENTS.md writes it).
fn expected_signature(secret: &str, id: &str, timestamp: &str, body: &[u8]) -> String {
    use base64::Engine as _;
    let key = flashgate_common::config::webhook_key(Some(secret)).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

impl Receiver {
    /// Over plain HTTP.
    async fn start(seed: u64, failing_percent: u32) -> Self {
        Self::serve(seed, failing_percent, None).await
    }

    /// Over HTTPS with `leaf`'s certificate.
    async fn start_tls(seed: u64, failing_percent: u32, leaf: &Leaf) -> Self {
        Self::serve(seed, failing_percent, Some(acceptor(leaf))).await
    }

    async fn serve(seed: u64, failing_percent: u32, tls: Option<SslAcceptor>) -> Self {
        use axum::http::{HeaderMap, StatusCode};
        let log = Arc::new(Mutex::new(Vec::new()));
        let failing = Arc::new(Mutex::new(failing_percent));
        let hold_next = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let holding = Arc::new(tokio::sync::Notify::new());
        let late_next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)));
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post({
                let (log, failing, hold_next, holding) = (
                    log.clone(),
                    failing.clone(),
                    hold_next.clone(),
                    holding.clone(),
                );
                let late_next = late_next.clone();
                move |headers: HeaderMap, body: axum::body::Bytes| {
                    let (log, failing, rng) = (log.clone(), failing.clone(), rng.clone());
                    let (hold_next, holding, late_next) =
                        (hold_next.clone(), holding.clone(), late_next.clone());
                    async move {
                        let header = |name: &str| {
                            headers
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned()
                        };
                        let (id, timestamp, signature) = (
                            header("webhook-id"),
                            header("webhook-timestamp"),
                            header("webhook-signature"),
                        );
                        let now = flashgate_common::now_ms() / 1000;
                        let fresh = timestamp
                            .parse::<i64>()
                            .is_ok_and(|t| (now - t).abs() <= 300);
                        let signed = fresh
                            && signature
                                == expected_signature(WEBHOOK_SECRET, &id, &timestamp, &body)
                            && header("flashgate-event-id") == id;
                        let fail =
                            rng.lock().unwrap().random_range(0..100) < *failing.lock().unwrap();
                        let accepted = signed && !fail;
                        let late = accepted
                            && late_next
                                .fetch_update(
                                    std::sync::atomic::Ordering::SeqCst,
                                    std::sync::atomic::Ordering::SeqCst,
                                    |n| n.checked_sub(1),
                                )
                                .is_ok();
                        log.lock().unwrap().push(Delivery {
                            event_id: id,
                            body: String::from_utf8_lossy(&body).into_owned(),
                            accepted,
                            signed,
                            timestamp,
                            signature,
                            late,
                        });
                        if late {
                            tokio::time::sleep(LATE_ANSWER).await;
                        }
                        if accepted && hold_next.swap(false, std::sync::atomic::Ordering::SeqCst) {
                            holding.notify_one();
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        match (signed, accepted) {
                            (false, _) => StatusCode::UNAUTHORIZED,
                            (true, false) => StatusCode::SERVICE_UNAVAILABLE,
                            (true, true) => StatusCode::NO_CONTENT,
                        }
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Handshakes::default();
        let url = match tls {
            None => {
                tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
                format!("http://{addr}/hook")
            }
            Some(acceptor) => {
                let tls = TlsListener {
                    tcp: listener,
                    acceptor,
                    handshakes: handshakes.clone(),
                };
                tokio::spawn(async move { axum::serve(tls, app).await.unwrap() });
                format!("https://{addr}/hook")
            }
        };
        Self {
            url,
            log,
            failing,
            hold_next,
            holding,
            late_next,
            handshakes,
        }
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.log.lock().unwrap().clone()
    }
}

/// `[backend]` lines and an `[events]` table that deliver quickly.
fn events_toml(destination: &str, max_attempts: u32) -> String {
    format!(
        "expiry_poll_ms = 200\n[events]\n{destination}\nmax_attempts = {max_attempts}\nbackoff_initial_ms = 50\nbackoff_max_ms = 400\npoll_ms = 50\nsend_timeout_ms = 2000\nlease_ms = 6000\n"
    )
}

async fn put_sale(stack: &Stack, id: &str, stock: i64, payment_timeout_seconds: i64) {
    let now = flashgate_common::now_ms();
    let body = json!({
        "name": format!("Sale {id}"), "stock": stock, "per_user_limit": 1,
        "starts_at": flashgate_common::rfc3339(now - 1000), "ends_at": flashgate_common::rfc3339(now + 3_600_000),
        "payment_timeout_seconds": payment_timeout_seconds,
    });
    let (status, v) = stack
        .admin(Method::PUT, &format!("/admin/sales/{id}"), Some(body))
        .await;
    assert_eq!(status, 201, "{v}");
}

/// Buys `n` items of `sale` with new users, paying every other order at
/// once (its `paid` is written while its `created` is still on its way);
/// answers the order ids and the paid ones.
async fn buy_orders(stack: &Stack, sale: &str, n: usize) -> (Vec<String>, HashSet<String>) {
    let (mut orders, mut paid) = (Vec::new(), HashSet::new());
    for i in 0..n {
        let user = random_user();
        let (status, body) = stack.buy(sale, &user, None).await;
        assert!(status == 201 || status == 202, "{status} {body}");
        let order = stack
            .order_id_of(&user, body["reservation_id"].as_str().unwrap())
            .await;
        if i % 2 == 0 {
            let (status, body) = stack
                .backend_post(&format!("/internal/orders/{order}/pay"))
                .await;
            assert_eq!(status, 200, "{body}");
            paid.insert(order.clone());
        }
        orders.push(order);
    }
    (orders, paid)
}

/// What the shop must have heard of each order by the end: `created`, then
/// `paid` for the paid ones and `cancelled` for the others.
fn expected_events(
    orders: &[String],
    paid: &HashSet<String>,
) -> HashMap<String, Vec<&'static str>> {
    orders
        .iter()
        .map(|o| {
            (
                o.clone(),
                vec![
                    "order.created",
                    if paid.contains(o) {
                        "order.paid"
                    } else {
                        "order.cancelled"
                    },
                ],
            )
        })
        .collect()
}

/// Checks the bodies the shop took (in arrival order) against `expected`:
/// every event there, the events of an order in `seq` order, a repeated
/// event the same id and bytes, `item_returned` only on cancellations.
/// Answers how many bodies were repeats.
fn check_events(
    bodies: &[(String, String)],
    expected: &HashMap<String, Vec<&'static str>>,
) -> usize {
    let mut first_by_id: HashMap<String, String> = HashMap::new();
    let mut heard: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    let mut repeats = 0;
    for (id, body) in bodies {
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            v["id"].as_str(),
            Some(id.as_str()),
            "the id header and the body's id agree"
        );
        if let Some(first) = first_by_id.get(id) {
            assert_eq!(first, body, "a repeated event carries the same bytes");
            repeats += 1;
            continue;
        }
        first_by_id.insert(id.clone(), body.clone());
        let order = v["order"]["order_id"].as_str().unwrap().to_owned();
        let kind = v["type"].as_str().unwrap().to_owned();
        assert_eq!(
            v["item_returned"].as_bool(),
            Some(kind == "order.cancelled"),
            "{v}"
        );
        let seen = heard.entry(order).or_default();
        let seq = v["seq"].as_i64().unwrap();
        assert!(
            seen.last().is_none_or(|(last, _)| *last < seq),
            "events of an order out of order: {seen:?} then {v}"
        );
        seen.push((seq, kind));
    }
    for (order, kinds) in expected {
        let got: Vec<&str> = heard
            .get(order)
            .map(|h| h.iter().map(|(_, k)| k.as_str()).collect())
            .unwrap_or_default();
        assert_eq!(&got, kinds, "events of order {order}");
    }
    assert_eq!(
        heard.len(),
        expected.len(),
        "events of orders that do not exist"
    );
    repeats
}

/// The first event `GET /admin/events/dead` lists, once there is one
/// (polled every 100 ms); panics at `deadline`.
async fn first_dead_event(stack: &Stack, deadline: Instant) -> Value {
    loop {
        let (status, v) = stack.admin(Method::GET, "/admin/events/dead", None).await;
        assert_eq!(status, 200, "{v}");
        if let Some(first) = v["dead_events"].as_array().and_then(|a| a.first()) {
            return first.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no dead event:\n{}",
            stack.log("flashgate-backend")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Retries dead event `id` through the admin API.
async fn retry_dead_event(stack: &Stack, id: &str) {
    let (status, v) = stack
        .admin(Method::POST, &format!("/admin/events/{id}/retry"), None)
        .await;
    assert_eq!((status, v["state"].as_str()), (202, Some("pending")), "{v}");
}

/// The config text with `events.ca_file` set to `path` (or left out).
fn with_ca_file(text: String, path: Option<&std::path::Path>) -> String {
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("ca_file = "))
        .map(|l| format!("{l}\n"))
        .collect();
    match path {
        Some(path) => text.replacen(
            "[events]\n",
            &format!("[events]\nca_file = \"{}\"\n", path.display()),
            1,
        ),
        None => text,
    }
}

/// Restarts the backend on its config file edited by `edit`.
fn restart_backend_with(stack: &mut Stack, edit: impl FnOnce(String) -> String) {
    stack.kill_backend();
    stack.edit_config(edit);
    stack.start_backend();
}

/// Starts one more backend on the stack's config, which must refuse to
/// start; answers what it logged.
fn backend_refusing_to_start(stack: &Stack) -> String {
    let mut backend = spawn_as(
        &stack.dir.0,
        &stack.config_path,
        "flashgate-backend",
        "flashgate-backend-refused",
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = backend.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the backend started: {}",
            stack.log("flashgate-backend-refused")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = stack.log("flashgate-backend-refused");
    assert!(!status.success(), "{status}: {log}");
    log
}

/// Waits until `done` holds (polled every 100 ms), or panics after `limit`.
async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_event_reaches_a_flaky_webhook_in_order_across_a_backend_kill() {
    const ORDERS: usize = 24;
    let receiver = Receiver::start(0x5eed, 35).await;
    let toml = events_toml(&format!("webhook_url = \"{}\"", receiver.url), 1000);
    let mut stack = Stack::start(StackOptions {
        extra_toml: toml,
        ..StackOptions::default()
    })
    .await;
    put_sale(&stack, "ev-hook", ORDERS as i64, 4).await;
    let (orders, paid) = buy_orders(&stack, "ev-hook", ORDERS).await;
    // Killed while a request it sent is in flight (taken by the receiver,
    // not answered yet), with retries pending (the receiver fails a third of
    // the requests); the unpaid orders time out and are cancelled after the
    // restart.
    receiver
        .hold_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(20), receiver.holding.notified())
        .await
        .expect("a request to hold");
    stack.kill_backend();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.start_backend();
    // The next two events the receiver takes are answered past the send
    // timeout: stored by the shop, failed for the backend, sent again.
    receiver
        .late_next
        .store(2, std::sync::atomic::Ordering::SeqCst);

    let expected = expected_events(&orders, &paid);
    let wanted: usize = expected.values().map(Vec::len).sum();
    wait_until(
        "every event, and the late ones again",
        Duration::from_secs(60),
        || {
            let deliveries = receiver.deliveries();
            let taken = |id: &str| {
                deliveries
                    .iter()
                    .filter(|d| d.accepted && d.event_id == id)
                    .count()
            };
            deliveries
                .iter()
                .filter(|d| d.accepted)
                .map(|d| d.event_id.clone())
                .collect::<HashSet<_>>()
                .len()
                >= wanted
                && deliveries.iter().filter(|d| d.late).count() == 2
                && deliveries
                    .iter()
                    .filter(|d| d.late)
                    .all(|d| taken(&d.event_id) >= 2)
        },
    )
    .await;

    let deliveries = receiver.deliveries();
    assert!(
        deliveries.iter().all(|d| d.signed),
        "every request verifies with the documented signature"
    );
    assert!(
        deliveries.iter().any(|d| !d.accepted),
        "the receiver failed some requests"
    );
    let accepted: Vec<(String, String)> = deliveries
        .iter()
        .filter(|d| d.accepted)
        .map(|d| (d.event_id.clone(), d.body.clone()))
        .collect();
    let repeats = check_events(&accepted, &expected);
    assert!(
        repeats >= 1,
        "the event in flight at the kill is sent again once its lease passes"
    );
    let late: Vec<&Delivery> = deliveries.iter().filter(|d| d.late).collect();
    assert_eq!(late.len(), 2, "two events were answered late");
    for d in late {
        let again = accepted.iter().filter(|(id, _)| *id == d.event_id).count();
        assert!(
            again >= 2,
            "an event answered past the send timeout is sent again with its id {}: {again} taken",
            d.event_id
        );
    }
    eprintln!(
        "order events: {wanted} events, {} requests, {} taken, {repeats} taken again",
        deliveries.len(),
        accepted.len()
    );
    // Never `paid`/`cancelled` sent (even once, failing) before the
    // order's `created` was taken.
    let mut taken: HashSet<String> = HashSet::new();
    for d in &deliveries {
        let v: Value = serde_json::from_str(&d.body).unwrap();
        let order = v["order"]["order_id"].as_str().unwrap().to_owned();
        if v["seq"] == 2 {
            assert!(
                taken.contains(&order),
                "event 2 of {order} sent before event 1 was delivered"
            );
        } else if d.accepted {
            taken.insert(order);
        }
    }
    // A tampered body does not verify.
    let d = &deliveries[0];
    assert_eq!(
        expected_signature(WEBHOOK_SECRET, &d.event_id, &d.timestamp, d.body.as_bytes()),
        d.signature
    );
    let tampered = d.body.replacen("order.", "order_", 1);
    assert_ne!(
        expected_signature(
            WEBHOOK_SECRET,
            &d.event_id,
            &d.timestamp,
            tampered.as_bytes()
        ),
        d.signature
    );

    let (status, dead) = stack.admin(Method::GET, "/admin/events/dead", None).await;
    assert_eq!(
        (status, dead["dead_events"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{dead}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_events_are_listed_counted_and_delivered_once_retried() {
    let receiver = Receiver::start(7, 100).await;
    let toml = events_toml(&format!("webhook_url = \"{}\"", receiver.url), 2);
    let stack = Stack::start(StackOptions {
        extra_toml: toml,
        ..StackOptions::default()
    })
    .await;
    put_sale(&stack, "ev-dead", 5, 900).await;
    let (orders, paid) = buy_orders(&stack, "ev-dead", 1).await;
    let order = orders[0].clone();
    assert!(paid.contains(&order));

    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = first_dead_event(&stack, deadline).await;
    assert_eq!(
        (
            dead["order_id"].as_str(),
            dead["type"].as_str(),
            dead["attempts"].as_i64()
        ),
        (Some(order.as_str()), Some("order.created"), Some(2))
    );
    assert_eq!(dead["last_error"], "webhook answered 503");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        receiver.deliveries().len(),
        2,
        "max_attempts requests, and `paid` waits behind the dead `created`"
    );
    let metric = |name: &str, text: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    let scrape = || stack.backend_metrics_text();
    let mut text = scrape().await;
    // The gauges are read from the outbox once a second.
    while metric("flashgate_order_events_dead_in_outbox", &text) != Some(1.0)
        || metric("flashgate_order_events_dead_total", &text) != Some(1.0)
    {
        assert!(Instant::now() < deadline, "dead metrics: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        text = scrape().await;
    }
    assert_eq!(
        metric(
            "flashgate_order_events_failed_attempts_total{sink=\"webhook\"}",
            &text
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        metric("flashgate_order_events_backlog", &text),
        Some(1.0),
        "`paid` waits: {text}"
    );

    // Bad input changes nothing.
    let id = dead["event_id"].as_str().unwrap();
    assert_eq!(
        stack
            .admin(Method::POST, "/admin/events/ev-nonsense/retry", None)
            .await
            .0,
        400
    );
    let (status, v) = stack
        .admin(
            Method::POST,
            "/admin/events/ev-00000000000000000000000000000000/retry",
            None,
        )
        .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    let anonymous = reqwest::Client::new()
        .post(stack.admin_url(&format!("/admin/events/{id}/retry")))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(
        stack
            .admin(Method::GET, "/admin/events/dead?limit=0", None)
            .await
            .0,
        400
    );

    *receiver.failing.lock().unwrap() = 0;
    let (status, v) = stack
        .admin(Method::POST, &format!("/admin/events/{id}/retry"), None)
        .await;
    assert_eq!((status, v["state"].as_str()), (202, Some("pending")), "{v}");
    wait_until(
        "created and paid delivered",
        Duration::from_secs(20),
        || receiver.deliveries().iter().filter(|d| d.accepted).count() == 2,
    )
    .await;
    let accepted: Vec<(String, String)> = receiver
        .deliveries()
        .iter()
        .filter(|d| d.accepted)
        .map(|d| (d.event_id.clone(), d.body.clone()))
        .collect();
    assert_eq!(accepted[0].0, id, "the retried event keeps its id");
    check_events(
        &accepted,
        &HashMap::from([(order.clone(), vec!["order.created", "order.paid"])]),
    );
    let (_, v) = stack.admin(Method::GET, "/admin/events/dead", None).await;
    assert_eq!(v["dead_events"], json!([]));
}

/// A queue of the test's own on a fresh exchange: every message published
/// to the exchange lands in it.
async fn rabbit_queue(exchange: &str) -> (lapin::Connection, lapin::Consumer) {
    use lapin::options::{
        BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::FieldTable;
    let conn = lapin::Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("RabbitMQ on 127.0.0.1:5672 (make test starts it)");
    let channel = conn.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        auto_delete: false,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            lapin::ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.name().clone(),
            exchange.into(),
            "order.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let consumer = channel
        .basic_consume(
            queue.name().clone(),
            "test".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    (conn, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_event_reaches_rabbitmq_persistent_and_confirmed_on_mysql() {
    use futures_util::StreamExt;
    const ORDERS: usize = 8;
    let database = MysqlDatabase::create().await;
    let exchange = format!("flashgate.test.{:x}", rand::random::<u64>());
    let (conn, mut consumer) = rabbit_queue(&exchange).await;
    let destination =
        format!("amqp_url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\nexchange = \"{exchange}\"");
    let options = StackOptions {
        extra_toml: events_toml(&destination, 1000),
        database_url: Some(database.url.clone()),
        ..StackOptions::default()
    };
    let mut stack = Stack::start(options).await;
    put_sale(&stack, "ev-amqp", ORDERS as i64, 4).await;
    let (orders, paid) = buy_orders(&stack, "ev-amqp", ORDERS).await;
    stack.kill_backend();
    stack.start_backend();

    let expected = expected_events(&orders, &paid);
    let wanted: usize = expected.values().map(Vec::len).sum();
    let mut bodies: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while bodies
        .iter()
        .map(|(id, _)| id)
        .collect::<HashSet<_>>()
        .len()
        < wanted
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let delivery = tokio::time::timeout(left, consumer.next())
            .await
            .expect("every event on the queue in time")
            .unwrap()
            .unwrap();
        let props = &delivery.properties;
        let body = String::from_utf8(delivery.data.clone()).unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(props.delivery_mode(), &Some(2), "persistent");
        assert_eq!(
            props.message_id().as_ref().map(|m| m.as_str()),
            v["id"].as_str(),
            "event id as message_id"
        );
        assert_eq!(
            props.kind().as_ref().map(|k| k.as_str()),
            v["type"].as_str()
        );
        assert_eq!(
            delivery.routing_key.as_str(),
            v["type"].as_str().unwrap(),
            "routing key of the event type"
        );
        bodies.push((v["id"].as_str().unwrap().to_owned(), body));
    }
    check_events(&bodies, &expected);
    let (orders_in_db, _, _) = stack.db_orders("ev-amqp").await;
    assert_eq!(orders_in_db, ORDERS as i64);
    drop(stack);
    if let Ok(channel) = conn.create_channel().await {
        let _ = channel
            .exchange_delete(
                exchange.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

/// Credentials a webhook URL may carry (its userinfo and a query token),
/// which must never reach a log or `last_error`.
const URL_SECRETS: [&str; 3] = ["u:pw", "pw@", "s3cret"];

/// `url` with a user and password and a `?token=` query, as a shop may
/// configure it.
fn with_credentials(url: &str) -> String {
    format!(
        "{}?token=s3cret",
        url.replacen("https://", "https://u:pw@", 1)
    )
}

/// Asserts that neither `last_error` of `dead` nor the backend's log
/// holds any of `secrets`.
fn assert_no_secret(stack: &Stack, dead: &Value, secrets: &[&str]) {
    let (error, log) = (
        dead["last_error"].as_str().unwrap_or_default(),
        stack.log("flashgate-backend"),
    );
    for secret in secrets {
        assert!(!error.contains(secret), "`{secret}` in last_error: {error}");
        assert!(
            !log.contains(secret),
            "`{secret}` in the backend log:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_webhook_gets_events_only_once_ca_file_trusts_the_shops_ca() {
    let shop_ca = TestCa::root("Shop Test Root");
    let receiver = Receiver::start_tls(
        11,
        0,
        &shop_ca.leaf("shop.test", &["localhost"], &["127.0.0.1"]),
    )
    .await;
    assert!(
        receiver.url.starts_with("https://127.0.0.1:"),
        "{}",
        receiver.url
    );
    // From the trusted CA, but for another name only.
    let elsewhere =
        Receiver::start_tls(12, 0, &shop_ca.leaf("other.test", &["other.test"], &[])).await;
    let url = with_credentials(&receiver.url);
    let toml = events_toml(&format!("webhook_url = \"{url}\""), 2);
    let mut stack = Stack::start(StackOptions {
        extra_toml: toml,
        ..StackOptions::default()
    })
    .await;
    put_sale(&stack, "ev-https", 5, 900).await;
    let (orders, paid) = buy_orders(&stack, "ev-https", 1).await;

    // The system's roots only: the shop's certificate does not verify, no
    // request is made, and the event goes dead after max_attempts.
    let dead = first_dead_event(&stack, Instant::now() + Duration::from_secs(30)).await;
    let id = dead["event_id"].as_str().unwrap().to_owned();
    let error = dead["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("webhook TLS handshake failed:")
            && error.contains("certificate verify failed"),
        "{error}"
    );
    assert_eq!(dead["attempts"], 2, "{dead}");
    assert!(
        stack
            .log("flashgate-backend")
            .contains("TLS handshake with the destination failed"),
        "logged as a TLS failure"
    );
    assert!(
        receiver.handshakes.failed() >= 2,
        "each attempt was refused in the handshake"
    );
    assert_eq!(
        (receiver.handshakes.done(), receiver.deliveries().len()),
        (0, 0),
        "nothing reached the shop"
    );
    assert_no_secret(&stack, &dead, &URL_SECRETS);

    // Another CA in ca_file: the same; a ca_file that is missing or not
    // PEM stops the backend, named.
    let other_ca = TestCa::root("Another Test Root");
    let other_ca_file = stack.dir.0.join("other-ca.pem");
    write_replacing(&other_ca_file, &other_ca.pem());
    let missing = stack.dir.0.join("missing-ca.pem");
    stack.kill_backend();
    stack.edit_config(|t| with_ca_file(t, Some(&missing)));
    let log = backend_refusing_to_start(&stack);
    assert!(
        log.contains(&format!(
            "events.ca_file: cannot read {}",
            missing.display()
        )),
        "{log}"
    );
    let not_pem = stack.dir.0.join("not-a-ca.pem");
    write_replacing(&not_pem, &shop_ca.leaf("x.test", &["x.test"], &[]).key_pem);
    stack.edit_config(|t| with_ca_file(t, Some(&not_pem)));
    let log = backend_refusing_to_start(&stack);
    assert!(
        log.contains(&format!(
            "events.ca_file: {} holds no PEM certificate",
            not_pem.display()
        )),
        "{log}"
    );
    restart_backend_with(&mut stack, |t| with_ca_file(t, Some(&other_ca_file)));
    let failed_before = receiver.handshakes.failed();
    retry_dead_event(&stack, &id).await;
    let dead = first_dead_event(&stack, Instant::now() + Duration::from_secs(30)).await;
    assert_eq!(
        (dead["event_id"].as_str(), dead["attempts"].as_i64()),
        (Some(id.as_str()), Some(2)),
        "{dead}"
    );
    assert!(
        dead["last_error"]
            .as_str()
            .unwrap()
            .contains("certificate verify failed"),
        "{dead}"
    );
    assert!(receiver.handshakes.failed() >= failed_before + 2);
    assert_eq!(
        (receiver.handshakes.done(), receiver.deliveries().len()),
        (0, 0),
        "nothing reached the shop"
    );
    assert_no_secret(&stack, &dead, &URL_SECRETS);

    // The shop's CA in ca_file (beside another one), but a URL whose host
    // (127.0.0.1) the certificate does not cover: the name is checked.
    let both = stack.dir.0.join("cas.pem");
    write_replacing(&both, &[other_ca.pem(), shop_ca.pem()].concat());
    let elsewhere_url = with_credentials(&elsewhere.url);
    restart_backend_with(&mut stack, |t| {
        with_ca_file(t.replace(&url, &elsewhere_url), Some(&both))
    });
    retry_dead_event(&stack, &id).await;
    let dead = first_dead_event(&stack, Instant::now() + Duration::from_secs(30)).await;
    assert_eq!(
        (dead["event_id"].as_str(), dead["attempts"].as_i64()),
        (Some(id.as_str()), Some(2)),
        "{dead}"
    );
    let error = dead["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("webhook TLS handshake failed:")
            && error.contains("certificate verify failed"),
        "{error}"
    );
    assert!(
        elsewhere.handshakes.failed() >= 2,
        "each attempt was refused in the handshake"
    );
    assert_eq!(
        (elsewhere.handshakes.done(), elsewhere.deliveries().len()),
        (0, 0),
        "nothing reached that server"
    );
    assert_no_secret(&stack, &dead, &URL_SECRETS);

    // The URL of the shop again: delivered, signed.
    restart_backend_with(&mut stack, |t| t.replace(&elsewhere_url, &url));
    retry_dead_event(&stack, &id).await;
    wait_until(
        "created and paid over https",
        Duration::from_secs(30),
        || receiver.deliveries().iter().filter(|d| d.accepted).count() == 2,
    )
    .await;
    let deliveries = receiver.deliveries();
    assert!(
        deliveries.iter().all(|d| d.signed),
        "every request verifies with the documented signature"
    );
    let accepted: Vec<(String, String)> = deliveries
        .iter()
        .filter(|d| d.accepted)
        .map(|d| (d.event_id.clone(), d.body.clone()))
        .collect();
    assert_eq!(accepted[0].0, id, "the retried event keeps its id");
    check_events(&accepted, &expected_events(&orders, &paid));
    assert!(receiver.handshakes.done() >= 1);
    let (_, v) = stack.admin(Method::GET, "/admin/events/dead", None).await;
    assert_eq!(v["dead_events"], json!([]));
    assert_no_secret(&stack, &json!({}), &URL_SECRETS);
}

/// A TLS-terminating proxy on 127.0.0.1 in front of the machine's
/// RabbitMQ (which has no TLS listener): each connection's handshake is
/// made with `leaf`, then its bytes go both ways to 127.0.0.1:5672.
/// Answers the proxy's port and its handshake counts.
async fn amqps_proxy(leaf: &Leaf) -> (u16, Handshakes) {
    amqps_proxy_on("127.0.0.1:0", leaf).await
}

/// [`amqps_proxy`], listening on `bind`.
async fn amqps_proxy_on(bind: &str, leaf: &Leaf) -> (u16, Handshakes) {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = Arc::new(acceptor(leaf));
    let handshakes = Handshakes::default();
    let counted = handshakes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, handshakes) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Some(mut tls) = handshakes.accept(&acceptor, tcp).await else {
                    return;
                };
                if let Ok(mut rabbit) = tokio::net::TcpStream::connect("127.0.0.1:5672").await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut rabbit).await;
                }
            });
        }
    });
    (port, handshakes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_events_reach_rabbitmq_over_amqps_once_ca_file_trusts_the_brokers_ca() {
    use futures_util::StreamExt;
    let broker_ca = TestCa::root("Broker Test Root");
    // The URL names 127.0.0.1, and the certificate covers that IP only.
    let (port, handshakes) = amqps_proxy(&broker_ca.leaf("rabbit.test", &[], &["127.0.0.1"])).await;
    // From the same CA, for another name only.
    let (elsewhere_port, elsewhere) =
        amqps_proxy(&broker_ca.leaf("other.test", &["other.test"], &[])).await;
    let exchange = format!("flashgate.amqps.{:x}", rand::random::<u64>());
    let (conn, mut consumer) = rabbit_queue(&exchange).await;
    let destination = format!(
        "amqp_url = \"amqps://guest:guest@127.0.0.1:{port}/%2f\"\nexchange = \"{exchange}\""
    );
    let mut stack = Stack::start(StackOptions {
        extra_toml: events_toml(&destination, 2),
        ..StackOptions::default()
    })
    .await;
    put_sale(&stack, "ev-amqps", 5, 900).await;
    let (orders, paid) = buy_orders(&stack, "ev-amqps", 1).await;

    // The system's roots only: the broker's certificate does not verify,
    // no AMQP session is opened, and the event goes dead.
    let dead = first_dead_event(&stack, Instant::now() + Duration::from_secs(30)).await;
    let id = dead["event_id"].as_str().unwrap().to_owned();
    let error = dead["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("amqp TLS handshake failed:")
            && error.contains("certificate verify failed"),
        "{error}"
    );
    assert!(
        handshakes.failed() >= 2,
        "each attempt was refused in the handshake"
    );
    assert_eq!(handshakes.done(), 0, "no connection reached RabbitMQ");
    assert_no_secret(&stack, &dead, &["guest:guest"]);

    // The broker's CA in ca_file, but the broker at 127.0.0.1 shows a
    // certificate for another name: refused, nothing delivered.
    let ca_file = stack.dir.0.join("broker-ca.pem");
    write_replacing(&ca_file, &broker_ca.pem());
    let (at_port, at_elsewhere) = (
        format!("@127.0.0.1:{port}/"),
        format!("@127.0.0.1:{elsewhere_port}/"),
    );
    restart_backend_with(&mut stack, |t| {
        with_ca_file(t.replace(&at_port, &at_elsewhere), Some(&ca_file))
    });
    retry_dead_event(&stack, &id).await;
    let dead = first_dead_event(&stack, Instant::now() + Duration::from_secs(30)).await;
    assert_eq!(
        (dead["event_id"].as_str(), dead["attempts"].as_i64()),
        (Some(id.as_str()), Some(2)),
        "{dead}"
    );
    let error = dead["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("amqp TLS handshake failed:")
            && error.contains("certificate verify failed"),
        "{error}"
    );
    assert!(
        elsewhere.failed() >= 2,
        "each attempt was refused in the handshake"
    );
    assert_eq!(elsewhere.done(), 0, "no connection reached RabbitMQ");
    assert_no_secret(&stack, &dead, &["guest:guest"]);

    // The broker whose certificate lists 127.0.0.1: the event and the next
    // one arrive.
    restart_backend_with(&mut stack, |t| t.replace(&at_elsewhere, &at_port));
    retry_dead_event(&stack, &id).await;
    let expected = expected_events(&orders, &paid);
    let mut bodies: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while bodies.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let delivery = tokio::time::timeout(left, consumer.next())
            .await
            .expect("both events on the queue in time")
            .unwrap()
            .unwrap();
        assert_eq!(delivery.properties.delivery_mode(), &Some(2), "persistent");
        let body = String::from_utf8(delivery.data.clone()).unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        bodies.push((v["id"].as_str().unwrap().to_owned(), body));
    }
    assert_eq!(bodies[0].0, id, "the retried event keeps its id");
    check_events(&bodies, &expected);
    assert!(handshakes.done() >= 1, "published through the TLS proxy");
    assert_no_secret(&stack, &json!({}), &["guest:guest"]);
    drop(stack);
    if let Ok(channel) = conn.create_channel().await {
        let _ = channel
            .exchange_delete(
                exchange.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqps_broker_at_an_ipv6_address_is_reached_there_and_verified_for_that_address() {
    use futures_util::StreamExt;
    let broker_ca = TestCa::root("Broker v6 Test Root");
    // Listening on ::1 only, with a certificate for the IP ::1 only.
    let (port, handshakes) =
        amqps_proxy_on("[::1]:0", &broker_ca.leaf("rabbit6.test", &[], &["::1"])).await;
    let exchange = format!("flashgate.amqps6.{:x}", rand::random::<u64>());
    let (conn, mut consumer) = rabbit_queue(&exchange).await;
    let destination =
        format!("amqp_url = \"amqps://guest:guest@[::1]:{port}/%2f\"\nexchange = \"{exchange}\"");
    let mut stack = Stack::start(StackOptions {
        extra_toml: events_toml(&destination, 2),
        ..StackOptions::default()
    })
    .await;
    let ca_file = stack.dir.0.join("broker-ca.pem");
    write_replacing(&ca_file, &broker_ca.pem());
    restart_backend_with(&mut stack, |t| with_ca_file(t, Some(&ca_file)));
    put_sale(&stack, "ev-amqps6", 5, 900).await;
    let (orders, paid) = buy_orders(&stack, "ev-amqps6", 1).await;

    let mut bodies: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while bodies.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(delivery) = tokio::time::timeout(left, consumer.next()).await else {
            panic!(
                "both events on the queue in time:\n{}",
                stack.log("flashgate-backend")
            );
        };
        let body = String::from_utf8(delivery.unwrap().unwrap().data.clone()).unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        bodies.push((v["id"].as_str().unwrap().to_owned(), body));
    }
    check_events(&bodies, &expected_events(&orders, &paid));
    assert!(handshakes.done() >= 1, "published through the proxy on ::1");
    assert_eq!(handshakes.failed(), 0, "the certificate for ::1 verified");
    assert_no_secret(&stack, &json!({}), &["guest:guest"]);
    drop(stack);
    if let Ok(channel) = conn.create_channel().await {
        let _ = channel
            .exchange_delete(
                exchange.as_str().into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
}
