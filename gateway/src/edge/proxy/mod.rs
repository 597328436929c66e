//! The Pingora adapter: the gateway's request path, phase by phase. The
//! phases only translate, request to call and outcome to reply; the buy
//! rules live in [`crate::buy`], sale state in [`crate::sales`], admission
//! in [`crate::admission`].
//!
//! ```text
//! early_request_filter   idle timeout of a reusable connection, request id
//! request_filter         headers too large? ─► 431
//!                        Routes::classify
//!   ├─ Route::Buy ─────► BuyService::answer_early ─► body read ─► BuyService::admit ─► BuyService::prove ─► BuyService::buy ─► BuyOutcome
//!   ├─ sale reads ─────► Admission::read ─► SaleCache::{list, view}
//!   ├─ Route::Challenge ─► Admission::user (read buckets) ─► ChallengeGate::offer
//!   ├─ Route::Reservation ► Admission::user ─► BuyService::reservation
//!   ├─ pages, assets ──► StaticPages::serve ─► Page (head built at load) ─► write_page
//!   │                    a rejection ─► its answer kept per thread (answers.rs) ─► write_rejection
//!   │                    every other answer ─► Reply (reply.rs) ─► write_reply, Ok(true)
//!   └─ Route::Shop ────► a waiting room's path? WaitingRooms::visit (waiting_room/):
//!                        queue page, challenge or 503 answered here; else Ok(false): proxied
//! request_cache_filter   [shop.cache] on: GET/HEAD use the edge cache (shop_cache),
//!                        as [[shop.cache.rules]] adjust (bypass, ignored cookies)
//!   cache_key_callback   scheme + host + raw target (path and query)
//!   cache_vary_filter    the variant the response's Vary and the key cookies name
//!   cache_hit_filter     Cookie/Authorization take only public copies; copies an
//!                        unsafe method invalidated are revalidated
//!   should_serve_stale   stale-while-revalidate, stale-if-error on shop failures
//!   hit or stale ──────► answered from the cache; else to the shop:
//! upstream_peer          a healthy shop upstream (round robin over the addresses
//!                        shop.upstreams resolve to), its origin kept in ctx, else 502
//!   (plain HTTP with gateway.tls.redirect_http: GET/HEAD of pages ─► 308 to HTTPS, tls::redirect)
//! upstream_request_filter  hop-by-hop and Forwarded removed; X-Forwarded-For / -Proto / -Host,
//!                        X-Real-IP (forwarded.rs), X-Request-Id; cached requests: X-Original-URL
//!                        & co removed; Host = shop.host_header when fixed
//! upstream_response_filter  a 304 to a revalidation kept: its fields update the stored copy
//! response_cache_filter  may the shop's answer be stored, for how long
//! response_filter        hop-by-hop removed from the shop's answer; its tag header (shop_cache::tags);
//!                        X-Cache, Cache-Status; a 2xx/3xx to an unsafe method invalidates its URLs
//! fail_to_proxy          shop unreachable or too slow: 502 / 504 JSON
//! logging                requests / duration / buy outcome metrics, once per request
//! ```
//!
//! Handlers never touch the session's response: they return a [`Reply`]
//! (or a [`Rejection`]), and [`session::write_page`] is the only writer
//! (through `write_reply` and `write_rejection`).
//!
//! Pingora boxes the `request_filter` future on every request, so its size
//! is paid by every request, page views and sold-out answers included. The
//! large futures only some routes need are held out of line with
//! `Box::pin` (the buy, the reservation lookup, moka's single-flight reads
//! in `sales`, the first connect in `RedisClient::conn`); a new route or
//! await that is large (anything holding a Redis or backend call) should be
//! boxed the same way. `RUSTC_BOOTSTRAP=1 cargo rustc -p flashgate --lib --
//! -Zprint-type-sizes` lists the sizes.

mod answers;
mod compress;
pub mod ctx;
pub mod forwarded;
pub mod session;

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use flashgate_common::config::{Config, HostHeader};
use pingora::cache::key::HashBinary;
use pingora::cache::{
    CacheKey, CacheMeta, ForcedFreshness, HitHandler, NoCacheReason, RespCacheable,
};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use serde_json::json;
use tracing::{debug, warn};

