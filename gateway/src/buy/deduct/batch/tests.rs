//! `lua/deduct_batch.lua` against real redis-servers: a batch of attempts
//! gives the same outcomes and leaves the same Redis state as the same
//! attempts sent one by one (one attempt per call), in the same order, on
//! a second server set up alike. Reservation ids and nonces are the test's,
//! so both servers write the same records; only clocks and replication
//! ids differ, and are compared by shape.

use std::collections::BTreeMap;
use std::time::Duration;

use flashgate_common::keys::SaleKeys;
use flashgate_common::now_ms;
use flashgate_common::reservation::Reservation;
use redis::aio::MultiplexedConnection;

use super::{
    DeductBatcher, OwnedAttempt, Queue, Waiter, IN_FLIGHT_PER_SALE, MAX_BATCH, MAX_QUEUED,
};
use crate::buy::deduct::{deduct_many, BuyAttempt, Decision, DeductOutcome};
use crate::infra::Breaker;
use crate::infra::RedisServer;
use crate::infra::{RedisClient, RedisError};

/// One attempt: user, Idempotency-Key ("" for none), reservation id, nonce.
type Try = (&'static str, &'static str, &'static str, &'static str);

/// A sale's state in Meta, as the backend's preheat leaves it.
#[derive(Clone, Copy)]
struct Sale {
    stock: i64,
    per_user_limit: i64,
    starts_at_ms: i64,
    ends_at_ms: i64,
    paused: bool,
    /// Not agreeing with the database on this Redis (a promoted replica).
    fenced: bool,
    /// The sale's own opening draw window (0: none).
    draw_window_ms: i64,
}

impl Sale {
    fn open(stock: i64, per_user_limit: i64) -> Self {
        let now = now_ms();
        Self {
            stock,
            per_user_limit,
            starts_at_ms: now - 1000,
            ends_at_ms: now + 3_600_000,
            paused: false,
            fenced: false,
            draw_window_ms: 0,
        }
    }
}

/// A server, a client of it, and a plain connection for setup and reads.
struct Side {
    _server: RedisServer,
    client: RedisClient,
    conn: MultiplexedConnection,
}

impl Side {
    async fn new() -> Self {
        let server = RedisServer::private();
        let client = RedisClient::standalone(
            &server.url(),
            Duration::from_secs(2),
            Breaker::new(5, Duration::from_secs(1)),
        );
        let conn = server.conn().await;
        Self {
            _server: server,
            client,
            conn,
        }
    }

    async fn install(&mut self, id: &str, sale: Sale) {
        let keys = SaleKeys::new(id);
        let meta = [
            ("name", "Sneaker".to_owned()),
            ("stock", sale.stock.to_string()),
            ("per_user_limit", sale.per_user_limit.to_string()),
            ("starts_at_ms", sale.starts_at_ms.to_string()),
            ("ends_at_ms", sale.ends_at_ms.to_string()),
            ("paused", if sale.paused { "1" } else { "0" }.to_owned()),
            ("draw_window_ms", sale.draw_window_ms.to_string()),
        ];
        let synced = if sale.fenced {
            "another-master".to_owned()
        } else {
            self.replid().await
        };
        let () = redis::pipe()
            .hset_multiple(&keys.meta, &meta)
            .ignore()
            .set(&keys.remaining, sale.stock)
            .ignore()
            .set(&keys.synced, synced)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .unwrap();
    }

    async fn replid(&mut self) -> String {
        crate::infra::master_replid(&mut self.conn).await
    }

