//! The load generator: HTTP/1.1 keepalive connections (hyper's client
//! connection API, one connection per task), latencies in an HDR histogram.
//!
//! - Closed loop: `conns` connections, each sends its next request as soon as
//!   the previous answer is read.
//! - Open loop: requests are due at a fixed rate; each is sent on the next
//!   free connection, and its latency counts from when it was *due*, so a
//!   stalled server shows up as latency instead of quietly lowering the load
//!   (no coordinated omission).
//! - Burst: a fixed crowd of users, each buying once with an impatient
//!   client (short patience, retries with the same idempotency key, and
//!   sometimes a double click), until every user is done.
//!
//! A warmup precedes the measured window; requests due in the warmup are
//! counted in `total_statuses` only (the correctness checks need every
//! request), not in the latency figures.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rand::Rng;
use serde::Serialize;
use tokio::net::TcpStream;

/// Which users the requests come from.
#[derive(Clone)]
pub struct Users {
    /// Pre-built header values, one per user: `Bearer <jwt>` for Flashgate,
    /// the bare user id for the peer.
    pub headers: Arc<Vec<HeaderValue>>,
}

/// Who sends each request.
#[derive(Clone, Copy, Debug)]
pub enum Pick {
    /// Every request from the next user of the list (wrapping around).
    Distinct,
    /// Every request from this one user.
    One(usize),
}

/// What the requests look like.
#[derive(Clone)]
pub enum Target {
    /// A plain GET of `path`.
    Get { path: String },
    /// A GET of `path` with one `Cookie` header on every request (a
    /// waiting room's visitor).
    GetWithCookie { path: String, cookie: HeaderValue },
    /// Flashgate's `POST /flashgate/api/sales/{id}/buy`: bearer token and Idempotency-Key.
    FlashBuy {
        path: String,
        users: Users,
        pick: Pick,
    },
    /// The OpenResty peer's `POST /api/seckill/{id}/buy`: X-User-Id, X-Request-Id.
    PeerBuy {
        path: String,
        users: Users,
        pick: Pick,
    },
    /// A Flashgate buy the gateway must turn down before Redis: `body`
    /// as sent, with the next user's bearer token when `users` is given
    /// (none: unauthenticated).
    RefusedBuy {
        path: String,
        users: Option<Users>,
        body: &'static [u8],
    },
}

/// The pace of a run.
#[derive(Clone, Copy, Debug)]
pub enum Pace {
    Closed,
    Open { rate: f64 },
}

/// One load run.
#[derive(Clone)]
pub struct LoadSpec {
    pub addr: SocketAddr,
    pub conns: usize,
    pub pace: Pace,
    pub warmup: Duration,
    pub duration: Duration,
    /// A request unanswered this long counts as a timeout (and its
    /// connection is dropped).
    pub timeout: Duration,
    pub target: Target,
    /// Makes idempotency keys / request ids unique across runs.
    pub tag: String,
}

/// A burst: `users` buyers, each until it has an answer it accepts.
#[derive(Clone)]
pub struct BurstSpec {
    pub addr: SocketAddr,
    pub conns: usize,
    /// A `FlashBuy` or `PeerBuy` target (its `pick` is ignored).
    pub target: Target,
    pub users: usize,
    /// How long a buyer waits before giving up on an answer and retrying.
    pub patience: Duration,
    /// Attempts per buyer, first included.
    pub max_attempts: u32,
    /// Share of buyers who click again after their first answer.
    pub double_click: f64,
    /// The whole burst stops here, done or not.
    pub deadline: Duration,
    pub tag: String,
}

/// What a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Responses in the measured window.
    pub requests: u64,
    pub elapsed_s: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Status counts in the measured window.
    pub statuses: BTreeMap<u16, u64>,
    /// Status counts of the whole run, warmup included.
    pub total_statuses: BTreeMap<u16, u64>,
    /// Connection or protocol errors, whole run.
    pub errors: u64,
    /// Requests unanswered within the timeout, whole run.
    pub timeouts: u64,
    /// Open loop: requests that were due but never sent (the run ended).
    pub missed: u64,
    /// Burst: distinct users who saw a winning answer.
    pub winners: Option<u64>,
    /// Burst: users who finished (accepted an answer or ran out of attempts).
    pub users_done: Option<u64>,
}

