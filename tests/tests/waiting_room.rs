//! Waiting rooms (`[[shop.waiting_rooms]]`): real gateways on one real
//! redis-server, a counting shop behind them, and visitors as HTTP clients
//! that keep their room cookie and come back when `Retry-After` says.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use flashgate_tests::test_shop::TestShop;
use flashgate_tests::{bin, Stack, StackOptions, ADMIN_TOKEN, WAITING_ROOM_SECRET};
use serde_json::Value;

const SHOP_PAGE: &str = "the shop's page";

async fn shop_page(_req: Request, _n: usize) -> Response {
    Response::builder()
        .header("content-type", "text/plain")
        .body(Body::from(SHOP_PAGE))
        .unwrap()
}

/// A `[[shop.waiting_rooms]]` table.
fn room(name: &str, path: &str, keys: &str) -> String {
    format!("[[shop.waiting_rooms]]\nname = \"{name}\"\npaths = [\"{path}\"]\n{keys}\n")
}

/// A stack whose shop is the counting test shop, with `rooms`.
async fn stack_with(rooms: &str) -> (Stack, TestShop) {
    let shop = TestShop::start(shop_page).await;
    let stack = Stack::start(StackOptions {
        extra_toml: format!("[shop]\nupstreams = [\"{}\"]\n{rooms}", shop.addr),
        // A crowd on a shared machine: a slow Redis is not the room's fault.
        redis_timeout_ms: 1000,
        ..StackOptions::default()
    })
    .await;
    (stack, shop)
}

/// What a visitor saw.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Shop,
    Queued { place: u64 },
    Challenge { challenge: String, bits: u8 },
    Full,
    Other(u16, String),
}

/// One visitor: the room cookies the gateways gave them.
#[derive(Debug, Default, Clone)]
struct Visitor {
    cookies: HashMap<String, String>,
}

impl Visitor {
    fn header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The value of room `name`'s cookie.
    fn cookie(&self, name: &str) -> Option<&str> {
        self.cookies
            .get(&format!("fg_room_{name}"))
            .map(String::as_str)
    }

    /// `GET path` on `addr` as an app (`Accept: application/json`).
    async fn visit(&mut self, http: &reqwest::Client, addr: SocketAddr, path: &str) -> Seen {
        self.visit_with(http, addr, path, &[]).await
    }

    async fn visit_with(
        &mut self,
        http: &reqwest::Client,
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Seen {
        let mut req = http
            .get(format!("http://{addr}{path}"))
            .header("accept", "application/json");
        if !self.cookies.is_empty() {
            req = req.header("cookie", self.header());
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        for set in resp.headers().get_all("set-cookie") {
            let (pair, _) = set.to_str().unwrap().split_once(';').unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            self.cookies.insert(k.to_owned(), v.to_owned());
        }
        let body = resp.text().await.unwrap();
        if body == SHOP_PAGE {
            return Seen::Shop;
        }
        let value: Value = serde_json::from_str(&body).unwrap_or_default();
        match (status, value["status"].as_str(), value["code"].as_str()) {
            (200, Some("queued"), _) => Seen::Queued {
                place: value["place"].as_u64().unwrap(),
            },
            (200, Some("challenge"), _) => Seen::Challenge {
                challenge: value["challenge"].as_str().unwrap().to_owned(),
                bits: value["difficulty_bits"].as_u64().unwrap() as u8,
            },
            (503, _, Some("room_full")) => Seen::Full,
            _ => Seen::Other(status, body),
        }
    }
}

/// The `n` claim of a room cookie standing `st`, read without its key:
/// inside until (ms) for `i`, the place's score for `w`.
fn claim_n(cookie: &str, st: &str) -> i64 {
    use base64::Engine;
    let payload = cookie.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    let claims: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(claims["st"], st, "not a `{st}` cookie: {claims}");
    claims["n"].as_i64().unwrap()
}

async fn zcard(stack: &Stack, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut stack.redis_handle().await)
        .await
        .unwrap()
}

/// The most intervals `[from, to)` open at one instant.
fn most_overlapping(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|(from, to)| [(*from, 1), (*to, -1)])
        .collect();
    // An interval ending at the instant another starts does not overlap it.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        open += step;
        most = most.max(open);
    }
    most as usize
}