    /// Every key and its value, comparable across servers: a stream's
    /// records without their ids and times, a call key's win without its
    /// time, this server's replication id by name, and whether a key
    /// expires (not when).
    async fn state(&mut self) -> BTreeMap<String, String> {
        let replid = self.replid().await;
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let mut state = BTreeMap::new();
        for name in names {
            let kind: String = redis::cmd("TYPE")
                .arg(&name)
                .query_async(&mut self.conn)
                .await
                .unwrap();
            let value = match kind.as_str() {
                "string" => {
                    let v: String = redis::cmd("GET")
                        .arg(&name)
                        .query_async(&mut self.conn)
                        .await
                        .unwrap();
                    if name.contains(":call:") {
                        v.split('|').next().unwrap().to_owned()
                    } else if v == replid {
                        "<this server's replication id>".to_owned()
                    } else {
                        v
                    }
                }
                "hash" => {
                    let mut v: BTreeMap<String, String> = redis::cmd("HGETALL")
                        .arg(&name)
                        .query_async(&mut self.conn)
                        .await
                        .unwrap();
                    for (field, value) in &mut v {
                        // A draw's opening time and its entries' times are the server's clock.
                        if field == "opened_at_ms" {
                            *value = "<time>".to_owned();
                        } else if let Ok(serde_json::Value::Object(mut entry)) =
                            serde_json::from_str(value)
                        {
                            entry.remove("at");
                            *value = serde_json::Value::Object(entry).to_string();
                        }
                    }
                    format!("{v:?}")
                }
                "stream" => {
                    let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
                        .arg(&name)
                        .arg("-")
                        .arg("+")
                        .query_async(&mut self.conn)
                        .await
                        .unwrap();
                    // Each record without its time (the server's clock).
                    let records: Vec<Vec<(String, String)>> = v
                        .into_iter()
                        .map(|(_, fields)| {
                            let r = Reservation::from_fields(|name| {
                                fields
                                    .iter()
                                    .find(|(f, _)| f == name)
                                    .map(|(_, v)| v.as_str())
                            })
                            .unwrap();
                            vec![
                                ("rid".into(), r.reservation_id),
                                ("sale".into(), r.sale_id),
                                ("user".into(), r.user_id),
                                ("idem".into(), r.idempotency_key),
                            ]
                        })
                        .collect();
                    format!("{records:?}")
                }
                other => panic!("unexpected type {other} of {name}"),
            };
            let ttl: i64 = redis::cmd("TTL")
                .arg(&name)
                .query_async(&mut self.conn)
                .await
                .unwrap();
            state.insert(name, format!("{value} expires={}", ttl > 0));
        }
        state
    }
}

/// `attempt` alone in its script call: its own decision or error, and the
/// call's error.
async fn alone(client: &RedisClient, attempt: &BuyAttempt<'_>) -> Result<Decision, RedisError> {
    let mut decisions = deduct_many(client, std::slice::from_ref(attempt)).await?;
    assert_eq!(decisions.len(), 1, "one decision per attempt");
    decisions.remove(0)
}

fn attempt<'a>(sale_id: &'a str, t: &'a Try) -> BuyAttempt<'a> {
    attempt_in(sale_id, 1, t)
}

/// An attempt in sale `sale_id` of `buckets` buckets.
fn attempt_in<'a>(sale_id: &'a str, buckets: u32, t: &'a Try) -> BuyAttempt<'a> {
    let (user_id, idempotency_key, reservation_id, call_nonce) = *t;
    BuyAttempt {
        sale_id,
        user_id,
        idempotency_key,
        reservation_id,
        call_nonce,
        idempotency_ttl_seconds: 600,
        draw_window_ms: 0,
        buckets,
        dry_is_final: false,
    }
}

/// A decision with the server's own clock and replication id reduced to
/// whether they were there; an error to "error".
fn comparable(d: Result<Decision, crate::infra::RedisError>) -> String {
    match d {
        Ok(Decision {
            outcome:
                DeductOutcome::Won {
                    reservation_id,
                    reserved_at_ms,
                },
            replayed,
            node,
            ..
        }) => {
            format!(
                "won {reservation_id} at={} replayed={replayed} node={}",
                reserved_at_ms.is_some(),
                node.is_some()
            )
        }
        // How long the draw stays open is the server's clock.
        Ok(Decision {
            outcome: DeductOutcome::Entered { entry, .. },
            replayed,
            node,
            ..
        }) => {
            format!(
                "Entered {entry} replayed={replayed} node={}",
                node.is_some()
            )
        }
        Ok(d) => format!(
            "{:?} replayed={} node={}",
            d.outcome,
            d.replayed,
            d.node.is_some()
        ),
        Err(_) => "error".to_owned(),
    }
}

