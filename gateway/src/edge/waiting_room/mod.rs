//! Waiting rooms (`[[shop.waiting_rooms]]`): a bounded number of visitors
//! inside the shop's own pages at once, the rest in a fair queue shared by
//! every gateway.
//!
//! ```text
//! shop request on a guarded path (the sale's own routes are never guarded)
//!   room ended, or mode passthrough ─────────────► to the shop
//!   cookie fg_room_<name>: inside, not expired ──► to the shop, 0 Redis calls
//!                                                  (renewed in the answer when half spent;
//!                                                   the renewal reaches Redis with the next tick)
//!   room asks a proof of work, none solved ─────► the page with a challenge (no place yet)
//!   otherwise ─► lua/room_visit.lua (one call) ─┬─ let in ─► to the shop, cookie: inside until
//!                                                ├─ queued ─► queue page / JSON, cookie: the place
//!                                                └─ full (reject mode) ─► 503
//! ```
//!
//! Layout: [`pass`] the signed cookie; [`store`] the Redis calls; [`page`]
//! the queue page and its JSON; [`tick`] each gateway's periodic call per
//! room (sessions renewed, the head of the queue called in, the room's
//! state for pages, metrics and the admin API); [`admin`] the admin routes.
//!
//! **The bound.** Who is inside is the room's `inside` set in Redis, one
//! slot per room: every visit and tick is one atomic script, and only
//! they add to the set, each within `active_users`. A visitor called in
//! holds a seat for the grace (three refreshes, at least 30 s), and so does
//! one let in on arrival until their cookie comes back; then
//! `session_seconds`, renewed on a request once half is spent. The renewal
//! is in the new cookie at once and reaches Redis with the gateway's next
//! tick; it is made only while at least two ticks of the session are left,
//! and Redis takes it only for a visitor still inside, so it never counts
//! a visitor whose seat was given away. The margins, each counted or named:
//! a renewal held up past the end of its session (a tick late by more
//! than two seconds, or lost with its gateway) leaves that visitor inside
//! by their cookie but not in the set, until their cookie ends
//! (`flashgate_waiting_room_renewals_late_total`); a Redis that loses the
//! set (a failover without the last writes) forgets who is inside for up
//! to a session; and a cookie is a bearer token: shared with others, it
//! lets them in on its seat.
//!
//! **Fairness.** Places are scores: `fifo` arrivals draw the next ticket;
//! `random` arrivals before the start (the pre-queue) and within
//! `random_window_seconds` of it draw a random score below every ticket.
//! A place is drawn into the arrival's cookie and enters the queue when
//! they come back with it, so a client that keeps no cookie costs no
//! memory (and while places drawn within the grace may still come back,
//! nobody new is let in past them). The cookie keeps the score, so a
//! visitor whose place Redis lost gets it back, and a gateway that dies
//! takes no place with it: every gateway verifies every cookie. A place
//! is used once: a visitor called in is remembered for a day (`called`),
//! and a saved waiting cookie then draws a new place behind everyone. A
//! client that drops its cookie draws a new random place each time, so a
//! `random` room open to bots should ask a proof of work (`challenge`).

pub mod admin;
pub mod page;
pub mod pass;
pub mod store;
pub mod tick;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use arc_swap::ArcSwap;
use flashgate_common::config::{Config, PathPattern, RoomMode, WaitingRoomConfig};
use flashgate_common::keys::RoomKeys;
use flashgate_common::metrics::Registry;
use pingora::http::RequestHeader;
use prometheus::{GaugeVec, IntCounterVec, Opts};

use crate::admission::token::{Signer, ID_BYTES};
use crate::edge::reply::Reply;
use crate::infra::RedisClient;
use page::{Page, Shown, POW_COOKIE};
use pass::{Pass, Passes, Refused, Standing};
use store::{Answer, Shared};

