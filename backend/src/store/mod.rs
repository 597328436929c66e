//! The order database: the durable truth of sales and orders.
//!
//! Redis holds the hot counters; this store holds what must survive Redis.
//! One [`Store`] handle (a cloneable pool) serves SQLite, the default for a
//! single box, PostgreSQL and MySQL/MariaDB, through sqlx's `Any` driver, so
//! every query here is written once in the SQL SQLite and PostgreSQL accept
//! (`$N` placeholders, `ON CONFLICT ... DO NOTHING`) and rewritten for
//! MySQL by [`sql::dialect`]. The store tests run the same body against
//! all three databases to keep it that way. The schema is kept by sqlx
//! migrations, one directory per database flavour ([`schema`]).
//!
//! With order events on ([`Store::with_order_events`]), every change of an
//! order (created, paid, cancelled) writes its event to the outbox in the
//! same transaction ([`outbox`]).

pub mod outbox;
mod sale_lock;
pub mod schema;
mod sql;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use flashgate_common::keys::switch_value;
use flashgate_common::reservation::{OrderView, Reservation, ReservationStatus};
use flashgate_common::sale::SaleSpec;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

pub use sale_lock::{OrderWrite, SaleResync, SyncedOrder};
pub use schema::{Flavour, SchemaError};

/// A database problem. Every variant is an infrastructure failure: expected
/// results (an order that already exists, an unknown sale) are `Ok` values.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot prepare the SQLite file {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("cannot switch the SQLite file to WAL: {0}")]
    Wal(#[source] sqlx::Error),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("database query failed: {0}")]
    Query(#[from] sqlx::Error),
    #[error("unknown order status `{0}` in the database")]
    BadStatus(String),
}

/// Rows per INSERT statement. A batch larger than this (only possible with
/// `batch_size` above it) is split into several statements inside the same
/// transaction, because PostgreSQL accepts at most 65535 bind parameters
/// per statement and SQLite 32766; 7 parameters per row x 2000 stays below.
const MAX_ROWS_PER_INSERT: usize = 2000;

/// A cloneable handle to the order database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    flavour: Flavour,
    /// Whether order changes write their events to the outbox.
    events: bool,
    /// Bucket counts of the saved sales, read once per store (shared by
    /// its clones): a saved sale's count never changes
    /// (`PUT /admin/sales/{id}` refuses it, the upsert keeps it), so every
    /// order batch need not ask the database again.
    buckets: Arc<RwLock<HashMap<String, u32>>>,
}

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