/// Runs `batches` of attempts on sale `id`: one by one on a server, in
/// batches on another, both set up by `setup`; asserts the same outcomes
/// and the same state; returns the outcomes, one list per batch.
async fn same_as_one_by_one(
    id: &str,
    sale: Sale,
    setup: &[(&str, &str)],
    batches: &[&[Try]],
) -> Vec<Vec<String>> {
    same_as_one_by_one_in(id, 1, id, sale, setup, batches).await
}

/// As [`same_as_one_by_one`], in sale `id` of `buckets` buckets whose
/// attempts buy in the one installed as `installed` (the sale, or the
/// attempts' home bucket).
async fn same_as_one_by_one_in(
    id: &str,
    buckets: u32,
    installed: &str,
    sale: Sale,
    setup: &[(&str, &str)],
    batches: &[&[Try]],
) -> Vec<Vec<String>> {
    let (mut single, mut batched) = (Side::new().await, Side::new().await);
    for side in [&mut single, &mut batched] {
        side.install(installed, sale).await;
        for (key, value) in setup {
            let () = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query_async(&mut side.conn)
                .await
                .unwrap();
        }
    }
    let mut outcomes = Vec::new();
    for batch in batches {
        let mut one_by_one = Vec::new();
        for t in *batch {
            one_by_one.push(comparable(
                alone(&single.client, &attempt_in(id, buckets, t)).await,
            ));
        }
        let attempts: Vec<BuyAttempt<'_>> =
            batch.iter().map(|t| attempt_in(id, buckets, t)).collect();
        let together: Vec<String> = deduct_many(&batched.client, &attempts)
            .await
            .unwrap()
            .into_iter()
            .map(comparable)
            .collect();
        assert_eq!(together, one_by_one, "outcomes of {batch:?}");
        outcomes.push(together);
    }
    assert_eq!(
        batched.state().await,
        single.state().await,
        "redis state after {batches:?}"
    );
    outcomes
}

#[tokio::test]
async fn stock_running_out_mid_batch_leaves_the_later_attempts_sold_out() {
    let out = same_as_one_by_one(
        "s",
        Sale::open(3, 1),
        &[],
        &[&[
            ("a", "", "r1", "n1"),
            ("b", "", "r2", "n2"),
            ("c", "ka", "r3", ""),
            ("d", "", "r4", "n4"),
            ("e", "ke", "r5", ""),
        ]],
    )
    .await;
    let won = out[0].iter().filter(|o| o.starts_with("won")).count();
    assert_eq!(won, 3);
    assert_eq!(out[0][3], "SoldOut replayed=false node=false");
    assert_eq!(out[0][4], "SoldOut replayed=false node=false");
}

#[tokio::test]
async fn the_per_user_limit_holds_within_a_batch() {
    let out = same_as_one_by_one(
        "s",
        Sale::open(10, 1),
        &[],
        &[&[
            ("a", "", "r1", "n1"),
            ("a", "", "r2", "n2"),
            ("a", "k3", "r3", ""),
        ]],
    )
    .await;
    assert!(out[0][0].starts_with("won r1"));
    assert_eq!(
        &out[0][1..],
        [
            "LimitReached replayed=false node=false",
            "LimitReached replayed=false node=false"
        ]
    );
}

#[tokio::test]
async fn a_key_twice_in_a_batch_replays_the_first_outcome_and_across_batches_too() {
    let out = same_as_one_by_one(
        "s",
        Sale::open(1, 1),
        &[],
        &[
            &[
                ("a", "k1", "r1", ""),
                ("a", "k1", "r2", ""),
                ("b", "k2", "r3", ""),
                ("b", "k2", "r4", ""),
            ],
            &[("a", "k1", "r5", ""), ("b", "k2", "r6", "")],
        ],
    )
    .await;
    assert_eq!(out[0][0], "won r1 at=true replayed=false node=true");
    assert_eq!(
        out[0][1], "won r1 at=false replayed=true node=true",
        "the same key: the first's win, nothing taken"
    );
    assert_eq!(out[0][2], "SoldOut replayed=false node=false");
    assert_eq!(out[0][3], "SoldOut replayed=true node=false");
    assert_eq!(
        out[1],
        [
            "won r1 at=false replayed=true node=true",
            "SoldOut replayed=true node=false"
        ]
    );
}

