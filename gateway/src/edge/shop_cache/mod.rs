//! The edge cache of the shop's responses (`[shop.cache]`), on
//! pingora-cache: a flash sale multiplies the traffic to the shop's product,
//! list and asset pages, and most of it can be answered from here.
//!
//! - What is stored: `GET`/`HEAD` responses with status 200, 203, 204, 300,
//!   301, 308, 404 or 410 whose `Cache-Control` (`s-maxage` before `max-age`)
//!   or `Expires` gives them a lifetime, and other 2xx/3xx (but 206, 304)
//!   whose lifetime is explicit; never other 4xx/5xx (a header outside the
//!   key can provoke them: [`policy`]). Nothing marked `private` or
//!   `no-store` (unless `must-understand`), nothing with `Set-Cookie` (a
//!   session cookie must never reach another client), nothing with `Vary: *`.
//!   `no-cache` responses are stored but revalidated on every use, and never
//!   served stale.
//! - Freshness ([`freshness`], RFC 9111 §4.2 and RFC 9213):
//!   `Flashgate-Cache-Control` over `CDN-Cache-Control` over `Cache-Control`
//!   and `Expires`; `Expires` counted from the response's `Date`; the `Age`
//!   it arrives with counted, and in the `Age` served. A shop `304` updates
//!   the stored fields ([`revalidation`]); a 2xx/3xx to an unsafe method
//!   invalidates the URL ([`invalidation`]). `Vary` picks the variant by the
//!   named request headers ([`policy::variance`]; `Accept-Encoding` by the
//!   set of codings it accepts, so browsers share a copy per encoding). Only the shop's headers
//!   decide: the client's own `Cache-Control` and `Pragma` are not honoured
//!   (a crowd reloading with `no-cache` must not reach the shop).
//! - Cookies and `Authorization`: such a request is answered from the cache
//!   only by a response the shop marked `public` (or `s-maxage`), and its
//!   response is stored only if so marked. It never waits on, or holds, the
//!   fetch of an anonymous request (no cache lock), so a client cannot stall
//!   or defeat the coalescing of others by sending a cookie.
//! - Coalescing: the first miss of a URL fetches it; concurrent misses wait
//!   on pingora's cache lock (up to `shop.cache.lock_timeout_ms`) and are then
//!   answered from the stored copy; a miss whose lookup ran just before the
//!   copy landed looks again rather than fetching it twice
//!   ([`fill_lock`]). A response found uncacheable releases the
//!   waiters to the shop; a 5xx instead lets one of them fetch again (so a
//!   failing shop is not hit by the whole crowd at once). Nothing is
//!   remembered about a URL beyond its stored copy: no uncacheable
//!   predictor, since one request (a junk `Authorization` answered 401, a
//!   header outside the key that makes the shop fail or set a cookie) would
//!   otherwise switch the cache off for that URL for everyone. The cost is
//!   that requests for a URL that is never cacheable still queue behind one
//!   fetch each before going to the shop.
//! - Stale: `stale-while-revalidate` answers the stale copy and refreshes it
//!   in the background (one refresh per URL); `stale-if-error` (or
//!   `shop.cache.stale_if_error_seconds` when the shop names none) answers it
//!   while the shop fails (5xx, refused, timeout).
//! - Memory: the store ([`storage::MemoryStore`]) holds complete responses;
//!   pingora's LRU eviction manager weighs each by its header, body and URL
//!   bytes plus a fixed overhead, and evicts the least recently used past
//!   three quarters of `shop.cache.max_bytes`; the last quarter bounds the
//!   fills in progress (a fill past it is abandoned and its response passes
//!   through). Targets over 8 KiB bypass the cache.
//! - `X-Cache` on every proxied response while the cache is on: `HIT`,
//!   `MISS`, `STALE`, `REVALIDATED` (stored copy confirmed by the shop with
//!   304) or `BYPASS` (not cacheable, or not taken from the cache); beside
//!   it `Cache-Status` (RFC 9211, [`cache_status`]).
//! - Conformance: the HTTP caching test suite runs in
//!   `tests/tests/cache_conformance.rs`; the figure and the tests still
//!   failing, with reasons: docs/OPERATIONS.md "The shop cache".
//! - Purge ([`ShopCache::purge`]): by URL (every scheme, host and variant of a path
//!   and query), by path prefix, or by the shop's tags ([`tags`]), from the
//!   admin listener. Each gateway holds its own cache: the gateway that gets
//!   the purge applies it, records it in Redis and announces it on
//!   `fg:events` ([`SaleEvent::ShopPurge`]), and every other gateway applies
//!   it when it hears it (`events`); one whose subscription was down applies
//!   it from the record when it comes back, or drops its whole cache when
//!   the record cannot tell ([`purge_log`]). URLs match
//!   byte for byte as clients sent them (`?a=1&b=2` and `?b=2&a=1`, `%34`
//!   and `4` are different entries): purge by prefix to catch every
//!   spelling.
//! - Rules (`[[shop.cache.rules]]`, [`rules`]): the operator's TTLs,
//!   ignored and key cookies, bypasses and stale windows, for shops whose
//!   headers alone keep their pages out; with none, the above is all.
//!   Why a request bypassed the cache is counted by
//!   [`bypass::BypassReason`].
//!
//! Storage, eviction manager and lock must be `'static` for
//! pingora-cache: they are leaked once per gateway built.

