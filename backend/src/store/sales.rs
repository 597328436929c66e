//! The `sales` table: each sale's definition (the truth Redis is rebuilt
//! from), its payment timeout and the pause an operator recorded.

use sqlx::any::AnyRow;
use sqlx::Row;

use flashgate_common::sale::SaleSpec;

use super::{sql, Flavour, Store, StoreError};

/// The sales of a [`Store`] ([`Store::sales`]).
#[derive(Clone, Copy, Debug)]
pub struct Sales<'a> {
    pub(super) store: &'a Store,
}

impl Sales<'_> {
    /// Writes `spec` unless a sale with its id exists. Once written, the row
    /// is the truth: a sale declared in the TOML file whose start defaulted
    /// to "now" keeps its first window across restarts.
    ///
    /// Returns whether the row was written.
    ///
    /// # Errors
    /// A failed query.
    pub async fn insert_if_absent(&self, spec: &SaleSpec) -> Result<bool, StoreError> {
        if self.store.flavour == Flavour::Mysql {
            let done = bind_sale(
                sqlx::query(&self.store.sql(sql::INSERT_SALE)),
                spec,
                flashgate_common::now_ms(),
            )
            .execute(&self.store.pool)
            .await;
            return match done {
                Ok(_) => Ok(true),
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
        let done = bind_sale(
            sqlx::query(&self.store.sql(sql::INSERT_SALE_IF_ABSENT)),
            spec,
            flashgate_common::now_ms(),
        )
        .execute(&self.store.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Creates or replaces the sale `spec.id`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn upsert(&self, spec: &SaleSpec) -> Result<(), StoreError> {
        bind_sale(
            sqlx::query(&self.store.sql(sql::UPSERT_SALE)),
            spec,
            flashgate_common::now_ms(),
        )
        .execute(&self.store.pool)
        .await?;
        Ok(())
    }

    /// Starts a transaction that writes a sale, for callers that must make
    /// another system agree before the write becomes visible (the admin API
    /// updates Redis between [`SaleWrite::upsert`] and [`SaleWrite::commit`]).
    ///
    /// # Errors
    /// No connection could be taken from the pool.
    pub async fn begin_write(&self) -> Result<SaleWrite, StoreError> {
        Ok(SaleWrite {
            tx: self.store.pool.begin().await?,
            flavour: self.store.flavour,
        })
    }

    /// The sale `id`, if known.
    ///
    /// # Errors
    /// A failed query.
    pub async fn get(&self, id: &str) -> Result<Option<SaleSpec>, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::SALE_BY_ID))
            .bind(id)
            .fetch_optional(&self.store.pool)
            .await?;
        row.as_ref().map(sale_from_row).transpose()
    }

    /// Sale `id`'s bucket count, from the database once per store (1 for
    /// a sale the database does not hold: not remembered, it may be
    /// created later).
    ///
    /// # Errors
    /// A failed query.
    pub async fn buckets(&self, id: &str) -> Result<u32, StoreError> {
        if let Some(n) = self
            .store
            .buckets
            .read()
            .ok()
            .and_then(|m| m.get(id).copied())
        {
            return Ok(n);
        }
        let Some(spec) = self.get(id).await? else {
            return Ok(1);
        };
        if let Ok(mut m) = self.store.buckets.write() {
            m.insert(id.to_owned(), spec.buckets);
        }
        Ok(spec.buckets)
    }

    /// Every sale, ordered by id.
    ///
    /// # Errors
    /// A failed query.
    pub async fn all(&self) -> Result<Vec<SaleSpec>, StoreError> {
        let rows = sqlx::query(&self.store.sql(sql::ALL_SALES))
            .fetch_all(&self.store.pool)
            .await?;
        rows.iter().map(sale_from_row).collect()
    }

    /// Sets the payment timeout of sale `id`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_payment_timeout(&self, id: &str, seconds: i64) -> Result<(), StoreError> {
        sqlx::query(&self.store.sql(sql::SET_PAYMENT_TIMEOUT))
            .bind(seconds)
            .bind(id)
            .execute(&self.store.pool)
            .await?;
        Ok(())
    }

    /// The payment timeout of sale `id`, in seconds.
    ///
    /// # Errors
    /// A failed query.
    pub async fn payment_timeout(&self, id: &str) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::PAYMENT_TIMEOUT))
            .bind(id)
            .fetch_optional(&self.store.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
    }

    /// Records whether an operator has sale `id` paused; returns whether
    /// the sale exists. The row is what a sale restored into an empty Redis
    /// gets.
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_paused(&self, id: &str, paused: bool) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.store.sql(sql::SET_SALE_PAUSED))
            .bind(i64::from(paused))
            .bind(id)
            .execute(&self.store.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Whether an operator has sale `id` paused: `None` for an unknown sale
    /// or one whose pause was never recorded (a row made before pauses were
    /// kept in the database).
    ///
    /// # Errors
    /// A failed query.
    pub async fn paused(&self, id: &str) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::SALE_PAUSED))
            .bind(id)
            .fetch_optional(&self.store.pool)
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
    pub async fn pauses(&self) -> Result<Vec<(String, Option<bool>)>, StoreError> {
        let rows = sqlx::query(&self.store.sql(sql::SALE_PAUSES))
            .fetch_all(&self.store.pool)
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
    /// (an operator's [`Sales::set_paused`] always wins); returns
    /// whether it did.
    ///
    /// # Errors
    /// A failed query.
    pub async fn adopt_paused(&self, id: &str, paused: bool) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.store.sql(sql::ADOPT_SALE_PAUSED))
            .bind(i64::from(paused))
            .bind(id)
            .execute(&self.store.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
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

    fn sql<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
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
        .bind(spec.checkout_url.clone())
}

pub(super) fn sale_from_row(row: &AnyRow) -> Result<SaleSpec, StoreError> {
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
        checkout_url: row.try_get("checkout_url")?,
    })
}
