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
//!
//! Layout: one handle, one view per table, each borrowing the handle's
//! pool (a transaction that spans tables is still one transaction, opened
//! by the view that owns the change):
//! - [`Store::orders`] ([`orders`]): orders and their life;
//! - [`Store::sales`] ([`sales`]): sale definitions, payment timeouts,
//!   recorded pauses, and [`SaleWrite`], a sale written under a hold;
//! - [`Store::switch`] ([`switch`]): the global switch (`settings`);
//! - [`Store::outbox`] ([`outbox`]): order events waiting for delivery;
//! - [`Store::locks`] ([`sale_lock`]): the holds of a sale's row that keep
//!   order writes and a re-sync apart ([`OrderWrite`], [`SaleResync`]);
//! - [`schema`] the migrations, `sql` the statements and their dialects.

mod orders;
pub mod outbox;
mod sale_lock;
mod sales;
pub mod schema;
mod sql;
mod switch;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;

pub use orders::{OrderRow, OrderStatus, Orders, Payment};
pub use outbox::Outbox;
pub use sale_lock::{OrderWrite, SaleLocks, SaleResync, SyncedOrder};
pub use sales::{SaleWrite, Sales};
pub use schema::{Flavour, SchemaError};
pub use switch::GlobalSwitch;

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
    /// PostgreSQL chunks still to insert with `ON CONFLICT` before a plain
    /// insert is tried again, after one met an order written by the other
    /// path (see `insert_columns` in [`orders`]).
    conflict_backoff: Arc<std::sync::atomic::AtomicU32>,
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
            conflict_backoff: Arc::default(),
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

    /// The `orders` table.
    pub fn orders(&self) -> Orders<'_> {
        Orders { store: self }
    }

    /// The `sales` table.
    pub fn sales(&self) -> Sales<'_> {
        Sales { store: self }
    }

    /// The global switch (`settings`).
    pub fn switch(&self) -> GlobalSwitch<'_> {
        GlobalSwitch { store: self }
    }

    /// The order events outbox (`order_events`).
    pub fn outbox(&self) -> Outbox<'_> {
        Outbox { store: self }
    }

    /// The holds of sale rows around order writes and re-syncs.
    pub fn locks(&self) -> SaleLocks<'_> {
        SaleLocks { store: self }
    }
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

#[cfg(test)]
mod tests;
