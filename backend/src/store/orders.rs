//! The `orders` table: one row per reservation that became an order, and
//! its life (created, paid or cancelled, its item back in Redis). With
//! order events on, each change writes its event to the outbox in the same
//! transaction ([`super::outbox`]).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use flashgate_common::reservation::{OrderView, Reservation, ReservationStatus};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{outbox, sql, Flavour, Store, StoreError};

/// Rows per INSERT statement. A batch larger than this (only possible with
/// `batch_size` above it) is split into several statements inside the same
/// transaction, because PostgreSQL accepts at most 65535 bind parameters
/// per statement and SQLite 32766; 7 parameters per row x 2000 stays below.
pub(super) const MAX_ROWS_PER_INSERT: usize = 2000;

/// PostgreSQL chunks inserted with `ON CONFLICT` after one met an order
/// the other path wrote (see `Store::insert_columns`).
const CONFLICT_BACKOFF: u32 = 16;

/// The fewest rows of a PostgreSQL chunk tried as a plain insert first
/// (see `Store::insert_columns`).
const PLAIN_INSERT_ROWS: usize = 64;

/// Order status as stored in `orders.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    Created,
    Paid,
    Cancelled,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Created => "created",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "created" => Ok(OrderStatus::Created),
            "paid" => Ok(OrderStatus::Paid),
            "cancelled" => Ok(OrderStatus::Cancelled),
            other => Err(StoreError::BadStatus(other.to_owned())),
        }
    }

    /// What the buyer sees of this status.
    pub fn reservation_status(self) -> ReservationStatus {
        match self {
            OrderStatus::Created | OrderStatus::Paid => ReservationStatus::Confirmed,
            OrderStatus::Cancelled => ReservationStatus::Cancelled,
        }
    }
}

/// An order row as the payment, expiry, restore and reconcile paths see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRow {
    pub order_id: String,
    pub reservation_id: String,
    pub sale_id: String,
    pub user_id: String,
    pub status: OrderStatus,
    /// When the item of a cancelled order went back to Redis.
    pub released_at_ms: Option<i64>,
}

/// What a payment attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payment {
    /// This call (or an earlier one) marked the order paid.
    Paid(OrderRow),
    /// The order was cancelled first (payment timeout): not paid.
    Cancelled(OrderRow),
    /// No such order.
    Unknown,
}

/// The orders of a [`Store`] ([`Store::orders`]).
#[derive(Clone, Copy, Debug)]
pub struct Orders<'a> {
    pub(super) store: &'a Store,
}