/// 2 gateways, `active_users = 50`, 2,000 visitors arriving together, each
/// back when `Retry-After` says, alternating gateways, leaving once let in
/// (their session ends a second later). Pins: the bound held in Redis and
/// by the cookies handed out; everyone let in; FIFO within its margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_hold_the_bound_and_let_two_thousand_visitors_in_fifo() {
    const VISITORS: usize = 2000;
    const ACTIVE: usize = 50;
    let (stack, shop) = stack_with(&room(
        "crowd",
        "/shop/",
        "active_users = 50\nsession_seconds = 1\nrefresh_seconds = 1",
    ))
    .await;
    let (_second, second_addr) = stack.start_second_gateway();
    let gateways = [stack.gateway_addr, second_addr];

    // Redis's side of the bound, sampled while the crowd is let in.
    let most_inside = Arc::new(Mutex::new(0u64));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (most, done) = (most_inside.clone(), done.clone());
        let mut conn = stack.redis_handle().await;
        tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let n: u64 = redis::cmd("ZCARD")
                    .arg("fg:{room:crowd}:inside")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or(0);
                {
                    let mut most = most.lock().unwrap();
                    *most = (*most).max(n);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let started = Instant::now();
    let deadline = started + Duration::from_secs(240);
    let tasks: Vec<_> = (0..VISITORS)
        .map(|i| {
            let http = stack.http.clone();
            tokio::spawn(async move {
                let mut visitor = Visitor::default();
                let mut score = 0;
                for attempt in 0.. {
                    assert!(Instant::now() < deadline, "visitor {i} never let in");
                    let addr = gateways[(i + attempt) % 2];
                    match visitor.visit(&http, addr, "/shop/item").await {
                        Seen::Shop => {
                            let until = claim_n(visitor.cookie("crowd").unwrap(), "i");
                            let now = flashgate_common::now_ms();
                            return (score, started.elapsed(), (now, until));
                        }
                        Seen::Queued { .. } => {
                            score = claim_n(visitor.cookie("crowd").unwrap(), "w");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        // Redis slow on a busy machine: back after Retry-After, as asked.
                        Seen::Other(503, body) if body.contains("\"unavailable\"") => {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        other => panic!("visitor {i}: {other:?}"),
                    }
                }
                unreachable!()
            })
        })
        .collect();
    let mut admitted = Vec::with_capacity(VISITORS);
    for task in tasks {
        admitted.push(task.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();

    assert_eq!(admitted.len(), VISITORS, "every visitor let in in the end");
    assert!(shop.total() >= VISITORS, "each visitor reached the shop");
    let most = *most_inside.lock().unwrap();
    assert!(
        most as usize <= ACTIVE,
        "Redis held {most} visitors inside, above active_users = {ACTIVE}"
    );
    let intervals: Vec<(i64, i64)> = admitted.iter().map(|(_, _, span)| *span).collect();
    let overlapping = most_overlapping(&intervals);
    assert!(
        overlapping <= ACTIVE,
        "{overlapping} visitors held valid inside cookies at once, above {ACTIVE}"
    );
    // FIFO: places (their scores) are called in order; a visitor is
    // overtaken only by those called while their own call waits for their
    // next refresh, so by at most a few batches.
    let mut by_place: Vec<(i64, Duration)> = admitted
        .iter()
        .filter(|(score, _, _)| *score > 0)
        .map(|(score, at, _)| (*score, *at))
        .collect();
    by_place.sort();
    let mut most_overtaken = 0;
    for (i, (_, at)) in by_place.iter().enumerate() {
        let overtaken = by_place[i + 1..].iter().filter(|(_, t)| t < at).count();
        most_overtaken = most_overtaken.max(overtaken);
    }
    assert!(
        most_overtaken <= 4 * ACTIVE,
        "a visitor was overtaken by {most_overtaken} later arrivals"
    );
    println!(
        "2000 visitors let in over {:?}; most inside (Redis) {most}, most valid cookies {overlapping}, most overtaken {most_overtaken}",
        started.elapsed()
    );
}

/// Spearman's rank correlation of `xs` and `ys` (no ties).
fn spearman(xs: &[f64], ys: &[f64]) -> f64 {
    let rank = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|a, b| v[*a].total_cmp(&v[*b]));
        let mut r = vec![0.0; v.len()];
        for (rank, i) in idx.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (rx, ry) = (rank(xs), rank(ys));
    let n = xs.len() as f64;
    let d2: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - b).powi(2)).sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

/// Before the start, a random room's places do not follow arrival: the
/// rank correlation of arrival and place stays within 4 standard errors of
/// 0 (1/sqrt(n-1) under independence: a false failure about once in
/// 16,000 runs), while the same arrivals in a FIFO room correlate fully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_places_are_independent_of_arrival_and_fifo_places_follow_it() {
    const N: usize = 400;
    let opens = flashgate_common::rfc3339(flashgate_common::now_ms() + 3_600_000);
    let keys = format!("active_users = 10\nstarts_at = \"{opens}\"");
    let (stack, _shop) = stack_with(&format!(
        "{}{}",
        room("draw", "/draw/", &format!("{keys}\nqueueing = \"random\"")),
        room("line", "/line/", &keys)
    ))
    .await;
    let mut visitors = vec![Visitor::default(); N];
    // Each arrives (a place drawn), then comes back (the place taken up).
    for path in ["/draw/x", "/line/x", "/draw/x", "/line/x"] {
        for v in &mut visitors {
            let seen = v.visit(&stack.http, stack.gateway_addr, path).await;
            assert!(matches!(seen, Seen::Queued { .. }), "{path}: {seen:?}");
        }
    }
    let arrival: Vec<f64> = (0..N).map(|i| i as f64).collect();
    let mut rho = HashMap::new();
    for path in ["/draw/x", "/line/x"] {
        let mut places = Vec::with_capacity(N);
        for v in &mut visitors {
            match v.visit(&stack.http, stack.gateway_addr, path).await {
                Seen::Queued { place } => places.push(place as f64),
                other => panic!("{path}: {other:?}"),
            }
        }
        rho.insert(path, spearman(&arrival, &places));
    }
    let bound = 4.0 / ((N - 1) as f64).sqrt();
    assert!(
        rho["/draw/x"].abs() < bound,
        "random places follow arrival: rho = {} (bound {bound})",
        rho["/draw/x"]
    );
    assert!(
        (rho["/line/x"] - 1.0).abs() < 1e-9,
        "FIFO places are arrival order: rho = {}",
        rho["/line/x"]
    );
}

/// A cookie signed with `WAITING_ROOM_SECRET` (the test gateways' key).
fn minted(room: &str, st: &str, n: i64, exp_s: i64) -> String {
    let claims = serde_json::json!({"room": room, "vid": "minted", "st": st, "n": n, "exp": exp_s});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(WAITING_ROOM_SECRET.as_bytes()),
    )
    .unwrap()
}

