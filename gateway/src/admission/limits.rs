//! Token-bucket limits enforced before any Redis call.
//!
//! Each route class (buy, sale-state reads) has up to three GCRA buckets
//! (governor): per user, per client IP, and one global. Keyed buckets live
//! in bounded moka caches (`limits.max_tracked_keys` entries, dropped after
//! `limits.idle_seconds` unused), so memory stays bounded however many
//! distinct users or IPs an attacker invents. The price of the bound: a key
//! pushed out of a full cache starts over with a full bucket. moka's
//! frequency-based admission keeps the keys that are actually hammering.
//!
//! IPv6 clients are keyed by their /64, the smallest block a single
//! subscriber usually holds.
//!
//! The caches hash their keys with aHash, seeded at random per process:
//! a client can pick its IP within its block (and a shop mints user ids),
//! and a random seed keeps it from aiming keys at one hash bucket, at a
//! fraction of SipHash's cost per check.
//!
//! The limiters are generic over governor's [`Clock`]: the default
//! (quanta) clock in production, `FakeRelativeClock` in tests, which then
//! refill buckets by advancing the clock instead of sleeping.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flashgate_common::config::{Bucket, LimitsConfig, RouteLimits};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

/// One bucket on clock `C`.
type Bucket1<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// Which bucket turned a request away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    User,
    Ip,
    Global,
    /// The cluster-wide bucket in Redis (`cluster_limit`).
    Cluster,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Ip => "ip",
            Scope::Global => "global",
            Scope::Cluster => "cluster",
        }
    }
}

/// A rejection by a bucket, with what the RateLimit headers need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub class: RouteClass,
    pub scope: Scope,
    pub bucket: Bucket,
    /// Until one more request would pass.
    pub retry_after: Duration,
}

impl Limited {
    /// Whole seconds to wait, at least 1 (Retry-After has no fractions).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_millis().div_ceil(1000).max(1) as u64
    }

    /// `Retry-After`: [`Self::retry_after_secs`] in decimal.
    pub fn retry_after_header(&self) -> String {
        let mut out = String::with_capacity(4);
        push_decimal(&mut out, self.retry_after_secs());
        out
    }

    /// `RateLimit-Policy` per draft-ietf-httpapi-ratelimit-headers: the
    /// quota `q` and the window `w` (seconds) in which a full bucket refills.
    pub fn policy_header(&self) -> String {
        let window = self
            .bucket
            .burst
            .get()
            .div_ceil(self.bucket.per_second.get())
            .max(1);
        let mut out = self.policy_name(24);
        out.push_str(";q=");
        push_decimal(&mut out, u64::from(self.bucket.burst.get()));
        out.push_str(";w=");
        push_decimal(&mut out, u64::from(window));
        out
    }

    /// `RateLimit`: none left, and the seconds until one more passes.
    pub fn state_header(&self) -> String {
        let mut out = self.policy_name(20);
        out.push_str(";r=0;t=");
        push_decimal(&mut out, self.retry_after_secs());
        out
    }

    /// `"<class>-<scope>"`, the policy's name in both headers, with room
    /// for `extra` more bytes.
    fn policy_name(&self, extra: usize) -> String {
        let (class, scope) = (self.class.as_str(), self.scope.as_str());
        let mut out = String::with_capacity(class.len() + scope.len() + 3 + extra);
        out.push('"');
        out.push_str(class);
        out.push('-');
        out.push_str(scope);
        out.push('"');
        out
    }
}

/// Appends `n` in decimal. The RateLimit headers are written for every
/// 429, the commonest answer under a flood: plain pushes cost a fraction
/// of `format!`'s machinery.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[start..].iter().map(|&d| char::from(d)));
}

/// The route classes limits are configured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteClass {
    Buy,
    Read,
}

impl RouteClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteClass::Buy => "buy",
            RouteClass::Read => "read",
        }
    }
}

fn quota(b: Bucket) -> Quota {
    Quota::per_second(b.per_second).allow_burst(b.burst)
}

/// Locks that serialise the making of a key's first bucket, the key's
/// hash picking one (see [`Keyed::first_bucket`]): enough that distinct
/// new keys seldom wait on each other, few enough to cost nothing held.
const FIRST_BUCKET_LOCKS: usize = 64;

/// Keys a keyed limiter's table is sized for from the start (at most
/// `limits.max_tracked_keys`), so the first crowd after a start or a
/// limits reload, a sale's opening second, fills it without rehashing
/// it on the way. The table is allocated then whether or not the limiter
/// sees traffic: 2 MiB of slots at the default, 16 MiB from about 524,000
/// keys on (the bound). moka may shrink a table that idle keys emptied;
/// a later crowd grows it again as it would have without this.
const PRESIZED_KEYS: u64 = 1_000_000;

