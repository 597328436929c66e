//! The gateway's request path, as Pingora phases.
//!
//! ```text
//! early_request_filter   idle timeout of a reusable connection, request id
//! request_filter         route::classify
//!   ├─ gateway route ──► handler (auth → deduct → forward …) ─► Reply ─► write, Ok(true)
//!   └─ Route::Shop ────► Ok(false): proxied
//! upstream_peer          a healthy shop upstream (round robin), else 502
//! upstream_request_filter  hop-by-hop and Forwarded removed; X-Forwarded-For / -Proto, X-Request-Id
//! response_filter        hop-by-hop removed from the shop's answer
//! fail_to_proxy          shop unreachable or too slow: 502 / 504 JSON
//! ```
//!
//! Handlers never touch the session's response: they return a [`Reply`]
//! (or a [`Rejection`]), and [`write_reply`] is the only writer.

use std::sync::Arc;

use async_trait::async_trait;
use flashgate_common::config::{Config, DenyConfig, LimitsConfig};
use flashgate_common::now_ms;
use flashgate_common::reservation::{reservation_id, sale_of_reservation, ForwardedWinner, Reservation, ReservationStatus};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use serde_json::json;
use tracing::{debug, warn};

use crate::auth::Verifier;
use crate::client_ip::client_ip;
use crate::cluster_limit::ClusterLimit;
use crate::deduct::{deduct, remembered, BuyAttempt, Decision, DeductOutcome};
use crate::forwarder::Forwarder;
use crate::limits::{Limiters, RouteClass};
use crate::local_state::LocalSales;
use crate::metrics::Metrics;
use crate::order_cache::OrderLookups;
use crate::orders::OrderClient;
use crate::redis_client::{RedisClient, RedisError};
use crate::reply::{Rejection, Reply};
use crate::route::{classify, Route};
use crate::sales::list_sales;
use crate::state_cache::SaleStateCache;
use crate::static_pages::{PageRequest, StaticPages, SALE_PAGE};
use crate::switches::Switches;
use crate::upstreams::{hop_by_hop, ShopFailure, Upstreams};

/// Largest buy request body accepted; a buy needs no more.
pub const MAX_BUY_BODY_BYTES: usize = 4096;
/// Most header bytes (names and values) accepted on any request; real
/// browsers send a few KiB. Pingora's own limit is far larger.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Longest Idempotency-Key accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 64;

/// Shared state of the gateway, built once in `main`.
pub struct Gateway {
    pub config: Arc<Config>,
    /// Limits and deny lists; swapped whole when the config file changes.
    pub edge: Arc<arc_swap::ArcSwap<Edge>>,
    pub verifier: Verifier,
    pub redis: RedisClient,
    pub orders: Arc<OrderClient>,
    /// Reservations' orders, cached briefly for polling and retrying winners.
    pub order_lookups: OrderLookups,
    /// Queues winners for the backend, off the request path.
    pub forwarder: Forwarder,
    /// Shared with the watcher that reloads changed files.
    pub pages: Arc<StaticPages>,
    pub shop: Upstreams,
    /// `GET /api/sales/{id}` answers: one Redis read per sale per TTL.
    pub sale_states: SaleStateCache,
    /// Sale windows and sold-out flags, shared with the events listener.
    pub local: Arc<LocalSales>,
    /// Shared with the admin listener that serves `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Global switch and backlog pauses, kept current by a watcher.
    pub switches: Arc<Switches>,
}

/// The hot-reloadable part of the gateway: limiters and deny lists.
pub struct Edge {
    pub limits: LimitsConfig,
    pub limiters: Arc<Limiters>,
    pub deny: DenyConfig,
    /// The cluster-wide bucket in Redis, when configured.
    pub cluster: Option<Arc<ClusterLimit>>,
}

impl Edge {
    pub fn new(config: &Config) -> Self {
        Self::with_limiters(config, Arc::new(Limiters::new(&config.limits)))
    }