/// The prefix of every room's cookie name.
const COOKIE_PREFIX: &str = "fg_room_";
/// Most visitors whose renewal one room holds between ticks; past it a
/// visitor's renewal waits for their next request.
const MAX_PENDING_RENEWALS: usize = 100_000;
/// A session is renewed only while at least this much of it is left, so
/// the renewal reaches Redis (with the next tick) before the session ends
/// there: a renewal that came later would count a visitor whose seat the
/// room already gave to another.
const RENEW_FLOOR_MS: i64 = 2 * tick::TICK.as_millis() as i64;
/// Past this without a tick, a gateway stops trusting the mode it last
/// read (a `passthrough` switched back meanwhile) and uses the file's.
const STALE_MODE: Duration = Duration::from_secs(5);

/// What a guarded request gets.
#[derive(Debug)]
pub enum Visit {
    /// On to the shop, with this `Set-Cookie` value in its answer, if any.
    Pass { set_cookie: Option<String> },
    /// The room answers.
    Answer(Reply),
}

/// The proof of work a room asks before a place: the buy path's signer
/// and base difficulty.
struct Proof {
    signer: Signer,
    bits: u8,
    ttl: Duration,
}

/// One room of this gateway.
pub struct Room {
    pub config: WaitingRoomConfig,
    /// Its paths in lower case, matched against [`routed_form`].
    paths: Vec<PathPattern>,
    keys: RoomKeys,
    passes: Passes,
    cookie: String,
    page: Page,
    /// The room's state as the last tick read it.
    shared: ArcSwap<Shared>,
    /// Sessions renewed since the last tick: visitor → inside until (ms).
    renewals: Mutex<HashMap<String, i64>>,
    /// When a tick last read the room.
    last_tick: Mutex<Instant>,
    proof: Option<Proof>,
}

impl Room {
    /// The mode the last tick (or visit) saw; the file's once no tick has
    /// read the room for [`STALE_MODE`].
    pub fn mode(&self) -> RoomMode {
        let fresh = self
            .last_tick
            .lock()
            .is_ok_and(|at| at.elapsed() < STALE_MODE);
        if fresh {
            self.shared.load().mode
        } else {
            self.config.mode
        }
    }

    pub fn shared(&self) -> Shared {
        **self.shared.load()
    }

    fn seen_mode(&self, mode: RoomMode) {
        if self.shared.load().mode != mode {
            let mut shared = self.shared();
            shared.mode = mode;
            self.shared.store(shared.into());
        }
    }

    /// Seconds until `place` is let in at the measured rate; `None` while
    /// nobody has been let in lately.
    pub fn wait_seconds(&self, place: u64) -> Option<u64> {
        let rate = self.shared.load().rate_per_second;
        (rate > 1e-3).then(|| (place as f64 / rate).ceil() as u64)
    }

    fn set_cookie(&self, value: &str, max_age_s: i64, tls: bool) -> String {
        let secure = if tls { "; Secure" } else { "" };
        format!(
            "{}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
            self.cookie,
            max_age_s.max(1)
        )
    }
}

/// The rooms' metrics (`flashgate_waiting_room_*`).
pub struct RoomMetrics {
    /// Guarded requests by what the room answered.
    pub requests: IntCounterVec,
    /// Cookies refused, by why.
    pub refused: IntCounterVec,
    /// Renewals that reached Redis after their session had ended there.
    pub late_renewals: IntCounterVec,
    pub inside: GaugeVec,
    pub waiting: GaugeVec,
    /// Visitors let in per minute, measured.
    pub admission_rate: GaugeVec,
    /// The estimated wait of the last place in the queue.
    pub estimated_wait: GaugeVec,
}

impl RoomMetrics {
    fn new(registry: &Registry) -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = GaugeVec::new(Opts::new(name, help), &["room"]).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        Self {
            requests: counter(
                "waiting_room_requests_total",
                "Requests on a waiting room's paths, by answer: inside (a valid cookie, no Redis call), let_in, queued, challenge, full, passthrough, unavailable.",
                &["room", "answer"],
            ),
            refused: counter(
                "waiting_room_cookies_refused_total",
                "Waiting-room cookies refused, by reason: forged, expired, other_room.",
                &["room", "reason"],
            ),
            late_renewals: counter(
                "waiting_room_renewals_late_total",
                "Session renewals that reached Redis after the session had ended there (a tick late by more than the renewal floor); the visitor is then not counted inside until their cookie ends.",
                &["room"],
            ),
            inside: gauge("waiting_room_inside", "Visitors inside the room (Redis, last tick)."),
            waiting: gauge("waiting_room_waiting", "Visitors waiting in the room's queue (last tick)."),
            admission_rate: gauge(
                "waiting_room_admission_rate_per_minute",
                "Visitors let in per minute, measured (exponentially weighted over a minute).",
            ),
            estimated_wait: gauge(
                "waiting_room_estimated_wait_seconds",
                "Estimated wait of the last place in the queue at the measured rate (-1: not measured yet).",
            ),
        }
    }

    fn answered(&self, room: &str, answer: &str) {
        self.requests.with_label_values(&[room, answer]).inc();
    }
}