pub mod bypass;
pub mod cache_status;
pub mod fill_lock;
pub mod freshness;
pub mod invalidation;
pub mod policy;
pub mod purge_api;
pub mod purge_log;
pub mod revalidation;
pub mod rules;
pub mod storage;
pub mod tags;

pub use purge_api::PurgeApi;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use flashgate_common::config::ShopCacheConfig;
use flashgate_common::keys::{PurgeKind, SaleEvent};
use flashgate_common::metrics::Registry;
use pingora::cache::eviction::simple_lru;
use pingora::cache::eviction::{CacheEntryKeyRef, EvictionManager};
use pingora::cache::key::CacheHashKey;
use pingora::cache::lock::CacheKeyLockImpl;
use pingora::cache::{
    CacheMeta, CacheMetaDefaults, CacheOptionOverrides, CachePhase, RespCacheable,
};
use pingora::http::ResponseHeader;
use prometheus::{IntCounterVec, IntGauge, Opts};

use fill_lock::FillLock;
use storage::{MemoryStore, StoreGauges};

/// Fills in progress hold at most `max_bytes / FILL_SHARE`; stored entries
/// the rest (config validation keeps `max_object_bytes` within the fills' share).
pub const FILL_SHARE: usize = 4;

/// After a failed fetch of a URL, its stale copy answers everyone (inside
/// its stale-if-error window) for this long before one request tries the
/// shop again.
pub const FAILED_FETCH_HOLD: Duration = Duration::from_secs(1);
/// Most URLs whose failed fetch is remembered; the record is cleared past it.
const MAX_FAILED_FETCHES: usize = 4096;

/// How a request uses the cache, decided before the lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheUse {
    /// Not a shop request, the cache is off, or the request cannot be cached
    /// (method, body, upgrade).
    #[default]
    Off,
    /// Looked up and stored by the rules of [`policy`].
    Shared,
    /// Carries `Cookie` or `Authorization`: only `public` responses.
    Credentialed,
}

/// What the cache did for one response: the `X-Cache` value and the
/// `result` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheResult {
    Hit,
    Miss,
    Stale,
    Revalidated,
    Bypass,
}

impl CacheResult {
    /// From the phase pingora-cache ended in.
    pub fn of(phase: CachePhase) -> Self {
        match phase {
            CachePhase::Hit => CacheResult::Hit,
            CachePhase::Stale | CachePhase::StaleUpdating => CacheResult::Stale,
            CachePhase::Miss | CachePhase::Expired => CacheResult::Miss,
            CachePhase::Revalidated | CachePhase::RevalidatedNoCache(_) => CacheResult::Revalidated,
            CachePhase::Disabled(_)
            | CachePhase::Bypass
            | CachePhase::Uninit
            | CachePhase::CacheKey => CacheResult::Bypass,
        }
    }