    /// An edge for `config` that keeps existing (still matching) buckets.
    pub fn with_limiters(config: &Config, limiters: Arc<Limiters>) -> Self {
        Self {
            limits: config.limits.clone(),
            limiters,
            deny: config.deny.clone(),
            cluster: config.limits.cluster_global.map(|b| Arc::new(ClusterLimit::new(b))),
        }
    }
}

/// Per-request state.
pub struct RequestCtx {
    /// Sent back to the client and to the shop or backend, for log correlation.
    pub request_id: String,
    /// Metric label of the route (bounded set).
    pub route: &'static str,
    /// Metric label of what happened (a rejection code, `won`, `replay`, `ok`).
    pub outcome: &'static str,
    pub started: std::time::Instant,
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx { request_id: String::new(), route: "shop", outcome: "ok", started: std::time::Instant::now() }
    }

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> pingora::Result<()> {
        // Pingora has already decided from the request whether the
        // connection may carry another one: not after `Connection: close`,
        // an HTTP/1.0 request without keep-alive, or a request with both
        // Content-Length and Transfer-Encoding (two parsers may frame it
        // differently: a request-smuggling vector). Only a reusable
        // connection gets the idle timeout; setting it on the others would
        // turn keepalive back on.
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(self.config.gateway.keepalive.as_secs()));
        }
        // A client trickling its body is cut off instead of holding a slot.
        session.set_read_timeout(Some(self.config.gateway.body_read_timeout));
        ctx.request_id = request_id(session.req_header());
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> pingora::Result<bool> {
        let req = session.req_header();
        let header_bytes: usize = req.headers.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
        if header_bytes > MAX_HEADER_BYTES {
            ctx.route = "invalid";
            ctx.outcome = Rejection::HeadersTooLarge.label();
            session.set_keepalive(None);
            return write_reply(session, Rejection::HeadersTooLarge.into(), ctx).await;
        }
        let method = req.method.clone();
        let path = req.uri.path().to_owned();
        let reply = match classify(&method, &path) {
            Ok(Route::Shop) => return Ok(false),
            Ok(route) => {
                keep_alive_after_early_answer(session);
                ctx.route = route.label();
                self.handle(route, session, ctx).await
            }
            Err(e) => {
                ctx.route = "invalid";
                Err(Rejection::from(e))
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(rejection) => {
                ctx.outcome = rejection.label();
                Reply::from(rejection)
            }
        };
        write_reply(session, reply, ctx).await
    }

    /// Records each request once, whoever answered it.
    async fn logging(&self, session: &mut Session, error: Option<&pingora::Error>, ctx: &mut RequestCtx) {
        let m = &self.metrics;
        if ctx.route == "shop" {
            ctx.outcome = match (error, session.response_written().map(|r| r.status.as_u16())) {
                (_, Some(502)) => "bad_gateway",
                (_, Some(504)) => "gateway_timeout",
                (_, Some(s)) if s < 400 => "ok",
                (_, Some(s)) if s < 500 => "client_error",
                (_, Some(_)) => "upstream_error",
                (Some(_), None) => "error",
                (None, None) => "ok",
            };
        }
        m.requests.with_label_values(&[ctx.route, ctx.outcome]).inc();
        m.request_duration.with_label_values(&[ctx.route]).observe(ctx.started.elapsed().as_secs_f64());
        if ctx.route == "buy" {
            m.buy_outcomes.with_label_values(&[ctx.outcome]).inc();
        }
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut RequestCtx) -> pingora::Result<Box<HttpPeer>> {
        match self.shop.peer() {
            Some(peer) => Ok(Box::new(peer)),
            None => pingora::Error::e_explain(pingora::ErrorType::ConnectNoRoute, "no healthy shop upstream"),
        }
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        for name in hop_by_hop(&upstream.headers) {
            upstream.remove_header(&name);
        }
        // The shop hears of the client only through X-Forwarded-For, which
        // ends with the peer the gateway saw; a Forwarded the client wrote
        // itself would let it name any address to the shop.
        upstream.remove_header("forwarded");
        if let Some(peer) = session.client_addr().and_then(|a| a.as_inet()) {
            let peer = peer.ip().to_canonical();
            let xff = match upstream.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
                Some(prev) => format!("{prev}, {peer}"),
                None => peer.to_string(),
            };
            upstream.insert_header("X-Forwarded-For", xff)?;
        }
        upstream.insert_header("X-Forwarded-Proto", "http")?;
        upstream.insert_header("X-Request-Id", &ctx.request_id)?;
        Ok(())
    }

    async fn response_filter(&self, _session: &mut Session, response: &mut ResponseHeader, _ctx: &mut RequestCtx) -> pingora::Result<()> {
        for name in hop_by_hop(&response.headers) {
            response.remove_header(&name);
        }
        Ok(())
    }

    /// Nothing was sent on a connection that failed to open, so another
    /// upstream may be tried (`upstream_peer` skips unhealthy ones).
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        _ctx: &mut RequestCtx,
        mut e: Box<pingora::Error>,
    ) -> Box<pingora::Error> {
        if self.shop.len() > 1 {
            e.set_retry(true);
        }
        e
    }

    /// The shop could not be reached or answered too slowly: a JSON 502 or
    /// 504, if nothing of the response was sent yet.
    async fn fail_to_proxy(&self, session: &mut Session, e: &pingora::Error, ctx: &mut RequestCtx) -> pingora::proxy::FailToProxy {
        let client_gone = *e.esource() == pingora::ErrorSource::Downstream
            && matches!(e.etype(), pingora::ErrorType::WriteError | pingora::ErrorType::ReadError | pingora::ErrorType::ConnectionClosed);
        if client_gone || session.response_written().is_some() {
            return pingora::proxy::FailToProxy { error_code: 0, can_reuse_downstream: false };
        }
        let failure = ShopFailure::classify(e);
        warn!(error = %e, ?failure, "shop request failed");
        let reply = failure.reply();
        let error_code = reply.status;
        // The request body may be half-read: do not reuse the connection.
        session.set_keepalive(None);
        if let Err(error) = write_reply(session, reply, ctx).await {
            debug!(%error, "could not answer the client");
        }
        pingora::proxy::FailToProxy { error_code, can_reuse_downstream: false }
    }
}