impl Store {
    /// Connects to `database_url` (`sqlite:...` or `postgres://...`) and
    /// brings its schema up to date (see [`schema`]). A SQLite file and its
    /// directory are created when absent, and the file is switched to WAL
    /// so readers do not block the consumer's writes.
    ///
    /// # Errors
    /// The directory cannot be created, the database refuses the connection,
    /// or the schema cannot be migrated.
    pub async fn connect(database_url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let flavour = Flavour::of(database_url);
        let url = match flavour {
            Flavour::Sqlite => prepare_sqlite(database_url)?,
            Flavour::Postgres | Flavour::Mysql => database_url.to_owned(),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(if flavour == Flavour::Sqlite { 4 } else { 10 })
            .acquire_timeout(std::time::Duration::from_secs(5))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if flavour == Flavour::Mysql {
                        for statement in sql::MYSQL_SESSION {
                            sqlx::query(statement).execute(&mut *conn).await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .map_err(StoreError::Connect)?;
        if flavour == Flavour::Sqlite {
            // WAL is a property of the file, so setting it once is enough.
            sqlx::query("PRAGMA journal_mode=WAL")
                .execute(&pool)
                .await
                .map_err(StoreError::Wal)?;
        }
        schema::migrate(&pool, flavour).await?;
        Ok(Self {
            pool,
            flavour,
            events: false,
            buckets: Arc::default(),
        })
    }

    /// This store with order events written to the outbox (`on`) or not.
    /// Every backend on one database must agree: an order changed by a
    /// backend with events off has no event.
    #[must_use]
    pub fn with_order_events(mut self, on: bool) -> Self {
        self.events = on;
        self
    }

    /// The database flavour behind this store.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// `text` in this database's dialect (see [`sql::dialect`]).
    fn sql<'a>(&self, text: &'a str) -> Cow<'a, str> {
        sql::dialect(self.flavour, text)
    }

    /// Answers whether the database responds to a trivial query.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// Closes the pool, waiting for connections in use to come back.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Turns reservations into orders with one multi-row insert, in one
    /// transaction. A reservation that already has an order is skipped, so
    /// replaying a batch (after a crash before XACK, or a gateway forward
    /// racing the stream) never creates a second order.
    ///
    /// Returns how many orders this call created.
    ///
    /// # Errors
    /// [`StoreError::Query`] when the transaction fails; nothing is written.
    pub async fn insert_orders(&self, reservations: &[Reservation]) -> Result<u64, StoreError> {
        if reservations.is_empty() {
            return Ok(0);
        }
        let sorted = in_lock_order(reservations);
        let mut tx = self.pool.begin().await?;
        let created = self.insert_in(&mut tx, &sorted).await?;
        tx.commit().await?;
        Ok(created.len() as u64)
    }

    /// The order made from reservation `reservation_id`, if any.
    ///
    /// # Errors
    /// A failed query or an unknown status value in the row.
    pub async fn order_by_reservation(
        &self,
        reservation_id: &str,
    ) -> Result<Option<OrderView>, StoreError> {
        let row = sqlx::query(&self.sql(sql::ORDER_BY_RESERVATION))
            .bind(reservation_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(order_view).transpose()
    }

    /// Orders of `sale_id` that still hold an item (not cancelled).
    ///
    /// # Errors
    /// A failed query.
    pub async fn count_live_orders(&self, sale_id: &str) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.sql(sql::COUNT_LIVE_ORDERS))
            .bind(sale_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Writes `spec` unless a sale with its id exists. Once written, the row
    /// is the truth: a sale declared in the TOML file whose start defaulted
    /// to "now" keeps its first window across restarts.
    ///
    /// Returns whether the row was written.
    ///
    /// # Errors
    /// A failed query.
    pub async fn insert_sale_if_absent(&self, spec: &SaleSpec) -> Result<bool, StoreError> {
        if self.flavour == Flavour::Mysql {
            let done = bind_sale(
                sqlx::query(&self.sql(sql::INSERT_SALE)),
                spec,
                flashgate_common::now_ms(),
            )
            .execute(&self.pool)
            .await;
            return match done {
                Ok(_) => Ok(true),
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
        let done = bind_sale(
            sqlx::query(&self.sql(sql::INSERT_SALE_IF_ABSENT)),
            spec,
            flashgate_common::now_ms(),
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Creates or replaces the sale `spec.id`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn upsert_sale(&self, spec: &SaleSpec) -> Result<(), StoreError> {
        bind_sale(
            sqlx::query(&self.sql(sql::UPSERT_SALE)),
            spec,
            flashgate_common::now_ms(),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Starts a transaction that writes a sale, for callers that must make
    /// another system agree before the write becomes visible (the admin API
    /// updates Redis between [`SaleWrite::upsert`] and [`SaleWrite::commit`]).
    ///
    /// # Errors
    /// No connection could be taken from the pool.
    pub async fn begin_sale_write(&self) -> Result<SaleWrite, StoreError> {
        Ok(SaleWrite {
            tx: self.pool.begin().await?,
            flavour: self.flavour,
        })
    }

    /// The sale `id`, if known.
    ///
    /// # Errors
    /// A failed query.
    pub async fn sale(&self, id: &str) -> Result<Option<SaleSpec>, StoreError> {
        let row = sqlx::query(&self.sql(sql::SALE_BY_ID))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sale_from_row).transpose()
    }

    /// Sale `id`'s bucket count, from the database once per store (1 for
    /// a sale the database does not hold: not remembered, it may be
    /// created later).
    ///
    /// # Errors
    /// A failed query.
    pub async fn sale_buckets(&self, id: &str) -> Result<u32, StoreError> {
        if let Some(n) = self.buckets.read().ok().and_then(|m| m.get(id).copied()) {
            return Ok(n);
        }
        let Some(spec) = self.sale(id).await? else {
            return Ok(1);
        };
        if let Ok(mut m) = self.buckets.write() {
            m.insert(id.to_owned(), spec.buckets);
        }
        Ok(spec.buckets)
    }

    /// Every sale, ordered by id.
    ///
    /// # Errors
    /// A failed query.
    pub async fn sales(&self) -> Result<Vec<SaleSpec>, StoreError> {
        let rows = sqlx::query(&self.sql(sql::ALL_SALES))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(sale_from_row).collect()
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

/// Error codes of a statement that waited too long for a lock, or lost a
/// race, rather than being refused for its data: SQLite `BUSY`, `LOCKED`
/// and `BUSY_SNAPSHOT`; PostgreSQL `lock_not_available` (a hold's
/// `lock_timeout`), `serialization_failure`, `deadlock_detected`,
/// `query_canceled`; MySQL's deadlock (SQLSTATE `40001`). Retried like an
/// unreachable database, never counted against an entry.
const WAITED_TOO_LONG: &[&str] = &["5", "6", "517", "55P03", "40001", "40P01", "57014"];

/// MySQL error numbers of the same kind, whose SQLSTATE (`HY000`, `70100`,
/// `08S01`) is too general to tell: 1205 lock wait timeout, 1213 deadlock,
/// 1969 statement timeout (MariaDB `max_statement_time`), 3024 statement
/// timeout (MySQL `max_execution_time`), 1317 query interrupted (`KILL
/// QUERY`), 1927 connection killed (MariaDB), 1053 server shutting down.
const MYSQL_WAITED_TOO_LONG: &[u16] = &[1053, 1205, 1213, 1317, 1927, 1969, 3024];

impl StoreError {
    /// Whether the database answered with an error about this statement
    /// (a constraint, a trigger, bad data), as opposed to being unreachable.
    pub fn is_rejection(&self) -> bool {
        match self {
            StoreError::Query(sqlx::Error::Database(e)) => {
                let mysql_wait = e
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|m| MYSQL_WAITED_TOO_LONG.contains(&m.number()));
                !mysql_wait
                    && !e
                        .code()
                        .is_some_and(|c| WAITED_TOO_LONG.contains(&c.as_ref()))
            }
            _ => false,
        }
    }
}

impl Store {
    /// Sets the payment timeout of sale `id`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_payment_timeout(&self, id: &str, seconds: i64) -> Result<(), StoreError> {
        sqlx::query(&self.sql(sql::SET_PAYMENT_TIMEOUT))
            .bind(seconds)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The payment timeout of sale `id`, in seconds.
    ///
    /// # Errors
    /// A failed query.
    pub async fn payment_timeout(&self, id: &str) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(&self.sql(sql::PAYMENT_TIMEOUT))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
    }

    /// Records whether an operator has sale `id` paused; returns whether
    /// the sale exists. The row is what a sale restored into an empty Redis
    /// gets.
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_sale_paused(&self, id: &str, paused: bool) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql(sql::SET_SALE_PAUSED))
            .bind(i64::from(paused))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Whether an operator has sale `id` paused: `None` for an unknown sale
    /// or one whose pause was never recorded (a row made before pauses were
    /// kept in the database).
    ///
    /// # Errors
    /// A failed query.
    pub async fn sale_paused(&self, id: &str) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(&self.sql(sql::SALE_PAUSED))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row
            .map(|r| r.try_get::<Option<i64>, _>(0))
            .transpose()?
            .flatten()
            .map(|p| p != 0))
    }

    /// Every sale's recorded pause, by id; `None` where never recorded.
    ///
    /// # Errors
    /// A failed query.
    pub async fn sale_pauses(&self) -> Result<Vec<(String, Option<bool>)>, StoreError> {
        let rows = sqlx::query(&self.sql(sql::SALE_PAUSES))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>(0)?,
                    r.try_get::<Option<i64>, _>(1)?.map(|p| p != 0),
                ))
            })
            .collect()
    }

