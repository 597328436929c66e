//! Every test body runs against SQLite, PostgreSQL and MySQL (MariaDB).

use std::collections::HashSet;

use flashgate_common::reservation::{Reservation, ReservationStatus};
use flashgate_common::sale::SaleSpec;

use super::orders::MAX_ROWS_PER_INSERT;
use super::*;
use crate::testing::{reservation, sale, stores, unique};

#[tokio::test]
async fn batch_insert_is_idempotent_on_reservation_id() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let batch: Vec<_> = (0..5)
            .map(|i| reservation(&sale_id, &format!("u{i}")))
            .collect();
        assert_eq!(store.orders().insert(&batch).await.unwrap(), 5, "{db}");
        assert_eq!(store.orders().insert(&batch).await.unwrap(), 0, "{db}");
        assert_eq!(
            store.orders().count_live(&sale_id).await.unwrap(),
            5,
            "{db}"
        );
    }
}

#[tokio::test]
async fn a_batch_mixing_new_and_known_reservations_inserts_only_the_new() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let first = reservation(&sale_id, "a");
        store
            .orders()
            .insert(std::slice::from_ref(&first))
            .await
            .unwrap();
        let order = store
            .orders()
            .by_reservation(&first.reservation_id)
            .await
            .unwrap()
            .unwrap();
        // Same reservation id with other data must not create or change a row.
        let mut replay = first.clone();
        replay.user_id = "someone-else".into();
        let batch = vec![replay, reservation(&sale_id, "b")];
        assert_eq!(store.orders().insert(&batch).await.unwrap(), 1, "{db}");
        let again = store
            .orders()
            .by_reservation(&first.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again, order, "{db}");
        assert_eq!(
            store.orders().count_live(&sale_id).await.unwrap(),
            2,
            "{db}"
        );
    }
}

#[tokio::test]
async fn large_batches_are_split_below_the_parameter_limit() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let batch: Vec<_> = (0..MAX_ROWS_PER_INSERT + 10)
            .map(|i| reservation(&sale_id, &format!("u{i}")))
            .collect();
        assert_eq!(
            store.orders().insert(&batch).await.unwrap(),
            batch.len() as u64,
            "{db}"
        );
    }
}

#[tokio::test]
async fn order_by_reservation_maps_status_and_ids() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let r = reservation(&sale_id, "alice");
        assert_eq!(
            store
                .orders()
                .by_reservation(&r.reservation_id)
                .await
                .unwrap(),
            None,
            "{db}"
        );
        store
            .orders()
            .insert(std::slice::from_ref(&r))
            .await
            .unwrap();
        let view = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            view.order_id.starts_with("o-") && view.order_id.len() == 34,
            "{db}: {}",
            view.order_id
        );
        assert_eq!(
            (view.sale_id.as_str(), view.user_id.as_str()),
            (sale_id.as_str(), "alice"),
            "{db}"
        );
        assert_eq!(view.status, ReservationStatus::Confirmed, "{db}");

        assert!(
            matches!(
                store.orders().pay(&view.order_id).await.unwrap(),
                Payment::Paid(_)
            ),
            "{db}"
        );
        let view = store
            .orders()
            .by_reservation(&r.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.status, ReservationStatus::Confirmed, "{db}");

        // A paid order is never cancelled: an unpaid one shows it.
        let unpaid = reservation(&sale_id, "bob");
        store
            .orders()
            .insert(std::slice::from_ref(&unpaid))
            .await
            .unwrap();
        let order = store
            .orders()
            .by_reservation(&unpaid.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            store
                .orders()
                .cancel_if_unpaid(&order.order_id)
                .await
                .unwrap(),
            "{db}"
        );
        let view = store
            .orders()
            .by_reservation(&unpaid.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.status, ReservationStatus::Cancelled, "{db}");
    }
}