#[tokio::test]
async fn a_resent_nonce_answers_its_first_win_within_and_across_batches() {
    let out = same_as_one_by_one(
        "s",
        Sale::open(5, 2),
        &[],
        &[
            &[("a", "", "r1", "n1"), ("a", "", "r1", "n1")],
            &[("a", "", "r1", "n1"), ("a", "", "r2", "n2")],
        ],
    )
    .await;
    assert_eq!(
        out[0],
        [
            "won r1 at=true replayed=false node=true",
            "won r1 at=true replayed=false node=true"
        ]
    );
    assert_eq!(
        out[1],
        [
            "won r1 at=true replayed=false node=true",
            "won r2 at=true replayed=false node=true"
        ],
        "one item per call"
    );
}

#[tokio::test]
async fn a_keyless_call_sent_again_answers_its_first_win_time_included_and_takes_one_item() {
    let mut side = Side::new().await;
    side.install("again", Sale::open(10, 5)).await;
    // What the cluster client does with a call whose connection dropped
    // after Redis ran it: the same call (its nonce), sent again.
    let (first, resent, other): (Try, Try, Try) = (
        ("bob", "", "again.1", "n1"),
        ("bob", "", "again.2", "n1"),
        ("bob", "", "again.3", "n2"),
    );
    let won = alone(&side.client, &attempt("again", &first))
        .await
        .unwrap();
    let again = alone(&side.client, &attempt("again", &resent))
        .await
        .unwrap();
    assert_eq!(again, won, "the same answer, time included");
    assert!(
        !again.replayed,
        "the buyer sent one request: a win, not a replay"
    );
    let stream_len = |mut conn: MultiplexedConnection| async move {
        let n: u64 = redis::cmd("XLEN")
            .arg(SaleKeys::new("again").stream)
            .query_async(&mut conn)
            .await
            .unwrap();
        n
    };
    assert_eq!(stream_len(side.conn.clone()).await, 1, "one item taken");
    // Another call of the same buyer is a new buy (limit 5).
    let new = alone(&side.client, &attempt("again", &other))
        .await
        .unwrap();
    assert!(
        matches!(new.outcome, DeductOutcome::Won { ref reservation_id, .. } if reservation_id == "again.3"),
        "{new:?}"
    );
    assert_eq!(stream_len(side.conn.clone()).await, 2);
}

#[tokio::test]
async fn a_closed_sale_answers_every_attempt_of_the_batch_alike() {
    let now = now_ms();
    let attempts: &[Try] = &[
        ("a", "k", "r1", ""),
        ("b", "", "r2", "n2"),
        ("a", "k", "r3", ""),
    ];
    let paused = same_as_one_by_one(
        "s",
        Sale {
            paused: true,
            ..Sale::open(5, 1)
        },
        &[],
        &[attempts],
    )
    .await;
    assert!(
        paused[0]
            .iter()
            .all(|o| o == "Paused replayed=false node=false"),
        "{paused:?}"
    );
    let ended = same_as_one_by_one(
        "s",
        Sale {
            ends_at_ms: now - 1,
            ..Sale::open(5, 1)
        },
        &[],
        &[attempts],
    )
    .await;
    assert_eq!(
        ended[0][2], "Ended replayed=true node=false",
        "an ended sale is final: remembered under the key"
    );
    let later = same_as_one_by_one(
        "s",
        Sale {
            starts_at_ms: now + 60_000,
            ..Sale::open(5, 1)
        },
        &[],
        &[attempts],
    )
    .await;
    assert!(
        later[0]
            .iter()
            .all(|o| o.starts_with("NotStarted") && o.ends_with("replayed=false node=false")),
        "{later:?}"
    );
    let fenced = same_as_one_by_one(
        "s",
        Sale {
            fenced: true,
            ..Sale::open(5, 1)
        },
        &[],
        &[attempts],
    )
    .await;
    assert!(
        fenced[0]
            .iter()
            .all(|o| o == "Fenced replayed=false node=false"),
        "{fenced:?}"
    );
}

