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
    /// Redis holds the sale with another bucket count than the change:
    /// nothing changed.
    #[error("redis holds the sale with {held} bucket(s), the change says {given}")]
    BucketsDiffer { held: i64, given: u32 },
    /// A bucketed sale Redis lost, which phase 1 cannot rebuild (it has
    /// orders, or some of its buckets survived): left absent, its buys
    /// answer 503 until an operator re-creates it or phase 2's re-sync.
    #[error("the bucketed sale cannot be restored into redis (it has orders or surviving buckets); left absent")]
    LeftAbsent,
    /// A bucket of a bucketed sale could not take a stock change: it is
    /// absent from Redis, or its Redis failed over since it was synced.
    /// What was changed before was given back (or is left to
    /// reconciliation, logged).
    #[error("bucket {bucket} of the sale is {why}; its stock cannot change now")]
    BucketUnavailable { bucket: u32, why: &'static str },
    /// The sale's Redis failed over and the sale is not re-synced yet
    /// (`crate::fence`): its stock cannot change until it is, as its count
    /// may lack the last deducts. Nothing changed.
    #[error("the sale is fenced after a redis failover until it is re-synced; its stock cannot change now")]
    Fenced,
}
