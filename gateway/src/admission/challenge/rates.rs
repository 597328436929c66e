//! The adaptive difficulty: how hard a challenge is depends on how fast its
//! user, its client IP and its whole sale are asking right now.
//!
//! A request here is one challenge handed out (a buy answered 428, or a
//! fetch): every buy needs one. A fetch counts for its user only: fetching
//! costs nothing, so a flood of fetches must not raise what the user's
//! neighbours behind one IP, or the whole sale, are asked; a buy counts for
//! all three. Each key keeps one number, the count of
//! its requests with each decayed
//! exponentially over a minute (time constant 60 s): at a steady `r`
//! requests per minute it settles at `r`, a burst of `n` reads `n` at once
//! and fades back. Above a scope's threshold, every doubling of the rate
//! adds a bit (`ceil(log2(rate / threshold))`); the hottest of the three
//! scopes decides, capped at `challenge.max_difficulty_bits`. A buyer who
//! fetches a challenge and buys once stays at the base; a script firing a
//! thousand requests a minute pays 2^8 times as much per request.
//!
//! Memory is bounded as in `limits`: one moka cache per scope,
//! `limits.max_tracked_keys` entries, each dropped after ten minutes
//! unused (by then its count has decayed below 0.01). IPv6 clients are
//! counted by /64. Time is a parameter ([`Instant`]), so tests drive it.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use flashgate_common::config::ChallengeConfig;
use moka::sync::Cache;

/// The time constant of the decay: rates read "per minute".
const WINDOW: Duration = Duration::from_secs(60);
/// Unused keys are dropped after this long.
const IDLE: Duration = Duration::from_secs(600);

/// A decayed request count.
#[derive(Debug, Clone, Copy)]
struct Decayed {
    count: f64,
    at: Instant,
}

impl Decayed {
    /// This count at `now`, with one more request.
    fn bumped(prev: Option<Self>, now: Instant) -> Self {
        Self {
            count: Self::at(prev, now) + 1.0,
            at: now,
        }
    }

    /// This count, decayed to `now`.
    fn at(prev: Option<Self>, now: Instant) -> f64 {
        prev.map_or(0.0, |p| {
            let elapsed = now.saturating_duration_since(p.at).as_secs_f64();
            p.count * (-elapsed / WINDOW.as_secs_f64()).exp()
        })
    }
}

/// One scope's counts (user, IP or sale).
struct Scope<K: std::hash::Hash + Eq + Send + Sync + 'static> {
    /// Requests per minute up to which the scope adds nothing.
    threshold_per_minute: f64,
    counts: Cache<K, Decayed>,
}

impl<K: std::hash::Hash + Eq + Send + Sync + Clone + 'static> Scope<K> {
    fn new(threshold_per_minute: f64, max_keys: u64) -> Self {
        Self {
            threshold_per_minute,
            counts: Cache::builder()
                .max_capacity(max_keys)
                .time_to_idle(IDLE)
                .build(),
        }
    }

    /// Counts one request of `key` and returns the bits it adds now.
    fn hit<Q>(&self, key: &Q, now: Instant) -> u8
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let entry = self
            .counts
            .entry_by_ref(key)
            .and_upsert_with(|prev| Decayed::bumped(prev.map(|e| e.into_value()), now));
        extra_bits(entry.into_value().count, self.threshold_per_minute)
    }

    /// The bits `key` adds now, without counting a request.
    fn peek<Q>(&self, key: &Q, now: Instant) -> u8
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        extra_bits(
            Decayed::at(self.counts.get(key), now),
            self.threshold_per_minute,
        )
    }
}

/// Bits added for `rate` against `threshold`: none up to it, then one per
/// doubling (`ceil(log2(rate / threshold))`), at most 32.
pub fn extra_bits(rate: f64, threshold: f64) -> u8 {
    if rate <= threshold {
        return 0;
    }
    (rate / threshold).log2().ceil().min(32.0) as u8
}

/// The request rates of users, IPs and sales, and the difficulty they ask.
pub struct Rates {
    base: u8,
    max: u8,
    users: Scope<String>,
    ips: Scope<IpAddr>,
    sales: Scope<String>,
}

impl Rates {
    pub fn new(config: &ChallengeConfig, max_keys: u64) -> Self {
        Self {
            base: config.difficulty_bits,
            max: config.max_difficulty_bits,
            users: Scope::new(f64::from(config.user_rate_per_minute), max_keys),
            ips: Scope::new(f64::from(config.ip_rate_per_minute), max_keys),
            // Sales are few; a small cache suffices.
            sales: Scope::new(
                f64::from(config.sale_rate_per_second) * 60.0,
                max_keys.min(10_000),
            ),
        }
    }