impl Gateway {
    /// Runs the handler of a gateway route.
    async fn handle(&self, route: Route<'_>, session: &mut Session, ctx: &mut RequestCtx) -> Result<Reply, Rejection> {
        match route {
            Route::ListSales => {
                self.admit_read(session)?;
                self.list_sales().await
            }
            Route::SaleState(id) => {
                self.admit_read(session)?;
                self.sale_state(id).await
            }
            Route::Buy(id) => self.buy(session, id, ctx).await,
            Route::Reservation(rid) => {
                let user = self.admit_user(session, RouteClass::Read)?;
                self.reservation(&user, rid).await
            }
            Route::SalePage(_) => Ok(self.pages.serve(SALE_PAGE, &PageRequest::from_headers(&session.req_header().headers))),
            Route::Asset(path) => Ok(self.pages.serve(path, &PageRequest::from_headers(&session.req_header().headers))),
            Route::Shop => Err(Rejection::NotFound("not a gateway route")),
        }
    }

    /// The client address used for limits and deny lists.
    fn client_ip(&self, session: &Session, edge: &Edge) -> std::net::IpAddr {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        client_ip(peer, &session.req_header().headers, &edge.limits.trusted_proxies, edge.limits.client_ip_header)
    }

    /// Deny list and per-IP and global buckets of sale-state reads.
    fn admit_read(&self, session: &Session) -> Result<(), Rejection> {
        let edge = self.edge.load();
        let ip = self.client_ip(session, &edge);
        if edge.deny.denies_ip(ip) {
            return Err(Rejection::Denied);
        }
        edge.limiters.check_ip(RouteClass::Read, ip).map_err(Rejection::RateLimited)?;
        edge.limiters.check_user_then_global(RouteClass::Read, None).map_err(Rejection::RateLimited)
    }