pub use ctx::{Outcome, RequestCtx};

use crate::admission::ChallengeGate;
use crate::admission::RouteClass;
use crate::admission::{Admission, OwnOrigin};
use crate::buy::{BuyOutcome, BuyRequest, BuyService};
use crate::edge::reply::Reply;
use crate::edge::route::{Route, Routes};
use crate::edge::shop_cache::bypass::BypassReason;
use crate::edge::shop_cache::rules::Rules;
use crate::edge::shop_cache::{
    cache_status, invalidation, policy, revalidation, CacheResult, CacheUse, ShopCache,
};
use crate::edge::static_pages::{PageRequest, StaticPages, SALE_PAGE};
use crate::edge::upstreams::{default_host, hop_by_hop, ShopFailure, Upstreams};
use crate::edge::waiting_room::{self, Visit, WaitingRooms};
use crate::infra::Metrics;
use crate::infra::OrderClient;
use crate::infra::RedisClient;
use crate::infra::RouteKind;
use crate::rejection::{unavailable, Rejection};
use crate::sales::SaleCache;
use crate::sales::Switches;
use session::{
    keep_alive_after_early_answer, peer, read_buy_body, request_id, write_page, write_rejection,
    write_reply,
};

/// Answers `rejection` and records it as the request's outcome.
async fn reject(
    session: &mut Session,
    rejection: Rejection,
    ctx: &mut RequestCtx,
) -> pingora::Result<bool> {
    let written = write_rejection(session, &rejection, ctx).await;
    ctx.outcome = Outcome::Rejected(rejection);
    written
}