    /// Records `paused` for sale `id` only if its row never recorded a pause
    /// (an operator's [`Store::set_sale_paused`] always wins); returns
    /// whether it did.
    ///
    /// # Errors
    /// A failed query.
    pub async fn adopt_sale_paused(&self, id: &str, paused: bool) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql(sql::ADOPT_SALE_PAUSED))
            .bind(i64::from(paused))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records the global switch (`true` stops every buy).
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_all_paused(&self, paused: bool) -> Result<(), StoreError> {
        sqlx::query(&self.sql(sql::SET_SETTING))
            .bind(sql::SWITCH_SETTING)
            .bind(switch_value(paused))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records the global switch only if it was never recorded (an
    /// operator's [`Store::set_all_paused`] always wins).
    ///
    /// # Errors
    /// A failed query.
    pub async fn adopt_all_paused(&self, paused: bool) -> Result<(), StoreError> {
        sqlx::query(&self.sql(sql::ADOPT_SETTING))
            .bind(sql::SWITCH_SETTING)
            .bind(switch_value(paused))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The global switch as last recorded; `None` when never recorded.
    ///
    /// # Errors
    /// A failed query.
    pub async fn all_paused(&self) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(&self.sql(sql::SETTING))
            .bind(sql::SWITCH_SETTING)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row
            .map(|r| r.try_get::<String, _>(0))
            .transpose()?
            .map(|v| v == "paused"))
    }

    /// The order `order_id`, if any.
    ///
    /// # Errors
    /// A failed query.
    pub async fn order(&self, order_id: &str) -> Result<Option<OrderRow>, StoreError> {
        let row = sqlx::query(&self.sql(sql::ORDER_BY_ID))
            .bind(order_id)
            .fetch_optional(&self.pool)
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
        Ok(match self.order(order_id).await? {
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
    /// sale's stock, so [`Store::mark_released`] writes it once it is.
    pub async fn cancel_if_unpaid(&self, order_id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sql(sql::CANCEL_IF_CREATED))
            .bind(order_id)
            .execute(&self.pool)
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
        if !self.events {
            let done = sqlx::query(&self.sql(statement))
                .bind(order_id)
                .execute(&self.pool)
                .await?;
            return Ok(done.rows_affected() == 1);
        }
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(&self.sql(statement))
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        let changed = done.rows_affected() == 1;
        if changed {
            let row = sqlx::query(&self.sql(sql::ORDER_BY_ID))
                .bind(order_id)
                .fetch_one(&mut *tx)
                .await?;
            let order = order_row(&row, false)?;
            let event = outbox::NewEvent::new(kind, &order, flashgate_common::now_ms());
            outbox::write(&mut tx, self.flavour, &[event]).await?;
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Up to `limit` unpaid orders whose sale's payment timeout passed at `now_ms`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn expired_orders(
        &self,
        now_ms: i64,
        limit: i64,
    ) -> Result<Vec<OrderRow>, StoreError> {
        let rows = sqlx::query(&self.sql(sql::EXPIRED_ORDERS))
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.pool)
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
        let rows = sqlx::query(&self.sql(sql::UNRELEASED_CANCELLED))
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        order_rows(&rows, OrderStatus::Cancelled)
    }

    /// Orders of `sale_id` waiting for a payment or for their item's return.
    ///
    /// # Errors
    /// A failed query.
    pub async fn unsettled_orders(&self, sale_id: &str) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.sql(sql::UNSETTLED_ORDERS))
            .bind(sale_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Which of `reservation_ids` have an order (at most
    /// [`MAX_ROWS_PER_INSERT`] per query).
    ///
    /// # Errors
    /// A failed query.
    pub async fn reservations_with_orders(
        &self,
        reservation_ids: &[&str],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let mut found = std::collections::HashSet::new();
        for chunk in reservation_ids.chunks(MAX_ROWS_PER_INSERT) {
            let statement = sql::orders_by_reservations(chunk.len());
            let statement = self.sql(&statement);
            let mut query = sqlx::query(&statement);
            for rid in chunk {
                query = query.bind(*rid);
            }
            for row in query.fetch_all(&self.pool).await? {
                found.insert(row.try_get::<String, _>("reservation_id")?);
            }
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
        if !self.events {
            sqlx::query(&self.sql(sql::MARK_RELEASED))
                .bind(at_ms)
                .bind(order_id)
                .execute(&self.pool)
                .await?;
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(&self.sql(sql::MARK_RELEASED))
            .bind(at_ms)
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 1 {
            let row = sqlx::query(&self.sql(sql::ORDER_BY_ID))
                .bind(order_id)
                .fetch_one(&mut *tx)
                .await?;
            let order = order_row(&row, false)?;
            outbox::write(
                &mut tx,
                self.flavour,
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
    pub async fn sale_orders(&self, sale_id: &str) -> Result<Vec<OrderRow>, StoreError> {
        let rows = sqlx::query(&self.sql(sql::SALE_ORDERS))
            .bind(sale_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| order_row(r, true)).collect()
    }

    /// Answers whether an order row can be written right now, by writing a
    /// probe row in a transaction that is rolled back. Tells a database
    /// that refuses every write (read-only, full, down) from one entry
    /// that the database rejects on its own.
    pub async fn writable(&self) -> bool {
        let probe = async {
            let mut tx = self.pool.begin().await?;
            let statement = sql::insert_orders(1);
            let statement = self.sql(&statement);
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

fn order_row(row: &AnyRow, with_released: bool) -> Result<OrderRow, StoreError> {
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

/// An open transaction writing one sale; dropped without
/// [`SaleWrite::commit`], it rolls back.
pub struct SaleWrite {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    flavour: Flavour,
}

impl SaleWrite {
    /// The saved sale `id`, read under an exclusive hold of its row (`FOR
    /// UPDATE` on PostgreSQL and MySQL, the write lock on SQLite) so no
    /// other change commits between this read and the commit.
    ///
    /// # Errors
    /// A failed query.
    pub async fn held(&mut self, id: &str) -> Result<Option<SaleSpec>, StoreError> {
        let lock = if self.flavour == Flavour::Sqlite {
            sql::TAKE_WRITE_LOCK
        } else {
            sql::HOLD_SALE_EXCLUSIVE
        };
        sqlx::query(&self.sql(lock))
            .bind(id)
            .execute(&mut *self.tx)
            .await?;
        let row = sqlx::query(&self.sql(sql::SALE_BY_ID))
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await?;
        row.as_ref().map(sale_from_row).transpose()
    }

    /// Creates or replaces the sale inside the transaction.
    ///
    /// # Errors
    /// A failed query.
    pub async fn upsert(&mut self, spec: &SaleSpec) -> Result<(), StoreError> {
        bind_sale(
            sqlx::query(&self.sql(sql::UPSERT_SALE)),
            spec,
            flashgate_common::now_ms(),
        )
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Sets the sale's payment timeout inside the transaction.
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_payment_timeout(&mut self, id: &str, seconds: i64) -> Result<(), StoreError> {
        sqlx::query(&self.sql(sql::SET_PAYMENT_TIMEOUT))
            .bind(seconds)
            .bind(id)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    /// Makes the write visible.
    ///
    /// # Errors
    /// The commit failed; nothing was written.
    pub async fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit().await?)
    }

    fn sql<'a>(&self, text: &'a str) -> Cow<'a, str> {
        sql::dialect(self.flavour, text)
    }
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

fn bind_sale<'q>(query: AnyQuery<'q>, spec: &SaleSpec, now: i64) -> AnyQuery<'q> {
    query
        .bind(spec.id.clone())
        .bind(spec.name.clone())
        .bind(spec.stock)
        .bind(spec.per_user_limit)
        .bind(spec.starts_at_ms)
        .bind(spec.ends_at_ms)
        .bind(now)
        .bind(spec.draw_window_ms)
        .bind(i64::from(spec.buckets))
}

fn sale_from_row(row: &AnyRow) -> Result<SaleSpec, StoreError> {
    Ok(SaleSpec {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        stock: row.try_get("stock")?,
        per_user_limit: row.try_get("per_user_limit")?,
        starts_at_ms: row.try_get("starts_at_ms")?,
        ends_at_ms: row.try_get("ends_at_ms")?,
        draw_window_ms: row.try_get("draw_window_ms")?,
        // 1 to 64 by the validation of every writer; anything else read
        // back is treated as one bucket, the layout that needs nothing.
        buckets: u32::try_from(row.try_get::<i64, _>("buckets")?)
            .ok()
            .filter(|b| (1..=64).contains(b))
            .unwrap_or(1),
    })
}

/// `o-` followed by a v4 UUID without dashes.
fn new_order_id() -> String {
    format!("o-{}", uuid::Uuid::new_v4().simple())
}

/// Creates the directory of a SQLite file and makes sure the URL asks for
/// the file to be created (`mode=rwc`) when it does not say otherwise.
fn prepare_sqlite(url: &str) -> Result<String, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let in_memory = path.is_empty() || path == ":memory:";
    if !in_memory {
        if let Some(dir) = Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: path.to_owned(),
                source,
            })?;
        }
    }
    Ok(match query {
        Some(q) if q.split('&').any(|kv| kv.starts_with("mode=")) => url.to_owned(),
        Some(_) => format!("{url}&mode=rwc"),
        None => format!("{url}?mode=rwc"),
    })
}

impl Store {
    /// Inserts `sorted` (see [`in_lock_order`]) inside `tx`, skipping
    /// reservations that already have an order, and writes the
    /// `order.created` event of each new order when events are on.
    /// Answers the reservation ids that got an order from this call.
    async fn insert_in(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        sorted: &[&Reservation],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let now = flashgate_common::now_ms();
        let mut created = std::collections::HashSet::new();
        let mut events = Vec::new();
        for chunk in sorted.chunks(MAX_ROWS_PER_INSERT) {
            let order_ids: Vec<String> = chunk.iter().map(|_| new_order_id()).collect();
            let mut new_here = std::collections::HashSet::new();
            if self.flavour == Flavour::Mysql {
                // No `INSERT ... RETURNING` through sqlx on MySQL: the rows
                // this call made are the ones holding the order ids it chose.
                let statement = self.sql(&sql::insert_orders(chunk.len())).into_owned();
                bind_orders(&statement, chunk, &order_ids, now)
                    .execute(&mut **tx)
                    .await?;
                let select = self.sql(&sql::orders_by_ids(order_ids.len())).into_owned();
                let mut query = sqlx::query(&select);
                for id in &order_ids {
                    query = query.bind(id.as_str());
                }
                for row in query.fetch_all(&mut **tx).await? {
                    new_here.insert(row.try_get::<String, _>("reservation_id")?);
                }
            } else {
                let statement = sql::insert_orders_returning(chunk.len());
                for row in bind_orders(&statement, chunk, &order_ids, now)
                    .fetch_all(&mut **tx)
                    .await?
                {
                    new_here.insert(row.try_get::<String, _>("reservation_id")?);
                }
            }
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
}

#[cfg(test)]
mod tests;

/// Order rows of a query selecting order_id, reservation_id, sale_id and
/// user_id, all known to be in `status` and not yet released.
fn order_rows(
    rows: &[sqlx::any::AnyRow],
    status: OrderStatus,
) -> Result<Vec<OrderRow>, StoreError> {
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
fn order_view(row: &sqlx::any::AnyRow) -> Result<OrderView, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(OrderView {
        order_id: row.try_get("order_id")?,
        reservation_id: row.try_get("reservation_id")?,
        sale_id: row.try_get("sale_id")?,
        user_id: row.try_get("user_id")?,
        status: OrderStatus::parse(&status)?.reservation_status(),
    })
}

/// The reservations sorted by id, each id once. The forward path and the
/// stream consumer insert the same reservations at the same time; taking
/// the unique-index locks in one order keeps their transactions from
/// deadlocking (which PostgreSQL would break only after `deadlock_timeout`,
/// a second). A reservation listed twice is inserted once: the first copy
/// wins, as it would across two batches.
fn in_lock_order(reservations: &[Reservation]) -> Vec<&Reservation> {
    let mut sorted: Vec<&Reservation> = reservations.iter().collect();
    sorted.sort_by(|a, b| a.reservation_id.cmp(&b.reservation_id));
    sorted.dedup_by(|later, earlier| later.reservation_id == earlier.reservation_id);
    sorted
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
