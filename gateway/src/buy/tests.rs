//! The buy rules against a real redis-server, without Pingora: plain
//! inputs in, a [`BuyOutcome`] out, time from a [`ManualClock`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use flashgate_common::config::{AuthConfig, DenyConfig, LimitsConfig};
use flashgate_common::config::{FairnessConfig, RouteLimits};
use flashgate_common::keys::SaleKeys;
use flashgate_common::now_ms;
use flashgate_common::reservation::Reservation;
use http::HeaderMap;

use super::deduct::{BuyAttempt, DeductOutcome};
use super::*;
use crate::admission::ChallengeGate;
use crate::admission::Limiters;
use crate::admission::{mint, Verifier};
use crate::admission::{Admission, Edge};
use crate::infra::Breaker;
use crate::infra::Metrics;
use crate::infra::OrderClient;
use crate::infra::RedisClient;
use crate::infra::RedisServer;
use crate::infra::{ManualClock, WallClock};
use crate::rejection::Rejection;
use crate::sales::SaleCache;
use crate::sales::Switches;

const SECRET: &[u8] = b"a test secret that is long enough for hs256";
const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

pub(super) struct Fixture {
    pub(super) redis: RedisServer,
    pub(super) service: BuyService<ManualClock>,
    pub(super) clock: ManualClock,
}

pub(super) async fn fixture(deny_users: &[&str]) -> Fixture {
    fixture_with(deny_users, RouteLimits::default()).await
}

/// A fixture whose buys pass the buckets of `buy`.
async fn fixture_with(deny_users: &[&str], buy: RouteLimits) -> Fixture {
    let redis_server = RedisServer::private();
    let limits = LimitsConfig {
        trusted_proxies: vec![],
        client_ip_header: Default::default(),
        max_tracked_keys: 1000,
        idle: Duration::from_secs(60),
        buy,
        read: RouteLimits::default(),
        cluster_global: None,
    };
    let edge = Edge {
        limiters: Arc::new(Limiters::new(&limits)),
        limits,
        deny: DenyConfig {
            users: deny_users.iter().map(|u| (*u).to_owned()).collect(),
            nets: vec![],
        },
        cluster: None,
    };
    let admission = Arc::new(Admission {
        edge: Arc::new(arc_swap::ArcSwap::from_pointee(edge)),
        verifier: Verifier::new(SECRET),
        csrf: Default::default(),
    });
    // Nobody listens there: the backend "does not answer".
    let orders =
        Arc::new(OrderClient::new("http://127.0.0.1:9", Duration::from_millis(200), "t").unwrap());
    let metrics = Arc::new(Metrics::register());
    let switches = Arc::new(Switches::default());
    switches.set_all_paused(false);
    let clock = ManualClock::at(now_ms());
    let redis = Arc::new(RedisClient::standalone(
        &redis_server.url(),
        Duration::from_millis(500),
        Breaker::new(5, Duration::from_secs(1)),
    ));
    let deps = BuyDeps {
        admission,
        challenge: Arc::new(ChallengeGate::off(metrics.clone())),
        redis,
        sales: Arc::new(SaleCache::new(Duration::from_millis(250))),
        switches,
        orders,
        metrics,
        idempotency_ttl: Duration::from_secs(600),
        // No draw unless a sale has a window of its own (`draw_sale`).
        fairness: FairnessConfig {
            window_ms: 0,
            settle: Duration::from_secs(5),
        },
        wait_replicas: 0,
        wait_timeout: Duration::ZERO,
        checkout: crate::buy::Checkout::new(None, Duration::from_secs(600)),
    };
    // Its worker dropped: winners are not forwarded (the backend "does not
    // answer" anyway).
    let (service, _worker) = BuyService::new(deps, clock.clone());
    Fixture {
        redis: redis_server,
        service,
        clock,
    }
}

