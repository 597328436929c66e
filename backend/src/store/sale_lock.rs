//! Sale locks in the database: what keeps a re-sync of a sale and the
//! writes of its orders from interleaving.
//!
//! An order is written only after its reservation was checked in Redis
//! (see `crate::counted`). Between that check and the commit, the Redis
//! may fail over, and the backend may re-sync the sale into the promoted
//! one (`crate::fence`) by reading the database's orders: an order
//! committed just after that read would be counted nowhere, and its item
//! sold again. So a write holds its sales' rows **shared** from before the
//! check until its commit, and a re-sync holds its sale's row
//! **exclusively** from before it reads the orders until the sale's new
//! Redis counts them all. Either the write commits first and the re-sync
//! reads it, or the write checks its reservations in the re-synced Redis.
//!
//! PostgreSQL: `SELECT ... FOR SHARE` and `FOR UPDATE` on the `sales` row;
//! MySQL: `LOCK IN SHARE MODE` and `FOR UPDATE` (read committed and a 5 s
//! lock wait, set on each connection: `sql::MYSQL_SESSION`).
//! SQLite has one writer at a time: both take the write lock at once with
//! a write that changes nothing, which serialises them (and every other
//! write) for as long as they last.

use flashgate_common::reservation::Reservation;
use sqlx::Row;

use flashgate_common::sale::SaleSpec;

use super::orders::{in_lock_order, order_row};
use super::sales::sale_from_row;
use super::{sql, Flavour, OrderRow, Store, StoreError};

/// Orders being written while their sales are held shared; dropped
/// without [`OrderWrite::commit`], nothing is written.
pub struct OrderWrite {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    store: Store,
}

/// A sale held exclusively while Redis is made to agree with its orders;
/// dropped without [`SaleResync::commit`], the hold ends all the same.
pub struct SaleResync {
    tx: sqlx::Transaction<'static, sqlx::Any>,
    flavour: Flavour,
}

/// One order as a re-sync needs it: the row and its Idempotency-Key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedOrder {
    pub row: OrderRow,
    /// Empty when the buyer sent none.
    pub idempotency_key: String,
    /// When its reservation was made (Redis time, ms).
    pub reserved_at_ms: i64,
}

/// The sale holds of a [`Store`] ([`Store::locks`]).
#[derive(Clone, Copy, Debug)]
pub struct SaleLocks<'a> {
    pub(super) store: &'a Store,
}

impl SaleLocks<'_> {
    /// Opens a transaction that holds the rows of `sale_ids` shared (in id
    /// order, so two writers never wait on each other in a cycle).
    ///
    /// # Errors
    /// A failed statement, or a lock not granted in time.
    pub async fn begin_order_write(&self, sale_ids: &[&str]) -> Result<OrderWrite, StoreError> {
        let mut ids: Vec<&str> = sale_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut tx = self.begin_held().await?;
        for id in ids {
            sqlx::query(&self.store.sql(self.lock_statement(false)))
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        Ok(OrderWrite {
            tx,
            store: self.store.clone(),
        })
    }

    /// Opens a transaction that holds sale `sale_id` exclusively: no order
    /// of it commits until this one ends.
    ///
    /// # Errors
    /// A failed statement, or a lock not granted in time.
    pub async fn begin_resync(&self, sale_id: &str) -> Result<SaleResync, StoreError> {
        let mut tx = self.begin_held().await?;
        sqlx::query(&self.store.sql(self.lock_statement(true)))
            .bind(sale_id)
            .execute(&mut *tx)
            .await?;
        Ok(SaleResync {
            tx,
            flavour: self.store.flavour,
        })
    }

    /// A transaction for a hold. On PostgreSQL: read committed whatever the
    /// server's default, so a re-sync that waited for a write reads it; and
    /// a wait for a hold gives up after 5 s (the write or the re-sync is
    /// retried) instead of keeping a pooled connection. Both are set by the
    /// `BEGIN` itself, one round trip for all three (every order write
    /// opens one of these).
    async fn begin_held(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        if self.store.flavour == Flavour::Postgres {
            return Ok(self.store.pool.begin_with(sql::BEGIN_HELD).await?);
        }
        Ok(self.store.pool.begin().await?)
    }

    fn lock_statement(&self, exclusive: bool) -> &'static str {
        match (self.store.flavour, exclusive) {
            (Flavour::Postgres, false) => sql::HOLD_SALE_SHARED,
            (Flavour::Postgres | Flavour::Mysql, true) => sql::HOLD_SALE_EXCLUSIVE,
            (Flavour::Mysql, false) => sql::HOLD_SALE_SHARED_MYSQL,
            (Flavour::Sqlite, _) => sql::TAKE_WRITE_LOCK,
        }
    }
}

impl OrderWrite {
    /// Inserts `reservations` (each reservation at most once, ever) and
    /// answers the reservation ids this call created orders for.
    ///
    /// # Errors
    /// A failed statement; the transaction is then unusable.
    pub async fn insert(
        &mut self,
        reservations: &[Reservation],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let sorted = in_lock_order(reservations);
        self.store.insert_in(&mut self.tx, &sorted).await
    }

    /// Makes the orders visible and ends the hold.
    ///
    /// # Errors
    /// The commit failed; nothing was written.
    pub async fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit().await?)
    }
}

impl SaleResync {
    /// Every order of the sale, with its Idempotency-Key, as committed
    /// when the hold was taken (none can commit since).
    ///
    /// # Errors
    /// A failed query or an unknown status.
    pub async fn orders(&mut self, sale_id: &str) -> Result<Vec<SyncedOrder>, StoreError> {
        let rows = sqlx::query(&sql::dialect(self.flavour, sql::SALE_ORDERS_WITH_KEYS))
            .bind(sale_id)
            .fetch_all(&mut *self.tx)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(SyncedOrder {
                    row: order_row(r, true)?,
                    idempotency_key: r.try_get("idempotency_key")?,
                    reserved_at_ms: r.try_get("reserved_at_ms")?,
                })
            })
            .collect()
    }

    /// The sale's definition, as committed (no change can commit while the
    /// hold lasts).
    ///
    /// # Errors
    /// A failed query.
    pub async fn sale(&mut self, sale_id: &str) -> Result<Option<SaleSpec>, StoreError> {
        let row = sqlx::query(&sql::dialect(self.flavour, sql::SALE_BY_ID))
            .bind(sale_id)
            .fetch_optional(&mut *self.tx)
            .await?;
        row.as_ref().map(sale_from_row).transpose()
    }

    /// The pause an operator recorded for the sale, as committed (`None`:
    /// unknown sale, or a pause never recorded); see [`Sales::paused`](super::Sales::paused).
    ///
    /// # Errors
    /// A failed query.
    pub async fn paused(&mut self, sale_id: &str) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(&sql::dialect(self.flavour, sql::SALE_PAUSED))
            .bind(sale_id)
            .fetch_optional(&mut *self.tx)
            .await?;
        Ok(row
            .map(|r| r.try_get::<Option<i64>, _>(0))
            .transpose()?
            .flatten()
            .map(|p| p != 0))
    }

    /// Ends the hold.
    ///
    /// # Errors
    /// The database failed; the hold ends with the connection all the same.
    pub async fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit().await?)
    }
}