impl Summary {
    /// Responses of the whole run with a status in `range`.
    pub fn total_in(&self, range: std::ops::RangeInclusive<u16>) -> u64 {
        self.total_statuses
            .iter()
            .filter(|(s, _)| range.contains(s))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn total_of(&self, status: u16) -> u64 {
        self.total_statuses.get(&status).copied().unwrap_or(0)
    }

    /// `201×9000 409×3` style, window counts.
    pub fn statuses_text(&self) -> String {
        let mut parts: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}×{n}"))
            .collect();
        if self.errors > 0 {
            parts.push(format!("err×{}", self.errors));
        }
        if self.timeouts > 0 {
            parts.push(format!("timeout×{}", self.timeouts));
        }
        if self.missed > 0 {
            parts.push(format!("unsent×{}", self.missed));
        }
        parts.join(" ")
    }
}

/// Per-task counters, merged at the end.
struct Tally {
    hist: Histogram<u64>,
    window: [u64; 600],
    total: [u64; 600],
    errors: u64,
    timeouts: u64,
    missed: u64,
    last_done: Option<Instant>,
    winners: u64,
    users_done: u64,
}

impl Tally {
    fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds"),
            window: [0; 600],
            total: [0; 600],
            errors: 0,
            timeouts: 0,
            missed: 0,
            last_done: None,
            winners: 0,
            users_done: 0,
        }
    }

    fn record(&mut self, status: u16, latency: Duration, in_window: bool, done: Instant) {
        let s = usize::from(status).min(599);
        self.total[s] += 1;
        if in_window {
            self.window[s] += 1;
            let _ = self.hist.record((latency.as_micros() as u64).max(1));
            self.last_done = Some(self.last_done.map_or(done, |t| t.max(done)));
        }
    }

    fn merge(&mut self, other: &Tally) {
        let _ = self.hist.add(&other.hist);
        for i in 0..600 {
            self.window[i] += other.window[i];
            self.total[i] += other.total[i];
        }
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        self.missed += other.missed;
        self.winners += other.winners;
        self.users_done += other.users_done;
        self.last_done = match (self.last_done, other.last_done) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    fn summary(&self, window_start: Instant) -> Summary {
        let to_map = |a: &[u64; 600]| {
            a.iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(s, n)| (s as u16, *n))
                .collect::<BTreeMap<_, _>>()
        };
        let requests: u64 = self.window.iter().sum();
        let elapsed = self.last_done.map_or(0.0, |t| {
            t.saturating_duration_since(window_start).as_secs_f64()
        });
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        Summary {
            requests,
            elapsed_s: elapsed,
            rps: if elapsed > 0.0 {
                requests as f64 / elapsed
            } else {
                0.0
            },
            p50_ms: q(0.50),
            p90_ms: q(0.90),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: self.hist.max() as f64 / 1000.0,
            statuses: to_map(&self.window),
            total_statuses: to_map(&self.total),
            errors: self.errors,
            timeouts: self.timeouts,
            missed: self.missed,
            winners: None,
            users_done: None,
        }
    }
}

const BUY_BODY: &[u8] = br#"{"qty":1}"#;

/// Builds one request. `user` is ignored for plain GETs; `key` is the
/// idempotency key (Flashgate) or request id (peer).
fn build(target: &Target, host: &HeaderValue, user: usize, key: &str) -> Request<Full<Bytes>> {
    let (method, path, body) = match target {
        Target::Get { path } | Target::GetWithCookie { path, .. } => {
            (Method::GET, path, Bytes::new())
        }
        Target::FlashBuy { path, .. } | Target::PeerBuy { path, .. } => {
            (Method::POST, path, Bytes::from_static(BUY_BODY))
        }
        Target::RefusedBuy { path, body, .. } => (Method::POST, path, Bytes::from_static(body)),
    };
    let mut req = Request::builder()
        .method(method)
        .uri(path.as_str())
        .header(http::header::HOST, host.clone());
    match target {
        Target::Get { .. } => {}
        Target::GetWithCookie { cookie, .. } => {
            req = req.header(http::header::COOKIE, cookie.clone());
        }
        Target::FlashBuy { users, .. } => {
            let users = &users.headers;
            req = req
                .header(
                    http::header::AUTHORIZATION,
                    users[user % users.len()].clone(),
                )
                .header("idempotency-key", key)
                .header(http::header::CONTENT_TYPE, "application/json");
        }
        Target::PeerBuy { users, .. } => {
            let users = &users.headers;
            req = req
                .header("x-user-id", users[user % users.len()].clone())
                .header("x-request-id", key)
                .header(http::header::CONTENT_TYPE, "application/json");
        }
        Target::RefusedBuy { users, .. } => {
            if let Some(users) = users {
                let users = &users.headers;
                req = req.header(
                    http::header::AUTHORIZATION,
                    users[user % users.len()].clone(),
                );
            }
            req = req
                .header("idempotency-key", key)
                .header(http::header::CONTENT_TYPE, "application/json");
        }
    }
    req.body(Full::new(body)).expect("a well-formed request")
}

