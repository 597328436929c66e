//! The outbox on every database, and the deliverer against a real HTTP
//! receiver on loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashgate_common::config::{AmqpConfig, EventsConfig, WebhookConfig};
use serde_json::Value;

use super::*;
use crate::store::outbox::EventType;
use crate::store::Payment;
use crate::testing::{isolated_stores as stores, reservation, unique};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn payload(event: &OutboxEvent) -> Value {
    serde_json::from_str(&event.payload).unwrap()
}

#[tokio::test]
async fn every_order_change_writes_its_event_with_the_change() {
    for (db, store) in stores().await {
        let store = store.clone().with_order_events(true);
        let sale_id = unique("s");
        let (a, b) = (reservation(&sale_id, "alice"), reservation(&sale_id, "bob"));
        assert_eq!(
            store
                .orders()
                .insert(&[a.clone(), b.clone()])
                .await
                .unwrap(),
            2,
            "{db}"
        );
        assert_eq!(
            store
                .orders()
                .insert(&[a.clone(), b.clone()])
                .await
                .unwrap(),
            0,
            "{db}: a replay makes no order and no event"
        );
        let order_a = store
            .orders()
            .by_reservation(&a.reservation_id)
            .await
            .unwrap()
            .unwrap();
        let order_b = store
            .orders()
            .by_reservation(&b.reservation_id)
            .await
            .unwrap()
            .unwrap();

        assert!(
            matches!(
                store.orders().pay(&order_a.order_id).await.unwrap(),
                Payment::Paid(_)
            ),
            "{db}"
        );
        assert!(
            matches!(
                store.orders().pay(&order_a.order_id).await.unwrap(),
                Payment::Paid(_)
            ),
            "{db}"
        );
        assert!(
            store
                .orders()
                .cancel_if_unpaid(&order_b.order_id)
                .await
                .unwrap(),
            "{db}"
        );
        assert!(
            !store
                .orders()
                .cancel_if_unpaid(&order_b.order_id)
                .await
                .unwrap(),
            "{db}"
        );
        assert!(
            matches!(
                store.orders().pay(&order_b.order_id).await.unwrap(),
                Payment::Cancelled(_)
            ),
            "{db}"
        );
        let cancelled_only: Vec<_> = store
            .outbox()
            .of_order(&order_b.order_id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            cancelled_only,
            vec![EventType::Created],
            "{db}: no `cancelled` before the item is back"
        );
        store
            .orders()
            .mark_released(&order_b.order_id, flashgate_common::now_ms())
            .await
            .unwrap();
        store
            .orders()
            .mark_released(&order_b.order_id, flashgate_common::now_ms())
            .await
            .unwrap();

        let events_a = store.outbox().of_order(&order_a.order_id).await.unwrap();
        let kinds: Vec<_> = events_a.iter().map(|e| (e.seq, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![(1, EventType::Created), (2, EventType::Paid)],
            "{db}: one event per change, in order"
        );
        let created = payload(&events_a[0]);
        assert_eq!(created["id"], events_a[0].event_id.as_str(), "{db}");
        assert_eq!(created["type"], "order.created", "{db}");
        assert_eq!(
            created["order"]["order_id"],
            order_a.order_id.as_str(),
            "{db}"
        );
        assert_eq!(
            created["order"]["reservation_id"],
            a.reservation_id.as_str(),
            "{db}"
        );
        assert_eq!(created["order"]["user_id"], "alice", "{db}");
        assert_eq!(created["order"]["sale_id"], sale_id.as_str(), "{db}");
        assert_eq!(payload(&events_a[1])["order"]["status"], "paid", "{db}");

        let events_b = store.outbox().of_order(&order_b.order_id).await.unwrap();
        let kinds: Vec<_> = events_b.iter().map(|e| (e.seq, e.kind)).collect();
        assert_eq!(
            kinds,
            vec![(1, EventType::Created), (2, EventType::Cancelled)],
            "{db}"
        );
        let cancelled = payload(&events_b[1]);
        assert_eq!(
            (
                cancelled["type"].as_str(),
                cancelled["item_returned"].as_bool()
            ),
            (Some("order.cancelled"), Some(true)),
            "{db}"
        );
        assert_eq!(payload(&events_b[0])["item_returned"], false, "{db}");
    }
}

#[tokio::test]
async fn the_held_order_write_writes_created_events_in_its_transaction() {
    for (db, store) in stores().await {
        let store = store.clone().with_order_events(true);
        let sale_id = unique("s");
        store
            .sales()
            .upsert(&crate::testing::sale(&sale_id, 5))
            .await
            .unwrap();
        let r = reservation(&sale_id, "carol");
        let mut write = store.locks().begin_order_write(&[&sale_id]).await.unwrap();
        assert_eq!(
            write.insert(std::slice::from_ref(&r)).await.unwrap().len(),
            1,
            "{db}"
        );
        drop(write);
        assert_eq!(
            store.outbox().stats().await.unwrap().pending,
            0,
            "{db}: rolled back with the order"
        );
        let mut write = store.locks().begin_order_write(&[&sale_id]).await.unwrap();
        write.insert(std::slice::from_ref(&r)).await.unwrap();
        write.commit().await.unwrap();
        let order = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            store
                .outbox()
                .of_order(&order.order_id)
                .await
                .unwrap()
                .len(),
            1,
            "{db}"
        );
        assert_eq!(store.outbox().stats().await.unwrap().pending, 1, "{db}");
    }
}