#[tokio::test]
async fn cancelled_orders_are_not_live() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let batch: Vec<_> = (0..3)
            .map(|i| reservation(&sale_id, &format!("u{i}")))
            .collect();
        store.orders().insert(&batch).await.unwrap();
        store
            .orders()
            .insert(&[reservation(&unique("other"), "x")])
            .await
            .unwrap();
        let first = store
            .orders()
            .by_reservation(&batch[0].reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            store
                .orders()
                .cancel_if_unpaid(&first.order_id)
                .await
                .unwrap(),
            "{db}"
        );
        assert_eq!(
            store.orders().count_live(&sale_id).await.unwrap(),
            2,
            "{db}"
        );
    }
}

#[tokio::test]
async fn insert_sale_if_absent_never_overwrites() {
    for (db, store) in stores().await {
        let id = unique("s");
        let spec = sale(&id, 10);
        assert!(store.sales().insert_if_absent(&spec).await.unwrap(), "{db}");
        let mut moved = spec.clone();
        moved.starts_at_ms += 60_000;
        moved.ends_at_ms += 60_000;
        moved.stock = 99;
        assert!(
            !store.sales().insert_if_absent(&moved).await.unwrap(),
            "{db}"
        );
        assert_eq!(store.sales().get(&id).await.unwrap(), Some(spec), "{db}");
    }
}

#[tokio::test]
async fn upsert_sale_replaces_and_lists() {
    for (db, store) in stores().await {
        let id = unique("s");
        assert_eq!(store.sales().get(&id).await.unwrap(), None, "{db}");
        let mut spec = sale(&id, 10);
        store.sales().upsert(&spec).await.unwrap();
        spec.stock = 20;
        spec.name = "renamed".into();
        store.sales().upsert(&spec).await.unwrap();
        assert_eq!(
            store.sales().get(&id).await.unwrap().as_ref(),
            Some(&spec),
            "{db}"
        );
        assert!(store.sales().all().await.unwrap().contains(&spec), "{db}");
    }
}

#[tokio::test]
async fn a_sale_write_dropped_before_commit_leaves_nothing() {
    for (db, store) in stores().await {
        let id = unique("s");
        let mut write = store.sales().begin_write().await.unwrap();
        write.upsert(&sale(&id, 5)).await.unwrap();
        drop(write);
        assert_eq!(store.sales().get(&id).await.unwrap(), None, "{db}");
    }
}

#[tokio::test]
async fn sqlite_file_and_directory_are_created() {
    let url = crate::testing::sqlite_url();
    let store = Store::connect(&url).await.unwrap();
    assert!(store.ping().await);
    let path = url.strip_prefix("sqlite://").unwrap();
    assert!(std::path::Path::new(path).exists());
}

#[tokio::test]
async fn a_payment_and_a_cancellation_are_decided_once() {
    for (db, store) in crate::testing::stores().await {
        let sale_id = unique("s");
        let (a, b) = (reservation(&sale_id, "a"), reservation(&sale_id, "b"));
        store
            .orders()
            .insert(&[a.clone(), b.clone()])
            .await
            .unwrap();
        let a = store
            .orders()
            .by_reservation(&a.reservation_id)
            .await
            .unwrap()
            .unwrap();
        let b = store
            .orders()
            .by_reservation(&b.reservation_id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(
                store.orders().pay(&a.order_id).await.unwrap(),
                Payment::Paid(_)
            ),
            "{db}"
        );
        assert!(
            matches!(
                store.orders().pay(&a.order_id).await.unwrap(),
                Payment::Paid(_)
            ),
            "paying twice is harmless ({db})"
        );
        assert!(
            !store.orders().cancel_if_unpaid(&a.order_id).await.unwrap(),
            "a paid order is never cancelled ({db})"
        );
        assert!(
            store.orders().cancel_if_unpaid(&b.order_id).await.unwrap(),
            "{db}"
        );
        assert!(
            !store.orders().cancel_if_unpaid(&b.order_id).await.unwrap(),
            "{db}"
        );
        assert!(
            matches!(
                store.orders().pay(&b.order_id).await.unwrap(),
                Payment::Cancelled(_)
            ),
            "{db}"
        );
        assert_eq!(
            store
                .orders()
                .pay("o-00000000000000000000000000000000")
                .await
                .unwrap(),
            Payment::Unknown,
            "{db}"
        );
        assert!(store.orders().writable().await, "{db}");
    }
}

