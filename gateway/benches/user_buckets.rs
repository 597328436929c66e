//! What a buy's per-user bucket costs the gateway per request: a crowd of
//! users each seen once (the bucket made, as in a sale's opening
//! second), larger and smaller than `limits.max_tracked_keys`, and one
//! user hammering. Run with `cargo bench -p flashgate --bench
//! user_buckets`; prints microseconds per call (no assertion: a figure
//! for the docs, not a test).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use flashgate_common::config::{Bucket, LimitsConfig, RouteLimits};
use flashgate_gateway::admission::{Limiters, RouteClass};

mod common;
use common::per_call;

fn limiters(max_tracked_keys: u64) -> Limiters {
    let one = NonZeroU32::new(1).expect("non-zero");
    let ten = NonZeroU32::new(10).expect("non-zero");
    Limiters::new(&LimitsConfig {
        trusted_proxies: vec![],
        client_ip_header: Default::default(),
        max_tracked_keys,
        idle: Duration::from_secs(60),
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
    let crowd: Vec<String> = (0..300_000).map(|i| format!("buyer-{i}")).collect();
    for (name, keys) in [
        ("300,000 users, first sighting, 100,000 tracked", 100_000),
        ("300,000 users, first sighting, 400,000 tracked", 400_000),
    ] {
        let limiters = limiters(keys);
        per_call(name, 0, crowd.len(), |i| {
            black_box(check(&limiters, black_box(&crowd[i])));
        });
    }
    let limiters = limiters(100_000);
    per_call("one user hammering", 0, 1_000_000, |_| {
        black_box(check(&limiters, black_box("buyer-42")));
    });
}
