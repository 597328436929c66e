//! `bench/REPORT.md`: targets with their figures, per-scenario tables with
//! ratios and CPU per 1,000 requests, every round with the machine's load
//! before it, the books after every buy run, the drain, the Redis ceiling,
//! profiles, versions.

use std::fmt::Write as _;

use crate::results::{
    Results, RoundResult, Side, DURABILITY, DURABILITY_ROUNDS, DURABILITY_SECS, SCENARIOS,
};
use crate::sys::DATABASE;

/// One target of the issue, evaluated.
#[derive(Debug, Clone)]
pub struct TargetEval {
    pub id: &'static str,
    pub name: &'static str,
    pub goal: &'static str,
    pub figures: String,
    /// `None`: not measured in this run.
    pub met: Option<bool>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = v.collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Mean over rounds of `f`.
pub fn avg(
    r: &Results,
    scenario: &str,
    side: Side,
    f: impl Fn(&RoundResult) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = r.of(scenario, side).into_iter().filter_map(f).collect();
    mean(v.into_iter())
}

pub fn rps(r: &Results, scenario: &str, side: Side) -> Option<f64> {
    avg(r, scenario, side, |x| Some(x.summary.rps))
}

/// Gateway + Redis CPU µs per request (= ms per 1,000) of a scenario's side.
fn gateway_redis_us(r: &Results, scenario: &str, side: Side) -> Option<f64> {
    avg(r, scenario, side, |x| {
        Some(cpu_of(x, "gateway")? + cpu_of(x, "redis").unwrap_or(0.0))
    })
}

/// The rejection rows held to the static page's rate: (target id,
/// scenario, name). Each of their Flashgate rounds is followed by a round
/// of the static page ([`Side::Reference`]).
const REJECTIONS: [(&str, &str, &str); 5] = [
    ("soldout", "d_soldout", "Buy after sold out"),
    ("ratelimited", "e_hammer", "Rate-limited rejections"),
    ("not_started", "j_not_started", "Buy before the sale starts"),
    ("unauth", "j_unauth", "Unauthenticated buy (401)"),
    ("bad_input", "j_bad_input", "Buy with bad input (400)"),
];

/// The share of the static page's req/s each rejection row is held to.
const REJECTION_GOAL: f64 = 0.95;

/// Row d's buys from [`SEEN_BUYERS`] buyers, whose tokens the gateway
/// remembers after their first buy: beside row d, whose buyers (the run's
/// `--users`) are each seen about once a round, it shows what first
/// sightings cost (the signature check, and the rest of a cold token:
/// its store into the remembered table, a larger working set). Its rounds
/// are followed by static-page rounds too ([`beside_static`]), but it is
/// no target of its own.
pub(crate) const SOLDOUT_SEEN: &str = "d_soldout_seen";

/// Buyers of row d°: few enough that the gateway's table of remembered
/// tokens (65,536 slots, one token each) holds nearly all of them; the
/// few that share a slot (about 15 of 1,000) are checked again.
pub(crate) const SEEN_BUYERS: usize = 1_000;

/// Whether each Flashgate round of `scenario` is followed by a round of
/// the static page ([`Side::Reference`]).
pub(crate) fn beside_static(scenario: &str) -> bool {
    scenario == SOLDOUT_SEEN || REJECTIONS.iter().any(|(_, id, _)| *id == scenario)
}

/// `scenario`'s Flashgate rounds against the static-page rounds run
/// beside them ([`beside_static`]): whether they reach
/// [`REJECTION_GOAL`], and the figures.
fn against_static(r: &Results, scenario: &str) -> (Option<bool>, String) {
    let x = rps(r, scenario, Side::Flashgate);
    let static_page = rps(r, scenario, Side::Reference);
    let vs_static = at_least(ratio(x, static_page), REJECTION_GOAL);
    let figures = format!(
        "{} vs {} req/s = {}×; gateway {} vs {} µs per request",
        f0(x),
        f0(static_page),
        vs_static.shown,
        f2(avg(r, scenario, Side::Flashgate, |x| cpu_of(x, "gateway"))),
        f2(avg(r, scenario, Side::Reference, |x| cpu_of(x, "gateway"))),
    );
    (vs_static.met, figures)
}

/// Row d° beside its static reference rounds, when it ran.
fn soldout_seen_text(r: &Results) -> String {
    if rps(r, SOLDOUT_SEEN, Side::Flashgate).is_none() {
        return String::new();
    }
    let (_, figures) = against_static(r, SOLDOUT_SEEN);
    format!(
        "; the same buys from {SEEN_BUYERS} buyers whose tokens the gateway remembers (row d°, no target of its own): {figures}"
    )
}

/// Pingora's floor answering row e's buys with the gateway's 429 (the
/// rounds of [`Side::Floor`]) beside `peer` req/s, when it ran.
fn floor_429_text(r: &Results, peer: Option<f64>) -> String {
    let floor = rps(r, "e_hammer", Side::Floor);
    if floor.is_none() {
        return String::new();
    }
    format!(
        "; Pingora's floor answering the same 429 (pingora-floor-429, same row): {} req/s = {}× the peer, {} µs gateway CPU each",
        f0(floor),
        f2(ratio(floor, peer)),
        f2(avg(r, "e_hammer", Side::Floor, |x| cpu_of(x, "gateway"))),
    )
}

/// Requests per second offered to one sale in the cost model.
const OFFERED: f64 = 10_000_000.0;
/// Items of that sale.
const ITEMS: f64 = 10_000.0;
/// CDN points of presence, each refreshing the page and the sale state
/// once per second from the gateways.
const CDN_POPS: f64 = 1_000.0;

/// Gateway CPU µs per request of each rejection row that ran.
fn rejection_costs(r: &Results) -> Vec<(&'static str, f64)> {
    REJECTIONS
        .iter()
        .filter_map(|(_, scenario, name)| {
            Some((
                *name,
                avg(r, scenario, Side::Flashgate, |x| cpu_of(x, "gateway"))?,
            ))
        })
        .collect()
}

/// Cores Redis was busy over a round's measured window.
fn redis_busy_cores(x: &RoundResult) -> Option<f64> {
    (x.summary.elapsed_s > 0.0).then(|| x.cpu.get("redis").map(|s| s / x.summary.elapsed_s))?
}

/// Redis script calls per 1,000 requests of a round's whole run (warmup
/// included, as the calls are counted).
fn script_calls_per_k(x: &RoundResult) -> Option<f64> {
    let (calls, _) = x.check.as_ref()?.script_calls?;
    let requests: u64 = x.summary.total_statuses.values().sum();
    (requests > 0).then(|| calls as f64 * 1000.0 / requests as f64)
}

fn cpu_of(x: &RoundResult, name: &str) -> Option<f64> {
    x.cpu.ms_per_k(name, x.summary.requests)
}

fn f0(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.0}"))
}

fn f2(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.2}"))
}

/// A ratio beside the goal it is judged by: two decimals, more when two
/// would print the goal itself for a ratio that is not it (0.948 against
/// a goal of 0.95 reads "0.948", never "0.95" beside "missed").
fn f2_vs(q: Option<f64>, goal: f64) -> String {
    let Some(q) = q else {
        return f2(None);
    };
    if q == goal {
        return format!("{q:.2}");
    }
    (2..=6)
        .map(|places| (format!("{q:.places$}"), format!("{goal:.places$}")))
        .find(|(shown, g)| shown != g)
        // Closer than six decimals: Rust's shortest exact form.
        .map_or_else(|| format!("{q}"), |(shown, _)| shown)
}

/// A ratio judged against its goal, the one number both come from: the
/// figure as printed ([`f2_vs`]) and the verdict.
struct Judged {
    shown: String,
    met: Option<bool>,
}

/// `q` judged by "at least `goal`".
fn at_least(q: Option<f64>, goal: f64) -> Judged {
    Judged {
        shown: f2_vs(q, goal),
        met: q.map(|q| q >= goal),
    }
}