#[tokio::test]
async fn a_database_made_before_payment_timeouts_gains_the_new_columns() {
    let url = crate::testing::sqlite_url();
    let path = url.strip_prefix("sqlite://").unwrap();
    std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    sqlx::any::install_default_drivers();
    let old = sqlx::AnyPool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    for statement in [
        "CREATE TABLE sales (id TEXT PRIMARY KEY, name TEXT NOT NULL, stock BIGINT NOT NULL, per_user_limit BIGINT NOT NULL, starts_at_ms BIGINT NOT NULL, ends_at_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL)",
        "CREATE TABLE orders (order_id TEXT PRIMARY KEY, reservation_id TEXT NOT NULL UNIQUE, sale_id TEXT NOT NULL, user_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, reserved_at_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL, status TEXT NOT NULL)",
        "INSERT INTO sales VALUES ('old', 'old sale', 5, 1, 0, 9999999999999, 0)",
    ] {
        sqlx::query(statement).execute(&old).await.unwrap();
    }
    old.close().await;
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(
        store.sales().payment_timeout("old").await.unwrap(),
        Some(900)
    );
    assert_eq!(store.sales().get("old").await.unwrap().unwrap().stock, 5);
    // Connecting again finds the columns and changes nothing.
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(
        store.sales().payment_timeout("old").await.unwrap(),
        Some(900)
    );
}

#[tokio::test]
async fn a_sale_pause_and_the_global_switch_are_kept_in_the_database() {
    for (db, store) in stores().await {
        let id = unique("s");
        assert!(
            !store.sales().set_paused(&id, true).await.unwrap(),
            "{db}: unknown sale"
        );
        assert_eq!(store.sales().paused(&id).await.unwrap(), None, "{db}");
        let spec = sale(&id, 5);
        store.sales().upsert(&spec).await.unwrap();
        assert_eq!(
            store.sales().paused(&id).await.unwrap(),
            Some(false),
            "{db}"
        );
        assert!(store.sales().set_paused(&id, true).await.unwrap(), "{db}");
        // Changing the sale's definition keeps its pause.
        store
            .sales()
            .upsert(&SaleSpec { stock: 7, ..spec })
            .await
            .unwrap();
        assert_eq!(store.sales().paused(&id).await.unwrap(), Some(true), "{db}");
        assert!(store.sales().set_paused(&id, false).await.unwrap(), "{db}");
        assert_eq!(
            store.sales().paused(&id).await.unwrap(),
            Some(false),
            "{db}"
        );

        // PostgreSQL is shared with other tests: put the switch back.
        let before = store.switch().paused().await.unwrap();
        store.switch().set_paused(true).await.unwrap();
        assert_eq!(store.switch().paused().await.unwrap(), Some(true), "{db}");
        store.switch().adopt_paused(false).await.unwrap();
        assert_eq!(
            store.switch().paused().await.unwrap(),
            Some(true),
            "{db}: a recorded switch is never replaced by an adopted one"
        );
        store.switch().set_paused(false).await.unwrap();
        assert_eq!(store.switch().paused().await.unwrap(), Some(false), "{db}");
        store
            .switch()
            .set_paused(before.unwrap_or(false))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_write_meeting_orders_another_write_has_not_committed_creates_only_its_own() {
    use std::sync::atomic::Ordering::Relaxed;
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let r: Vec<_> = (0..210)
            .map(|i| reservation(&sale_id, &format!("u{i}")))
            .collect();
        let ids = |picked: &mut dyn Iterator<Item = usize>| -> HashSet<String> {
            picked.map(|i| r[i].reservation_id.clone()).collect()
        };
        let write = |batch: Vec<Reservation>| {
            let (store, sale_id) = (Store::clone(&store), sale_id.clone());
            async move {
                let mut write = store.locks().begin_order_write(&[&sale_id]).await?;
                let created = write.insert(&batch).await?;
                write.commit().await?;
                Ok::<_, StoreError>(created)
            }
        };
        // The other path, mid-write: r5 and r70 inserted, not committed.
        let mut other = store.locks().begin_order_write(&[&sale_id]).await.unwrap();
        other.insert(&[r[5].clone(), r[70].clone()]).await.unwrap();
        // A write of 100 (on PostgreSQL a plain insert first) waits for them
        // (on SQLite already for the other's write lock) until it commits.
        let racing = tokio::spawn(write(r[..100].to_vec()));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        other.commit().await.unwrap();
        let created = racing.await.unwrap().unwrap();
        assert_eq!(
            created,
            ids(&mut (0..100).filter(|i| ![5, 70].contains(i))),
            "{db}: r5 and r70 were the other path's"
        );
        let postgres = store.flavour == Flavour::Postgres;
        if postgres {
            assert_eq!(store.conflict_backoff.load(Relaxed), 16, "{db}");
        }
        // The next write meets r1: only its own rows are answered (and on
        // PostgreSQL the backoff starts again).
        let mut batch = r[100..140].to_vec();
        batch.push(r[1].clone());
        assert_eq!(write(batch).await.unwrap(), ids(&mut (100..140)), "{db}");
        // One that meets none wears the backoff down by one.
        assert_eq!(
            write(r[140..].to_vec()).await.unwrap(),
            ids(&mut (140..210)),
            "{db}"
        );
        if postgres {
            assert_eq!(store.conflict_backoff.load(Relaxed), 15, "{db}");
        }
        assert_eq!(
            store.orders().count_live(&sale_id).await.unwrap(),
            210,
            "{db}"
        );
    }
}

#[tokio::test]
async fn a_reservation_listed_twice_in_one_write_gets_one_order_created_by_that_write() {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        let (a, b) = (reservation(&sale_id, "a"), reservation(&sale_id, "b"));
        store
            .orders()
            .insert(std::slice::from_ref(&b))
            .await
            .unwrap();
        let mut write = store.locks().begin_order_write(&[&sale_id]).await.unwrap();
        let created = write
            .insert(&[a.clone(), b.clone(), a.clone()])
            .await
            .unwrap();
        write.commit().await.unwrap();
        assert_eq!(
            created,
            std::collections::HashSet::from([a.reservation_id.clone()]),
            "{db}"
        );
        assert_eq!(
            store.orders().count_live(&sale_id).await.unwrap(),
            2,
            "{db}"
        );
    }
}