#[tokio::test]
async fn without_a_destination_no_event_is_written() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let r = reservation(&sale_id, "dave");
        store
            .orders()
            .insert(std::slice::from_ref(&r))
            .await
            .unwrap();
        let order = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        store.orders().pay(&order.order_id).await.unwrap();
        assert!(
            store
                .outbox()
                .of_order(&order.order_id)
                .await
                .unwrap()
                .is_empty(),
            "{db}"
        );
    }
}

#[tokio::test]
async fn claims_hand_out_the_first_event_of_each_order_once() {
    for (db, store) in stores().await {
        let store = store.clone().with_order_events(true);
        let sale_id = unique("s");
        let (a, b) = (reservation(&sale_id, "a"), reservation(&sale_id, "b"));
        store
            .orders()
            .insert(&[a.clone(), b.clone()])
            .await
            .unwrap();
        let order_a = store
            .orders()
            .by_reservation(&a.reservation_id)
            .await
            .unwrap()
            .unwrap();
        store.orders().pay(&order_a.order_id).await.unwrap();
        let now = flashgate_common::now_ms();

        let first = store.outbox().claim("one", now, 60_000, 100).await.unwrap();
        let kinds: Vec<_> = first.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![EventType::Created, EventType::Created],
            "{db}: never `paid` before `created` is delivered"
        );
        assert!(
            store
                .outbox()
                .claim("two", now, 60_000, 100)
                .await
                .unwrap()
                .is_empty(),
            "{db}: leased"
        );

        let of_a = first
            .iter()
            .find(|e| e.order_id == order_a.order_id)
            .unwrap();
        store.outbox().delivered(&of_a.event_id).await.unwrap();
        let next = store
            .outbox()
            .claim("three", now, 60_000, 100)
            .await
            .unwrap();
        assert_eq!(
            next.iter()
                .map(|e| (e.order_id.as_str(), e.kind))
                .collect::<Vec<_>>(),
            vec![(order_a.order_id.as_str(), EventType::Paid)],
            "{db}"
        );

        // A lease that passed is free again: its event goes out again, same id.
        let later = now + 61_000;
        let again = store
            .outbox()
            .claim("four", later, 60_000, 100)
            .await
            .unwrap();
        let mut ids: Vec<_> = again.iter().map(|e| e.event_id.clone()).collect();
        ids.sort();
        let mut expected: Vec<_> = first
            .iter()
            .filter(|e| e.order_id != order_a.order_id)
            .chain(&next)
            .map(|e| e.event_id.clone())
            .collect();
        expected.sort();
        assert_eq!(ids, expected, "{db}");
    }
}