    /// Everything a signed-in user's request (a buy, a reservation
    /// lookup) must pass before Redis, cheapest first: the IP's deny list
    /// and bucket, the token, the user's deny list and bucket, the global
    /// bucket, those of `class`. Returns the verified user id.
    fn admit_user(&self, session: &Session, class: RouteClass) -> Result<String, Rejection> {
        let edge = self.edge.load();
        let ip = self.client_ip(session, &edge);
        if edge.deny.denies_ip(ip) {
            return Err(Rejection::Denied);
        }
        edge.limiters.check_ip(class, ip).map_err(Rejection::RateLimited)?;
        let user = self.user(session)?;
        if edge.deny.users.contains(&user) {
            return Err(Rejection::Denied);
        }
        edge.limiters.check_user_then_global(class, Some(&user)).map_err(Rejection::RateLimited)?;
        Ok(user)
    }

    /// The verified user id of the request's bearer token.
    fn user(&self, session: &Session) -> Result<String, Rejection> {
        self.verifier
            .verify(session.req_header().headers.get("authorization").map(|v| v.as_bytes()))
            .map_err(|e| Rejection::Unauthorized(auth_message(e)))
    }

    async fn list_sales(&self) -> Result<Reply, Rejection> {
        let sales = list_sales(&self.redis, &self.sale_states).await.map_err(|e| self.unavailable(&e))?;
        Ok(Reply::json(200, &json!({ "sales": sales })))
    }

    /// `GET /api/sales/{id}`, from the edge micro-cache.
    async fn sale_state(&self, sale_id: &str) -> Result<Reply, Rejection> {
        let view = self.sale_states.view(&self.redis, sale_id).await.map_err(|e| self.unavailable(&e))?;
        match view {
            Some(view) => Ok(Reply::json(200, &view)),
            None => Err(Rejection::NotFound("no such sale")),
        }
    }