#[tokio::test]
async fn orders_keep_every_character_of_their_keys_and_ids_in_a_large_batch_and_a_small_one() {
    // Quotes, backslashes, commas, braces, spaces and the word NULL: what
    // PostgreSQL's array literals (its batched insert) must carry as text.
    const KEYS: &[&str] = &[
        "a\"b", "c\\d", "x,y", "{}", "NULL", " sp ace ", "''", "", "\\\"",
    ];
    for (db, store) in stores().await {
        let sale_id = unique("s");
        store.sales().upsert(&sale(&sale_id, 100)).await.unwrap();
        for n in [70, 3] {
            let batch: Vec<Reservation> = (0..n)
                .map(|i| Reservation {
                    idempotency_key: KEYS[i % KEYS.len()].to_owned(),
                    reserved_at_ms: 1_700_000_000_000 + i as i64,
                    ..reservation(&sale_id, &format!("u{n}-{i}@x.y"))
                })
                .collect();
            assert_eq!(
                store.orders().insert(&batch).await.unwrap(),
                n as u64,
                "{db}"
            );
            let mut resync = store.locks().begin_resync(&sale_id).await.unwrap();
            let written = resync.orders(&sale_id).await.unwrap();
            resync.commit().await.unwrap();
            for r in &batch {
                let order = written
                    .iter()
                    .find(|o| o.row.reservation_id == r.reservation_id)
                    .unwrap_or_else(|| panic!("{db}: no order for {}", r.reservation_id));
                assert_eq!(
                    (
                        order.row.sale_id.as_str(),
                        order.row.user_id.as_str(),
                        order.idempotency_key.as_str(),
                        order.reserved_at_ms
                    ),
                    (
                        r.sale_id.as_str(),
                        r.user_id.as_str(),
                        r.idempotency_key.as_str(),
                        r.reserved_at_ms
                    ),
                    "{db}"
                );
            }
        }
    }
}