/// Every room of this gateway.
pub struct WaitingRooms {
    pub rooms: Vec<Room>,
    pub metrics: RoomMetrics,
    /// Redis's clock minus this gateway's (ms), from the last answer: the
    /// times in cookies are Redis's.
    offset_ms: AtomicI64,
}

impl WaitingRooms {
    /// The rooms of `config`, their templates read; `None` without rooms.
    ///
    /// # Errors
    /// A template that cannot be read, or a missing secret (validation
    /// already asks for it).
    pub fn new(config: &Config, registry: &Registry) -> anyhow::Result<Option<Self>> {
        let configured = &config.shop.waiting_rooms;
        if configured.is_empty() {
            return Ok(None);
        }
        let secret = config
            .waiting_room_secret
            .as_deref()
            .context("shop.waiting_rooms needs FLASHGATE_WAITING_ROOM_SECRET")?;
        let prefix = &config.gateway.path_prefix;
        let mut rooms = Vec::with_capacity(configured.len());
        for (i, room) in configured.iter().enumerate() {
            let template = match &room.template {
                Some(path) => std::fs::read_to_string(path).with_context(|| {
                    format!(
                        "shop.waiting_rooms[{i}].template: cannot read {}",
                        path.display()
                    )
                })?,
                None => page::DEFAULT_TEMPLATE.to_owned(),
            };
            let proof = if room.challenge {
                let secret = config.challenge_secret.as_deref().with_context(|| {
                    format!("shop.waiting_rooms[{i}].challenge needs FLASHGATE_CHALLENGE_SECRET")
                })?;
                Some(Proof {
                    signer: Signer::new(secret.as_bytes()),
                    bits: config.challenge.difficulty_bits,
                    ttl: config.challenge.ttl,
                })
            } else {
                None
            };
            rooms.push(Room {
                paths: room.paths.iter().map(lower_case).collect(),
                keys: RoomKeys::new(&room.name),
                passes: Passes::new(&room.name, secret.as_bytes()),
                cookie: format!("{COOKIE_PREFIX}{}", room.name),
                page: Page {
                    room: room.name.clone(),
                    template,
                    worker: format!("{prefix}/static/pow.js"),
                    refresh_seconds: room.refresh.as_secs(),
                },
                shared: ArcSwap::from_pointee(Shared {
                    mode: room.mode,
                    inside: 0,
                    waiting: 0,
                    rate_per_second: 0.0,
                    admitted: 0,
                    now_ms: 0,
                    late: 0,
                }),
                renewals: Mutex::new(HashMap::new()),
                last_tick: Mutex::new(Instant::now()),
                proof,
                config: room.clone(),
            });
        }
        Ok(Some(Self {
            rooms,
            metrics: RoomMetrics::new(registry),
            offset_ms: AtomicI64::new(0),
        }))
    }

    /// The room guarding `path` (the raw path of the request), the first
    /// that does. Matched in the form a shop routes it by, so another
    /// spelling of a guarded path (`/%63heckout/`, `//checkout/`,
    /// `/x/../checkout/`, `/CHECKOUT/`) is guarded too.
    pub fn guarding(&self, path: &str) -> Option<&Room> {
        let path = routed_form(path);
        self.rooms
            .iter()
            .find(|room| room.paths.iter().any(|p| p.matches(&path)))
    }

    pub fn by_name(&self, name: &str) -> Option<&Room> {
        self.rooms.iter().find(|room| room.config.name == name)
    }