impl Orders<'_> {
    /// Turns reservations into orders with one multi-row insert per chunk
    /// (on PostgreSQL perhaps two: see `Store::insert_columns`), in one
    /// transaction. A reservation that already has an order is skipped, so
    /// replaying a batch (after a crash before XACK, or a gateway forward
    /// racing the stream) never creates a second order.
    ///
    /// Returns how many orders this call created.
    ///
    /// # Errors
    /// [`StoreError::Query`] when the transaction fails; nothing is written.
    pub async fn insert(&self, reservations: &[Reservation]) -> Result<u64, StoreError> {
        if reservations.is_empty() {
            return Ok(0);
        }
        let sorted = in_lock_order(reservations);
        let mut tx = self.store.pool.begin().await?;
        let created = self.store.insert_in(&mut tx, &sorted).await?;
        tx.commit().await?;
        Ok(created.len() as u64)
    }

    /// The order made from reservation `reservation_id`, if any.
    ///
    /// # Errors
    /// A failed query or an unknown status value in the row.
    pub async fn by_reservation(
        &self,
        reservation_id: &str,
    ) -> Result<Option<OrderView>, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::ORDER_BY_RESERVATION))
            .bind(reservation_id)
            .fetch_optional(&self.store.pool)
            .await?;
        row.as_ref().map(order_view).transpose()
    }

    /// Orders of `sale_id` that still hold an item (not cancelled).
    ///
    /// # Errors
    /// A failed query.
    pub async fn count_live(&self, sale_id: &str) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::COUNT_LIVE_ORDERS))
            .bind(sale_id)
            .fetch_one(&self.store.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// The order `order_id`, if any.
    ///
    /// # Errors
    /// A failed query.
    pub async fn get(&self, order_id: &str) -> Result<Option<OrderRow>, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::ORDER_BY_ID))
            .bind(order_id)
            .fetch_optional(&self.store.pool)
            .await?;
        row.as_ref().map(|r| order_row(r, false)).transpose()
    }

    /// Marks an order paid unless it was cancelled first. The race between
    /// a payment and the payment timeout is decided here, once, by a
    /// conditional update: whichever reaches the row first wins.
    ///
    /// # Errors
    /// A failed query.
    pub async fn pay(&self, order_id: &str) -> Result<Payment, StoreError> {
        self.change_status(sql::PAY_IF_CREATED, order_id, outbox::EventType::Paid)
            .await?;
        Ok(match self.get(order_id).await? {
            Some(o) if o.status == OrderStatus::Paid => Payment::Paid(o),
            Some(o) => Payment::Cancelled(o),
            None => Payment::Unknown,
        })
    }

    /// Cancels an order still waiting for payment; returns whether this
    /// call cancelled it (false when it was paid or cancelled before).
    ///
    /// # Errors
    /// A failed query.
    ///
    /// Writes no event: `order.cancelled` says the item is back in the
    /// sale's stock, so [`Orders::mark_released`] writes it once it is.
    pub async fn cancel_if_unpaid(&self, order_id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.store.sql(sql::CANCEL_IF_CREATED))
            .bind(order_id)
            .execute(&self.store.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Runs the conditional status update `statement` on `order_id`; when it
    /// changed the row and events are on, writes the event `kind` in the
    /// same transaction. Answers whether the row changed.
    async fn change_status(
        &self,
        statement: &str,
        order_id: &str,
        kind: outbox::EventType,
    ) -> Result<bool, StoreError> {
        if !self.store.events {
            let done = sqlx::query(&self.store.sql(statement))
                .bind(order_id)
                .execute(&self.store.pool)
                .await?;
            return Ok(done.rows_affected() == 1);
        }
        let mut tx = self.store.pool.begin().await?;
        let done = sqlx::query(&self.store.sql(statement))
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        let changed = done.rows_affected() == 1;
        if changed {
            let row = sqlx::query(&self.store.sql(sql::ORDER_BY_ID))
                .bind(order_id)
                .fetch_one(&mut *tx)
                .await?;
            let order = order_row(&row, false)?;
            let event = outbox::NewEvent::new(kind, &order, flashgate_common::now_ms());
            outbox::write(&mut tx, self.store.flavour, &[event]).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Up to `limit` unpaid orders whose sale's payment timeout passed at `now_ms`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn expired(&self, now_ms: i64, limit: i64) -> Result<Vec<OrderRow>, StoreError> {
        let rows = sqlx::query(&self.store.sql(sql::EXPIRED_ORDERS))
            .bind(now_ms)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.store.pool)
            .await?;
        order_rows(&rows, OrderStatus::Created)
    }

    /// Up to `limit` cancelled orders whose item is not back in Redis yet,
    /// ordered by order id, after order id `after` (`""` for the first page).
    ///
    /// # Errors
    /// A failed query.
    pub async fn unreleased_cancelled(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Vec<OrderRow>, StoreError> {
        let rows = sqlx::query(&self.store.sql(sql::UNRELEASED_CANCELLED))
            .bind(after)
            .bind(limit)
            .fetch_all(&self.store.pool)
            .await?;
        order_rows(&rows, OrderStatus::Cancelled)
    }

    /// Orders of `sale_id` waiting for a payment or for their item's return.
    ///
    /// # Errors
    /// A failed query.
    pub async fn unsettled(&self, sale_id: &str) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::UNSETTLED_ORDERS))
            .bind(sale_id)
            .fetch_one(&self.store.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Which of `reservation_ids` have an order (at most
    /// [`MAX_ROWS_PER_INSERT`] per query).
    ///
    /// # Errors
    /// A failed query.
    pub async fn existing(&self, reservation_ids: &[&str]) -> Result<HashSet<String>, StoreError> {
        let mut found = HashSet::new();
        for chunk in reservation_ids.chunks(MAX_ROWS_PER_INSERT) {
            let statement = sql::orders_by_reservations(chunk.len());
            let statement = self.store.sql(&statement);
            let mut query = sqlx::query(&statement);
            for rid in chunk {
                query = query.bind(*rid);
            }
            found.extend(reservation_ids_of(
                query.fetch_all(&self.store.pool).await?,
            )?);
        }
        Ok(found)
    }

    /// Records that the item of cancelled order `order_id` is back in Redis
    /// (once: a later call changes nothing) and, when events are on, writes
    /// `order.cancelled` in the same transaction, so the event is never
    /// written before the item is back.
    ///
    /// # Errors
    /// A failed query.
    pub async fn mark_released(&self, order_id: &str, at_ms: i64) -> Result<(), StoreError> {
        if !self.store.events {
            sqlx::query(&self.store.sql(sql::MARK_RELEASED))
                .bind(at_ms)
                .bind(order_id)
                .execute(&self.store.pool)
                .await?;
            return Ok(());
        }
        let mut tx = self.store.pool.begin().await?;
        let done = sqlx::query(&self.store.sql(sql::MARK_RELEASED))
            .bind(at_ms)
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 1 {
            let row = sqlx::query(&self.store.sql(sql::ORDER_BY_ID))
                .bind(order_id)
                .fetch_one(&mut *tx)
                .await?;
            let order = order_row(&row, false)?;
            outbox::write(
                &mut tx,
                self.store.flavour,
                &[outbox::NewEvent::new(
                    outbox::EventType::Cancelled,
                    &order,
                    at_ms,
                )],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Every order of `sale_id`, in one query (one consistent snapshot).
    ///
    /// # Errors
    /// A failed query or an unknown status.
    pub async fn of_sale(&self, sale_id: &str) -> Result<Vec<OrderRow>, StoreError> {
        let rows = sqlx::query(&self.store.sql(sql::SALE_ORDERS))
            .bind(sale_id)
            .fetch_all(&self.store.pool)
            .await?;
        rows.iter().map(|r| order_row(r, true)).collect()
    }

    /// Answers whether an order row can be written right now, by writing a
    /// probe row in a transaction that is rolled back. Tells a database
    /// that refuses every write (read-only, full, down) from one entry
    /// that the database rejects on its own.
    pub async fn writable(&self) -> bool {
        let probe = async {
            let mut tx = self.store.pool.begin().await?;
            let statement = sql::insert_orders(1);
            let statement = self.store.sql(&statement);
            sqlx::query(&statement)
                .bind(new_order_id())
                .bind(format!("probe.{}", uuid::Uuid::new_v4().simple()))
                .bind("")
                .bind("")
                .bind("")
                .bind(0_i64)
                .bind(0_i64)
                .execute(&mut *tx)
                .await?;
            tx.rollback().await
        };
        probe.await.is_ok()
    }
}

impl Store {
    /// Inserts `sorted` (see [`in_lock_order`]) inside `tx`, skipping
    /// reservations that already have an order, and writes the
    /// `order.created` event of each new order when events are on.
    /// Answers the reservation ids that got an order from this call.
    pub(super) async fn insert_in(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        sorted: &[&Reservation],
    ) -> Result<HashSet<String>, StoreError> {
        let now = flashgate_common::now_ms();
        let mut created = HashSet::new();
        let mut events = Vec::new();
        for chunk in sorted.chunks(MAX_ROWS_PER_INSERT) {
            let order_ids: Vec<String> = chunk.iter().map(|_| new_order_id()).collect();
            let new_here = match self.flavour {
                Flavour::Mysql => {
                    // No `INSERT ... RETURNING` through sqlx on MySQL, nor
                    // a count that tells a new row from a kept one (sqlx
                    // asks for found rows): the rows this call made are
                    // the ones holding the order ids it chose.
                    let statement = self.sql(&sql::insert_orders(chunk.len())).into_owned();
                    bind_orders(&statement, chunk, &order_ids, now)
                        .execute(&mut **tx)
                        .await?;
                    self.created_by_order_ids(tx, &order_ids).await?
                }
                Flavour::Postgres => {
                    let columns = OrderColumns::of(chunk, &order_ids);
                    self.insert_columns(tx, &columns, now, chunk, &order_ids)
                        .await?
                }
                Flavour::Sqlite => {
                    let statement = sql::insert_orders_returning(chunk.len());
                    reservation_ids_of(
                        bind_orders(&statement, chunk, &order_ids, now)
                            .fetch_all(&mut **tx)
                            .await?,
                    )?
                }
            };
            if self.events {
                for (r, order_id) in chunk.iter().zip(&order_ids) {
                    if new_here.contains(&r.reservation_id) {
                        events.push(outbox::NewEvent::created(r, order_id, now));
                    }
                }
            }
            created.extend(new_here);
        }
        outbox::write(tx, self.flavour, &events).await?;
        Ok(created)
    }

    /// PostgreSQL: inserts `columns` (those of `chunk`, with `order_ids`)
    /// and answers the reservation ids that got their order here. The
    /// statements take the rows as one array per column, so their text
    /// does not grow with the batch (parsed and planned once per connection).
    ///
    /// A chunk of at least [`PLAIN_INSERT_ROWS`] goes first as a plain
    /// insert under a savepoint: every row passes it unless the other path
    /// (the forward, the stream) wrote one of these orders already, and it
    /// spares the database `ON CONFLICT`'s speculative insertion, about a
    /// fifth of its work per order (a smaller chunk would spend more on the
    /// savepoint's two round trips). A conflict rolls the savepoint back
    /// (PostgreSQL logs the violation) and the chunk goes again with
    /// `ON CONFLICT DO NOTHING RETURNING`, as do the chunks of this store
    /// until [`CONFLICT_BACKOFF`] in a row met no order of the other path:
    /// where the paths race (`backend.forward_grace_ms = 0`) most take that
    /// way at once.
    async fn insert_columns(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        columns: &OrderColumns,
        now: i64,
        chunk: &[&Reservation],
        order_ids: &[String],
    ) -> Result<HashSet<String>, StoreError> {
        let backoff = &self.conflict_backoff;
        let backing_off = backoff
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if !backing_off && chunk.len() >= PLAIN_INSERT_ROWS {
            sqlx::query("SAVEPOINT order_batch")
                .execute(&mut **tx)
                .await?;
            let plain = columns
                .bind(sql::INSERT_NEW_ORDERS_ARRAYS, now)
                .execute(&mut **tx)
                .await;
            match plain {
                Ok(done) => {
                    sqlx::query("RELEASE SAVEPOINT order_batch")
                        .execute(&mut **tx)
                        .await?;
                    // Every row, or an error: nothing on `orders` skips one.
                    if done.rows_affected() == chunk.len() as u64 {
                        return Ok(chunk.iter().map(|r| r.reservation_id.clone()).collect());
                    }
                    return self.created_by_order_ids(tx, order_ids).await;
                }
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    for step in [
                        "ROLLBACK TO SAVEPOINT order_batch",
                        "RELEASE SAVEPOINT order_batch",
                    ] {
                        sqlx::query(step).execute(&mut **tx).await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let created = reservation_ids_of(
            columns
                .bind(sql::INSERT_ORDERS_ARRAYS, now)
                .fetch_all(&mut **tx)
                .await?,
        )?;
        if created.len() < chunk.len() {
            backoff.store(CONFLICT_BACKOFF, Ordering::Relaxed);
        }
        Ok(created)
    }

    /// The reservation ids of the orders among `order_ids` (just chosen
    /// for a chunk's rows, inside `tx`): the rows the chunk's insert made.
    async fn created_by_order_ids(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        order_ids: &[String],
    ) -> Result<HashSet<String>, StoreError> {
        let select = self.sql(&sql::orders_by_ids(order_ids.len())).into_owned();
        let mut query = sqlx::query(&select);
        for id in order_ids {
            query = query.bind(id.as_str());
        }
        reservation_ids_of(query.fetch_all(&mut **tx).await?)
    }
}

/// The `reservation_id` column of `rows`.
fn reservation_ids_of(rows: Vec<AnyRow>) -> Result<HashSet<String>, StoreError> {
    rows.iter()
        .map(|row| Ok(row.try_get::<String, _>("reservation_id")?))
        .collect()
}

pub(super) fn order_row(row: &AnyRow, with_released: bool) -> Result<OrderRow, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(OrderRow {
        order_id: row.try_get("order_id")?,
        reservation_id: row.try_get("reservation_id")?,
        sale_id: row.try_get("sale_id")?,
        user_id: row.try_get("user_id")?,
        status: OrderStatus::parse(&status)?,
        released_at_ms: if with_released {
            row.try_get("released_at_ms")?
        } else {
            None
        },
    })
}

/// Order rows of a query selecting order_id, reservation_id, sale_id and
/// user_id, all known to be in `status` and not yet released.
fn order_rows(rows: &[AnyRow], status: OrderStatus) -> Result<Vec<OrderRow>, StoreError> {
    rows.iter()
        .map(|r| {
            Ok(OrderRow {
                order_id: r.try_get("order_id")?,
                reservation_id: r.try_get("reservation_id")?,
                sale_id: r.try_get("sale_id")?,
                user_id: r.try_get("user_id")?,
                status,
                released_at_ms: None,
            })
        })
        .collect()
}

/// An order row (order_id, reservation_id, sale_id, user_id, status) as the
/// gateway sees it.
fn order_view(row: &AnyRow) -> Result<OrderView, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(OrderView {
        order_id: row.try_get("order_id")?,
        reservation_id: row.try_get("reservation_id")?,
        sale_id: row.try_get("sale_id")?,
        user_id: row.try_get("user_id")?,
        status: OrderStatus::parse(&status)?.reservation_status(),
    })
}

/// `o-` followed by a v4 UUID without dashes. Its random bytes come from
/// the thread's CSPRNG (seeded by the OS) rather than a `getrandom` call
/// per order, which was a few percent of the backend's CPU per order.
fn new_order_id() -> String {
    let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    format!("o-{}", id.simple())
}

/// The reservations sorted by id, each id once. The forward path and the
/// stream consumer insert the same reservations at the same time; taking
/// the unique-index locks in one order keeps their transactions from
/// deadlocking (which PostgreSQL would break only after `deadlock_timeout`,
/// a second). A reservation listed twice is inserted once: the first copy
/// wins, as it would across two batches.
pub(super) fn in_lock_order(reservations: &[Reservation]) -> Vec<&Reservation> {
    let mut sorted: Vec<&Reservation> = reservations.iter().collect();
    sorted.sort_by(|a, b| a.reservation_id.cmp(&b.reservation_id));
    sorted.dedup_by(|later, earlier| later.reservation_id == earlier.reservation_id);
    sorted
}

/// The rows of a chunk as [`sql::INSERT_ORDERS_ARRAYS`] reads them: one
/// PostgreSQL array literal per column, each row's value at the same
/// place, in the order of the chunk (the lock order: the statement
/// inserts in array order).
struct OrderColumns {
    order_ids: String,
    reservation_ids: String,
    sale_ids: String,
    user_ids: String,
    idempotency_keys: String,
    reserved_at_ms: String,
}

impl OrderColumns {
    /// The columns of `chunk`, each row with its new order id from `order_ids`.
    fn of(chunk: &[&Reservation], order_ids: &[String]) -> Self {
        let column = |width: usize| {
            let mut out = String::with_capacity(chunk.len() * (width + 3) + 2);
            out.push('{');
            out
        };
        let mut c = Self {
            order_ids: column(34),
            reservation_ids: column(48),
            sale_ids: column(16),
            user_ids: column(16),
            idempotency_keys: column(16),
            reserved_at_ms: column(13),
        };
        for (i, (r, order_id)) in chunk.iter().zip(order_ids).enumerate() {
            let separator = if i == 0 { "" } else { "," };
            for (out, value) in [
                (&mut c.order_ids, order_id.as_str()),
                (&mut c.reservation_ids, &r.reservation_id),
                (&mut c.sale_ids, &r.sale_id),
                (&mut c.user_ids, &r.user_id),
                (&mut c.idempotency_keys, &r.idempotency_key),
            ] {
                out.push_str(separator);
                push_array_element(out, value);
            }
            c.reserved_at_ms.push_str(separator);
            let _ = write!(c.reserved_at_ms, "{}", r.reserved_at_ms);
        }
        for out in [
            &mut c.order_ids,
            &mut c.reservation_ids,
            &mut c.sale_ids,
            &mut c.user_ids,
            &mut c.idempotency_keys,
            &mut c.reserved_at_ms,
        ] {
            out.push('}');
        }
        c
    }

    /// `statement` (one of the `INSERT_*ORDERS_ARRAYS`) with these
    /// columns and `now` (`created_at_ms`) bound.
    fn bind<'q>(
        &'q self,
        statement: &'q str,
        now: i64,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
        sqlx::query(statement)
            .bind(self.order_ids.as_str())
            .bind(self.reservation_ids.as_str())
            .bind(self.sale_ids.as_str())
            .bind(self.user_ids.as_str())
            .bind(self.idempotency_keys.as_str())
            .bind(self.reserved_at_ms.as_str())
            .bind(now)
    }
}

/// Appends `value` to an array literal as one quoted element: inside the
/// quotes only `"` and `\` are special (backslash-escaped), so any text,
/// commas, braces, spaces or the word NULL included, reads back as itself.
fn push_array_element(out: &mut String, value: &str) {
    out.push('"');
    let mut rest = value;
    while let Some(at) = rest.find(['"', '\\']) {
        out.push_str(&rest[..at]);
        out.push('\\');
        out.push_str(&rest[at..=at]);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

/// An order insert statement with the rows of `chunk` bound, each with its
/// new order id from `order_ids`, in the column order of [`sql::insert_orders`].
fn bind_orders<'q>(
    statement: &'q str,
    chunk: &[&'q Reservation],
    order_ids: &'q [String],
    now: i64,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    let mut query = sqlx::query(statement);
    for (r, order_id) in chunk.iter().zip(order_ids) {
        query = query
            .bind(order_id.as_str())
            .bind(r.reservation_id.as_str())
            .bind(r.sale_id.as_str())
            .bind(r.user_id.as_str())
            .bind(r.idempotency_key.as_str())
            .bind(r.reserved_at_ms)
            .bind(now);
    }
    query
}