fn cli(stack: &Stack, args: &[&str]) -> std::process::Output {
    Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&stack.config_path)
        .arg("room")
        .args(args)
        .env("FLASHGATE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// One seat: a visitor inside holds it, so every refused cookie ends in
/// the queue. An inside visitor's requests cost no Redis call (MONITOR);
/// a forged, an expired and another room's cookie are refused and
/// counted; the CLI shows the room and switches it to passthrough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_cookies_queue_an_inside_visitor_costs_no_redis_call_and_the_cli_switches_mode() {
    let (stack, shop) = stack_with(&format!(
        "{}{}",
        room("front", "/shop/", "active_users = 1\nsession_seconds = 600"),
        room("back", "/back/", "active_users = 5\nsession_seconds = 600")
    ))
    .await;
    let (http, gw) = (&stack.http, stack.gateway_addr);
    let mut inside = Visitor::default();
    assert_eq!(inside.visit(http, gw, "/shop/a").await, Seen::Shop);

    let visit_sha = flashgate_common::scripts::ROOM_VISIT.get_hash().to_owned();
    let monitor = stack.redis.monitor().await;
    let before = shop.total();
    for _ in 0..20 {
        assert_eq!(inside.visit(http, gw, "/shop/a").await, Seen::Shop);
    }
    assert_eq!(shop.total(), before + 20);
    let mut newcomer = Visitor::default();
    assert_eq!(
        newcomer.visit(http, gw, "/shop/a").await,
        Seen::Queued { place: 1 }
    );
    // Another spelling of the guarded path is guarded too.
    let mut sidestep = Visitor::default();
    assert!(matches!(
        sidestep.visit(http, gw, "/%73hop/a").await,
        Seen::Queued { .. }
    ));
    let commands = monitor.commands().await;
    let visits = commands.iter().filter(|c| c.contains(&visit_sha)).count();
    assert_eq!(
        visits, 2,
        "only the two newcomers' visits called Redis:\n{commands:#?}"
    );

    // Forged: the inside cookie with its signature changed.
    let cookie = inside.cookie("front").unwrap().to_owned();
    let (head, sig) = cookie.rsplit_once('.').unwrap();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    let forged = format!("{head}.{flipped}{}", &sig[1..]);
    let now = flashgate_common::now_ms();
    let expired = minted("front", "i", now - 1_000, now / 1000 - 10);
    let mut other = Visitor::default();
    assert_eq!(other.visit(http, gw, "/back/a").await, Seen::Shop);
    let other_room = other.cookie("back").unwrap().to_owned();
    for (reason, value) in [
        ("forged", forged),
        ("expired", expired),
        ("other_room", other_room),
    ] {
        let mut v = Visitor::default();
        v.cookies.insert("fg_room_front".into(), value);
        let seen = v.visit(http, gw, "/shop/a").await;
        assert!(matches!(seen, Seen::Queued { .. }), "{reason}: {seen:?}");
        let text = stack.gateway_metrics_text().await;
        let counted = text.lines().any(|l| {
            l.starts_with("flashgate_waiting_room_cookies_refused_total{")
                && l.contains(&format!("reason=\"{reason}\""))
                && l.contains("room=\"front\"")
                && l.ends_with(" 1")
        });
        assert!(counted, "{reason} not counted once:\n{text}");
    }

    // The admin API needs the token; the CLI shows and switches the room.
    let unauthorized = http
        .get(format!("http://{}/waiting-rooms", stack.gateway_admin_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    let list = cli(&stack, &["list"]);
    let out = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(out.contains("front") && out.contains("back"), "{out}");
    let bad = cli(&stack, &["mode", "front", "open"]);
    assert!(!bad.status.success(), "an unknown mode is refused");
    let switched = cli(&stack, &["mode", "front", "passthrough"]);
    assert!(
        switched.status.success(),
        "{}",
        String::from_utf8_lossy(&switched.stderr)
    );
    let mut anyone = Visitor::default();
    assert_eq!(anyone.visit(http, gw, "/shop/a").await, Seen::Shop);
    assert!(anyone.cookies.is_empty(), "passthrough hands out no cookie");
    let shown = cli(&stack, &["show", "front", "--json"]);
    let view: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(view["mode"], "passthrough");
    assert_eq!(view["configured_mode"], "queue");
}

/// Visitors wait behind a visitor inside; the gateway they joined through
/// is killed, and on the other gateway each keeps their place, even after
/// Redis loses the queue (the cookie holds the place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_while_visitors_wait_loses_no_place() {
    let (mut stack, _shop) = stack_with(&room(
        "hold",
        "/shop/",
        "active_users = 1\nsession_seconds = 600",
    ))
    .await;
    let (_second, second_addr) = stack.start_second_gateway();
    let http = stack.http.clone();
    let mut holder = Visitor::default();
    assert_eq!(
        holder.visit(&http, stack.gateway_addr, "/shop/").await,
        Seen::Shop
    );
    let mut waiting = vec![Visitor::default(); 20];
    for (i, v) in waiting.iter_mut().enumerate() {
        let seen = v.visit(&http, stack.gateway_addr, "/shop/").await;
        assert_eq!(
            seen,
            Seen::Queued {
                place: i as u64 + 1
            }
        );
    }
    stack.kill_gateway();
    for (i, v) in waiting.iter_mut().enumerate() {
        let seen = v.visit(&http, second_addr, "/shop/").await;
        assert_eq!(
            seen,
            Seen::Queued {
                place: i as u64 + 1
            },
            "after the kill"
        );
    }
    let _: () = redis::cmd("DEL")
        .arg("fg:{room:hold}:queue")
        .query_async(&mut stack.redis_handle().await)
        .await
        .unwrap();
    for v in waiting.iter_mut() {
        assert!(matches!(
            v.visit(&http, second_addr, "/shop/").await,
            Seen::Queued { .. }
        ));
    }
    for (i, v) in waiting.iter_mut().enumerate() {
        let seen = v.visit(&http, second_addr, "/shop/").await;
        assert_eq!(
            seen,
            Seen::Queued {
                place: i as u64 + 1
            },
            "after Redis lost the queue"
        );
    }
    assert_eq!(zcard(&stack, "fg:{room:hold}:queue").await, 20);
}

/// A room that asks a proof of work gives no place without one: the
/// challenge is bound to the visitor, so another visitor's solution does
/// not pass, and a solved one lets the visitor in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_asking_a_proof_of_work_gives_a_place_only_for_the_visitors_own_solution() {
    let (stack, _shop) = stack_with(&format!(
        "[challenge]\ndifficulty_bits = 8\n{}",
        room("proof", "/shop/", "active_users = 10\nchallenge = true")
    ))
    .await;
    let (http, gw) = (&stack.http, stack.gateway_addr);
    let mut a = Visitor::default();
    let mut b = Visitor::default();
    let Seen::Challenge { challenge, bits } = a.visit(http, gw, "/shop/").await else {
        panic!("no challenge for a")
    };
    assert!(matches!(
        b.visit(http, gw, "/shop/").await,
        Seen::Challenge { .. }
    ));
    let solution = flashgate_gateway::admission::token::solve(&challenge, bits, 0);
    let seen = b
        .visit_with(http, gw, "/shop/", &[("flashgate-pow", &solution)])
        .await;
    assert!(
        matches!(seen, Seen::Challenge { .. }),
        "a's solution passed for b: {seen:?}"
    );
    assert_eq!(
        a.visit_with(http, gw, "/shop/", &[("flashgate-pow", &solution)])
            .await,
        Seen::Shop
    );
    assert_eq!(zcard(&stack, "fg:{room:proof}:inside").await, 1);
}