    /// `POST /api/sales/{id}/buy`: verify, deduct once in Redis, forward a
    /// winner to the backend.
    async fn buy(&self, session: &mut Session, sale_id: &str, ctx: &mut RequestCtx) -> Result<Reply, Rejection> {
        // A sold-out sale is the commonest answer of a flash sale; without an
        // Idempotency-Key there is nothing to replay, and "sold out" says
        // nothing about the caller, so it is answered before any other work.
        if self.local.is_sold_out(sale_id) && session.req_header().headers.get("idempotency-key").is_none() {
            self.metrics.local_decisions.with_label_values(&["sold_out"]).inc();
            return Err(Rejection::SoldOut);
        }
        let user = self.admit_user(session, RouteClass::Buy)?;
        let cluster = self.edge.load().cluster.clone();
        if let Some(limit) = cluster {
            limit.check(&self.redis).await.map_err(|e| self.unavailable(&e))?.map_err(Rejection::RateLimited)?;
        }
        let idempotency_key = idempotency_key(session.req_header().headers.get("idempotency-key").map(|v| v.as_bytes()))?.to_owned();
        read_buy_body(session).await?;

        let decision = match self.local_rejection(sale_id).await? {
            None => self.deduct(sale_id, &user, &idempotency_key).await?,
            // Turned away locally; only a retry of a remembered key still
            // deserves its first outcome, so only that asks Redis: one
            // round trip, whoever holds the sale's items now. A win whose
            // order was cancelled (its item returned and sold again) is no
            // longer among the buyers, yet its key must still answer
            // `order_cancelled`, not `sold_out`. In a sold-out sale only a
            // user who ever won can have such a key; anyone else's retry is
            // answered here.
            Some(rejection) if idempotency_key.is_empty() => return Err(rejection),
            Some(Rejection::SoldOut) if !self.local.ever_won(&self.redis, sale_id, &user).await => return Err(Rejection::SoldOut),
            Some(rejection) => {
                remembered(&self.redis, sale_id, &user, &idempotency_key).await.map_err(|e| self.unavailable(&e))?.ok_or(rejection)?
            }
        };
        if decision.replayed {
            ctx.outcome = "replay";
        }
        debug!(sale = sale_id, user = %user, outcome = ?decision.outcome, replayed = decision.replayed, "deduct");
        let reply = match decision.outcome {
            // A win just now: forwarded with the script's time, the same
            // `ts` as the stream record, whichever path writes the order.
            DeductOutcome::Won { reservation_id, reserved_at_ms: Some(reserved_at_ms) } => {
                ctx.outcome = "won";
                self.queue_winner(ForwardedWinner {
                    reservation: Reservation {
                        reservation_id,
                        sale_id: sale_id.to_owned(),
                        user_id: user,
                        idempotency_key,
                        reserved_at_ms,
                    },
                    request_id: ctx.request_id.clone(),
                })
            }
            DeductOutcome::Won { reservation_id, reserved_at_ms: None } => self.replay_winner(&reservation_id).await,
            DeductOutcome::SoldOut => return Err(Rejection::SoldOut),
            DeductOutcome::LimitReached => return Err(Rejection::LimitReached),
            DeductOutcome::Ended => return Err(Rejection::Ended),
            DeductOutcome::NotStarted { starts_at_ms } => {
                let wait_ms = (starts_at_ms - now_ms()).max(0) as u64;
                return Err(Rejection::NotStarted(wait_ms.div_ceil(1000)));
            }
            DeductOutcome::Paused => return Err(Rejection::Paused),
            DeductOutcome::NotFound => return Err(self.local.missing(&self.orders, sale_id).await),
        };
        Ok(if decision.replayed { reply.header("Idempotent-Replayed", "true") } else { reply })
    }

    /// A decision this gateway can make without Redis: sold out (flagged),
    /// unknown sale, paused, not started, ended (from the cached window).
    async fn local_rejection(&self, sale_id: &str) -> Result<Option<Rejection>, Rejection> {
        if self.local.is_sold_out(sale_id) {
            self.metrics.local_decisions.with_label_values(&["sold_out"]).inc();
            return Ok(Some(Rejection::SoldOut));
        }
        if self.switches.all_paused() || self.switches.backlog_paused(sale_id) {
            self.metrics.local_decisions.with_label_values(&["paused"]).inc();
            return Ok(Some(Rejection::Paused));
        }
        let window = self.local.window(&self.redis, sale_id).await.map_err(|e| self.unavailable(&e))?;
        let rejection = match window {
            None => Some(self.local.missing(&self.orders, sale_id).await),
            Some(w) => {
                let now = now_ms();
                if now >= w.ends_at_ms {
                    Some(Rejection::Ended)
                } else if w.paused {
                    Some(Rejection::Paused)
                } else if now < w.starts_at_ms {
                    Some(Rejection::NotStarted(((w.starts_at_ms - now) as u64).div_ceil(1000)))
                } else {
                    None
                }
            }
        };
        if let Some(r) = &rejection {
            self.metrics.local_decisions.with_label_values(&[r.code()]).inc();
        }
        Ok(rejection)
    }