    /// Redis's clock as this gateway reads it now.
    fn redis_now(&self, local_ms: i64) -> i64 {
        local_ms + self.offset_ms.load(Ordering::Relaxed)
    }

    pub(super) fn saw_redis_clock(&self, redis_ms: i64, local_ms: i64) {
        self.offset_ms.store(redis_ms - local_ms, Ordering::Relaxed);
    }

    /// What `req`, on a path `room` guards, gets at `local_ms` (this
    /// gateway's clock).
    pub async fn visit(
        &self,
        room: &Room,
        req: &RequestHeader,
        tls: bool,
        redis: &RedisClient,
        local_ms: i64,
    ) -> Visit {
        let name = room.config.name.as_str();
        let now_ms = self.redis_now(local_ms);
        let open = room.config.ends_at_ms.is_some_and(|end| now_ms >= end);
        // A CORS preflight asks for no page.
        if open || room.mode() == RoomMode::Passthrough || req.method == http::Method::OPTIONS {
            self.metrics.answered(name, "passthrough");
            return Visit::Pass { set_cookie: None };
        }
        let pass = match cookie(req, &room.cookie).map(|value| room.passes.verify(value)) {
            None => None,
            Some(Ok(pass)) => Some(pass),
            Some(Err(reason)) => {
                self.refused(name, reason);
                None
            }
        };
        let json = wants_json(req);
        // A form's POST (or any other method) must not read a queue page as
        // its answer: 503 with the same body and Retry-After.
        let page_load = matches!(req.method, http::Method::GET | http::Method::HEAD);
        let answer = |reply: Reply| {
            Visit::Answer(if page_load || reply.status != 200 {
                reply
            } else {
                Reply {
                    status: 503,
                    ..reply
                }
            })
        };
        let (visitor, held) = match pass {
            Some(Pass {
                visitor,
                standing: Standing::Inside { until_ms },
                ..
            }) if until_ms > now_ms => {
                self.metrics.answered(name, "inside");
                return Visit::Pass {
                    set_cookie: self.renewed(room, &visitor, until_ms, now_ms, tls),
                };
            }
            Some(Pass {
                visitor,
                standing: Standing::Waiting { score },
                expires_s,
            }) => (visitor, Some((score, expires_s))),
            Some(Pass {
                visitor,
                standing: Standing::Proving | Standing::Inside { .. },
                ..
            }) => (visitor, None),
            None => (Passes::new_visitor(), None),
        };
        if let (Some(proof), None) = (&room.proof, held) {
            if !proven(proof, req, &visitor, name, now_ms) {
                self.metrics.answered(name, "challenge");
                let issued = proof.signer.issue(
                    &visitor,
                    &room_binding(name),
                    proof.bits,
                    now_ms + proof.ttl.as_millis() as i64,
                    rand::random::<[u8; ID_BYTES]>(),
                );
                let expires_s = now_ms / 1000 + proof.ttl.as_secs() as i64;
                let cookie = room.passes.sign(&visitor, Standing::Proving, expires_s);
                let max_age = proof.ttl.as_secs() as i64;
                return answer(room.page.answer(&Shown::Proving(issued), json).header(
                    http::header::SET_COOKIE,
                    room.set_cookie(&cookie, max_age, tls),
                ));
            }
        }
        let visited =
            store::visit(redis, &room.config, &room.keys, &visitor, held.map(|h| h.0)).await;
        let (answered, now_ms) = match visited {
            Ok((answered, mode, redis_ms)) => {
                self.saw_redis_clock(redis_ms, local_ms);
                room.seen_mode(mode);
                (answered, redis_ms)
            }
            Err(error) => {
                tracing::warn!(%error, room = name, "waiting room: redis did not answer a visit");
                self.metrics.answered(name, "unavailable");
                return answer(room.page.answer(&Shown::Unavailable, json));
            }
        };
        match answered {
            Answer::Pass => {
                self.metrics.answered(name, "passthrough");
                Visit::Pass { set_cookie: None }
            }
            Answer::In { until_ms } => {
                self.metrics.answered(name, "let_in");
                let cookie = room.passes.sign(
                    &visitor,
                    Standing::Inside { until_ms },
                    (until_ms + 999) / 1000,
                );
                Visit::Pass {
                    set_cookie: Some(room.set_cookie(
                        &cookie,
                        (until_ms - now_ms + 999) / 1000,
                        tls,
                    )),
                }
            }
            Answer::Queued { place, score } => {
                self.metrics.answered(name, "queued");
                let shown = Shown::Queued {
                    place,
                    waiting: room.shared.load().waiting.max(place),
                    wait_seconds: room.wait_seconds(place),
                    opens_at_ms: room.config.starts_at_ms.filter(|at| *at > now_ms),
                };
                // A place lives a day from when it was drawn, however
                // often the visitor comes back.
                let expires_s = match held {
                    Some((held_score, expires_s)) if held_score == score => expires_s,
                    _ => now_ms / 1000 + pass::WAITING_SECONDS,
                };
                let cookie = room
                    .passes
                    .sign(&visitor, Standing::Waiting { score }, expires_s);
                answer(room.page.answer(&shown, json).header(
                    http::header::SET_COOKIE,
                    room.set_cookie(&cookie, expires_s - now_ms / 1000, tls),
                ))
            }
            Answer::Full => {
                self.metrics.answered(name, "full");
                answer(room.page.answer(&Shown::Full, json))
            }
        }
    }