#[tokio::test]
async fn concurrent_claims_never_share_an_event() {
    for (db, store) in stores().await {
        let store = store.clone().with_order_events(true);
        let sale_id = unique("s");
        let batch: Vec<_> = (0..60)
            .map(|i| reservation(&sale_id, &format!("u{i}")))
            .collect();
        let batch_len = batch.len();
        store.orders().insert(&batch).await.unwrap();
        let now = flashgate_common::now_ms();
        // Each claimer goes on until the four together hold as many claims
        // as there are events (an empty claim may only mean another holds
        // the rows' locks), or the deadline passes.
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let claims: Vec<_> = (0..4)
            .map(|i| {
                let (store, taken) = (store.clone(), taken.clone());
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut round = 0;
                    while taken.load(std::sync::atomic::Ordering::SeqCst) < batch_len
                        && tokio::time::Instant::now() < deadline
                    {
                        let events = store
                            .outbox()
                            .claim(&format!("c{i}-{round}"), now, 60_000, 7)
                            .await
                            .unwrap();
                        taken.fetch_add(events.len(), std::sync::atomic::Ordering::SeqCst);
                        if events.is_empty() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        got.extend(events);
                        round += 1;
                    }
                    got
                })
            })
            .collect();
        let mut all = Vec::new();
        for claim in claims {
            all.extend(claim.await.unwrap().into_iter().map(|e| e.event_id));
        }
        let total = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), total, "{db}: an event was claimed twice");
        assert_eq!(total, 60, "{db}: every event was claimed");
        assert!(
            store
                .outbox()
                .claim("after", now, 60_000, 7)
                .await
                .unwrap()
                .is_empty(),
            "{db}: nothing left"
        );
    }
}

#[tokio::test]
async fn a_dead_event_holds_back_its_order_until_retried() {
    for (db, store) in stores().await {
        let store = store.clone().with_order_events(true);
        let r = reservation(&unique("s"), "erin");
        store
            .orders()
            .insert(std::slice::from_ref(&r))
            .await
            .unwrap();
        let order = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        store.orders().pay(&order.order_id).await.unwrap();
        let now = flashgate_common::now_ms();
        let created = store
            .outbox()
            .claim("a", now, 60_000, 10)
            .await
            .unwrap()
            .pop()
            .unwrap();

        let later = Failure {
            attempts: 1,
            sinks_done: 0,
            error: "webhook answered 500",
            retry_at_ms: Some(now + 5_000),
        };
        assert!(
            !store
                .outbox()
                .failed(&created.event_id, "someone else", &later)
                .await
                .unwrap(),
            "{db}: only the holder records"
        );
        assert!(
            store
                .outbox()
                .failed(&created.event_id, "a", &later)
                .await
                .unwrap(),
            "{db}"
        );
        assert!(
            store
                .outbox()
                .claim("b", now, 60_000, 10)
                .await
                .unwrap()
                .is_empty(),
            "{db}: not due yet"
        );
        let retried = store
            .outbox()
            .claim("c", now + 5_000, 60_000, 10)
            .await
            .unwrap();
        assert_eq!(
            retried
                .iter()
                .map(|e| (e.event_id.as_str(), e.attempts))
                .collect::<Vec<_>>(),
            vec![(created.event_id.as_str(), 1)],
            "{db}"
        );

        let dead = Failure {
            attempts: 2,
            sinks_done: 0,
            error: &"x".repeat(5000),
            retry_at_ms: None,
        };
        assert!(
            store
                .outbox()
                .failed(&created.event_id, "c", &dead)
                .await
                .unwrap(),
            "{db}"
        );
        assert!(
            store
                .outbox()
                .claim("d", now + 3_600_000, 60_000, 10)
                .await
                .unwrap()
                .is_empty(),
            "{db}: dead, and `paid` waits behind it"
        );
        let listed = store.outbox().dead(10).await.unwrap();
        assert_eq!(listed.len(), 1, "{db}");
        assert_eq!(
            (listed[0].event_id.as_str(), listed[0].attempts),
            (created.event_id.as_str(), 2),
            "{db}"
        );
        assert_eq!(
            listed[0].last_error.as_ref().map(String::len),
            Some(500),
            "{db}: the error is clipped"
        );
        let stats = store.outbox().stats().await.unwrap();
        assert_eq!((stats.pending, stats.dead), (1, 1), "{db}");

        assert!(
            store
                .outbox()
                .retry_dead(&created.event_id, now)
                .await
                .unwrap(),
            "{db}"
        );
        assert!(
            !store
                .outbox()
                .retry_dead(&created.event_id, now)
                .await
                .unwrap(),
            "{db}: no longer dead"
        );
        let back = store.outbox().claim("e", now, 60_000, 10).await.unwrap();
        assert_eq!(
            back.iter()
                .map(|e| (e.kind, e.attempts))
                .collect::<Vec<_>>(),
            vec![(EventType::Created, 0)],
            "{db}"
        );
    }
}