#[tokio::test]
async fn a_draw_window_enters_joins_and_caps_entries_within_a_batch_as_one_by_one() {
    let sale = Sale {
        draw_window_ms: 60_000,
        ..Sale::open(3, 1)
    };
    let out = same_as_one_by_one(
        "s",
        sale,
        &[],
        &[
            &[
                ("a", "ka", "r1", ""),
                // The same key: joins the entry the draw already holds.
                ("a", "ka", "r2", ""),
                // Another key of the same user: past the per-user entry cap.
                ("a", "kb", "r3", ""),
                ("b", "", "r4", "n4"),
                // The same call re-sent: its entry again, not a replay.
                ("b", "", "r4", "n4"),
            ],
            &[("c", "kc", "r5", ""), ("a", "ka", "r6", "")],
        ],
    )
    .await;
    assert_eq!(
        out[0],
        [
            "Entered 1 replayed=false node=false",
            "Entered 1 replayed=true node=false",
            "LimitReached replayed=false node=false",
            "Entered 2 replayed=false node=false",
            "Entered 2 replayed=false node=false",
        ]
    );
    assert_eq!(
        out[1],
        [
            "Entered 3 replayed=false node=false",
            "Entered 1 replayed=true node=false"
        ]
    );
}

#[tokio::test]
async fn a_buckets_sold_out_is_not_remembered_under_the_key_in_a_batch_either() {
    // Three users with the same home bucket of two: one batch.
    let buckets = 2;
    let home = flashgate_common::buckets::home_bucket("u0", buckets);
    let users: Vec<String> = (0..)
        .map(|i| format!("u{i}"))
        .filter(|u| flashgate_common::buckets::home_bucket(u, buckets) == home)
        .take(3)
        .collect();
    let users: Vec<&'static str> = users
        .into_iter()
        .map(|u| &*Box::leak(u.into_boxed_str()))
        .collect();
    let bucket = flashgate_common::buckets::bucket_id("s", home);
    let out = same_as_one_by_one_in(
        "s",
        buckets,
        &bucket,
        Sale::open(1, 1),
        &[],
        &[&[
            (users[0], "k0", "r1", ""),
            (users[1], "k1", "r2", ""),
            (users[1], "k1", "r3", ""),
            (users[2], "", "r4", "n4"),
        ]],
    )
    .await;
    assert!(out[0][0].starts_with("won r1"), "{out:?}");
    // Other buckets may still have stock: the key's retry asks again.
    assert_eq!(
        out[0][1..],
        ["SoldOut replayed=false node=false"; 3],
        "{out:?}"
    );
}

#[tokio::test]
async fn an_attempt_that_errors_is_only_that_attempts_error() {
    // The user "x"'s misses hash is a string: reading it fails (WRONGTYPE).
    let misses = SaleKeys::new("s").idempotency_misses("x");
    let out = same_as_one_by_one(
        "s",
        Sale::open(5, 1),
        &[(misses.as_str(), "not a hash")],
        &[&[
            ("a", "", "r1", "n1"),
            ("x", "kx", "r2", ""),
            ("b", "kb", "r3", ""),
        ]],
    )
    .await;
    assert!(out[0][0].starts_with("won r1"));
    assert_eq!(out[0][1], "error");
    assert!(out[0][2].starts_with("won r3"), "{out:?}");

    // The batch's error names the attempt's.
    let side = Side::new().await;
    let mut side = side;
    side.install("s", Sale::open(5, 1)).await;
    let () = redis::cmd("SET")
        .arg(&misses)
        .arg("not a hash")
        .query_async(&mut side.conn)
        .await
        .unwrap();
    let t: Try = ("x", "kx", "r2", "");
    let replies = deduct_many(&side.client, &[attempt("s", &t)])
        .await
        .unwrap();
    let error = replies.into_iter().next().unwrap().unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
}