/// Buckets keyed by user or IP, in a bounded cache.
struct Keyed<K: std::hash::Hash + Eq + Send + Sync + 'static, C: Clock> {
    bucket: Bucket,
    quota: Quota,
    cache: moka::sync::Cache<K, Arc<Bucket1<C>>, ahash::RandomState>,
    first: [Mutex<()>; FIRST_BUCKET_LOCKS],
    first_of: ahash::RandomState,
}

impl<
        K: std::hash::Hash + Eq + Send + Sync + Clone + 'static,
        C: Clock + Clone + Send + Sync + 'static,
    > Keyed<K, C>
{
    fn new(bucket: Bucket, cfg: &LimitsConfig) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(cfg.max_tracked_keys)
            .initial_capacity(cfg.max_tracked_keys.min(PRESIZED_KEYS) as usize)
            .time_to_idle(cfg.idle)
            .build_with_hasher(ahash::RandomState::new());
        Self {
            bucket,
            quota: quota(bucket),
            cache,
            first: std::array::from_fn(|_| Mutex::new(())),
            first_of: ahash::RandomState::new(),
        }
    }

    fn check<Q>(&self, key: &Q, clock: &C) -> Result<(), Duration>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let limiter = match self.cache.get(key) {
            Some(l) => l,
            None => self.first_bucket(key, clock),
        };
        limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(clock.now()))
    }

    /// The bucket of a key the cache did not hold a moment ago. First
    /// requests of one key racing on several threads must share one
    /// bucket, or a later insert would forget what the requests before it
    /// spent: the maker holds the key's lock and looks again first. (A
    /// lock of our own, not moka's `get_with`, whose single-flight
    /// bookkeeping cost more than the insert itself on a sale's crowd of
    /// new users.) Each bucket gets a clone of the one clock: building a
    /// fresh clock per key would query the CPU (cpuid) every time, which
    /// traps to the hypervisor on virtual machines.
    fn first_bucket<Q>(&self, key: &Q, clock: &C) -> Arc<Bucket1<C>>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let lock = &self.first[self.first_of.hash_one(key) as usize % FIRST_BUCKET_LOCKS];
        let _making = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(made) = self.cache.get(key) {
            return made;
        }
        let bucket = Arc::new(RateLimiter::direct_with_clock(self.quota, clock.clone()));
        self.cache.insert(key.to_owned(), bucket.clone());
        bucket
    }
}

/// The buckets of one route class.
struct ClassLimiter<C: Clock> {
    class: RouteClass,
    user: Option<Keyed<String, C>>,
    ip: Option<Keyed<IpAddr, C>>,
    global: Option<(Bucket, Bucket1<C>)>,
}

impl<C: Clock + Clone + Send + Sync + 'static> ClassLimiter<C> {
    fn new(class: RouteClass, limits: &RouteLimits, cfg: &LimitsConfig, clock: &C) -> Self {
        Self {
            class,
            user: limits.user.map(|b| Keyed::new(b, cfg)),
            ip: limits.ip.map(|b| Keyed::new(b, cfg)),
            global: limits
                .global
                .map(|b| (b, RateLimiter::direct_with_clock(quota(b), clock.clone()))),
        }
    }

    fn limited(&self, scope: Scope, bucket: Bucket, retry_after: Duration) -> Limited {
        Limited {
            class: self.class,
            scope,
            bucket,
            retry_after,
        }
    }
}

/// Every limiter of the gateway.
pub struct Limiters<C: Clock = DefaultClock> {
    buy: ClassLimiter<C>,
    read: ClassLimiter<C>,
    clock: C,
}