    /// Runs the deduct script; a sold-out answer found just now is flagged
    /// here and announced to every other gateway. A replayed one is not:
    /// it tells what an earlier attempt got, not whether stock is left.
    async fn deduct(&self, sale_id: &str, user: &str, idempotency_key: &str) -> Result<Decision, Rejection> {
        let rid = reservation_id(sale_id, rand::random());
        let attempt = BuyAttempt {
            sale_id,
            user_id: user,
            idempotency_key,
            reservation_id: &rid,
            idempotency_ttl_seconds: self.config.gateway.idempotency_ttl.as_secs(),
        };
        let timer = self.metrics.script_duration.start_timer();
        let decision = deduct(&self.redis, &attempt).await.map_err(|e| self.unavailable(&e))?;
        timer.observe_duration();
        if decision.found_sold_out() && !self.local.is_sold_out(sale_id) {
            self.local.mark_sold_out(sale_id);
            if let Ok(mut conn) = self.redis.conn().await {
                let event = flashgate_common::keys::SaleEvent::SoldOut(sale_id.to_owned());
                if let Err(error) = crate::events::publish(&mut conn, &event).await {
                    warn!(%error, sale = sale_id, "could not announce sold out");
                }
            }
        }
        Ok(decision)
    }

    /// Answers a winner `202 queued` at once: the reservation is already
    /// durable in the stream. The backend gets it in the next batch.
    fn queue_winner(&self, winner: ForwardedWinner) -> Reply {
        let body = json!({"status": "queued", "reservation_id": winner.reservation.reservation_id});
        if !self.forwarder.forward(winner) {
            self.metrics.forward_failures.with_label_values(&["queue_full"]).inc();
        }
        Reply::json(202, &body)
    }

    /// A winner retrying with their key: the order's own state once it
    /// exists (`201 confirmed`, or `410 order_cancelled` once the payment
    /// timeout cancelled it: the item is back on sale), else `202 queued`
    /// again. Nothing is forwarded again: the win's own forward or, failing
    /// that, the stream writes the order.
    async fn replay_winner(&self, rid: &str) -> Reply {
        match self.order_lookups.order(rid).await {
            Some(order) => crate::reply::replayed_order(&order),
            None => Reply::json(202, &json!({"status": "queued", "reservation_id": rid})),
        }
    }

    /// `GET /api/reservations/{id}`, for the reservation's own (admitted)
    /// user only.
    async fn reservation(&self, user: &str, rid: &str) -> Result<Reply, Rejection> {
        let sale = sale_of_reservation(rid).ok_or(Rejection::BadRequest("malformed reservation id"))?;
        let keys = flashgate_common::keys::SaleKeys::new(sale);
        let mut conn = self.redis.conn().await.map_err(|e| self.unavailable(&e))?;
        let owner: Option<String> = self
            .redis
            .bounded(redis::AsyncCommands::hget(&mut conn, &keys.reservations, rid))
            .await
            .map_err(|e| self.unavailable(&e))?
            .map_err(|e| self.unavailable(&e.into()))?;
        // Someone else's reservation is reported exactly like a missing one.
        if owner.as_deref() != Some(user) {
            return Err(Rejection::NotFound("no such reservation"));
        }
        let body = match self.order_lookups.order(rid).await {
            Some(order) => json!({"reservation_id": rid, "status": order.status, "order_id": order.order_id}),
            None => json!({"reservation_id": rid, "status": ReservationStatus::Queued}),
        };
        Ok(Reply::json(200, &body))
    }
}

impl Gateway {
    /// Counts a failed Redis call and turns it into `503 unavailable`. Not
    /// logged per request (an outage would flood the log); the breaker logs
    /// when it opens and closes.
    fn unavailable(&self, error: &RedisError) -> Rejection {
        let kind = match error {
            RedisError::Redis(_) => "error",
            RedisError::Timeout(_) => "timeout",
            RedisError::CircuitOpen => "circuit_open",
        };
        self.metrics.redis_errors.with_label_values(&[kind]).inc();
        debug!(%error, "redis unavailable");
        Rejection::Unavailable
    }
}

fn auth_message(e: crate::auth::AuthError) -> &'static str {
    match e {
        crate::auth::AuthError::Missing => "missing bearer token",
        crate::auth::AuthError::Expired => "token expired",
        crate::auth::AuthError::Invalid => "invalid token",
    }
}