#[tokio::test]
async fn an_attempt_that_errors_after_taking_its_item_leaves_the_next_one_the_true_stock() {
    // The script follows the items left through a call's wins instead of
    // reading them per attempt. An attempt that fails after its item was
    // taken (an expiry of 0 seconds: the key's SET is refused after the
    // count, the record and the stream entry were written) must not leave
    // that count one item too high for the attempts after it.
    let mut side = Side::new().await;
    side.install("s", Sale::open(2, 1)).await;
    let (a, x, b): (Try, Try, Try) = (
        ("a", "ka", "r1", ""),
        ("x", "kx", "r2", ""),
        ("b", "kb", "r3", ""),
    );
    let mut attempts = vec![attempt("s", &a), attempt("s", &x), attempt("s", &b)];
    attempts[1].idempotency_ttl_seconds = 0;
    let out: Vec<String> = deduct_many(&side.client, &attempts)
        .await
        .unwrap()
        .into_iter()
        .map(comparable)
        .collect();
    assert!(out[0].starts_with("won r1"), "{out:?}");
    assert_eq!(out[1], "error", "{out:?}");
    assert_eq!(out[2], "SoldOut replayed=false node=false", "{out:?}");
    let remaining: i64 = redis::cmd("GET")
        .arg(SaleKeys::new("s").remaining)
        .query_async(&mut side.conn)
        .await
        .unwrap();
    assert_eq!(remaining, 0, "two items, two taken, none sold twice");
}

/// A batcher on `side`'s server whose calls time out after `timeout`, and a
/// breaker that stays closed (the test counts answers, not the breaker's).
fn batcher(side: &Side, timeout: Duration) -> std::sync::Arc<DeductBatcher> {
    let url = side._server.url();
    let redis = std::sync::Arc::new(RedisClient::standalone(
        &url,
        timeout,
        Breaker::new(100_000, Duration::from_secs(1)),
    ));
    let sizes = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new(
        "sizes",
        "attempts per call",
    ))
    .unwrap();
    std::sync::Arc::new(DeductBatcher::new(redis, sizes))
}

#[tokio::test]
async fn a_sale_with_a_full_queue_answers_more_buys_at_once_and_every_waiter_is_answered() {
    let mut side = Side::new().await;
    side.install("s", Sale::open(10_000, 1)).await;
    let batcher = batcher(&side, Duration::from_millis(1000));
    // Connected and the scripts loaded before Redis stalls.
    let t: Try = ("warm", "", "r0", "n0");
    assert!(matches!(
        batcher.deduct(&attempt("s", &t)).await.unwrap().outcome,
        DeductOutcome::Won { .. }
    ));
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("ALL")
        .query_async(&mut side.conn)
        .await
        .unwrap();

    // Two calls in flight, MAX_QUEUED waiting, then 3 more.
    let over = 3;
    let total = IN_FLIGHT_PER_SALE + MAX_QUEUED + over;
    let mut tasks = Vec::new();
    for i in 0..total {
        let batcher = std::sync::Arc::clone(&batcher);
        tasks.push(tokio::spawn(async move {
            let (user, rid, nonce) = (format!("u{i}"), format!("r{i}"), format!("n{i}"));
            let a = BuyAttempt {
                sale_id: "s",
                user_id: &user,
                idempotency_key: "",
                reservation_id: &rid,
                call_nonce: &nonce,
                idempotency_ttl_seconds: 600,
                draw_window_ms: 0,
                buckets: 1,
                dry_is_final: false,
            };
            batcher.deduct(&a).await
        }));
        // The first calls take their slots before the others queue.
        if i < IN_FLIGHT_PER_SALE {
            tokio::task::yield_now().await;
        }
    }
    let mut full = 0;
    for task in tasks {
        match task.await.unwrap() {
            Err(RedisError::QueueFull) => full += 1,
            // A timeout (the call's, the queue's, or the connection's).
            Err(e) if e.is_transient() => {}
            other => panic!("a stalled Redis answered {other:?}"),
        }
    }
    assert_eq!(
        full, over,
        "only the attempts past the cap are turned away at once"
    );
}