impl Fixture {
    /// A sale as the backend's preheat leaves it, open from `starts` to `ends`.
    async fn sale(&self, id: &str, stock: i64, starts_at_ms: i64, ends_at_ms: i64) {
        self.sale_with(id, stock, 1, starts_at_ms, ends_at_ms, None)
            .await;
    }

    /// An open sale whose own opening draw closes `closes_in` from now.
    pub(super) async fn draw_sale(
        &self,
        id: &str,
        stock: i64,
        per_user_limit: i64,
        closes_in: Duration,
    ) {
        // Started by the fixture's clock (the window is checked on it), its
        // draw window counted from that start, in Redis time.
        let starts = self.clock.now_ms() - 1000;
        let window = now_ms() - starts + closes_in.as_millis() as i64;
        self.sale_with(
            id,
            stock,
            per_user_limit,
            starts,
            now_ms() + 3_600_000,
            Some(window),
        )
        .await;
    }

    async fn sale_with(
        &self,
        id: &str,
        stock: i64,
        per_user_limit: i64,
        starts_at_ms: i64,
        ends_at_ms: i64,
        draw_window_ms: Option<i64>,
    ) {
        let keys = SaleKeys::new(id);
        let mut conn = self.redis.conn().await;
        let mut meta = vec![
            ("name", "Sneaker".to_owned()),
            ("stock", stock.to_string()),
            ("per_user_limit", per_user_limit.to_string()),
            ("starts_at_ms", starts_at_ms.to_string()),
            ("ends_at_ms", ends_at_ms.to_string()),
            ("paused", "0".to_owned()),
        ];
        if let Some(w) = draw_window_ms {
            meta.push(("draw_window_ms", w.to_string()));
        }
        let _: () = redis::pipe()
            .hset_multiple(&keys.meta, &meta)
            .set(&keys.remaining, stock)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Installed by a backend: agreeing with the database on this Redis.
        let replid = crate::infra::master_replid(&mut conn).await;
        let () = redis::cmd("SET")
            .arg(&keys.synced)
            .arg(replid)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    pub(super) async fn open_sale(&self, id: &str, stock: i64) {
        let now = now_ms();
        self.sale(id, stock, now - 1000, now + 3_600_000).await;
    }

    pub(super) async fn buy(&self, sale_id: &str, user: &str, key: &str) -> BuyOutcome {
        self.service
            .buy(BuyRequest {
                sale_id,
                user,
                idempotency_key: key,
                request_id: "r",
            })
            .await
    }

    /// Opens a one-item sale that user `a` wins with key `ka`; user `b`'s
    /// buy (with `late_key`, possibly empty) then finds it sold out in
    /// Redis, which flags it here. `a`'s reservation id.
    pub(super) async fn sell_out_one(&self, sale_id: &str, late_key: &str) -> String {
        self.open_sale(sale_id, 1).await;
        let BuyOutcome::Won { reservation_id, .. } = self.buy(sale_id, "a", "ka").await else {
            panic!("no win")
        };
        assert_eq!(
            self.buy(sale_id, "b", late_key).await,
            BuyOutcome::Refused(Rejection::SoldOut)
        );
        reservation_id
    }

    pub(super) fn local_decisions(&self, decision: &str) -> u64 {
        self.service
            .metrics
            .local_decisions
            .with_label_values(&[decision])
            .get()
    }
}

fn headers(user: Option<&str>, key: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(user) = user {
        let token = mint(SECRET, user, 600, &AuthConfig::default()).unwrap();
        h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    if let Some(key) = key {
        h.insert("idempotency-key", key.parse().unwrap());
    }
    h
}

#[tokio::test]
async fn a_buyer_refused_at_the_limit_while_stock_lasts_keeps_exactly_the_items_they_hold() {
    let f = fixture(&[]).await;
    f.open_sale("s", 5).await;
    assert!(matches!(
        f.buy("s", "a", "k1").await,
        BuyOutcome::Won { .. }
    ));
    for key in ["k2", "", "k3"] {
        assert_eq!(
            f.buy("s", "a", key).await,
            BuyOutcome::Refused(Rejection::LimitReached)
        );
    }
    let keys = SaleKeys::new("s");
    let mut conn = f.redis.conn().await;
    let (held, left): (Option<String>, i64) = redis::pipe()
        .cmd("HGET")
        .arg(&keys.buyers)
        .arg("a")
        .cmd("GET")
        .arg(&keys.remaining)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (held.as_deref(), left),
        (Some("1"), 4),
        "the refusals took no slot and no item"
    );
}

#[tokio::test]
async fn the_first_buyers_win_until_the_stock_is_gone_then_the_sale_is_flagged() {
    let f = fixture(&[]).await;
    f.open_sale("s", 2).await;
    assert!(matches!(f.buy("s", "a", "").await, BuyOutcome::Won { .. }));
    assert_eq!(
        f.buy("s", "a", "").await,
        BuyOutcome::Refused(Rejection::LimitReached)
    );
    assert!(matches!(f.buy("s", "b", "").await, BuyOutcome::Won { .. }));
    assert_eq!(
        f.buy("s", "c", "").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert!(
        f.service.sales.is_sold_out("s"),
        "a fresh sold-out answer flags the sale"
    );

    // Flagged: the next buy is answered without the script.
    let scripts = f.redis.command_calls("evalsha").await;
    assert_eq!(
        f.buy("s", "d", "").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(f.redis.command_calls("evalsha").await, scripts);
    // Without an Idempotency-Key it is refused before admission (no token needed).
    assert_eq!(
        admit(&f, "s", &headers(None, None)).await,
        Err(Rejection::SoldOut)
    );
    assert_eq!(f.local_decisions("sold_out"), 2);
    let keys = SaleKeys::new("s");
    let entries: u64 = redis::cmd("XLEN")
        .arg(&keys.stream)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(entries, 2, "one stream record per winner");
}

#[tokio::test]
async fn a_won_key_replays_its_win_and_nothing_is_deducted_again() {
    let f = fixture(&[]).await;
    f.open_sale("s", 5).await;
    let BuyOutcome::Won { reservation_id, .. } = f.buy("s", "a", "k1").await else {
        panic!("no win")
    };
    let replay = f.buy("s", "a", "k1").await;
    // The backend does not answer: the order is reported queued.
    assert_eq!(
        replay,
        BuyOutcome::Replayed {
            reservation_id: reservation_id.clone(),
            order: None,
            checkout_url: None,
        }
    );
    let remaining: i64 = redis::cmd("GET")
        .arg(&SaleKeys::new("s").remaining)
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(remaining, 4);
    // The buy path read the snapshot before the win; the view shows the win anyway.
    let view = f
        .service
        .sales
        .view(&f.service.redis, "s", now_ms())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.remaining, 4);
}

#[tokio::test]
async fn the_window_is_checked_locally_on_the_injected_clock() {
    let f = fixture(&[]).await;
    let now = f.clock.now_ms();
    f.sale("s", 5, now - 1000, now + 60_000).await;
    let scripts = f.redis.command_calls("evalsha").await;
    f.clock.advance(Duration::from_secs(61));
    assert_eq!(
        f.buy("s", "a", "").await,
        BuyOutcome::Refused(Rejection::Ended)
    );
    f.sale("later", 5, now + 90_000, now + 120_000).await;
    assert_eq!(
        f.buy("later", "a", "").await,
        BuyOutcome::Refused(Rejection::NotStarted(29))
    );
    assert_eq!(
        f.redis.command_calls("evalsha").await,
        scripts,
        "decided without the script"
    );
    assert_eq!(
        (f.local_decisions("ended"), f.local_decisions("not_started")),
        (1, 1)
    );
}

#[tokio::test]
async fn keyed_buys_before_the_start_ask_redis_for_their_key_only_once_the_sale_sold() {
    let f = fixture(&[]).await;
    let now = f.clock.now_ms();
    f.sale("later", 5, now + 90_000, now + 120_000).await;
    let (scripts, reads) = (
        f.redis.command_calls("evalsha").await,
        f.redis.command_calls("hlen").await,
    );
    for (user, key) in [("a", "k1"), ("b", "k2"), ("a", "k3")] {
        assert_eq!(
            f.buy("later", user, key).await,
            BuyOutcome::Refused(Rejection::NotStarted(90))
        );
    }
    assert_eq!(
        (
            f.redis.command_calls("evalsha").await - scripts,
            f.redis.command_calls("hlen").await - reads
        ),
        (0, 1),
        "one read of the sale's reservations, no key asked for"
    );

    // A sale that sold, then moved to a later start by its operator: a
    // winner's keyed retry replays the win; another key is asked for and
    // refused.
    f.open_sale("s", 5).await;
    let BuyOutcome::Won { reservation_id, .. } = f.buy("s", "a", "k1").await else {
        panic!("no win")
    };
    f.sale("s", 5, now + 90_000, now + 120_000).await;
    f.service.sales.forget("s", None).await;
    let monitor = f.redis.monitor().await;
    assert!(
        matches!(f.buy("s", "a", "k1").await, BuyOutcome::Replayed { reservation_id: r, .. } if r == reservation_id)
    );
    assert_eq!(
        f.buy("s", "b", "k2").await,
        BuyOutcome::Refused(Rejection::NotStarted(90))
    );
    let asked = monitor.commands().await;
    assert!(
        asked.iter().any(|c| c.contains(":b:k2")),
        "b's key was asked for: {asked:?}"
    );
}

#[tokio::test]
async fn paused_switches_and_unknown_sales_are_answered_locally() {
    let f = fixture(&[]).await;
    f.open_sale("s", 5).await;
    f.service.switches.set_all_paused(true);
    assert_eq!(
        f.buy("s", "a", "").await,
        BuyOutcome::Refused(Rejection::Paused)
    );
    f.service.switches.set_all_paused(false);
    // Not in Redis and the backend cannot be asked: unavailable, never 404.
    assert_eq!(
        f.buy("ghost", "a", "").await,
        BuyOutcome::Refused(Rejection::Unavailable)
    );
    assert_eq!(f.redis.command_calls("evalsha").await, 0);
}

#[tokio::test]
async fn admission_checks_the_token_the_deny_list_and_the_key() {
    let f = fixture(&["banned"]).await;
    f.open_sale("s", 5).await;
    assert_eq!(
        admit(&f, "s", &headers(None, None)).await,
        Err(Rejection::Unauthorized(
            crate::admission::AuthError::Missing
        ))
    );
    assert_eq!(
        admit(&f, "s", &headers(Some("banned"), None)).await,
        Err(Rejection::Denied)
    );
    let long_key = "k".repeat(65);
    assert!(matches!(
        admit(&f, "s", &headers(Some("a"), Some(&long_key))).await,
        Err(Rejection::BadRequest(_))
    ));
    let admitted = admit(&f, "s", &headers(Some("a"), Some("k1")))
        .await
        .unwrap();
    assert_eq!(
        admitted,
        Admitted {
            user: "a".into(),
            idempotency_key: "k1".into()
        }
    );
}

#[tokio::test]
async fn a_flagged_sale_answers_unkeyed_buys_and_keyed_buys_of_users_who_never_reserved_without_redis(
) {
    let f = fixture(&[]).await;
    f.open_sale("s", 1).await;
    assert!(matches!(
        f.buy("s", "winner", "k").await,
        BuyOutcome::Won { .. }
    ));
    assert_eq!(
        f.buy("s", "late", "").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert!(f.service.sales.is_sold_out("s"));
    let monitor = f.redis.monitor().await;
    assert_eq!(
        f.buy("s", "late", "").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(
        f.buy("s", "other", "k").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(
        monitor.commands().await,
        Vec::<String>::new(),
        "answered by the flag and the sale's buyers"
    );
    let monitor = f.redis.monitor().await;
    assert!(
        matches!(f.buy("s", "winner", "k").await, BuyOutcome::Replayed { .. }),
        "the winner's retry replays"
    );
    let sent: Vec<String> = monitor
        .commands()
        .await
        .into_iter()
        .filter(|c| !c.contains(" lua]"))
        .collect();
    assert!(
        sent.iter().any(|c| c.contains("EVALSHA")),
        "a buyer's keyed retry goes to the script: {sent:?}"
    );
    let remembered: bool = redis::cmd("HEXISTS")
        .arg(SaleKeys::new("s").idempotency_misses("other"))
        .arg("k")
        .query_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert!(
        !remembered,
        "an answer of the flag is not remembered under its key"
    );
}

/// A fixture whose users' buy bucket holds one token (no IP or global bucket).
async fn fixture_with_one_token_per_user() -> Fixture {
    use flashgate_common::config::Bucket;
    let user = Bucket::new(1, 1);
    fixture_with(
        &[],
        RouteLimits {
            user,
            ip: None,
            global: None,
        },
    )
    .await
}

#[tokio::test]
async fn a_buy_spends_its_buckets_once_its_body_was_read_and_nothing_in_redis() {
    let f = fixture_with_one_token_per_user().await;
    f.open_sale("s", 1).await;
    // The sale as held by a gateway that already served it.
    let held = f.service.sales.window(&f.service.redis, "s").await;
    assert!(held.is_ok_and(|w| w.is_some()));
    let monitor = f.redis.monitor().await;
    assert!(admit(&f, "s", &headers(Some("a"), Some("k"))).await.is_ok());
    // Admitted, not proved: no token of the user's spent, so a second buy
    // is admitted too.
    let admitted = admit(&f, "s", &headers(Some("a"), Some("k")))
        .await
        .unwrap();
    let headers = headers(Some("a"), Some("k"));
    assert!(f
        .service
        .prove("s", &admitted, PEER, &headers)
        .await
        .is_ok());
    assert_eq!(
        monitor.commands().await,
        Vec::<String>::new(),
        "admission reads and writes nothing in Redis"
    );
    assert!(matches!(
        f.service.prove("s", &admitted, PEER, &headers).await,
        Err(Rejection::RateLimited(_))
    ));
}

#[tokio::test]
async fn a_buy_before_the_start_is_answered_before_a_bucket_is_spent() {
    let f = fixture_with_one_token_per_user().await;
    let now = f.clock.now_ms();
    f.sale("soon", 5, now + 30_000, now + 60_000).await;
    for key in [None, Some("k1"), Some("k2")] {
        let headers = headers(Some("a"), key);
        assert_eq!(
            admit_and_prove(&f, "soon", &headers).await,
            Err(Rejection::NotStarted(30))
        );
    }
    // Open now: the one token of the bucket is still there.
    f.clock.advance(Duration::from_secs(31));
    let headers = headers(Some("a"), Some("k3"));
    assert_eq!(admit_and_prove(&f, "soon", &headers).await, Ok(()));
}

/// A buy's admission as the proxy runs it, its body aside: the answers
/// given whoever sent it, then the buyer's.
async fn admit(f: &Fixture, sale: &str, headers: &HeaderMap) -> Result<Admitted, Rejection> {
    f.service.answer_early(sale, PEER, headers)?;
    let own_origin = crate::admission::OwnOrigin {
        tls: false,
        host: None,
    };
    f.service.admit(sale, headers, own_origin).await
}

/// A buy through both halves of its admission, the first refusal its answer.
async fn admit_and_prove(f: &Fixture, sale: &str, headers: &HeaderMap) -> Result<(), Rejection> {
    let admitted = admit(f, sale, headers).await?;
    f.service.prove(sale, &admitted, PEER, headers).await
}

#[tokio::test]
async fn a_buy_before_the_start_is_answered_before_its_token_once_the_sale_is_held() {
    let f = fixture(&[]).await;
    let now = f.clock.now_ms();
    f.sale("soon", 5, now + 30_000, now + 60_000).await;
    // Nothing held yet: the token is checked first.
    assert!(matches!(
        admit(&f, "soon", &headers(None, Some("k0"))).await,
        Err(Rejection::Unauthorized(_))
    ));
    // One buy reads the window, and, keyed, that the sale never sold.
    let signed_in = headers(Some("a"), Some("k1"));
    assert_eq!(
        admit_and_prove(&f, "soon", &signed_in).await,
        Err(Rejection::NotStarted(30))
    );
    // Now "not started" says nothing about the buyer and is answered first,
    // keyed or not, token or none.
    for key in [None, Some("k2")] {
        assert_eq!(
            admit(&f, "soon", &headers(None, key)).await.err(),
            Some(Rejection::NotStarted(30))
        );
    }
    // A sale that has sold holds wins to replay: once the read that it
    // never sold is past, a keyed buy is no longer answered from memory
    // (its token is checked, its key asked for).
    let mut conn = f.redis.conn().await;
    let () = redis::cmd("HSET")
        .arg(SaleKeys::new("soon").reservations)
        .arg("r1")
        .arg("a")
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(crate::sales::BUYERS_TTL + Duration::from_millis(100)).await;
    assert!(matches!(
        admit_and_prove(&f, "soon", &headers(None, Some("k3"))).await,
        Err(Rejection::Unauthorized(_))
    ));
    // Once open, a buy without a token is refused for that again.
    f.clock.advance(Duration::from_secs(30));
    assert!(matches!(
        admit(&f, "soon", &headers(None, None)).await,
        Err(Rejection::Unauthorized(_))
    ));
}

#[tokio::test]
async fn a_sale_synced_on_another_redis_is_fenced_sells_nothing_and_remembers_nothing() {
    let f = fixture(&[]).await;
    f.open_sale("s", 5).await;
    let keys = SaleKeys::new("s");
    let mut conn = f.redis.conn().await;
    assert!(matches!(
        f.buy("s", "a", "k1").await,
        BuyOutcome::Won { .. }
    ));
    // As after a failover: the sale was made to agree with the database on
    // a Redis whose replication id this one does not have.
    let () = redis::cmd("SET")
        .arg(&keys.synced)
        .arg("0123456789abcdef")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        f.buy("s", "b", "k2").await,
        BuyOutcome::Refused(Rejection::Unavailable)
    );
    assert_eq!(f.service.metrics.fenced_buys.get(), 1);
    // A win recorded before the fence is still answered from its key.
    assert!(matches!(
        f.buy("s", "a", "k1").await,
        BuyOutcome::Replayed { .. }
    ));
    let remaining: i64 = redis::cmd("GET")
        .arg(&keys.remaining)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(remaining, 4, "nothing sold while fenced");
    let remembered: bool = redis::cmd("EXISTS")
        .arg(keys.idempotency_misses("b"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!remembered, "the fenced answer is not an outcome to replay");
    assert!(!f.service.sales.is_sold_out("s"));
    // Without the key at all (a sale written by an older release) it is fenced too.
    let () = redis::cmd("DEL")
        .arg(&keys.synced)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        f.buy("s", "b", "k2").await,
        BuyOutcome::Refused(Rejection::Unavailable)
    );
}

#[tokio::test]
async fn a_refill_confirmed_dry_before_a_bucket_was_stocked_does_not_flag_the_sale_sold_out() {
    let f = fixture(&[]).await;
    let sales = &f.service.sales;
    // Taken before the confirmation; a `stocked` event arrives meanwhile.
    let clears = sales.clears("s");
    sales.bucket_stocked("s", 1);
    f.service.confirmed_dry("s", clears);
    assert!(
        !sales.is_sold_out("s"),
        "stock came back after the confirmation read it"
    );
    // Nothing stocked between the snapshot and the confirmation: flagged.
    let clears = sales.clears("s");
    f.service.confirmed_dry("s", clears);
    assert!(sales.is_sold_out("s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_buys_of_one_sale_share_script_calls_and_exactly_the_stock_wins() {
    let f = fixture(&[]).await;
    f.open_sale("s", 50).await;
    // The sale's window cached: every buy below goes straight to the deduct.
    let BuyOutcome::Won {
        reservation_id: first,
        ..
    } = f.buy("s", "first", "").await
    else {
        panic!("no win")
    };
    let buyers: Vec<(String, String)> = (0..400)
        .map(|i| {
            (
                format!("u{i}"),
                if i % 2 == 0 {
                    format!("k{i}")
                } else {
                    String::new()
                },
            )
        })
        .collect();
    let outcomes =
        futures_util::future::join_all(buyers.iter().map(|(user, key)| f.buy("s", user, key)))
            .await;
    let mut won: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match o {
            BuyOutcome::Won { reservation_id, .. } => Some(reservation_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(won.len(), 49, "exactly the stock wins");
    assert!(
        outcomes.iter().all(|o| matches!(
            o,
            BuyOutcome::Won { .. } | BuyOutcome::Refused(Rejection::SoldOut)
        )),
        "{outcomes:?}"
    );
    won.push(first);
    won.sort();
    won.dedup();
    assert_eq!(won.len(), 50, "every winner has a reservation of its own");

    let keys = SaleKeys::new("s");
    let mut conn = f.redis.conn().await;
    let records: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&keys.stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut recorded: Vec<String> = records
        .into_iter()
        .map(|(_, fields)| {
            assert_eq!(
                fields.keys().collect::<Vec<_>>(),
                ["r"],
                "a record is one field"
            );
            let r = Reservation::from_fields(|name| fields.get(name).map(String::as_str));
            r.unwrap().reservation_id
        })
        .collect();
    recorded.sort();
    assert_eq!(recorded, won, "one stream record per winner");
    let remaining: i64 = redis::cmd("GET")
        .arg(&keys.remaining)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(remaining, 0);

    let sizes = &f.service.metrics.deduct_batch_size;
    assert!(
        sizes.get_sample_sum() as u64 >= 50,
        "every win was decided by a script call"
    );
    assert!(
        sizes.get_sample_sum() > sizes.get_sample_count() as f64,
        "no script call decided more than one attempt: {} attempts in {} calls",
        sizes.get_sample_sum(),
        sizes.get_sample_count()
    );
    assert_eq!(
        f.redis.command_calls("evalsha").await,
        sizes.get_sample_count(),
        "one EVALSHA per batch"
    );
}

/// Gives an item of `user`'s back to a one-bucket sale in Redis, as the
/// backend's return does (`lua/release.lua`), without telling this gateway.
async fn return_item_unannounced(f: &Fixture, sale_id: &str, reservation_id: &str, user: &str) {
    let keys = SaleKeys::new(sale_id);
    let script = &flashgate_common::scripts::RELEASE;
    let returned: i64 = script
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(&keys.reservations)
        .key(&keys.released)
        .arg(reservation_id)
        .arg(user)
        .invoke_async(&mut f.redis.conn().await)
        .await
        .unwrap();
    assert_eq!(returned, 1);
}

#[tokio::test]
async fn a_winners_keyed_retry_on_a_gateway_that_missed_the_restock_replays_the_win_within_the_buyers_ttl(
) {
    let f = fixture(&[]).await;
    let reservation_id = f.sell_out_one("s", "kb").await;
    assert_eq!(
        f.buy("s", "c", "kc").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    // The item comes back and this gateway misses the news; another
    // gateway's buyer wins it with key `kz`, but never hears the 202.
    return_item_unannounced(&f, "s", &reservation_id, "a").await;
    let other = BuyAttempt {
        sale_id: "s",
        user_id: "z",
        idempotency_key: "kz",
        reservation_id: "s.z-1",
        call_nonce: "n",
        idempotency_ttl_seconds: 600,
        draw_window_ms: 0,
        buckets: 1,
        dry_is_final: false,
    };
    let won = f.service.deducts.deduct(&other).await.unwrap();
    assert!(matches!(won.outcome, DeductOutcome::Won { .. }), "{won:?}");
    // Z's retry lands here, where the sale is still flagged sold out and
    // its buyers were read before z won: answered sold out until that read
    // is `BUYERS_TTL` old, then sent to the script, which replays the win.
    assert!(f.service.sales.is_sold_out("s"));
    assert_eq!(
        f.buy("s", "z", "kz").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    tokio::time::sleep(crate::sales::BUYERS_TTL).await;
    let retry = f.buy("s", "z", "kz").await;
    assert!(
        matches!(&retry, BuyOutcome::Replayed { reservation_id, .. } if reservation_id == "s.z-1"),
        "{retry:?}"
    );
}

#[tokio::test]
async fn a_keyed_buy_answered_by_the_flag_is_not_final_for_its_key() {
    let f = fixture(&[]).await;
    let reservation_id = f.sell_out_one("s", "").await;
    assert!(f.service.sales.is_sold_out("s"));
    // Answered by the flag: the user never reserved, nothing to replay.
    assert_eq!(
        f.buy("s", "c", "kc").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    // The item comes back, and this gateway hears of it: the same key
    // buys it (the flag's answer was not remembered), once.
    return_item_unannounced(&f, "s", &reservation_id, "a").await;
    f.service.sales.forget("s", None).await;
    assert!(
        matches!(f.buy("s", "c", "kc").await, BuyOutcome::Won { .. }),
        "the key's first decision by Redis"
    );
    assert!(
        matches!(f.buy("s", "c", "kc").await, BuyOutcome::Replayed { .. }),
        "and its answer from then on"
    );
}

#[tokio::test]
async fn the_buyers_of_a_sale_still_sold_out_at_the_same_epoch_are_renewed_not_read_again() {
    let f = fixture(&[]).await;
    f.sell_out_one("s", "kb").await;
    tokio::time::sleep(crate::sales::BUYERS_TTL).await;
    // Past the TTL a keyed buy asks the script, which finds the sale sold
    // out at the epoch the buyers were read at: they are renewed as read.
    let monitor = f.redis.monitor().await;
    assert_eq!(
        f.buy("s", "c", "kc").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    let sent = monitor.commands().await;
    assert!(sent.iter().any(|c| c.contains("EVALSHA")), "{sent:?}");
    assert!(
        !sent.iter().any(|c| c.contains("HVALS")),
        "read again: {sent:?}"
    );
    let monitor = f.redis.monitor().await;
    assert_eq!(
        f.buy("s", "d", "kd").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(monitor.commands().await, Vec::<String>::new());
}

#[tokio::test]
async fn a_sales_buyers_are_read_at_most_once_per_interval_whatever_comes_back() {
    let f = fixture(&[]).await;
    let reservation_id = f.sell_out_one("s", "kb").await;
    // An item comes back and is won again: the sale sells out at a new
    // epoch, within the interval of the first read.
    return_item_unannounced(&f, "s", &reservation_id, "a").await;
    f.service.sales.forget("s", None).await;
    assert!(matches!(
        f.buy("s", "c", "kc").await,
        BuyOutcome::Won { .. }
    ));
    let monitor = f.redis.monitor().await;
    assert_eq!(
        f.buy("s", "d", "kd").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    assert_eq!(
        f.buy("s", "e", "ke").await,
        BuyOutcome::Refused(Rejection::SoldOut)
    );
    let sent = monitor.commands().await;
    assert!(
        !sent.iter().any(|c| c.contains("HVALS")),
        "read again: {sent:?}"
    );
    assert_eq!(
        sent.iter().filter(|c| c.contains("EVALSHA")).count(),
        2,
        "until the next read, keyed buys go to the script: {sent:?}"
    );
}
