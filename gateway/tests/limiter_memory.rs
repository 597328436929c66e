//! Memory stays bounded when attackers invent keys: 1,000,000 distinct IPs
//! and 1,000,000 distinct users go through the buy limiters, and the
//! process's resident memory grows by less than the documented cap.
//!
//! The cap (docs/ARCHITECTURE.md, "Limits and memory"): with
//! `max_tracked_keys = 100000`, each keyed limiter holds at most 100,000
//! buckets, about 100 bytes each with the cache's bookkeeping, so the two
//! limiters stay far below [`RSS_GROWTH_CAP_BYTES`].

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use flashgate_common::config::{Bucket, LimitsConfig, RouteLimits};
use flashgate_gateway::admission::{Limiters, RouteClass};

/// Documented cap on resident-memory growth for 2,000,000 distinct keys.
const RSS_GROWTH_CAP_BYTES: u64 = 128 * 1024 * 1024;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_million_ips_and_a_million_users_keep_memory_under_the_cap() {
    let bucket = Bucket::new(10, 20);
    let cfg = LimitsConfig {
        trusted_proxies: vec![],
        client_ip_header: Default::default(),
        max_tracked_keys: 100_000,
        idle: Duration::from_secs(120),
        buy: RouteLimits {
            user: bucket,
            ip: bucket,
            global: None,
        },
        read: RouteLimits::default(),
        cluster_global: None,
    };
    // Before the limiters are built: their tables are sized at start.
    let before = rss_bytes();
    let limiters = Limiters::new(&cfg);
    let mut user = String::with_capacity(24);
    for i in 0u32..1_000_000 {
        let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
        assert!(
            limiters.check_ip(RouteClass::Buy, ip).is_ok(),
            "a fresh IP has a full bucket"
        );
        user.clear();
        use std::fmt::Write;
        write!(user, "user-{:08x}", i.wrapping_mul(2_654_435_761)).unwrap();
        assert!(limiters
            .check_user_then_global(RouteClass::Buy, Some(&user))
            .is_ok());
    }
    let tracked = limiters.tracked_keys();
    let growth = rss_bytes().saturating_sub(before);
    println!(
        "tracked keys: {tracked}; RSS growth: {} MiB",
        growth / (1024 * 1024)
    );
    assert!(
        tracked <= 200_000,
        "caches exceeded their capacity: {tracked}"
    );
    assert!(growth < RSS_GROWTH_CAP_BYTES, "RSS grew by {growth} bytes");
}