/// A visitor called in who let their turn pass cannot go back to the head
/// of the line with the cookie that held their place: the place was used,
/// and the saved cookie draws a new one behind everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_waiting_cookie_does_not_put_a_visitor_back_at_the_head() {
    let (stack, _shop) = stack_with(&room(
        "turn",
        "/shop/",
        "active_users = 1\nsession_seconds = 3\nrefresh_seconds = 1",
    ))
    .await;
    let (http, gw) = (&stack.http, stack.gateway_addr);
    // The seat is taken for 3 s by a visitor who never comes back.
    assert_eq!(
        Visitor::default().visit(http, gw, "/shop/").await,
        Seen::Shop
    );
    let mut v = Visitor::default();
    assert_eq!(v.visit(http, gw, "/shop/").await, Seen::Queued { place: 1 });
    let saved = v.clone();
    let first_score = claim_n(saved.cookie("turn").unwrap(), "w");
    let deadline = Instant::now() + Duration::from_secs(30);
    while v.visit(http, gw, "/shop/").await != Seen::Shop {
        assert!(Instant::now() < deadline, "never let in");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Someone arrives behind while the visitor is inside.
    let mut later = Visitor::default();
    assert!(matches!(
        later.visit(http, gw, "/shop/").await,
        Seen::Queued { .. }
    ));
    let later_score = claim_n(later.cookie("turn").unwrap(), "w");
    // The session (3 s) ends; the saved cookie comes back.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut replay = saved;
    let seen = replay.visit(http, gw, "/shop/").await;
    assert!(matches!(seen, Seen::Queued { .. } | Seen::Shop), "{seen:?}");
    if seen != Seen::Shop {
        let score = claim_n(replay.cookie("turn").unwrap(), "w");
        assert!(
            score > later_score && score > first_score,
            "the used place {first_score} came back ({score}), ahead of {later_score}"
        );
    }
    assert_ne!(
        seen,
        Seen::Shop,
        "let in ahead of the visitor who waited behind"
    );
}