/// A webhook receiver on loopback answering `status` and recording bodies.
async fn receiver(
    status: Arc<Mutex<u16>>,
    seen: Arc<Mutex<Vec<(axum::http::HeaderMap, String)>>>,
) -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap, body: String| {
            let (status, seen) = (status.clone(), seen.clone());
            async move {
                seen.lock().unwrap().push((headers, body));
                let code = *status.lock().unwrap();
                axum::http::StatusCode::from_u16(code).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hook")
}

fn config(url: &str, max_attempts: u32) -> EventsConfig {
    EventsConfig {
        webhook: Some(WebhookConfig {
            url: url.to_owned(),
            key: SECRET.as_bytes().to_vec(),
            timeout: Duration::from_secs(5),
        }),
        amqp: None,
        ca_file: None,
        max_attempts,
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(20),
        poll: Duration::from_millis(10),
        lease: Duration::from_secs(30),
        batch_size: 100,
    }
}

#[tokio::test]
async fn the_webhook_gets_signed_events_and_failures_go_dead_after_max_attempts() {
    let store = Store::connect(&crate::testing::sqlite_url())
        .await
        .unwrap()
        .with_order_events(true);
    let status = Arc::new(Mutex::new(503));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let url = receiver(status.clone(), seen.clone()).await;
    let metrics = crate::metrics::Metrics::register();
    let deliverer =
        Deliverer::new(store.clone(), &config(&url, 3), metrics.events.clone()).unwrap();
    let r = reservation(&unique("s"), "frank");
    store
        .orders()
        .insert(std::slice::from_ref(&r))
        .await
        .unwrap();

    // Three failed attempts (each after its backoff), then dead.
    for _ in 0..200 {
        deliverer.deliver_once().await.unwrap();
        if store.outbox().stats().await.unwrap().dead == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.lock().unwrap().len(), 3, "max_attempts sends, no more");
    assert_eq!(
        metrics
            .events
            .failed_attempts
            .with_label_values(&["webhook"])
            .get(),
        3
    );
    assert_eq!(metrics.events.dead_total.get(), 1);
    deliverer.refresh_stats().await;
    assert!(
        metrics
            .render()
            .contains("flashgate_order_events_dead_in_outbox 1"),
        "{}",
        metrics.render()
    );
    let dead = store.outbox().dead(10).await.unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("webhook answered 503"));
    deliverer.deliver_once().await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 3, "a dead event is not sent");

    // Retried by an operator, it goes out, signed, with the id it always had.
    *status.lock().unwrap() = 204;
    assert!(store
        .outbox()
        .retry_dead(&dead[0].event_id, flashgate_common::now_ms())
        .await
        .unwrap());
    deliverer.deliver_once().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    let (headers, body) = &seen[3];
    let header = |name: &str| headers.get(name).unwrap().to_str().unwrap().to_owned();
    assert_eq!(header("webhook-id"), dead[0].event_id);
    assert_eq!(header("flashgate-event-id"), dead[0].event_id);
    assert_eq!(header("flashgate-event-type"), "order.created");
    assert_eq!(seen[0].1, *body, "every attempt sends the same bytes");
    let now_s = flashgate_common::now_ms() / 1000;
    assert_eq!(
        sign::verify(
            SECRET.as_bytes(),
            &header("webhook-id"),
            &header("webhook-timestamp"),
            &header("webhook-signature"),
            body.as_bytes(),
            now_s,
            300
        ),
        Ok(())
    );
    assert_eq!(
        metrics
            .events
            .delivered
            .with_label_values(&["webhook"])
            .get(),
        1
    );
    assert_eq!(
        store.outbox().stats().await.unwrap(),
        crate::store::outbox::OutboxStats::default(),
        "delivered events leave the outbox"
    );
}

