//! What a buy's per-user bucket costs the gateway per request, with the
//! default `limits.max_tracked_keys` of 100,000: new users' first buys
//! while the table has room, then once it is full (moka's admission
//! mostly turns newcomers away, so each gets its bucket made afresh),
//! and one user hammering past their burst. Run with `cargo bench -p
//! flashgate --bench user_buckets`; prints microseconds per call (no
//! assertion: a figure for the docs, not a test).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use flashgate_common::config::{file, Bucket, LimitsConfig, RouteLimits};
use flashgate_gateway::admission::{Limiters, RouteClass};

mod common;
use common::per_call;

/// The default `limits.max_tracked_keys`, which the phases' names quote.
const TRACKED: usize = 100_000;

fn limiters() -> Limiters {
    let one = NonZeroU32::new(1).expect("non-zero");
    let ten = NonZeroU32::new(10).expect("non-zero");
    Limiters::new(&LimitsConfig {
        trusted_proxies: vec![],
        client_ip_header: Default::default(),
        max_tracked_keys: TRACKED as u64,
        idle: Duration::from_secs(120),
        buy: RouteLimits {
            user: Some(Bucket {
                per_second: one,
                burst: ten,
            }),
            ip: None,
            global: None,
        },
        read: RouteLimits::default(),
        cluster_global: None,
    })
}

fn check(limiters: &Limiters, user: &str) -> bool {
    limiters
        .check_user_then_global(RouteClass::Buy, Some(user))
        .is_ok()
}

fn main() {
    assert_eq!(
        file::Limits::default().max_tracked_keys,
        TRACKED as u64,
        "the phases below are named for the default table size"
    );
    // User ids as long as the bench's (UUIDs).
    let crowd: Vec<String> = (0..3 * TRACKED)
        .map(|i| format!("00000000-0000-4000-8000-{i:012}"))
        .collect();
    let (filling, full) = crowd.split_at(TRACKED);
    let limiters = limiters();
    per_call(
        "100,000 new users, first buy, the table filling",
        0,
        filling.len(),
        |i| {
            black_box(check(&limiters, black_box(&filling[i])));
        },
    );
    per_call(
        "200,000 more new users, first buy, the table full",
        0,
        full.len(),
        |i| {
            black_box(check(&limiters, black_box(&full[i])));
        },
    );
    per_call(
        "one user hammering (refused past the burst)",
        0,
        1_000_000,
        |_| {
            black_box(check(&limiters, black_box(&filling[42])));
        },
    );
}