impl Limiters {
    pub fn new(cfg: &LimitsConfig) -> Self {
        Self::with_clock(cfg, DefaultClock::default())
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Limiters<C> {
    /// Limiters whose buckets refill on `clock`.
    pub fn with_clock(cfg: &LimitsConfig, clock: C) -> Self {
        Self {
            buy: ClassLimiter::new(RouteClass::Buy, &cfg.buy, cfg, &clock),
            read: ClassLimiter::new(RouteClass::Read, &cfg.read, cfg, &clock),
            clock,
        }
    }

    fn class(&self, class: RouteClass) -> &ClassLimiter<C> {
        match class {
            RouteClass::Buy => &self.buy,
            RouteClass::Read => &self.read,
        }
    }

    /// The per-IP bucket; checked first, before the token is even parsed.
    ///
    /// # Errors
    /// [`Limited`] when the bucket is empty.
    pub fn check_ip(&self, class: RouteClass, ip: IpAddr) -> Result<(), Limited> {
        let c = self.class(class);
        match &c.ip {
            Some(k) => k
                .check(&ip_key(ip), &self.clock)
                .map_err(|wait| c.limited(Scope::Ip, k.bucket, wait)),
            None => Ok(()),
        }
    }

    /// The per-user bucket, then the global one: a user over their own
    /// limit does not spend the global budget.
    ///
    /// # Errors
    /// [`Limited`] when a bucket is empty.
    pub fn check_user_then_global(
        &self,
        class: RouteClass,
        user: Option<&str>,
    ) -> Result<(), Limited> {
        let c = self.class(class);
        if let (Some(k), Some(user)) = (&c.user, user) {
            k.check(user, &self.clock)
                .map_err(|wait| c.limited(Scope::User, k.bucket, wait))?;
        }
        if let Some((bucket, limiter)) = &c.global {
            limiter.check().map_err(|nu| {
                c.limited(Scope::Global, *bucket, nu.wait_time_from(self.clock.now()))
            })?;
        }
        Ok(())
    }

    /// Keys currently tracked (users + IPs, all classes), for tests and metrics.
    pub fn tracked_keys(&self) -> u64 {
        [&self.buy, &self.read]
            .iter()
            .map(|c| {
                c.user.as_ref().map_or(0, |k| {
                    k.cache.run_pending_tasks();
                    k.cache.entry_count()
                }) + c.ip.as_ref().map_or(0, |k| {
                    k.cache.run_pending_tasks();
                    k.cache.entry_count()
                })
            })
            .sum()
    }
}

/// IPv4 as is (also when written IPv4-mapped); IPv6 truncated to its /64.
pub(crate) fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut seg = v6.segments();
            seg[4..].fill(0);
            IpAddr::V6(seg.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_written_whole_from_zero_to_the_largest() {
        for n in [0, 7, 10, 1234, u64::from(u32::MAX), u64::MAX] {
            let mut out = String::from("x");
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }

    fn cfg(buy: RouteLimits) -> LimitsConfig {
        LimitsConfig {
            trusted_proxies: vec![],
            client_ip_header: Default::default(),
            max_tracked_keys: 1000,
            idle: Duration::from_secs(60),
            buy,
            read: RouteLimits::default(),
            cluster_global: None,
        }
    }

    #[test]
    fn a_user_gets_exactly_the_burst_then_is_limited_with_a_wait() {
        let l = Limiters::new(&cfg(RouteLimits {
            user: Bucket::new(1, 3),
            ..Default::default()
        }));
        for _ in 0..3 {
            assert!(l.check_user_then_global(RouteClass::Buy, Some("u")).is_ok());
        }
        let err = l
            .check_user_then_global(RouteClass::Buy, Some("u"))
            .unwrap_err();
        assert_eq!(err.scope, Scope::User);
        assert_eq!(err.retry_after_secs(), 1);
        assert_eq!(err.policy_header(), "\"buy-user\";q=3;w=3");
        assert_eq!(err.state_header(), "\"buy-user\";r=0;t=1");
        assert_eq!(err.retry_after_header(), "1");
        assert!(
            l.check_user_then_global(RouteClass::Buy, Some("other"))
                .is_ok(),
            "buckets are per user"
        );
        assert!(
            l.check_user_then_global(RouteClass::Read, Some("u"))
                .is_ok(),
            "classes are separate"
        );
    }

    #[test]
    fn ipv6_clients_share_a_bucket_per_slash_64() {
        let l = Limiters::new(&cfg(RouteLimits {
            ip: Bucket::new(1, 1),
            ..Default::default()
        }));
        assert!(l
            .check_ip(RouteClass::Buy, "2001:db8::1".parse().unwrap())
            .is_ok());
        assert_eq!(
            l.check_ip(RouteClass::Buy, "2001:db8::2".parse().unwrap())
                .unwrap_err()
                .scope,
            Scope::Ip
        );
        assert!(l
            .check_ip(RouteClass::Buy, "2001:db8:0:1::1".parse().unwrap())
            .is_ok());
    }

    #[test]
    fn ipv4_mapped_clients_get_their_own_ipv4_bucket() {
        let l = Limiters::new(&cfg(RouteLimits {
            ip: Bucket::new(1, 1),
            ..Default::default()
        }));
        assert!(l
            .check_ip(RouteClass::Buy, "::ffff:192.0.2.1".parse().unwrap())
            .is_ok());
        assert!(
            l.check_ip(RouteClass::Buy, "::ffff:192.0.2.2".parse().unwrap())
                .is_ok(),
            "not one /64 for all IPv4"
        );
        assert_eq!(
            l.check_ip(RouteClass::Buy, "192.0.2.1".parse().unwrap())
                .unwrap_err()
                .scope,
            Scope::Ip,
            "same bucket as its IPv4 spelling"
        );
    }

    #[test]
    fn the_longest_idle_time_the_config_accepts_builds_the_limiters() {
        // The cache refuses (panics on) idle times over 1000 years; the
        // config stops far below, at a day.
        let mut c = cfg(RouteLimits {
            user: Bucket::new(1, 1),
            ip: Bucket::new(1, 1),
            ..Default::default()
        });
        c.idle = Duration::from_secs(flashgate_common::config::MAX_LIMITS_IDLE_SECONDS);
        let l = Limiters::new(&c);
        assert!(l
            .check_ip(RouteClass::Buy, "192.0.2.1".parse().unwrap())
            .is_ok());
        assert!(l.check_user_then_global(RouteClass::Buy, Some("u")).is_ok());
    }

    #[test]
    fn tracked_keys_stay_under_the_cap() {
        let mut c = cfg(RouteLimits {
            user: Bucket::new(1, 1),
            ..Default::default()
        });
        c.max_tracked_keys = 100;
        let l = Limiters::new(&c);
        for i in 0..5000 {
            let _ = l.check_user_then_global(RouteClass::Buy, Some(&format!("u{i}")));
        }
        assert!(l.tracked_keys() <= 100, "{}", l.tracked_keys());
    }

    #[test]
    fn first_requests_of_a_new_user_racing_on_threads_share_one_burst() {
        const THREADS: usize = 4;
        const BURST: u32 = 3;
        let clock = governor::clock::FakeRelativeClock::default();
        let l = Limiters::with_clock(
            &cfg(RouteLimits {
                user: Bucket::new(1, BURST),
                ..Default::default()
            }),
            clock,
        );
        let start = std::sync::Barrier::new(THREADS);
        for round in 0..300 {
            let user = format!("u{round}");
            let allowed: u32 = std::thread::scope(|s| {
                let racers: Vec<_> = (0..THREADS)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            (0..BURST)
                                .filter(|_| {
                                    l.check_user_then_global(RouteClass::Buy, Some(&user))
                                        .is_ok()
                                })
                                .count() as u32
                        })
                    })
                    .collect();
                racers.into_iter().map(|r| r.join().unwrap()).sum()
            });
            assert_eq!(
                allowed, BURST,
                "{user}: one bucket, one burst, whoever came first"
            );
        }
    }

    #[test]
    fn an_empty_bucket_refills_as_its_clock_advances() {
        let clock = governor::clock::FakeRelativeClock::default();
        let l = Limiters::with_clock(
            &cfg(RouteLimits {
                user: Bucket::new(2, 2),
                ..Default::default()
            }),
            clock.clone(),
        );
        assert!(l.check_user_then_global(RouteClass::Buy, Some("u")).is_ok());
        assert!(l.check_user_then_global(RouteClass::Buy, Some("u")).is_ok());
        let err = l
            .check_user_then_global(RouteClass::Buy, Some("u"))
            .unwrap_err();
        assert_eq!(
            (err.scope, err.retry_after),
            (Scope::User, Duration::from_millis(500))
        );
        clock.advance(Duration::from_millis(499));
        assert!(
            l.check_user_then_global(RouteClass::Buy, Some("u"))
                .is_err(),
            "not yet refilled"
        );
        clock.advance(Duration::from_millis(1));
        assert!(
            l.check_user_then_global(RouteClass::Buy, Some("u")).is_ok(),
            "one request's worth after 500 ms"
        );
        // The global bucket, on the same clock.
        let l = Limiters::with_clock(
            &cfg(RouteLimits {
                global: Bucket::new(10, 1),
                ..Default::default()
            }),
            clock.clone(),
        );
        assert!(l.check_user_then_global(RouteClass::Buy, None).is_ok());
        assert_eq!(
            l.check_user_then_global(RouteClass::Buy, None)
                .unwrap_err()
                .scope,
            Scope::Global
        );
        clock.advance(Duration::from_millis(100));
        assert!(l.check_user_then_global(RouteClass::Buy, None).is_ok());
    }
}