#[tokio::test]
async fn an_amqp_message_no_queue_takes_is_a_failed_attempt_and_stays_in_the_outbox() {
    let store = Store::connect(&crate::testing::sqlite_url())
        .await
        .unwrap()
        .with_order_events(true);
    let metrics = crate::metrics::Metrics::register();
    // A fresh exchange with no queue bound: the broker acks and returns.
    let exchange = format!("flashgate.unbound.{:x}", rand::random::<u64>());
    let mut config = config("http://127.0.0.1:9/unused", 10);
    config.webhook = None;
    config.amqp = Some(AmqpConfig {
        url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
        timeout: Duration::from_secs(5),
        exchange: exchange.clone(),
        routing_key_created: "order.created".into(),
        routing_key_paid: "order.paid".into(),
        routing_key_cancelled: "order.cancelled".into(),
    });
    let deliverer = Deliverer::new(store.clone(), &config, metrics.events.clone()).unwrap();
    let r = reservation(&unique("s"), "grace");
    store
        .orders()
        .insert(std::slice::from_ref(&r))
        .await
        .unwrap();

    let mut rounds = 0;
    while metrics
        .events
        .failed_attempts
        .with_label_values(&["amqp"])
        .get()
        < 2
    {
        rounds += deliverer.deliver_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(rounds < 50, "no failed AMQP attempt");
    }
    assert_eq!(
        metrics.events.delivered.with_label_values(&["amqp"]).get(),
        0
    );
    assert_eq!(
        store.outbox().stats().await.unwrap().pending,
        1,
        "the event stays in the outbox"
    );
    let left = store
        .outbox()
        .claim("t", flashgate_common::now_ms() + 3_600_000, 60_000, 10)
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert!(left[0].attempts >= 2, "attempts rise: {}", left[0].attempts);
    if let Some(amqp) = &deliverer.amqp {
        if let Ok(channel) = amqp.channel().await {
            let _ = channel
                .exchange_delete(
                    exchange.as_str().into(),
                    lapin::options::ExchangeDeleteOptions::default(),
                )
                .await;
        }
    }
}

/// Log lines written through [`tracing`] on this thread, kept for a test.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_tls_failure_is_warned_once_per_round_and_no_log_or_error_holds_the_urls_credentials() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let store = Store::connect(&crate::testing::sqlite_url())
        .await
        .unwrap()
        .with_order_events(true);
    let seen = Arc::new(Mutex::new(Vec::new()));
    // A plain HTTP receiver behind an https:// URL: every handshake fails.
    let plain = receiver(Arc::new(Mutex::new(204)), seen.clone()).await;
    let url = plain
        .replace("http://", "https://u:pw@")
        .replace("/hook", "/hook?token=s3cret");
    let metrics = crate::metrics::Metrics::register();
    // One attempt each: dead at once, with its error kept.
    let deliverer =
        Deliverer::new(store.clone(), &config(&url, 1), metrics.events.clone()).unwrap();
    for user in ["ann", "bob", "cyd"] {
        store
            .orders()
            .insert(&[reservation(&unique("s"), user)])
            .await
            .unwrap();
    }

    assert_eq!(deliverer.deliver_once().await.unwrap(), 3);
    assert_eq!(
        metrics
            .events
            .failed_attempts
            .with_label_values(&["webhook"])
            .get(),
        3
    );
    let warnings = |text: &str| {
        text.matches("the TLS handshake with the destination failed")
            .count()
    };
    assert_eq!(
        warnings(&logs.text()),
        1,
        "one warning for the round's three failures:\n{}",
        logs.text()
    );
    let errors: Vec<String> = store
        .outbox()
        .dead(10)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.last_error)
        .collect();
    assert_eq!(errors.len(), 3);
    assert!(
        errors
            .iter()
            .all(|e| e.starts_with("webhook TLS handshake failed")),
        "{errors:?}"
    );
    let text = logs.text();
    assert!(text.contains("webhook TLS handshake failed"), "{text}");
    assert!(seen.lock().unwrap().is_empty(), "nothing was posted");
    for secret in ["u:pw", "pw@", "s3cret", "token="] {
        assert!(!text.contains(secret), "`{secret}` in the log:\n{text}");
        assert!(
            errors.iter().all(|e| !e.contains(secret)),
            "`{secret}` in {errors:?}"
        );
    }
}