#[tokio::test]
async fn an_order_write_waits_for_a_resync_of_its_sale_and_the_resync_reads_what_committed_before_it(
) {
    for (db, store) in stores().await {
        let sale_id = unique("s");
        store.sales().upsert(&sale(&sale_id, 5)).await.unwrap();
        let early = reservation(&sale_id, "early");
        store
            .orders()
            .insert(std::slice::from_ref(&early))
            .await
            .unwrap();
        let mut resync = store.locks().begin_resync(&sale_id).await.unwrap();
        let late = reservation(&sale_id, "late");
        let writer = {
            let (store, sale_id, late) = (store.clone(), sale_id.clone(), late.clone());
            tokio::spawn(async move {
                let mut write = store.locks().begin_order_write(&[&sale_id]).await.unwrap();
                write.insert(std::slice::from_ref(&late)).await.unwrap();
                write.commit().await.unwrap();
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !writer.is_finished(),
            "{db}: the write must wait for the re-sync"
        );
        let seen: Vec<String> = resync
            .orders(&sale_id)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.row.reservation_id)
            .collect();
        assert_eq!(seen, vec![early.reservation_id.clone()], "{db}");
        resync.commit().await.unwrap();
        writer.await.unwrap();
        assert_eq!(
            store.orders().count_live(&sale_id).await.unwrap(),
            2,
            "{db}"
        );

        // And the other way round: a re-sync waits for a write in progress.
        let mut write = store.locks().begin_order_write(&[&sale_id]).await.unwrap();
        let third = reservation(&sale_id, "third");
        write.insert(std::slice::from_ref(&third)).await.unwrap();
        let resyncer = {
            let (store, sale_id) = (store.clone(), sale_id.clone());
            tokio::spawn(async move {
                let mut resync = store.locks().begin_resync(&sale_id).await.unwrap();
                let n = resync.orders(&sale_id).await.unwrap().len();
                resync.commit().await.unwrap();
                n
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !resyncer.is_finished(),
            "{db}: the re-sync must wait for the write"
        );
        write.commit().await.unwrap();
        assert_eq!(
            resyncer.await.unwrap(),
            3,
            "{db}: the re-sync reads the write that held it up"
        );
    }
}

#[tokio::test]
async fn pauses_a_database_never_recorded_are_taken_once_and_never_over_an_operators() {
    let url = crate::testing::sqlite_url();
    let path = url.strip_prefix("sqlite://").unwrap();
    std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    sqlx::any::install_default_drivers();
    // A database made before pauses and the switch were kept in it.
    let old = sqlx::AnyPool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    for statement in [
        "CREATE TABLE sales (id TEXT PRIMARY KEY, name TEXT NOT NULL, stock BIGINT NOT NULL, per_user_limit BIGINT NOT NULL, starts_at_ms BIGINT NOT NULL, ends_at_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL)",
        "INSERT INTO sales VALUES ('old', 'old sale', 5, 1, 0, 9999999999999, 0)",
    ] {
        sqlx::query(statement).execute(&old).await.unwrap();
    }
    old.close().await;
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(
        store.sales().paused("old").await.unwrap(),
        None,
        "never recorded"
    );
    assert_eq!(
        store.switch().paused().await.unwrap(),
        None,
        "never recorded"
    );
    assert_eq!(
        store.sales().pauses().await.unwrap(),
        vec![("old".to_owned(), None)]
    );
    // A sale created now starts recorded, open.
    store.sales().upsert(&sale("new", 5)).await.unwrap();
    assert_eq!(store.sales().paused("new").await.unwrap(), Some(false));
    assert!(!store.sales().adopt_paused("new", true).await.unwrap());
    assert_eq!(store.sales().paused("new").await.unwrap(), Some(false));

    assert!(store.sales().adopt_paused("old", true).await.unwrap());
    assert!(
        !store.sales().adopt_paused("old", false).await.unwrap(),
        "taken once"
    );
    assert_eq!(store.sales().paused("old").await.unwrap(), Some(true));
    store.switch().adopt_paused(true).await.unwrap();
    store.switch().adopt_paused(false).await.unwrap();
    assert_eq!(
        store.switch().paused().await.unwrap(),
        Some(true),
        "taken once"
    );
}

#[tokio::test]
async fn mysql_lock_waits_and_deadlocks_are_retried_and_bad_data_is_a_rejection() {
    let store = crate::testing::mysql_store().await;
    let (a, b) = (unique("s"), unique("s"));
    store.sales().upsert(&sale(&a, 5)).await.unwrap();
    store.sales().upsert(&sale(&b, 5)).await.unwrap();

    // A re-sync holds sale `a`: an order write on it waits 5 s
    // (innodb_lock_wait_timeout, error 1205) and is retried, not refused.
    let resync = store.locks().begin_resync(&a).await.unwrap();
    let waited = store
        .locks()
        .begin_order_write(&[&a])
        .await
        .err()
        .expect("the hold must time out");
    assert!(!waited.is_rejection(), "{waited}");
    drop(resync);

    // Two transactions taking `a` and `b` in opposite orders: InnoDB breaks
    // the cycle at once with 1213 (deadlock), also retried.
    let lock = |id: &str| format!("SELECT id FROM sales WHERE id = '{id}' FOR UPDATE");
    let mut one = store.pool.begin().await.unwrap();
    let mut two = store.pool.begin().await.unwrap();
    sqlx::query(&lock(&a)).execute(&mut *one).await.unwrap();
    sqlx::query(&lock(&b)).execute(&mut *two).await.unwrap();
    let (lock_a, lock_b) = (lock(&a), lock(&b));
    let (first, second) = tokio::join!(sqlx::query(&lock_b).execute(&mut *one), async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        sqlx::query(&lock_a).execute(&mut *two).await
    });
    let deadlock = first
        .err()
        .or(second.err())
        .map(StoreError::Query)
        .expect("one side is chosen as the deadlock victim");
    assert!(!deadlock.is_rejection(), "{deadlock}");
    drop((one, two));

    // A value the schema refuses (strict mode: too long) is the entry's fault.
    let mut long = reservation(&a, "x");
    long.user_id = "u".repeat(300);
    let refused = store
        .orders()
        .insert(&[long])
        .await
        .expect_err("a 300-character user id does not fit");
    assert!(refused.is_rejection(), "{refused}");
}

#[tokio::test]
async fn a_sales_bucket_count_is_read_once_per_store_and_never_shared_between_stores() {
    let url = crate::testing::sqlite_url();
    let (first, second) = (
        Store::connect(&url).await.unwrap(),
        Store::connect(&crate::testing::sqlite_url()).await.unwrap(),
    );
    let id = unique("s");
    assert_eq!(first.sales().buckets(&id).await.unwrap(), 1, "unknown: one");
    let mut spec = sale(&id, 10);
    spec.buckets = 4;
    first.sales().upsert(&spec).await.unwrap();
    assert_eq!(
        first.sales().buckets(&id).await.unwrap(),
        4,
        "an unknown sale is not remembered"
    );
    spec.buckets = 2;
    second.sales().upsert(&spec).await.unwrap();
    assert_eq!(
        second.sales().buckets(&id).await.unwrap(),
        2,
        "its own database"
    );
    // Remembered by the store and its clones: a count changed under it
    // (which no writer does) is not read again, while a new store reads it.
    sqlx::query("UPDATE sales SET buckets = 3 WHERE id = $1")
        .bind(&id)
        .execute(&first.pool)
        .await
        .unwrap();
    assert_eq!(first.clone().sales().buckets(&id).await.unwrap(), 4);
    let fresh = Store::connect(&url).await.unwrap();
    assert_eq!(fresh.sales().buckets(&id).await.unwrap(), 3);
}
