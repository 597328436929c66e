//! The optional cluster-wide global limit (`[limits.cluster_global]`, off
//! by default): one GCRA bucket in Redis (`lua/gcra.lua`) shared by every
//! gateway, for when the total buy rate reaching the backend must be exact
//! however many gateways run.
//!
//! The trade-off: it costs every admitted buy a second Redis round trip and
//! makes one key (`fg:{limit}:global`, `keys::CLUSTER_GLOBAL_LIMIT`) the hottest in the cluster (a single
//! slot), so it caps throughput at what one Redis shard does for that key.
//! The per-gateway global bucket (`limits.buy.global`, divided by the
//! number of gateways) is free and usually close enough. If Redis does not
//! answer, the buy is refused with 503 like any other Redis failure.

use std::time::Duration;

use flashgate_common::config::Bucket;
use flashgate_common::keys::CLUSTER_GLOBAL_LIMIT;

use crate::admission::limits::{Limited, RouteClass, Scope};
use crate::infra::{RedisClient, RedisError};

pub struct ClusterLimit {
    bucket: Bucket,
    script: redis::Script,
}

impl ClusterLimit {
    pub fn new(bucket: Bucket) -> Self {
        Self {
            bucket,
            script: flashgate_common::scripts::GCRA.clone(),
        }
    }

    /// Takes one token from the shared bucket.
    ///
    /// # Errors
    /// `Ok(Err(Limited))` when empty; `Err` when Redis fails.
    pub async fn check(&self, redis: &RedisClient) -> Result<Result<(), Limited>, RedisError> {
        let interval_ms = 1000.0 / f64::from(self.bucket.per_second.get());
        let tolerance_ms = interval_ms * f64::from(self.bucket.burst.get() - 1);
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(CLUSTER_GLOBAL_LIMIT)
            .arg(interval_ms)
            .arg(tolerance_ms);
        let (allowed, wait_ms): (i64, i64) = redis
            .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        Ok(if allowed == 1 {
            Ok(())
        } else {
            Err(Limited {
                class: RouteClass::Buy,
                scope: Scope::Cluster,
                bucket: self.bucket,
                retry_after: Duration::from_millis(wait_ms.max(1) as u64),
            })
        })
    }
}