/// Threads of this process now: all of them, and lapin's connection
/// threads (named `lapin-io-loop`).
fn threads() -> (usize, usize) {
    let tasks: Vec<_> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| t.unwrap().path())
        .collect();
    let io_loops = tasks
        .iter()
        .filter(|t| {
            std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.starts_with("lapin-io-loop"))
        })
        .count();
    (tasks.len(), io_loops)
}

/// Waits (up to 10 s) for lapin's connection threads to end; answers the
/// threads left.
async fn io_loops_ended() -> (usize, usize) {
    for _ in 0..100 {
        if threads().1 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    threads()
}

/// An event of order `o-1`, as the outbox hands it out.
fn an_event() -> OutboxEvent {
    OutboxEvent {
        event_id: "ev-1".into(),
        order_id: "o-1".into(),
        seq: 1,
        kind: EventType::Created,
        payload: "{}".into(),
        attempts: 0,
        sinks_done: 0,
        created_at_ms: flashgate_common::now_ms(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_never_answers_the_tls_handshake_times_out_and_leaves_no_thread_or_socket() {
    use tokio::io::AsyncReadExt;
    // Accepts every connection, keeps it open, and never says a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let held = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            held.lock().await.push(tcp);
        }
    });
    let amqp = amqp::Amqp::new(
        AmqpConfig {
            url: format!("amqps://guest:guest@127.0.0.1:{port}/%2f"),
            timeout: Duration::from_millis(400),
            exchange: "flashgate.silent".into(),
            routing_key_created: "order.created".into(),
            routing_key_paid: "order.paid".into(),
            routing_key_cancelled: "order.cancelled".into(),
        },
        None,
    );
    let event = an_event();
    let err = amqp.send(&event).await.unwrap_err();
    assert!(matches!(err, amqp::AmqpError::ConnectTimeout), "{err}");
    assert_eq!(
        err.to_string(),
        "amqp connection (TCP connect and TLS handshake) timed out"
    );
    // The first attempt may start pools that stay; later ones add nothing.
    let (after_one, io_loops) = io_loops_ended().await;
    assert_eq!(io_loops, 0, "the connection thread of the attempt ended");
    for _ in 0..5 {
        let err = amqp.send(&event).await.unwrap_err();
        assert!(matches!(err, amqp::AmqpError::ConnectTimeout), "{err}");
    }
    let (after_six, io_loops) = io_loops_ended().await;
    assert_eq!(io_loops, 0, "every attempt's connection thread ended");
    assert!(
        after_six <= after_one,
        "{after_six} threads after 6 attempts, {after_one} after 1"
    );

    // The connects went to 127.0.0.1 (the URL's IP, not `localhost`), and
    // every socket was closed by the client once its attempt timed out.
    let mut sockets = std::mem::take(&mut *accepted.lock().await);
    assert_eq!(sockets.len(), 6, "one connection per attempt");
    for tcp in &mut sockets {
        let mut hello = Vec::new();
        let eof = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut hello)).await;
        assert!(matches!(eof, Ok(Ok(_))), "the socket is closed: {eof:?}");
        assert_eq!(
            hello.first(),
            Some(&0x16),
            "a TLS ClientHello was sent first"
        );
    }
}

#[test]
fn backoff_doubles_up_to_its_cap_with_jitter() {
    let (initial, max) = (Duration::from_millis(1000), Duration::from_millis(8000));
    for (attempts, step) in [
        (1, 1000),
        (2, 2000),
        (3, 4000),
        (4, 8000),
        (5, 8000),
        (40, 8000),
        (u32::MAX, 8000),
    ] {
        for _ in 0..20 {
            let wait = backoff_ms(initial, max, attempts);
            assert!(
                (step / 2..=step).contains(&wait),
                "attempt {attempts}: {wait} outside [{}, {step}]",
                step / 2
            );
        }
    }
}