/// Most answers of gateway routes (429, 410, 401, ...) are written before
/// the request body is read. Pingora closes such a connection by default,
/// which makes every rejected client reconnect. A body small enough for a
/// buy is cheap to drain after the answer, so those connections stay open;
/// larger or chunked bodies keep the default and are closed.
fn keep_alive_after_early_answer(session: &mut Session) {
    let headers = &session.req_header().headers;
    let small = match headers.get(http::header::CONTENT_LENGTH) {
        Some(v) => v.to_str().ok().and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| n <= MAX_BUY_BODY_BYTES),
        None => !headers.contains_key(http::header::TRANSFER_ENCODING),
    };
    if small {
        session.set_close_on_response_before_downstream_finish(false);
    }
}

/// Validates the optional `Idempotency-Key`: 1 to 64 printable ASCII
/// characters. Absent means "" (no idempotency).
fn idempotency_key(value: Option<&[u8]>) -> Result<&str, Rejection> {
    let Some(v) = value else { return Ok("") };
    let ok = (1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&v.len()) && v.iter().all(|b| (0x20..0x7f).contains(b));
    if !ok {
        return Err(Rejection::BadRequest("Idempotency-Key must be 1 to 64 printable ASCII characters"));
    }
    // Checked ASCII above.
    std::str::from_utf8(v).map_err(|_| Rejection::BadRequest("Idempotency-Key must be ASCII"))
}

/// Reads the buy body: empty, or a JSON object of at most
/// [`MAX_BUY_BODY_BYTES`]. Nothing in it is needed today, but garbage is
/// refused rather than silently accepted.
async fn read_buy_body(session: &mut Session) -> Result<(), Rejection> {
    let declared = session.req_header().headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BUY_BODY_BYTES) {
        return Err(Rejection::PayloadTooLarge);
    }
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BUY_BODY_BYTES {
                    return Err(Rejection::PayloadTooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(_) => return Err(Rejection::BadRequest("unreadable request body")),
        }
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => Err(Rejection::BadRequest("body must be empty or a JSON object")),
    }
}

/// The client's `X-Request-Id` when it is short and printable, else a new one.
fn request_id(req: &RequestHeader) -> String {
    match req.headers.get("x-request-id").map(|v| v.as_bytes()) {
        Some(v) if (1..=64).contains(&v.len()) && v.iter().all(|b| b.is_ascii_graphic()) => String::from_utf8_lossy(v).into_owned(),
        _ => format!("{:032x}", rand::random::<u128>()),
    }
}

/// Writes a reply: always with `Content-Length` (a response without it is
/// close-delimited and ends keepalive), without a body for HEAD and 304.
async fn write_reply(session: &mut Session, reply: Reply, ctx: &RequestCtx) -> pingora::Result<bool> {
    let head = session.req_header().method == http::Method::HEAD;
    let mut header = ResponseHeader::build(reply.status, Some(reply.headers.len() + 4))?;
    header.insert_header("Content-Type", reply.content_type)?;
    header.insert_header("Content-Length", reply.body.len().to_string())?;
    header.insert_header("X-Request-Id", &ctx.request_id)?;
    if reply.content_type == "application/json" {
        header.insert_header("Cache-Control", "no-store")?;
    }
    for (name, value) in reply.headers {
        header.insert_header(name, value)?;
    }
    let body_follows = !head && reply.status != 304 && !reply.body.is_empty();
    session.write_response_header(Box::new(header), !body_follows).await?;
    if body_follows {
        session.write_response_body(Some(reply.body), true).await?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_must_be_short_printable_ascii() {
        assert_eq!(idempotency_key(None), Ok(""));
        assert_eq!(idempotency_key(Some(b"retry-1")), Ok("retry-1"));
        assert!(idempotency_key(Some(b"")).is_err());
        assert!(idempotency_key(Some(&[b'a'; 65])).is_err());
        assert!(idempotency_key(Some("clé".as_bytes())).is_err());
        assert!(idempotency_key(Some(b"a\x01b")).is_err());
    }
}