/// `q` judged by "at most `goal`".
fn at_most(q: Option<f64>, goal: f64) -> Judged {
    Judged {
        shown: f2_vs(q, goal),
        met: q.map(|q| q <= goal),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Median over a scenario's Flashgate rounds of `f`.
fn median(r: &Results, scenario: &str, f: impl Fn(&RoundResult) -> Option<f64>) -> Option<f64> {
    median_of(
        r.of(scenario, Side::Flashgate)
            .into_iter()
            .filter_map(f)
            .collect(),
    )
}

fn median_of(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The headline: CPU µs per request of each path, and from them the
/// gateway cores and Redis masters one big sale needs.
fn cost_model_section(md: &mut String, r: &Results) {
    let us = |scenario: &str, name: &str| avg(r, scenario, Side::Flashgate, |x| cpu_of(x, name));
    let _ = writeln!(md, "## Cost model\n");
    let _ = writeln!(
        md,
        "CPU time per request of each path, in µs (= ms per 1,000 requests in the tables below; mean of rounds; this \
         machine's cores, shared). \"Order written\" is the backend drain's: backend and PostgreSQL per order.\n"
    );
    let _ = writeln!(
        md,
        "| path | row | gateway µs | Redis µs | backend µs | database µs | total µs |\n|---|---|---:|---:|---:|---:|---:|"
    );
    let mut row = |path: &str,
                   id: &str,
                   g: Option<f64>,
                   redis: Option<f64>,
                   b: Option<f64>,
                   d: Option<f64>| {
        let total = [g, redis, b, d].iter().flatten().sum::<f64>();
        let any = [g, redis, b, d].iter().any(Option::is_some);
        let _ = writeln!(
            md,
            "| {path} | {id} | {} | {} | {} | {} | {} |",
            f2(g),
            f2(redis),
            f2(b),
            f2(d),
            f2(any.then_some(total))
        );
    };
    for (path, id) in [
        ("static page", "a_static"),
        ("sale state", "b_state"),
        ("sold out", "d_soldout"),
        ("rate-limited", "e_hammer"),
        ("not started", "j_not_started"),
        ("unauthenticated (401)", "j_unauth"),
        ("bad input (400)", "j_bad_input"),
        ("buy in stock", "c_buy"),
    ] {
        row(path, id, us(id, "gateway"), us(id, "redis"), None, None);
    }
    let drain = r.drain.as_ref();
    row(
        "order written",
        "drain",
        None,
        None,
        drain.map(|d| d.per_order(d.backend_cpu_s)),
        drain.and_then(|d| Some(d.per_order(d.database_cpu_s?))),
    );
    for (path, id) in [
        ("page over TLS 1.3 + h2", "l_tls_page"),
        ("full TLS handshake + 1 request", "l_tls_handshake"),
    ] {
        row(path, id, us(id, "gateway"), None, None, None);
    }
    md.push('\n');

    // The projection.
    let g = |id: &str| us(id, "gateway");
    let redis = |id: &str| us(id, "redis").unwrap_or(0.0);
    let (Some(limited), Some(sold_out)) = (g("e_hammer"), g("d_soldout")) else {
        let _ = writeln!(md, "The projection needs rows d_soldout and e_hammer.\n");
        return;
    };
    let rejected_us = (limited + sold_out) / 2.0;
    // Redis during the rejection rows: no call per request (the sold-out
    // flag, the buckets and the window are in the gateway's memory), so its
    // CPU there is its own background work (the backend's timers, expiry),
    // counted in cores whatever the rate, never per request.
    let of_rejections = |f: fn(&RoundResult) -> Option<f64>| {
        mean(
            ["e_hammer", "d_soldout"]
                .into_iter()
                .filter_map(|id| avg(r, id, Side::Flashgate, f)),
        )
    };
    let background = of_rejections(redis_busy_cores).unwrap_or(0.0);
    let calls_per_k = of_rejections(script_calls_per_k);
    let worst = rejection_costs(r)
        .into_iter()
        .map(|(_, us)| us)
        .fold(rejected_us, f64::max);
    let reads_us = g("a_static").unwrap_or(0.0) + g("b_state").unwrap_or(0.0);
    let buy = g("c_buy").unwrap_or(0.0);
    let buy_redis = redis("c_buy");
    let order = r
        .drain
        .as_ref()
        .and_then(crate::results::Drain::us_per_order);
    let gateway_cores = (OFFERED * rejected_us + CDN_POPS * reads_us) / 1e6;
    let gateway_worst = (OFFERED * worst + CDN_POPS * reads_us) / 1e6;
    // The wins all within the sale's first second: the most Redis CPU a
    // second of the sale can ask for, on top of the background.
    let wins_cores = ITEMS * buy_redis / 1e6;
    let masters = (background + wins_cores).ceil().max(1.0);
    let _ = writeln!(
        md,
        "**One sale, {:.0} requests/s offered, {:.0} items.** Assumptions: (1) a CDN in front serves the sale page and \
         the sale state (both cacheable), so what reaches the gateways from them is one refresh per second from each of \
         {:.0} points of presence; (2) the CDN keeps its connections to the gateways open, so TLS is paid there and a \
         gateway's request costs as the plain rows above (the TLS rows show what a gateway would add serving buyers \
         directly); (3) every buy attempt (a POST, which no CDN answers) reaches the gateways; (4) {:.0} of them win, \
         once each, and the rest are turned down, half rate-limited (buyers clicking past their bucket) and half sold out \
         (the stock is gone within the first second); not started, 401 and 400 cost about the same (table above).\n",
        OFFERED, ITEMS, CDN_POPS, ITEMS
    );
    let _ = writeln!(
        md,
        "| | CPU µs per request | cores for {:.0}/s |\n|---|---:|---:|",
        OFFERED
    );
    let _ = writeln!(
        md,
        "| gateways: the mix of rejections (+ the CDN's refreshes) | {rejected_us:.2} | **{gateway_cores:.0}** |"
    );
    let _ = writeln!(
        md,
        "| gateways: every request on the costliest rejection path | {worst:.2} | {gateway_worst:.0} |"
    );
    let _ = writeln!(
        md,
        "| Redis: the rejections, answered at the gateway ({} script calls per 1,000 requests in rows d and e: the \
         first buys before the sale was flagged, and the backend's timers); Redis's own background work during those \
         rows, in cores whatever the rate | – | {background:.2} |",
        f2(calls_per_k)
    );
    let _ = writeln!(
        md,
        "| the {ITEMS:.0} winning buys (gateway + Redis), once per sale | {:.2} | {:.3} core-seconds in all |",
        buy + buy_redis,
        ITEMS * (buy + buy_redis) / 1e6
    );
    let _ = writeln!(
        md,
        "| their {ITEMS:.0} orders (backend + database), once per sale | {} | {} core-seconds in all |\n",
        f2(order),
        order.map_or("–".into(), |o| format!("{:.3}", ITEMS * o / 1e6))
    );
    let _ = writeln!(
        md,
        "So: **{gateway_cores:.0} gateway cores** (≤ {gateway_worst:.0} if every request took the costliest rejection) and \
         **{masters:.0} Redis master(s)**: the rejections are answered from the gateway's memory (the sold-out flag, the \
         buckets, the sale's window), so Redis sees only the buys that can still win ({wins_cores:.2} cores should \
         all {ITEMS:.0} wins come in one second) beside its background work ({background:.2} cores), and one master \
         holds the sale's stock (bucketed stock spreads it, see below). Moonshot: ≤ 100 gateway cores, i.e. ≤ 10 µs of gateway CPU per \
         rejected request (Targets).\n"
    );
}

/// The durability rows: each setting's "buy in stock" figures, medians of
/// rounds, and its cost against the cheaper setting of its pair.
fn durability_section(md: &mut String, r: &Results) {
    if DURABILITY
        .iter()
        .all(|d| r.of(d.id, Side::Flashgate).is_empty())
    {
        return;
    }
    let _ = writeln!(md, "## Durability settings (median of rounds)\n");
    let _ = writeln!(
        md,
        "\"Buy in stock\" (closed loop, as c.) on Flashgate alone, under each setting: {DURABILITY_ROUNDS} rounds of at most \
         {DURABILITY_SECS} s each, alternating within each pair. `wait_replicas` rows run with one replica attached to the \
         bench's Redis (the 1 on a second gateway, same Redis and backend); `appendfsync` rows without a replica, with the \
         AOF switched on live (`CONFIG SET`). Cost is against the first row of the pair.\n"
    );
    let _ = writeln!(md, "| setting | req/s | cost | p50 ms | p99 ms | CPU gateway | CPU Redis |\n|---|---:|---:|---:|---:|---:|---:|");
    for pair in DURABILITY.chunks(2) {
        let base = median(r, pair[0].id, |x| Some(x.summary.rps));
        for d in pair {
            let x = median(r, d.id, |x| Some(x.summary.rps));
            let cost = match ratio(x, base) {
                Some(q) if d.id != pair[0].id => format!("{:+.1} %", (q - 1.0) * 100.0),
                _ => "–".into(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} |",
                d.title,
                f0(x),
                cost,
                f2(median(r, d.id, |x| Some(x.summary.p50_ms))),
                f2(median(r, d.id, |x| Some(x.summary.p99_ms))),
                f0(median(r, d.id, |x| cpu_of(x, "gateway"))),
                f0(median(r, d.id, |x| cpu_of(x, "redis"))),
            );
        }
    }
    md.push('\n');
}

/// The bucketed-stock rows ([`crate::buckets`]): each bucket count's
/// figures (median of rounds), every master's Redis CPU per buy, and the
/// projection to more masters from those CPU figures.
fn buckets_section(md: &mut String, r: &Results) {
    use crate::buckets::{BUCKET_COUNTS, MASTERS};
    use crate::results::BucketRound;
    if r.buckets.is_empty() {
        return;
    }
    let of =
        |b: u32| -> Vec<&BucketRound> { r.buckets.iter().filter(|x| x.buckets == b).collect() };
    let med =
        |b: u32, f: &dyn Fn(&BucketRound) -> f64| median_of(of(b).into_iter().map(f).collect());
    let _ = writeln!(
        md,
        "## Bucketed stock: one hot sale on a {MASTERS}-master Redis Cluster (median of rounds)\n"
    );
    let _ = writeln!(
        md,
        "\"Buy in stock\" (closed loop, distinct users, as c.) on a second Flashgate (gateway and backend, a PostgreSQL database of its own) whose Redis is a \
         cluster of the bench's own ({MASTERS} masters, no replicas), one sale per round with `buckets = 1` (one slot: one \
         master decides every buy) or `buckets = 6` (two buckets' slots per master when the tags spread so), rounds \
         alternating. Redis CPU is each master's process CPU in the measured window per 1,000 buys; the busiest master's \
         share is its part of the masters' total (1/{MASTERS} = even).\n"
    );
    let _ = writeln!(
        md,
        "| buckets | buckets per master | buys/s | p50 ms | p99 ms | Redis CPU ms per 1,000 buys, per master (busiest first) | all masters | busiest master's share | transfers per 1,000 buys | gateway CPU ms per 1,000 | books |\n|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|"
    );
    // Per bucket count: (Σ masters' ms per 1k buys, busiest master's ms per 1k).
    let mut cost = Vec::new();
    for b in BUCKET_COUNTS {
        let rounds = of(b);
        let Some(first) = rounds.first() else {
            continue;
        };
        // Busiest first in each round: which master serves a bucket's slot
        // differs from round to round (a new sale, a new tag).
        let by_load = |x: &BucketRound| {
            let mut v = x.master_ms_per_k();
            v.sort_by(|a, b| b.total_cmp(a));
            v
        };
        let per_master: Vec<Option<f64>> = (0..first.masters.len())
            .map(|i| med(b, &|x| by_load(x).get(i).copied().unwrap_or(0.0)))
            .collect();
        let total = med(b, &|x| x.master_ms_per_k().iter().sum());
        let busiest = med(b, &|x| {
            x.master_ms_per_k().iter().copied().fold(0.0, f64::max)
        });
        let share = ratio(busiest, total);
        cost.push((b, total, busiest));
        let books = if rounds.iter().all(|x| x.check.ok) {
            "ok"
        } else {
            "WRONG"
        };
        let _ = writeln!(
            md,
            "| {b} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {books} |",
            first
                .buckets_per_master
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" / "),
            f0(med(b, &|x| x.summary.rps)),
            f2(med(b, &|x| x.summary.p50_ms)),
            f2(med(b, &|x| x.summary.p99_ms)),
            per_master
                .iter()
                .map(|v| f0(*v))
                .collect::<Vec<_>>()
                .join(" / "),
            f0(total),
            share.map_or("–".into(), |q| format!("{:.0} %", q * 100.0)),
            f2(med(b, &|x| x.transfers_per_k())),
            f0(med(b, &|x| x
                .cpu
                .ms_per_k("gateway", x.summary.requests)
                .unwrap_or(0.0))),
        );
    }
    md.push('\n');
    let _ = writeln!(
        md,
        "Books of every round: {}\n",
        r.buckets
            .iter()
            .map(|x| format!("b{} r{}: {}", x.buckets, x.round, x.check.text))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // A master saturates at one core: 1,000 ms of CPU per second. One
    // bucket's buys all cost its one master; N buckets spread over M
    // masters cost each about total / M, as evenly as measured here.
    let _ = writeln!(md, "**Projection** (deducts/s when the busiest master runs one core flat out, from the per-master CPU above; this machine has 2 cores, so the cluster's 3 masters here share them with the gateway and the load):\n");
    let _ = writeln!(
        md,
        "| masters | 1 bucket | 6 buckets or more, spread as measured |\n|---:|---:|---:|"
    );
    let one = cost.iter().find(|c| c.0 == 1).and_then(|c| c.2);
    let many = cost.iter().find(|c| c.0 > 1);
    for m in [3_u32, 10, 30] {
        let single = one.filter(|c| *c > 0.0).map(|c| 1e6 / c);
        // Evenness measured on 3 masters (busiest vs mean) kept at m masters.
        let spread = many.and_then(|(_, total, busiest)| {
            let (total, busiest) = ((*total)?, (*busiest)?);
            let evenness = (total / MASTERS as f64) / busiest;
            (total > 0.0).then(|| f64::from(m) * evenness * 1e6 / total)
        });
        let _ = writeln!(md, "| {m} | {} | {} |", f0(single), f0(spread));
    }
    let gateway_ms = median_of(
        r.buckets
            .iter()
            .filter(|x| x.buckets > 1)
            .map(|x| x.cpu.ms_per_k("gateway", x.summary.requests).unwrap_or(0.0))
            .collect(),
    );
    let at_30 = many.and_then(|(_, total, busiest)| {
        Some(30.0 * ((*total)? / MASTERS as f64) / (*busiest)? * 1e6 / (*total)?)
    });
    let drain = r.drain.as_ref().map(crate::results::Drain::rate);
    let _ = writeln!(
        md,
        "\nWhat stops scaling first: with one bucket, the one master (the 1-bucket column does not grow with masters). With \
         buckets, Redis grows with the masters, and the next limits are, in order: the gateways' CPU ({} ms per 1,000 buys \
         here: {} cores of gateways at the 30-master rate, added by running more gateways, which share nothing but Redis); \
         the transfers, which cost three script calls each but stay rare while buckets hold stock (the rate above) and grow \
         only at the end of a sale; and, for a sale with that many winners, the order database: every winner is one order \
         row, and the backend drains {} orders/s into PostgreSQL on this machine (drain row). A flash sale's winners are \
         few (its stock), so the database limits only how fast winners are persisted, not how fast buyers are answered; \
         buckets are capped at 64 per sale.\n",
        f0(gateway_ms),
        f2(gateway_ms.zip(at_30).map(|(g, d)| g * d / 1e6)),
        f0(drain),
    );
}

/// Evaluates every target from the results.
pub fn targets(r: &Results) -> Vec<TargetEval> {
    let mut out = Vec::new();
    let (fa, pa) = (
        rps(r, "a_static", Side::Flashgate),
        rps(r, "a_static", Side::Peer),
    );
    let (fp99, pp99) = (
        avg(r, "a_static", Side::Flashgate, |x| Some(x.summary.p99_ms)),
        avg(r, "a_static", Side::Peer, |x| Some(x.summary.p99_ms)),
    );
    let vs_nginx = at_least(ratio(fa, pa), 1.0);
    out.push(TargetEval {
        id: "static",
        name: "Static page vs nginx",
        goal: "≥ 1.0× nginx req/s, p99 no worse",
        figures: format!(
            "{} vs {} req/s = {}×; p99 {} vs {} ms",
            f0(fa),
            f0(pa),
            vs_nginx.shown,
            f2(fp99),
            f2(pp99),
        ),
        met: vs_nginx
            .met
            .zip(fp99.zip(pp99))
            .map(|(faster, (f, p))| faster && f <= p),
    });
    let (ff, pf) = (
        rps(r, "a_floor", Side::Flashgate),
        rps(r, "a_floor", Side::Peer),
    );
    let tuned = rps(r, "a_floor_tuned", Side::Peer);
    let vs_floor = at_least(ratio(ff, pf), 1.0);
    out.push(TargetEval {
        id: "floor",
        name: "Static page vs Pingora's floor",
        goal: "≥ 1.0× `pingora_floor`'s req/s (row a⁰); one attempt at the floor itself with Pingora's server options, nginx's ratio beside it (row a⁺)",
        figures: format!(
            "{} vs {} req/s = {}×; the floor under Pingora's options (no work stealing, one SO_REUSEPORT listener per thread): {} req/s = {}× nginx ({} req/s, row a), the default floor {}× nginx",
            f0(ff),
            f0(pf),
            vs_floor.shown,
            f0(tuned),
            f2(ratio(tuned, pa)),
            f0(pa),
            f2(ratio(pf, pa)),
        ),
        met: vs_floor.met,
    });
    let (fs, ps) = (
        rps(r, "i_shop_cache", Side::Flashgate),
        rps(r, "i_shop_cache", Side::Peer),
    );
    let vs_cache = at_least(ratio(fs, ps), 1.0);
    out.push(TargetEval {
        id: "shop_cache",
        name: "Cached shop page vs nginx proxy_cache",
        goal: "≥ 1.0× nginx proxy_cache req/s (same page, same origin)",
        figures: format!(
            "{} vs {} req/s = {}×; p99 {} vs {} ms",
            f0(fs),
            f0(ps),
            vs_cache.shown,
            f2(avg(r, "i_shop_cache", Side::Flashgate, |x| Some(
                x.summary.p99_ms
            ))),
            f2(avg(r, "i_shop_cache", Side::Peer, |x| Some(
                x.summary.p99_ms
            ))),
        ),
        met: vs_cache.met,
    });
    let (fc, pc) = (
        rps(r, "c_buy", Side::Flashgate),
        rps(r, "c_buy", Side::Peer),
    );
    let vs_peer = at_least(ratio(fc, pc), 2.0);
    out.push(TargetEval {
        id: "buy",
        name: "Buy while in stock vs OpenResty",
        goal: "≥ 2× the peer's req/s",
        figures: format!("{} vs {} req/s = {}×", f0(fc), f0(pc), vs_peer.shown),
        met: vs_peer.met,
    });
    let (fcpu, pcpu) = (
        gateway_redis_us(r, "c_buy", Side::Flashgate),
        gateway_redis_us(r, "c_buy", Side::Peer),
    );
    let cpu_vs_peer = at_most(ratio(fcpu, pcpu), 0.6);
    out.push(TargetEval {
        id: "buy_cpu",
        name: "CPU per buy in stock: gateway + Redis",
        goal: "Flashgate's gateway + Redis ≤ 0.6× the OpenResty peer's gateway + Redis",
        figures: format!(
            "{} vs {} µs per buy = {}× (Flashgate: gateway {}, Redis {}; peer: gateway {}, Redis {}; the order's own cost is the next row{})",
            f2(fcpu),
            f2(pcpu),
            cpu_vs_peer.shown,
            f0(avg(r, "c_buy", Side::Flashgate, |x| cpu_of(x, "gateway"))),
            f0(avg(r, "c_buy", Side::Flashgate, |x| cpu_of(x, "redis"))),
            f0(avg(r, "c_buy", Side::Peer, |x| cpu_of(x, "gateway"))),
            f0(avg(r, "c_buy", Side::Peer, |x| cpu_of(x, "redis"))),
            if redis_per_win(r).is_some() {
                "; Flashgate's Redis command by command: \"Redis per win in the buy row\""
            } else {
                ""
            },
        ),
        met: cpu_vs_peer.met,
    });
    let mean_of = |values: Vec<f64>| {
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let order = mean_of(
        r.order_costs
            .iter()
            .filter_map(|(d, _)| d.us_per_order())
            .collect(),
    );
    let floor = mean_of(r.order_costs.iter().map(|(_, c)| c.us_per_row()).collect());
    let per_round: Vec<String> = r
        .order_costs
        .iter()
        .map(|(d, c)| {
            format!(
                "{} vs {:.1} (backend {:.1}, database {})",
                f2(d.us_per_order()),
                c.us_per_row(),
                d.per_order(d.backend_cpu_s),
                d.database_cpu_s
                    .map_or("–".into(), |db| format!("{:.1}", d.per_order(db))),
            )
        })
        .collect();
    let vs_copy = at_most(ratio(order, floor), 2.0);
    out.push(TargetEval {
        id: "order_cpu",
        name: "Orders written near the database's floor",
        goal: "backend + database CPU per order (the drain) ≤ 2× PostgreSQL's own cost of the same rows (`COPY` in batches of the backend's batch size, same table and indexes, each COPY right after a drain)",
        figures: match r.order_costs.first() {
            Some((_, c)) => format!(
                "{} µs per order vs the COPY floor {} µs per row = {}× (mean of {} drain + COPY pairs of {} rows in batches of {}; each pair, µs: {})",
                f2(order),
                f2(floor),
                vs_copy.shown,
                r.order_costs.len(),
                c.rows,
                c.batch,
                per_round.join("; "),
            ),
            None => "not run (the drain and its COPY floor run with --drain-orders > 0)".into(),
        },
        met: vs_copy.met,
    });
    let p99 = |side| avg(r, "c_buy_open", side, |x| Some(x.summary.p99_ms));
    let (fo, po) = (p99(Side::Flashgate), p99(Side::Peer));
    let tail_vs_peer = at_most(ratio(fo, po), 1.5);
    out.push(TargetEval {
        id: "open_tail",
        name: "Buy in stock, open loop (fixed rate): tail latency",
        goal: "p99 ≤ 1.5× the peer's p99 at the same rate",
        figures: format!(
            "p99 {} vs {} ms = {}× at {} buys/s",
            f2(fo),
            f2(po),
            tail_vs_peer.shown,
            f0(rps(r, "c_buy_open", Side::Peer))
        ),
        met: tail_vs_peer.met,
    });
    for (id, scenario, name) in REJECTIONS {
        let (met, figures) = against_static(r, scenario);
        let seen = if scenario == "d_soldout" {
            soldout_seen_text(r)
        } else {
            String::new()
        };
        out.push(TargetEval {
            id,
            name,
            goal: "≥ 0.95× Flashgate's own static-page req/s (its reference rounds, each run right after a round of this row)",
            figures: format!("{figures}{seen}"),
            met,
        });
    }
    let (fe, pe) = (
        rps(r, "e_hammer", Side::Flashgate),
        rps(r, "e_hammer", Side::Peer),
    );
    let limited_vs_peer = at_least(ratio(fe, pe), 1.2);
    out.push(TargetEval {
        id: "ratelimited_peer",
        name: "Rate-limited rejections vs OpenResty",
        goal: "≥ 1.2× the OpenResty peer's req/s",
        figures: format!(
            "{} vs {} req/s = {}×; gateway + Redis {} vs {} µs per request{}",
            f0(fe),
            f0(pe),
            limited_vs_peer.shown,
            f2(gateway_redis_us(r, "e_hammer", Side::Flashgate)),
            f2(gateway_redis_us(r, "e_hammer", Side::Peer)),
            floor_429_text(r, pe),
        ),
        met: limited_vs_peer.met,
    });
    for (id, scenario, name, goal) in [
        (
            "tls_page",
            "l_tls_page",
            "Sale page over TLS 1.3 + HTTP/2 vs nginx",
            "≥ 1.0× nginx's req/s (same certificate, ECDSA P-256; h2load 64 connections × 10 streams)",
        ),
        (
            "tls_handshake",
            "l_tls_handshake",
            "Full TLS 1.3 handshakes vs nginx",
            "≥ 1.0× nginx's handshakes/s (every connection new, one request each; h2load)",
        ),
    ] {
        let (f, p) = (rps(r, scenario, Side::Flashgate), rps(r, scenario, Side::Peer));
        // The same load beside Pingora's own TLS listener (row l⁰ / l'⁰).
        let floor_row = format!("{scenario}_floor");
        let (beside, floor) = (
            rps(r, &floor_row, Side::Flashgate),
            rps(r, &floor_row, Side::Peer),
        );
        let floor_text = if floor.is_some() {
            format!(
                "; beside Pingora's TLS floor ({floor_row}): {} vs {} per s = {}×, gateway {} vs floor {} µs CPU each, the floor {}× nginx",
                f0(beside),
                f0(floor),
                f2(ratio(beside, floor)),
                f2(avg(r, &floor_row, Side::Flashgate, |x| cpu_of(x, "gateway"))),
                f2(avg(r, &floor_row, Side::Peer, |x| cpu_of(x, "gateway"))),
                f2(ratio(floor, p)),
            )
        } else {
            String::new()
        };
        let vs_nginx = at_least(ratio(f, p), 1.0);
        out.push(TargetEval {
            id,
            name,
            goal,
            figures: format!(
                "{} vs {} per s = {}×; gateway {} vs nginx {} µs CPU each{floor_text}",
                f0(f),
                f0(p),
                vs_nginx.shown,
                f2(avg(r, scenario, Side::Flashgate, |x| cpu_of(x, "gateway"))),
                f2(avg(r, scenario, Side::Peer, |x| cpu_of(x, "gateway"))),
            ),
            met: vs_nginx.met,
        });
    }
    let worst = rejection_costs(r)
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1));
    out.push(TargetEval {
        id: "moonshot",
        name: "Moonshot: 10,000,000 rejected requests/s on ≤ 100 gateway cores",
        goal: "≤ 10 µs gateway CPU per rejected request, on every rejection path",
        figures: worst.map_or("no rejection row ran".into(), |(name, us)| {
            let floor = avg(r, "e_hammer", Side::Floor, |x| cpu_of(x, "gateway"));
            format!(
                "costliest rejection: {name} at {us:.1} µs = {:.0} gateway cores for 10,000,000/s{}",
                us * OFFERED / 1e6,
                floor.map_or(String::new(), |f| format!(
                    "; Pingora's floor answering a 429 (row e): {f:.1} µs = {:.0} cores",
                    f * OFFERED / 1e6
                )),
            )
        }),
        met: worst.map(|(_, us)| us <= 10.0),
    });
    // The comparison's scenarios only, not the durability rows.
    let script: Vec<(u64, u64)> = r
        .rounds
        .iter()
        .filter(|x| x.side == Side::Flashgate && SCENARIOS.iter().any(|s| s.id == x.scenario))
        .filter_map(|x| x.check.as_ref().and_then(|c| c.script_calls))
        .collect();
    let (calls, buys) = script.iter().fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    out.push(TargetEval {
        id: "script",
        name: "At most one Redis script call per buy that reaches Redis",
        goal: "cmdstat_evalsha (+ eval) calls ≤ buys that reached Redis (concurrent buys of a sale share one call)",
        figures: format!(
            "{calls} script calls for {buys} buys over {} runs (scenarios c, c', e) = {} buys per call",
            script.len(),
            f2_vs(ratio(Some(buys as f64), Some(calls as f64)), 1.0)
        ),
        met: (!script.is_empty()).then(|| script.iter().all(|(c, b)| c <= b)),
    });
    out.push(TargetEval {
        id: "drain",
        name: "Backend drain into PostgreSQL",
        goal: "≥ 10,000 orders/s for 100,000 preloaded reservations",
        figures: r.drain.as_ref().map_or("not run".into(), |d| {
            format!(
                "{} orders in {:.2} s from backend start = {:.0}/s ({:.0}/s from the first row); backend CPU {:.2} s",
                d.orders,
                d.total_s,
                d.rate(),
                d.orders as f64 / d.after_first_s.max(1e-9),
                d.backend_cpu_s
            )
        }),
        met: r.drain.as_ref().map(|d| d.ok && d.rate() >= 10_000.0),
    });
    out.push(TargetEval {
        id: "drain_mysql",
        name: "Backend drain into MySQL (MariaDB)",
        goal: "the same preload as the PostgreSQL drain, every reservation an order; ≥ 10,000 orders/s",
        figures: r.drain_mysql.as_ref().map_or("not run".into(), drain_figures),
        met: r.drain_mysql.as_ref().map(|d| d.ok && d.rate() >= 10_000.0),
    });
    out.push(TargetEval {
        id: "room_crowd",
        name: "Waiting room: the shop held at the room's bound while 100,000 visitors wait",
        goal: "the most inside (Redis) ≤ active_users, and requests reaching the shop ≤ 1.1× the rate seats free (active_users / session_seconds)",
        figures: r.room_crowd.as_ref().map_or("not run".into(), |c| {
            format!(
                "{} places given; {:.0} answers/s at the gateway, {:.1} reached the shop/s vs {:.0} seats freed/s; most inside {} of {}; {} errors",
                c.waiting_at_start,
                c.answers_per_s(),
                c.shop_per_s(),
                crate::room_crowd::Crowd::bound_per_s(),
                c.most_inside,
                crate::room_crowd::ACTIVE_USERS,
                c.errors
            )
        }),
        met: r.room_crowd.as_ref().map(crate::room_crowd::Crowd::held),
    });
    let checks: Vec<_> = r.rounds.iter().filter_map(|x| x.check.as_ref()).collect();
    out.push(TargetEval {
        id: "books",
        name: "Books balance after every buy run",
        goal: "winners = decrements = reservations = orders, no user above the limit",
        figures: format!(
            "{} of {} buy runs balanced (both sides)",
            checks.iter().filter(|c| c.ok).count(),
            checks.len()
        ),
        met: (!checks.is_empty()).then(|| checks.iter().all(|c| c.ok)),
    });
    out
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "**met**",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

fn side_name(scenario: &str, side: Side) -> &'static str {
    match side {
        Side::Flashgate => "Flashgate",
        Side::Reference => "Flashgate's static page (reference)",
        Side::Floor => "pingora-floor-429",
        Side::Peer => SCENARIOS
            .iter()
            .find(|s| s.id == scenario)
            .and_then(|s| s.peer)
            .unwrap_or("peer"),
    }
}

/// Renders the whole report.
pub fn markdown(r: &Results, chart: Option<&str>) -> String {
    let mut md = String::new();
    let m = &r.machine;
    let _ = writeln!(md, "# Flashgate benchmark report\n");
    let _ = writeln!(
        md,
        "Produced by `make bench` on {}: {} cores ({}), {}. Wall time {:.0} s. \
         Everything ran on this one machine over loopback, load generator included; \
         the machine is shared, so each round records the load average before it and the busy time \
         of processes that are not part of the run (\"other\", in cores). \
         See [README.md](README.md) for how to read this.\n",
        m.date, m.nproc, m.cpu_model, m.kernel, r.wall_s
    );

    cost_model_section(&mut md, r);

    let _ = writeln!(md, "## Targets\n");
    let _ = writeln!(
        md,
        "| target | goal | figures (mean of rounds) | verdict |\n|---|---|---|---|"
    );
    for t in targets(r) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            t.name,
            t.goal,
            t.figures,
            verdict(t.met)
        );
    }
    md.push('\n');

    if let Some(chart) = chart {
        let _ = writeln!(
            md,
            "![Throughput and latency, Flashgate beside its peers]({chart})\n"
        );
    }

    let _ = writeln!(md, "## Results by scenario (mean of rounds)\n");
    let _ = writeln!(
        md,
        "CPU is milliseconds of CPU time per 1,000 requests, from `/proc/PID/stat` (utime + stime) over the measured window. \
         For the peers, \"gateway\" is nginx (all workers and the master) and \"backend\" and \"database\" do not exist. \
         Flashgate's \"database\" is every PostgreSQL server process (the bench's database is on the machine's server, \
         which nothing else uses during a run).\n"
    );
    let _ = writeln!(
        md,
        "| scenario | side | req/s | ratio | p50 ms | p99 ms | p99.9 ms | CPU gateway | CPU Redis | CPU backend | CPU database | CPU load generator |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for sc in SCENARIOS {
        let f_rps = rps(r, sc.id, Side::Flashgate);
        for side in [Side::Flashgate, Side::Reference, Side::Floor, Side::Peer] {
            if r.of(sc.id, side).is_empty() {
                continue;
            }
            let x = rps(r, sc.id, side);
            let ratio_text = match side {
                Side::Flashgate => "1.00".to_owned(),
                Side::Peer | Side::Reference | Side::Floor => {
                    ratio(f_rps, x).map_or("–".into(), |q| format!("Flashgate {q:.2}×"))
                }
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                sc.title,
                side_name(sc.id, side),
                f0(x),
                ratio_text,
                f2(avg(r, sc.id, side, |x| Some(x.summary.p50_ms))),
                f2(avg(r, sc.id, side, |x| Some(x.summary.p99_ms))),
                f2(avg(r, sc.id, side, |x| Some(x.summary.p999_ms))),
                f0(avg(r, sc.id, side, |x| cpu_of(x, "gateway"))),
                f0(avg(r, sc.id, side, |x| cpu_of(x, "redis"))),
                f0(avg(r, sc.id, side, |x| cpu_of(x, "backend"))),
                f0(avg(r, sc.id, side, |x| cpu_of(x, DATABASE))),
                f0(avg(r, sc.id, side, |x| cpu_of(x, "loadgen"))),
            );
        }
    }
    md.push('\n');

    durability_section(&mut md, r);
    buckets_section(&mut md, r);

    let _ = writeln!(
        md,
        "## Every round, in the order run (round by round: Flashgate, its reference, the peer)\n"
    );
    let _ = writeln!(
        md,
        "| scenario | side | round | loadavg before | req/s | p50 | p99 | p99.9 | max ms | statuses (measured window) | busy cores (other) |\n|---|---|---:|---|---:|---:|---:|---:|---:|---|---|"
    );
    for x in &r.rounds {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {:.2} ({:.2}) |",
            x.scenario,
            side_name(x.scenario, x.side),
            x.round,
            x.loadavg_before,
            x.summary.rps,
            x.summary.p50_ms,
            x.summary.p99_ms,
            x.summary.p999_ms,
            x.summary.max_ms,
            x.summary.statuses_text(),
            x.cpu.machine_busy_cores,
            x.cpu.other_cores,
        );
    }
    md.push('\n');

    let _ = writeln!(md, "## Books after every buy run\n");
    let _ = writeln!(
        md,
        "Flashgate: after the run the bench waits until the backend has drained the sale's stream \
         (orders = reservations, nothing pending), then compares the winners the load generator saw \
         (distinct users for the burst) with the stock decrements and reservations in Redis and the \
         orders in PostgreSQL, and checks that no user holds more orders than the per-user limit (1). \
         Script calls come from `INFO commandstats` (reset before the run, warmup included; calls that ran, i.e. less `failed_calls`: an `EVALSHA` answered NOSCRIPT runs nothing); the \
         backend's stream maintenance runs its trim script on a 10 s timer whatever the load, so a \
         run passes when the calls are the buys that reached Redis plus at most the trims its \
         `/metrics` counted over a window enclosing the run. \
         The peer: winners = stock decrements = its buyers set = its stream.\n"
    );
    for x in r.rounds.iter().filter(|x| x.check.is_some()) {
        let c = x.check.as_ref().expect("filtered");
        let _ = writeln!(
            md,
            "- {} {} r{}: **{}** — {}",
            x.scenario,
            side_name(x.scenario, x.side),
            x.round,
            if c.ok { "OK" } else { "FAIL" },
            c.text
        );
    }
    md.push('\n');

    room_section(&mut md, r);

    if let Some(d) = &r.drain {
        let _ = writeln!(md, "## Backend drain\n");
        let _ = writeln!(
            md,
            "{} reservations were written into a sale's stream in the gateway's record format (one field `r`: rid, sale, user, ts and idem joined by spaces; \
             and `HSET resv rid user`) with pipelined XADD in {:.2} s while the backend was stopped. Then the backend was started \
             and the bench polled `SELECT COUNT(*) FROM orders` every 20 ms: all {} rows after **{:.2} s = {:.0} orders/s** \
             (from start, connecting and migrating included; {:.2} s from the first row). Backend CPU during the drain: {:.2} s.\n",
            d.orders,
            d.preload_s,
            d.orders,
            d.total_s,
            d.rate(),
            d.after_first_s,
            d.backend_cpu_s
        );
    }
    if let Some(d) = &r.drain_mysql {
        let _ = writeln!(
            md,
            "## Backend drain into MySQL\n\nThe same drain with the backend restarted on a fresh MySQL/MariaDB database \
             (`FLASHGATE_DATABASE_URL`): {}.\n",
            drain_figures(d)
        );
    }

    quote_micro_bench(
        &mut md,
        "Proof-of-work verification cost",
        "What checking a `Flashgate-Pow` header costs the gateway per buy (tag, bindings and the solution's hash; no Redis), \
         from `cargo bench -p flashgate --bench challenge_verify` on this machine before the run. Rows d* and e* above show \
         the sold-out and rate-limited answers with the challenge on: both are given before any challenge is checked.",
        &r.pow_verify,
    );
    quote_micro_bench(
        &mut md,
        "Buyer token verification cost",
        "What checking a buyer's bearer token costs the gateway per request, from `cargo bench -p flashgate --bench \
         token_verify` on this machine before the run: a token seen before is answered from the remembered tokens \
         (SHA-256 of the token, one slot); a first sighting is the full HS256 check. Row d (every request a buyer \
         among 300,000, each seen about once a round) is mostly first sightings.",
        &r.token_verify,
    );
    quote_micro_bench(
        &mut md,
        "Per-user bucket cost",
        "What a buy's per-user bucket costs the gateway, from `cargo bench -p flashgate --bench user_buckets` on this \
         machine before the run, with the default `limits.max_tracked_keys` of 100,000: a new user's first buy makes \
         the bucket while the table has room, and once it is full, when moka's admission mostly turns the newcomer \
         away (it keeps the keys seen more often) and the bucket is made afresh each time; a user hammering finds \
         their bucket and is refused. In row c each buy is a new buyer's, the next of 300,000, so a round's first \
         100,000 buys fill the table and the rest meet it full.",
        &r.user_buckets,
    );

    if !r.evalsha.is_empty() {
        let _ = writeln!(
            md,
            "## Redis deduct ceiling (peers/redis-evalsha, quoted)\n"
        );
        let _ = writeln!(
            md,
            "redis-benchmark calling the peer's deduct script by EVALSHA, 50 clients, without and with pipelining; run after both sides were stopped.\n"
        );
        let _ = writeln!(md, "```text\n{}\n```\n", r.evalsha.join("\n"));
    }

    redis_per_win_section(&mut md, r);

    if !r.profiles.is_empty() {
        let _ = writeln!(md, "## Profiles\n");
        let _ = writeln!(md, "`perf record -e cpu-clock -F 499` on the process (hardware counters are not available on this machine), `perf report --no-children --sort dso,symbol`: top frames by self time.\n");
        for p in &r.profiles {
            let _ = writeln!(
                md,
                "### {}\n\n```text\n{}\n```\n",
                p.what,
                p.lines.join("\n")
            );
        }
    } else if !r.perf_available {
        let _ = writeln!(md, "## Profiles\n\n`perf record` is not usable here; use `valgrind --tool=callgrind` on a short run instead.\n");
    }

    let _ = writeln!(md, "## Settings and versions\n");
    let _ = writeln!(md, "| setting | value |\n|---|---|");
    for (k, v) in &r.settings {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    for (k, v) in &m.versions {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    md
}

/// The commands the deduct script calls on a buy's path
/// (lua/deduct_batch.lua and its lib files); the same commands are also
/// sent outside scripts (the gateway's and the backend's reads).
const DEDUCT_COMMANDS: &[&str] = &[
    "get", "hget", "hmget", "hincrby", "decr", "hset", "xadd", "set", "info", "time", "hlen",
    "expire",
];

/// The Redis half of the buy row, per win, from Redis's time inside
/// commands: the script calls (with the commands they call), the deduct's
/// commands, their difference (the scripts' own work) and the rest.
struct RedisPerWin {
    /// Flashgate's c rounds pooled (those whose books balanced).
    rounds: usize,
    /// (command, calls per win, µs per call, µs per win), the costliest first.
    commands: Vec<(String, f64, f64, f64)>,
    scripts_us: f64,
    deduct_commands_us: f64,
    other_us: f64,
}

fn redis_per_win(r: &Results) -> Option<RedisPerWin> {
    // A round whose books failed may count fewer winners than Redis made.
    let measured: Vec<&crate::results::RedisCommands> = r
        .of("c_buy", Side::Flashgate)
        .into_iter()
        .filter_map(|x| x.check.as_ref())
        .filter(|c| c.ok)
        .filter_map(|c| c.redis.as_ref())
        .collect();
    let wins: u64 = measured.iter().map(|m| m.wins).sum();
    if wins == 0 {
        return None;
    }
    let mut sums = std::collections::BTreeMap::<&str, (u64, u64)>::new();
    for c in measured.iter().flat_map(|m| &m.commands) {
        let sum = sums.entry(&c.name).or_default();
        sum.0 += c.calls;
        sum.1 += c.usec;
    }
    let per_win = |v: u64| v as f64 / wins as f64;
    let us_of = |pick: &dyn Fn(&str) -> bool| {
        per_win(sums.iter().filter(|(n, _)| pick(n)).map(|(_, s)| s.1).sum())
    };
    let is_script = |n: &str| n == "evalsha" || n == "eval";
    let mut commands: Vec<_> = sums
        .iter()
        .map(|(n, &(calls, usec))| {
            let per_call = usec as f64 / calls.max(1) as f64;
            ((*n).to_owned(), per_win(calls), per_call, per_win(usec))
        })
        .collect();
    commands.sort_by(|a, b| b.3.total_cmp(&a.3));
    Some(RedisPerWin {
        rounds: measured.len(),
        commands,
        scripts_us: us_of(&is_script),
        deduct_commands_us: us_of(&|n| DEDUCT_COMMANDS.contains(&n)),
        other_us: us_of(&|n| !is_script(n) && !DEDUCT_COMMANDS.contains(&n)),
    })
}

fn redis_per_win_section(md: &mut String, r: &Results) {
    let Some(w) = redis_per_win(r) else {
        return;
    };
    let _ = writeln!(md, "## Redis per win in the buy row (c)\n");
    let _ = writeln!(
        md,
        "Redis's time inside its commands (`INFO commandstats`: not its I/O, parsing or event loop; on a busy machine \
         including being preempted) over Flashgate's {} c round(s) whose books balanced, each reset before the round \
         (warmup included) and read after its load ends, per win of the same window. A script call's time includes \
         the commands it calls, which are also counted on their own lines. Rows under 0.05 µs per win are left out \
         of the table, not of the sums.\n",
        w.rounds
    );
    let _ = writeln!(
        md,
        "| command | calls per win | µs per call | µs per win |\n|---|---:|---:|---:|"
    );
    for (name, calls, per_call, us) in w.commands.iter().filter(|c| c.3 >= 0.05) {
        let _ = writeln!(md, "| {name} | {calls:.3} | {per_call:.2} | {us:.2} |");
    }
    let own = (w.scripts_us - w.deduct_commands_us).max(0.0);
    let _ = writeln!(
        md,
        "\nScript calls (the deduct's, and the backend's few timed trims and fence checks): **{:.2} µs per win**. \
         The commands the deduct calls ({}): {:.2} µs per win, the same commands sent outside scripts included. \
         Script calls less those commands: **{:.2} µs per win ({:.0} % of the script calls' time)**: the scripts' \
         own work, their Lua and Redis's handling of each `redis.call` around the command. Every other command \
         (the backend's stream reads and acks, what the trims and fence checks call): {:.2} µs per win.\n",
        w.scripts_us,
        DEDUCT_COMMANDS.join(", "),
        w.deduct_commands_us,
        own,
        100.0 * own / w.scripts_us.max(1e-9),
        w.other_us
    );
}

/// One drain's figures, as the targets table shows them.
fn drain_figures(d: &crate::results::Drain) -> String {
    format!(
        "{} orders in {:.2} s from backend start = {:.0}/s ({:.0}/s from the first row); backend CPU {:.2} s",
        d.orders,
        d.total_s,
        d.rate(),
        d.orders as f64 / d.after_first_s.max(1e-9),
        d.backend_cpu_s
    )
}

/// The waiting room's rows beside the static page, and the crowd.
fn room_section(md: &mut String, r: &Results) {
    let fa = rps(r, "a_static", Side::Flashgate);
    let inside = rps(r, "j_room_admitted", Side::Flashgate);
    let queued = rps(r, "j_room_queued", Side::Flashgate);
    if inside.is_none() && queued.is_none() && r.room_crowd.is_none() {
        return;
    }
    let _ = writeln!(md, "## Waiting room\n");
    let _ = writeln!(
        md,
        "A gateway whose one-seat room guards the shop's page (the peers' static nginx): a visitor inside sends \
         their room cookie (verified in memory, no Redis call) and is proxied to the shop; a visitor waiting \
         behind them gets the queue page (one `lua/room_visit.lua` call each). Mean of rounds, beside the \
         gateway's own static page in the same run.\n\n\
         | request | req/s | vs static page |\n|---|---:|---:|\n\
         | static sale page (a) | {} | 1.00× |\n\
         | a visitor inside: the shop's page (j) | {} | {}× |\n\
         | a visitor waiting: the queue page (j') | {} | {}× |\n",
        f0(fa),
        f0(inside),
        f2(ratio(inside, fa)),
        f0(queued),
        f2(ratio(queued, fa)),
    );
    if let Some(c) = &r.room_crowd {
        let _ = writeln!(
            md,
            "**Under a crowd** (`{}`): a room of {} seats with {} s sessions guards the shop's page. {} visitors joined \
             in {:.1} s ({} places given). Then for {:.1} s they came back in turn, each with their own cookie, \
             as fast as {} connections could send: the gateway answered **{:.0} requests/s**, of which **{:.1}/s reached \
             the shop**, against {:.0} seats freed per second (active_users / session_seconds); the most visitors Redis \
             held inside, sampled every 50 ms, was **{}**. Errors: {}.\n",
            crate::room_crowd::SCENARIO,
            crate::room_crowd::ACTIVE_USERS,
            crate::room_crowd::SESSION_SECONDS,
            c.visitors,
            c.join_s,
            c.waiting_at_start,
            c.poll_s,
            128,
            c.answers_per_s(),
            c.shop_per_s(),
            crate::room_crowd::Crowd::bound_per_s(),
            c.most_inside,
            c.errors
        );
    }
}

/// A micro-benchmark's figures, quoted under `title` with what they
/// measure; nothing when it was not run.
fn quote_micro_bench(md: &mut String, title: &str, about: &str, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(md, "## {title} (quoted)\n\n{about}\n");
    let _ = writeln!(md, "```text\n{}\n```\n", lines.join("\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_beside_its_goal_never_prints_the_goal_unless_it_is_the_goal() {
        assert_eq!(f2_vs(Some(0.948), 0.95), "0.948", "missed, not 0.95");
        assert_eq!(f2_vs(Some(0.9512), 0.95), "0.951");
        assert_eq!(f2_vs(Some(0.60049), 0.6), "0.6005", "missed, not 0.600");
        assert_eq!(f2_vs(Some(0.87), 0.95), "0.87");
        assert_eq!(f2_vs(Some(0.95), 0.95), "0.95");
        assert_ne!(f2_vs(Some(0.95 - 1e-9), 0.95), "0.95", "however close");
        assert_eq!(f2_vs(Some(12.345), 2.0), "12.35");
        assert_eq!(f2_vs(None, 1.0), "–");
    }

    fn round(scenario: &'static str, side: Side, rps: f64) -> RoundResult {
        RoundResult {
            scenario,
            side,
            round: 1,
            loadavg_before: String::new(),
            summary: crate::load::Summary {
                rps,
                ..Default::default()
            },
            cpu: Default::default(),
            check: None,
        }
    }

    fn buy_round(
        scenario: &'static str,
        side: Side,
        ok: bool,
        wins: u64,
        commands: Vec<crate::stack::CommandStat>,
    ) -> RoundResult {
        RoundResult {
            check: Some(crate::results::Check {
                ok,
                text: String::new(),
                script_calls: None,
                redis: Some(crate::results::RedisCommands { wins, commands }),
            }),
            ..round(scenario, side, 10_000.0)
        }
    }

    fn stat(name: &str, calls: u64, usec: u64) -> crate::stack::CommandStat {
        crate::stack::CommandStat {
            name: name.into(),
            calls,
            failed: 0,
            usec,
        }
    }

    /// A round of `rps` req/s over 10 s whose gateway and Redis used
    /// `gateway_s` and `redis_s` CPU seconds.
    fn costed_round(scenario: &'static str, gateway_s: f64, redis_s: f64) -> RoundResult {
        let mut x = round(scenario, Side::Flashgate, 40_000.0);
        x.summary.elapsed_s = 10.0;
        x.summary.requests = 400_000;
        x.cpu.secs = vec![("gateway".into(), gateway_s), ("redis".into(), redis_s)];
        x
    }

    #[test]
    fn the_cost_model_counts_redis_during_rejections_in_cores_not_per_request() {
        let mut soldout = costed_round("d_soldout", 12.0, 0.4);
        soldout.check = Some(crate::results::Check {
            ok: true,
            text: String::new(),
            script_calls: Some((120, 0)),
            redis: None,
        });
        soldout.summary.total_statuses = [(410, 480_000)].into();
        let r = Results {
            rounds: vec![
                soldout,
                costed_round("e_hammer", 10.0, 0.2),
                costed_round("c_buy", 20.0, 12.0),
            ],
            ..Default::default()
        };
        let mut md = String::new();
        cost_model_section(&mut md, &r);
        // 0.04 and 0.02 cores busy: 0.03 on average. Per request that is
        // 0.75 µs, which scaled to 10,000,000 requests/s would read 7.5
        // cores and 8 masters.
        assert!(md.contains("| – | 0.03 |"), "{md}");
        assert!(md.contains("0.25 script calls per 1,000 requests"), "{md}");
        // The wins: 30 µs of Redis each, 10,000 of them in one second.
        assert!(
            md.contains("(0.30 cores should all 10000 wins come in one second)"),
            "{md}"
        );
        assert!(md.contains("**1 Redis master(s)**"), "{md}");
    }

    #[test]
    fn the_buy_rows_redis_is_split_per_win_into_script_calls_their_commands_and_the_rest() {
        let heavy = || vec![stat("evalsha", 1, 1_000_000), stat("xadd", 1, 1_000_000)];
        let r = Results {
            rounds: vec![
                buy_round(
                    "c_buy",
                    Side::Flashgate,
                    true,
                    100,
                    vec![
                        stat("evalsha", 10, 3_000),
                        stat("xadd", 100, 200),
                        stat("xack", 5, 100),
                    ],
                ),
                buy_round(
                    "c_buy",
                    Side::Flashgate,
                    true,
                    100,
                    vec![stat("evalsha", 10, 3_000), stat("hset", 100, 200)],
                ),
                // Not pooled: a round whose books failed, another row's, the peer's.
                buy_round("c_buy", Side::Flashgate, false, 1, heavy()),
                buy_round("c_buy_open", Side::Flashgate, true, 1, heavy()),
                buy_round("c_buy", Side::Peer, true, 1, heavy()),
            ],
            ..Default::default()
        };
        let w = redis_per_win(&r).expect("two c rounds");
        assert_eq!(w.rounds, 2);
        assert_eq!(w.scripts_us, 30.0);
        assert_eq!(w.deduct_commands_us, 2.0);
        assert_eq!(w.other_us, 0.5);
        assert_eq!(w.commands[0], ("evalsha".to_owned(), 0.1, 300.0, 30.0));
        let mut md = String::new();
        redis_per_win_section(&mut md, &r);
        assert!(
            md.contains("**28.00 µs per win (93 % of the script calls' time)**"),
            "{md}"
        );
        assert!(md.contains("| xack | 0.025 | 20.00 | 0.50 |"), "{md}");
        assert!(
            targets(&r)
                .iter()
                .any(|t| t.id == "buy_cpu" && t.figures.contains("Redis per win in the buy row")),
            "the buy CPU target points to the breakdown"
        );
    }

    #[test]
    fn row_d_shows_the_seen_buyers_row_beside_its_own_static_rounds_and_no_verdict_of_its_own() {
        let soldout = |r: &Results| targets(r).into_iter().find(|t| t.id == "soldout");
        let mut r = Results {
            rounds: vec![
                round("d_soldout", Side::Flashgate, 30_000.0),
                round("d_soldout", Side::Reference, 40_000.0),
            ],
            ..Default::default()
        };
        let without = soldout(&r).expect("row d's target");
        assert!(!without.figures.contains("row d°"), "{}", without.figures);
        let targets_without = targets(&r).len();
        // d°'s own static rounds differ from row d's: its ratio must use
        // its own (against row d's it would read 1.02×).
        r.rounds.extend([
            round(SOLDOUT_SEEN, Side::Flashgate, 41_000.0),
            round(SOLDOUT_SEEN, Side::Reference, 45_000.0),
        ]);
        let with = soldout(&r).expect("row d's target");
        assert!(
            with.figures.contains(&format!(
                "from {SEEN_BUYERS} buyers whose tokens the gateway remembers (row d°, no target of its own): 41000 vs 45000 req/s = 0.91×"
            )),
            "{}",
            with.figures
        );
        assert_eq!(with.met, Some(false), "row d's verdict is row d's: 0.75×");
        assert_eq!(targets(&r).len(), targets_without, "d° is judged nowhere");
        assert!(beside_static(SOLDOUT_SEEN) && beside_static("d_soldout"));
        assert!(!beside_static("c_buy"));
    }

    #[test]
    fn a_rejection_row_is_held_to_the_static_rounds_run_beside_it_not_to_row_a() {
        let r = Results {
            rounds: vec![
                // Row a, minutes earlier, on a quieter machine.
                round("a_static", Side::Flashgate, 60_000.0),
                round("d_soldout", Side::Flashgate, 50_000.0),
                round("d_soldout", Side::Reference, 51_000.0),
                round("e_hammer", Side::Flashgate, 45_000.0),
                round("e_hammer", Side::Reference, 46_000.0),
                round("j_unauth", Side::Flashgate, 70_000.0),
                round("j_unauth", Side::Reference, 80_000.0),
            ],
            ..Default::default()
        };
        let verdict = |id: &str| targets(&r).into_iter().find(|t| t.id == id).map(|t| t.met);
        // Each row against its own reference rounds: against row a, sold
        // out would be missed and 401 met; against the mean of all the
        // reference rounds (59,000), sold out and rate-limited missed.
        assert_eq!(verdict("soldout"), Some(Some(true)), "50,000 vs 51,000");
        assert_eq!(verdict("ratelimited"), Some(Some(true)), "45,000 vs 46,000");
        assert_eq!(verdict("unauth"), Some(Some(false)), "70,000 vs 80,000");
        assert_eq!(verdict("bad_input"), Some(None), "not run: no verdict");
    }
}
