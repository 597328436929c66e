//! The error of the work on sales in Redis and the database (preheating,
//! changing, restoring, returning stock, reconciling, archiving), shared by
//! the modules that do it and mapped to HTTP once, in `api::error`.

use redis::RedisError;

use crate::store::StoreError;

/// Why a sale could not be preheated, changed or viewed.
#[derive(Debug, thiserror::Error)]
pub enum SaleError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("unexpected reply {0:?} from a sale script")]
    BadReply(Vec<i64>),
    /// Another backend is restoring the sale, or this restore must be
    /// tried again (the restore loop does).
    #[error("the sale is being restored into redis")]
    Restoring,
}
