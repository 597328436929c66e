//! The gateway's Prometheus metrics, registered once into a registry the
//! gateway owns (tests can build two gateways without clashes) and served
//! by the admin listener at `/metrics`.
//!
//! Labels are bounded enums only: no user ids, IPs or reservation ids.
//!
//! The per-request metrics ([`RequestMetrics`]) keep each labelled child
//! once it was first used: counting a request is then an atomic add, not a
//! hash of its labels and a lock of the family (`with_label_values`) three
//! times per request. Children are still made on first use, so `/metrics`
//! lists exactly the series that happened.

use std::sync::OnceLock;

use flashgate_common::metrics::Registry;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    TextEncoder,
};

/// Latency buckets from 100 µs to 5 s: edge answers are sub-millisecond,
/// Redis and backend calls a few milliseconds, timeouts up to seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Attempts per batched deduct call: 1 at low load, up to the batcher's
/// most (`buy::deduct::batch::MAX_BATCH`, which checks it is the last).
pub(crate) const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 48.0, 64.0];

/// Difficulty buckets, in bits: each bit doubles the work.
const DIFFICULTY_BUCKETS: &[f64] = &[
    0.0, 4.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0, 28.0, 32.0,
];

/// The `route` metric label: a route without its ids, or a request that
/// named no route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    ListSales,
    SaleState,
    Buy,
    Challenge,
    Reservation,
    Page,
    Asset,
    Shop,
    /// A shop request a waiting room answered (queue page, challenge, full).
    WaitingRoom,
    /// Refused before it was routed (bad id, wrong method, huge headers).
    Invalid,
}

impl RouteKind {
    /// How many kinds there are: [`RouteKind::index`] is below it.
    pub const COUNT: usize = RouteKind::Invalid as usize + 1;

    /// A dense index, for per-route tables (`metrics`).
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::ListSales => "list_sales",
            RouteKind::SaleState => "sale_state",
            RouteKind::Buy => "buy",
            RouteKind::Challenge => "challenge",
            RouteKind::Reservation => "reservation",
            RouteKind::Page => "page",
            RouteKind::Asset => "asset",
            RouteKind::Shop => "shop",
            RouteKind::WaitingRoom => "waiting_room",
            RouteKind::Invalid => "invalid",
        }
    }
}

pub struct Metrics {
    pub registry: Registry,
    /// `requests`, `request_duration` and `buy_outcomes`, recorded once
    /// per request with their children kept.
    pub per_request: RequestMetrics,
    /// Every request, by route and outcome.
    pub requests: IntCounterVec,
    /// Buy attempts by outcome (won, sold_out, rate_limited_user, ...).
    pub buy_outcomes: IntCounterVec,
    /// Whole edge request, by route.
    pub request_duration: HistogramVec,
    /// One deduct as its buyer waits for it: the script call, and the
    /// wait for a call slot of its sale when its batch queued.
    pub script_duration: Histogram,
    /// Buy attempts per deduct script call (`buy::deduct::batch`): its count is
    /// the number of calls, its sum the attempts they decided.
    pub deduct_batch_size: Histogram,
    /// One winner forward to the backend.
    pub forward_duration: Histogram,
    /// Redis calls that failed, by kind (error, timeout, circuit_open,
    /// queue_full).
    pub redis_errors: IntCounterVec,
    /// 0 closed, 1 open, 2 half-open.
    pub circuit_state: IntGauge,
    /// Buys decided from local sale state without Redis, by decision.
    pub local_decisions: IntCounterVec,
    /// `local_decisions{decision="sold_out"}`, resolved once: the
    /// commonest answer of a flash sale.
    pub local_sold_out: IntCounter,
    /// `local_decisions{decision="not_started"}`, resolved once: the
    /// answer to the crowd clicking before the start.
    pub local_not_started: IntCounter,
    /// Winner forwards that failed (the order then comes from the stream).
    pub forward_failures: IntCounterVec,
    /// Buys the deduct script refused because their sale is fenced (its
    /// Redis became a master since the sale last agreed with the database).
    pub fenced_buys: IntCounter,
    /// Transfers between the buckets of bucketed sales this gateway tried,
    /// by what the donor answered: `moved`, `empty`, `in_transit`,
    /// `unavailable` (fenced or absent).
    pub bucket_transfers: IntCounterVec,
    /// Redis `WAIT` calls for replica acknowledgement (`redis.wait_replicas`);
    /// beside the wins, it shows how many wins one `WAIT` covers.
    pub replica_waits: IntCounter,
    /// Wins answered 503 because too few replicas acknowledged them in time.
    pub replica_wait_timeouts: IntCounter,
    /// Proof-of-work challenges handed out (428 answers and fetches).
    pub challenges_issued: IntCounter,
    /// Solutions accepted (each once).
    pub challenges_solved: IntCounter,
    /// Buys refused for their solution, by reason (missing, expired,
    /// forged, other_user, other_sale, too_easy, replayed, malformed).
    pub challenges_rejected: IntCounterVec,
    /// The difficulty of each challenge issued, in leading zero bits.
    pub challenge_difficulty: Histogram,
    /// Certificate reloads of the HTTPS listener, by result (ok, error).
    pub tls_reloads: IntCounterVec,
    /// When the first certificate in use expires (Unix seconds); alerts
    /// compare it with `time()`.
    pub tls_certificate_expiry: IntGauge,
    /// 1 while the certificate files on disk cannot be loaded (the running
    /// set is older than them), else 0: what an alert can hold `for:`.
    pub tls_reload_failing: IntGauge,
    /// Lookups of a `shop.upstreams` name that failed or found nothing
    /// (its last good addresses stay in use).
    pub shop_resolve_failures: IntCounter,
    /// Loads of the JWKS (`auth.jwks_url` / `auth.jwks_file`), by result
    /// (ok, error); while they fail the last good set is used.
    pub jwks_loads: IntCounterVec,
}