    /// The `X-Cache` header value.
    pub fn header(self) -> &'static str {
        match self {
            CacheResult::Hit => "HIT",
            CacheResult::Miss => "MISS",
            CacheResult::Stale => "STALE",
            CacheResult::Revalidated => "REVALIDATED",
            CacheResult::Bypass => "BYPASS",
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Stale => "stale",
            CacheResult::Revalidated => "revalidated",
            CacheResult::Bypass => "bypass",
        }
    }
}

/// What to purge: a URL (one path and query, every host and variant),
/// every path under a prefix, or every response the shop tagged so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeTarget {
    pub kind: PurgeKind,
    pub value: String,
}

impl PurgeTarget {
    pub fn new(kind: PurgeKind, value: impl Into<String>) -> Self {
        Self {
            kind,
            value: value.into(),
        }
    }

    pub fn label(&self) -> &'static str {
        self.kind.label()
    }

    /// The event announcing this purge by gateway `from`.
    pub fn event(&self, from: &str) -> SaleEvent {
        SaleEvent::ShopPurge {
            from: from.to_owned(),
            kind: self.kind,
            value: self.value.clone(),
        }
    }
}

/// The cache's metrics, registered into the gateway's registry.
pub struct CacheMetrics {
    /// Proxied shop responses by what the cache did.
    pub results: IntCounterVec,
    /// Purges by kind (`url`, `prefix`, `tag`, and `all`: a cache dropped
    /// because it could not be proven fresh), and objects they removed.
    pub purges: IntCounterVec,
    pub purged_objects: IntCounterVec,
    /// Client requests answered `X-Cache: BYPASS`, by why.
    pub bypasses: IntCounterVec,
}

/// The shop cache of one gateway.
pub struct ShopCache {
    /// Names this gateway's purge announcements, so it skips its own.
    pub id: String,
    store: &'static MemoryStore,
    eviction: &'static simple_lru::Manager,
    lock: &'static CacheKeyLockImpl,
    defaults: CacheMetaDefaults,
    max_object_bytes: usize,
    lock_timeout: Duration,
    /// Keys whose last fetch failed, and when.
    failed_fetches: Mutex<HashMap<u128, Instant>>,
    /// The last recorded purge applied here.
    pub purge_log: purge_log::PurgeLog,
    /// The shop's tag header (lower case), and whether clients see it.
    pub tag_header: http::HeaderName,
    pub forward_tag_header: bool,
    /// `[[shop.cache.rules]]`.
    rules: rules::Rules,
    /// URLs written to by unsafe methods ([`invalidation`]).
    pub invalidations: invalidation::Invalidations,
    pub metrics: CacheMetrics,
}

/// No heuristic freshness: a response the shop gives no lifetime is not stored.
fn no_default_freshness(_status: http::StatusCode) -> Option<Duration> {
    None
}