/// A visitor inside who keeps making requests keeps their seat (each
/// renewal reaches Redis before the session ends there), and the visitor
/// waiting behind is let in only once they stop; never two inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_visitor_keeps_the_seat_through_renewals_and_the_next_gets_it_after() {
    let (stack, _shop) = stack_with(&room(
        "renew",
        "/shop/",
        "active_users = 1\nsession_seconds = 6\nrefresh_seconds = 1",
    ))
    .await;
    let (http, gw) = (&stack.http, stack.gateway_addr);
    let mut active = Visitor::default();
    let mut next = Visitor::default();
    assert_eq!(active.visit(http, gw, "/shop/").await, Seen::Shop);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(12) {
        assert_eq!(
            active.visit(http, gw, "/shop/").await,
            Seen::Shop,
            "the seat was lost"
        );
        assert!(
            matches!(next.visit(http, gw, "/shop/").await, Seen::Queued { .. }),
            "let in beside an active visitor"
        );
        assert!(zcard(&stack, "fg:{room:renew}:inside").await <= 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        claim_n(active.cookie("renew").unwrap(), "i") > flashgate_common::now_ms(),
        "the cookie was renewed"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while next.visit(http, gw, "/shop/").await != Seen::Shop {
        assert!(Instant::now() < deadline, "the seat never came free");
        assert!(zcard(&stack, "fg:{room:renew}:inside").await <= 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The room's other keys: `reject` turns away who finds no seat (`503
/// room_full`, no place); `new_users_per_minute` lets in ten seconds'
/// worth at once and queues the rest though seats are free; a room past
/// its `ends_at` lets everyone through; the operator's template is the
/// page, with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_mode_the_admission_pace_the_end_of_the_event_and_the_template_apply() {
    let dir = flashgate_tests::TempDir::new("room-template");
    let template = dir.0.join("queue.html");
    std::fs::write(&template, "<p>Acme line: place {{place}}</p>{{script}}").unwrap();
    let ended = flashgate_common::rfc3339(flashgate_common::now_ms() - 60_000);
    let started = flashgate_common::rfc3339(flashgate_common::now_ms() - 120_000);
    let (stack, _shop) = stack_with(&format!(
        "{}{}{}",
        room(
            "full",
            "/full/",
            &format!(
                "active_users = 1\nmode = \"reject\"\ntemplate = \"{}\"",
                template.display()
            )
        ),
        room(
            "paced",
            "/paced/",
            "active_users = 100\nnew_users_per_minute = 60"
        ),
        room(
            "over",
            "/over/",
            &format!("active_users = 1\nstarts_at = \"{started}\"\nends_at = \"{ended}\"")
        ),
    ))
    .await;
    let (http, gw) = (&stack.http, stack.gateway_addr);

    assert_eq!(
        Visitor::default().visit(http, gw, "/full/").await,
        Seen::Shop
    );
    let mut turned = Visitor::default();
    assert_eq!(turned.visit(http, gw, "/full/").await, Seen::Full);
    assert!(turned.cookies.is_empty(), "reject gives no place");
    let page = http.get(stack.url("/full/")).send().await.unwrap();
    assert_eq!(page.status(), 503);
    assert_eq!(page.headers()["retry-after"], "10");
    assert!(
        page.text().await.unwrap().contains("Acme line"),
        "the template is the page"
    );

    // 60 a minute: ten seconds' worth (10) let in, the rest wait.
    let mut let_in = 0;
    for _ in 0..30 {
        match Visitor::default().visit(http, gw, "/paced/").await {
            Seen::Shop => let_in += 1,
            Seen::Queued { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    // (An eleventh only if these requests took over a second: one more token.)
    assert!(
        (10..=11).contains(&let_in),
        "{let_in} let in: the bucket holds ten seconds of new_users_per_minute"
    );

    let mut anyone = Visitor::default();
    for _ in 0..3 {
        assert_eq!(anyone.visit(http, gw, "/over/").await, Seen::Shop);
    }
    assert!(anyone.cookies.is_empty(), "an ended room is out of the way");
}