/// A waiter queued `ago` in the past, and the receiver of its answer.
fn waiter(
    ago: Duration,
) -> (
    Waiter,
    tokio::sync::oneshot::Receiver<Result<Decision, RedisError>>,
) {
    let (answer, rx) = tokio::sync::oneshot::channel();
    let attempt = OwnedAttempt {
        sale_id: "s".into(),
        user_id: "u".into(),
        idempotency_key: String::new(),
        reservation_id: "r".into(),
        call_nonce: "n".into(),
        idempotency_ttl_seconds: 600,
        draw_window_ms: 0,
        buckets: 1,
        dry_is_final: false,
    };
    (
        Waiter {
            attempt,
            enqueued: std::time::Instant::now() - ago,
            answer,
        },
        rx,
    )
}

#[test]
fn attempts_that_waited_past_the_call_timeout_are_answered_with_it_not_sent() {
    let mut queue = Queue::default();
    let (old, mut old_rx) = waiter(Duration::from_secs(2));
    let (fresh, mut fresh_rx) = waiter(Duration::ZERO);
    queue.waiting.extend([old, fresh]);
    let batch = queue.next_batch(Duration::from_secs(1));
    assert_eq!(batch.len(), 1, "only the fresh attempt goes in the call");
    assert!(matches!(old_rx.try_recv(), Ok(Err(RedisError::Timeout(_)))));
    assert!(
        fresh_rx.try_recv().is_err(),
        "the fresh one waits for its call's answer"
    );
    assert!(queue.waiting.is_empty());
}

#[test]
fn a_batch_takes_at_most_max_batch_attempts() {
    let mut queue = Queue::default();
    let receivers: Vec<_> = (0..MAX_BATCH + 5)
        .map(|_| {
            let (w, rx) = waiter(Duration::ZERO);
            queue.waiting.push_back(w);
            rx
        })
        .collect();
    assert_eq!(queue.next_batch(Duration::from_secs(1)).len(), MAX_BATCH);
    assert_eq!(queue.waiting.len(), 5);
    drop(receivers);
}

/// `side`'s deduct of one attempt and of a batch of two, each as the client
/// sees it: the call's error, if any.
async fn call_errors(side: &Side) -> (redis::RedisError, redis::RedisError) {
    let (a, b): (Try, Try) = (("a", "ka", "r1", ""), ("b", "", "r2", "n2"));
    let one = alone(&side.client, &attempt("s", &a)).await.unwrap_err();
    let many = deduct_many(&side.client, &[attempt("s", &a), attempt("s", &b)])
        .await
        .unwrap_err();
    let unwrap = |e: RedisError| match e {
        RedisError::Redis(e) => e,
        other => panic!("expected the server's error, got {other}"),
    };
    (unwrap(one), unwrap(many))
}

#[tokio::test]
async fn a_node_that_cannot_take_writes_fails_the_whole_batch_as_it_fails_one_call() {
    // Too few replicas: every write is refused (NOREPLICAS).
    let mut side = Side::new().await;
    side.install("s", Sale::open(5, 1)).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg(1)
        .query_async(&mut side.conn)
        .await
        .unwrap();
    let (one, many) = call_errors(&side).await;
    assert_eq!(one.code(), Some("NOREPLICAS"), "{one}");
    assert_eq!(
        many.code(),
        one.code(),
        "the batch's error is the call's, as one attempt's: {many}"
    );
    let remaining: i64 = redis::cmd("GET")
        .arg(SaleKeys::new("s").remaining)
        .query_async(&mut side.conn)
        .await
        .unwrap();
    assert_eq!(remaining, 5);

    // A replica (here of a master it cannot reach): READONLY, a failover's
    // sign, which a Sentinel client answers by looking the primary up again.
    let mut side = Side::new().await;
    side.install("s", Sale::open(5, 1)).await;
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query_async(&mut side.conn)
        .await
        .unwrap();
    // (It keeps its replication id until it syncs: the sale is not fenced.)
    let (one, many) = call_errors(&side).await;
    assert_eq!(
        one.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
        "{one}"
    );
    assert_eq!(many.kind(), one.kind(), "{many}");
    assert!(
        RedisError::Redis(many).is_transient(),
        "a failover's error is worth a retry"
    );
}