impl ShopCache {
    /// Builds the cache and registers its metrics (`flashgate_shop_cache_*`).
    ///
    /// # Panics
    /// Only if the metrics are registered twice into one registry.
    pub fn new(config: &ShopCacheConfig, registry: &Registry) -> Self {
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let evictions = prometheus::IntCounter::new(
            "shop_cache_evictions_total",
            "Shop responses evicted to stay under shop.cache.max_bytes.",
        )
        .expect("valid counter");
        registry
            .register(Box::new(evictions.clone()))
            .expect("unique metric");
        let gauges = StoreGauges {
            bytes: gauge(
                "shop_cache_bytes",
                "Bytes of shop responses (headers and bodies) held in the edge cache.",
            ),
            objects: gauge(
                "shop_cache_objects",
                "Shop responses held in the edge cache.",
            ),
            evictions,
        };
        let metrics = CacheMetrics {
            results: counter(
                "shop_cache_requests_total",
                "Proxied shop requests by cache result (hit, miss, stale, revalidated, bypass).",
                &["result"],
            ),
            purges: counter(
                "shop_cache_purges_total",
                "Cache purges by kind (url, prefix, tag; all: the cache dropped, not provably fresh after Redis was away).",
                &["kind"],
            ),
            purged_objects: counter(
                "shop_cache_purged_objects_total",
                "Cached responses removed by purges, by kind.",
                &["kind"],
            ),
            bypasses: counter(
                "shop_cache_bypasses_total",
                "Proxied shop requests that bypassed the cache, by reason (method, cookie, no_lifetime, set_cookie, rule_bypass, ...).",
                &["reason"],
            ),
        };
        // Fills in progress and stored entries share max_bytes.
        let fill_budget = config.max_bytes / FILL_SHARE;
        let stale_if_error = u32::try_from(config.stale_if_error.as_secs()).unwrap_or(u32::MAX);
        let store: &'static MemoryStore = Box::leak(Box::new(MemoryStore::new(
            config.max_object_bytes,
            fill_budget,
            &config.tag_header,
            gauges,
        )));
        Self {
            id: format!("{:016x}", rand::random::<u64>()),
            store,
            eviction: Box::leak(Box::new(simple_lru::Manager::new(
                config.max_bytes - fill_budget,
            ))),
            lock: Box::leak(Box::new(FillLock::new(config.lock_timeout, store))),
            defaults: CacheMetaDefaults::new(no_default_freshness, 0, stale_if_error),
            max_object_bytes: config.max_object_bytes,
            lock_timeout: config.lock_timeout,
            failed_fetches: Mutex::new(HashMap::new()),
            purge_log: purge_log::PurgeLog::default(),
            // Validated as a header name by the config.
            tag_header: http::HeaderName::from_bytes(config.tag_header.as_bytes())
                .unwrap_or(http::HeaderName::from_static("surrogate-key")),
            forward_tag_header: config.forward_tag_header,
            rules: rules::Rules::new(config),
            invalidations: invalidation::Invalidations::default(),
            metrics,
        }
    }

    /// Turns the cache on for a shop request that may use it, as
    /// `policy::request_use` decided.
    pub fn enable(&self, cache: &mut pingora::cache::HttpCache, using: CacheUse) {
        if using == CacheUse::Off {
            return;
        }
        // A credentialed request neither waits on nor holds the fetch of
        // anonymous ones: its answer may be private.
        let lock = (using == CacheUse::Shared).then_some(self.lock);
        let mut overrides = CacheOptionOverrides::default();
        overrides.wait_timeout = Some(self.lock_timeout);
        cache.enable(self.store, Some(self.eviction), None, lock, Some(overrides));
        // Pingora refuses a response over this by its Content-Length, or
        // (chunked) fails it when the body passes it.
        cache.set_max_file_size_bytes(self.max_object_bytes);
    }

    /// Whether and how long the shop's response may be stored (with the
    /// rule the request matched, if any).
    pub fn cacheable(
        &self,
        using: CacheUse,
        applied: &rules::Applied,
        resp: &ResponseHeader,
    ) -> RespCacheable {
        self.rules
            .cacheable(applied, resp, &self.defaults, |resp, defaults| {
                policy::response_cacheable(using, resp, defaults)
            })
    }

    /// `[[shop.cache.rules]]`.
    pub fn rules(&self) -> &rules::Rules {
        &self.rules
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.store.bytes()
    }

    /// Removes what `target` names; returns how many responses were removed.
    pub fn purge(&self, target: &PurgeTarget) -> usize {
        let value = target.value.clone();
        let removed = match target.kind {
            PurgeKind::Url => self.store.purge_where(move |path, _| path == value),
            PurgeKind::Prefix => self
                .store
                .purge_where(move |path, _| path.starts_with(value.as_str())),
            PurgeKind::Tag => self.store.purge_where(move |_, tags| tags.contains(&value)),
        };
        self.removed(target.label(), &removed)
    }

    /// Removes every stored response (and every fill in progress); returns
    /// how many responses were removed.
    pub fn drop_all(&self) -> usize {
        let removed = self.store.purge_where(|_, _| true);
        if removed.is_empty() {
            return 0;
        }
        self.removed("all", &removed)
    }

    fn removed(&self, kind: &str, removed: &[pingora::cache::key::CompactCacheKey]) -> usize {
        for key in removed {
            self.eviction
                .remove(CacheEntryKeyRef::from_entry_id(key, None));
        }
        self.metrics.purges.with_label_values(&[kind]).inc();
        self.metrics
            .purged_objects
            .with_label_values(&[kind])
            .inc_by(removed.len() as u64);
        removed.len()
    }

    /// Applies a purge another gateway announced; `false` for this
    /// gateway's own announcements (already applied) and other events.
    pub fn apply_announced(&self, event: &SaleEvent) -> bool {
        match event {
            SaleEvent::ShopPurge { from, kind, value } if *from != self.id => {
                let target = PurgeTarget::new(*kind, value.clone());
                let purged = self.purge(&target);
                tracing::info!(kind = target.label(), purged, from = %from, "shop cache purged as announced");
                true
            }
            _ => false,
        }
    }

    /// Notes that the shop failed to answer `key` (5xx, refused, timeout).
    pub fn fetch_failed(&self, key: &pingora::cache::CacheKey) {
        let mut failed = self
            .failed_fetches
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if failed.len() >= MAX_FAILED_FETCHES {
            failed.retain(|_, at| at.elapsed() < FAILED_FETCH_HOLD);
            if failed.len() >= MAX_FAILED_FETCHES {
                failed.clear();
            }
        }
        failed.insert(u128::from_be_bytes(key.primary_bin()), Instant::now());
    }

    /// Whether a stale copy answers without asking the shop: its fetch
    /// failed within `FAILED_FETCH_HOLD` and the copy is inside its
    /// stale-if-error window. Without this, requests waiting on the lock
    /// would each ask the failing shop in turn once the failed fetch
    /// releases it.
    pub fn serve_stale_on_recent_failure(
        &self,
        key: &pingora::cache::CacheKey,
        meta: &CacheMeta,
    ) -> bool {
        let failed = self
            .failed_fetches
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let recent = failed
            .get(&u128::from_be_bytes(key.primary_bin()))
            .is_some_and(|at| at.elapsed() < FAILED_FETCH_HOLD);
        recent && meta.serve_stale_if_error(SystemTime::now())
    }

    /// Whether a stored response may answer this request: a credentialed
    /// request takes only what the shop marked public.
    pub fn may_serve(&self, using: CacheUse, meta: &CacheMeta) -> bool {
        using != CacheUse::Credentialed || policy::shared_with_credentials(meta.response_header())
    }
}

#[async_trait::async_trait]
impl crate::sales::AnnouncedPurges for ShopCache {
    async fn catch_up(&self, client: &crate::infra::RedisClient, announced: Option<&SaleEvent>) {
        let mut seen = Vec::new();
        match self.purge_log.catch_up(client, self, &mut seen).await {
            Ok(purge_log::CatchUp::Applied(0)) => {}
            Ok(purge_log::CatchUp::Applied(n)) => {
                tracing::info!(purges = n, "shop cache purges applied from the record");
            }
            Ok(purge_log::CatchUp::Dropped(0)) => {}
            Ok(purge_log::CatchUp::Dropped(n)) => {
                tracing::warn!(
                    dropped = n,
                    "shop cache dropped: the purges since it was filled are not all on record"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the shop cache purges on record; applying the announcement alone");
            }
        }
        // An announcement its gateway could not record is applied as heard.
        if let Some(event) = announced.filter(|e| !seen.contains(e)) {
            self.apply_announced(event);
        }
    }
}