    /// A session renewed once half of it is spent (and while enough is
    /// left for the renewal to reach Redis first): a new cookie now, the
    /// new end sent with the next tick.
    fn renewed(
        &self,
        room: &Room,
        visitor: &str,
        until_ms: i64,
        now_ms: i64,
        tls: bool,
    ) -> Option<String> {
        let session = room.config.session.as_millis() as i64;
        let left = until_ms - now_ms;
        if left >= session / 2 || left < RENEW_FLOOR_MS {
            return None;
        }
        let until_ms = now_ms + session;
        {
            let mut renewals = room.renewals.lock().unwrap_or_else(|p| p.into_inner());
            if renewals.len() >= MAX_PENDING_RENEWALS && !renewals.contains_key(visitor) {
                return None;
            }
            renewals.insert(visitor.to_owned(), until_ms);
        }
        let cookie = room.passes.sign(
            visitor,
            Standing::Inside { until_ms },
            (until_ms + 999) / 1000,
        );
        Some(room.set_cookie(&cookie, session / 1000, tls))
    }

    fn refused(&self, room: &str, reason: Refused) {
        self.metrics
            .refused
            .with_label_values(&[room, reason.as_str()])
            .inc();
    }
}

/// `pattern` in lower case.
fn lower_case(pattern: &PathPattern) -> PathPattern {
    match pattern {
        PathPattern::Prefix(p) => PathPattern::Prefix(p.to_ascii_lowercase()),
        PathPattern::Glob(g) => PathPattern::Glob(g.to_ascii_lowercase()),
    }
}

/// `path` as a shop may route it: percent-escapes decoded, `.` and `..`
/// segments resolved, repeated `/` collapsed, in lower case. Only for
/// matching: the shop still gets the request's own target.
fn routed_form(path: &str) -> std::borrow::Cow<'_, str> {
    let plain = !path.bytes().any(|b| b == b'%' || b.is_ascii_uppercase())
        && !path.contains("//")
        && !path.contains("/.");
    if plain {
        return std::borrow::Cow::Borrowed(path);
    }
    let raw = path.as_bytes();
    let mut decoded = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            raw[i],
            raw.get(i + 1).copied().and_then(hex),
            raw.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                decoded.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8_lossy(&decoded).to_ascii_lowercase();
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing = false;
    for segment in decoded.split('/') {
        trailing = matches!(segment, "" | "." | "..");
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = format!("/{}", segments.join("/"));
    if trailing && !segments.is_empty() {
        out.push('/');
    }
    std::borrow::Cow::Owned(out)
}

/// What a room's challenge is bound to in place of a sale.
fn room_binding(room: &str) -> String {
    format!("room:{room}")
}