fn pick_of(target: &Target) -> Pick {
    match target {
        Target::Get { .. } | Target::GetWithCookie { .. } => Pick::One(0),
        Target::RefusedBuy { .. } => Pick::Distinct,
        Target::FlashBuy { pick, .. } | Target::PeerBuy { pick, .. } => *pick,
    }
}

type Conn = SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Conn, Box<dyn std::error::Error + Send + Sync>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Sends one request on `conn` (connecting first if needed) and reads the
/// whole answer. Any failure drops the connection.
async fn send(
    conn: &mut Option<Conn>,
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
    if conn.as_ref().is_none_or(|c| c.is_closed()) {
        *conn = Some(connect(addr).await?);
    }
    let sender = conn.as_mut().expect("connected above");
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await?;
    Ok(status)
}

async fn send_bounded(
    conn: &mut Option<Conn>,
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
    limit: Duration,
    tally: &mut Tally,
) -> Option<u16> {
    match tokio::time::timeout(limit, send(conn, addr, req)).await {
        Ok(Ok(status)) => Some(status),
        Ok(Err(_)) => {
            tally.errors += 1;
            *conn = None;
            None
        }
        Err(_) => {
            tally.timeouts += 1;
            *conn = None;
            None
        }
    }
}

/// CPU or other readings taken at the start and end of the measured window.
pub trait Probe<S>: Fn() -> S + Send + Sync {}
impl<S, F: Fn() -> S + Send + Sync> Probe<S> for F {}

/// Runs a closed- or open-loop load; `probe` is read when the measured
/// window opens and after its last answer.
pub async fn run<S>(spec: LoadSpec, probe: impl Probe<S>) -> (Summary, S, S) {
    let host = HeaderValue::from_str(&spec.addr.to_string()).expect("an address is a valid Host");
    let start = Instant::now() + Duration::from_millis(50);
    let window_start = start + spec.warmup;
    let end = window_start + spec.duration;
    let next = Arc::new(AtomicU64::new(0));
    let spec = Arc::new(spec);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..spec.conns.max(1) {
        let (spec, next, host) = (spec.clone(), next.clone(), host.clone());
        tasks.spawn(async move {
            let mut tally = Tally::new();
            let mut conn: Option<Conn> = None;
            let pick = pick_of(&spec.target);
            tokio::time::sleep_until(start.into()).await;
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                let due = match spec.pace {
                    Pace::Closed => {
                        let now = Instant::now();
                        if now >= end {
                            break;
                        }
                        now
                    }
                    Pace::Open { rate } => {
                        let due = start + Duration::from_secs_f64(seq as f64 / rate);
                        if due >= end {
                            break;
                        }
                        // Far behind schedule at the end: the rest is unsent.
                        if Instant::now() > end + Duration::from_secs(2) {
                            tally.missed += 1;
                            continue;
                        }
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                };
                let user = match pick {
                    Pick::Distinct => seq as usize,
                    Pick::One(u) => u,
                };
                let key = format!("{}-{seq}", spec.tag);
                let req = build(&spec.target, &host, user, &key);
                if let Some(status) =
                    send_bounded(&mut conn, spec.addr, req, spec.timeout, &mut tally).await
                {
                    let done = Instant::now();
                    tally.record(status, done - due, due >= window_start, done);
                }
            }
            tally
        });
    }
    tokio::time::sleep_until(window_start.into()).await;
    let before = probe();
    let mut total = Tally::new();
    while let Some(t) = tasks.join_next().await {
        if let Ok(t) = t {
            total.merge(&t);
        }
    }
    let after = probe();
    (total.summary(window_start), before, after)
}

