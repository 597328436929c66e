//! The global switch as the database records it (`settings`): what a
//! Redis that lost it is given again.

use flashgate_common::keys::switch_value;
use sqlx::Row;

use super::{sql, Store, StoreError};

/// The global switch of a [`Store`] ([`Store::switch`]).
#[derive(Clone, Copy, Debug)]
pub struct GlobalSwitch<'a> {
    pub(super) store: &'a Store,
}

impl GlobalSwitch<'_> {
    /// Records the global switch (`true` stops every buy).
    ///
    /// # Errors
    /// A failed query.
    pub async fn set_paused(&self, paused: bool) -> Result<(), StoreError> {
        sqlx::query(&self.store.sql(sql::SET_SETTING))
            .bind(sql::SWITCH_SETTING)
            .bind(switch_value(paused))
            .execute(&self.store.pool)
            .await?;
        Ok(())
    }

    /// Records the global switch only if it was never recorded (an
    /// operator's [`GlobalSwitch::set_paused`] always wins).
    ///
    /// # Errors
    /// A failed query.
    pub async fn adopt_paused(&self, paused: bool) -> Result<(), StoreError> {
        sqlx::query(&self.store.sql(sql::ADOPT_SETTING))
            .bind(sql::SWITCH_SETTING)
            .bind(switch_value(paused))
            .execute(&self.store.pool)
            .await?;
        Ok(())
    }

    /// The global switch as last recorded; `None` when never recorded.
    ///
    /// # Errors
    /// A failed query.
    pub async fn paused(&self) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(&self.store.sql(sql::SETTING))
            .bind(sql::SWITCH_SETTING)
            .fetch_optional(&self.store.pool)
            .await?;
        Ok(row
            .map(|r| r.try_get::<String, _>(0))
            .transpose()?
            .map(|v| v == "paused"))
    }
}