/// Shared state of the gateway, built once in `server`.
pub struct Gateway {
    pub config: Arc<Config>,
    /// Deny lists, buckets and tokens; its edge is swapped by the config watcher.
    pub admission: Arc<Admission>,
    /// The buy rules.
    pub buy: BuyService,
    /// The proof of work a buy must carry (shared with the buy rules):
    /// `GET /flashgate/api/sales/{id}/challenge` offers one.
    pub challenge: Arc<ChallengeGate>,
    /// One snapshot per sale, shared with the buy rules and the events listener.
    pub sales: Arc<SaleCache>,
    pub redis: Arc<RedisClient>,
    /// The order backend's client, shared with the buy rules (readiness
    /// checks it).
    pub orders: Arc<OrderClient>,
    /// Which paths are the gateway's (`gateway.path_prefix`), the rest the shop's.
    pub routes: Routes,
    /// Shared with the watcher that reloads changed files.
    pub pages: Arc<StaticPages>,
    pub shop: Upstreams,
    /// Shared with the admin listener that serves `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Global switch and backlog pauses, kept current by a watcher.
    pub switches: Arc<Switches>,
    /// The edge cache of the shop's responses; `None` while `shop.cache.enabled` is false.
    pub shop_cache: Option<Arc<ShopCache>>,
    /// The waiting rooms in front of the shop's pages; `None` without rooms.
    pub rooms: Option<Arc<WaitingRooms>>,
    /// The HTTPS listener's certificates (kept current by their watcher):
    /// a redirect names only hosts they cover.
    pub certs: Option<Arc<arc_swap::ArcSwap<crate::edge::tls::CertSet>>>,
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new()
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
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
        ctx.tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        Ok(())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        if session::headers_too_large(session.req_header()) {
            ctx.route = RouteKind::Invalid;
            session.set_keepalive(None);
            return reject(session, Rejection::HeadersTooLarge, ctx).await;
        }
        // Only origin-form targets (`/path?query`): the gateway routes and
        // the cache key read the parsed path, while the shop gets the raw
        // target, and pingora parses other forms (`x:/search`, `*`,
        // `http://host/path`) to a path the shop never sees.
        if session.req_header().raw_path().first() != Some(&b'/') {
            ctx.route = RouteKind::Invalid;
            let rejection =
                Rejection::BadRequest("the request target must be a path starting with /");
            return reject(session, rejection, ctx).await;
        }
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_owned();
        let route = self.routes.classify(&method, &path);
        if let (Ok(route), Some(https_port)) = (&route, self.https_redirect_port(ctx)) {
            if crate::edge::tls::redirect::applies(&method, &path, route) {
                keep_alive_after_early_answer(session);
                ctx.route = route.kind();
                let reply = self.redirect_to_https(session.req_header(), https_port, ctx);
                return write_reply(session, reply, ctx).await;
            }
        }
        let reply = match route {
            Ok(Route::Shop) => {
                if let Some(rooms) = &self.rooms {
                    if let Some(room) = rooms.guarding(&path) {
                        let now_ms = flashgate_common::now_ms();
                        let visit =
                            rooms.visit(room, session.req_header(), ctx.tls, &self.redis, now_ms);
                        match Box::pin(visit).await {
                            Visit::Pass { set_cookie } => ctx.room_cookie = set_cookie,
                            Visit::Answer(reply) => {
                                keep_alive_after_early_answer(session);
                                ctx.route = RouteKind::WaitingRoom;
                                return write_reply(session, reply, ctx).await;
                            }
                        }
                    }
                    waiting_room::strip_cookies(session.req_header_mut())?;
                }
                if self.shop_cache.is_some() || self.config.shop.compression.is_some() {
                    compress::normalize(session.req_header_mut(), self.config.shop.compression);
                }
                return Ok(false);
            }
            Ok(route @ (Route::SalePage(_) | Route::Asset(_))) => {
                keep_alive_after_early_answer(session);
                ctx.route = route.kind();
                let rel = match route {
                    Route::Asset(path) => path,
                    _ => SALE_PAGE,
                };
                // A missing file is answered like any 404 but keeps the
                // `ok` outcome label pages always had.
                return match self.pages.serve(
                    rel,
                    &PageRequest::from_headers(&session.req_header().headers),
                ) {
                    Ok(page) => write_page(session, page, ctx).await,
                    Err(rejection) => write_rejection(session, &rejection, ctx).await,
                };
            }
            Ok(route) => {
                keep_alive_after_early_answer(session);
                ctx.route = route.kind();
                self.handle(route, session, ctx).await
            }
            Err(e) => {
                ctx.route = RouteKind::Invalid;
                Err(Rejection::from(e))
            }
        };
        match reply {
            Ok(reply) => write_reply(session, reply, ctx).await,
            Err(rejection) => reject(session, rejection, ctx).await,
        }
    }

    /// Records each request once, whoever answered it.
    async fn logging(
        &self,
        session: &mut Session,
        error: Option<&pingora::Error>,
        ctx: &mut RequestCtx,
    ) {
        let m = &self.metrics;
        if ctx.route == RouteKind::Shop {
            ctx.outcome = Outcome::of_shop(
                session.response_written().map(|r| r.status.as_u16()),
                error.is_some(),
            );
        }
        m.per_request.record(
            ctx.route,
            ctx.outcome.as_str(),
            ctx.started.elapsed().as_secs_f64(),
        );
        // A background refresh (stale-while-revalidate) is not a client's request.
        if let (Some(cache), RouteKind::Shop, None) =
            (&self.shop_cache, ctx.route, &session.subrequest_ctx)
        {
            let result = if ctx.stale_on_error {
                CacheResult::Stale
            } else {
                CacheResult::of(session.cache.phase())
            };
            cache
                .metrics
                .results
                .with_label_values(&[result.label()])
                .inc();
            if result == CacheResult::Bypass {
                let reason = ctx.cache_rule.bypass.unwrap_or_else(|| {
                    BypassReason::of_phase(
                        session.cache.phase(),
                        session.response_written(),
                        ctx.cache_rule.credential,
                    )
                });
                cache
                    .metrics
                    .bypasses
                    .with_label_values(&[reason.label()])
                    .inc();
            }
        }
    }

    /// Only shop requests get here (gateway routes answered in `request_filter`).
    fn request_cache_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if let Some(cache) = &self.shop_cache {
            let req = session.req_header();
            (ctx.cache, ctx.cache_rule) = cache.rules().apply(req, policy::request_use(req));
            cache.enable(&mut session.cache, ctx.cache);
        }
        Ok(())
    }

    fn cache_key_callback(
        &self,
        session: &Session,
        _ctx: &mut RequestCtx,
    ) -> pingora::Result<CacheKey> {
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        Ok(policy::cache_key(session.req_header(), tls))
    }

    fn upstream_response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Option<std::time::Duration>> {
        compress::finish_brotli(session, body, end_of_stream, &mut ctx.brotli_closed);
        Ok(None)
    }

    /// The shop's response marked when pingora compresses it; a `304` to a
    /// revalidation kept for `response_cache_filter`.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        compress::mark(session, resp);
        if resp.status == http::StatusCode::NOT_MODIFIED && ctx.cache != CacheUse::Off {
            ctx.not_modified = Some(Box::new(resp.clone()));
        }
        Ok(())
    }

    fn response_cache_filter(
        &self,
        _session: &Session,
        resp: &ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<RespCacheable> {
        let updated;
        let resp = match ctx.not_modified.take() {
            Some(not_modified) => {
                updated = revalidation::updated(resp, &not_modified);
                &updated
            }
            None => resp,
        };
        Ok(match &self.shop_cache {
            Some(cache) => cache.cacheable(ctx.cache, &ctx.cache_rule, resp),
            None => RespCacheable::Uncacheable(NoCacheReason::NeverEnabled),
        })
    }

    fn cache_vary_filter(
        &self,
        meta: &CacheMeta,
        ctx: &mut RequestCtx,
        req: &RequestHeader,
    ) -> Option<HashBinary> {
        let vary = policy::variance(meta, req);
        match &self.shop_cache {
            Some(cache) => cache.rules().variance(&ctx.cache_rule, vary),
            None => vary,
        }
    }

    /// A stored copy the shop did not mark public is not for a request with
    /// `Cookie` or `Authorization`: it goes to the shop.
    /// While a recent fetch of the URL failed, a stale copy inside its
    /// stale-if-error window answers at once (`X-Cache: STALE`).
    async fn cache_hit_filter(
        &self,
        session: &mut Session,
        meta: &CacheMeta,
        _hit: &mut HitHandler,
        is_fresh: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Option<ForcedFreshness>> {
        let Some(cache) = &self.shop_cache else {
            return Ok(None);
        };
        // Only credentialed requests are force-missed, and they hold no cache
        // lock: a locked request force-missed on a stored copy would be sent
        // back to look again by `FillLock` until pingora's retry limit.
        if !cache.may_serve(ctx.cache, meta) {
            return Ok(Some(ForcedFreshness::ForceMiss));
        }
        let path = invalidation::path_of(session.req_header());
        if cache.invalidations.is_invalid(&path, meta.updated()) {
            return Ok(Some(ForcedFreshness::ForceExpired));
        }
        if !is_fresh && cache.serve_stale_on_recent_failure(session.cache.cache_key(), meta) {
            ctx.stale_on_error = true;
            return Ok(Some(ForcedFreshness::ForceFresh));
        }
        Ok(None)
    }

    /// While revalidating (no error) the stored windows decide; on an
    /// error, any failure but the client's own serves stale if allowed.
    /// A shop failure is remembered for the requests after it
    /// (`cache_hit_filter`).
    fn should_serve_stale(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
        error: Option<&pingora::Error>,
    ) -> bool {
        let Some(error) = error else { return true };
        let shop_failed = *error.esource() != pingora::ErrorSource::Downstream;
        if let (true, Some(cache)) = (shop_failed && session.cache.enabled(), &self.shop_cache) {
            cache.fetch_failed(session.cache.cache_key());
        }
        shop_failed
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        match self.shop.peer() {
            Some((peer, origin)) => {
                ctx.origin = Some(origin);
                Ok(Box::new(peer))
            }
            None => pingora::Error::e_explain(
                pingora::ErrorType::ConnectNoRoute,
                "no healthy shop upstream",
            ),
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
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let (client, chain_trusted) = self.admission.forwarding(
            peer.unwrap_or(IpAddr::from([0, 0, 0, 0])),
            &upstream.headers,
        );
        let view = forwarded::ClientView {
            peer,
            client,
            chain_trusted,
            tls: ctx.tls,
        };
        forwarded::apply(upstream, &view)?;
        upstream.insert_header("X-Request-Id", &ctx.request_id)?;
        // The shop must answer what the cache key names, whatever other
        // host, path or method the client's headers claim.
        if ctx.cache != CacheUse::Off {
            policy::strip_unkeyed(upstream)?;
            // Cookies a rule ignores are not the shop's business here.
            Rules::upstream_cookie(&ctx.cache_rule, upstream)?;
        }
        match (&self.config.shop.host_header, &ctx.origin) {
            (HostHeader::Fixed(name), _) => upstream.insert_header(http::header::HOST, name)?,
            (HostHeader::Client, Some(origin))
                if !upstream.headers.contains_key(http::header::HOST) =>
            {
                upstream.insert_header(http::header::HOST, default_host(origin))?;
            }
            (HostHeader::Client, _) => {}
        }
        if let (Some(levels), RouteKind::Shop) = (self.config.shop.compression, ctx.route) {
            compress::enable(session, upstream, levels);
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        for name in hop_by_hop(&response.headers) {
            response.remove_header(&name);
        }
        compress::unmark(response);
        if let Some(cookie) = ctx.room_cookie.take() {
            response.append_header(http::header::SET_COOKIE, cookie)?;
        }
        if let (Some(cache), RouteKind::Shop) = (&self.shop_cache, ctx.route) {
            // The shop's tags name its internals: kept for purges, not shown.
            if !cache.forward_tag_header {
                response.remove_header(&cache.tag_header);
            }
            let result = match (ctx.cache, ctx.stale_on_error) {
                (CacheUse::Off, _) => CacheResult::Bypass,
                (_, true) => CacheResult::Stale,
                _ => CacheResult::of(session.cache.phase()),
            };
            response.insert_header("X-Cache", result.header())?;
            let ours = cache_status::value(
                ctx.cache == CacheUse::Off,
                ctx.stale_on_error,
                session.cache.phase(),
                session.cache.maybe_cache_meta(),
                std::time::SystemTime::now(),
            );
            // The shop's own caches come first (RFC 9211 §2).
            let value = match response.headers.get("cache-status").map(|v| v.to_str()) {
                Some(Ok(theirs)) => format!("{theirs}, {ours}"),
                _ => ours,
            };
            response.insert_header("Cache-Status", value)?;
            let written = invalidation::targets(session.req_header(), response);
            cache
                .invalidations
                .record(written, std::time::SystemTime::now());
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
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora::Error,
        ctx: &mut RequestCtx,
    ) -> pingora::proxy::FailToProxy {
        let client_gone = *e.esource() == pingora::ErrorSource::Downstream
            && matches!(
                e.etype(),
                pingora::ErrorType::WriteError
                    | pingora::ErrorType::ReadError
                    | pingora::ErrorType::ConnectionClosed
            );
        if client_gone || session.response_written().is_some() {
            return pingora::proxy::FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let failure = ShopFailure::classify(e);
        warn!(error = %e, ?failure, "shop request failed");
        let mut reply = failure.reply();
        // A visitor let in keeps their seat even when the shop failed.
        if let Some(cookie) = ctx.room_cookie.take() {
            reply = reply.header(http::header::SET_COOKIE, cookie);
        }
        let error_code = reply.status;
        // The request body may be half-read: do not reuse the connection.
        session.set_keepalive(None);
        if let Err(error) = write_reply(session, reply, ctx).await {
            debug!(%error, "could not answer the client");
        }
        pingora::proxy::FailToProxy {
            error_code,
            can_reuse_downstream: false,
        }
    }
}

impl Gateway {
    /// The HTTPS port to send plain page requests to, when
    /// `gateway.tls.redirect_http` is on and this request is plain.
    fn https_redirect_port(&self, ctx: &RequestCtx) -> Option<u16> {
        let tls = self
            .config
            .gateway
            .tls
            .as_ref()
            .filter(|t| t.redirect_http)?;
        (!ctx.tls).then_some(tls.redirect_port)
    }

    /// `308` to the same path over HTTPS, or `400` when the request names
    /// no host that can go into a `Location` (see `tls::redirect::location`).
    fn redirect_to_https(
        &self,
        req: &RequestHeader,
        https_port: u16,
        ctx: &mut RequestCtx,
    ) -> Reply {
        let host = req
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| req.uri.host());
        let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let certs = self.certs.as_ref().map(|c| c.load());
        let covers = |h: &str| certs.as_ref().is_some_and(|c| c.covers(h));
        match crate::edge::tls::redirect::location(host, target, https_port, covers) {
            Some(location) => {
                ctx.outcome = Outcome::RedirectedToHttps;
                Reply::json(308, &json!({"code": "https_required", "message": "this page is served over HTTPS", "location": location}))
                    .header(http::header::LOCATION, location)
            }
            None => {
                let rejection = Rejection::BadRequest("a Host header naming this site is required");
                ctx.outcome = Outcome::Rejected(rejection.clone());
                Reply::from(rejection)
            }
        }
    }

    /// Runs the handler of a gateway route: plain calls, one per route.
    async fn handle(
        &self,
        route: Route<'_>,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Reply, Rejection> {
        let headers = &session.req_header().headers;
        let now_ms = flashgate_common::now_ms;
        match route {
            Route::ListSales => {
                self.admission.read(peer(session), headers)?;
                let sales = self
                    .sales
                    .list(&self.redis, now_ms())
                    .await
                    .map_err(|e| unavailable(&self.metrics, &e))?;
                Ok(Reply::json(200, &json!({ "sales": sales })))
            }
            Route::SaleState(id) => {
                self.admission.read(peer(session), headers)?;
                match self
                    .sales
                    .view(&self.redis, id, now_ms())
                    .await
                    .map_err(|e| unavailable(&self.metrics, &e))?
                {
                    Some(view) => Ok(Reply::json(200, &view)),
                    None => Err(Rejection::NotFound("no such sale")),
                }
            }
            Route::Buy(sale_id) => {
                let client = peer(session);
                self.buy.answer_early(sale_id, client, headers)?;
                // The body before the token: a bad one is refused without
                // checking a signature.
                read_buy_body(session, self.config.gateway.body_read_timeout).await?;
                let headers = &session.req_header().headers;
                // The origin this request was sent to (scheme by listener),
                // for the CSRF check of a buy signed in by cookie.
                let own_origin = OwnOrigin {
                    tls: ctx.tls,
                    host: headers
                        .get(http::header::HOST)
                        .and_then(|v| v.to_str().ok())
                        .or_else(|| session.req_header().uri.authority().map(|a| a.as_str())),
                };
                let admitted = self.buy.admit(sale_id, headers, own_origin).await?;
                self.buy.prove(sale_id, &admitted, client, headers).await?;
                let (user, idempotency_key) = (&admitted.user, &admitted.idempotency_key);
                // Boxed, as the reservation lookup below: these futures are
                // the largest of any route, and held inline they would grow
                // every request's future (moved into its box per request),
                // the static pages' and the sold-out answers' included.
                let buy = BuyRequest {
                    sale_id,
                    user,
                    idempotency_key,
                    request_id: &ctx.request_id,
                };
                let outcome = Box::pin(self.buy.buy(buy)).await;
                ctx.outcome = match &outcome {
                    BuyOutcome::Won { .. } => Outcome::Won,
                    BuyOutcome::Replayed { .. } => Outcome::Replay,
                    BuyOutcome::Refused(r) => Outcome::Rejected(r.clone()),
                };
                Ok(Reply::from(outcome))
            }
            Route::Challenge(sale_id) => {
                let user = self
                    .admission
                    .user(RouteClass::Read, peer(session), headers)
                    .await?;
                let ip = self.admission.client_ip(peer(session), headers);
                match self.challenge.offer(sale_id, &user, ip, now_ms()) {
                    Some(issued) => Ok(Reply::json(
                        200,
                        &crate::edge::reply::challenge_fields(&issued),
                    )
                    .header(http::header::CACHE_CONTROL, "no-store")),
                    None => Err(Rejection::NotFound(
                        "this gateway asks no proof of work: buy without one",
                    )),
                }
            }
            Route::Reservation(rid) => {
                let user = self
                    .admission
                    .user(RouteClass::Read, peer(session), headers)
                    .await?;
                let view = Box::pin(self.buy.reservation(&user, rid)).await?;
                Ok(Reply::json(200, &view))
            }
            // Answered in `request_filter`, with their prebuilt heads.
            Route::SalePage(_) | Route::Asset(_) | Route::Shop => {
                Err(Rejection::NotFound("not a gateway route"))
            }
        }
    }
}