/// Runs a burst of impatient buyers until all are done or the deadline.
pub async fn burst<S>(spec: BurstSpec, probe: impl Probe<S>) -> (Summary, S, S) {
    let host = HeaderValue::from_str(&spec.addr.to_string()).expect("an address is a valid Host");
    let start = Instant::now();
    let deadline = start + spec.deadline;
    let next_user = Arc::new(AtomicU64::new(0));
    let spec = Arc::new(spec);
    let before = probe();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..spec.conns.max(1) {
        let (spec, next_user, host) = (spec.clone(), next_user.clone(), host.clone());
        tasks.spawn(async move {
            let mut tally = Tally::new();
            let mut conn: Option<Conn> = None;
            loop {
                let user = next_user.fetch_add(1, Ordering::Relaxed) as usize;
                if user >= spec.users || Instant::now() >= deadline {
                    break;
                }
                let key = format!("{}-u{user}", spec.tag);
                let mut won = false;
                let mut clicked_again = false;
                let mut attempts = 0;
                while attempts < spec.max_attempts && Instant::now() < deadline {
                    attempts += 1;
                    let req = build(&spec.target, &host, user, &key);
                    let sent = Instant::now();
                    // The last attempt waits as long as it takes (bounded).
                    let patience = if attempts == spec.max_attempts {
                        Duration::from_secs(5)
                    } else {
                        spec.patience
                    };
                    let status =
                        send_bounded(&mut conn, spec.addr, req, patience, &mut tally).await;
                    if let Some(status) = status {
                        let done = Instant::now();
                        tally.record(status, done - sent, true, done);
                        if (200..300).contains(&status) {
                            won = true;
                        }
                        let retryable = status == 429 || status >= 500;
                        if !retryable {
                            if !clicked_again && rand::rng().random_bool(spec.double_click) {
                                clicked_again = true;
                                continue;
                            }
                            break;
                        }
                    }
                    let pause = rand::rng().random_range(5..50);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                tally.users_done += 1;
                if won {
                    tally.winners += 1;
                }
            }
            tally
        });
    }
    let mut total = Tally::new();
    while let Some(t) = tasks.join_next().await {
        if let Ok(t) = t {
            total.merge(&t);
        }
    }
    let after = probe();
    let mut summary = total.summary(start);
    summary.winners = Some(total.winners);
    summary.users_done = Some(total.users_done);
    (summary, before, after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buy_requests_carry_the_user_and_a_key() {
        let users = Users {
            headers: Arc::new(vec![
                HeaderValue::from_static("Bearer a"),
                HeaderValue::from_static("Bearer b"),
            ]),
        };
        let host = HeaderValue::from_static("127.0.0.1:1");
        let t = Target::FlashBuy {
            path: "/flashgate/api/sales/s/buy".into(),
            users: users.clone(),
            pick: Pick::Distinct,
        };
        let r = build(&t, &host, 3, "k-1");
        assert_eq!(r.headers()["authorization"], "Bearer b");
        assert_eq!(r.headers()["idempotency-key"], "k-1");
        let t = Target::PeerBuy {
            path: "/api/seckill/1001/buy".into(),
            users,
            pick: Pick::One(0),
        };
        let r = build(&t, &host, 0, "k-2");
        assert_eq!(r.headers()["x-user-id"], "Bearer a");
        assert_eq!(r.headers()["x-request-id"], "k-2");
    }

    #[test]
    fn summaries_count_statuses_by_range() {
        let mut t = Tally::new();
        let now = Instant::now();
        t.record(201, Duration::from_millis(1), true, now);
        t.record(409, Duration::from_millis(2), false, now);
        let s = t.summary(now);
        assert_eq!(s.requests, 1);
        assert_eq!(s.total_in(200..=299), 1);
        assert_eq!(s.total_of(409), 1);
    }
}