impl Metrics {
    /// # Panics
    /// Only if two metrics share a name, a programming error caught by the tests.
    pub fn register() -> Self {
        let registry = Registry::with_prefix("flashgate").expect("valid prefix");
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str| {
            let h = Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            )
            .expect("valid histogram");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let requests = counter(
            "requests_total",
            "Requests by route and outcome.",
            &["route", "outcome"],
        );
        let buy_outcomes = counter(
            "buy_outcomes_total",
            "Buy attempts by outcome.",
            &["outcome"],
        );
        let redis_errors = counter(
            "redis_errors_total",
            "Failed Redis calls by kind.",
            &["kind"],
        );
        let local_decisions = counter(
            "local_decisions_total",
            "Buys answered from local sale state, without Redis.",
            &["decision"],
        );
        let forward_failures = counter(
            "backend_forward_failures_total",
            "Winner forwards that failed, by reason.",
            &["reason"],
        );
        let bucket_transfers = counter(
            "bucket_transfers_total",
            "Transfers of items between the buckets of bucketed sales, by the donor's answer.",
            &["result"],
        );
        let request_duration = HistogramVec::new(
            HistogramOpts::new("request_duration_seconds", "Edge request latency by route.")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["route"],
        )
        .expect("valid histogram");
        registry
            .register(Box::new(request_duration.clone()))
            .expect("unique metric");
        let script_duration = histogram(
            "redis_script_duration_seconds",
            "Latency of one deduct as its buyer waits for it (its batch's call included).",
        );
        let deduct_batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "deduct_batch_size",
                "Buy attempts decided per deduct script call.",
            )
            .buckets(BATCH_SIZE_BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        registry
            .register(Box::new(deduct_batch_size.clone()))
            .expect("unique metric");
        let forward_duration = histogram(
            "backend_forward_duration_seconds",
            "Latency of one winner forward to the backend.",
        );
        let circuit_state = IntGauge::new(
            "redis_circuit_state",
            "Redis circuit breaker: 0 closed, 1 open, 2 half-open.",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(circuit_state.clone()))
            .expect("unique metric");
        let plain_counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let shop_resolve_failures = plain_counter(
            "shop_resolve_failures_total",
            "Lookups of a shop.upstreams name that failed or found no address; its last good addresses stay in use.",
        );
        let fenced_buys = plain_counter(
            "fenced_buys_total",
            "Buys refused with 503 because their sale is fenced until the backend re-syncs it.",
        );
        let replica_waits = plain_counter(
            "gateway_replica_waits_total",
            "Redis WAIT calls for replica acknowledgement of wins.",
        );
        let replica_wait_timeouts = plain_counter(
            "gateway_replica_wait_timeouts_total",
            "Wins answered 503: fewer replicas than redis.wait_replicas acknowledged in time.",
        );
        let challenges_issued = plain_counter(
            "challenges_issued_total",
            "Proof-of-work challenges issued.",
        );
        let challenges_solved = plain_counter(
            "challenges_solved_total",
            "Proof-of-work solutions accepted (each once).",
        );
        let challenges_rejected = counter(
            "challenges_rejected_total",
            "Buys refused for their proof-of-work solution, by reason.",
            &["reason"],
        );
        let challenge_difficulty = Histogram::with_opts(
            HistogramOpts::new(
                "challenge_difficulty",
                "Difficulty of the challenges issued: leading zero bits asked of the hash.",
            )
            .buckets(DIFFICULTY_BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        registry
            .register(Box::new(challenge_difficulty.clone()))
            .expect("unique metric");
        let tls_reloads = counter(
            "tls_reloads_total",
            "Certificate reloads of the HTTPS listener, by result.",
            &["result"],
        );
        let tls_certificate_expiry = IntGauge::new(
            "tls_certificate_expiry_timestamp_seconds",
            "When the first certificate the HTTPS listener uses expires, in Unix seconds.",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(tls_certificate_expiry.clone()))
            .expect("unique metric");
        let tls_reload_failing = IntGauge::new(
            "tls_reload_failing",
            "1 while the HTTPS listener's certificate files cannot be loaded and older ones are served, else 0.",
        )
        .expect("valid gauge");
        registry
            .register(Box::new(tls_reload_failing.clone()))
            .expect("unique metric");
        let jwks_loads = counter(
            "jwks_loads_total",
            "Loads of the identity provider's JWKS, by result; on error the last good set stays.",
            &["result"],
        );
        let per_request = RequestMetrics::new(&requests, &request_duration, &buy_outcomes);
        Self {
            registry,
            per_request,
            requests,
            buy_outcomes,
            request_duration,
            script_duration,
            deduct_batch_size,
            forward_duration,
            redis_errors,
            circuit_state,
            local_sold_out: local_decisions.with_label_values(&["sold_out"]),
            local_not_started: local_decisions.with_label_values(&["not_started"]),
            local_decisions,
            forward_failures,
            fenced_buys,
            bucket_transfers,
            replica_waits,
            replica_wait_timeouts,
            challenges_issued,
            challenges_solved,
            challenges_rejected,
            challenge_difficulty,
            tls_reloads,
            shop_resolve_failures,
            tls_certificate_expiry,
            tls_reload_failing,
            jwks_loads,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Outcomes kept per route: more than any route sees in practice; an
/// outcome past them is counted through its family, as before.
const KEPT_OUTCOMES: usize = 24;

/// Children of one labelled family keyed by one `'static` label, filled on
/// first use. Racing threads may fill two slots with the same label; both
/// hold the same child, so counts are never split.
struct Kept<M> {
    slots: [OnceLock<(&'static str, M)>; KEPT_OUTCOMES],
}

impl<M> Kept<M> {
    fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The child for `label`, made with `make` when a slot is free; `None`
    /// when every slot holds another label.
    fn get(&self, label: &'static str, make: impl Fn() -> M) -> Option<&M> {
        self.slots
            .iter()
            .map(|slot| slot.get_or_init(|| (label, make())))
            .find(|(l, _)| *l == label)
            .map(|(_, m)| m)
    }
}

/// The metrics every request records once (in `logging`).
pub struct RequestMetrics {
    requests: IntCounterVec,
    durations: HistogramVec,
    buy_outcomes: IntCounterVec,
    /// Per route kind: its duration histogram and its outcomes' counters.
    by_route: [(OnceLock<Histogram>, Kept<IntCounter>); RouteKind::COUNT],
    buys: Kept<IntCounter>,
}

impl RequestMetrics {
    fn new(
        requests: &IntCounterVec,
        durations: &HistogramVec,
        buy_outcomes: &IntCounterVec,
    ) -> Self {
        Self {
            requests: requests.clone(),
            durations: durations.clone(),
            buy_outcomes: buy_outcomes.clone(),
            by_route: std::array::from_fn(|_| (OnceLock::new(), Kept::new())),
            buys: Kept::new(),
        }
    }

    /// Counts a request of `route` that ended with `outcome` (a label) and
    /// took `seconds`; a buy's outcome is also counted in `buy_outcomes`.
    pub fn record(&self, route: RouteKind, outcome: &'static str, seconds: f64) {
        // `get`: a kind past `RouteKind::COUNT` (one added after `Invalid`)
        // is counted without a kept child, never a panic on a request.
        match self.by_route.get(route.index()) {
            Some((duration, outcomes)) => {
                duration
                    .get_or_init(|| self.durations.with_label_values(&[route.as_str()]))
                    .observe(seconds);
                match outcomes.get(outcome, || {
                    self.requests.with_label_values(&[route.as_str(), outcome])
                }) {
                    Some(counter) => counter.inc(),
                    None => self
                        .requests
                        .with_label_values(&[route.as_str(), outcome])
                        .inc(),
                }
            }
            None => {
                self.durations
                    .with_label_values(&[route.as_str()])
                    .observe(seconds);
                self.requests
                    .with_label_values(&[route.as_str(), outcome])
                    .inc();
            }
        }
        if route == RouteKind::Buy {
            match self
                .buys
                .get(outcome, || self.buy_outcomes.with_label_values(&[outcome]))
            {
                Some(counter) => counter.inc(),
                None => self.buy_outcomes.with_label_values(&[outcome]).inc(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_register_and_render_with_the_prefix() {
        let m = Metrics::register();
        m.buy_outcomes.with_label_values(&["won"]).inc();
        let text = m.render();
        assert!(
            text.contains("flashgate_buy_outcomes_total{outcome=\"won\"} 1"),
            "{text}"
        );
        // Two gateways in one process do not clash.
        let _second = Metrics::register();
    }

    #[test]
    fn per_request_counts_land_in_their_families_and_only_used_series_are_listed() {
        let m = Metrics::register();
        m.per_request.record(RouteKind::Page, "ok", 0.001);
        m.per_request.record(RouteKind::Page, "ok", 0.001);
        m.per_request.record(RouteKind::Buy, "sold_out", 0.002);
        let text = m.render();
        assert!(
            text.contains("flashgate_requests_total{outcome=\"ok\",route=\"page\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("flashgate_requests_total{outcome=\"sold_out\",route=\"buy\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("flashgate_buy_outcomes_total{outcome=\"sold_out\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("flashgate_request_duration_seconds_count{route=\"page\"} 2"),
            "{text}"
        );
        assert!(
            !text.contains("route=\"asset\""),
            "no series for a route never asked: {text}"
        );
        assert!(
            !text.contains("flashgate_buy_outcomes_total{outcome=\"ok\"}"),
            "pages are not buys: {text}"
        );
    }

    #[test]
    fn outcomes_past_the_kept_ones_are_still_counted() {
        let m = Metrics::register();
        let labels: Vec<&'static str> = (0..KEPT_OUTCOMES + 3)
            .map(|i| &*Box::leak(format!("o{i}").into_boxed_str()))
            .collect();
        for label in &labels {
            m.per_request.record(RouteKind::Buy, label, 0.0);
        }
        m.per_request
            .record(RouteKind::Buy, labels[KEPT_OUTCOMES + 2], 0.0);
        let text = m.render();
        assert!(
            text.contains(&format!(
                "flashgate_requests_total{{outcome=\"o{}\",route=\"buy\"}} 2",
                KEPT_OUTCOMES + 2
            )),
            "{text}"
        );
        assert!(
            text.contains("flashgate_requests_total{outcome=\"o0\",route=\"buy\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "flashgate_buy_outcomes_total{{outcome=\"o{}\"}} 2",
                KEPT_OUTCOMES + 2
            )),
            "{text}"
        );
    }
}