    /// Counts one request of `user` from `ip` in `sale` at `now` (a fetch,
    /// `buy == false`, for the user only); returns the difficulty a
    /// challenge issued to it now asks.
    pub fn hit(&self, user: &str, ip: IpAddr, sale: &str, now: Instant, buy: bool) -> u8 {
        let ip = crate::admission::limits::ip_key(ip);
        let shared = if buy {
            self.ips.hit(&ip, now).max(self.sales.hit(sale, now))
        } else {
            self.ips.peek(&ip, now).max(self.sales.peek(sale, now))
        };
        self.base
            .saturating_add(self.users.hit(user, now).max(shared))
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashgate_common::config::ChallengeMode;

    fn rates() -> Rates {
        let config = ChallengeConfig {
            mode: ChallengeMode::Adaptive,
            difficulty_bits: 10,
            max_difficulty_bits: 18,
            ttl: Duration::from_secs(60),
            user_rate_per_minute: 6,
            ip_rate_per_minute: 60,
            sale_rate_per_second: 100,
        };
        Rates::new(&config, 1000)
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    #[test]
    fn a_calm_user_stays_at_the_base() {
        let r = rates();
        let t0 = Instant::now();
        for i in 0..30 {
            // One request every 20 s: 3 a minute, under the 6 allowed.
            assert_eq!(
                r.hit("calm", IP, "drop", t0 + Duration::from_secs(20 * i), true),
                10,
                "request {i}"
            );
        }
    }

    #[test]
    fn a_burst_raises_the_difficulty_one_bit_per_doubling_up_to_the_cap() {
        let r = rates();
        let t0 = Instant::now();
        let asked: Vec<u8> = (0..200)
            .map(|_| r.hit("script", IP, "drop", t0, true))
            .collect();
        assert_eq!(&asked[..6], &[10; 6], "the first six are free");
        assert_eq!(asked[6], 11, "the 7th is above 6 a minute");
        assert_eq!(asked[12], 12, "13 > 2 x 6");
        assert_eq!(asked[24], 13, "25 > 4 x 6");
        assert_eq!(asked[199], 16, "200 / 6 = 33: five doublings and a bit");
        assert!(
            asked.windows(2).all(|w| w[0] <= w[1]),
            "never falls during a burst: {asked:?}"
        );
        for _ in 0..10_000 {
            r.hit("script", IP, "drop", t0, true);
        }
        assert_eq!(
            r.hit("script", IP, "drop", t0, true),
            18,
            "capped at max_difficulty_bits"
        );
        // Another user on the same IP pays for the IP's rate (10,201 a minute).
        assert_eq!(r.hit("neighbour", IP, "drop", t0, true), 18);
        let elsewhere: IpAddr = "198.51.100.7".parse().unwrap();
        assert_eq!(
            r.hit("neighbour", elsewhere, "other-sale", t0, true),
            10,
            "the script's heat stays with its own keys"
        );
    }

    #[test]
    fn fetches_heat_only_their_own_user_and_buys_heat_the_ip_and_the_sale_too() {
        let r = rates();
        let t0 = Instant::now();
        for _ in 0..2000 {
            r.hit("fetcher", IP, "drop", t0, false);
        }
        assert!(
            r.hit("fetcher", IP, "drop", t0, false) > 10,
            "the fetcher pays for its fetches"
        );
        assert_eq!(
            r.hit("neighbour", IP, "drop", t0, true),
            10,
            "its fetches raise nothing for the IP or the sale"
        );
        for _ in 0..2000 {
            r.hit("buyer", IP, "drop", t0, true);
        }
        assert!(
            r.hit("neighbour", IP, "drop", t0, true) > 10,
            "buys heat the IP and the sale"
        );
    }

    #[test]
    fn the_difficulty_falls_back_once_the_rate_decays() {
        let r = rates();
        let t0 = Instant::now();
        for _ in 0..100 {
            r.hit("burst", IP, "drop", t0, true);
        }
        assert!(r.hit("burst", IP, "drop", t0, true) > 10);
        // After ten minutes 101 requests decay to under 0.01.
        assert_eq!(
            r.hit("burst", IP, "drop", t0 + Duration::from_secs(600), true),
            10
        );
    }

    #[test]
    fn the_sale_rate_is_per_second() {
        assert_eq!(extra_bits(6000.0, 100.0 * 60.0), 0);
        assert_eq!(extra_bits(6001.0, 100.0 * 60.0), 1);
        assert_eq!(extra_bits(f64::MAX, 1.0), 32);
    }
}