/// Whether the request carries a solved challenge of this room for this
/// visitor (the `Flashgate-Pow` header, or the page's cookie).
fn proven(proof: &Proof, req: &RequestHeader, visitor: &str, room: &str, now_ms: i64) -> bool {
    let header = req
        .headers
        .get(crate::admission::token::POW_HEADER)
        .map(|v| v.as_bytes());
    let solution = header.or_else(|| cookie(req, POW_COOKIE).map(str::as_bytes));
    solution.is_some_and(|s| {
        proof
            .signer
            .verify(s, visitor, &room_binding(room), now_ms, proof.bits)
            .is_ok()
    })
}

/// Whether the client asked for JSON rather than a page.
fn wants_json(req: &RequestHeader) -> bool {
    req.headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/json") && !accept.contains("text/html"))
}

/// The `name=value` pairs of the request's `Cookie` headers, as bytes: a
/// header holding another cookie's non-ASCII value still yields the rest.
fn cookie_pairs(req: &RequestHeader) -> impl Iterator<Item = &[u8]> {
    req.headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
        .map(<[u8]>::trim_ascii)
        .filter(|pair| !pair.is_empty())
}

/// The value of cookie `name` in the request.
fn cookie<'r>(req: &'r RequestHeader, name: &str) -> Option<&'r str> {
    cookie_pairs(req)
        .filter_map(|pair| pair.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
        .find_map(|value| std::str::from_utf8(value).ok())
        .filter(|value| !value.is_empty())
}

/// Whether a cookie pair is one of the rooms' own.
fn ours(pair: &[u8]) -> bool {
    pair.starts_with(COOKIE_PREFIX.as_bytes()) || pair.starts_with(POW_COOKIE.as_bytes())
}

/// The rooms' cookies taken out of the request: they are the gateway's,
/// not the shop's, and a request carrying only them stays cacheable.
pub fn strip_cookies(req: &mut RequestHeader) -> pingora::Result<()> {
    if !cookie_pairs(req).any(ours) {
        return Ok(());
    }
    let kept: Vec<u8> = cookie_pairs(req)
        .filter(|pair| !ours(pair))
        .collect::<Vec<_>>()
        .join(&b"; "[..]);
    if kept.is_empty() {
        req.remove_header(&http::header::COOKIE);
    } else {
        let value = http::HeaderValue::from_bytes(&kept).map_err(|e| {
            pingora::Error::because(pingora::ErrorType::InvalidHTTPHeader, "cookie", e)
        })?;
        req.insert_header(http::header::COOKIE, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_spellings_of_a_guarded_path_are_matched_in_the_form_a_shop_routes() {
        for (raw, routed) in [
            ("/checkout/", "/checkout/"),
            ("/%63heckout/", "/checkout/"),
            ("//checkout//pay", "/checkout/pay"),
            ("/./checkout/", "/checkout/"),
            ("/x/../checkout/", "/checkout/"),
            ("/CHECKOUT/", "/checkout/"),
            ("/checkout/.", "/checkout/"),
            ("/%2e%2e/checkout", "/checkout"),
            ("/bad%zzpath", "/bad%zzpath"),
        ] {
            assert_eq!(routed_form(raw), routed, "{raw}");
        }
        let prefix = lower_case(&PathPattern::Prefix("/Checkout/".into()));
        assert!(prefix.matches(&routed_form("/%43heckout/pay")));
    }

    #[test]
    fn the_rooms_cookies_are_taken_out_and_the_shops_kept() {
        let mut req = RequestHeader::build("GET", b"/checkout/", None).unwrap();
        req.append_header("Cookie", "sessionid=abc; fg_room_checkout=x.y.z")
            .unwrap();
        req.append_header("Cookie", "fg_room.pow=c.1").unwrap();
        strip_cookies(&mut req).unwrap();
        assert_eq!(req.headers.get("cookie").unwrap(), "sessionid=abc");
        let mut only_ours = RequestHeader::build("GET", b"/", None).unwrap();
        only_ours
            .append_header("Cookie", "fg_room_checkout=x")
            .unwrap();
        strip_cookies(&mut only_ours).unwrap();
        assert!(only_ours.headers.get("cookie").is_none());
    }
}
