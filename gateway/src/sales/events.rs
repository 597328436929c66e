//! Sale events between gateways, over Redis pub/sub.
//!
//! Each gateway subscribes to [`EVENTS_CHANNEL`] and applies what it hears
//! to its [`SaleCache`]: another gateway's sold-out, an operator's change;
//! and another gateway's shop cache purge to its shop cache
//! ([`AnnouncedPurges`]), which also reads the purges on record in Redis
//! each time the subscription stands, so none missed while it was down is
//! lost.
//! A lost subscription is re-established with backoff. Pub/sub delivers at
//! most once, so once it stands again every sold-out flag is cleared: a
//! "changed" sent while it was down is lost (see `sales`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashgate_common::backoff::Backoff;
use flashgate_common::config::RedisConfig;
use flashgate_common::keys::{SaleEvent, EVENTS_CHANNEL};
use flashgate_common::redis_conn::EventSubscription;
use tracing::{debug, info, warn};

use crate::infra::RedisClient;
use crate::infra::{Shutdown, Task};
use crate::sales::switches::Switches;
use crate::sales::{read_stock_epoch, SaleCache};

pub struct EventListener {
    /// Where to subscribe, in the configured `redis.mode`.
    pub redis: RedisConfig,
    /// Reads a changed sale's stock epoch: a sibling of the request
    /// path's client (`RedisClient::sibling`), its connection on this
    /// task's runtime.
    pub client: Arc<RedisClient>,
    pub sales: Arc<SaleCache>,
    pub switches: Arc<Switches>,
    /// Applies other gateways' purges; `None` while the shop cache is off.
    pub shop_cache: Option<Arc<dyn AnnouncedPurges>>,
}

/// Where another gateway's shop cache purge is applied: the edge's shop
/// cache, which this listener knows only through this.
#[async_trait]
pub trait AnnouncedPurges: Send + Sync {
    /// Applies every purge recorded in Redis since the last one applied
    /// (called when the subscription stands, and with each purge
    /// `announced`, which is applied even if it is not on record).
    async fn catch_up(&self, client: &RedisClient, announced: Option<&SaleEvent>);
}

impl EventListener {
    /// Subscribes and applies events until the subscription ends; sets
    /// `subscribed` once the subscription stands.
    async fn listen(&self, subscribed: &mut bool) -> redis::RedisResult<()> {
        let mut events = EventSubscription::subscribe(&self.redis, EVENTS_CHANNEL).await?;
        *subscribed = true;
        // Subscribed: what was announced before is lost, so no flag stands.
        self.sales.clear_all_flags();
        // Purges are on record: those missed meanwhile are applied now.
        if let Some(cache) = &self.shop_cache {
            cache.catch_up(&self.client, None).await;
        }
        while let Some(payload) = events.next().await {
            match SaleEvent::decode(&payload) {
                Some(SaleEvent::SoldOut { sale, epoch }) => {
                    self.sales.flag_sold_out(&sale, Some(epoch), None);
                }
                Some(SaleEvent::BucketSoldOut { sale, bucket }) => {
                    self.sales.mark_bucket_empty(&sale, bucket)
                }
                Some(SaleEvent::BucketStocked { sale, bucket }) => {
                    self.sales.bucket_stocked(&sale, bucket)
                }
                Some(SaleEvent::Changed(id)) => {
                    // Read before the next event is applied: a `sold_out`
                    // announced after this one but decided before the
                    // change is then known to be stale.
                    let epoch = read_stock_epoch(&self.client, &id).await;
                    if let Err(error) = &epoch {
                        warn!(%error, sale = id, "cannot read a changed sale's stock epoch; its older sold outs may flag it until they expire");
                    }
                    self.sales.forget(&id, epoch.ok()).await;
                }
                Some(SaleEvent::AllPaused(paused)) => self.switches.set_all_paused(paused),
                Some(purge @ SaleEvent::ShopPurge { .. }) => {
                    if let Some(cache) = &self.shop_cache {
                        cache.catch_up(&self.client, Some(&purge)).await;
                    }
                }
                None => debug!(payload, "ignoring unknown sale event"),
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Task for EventListener {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        // Logged once per change, not once per retry: Redis may be absent
        // or loading for minutes.
        let mut up: Option<bool> = None;
        loop {
            let mut subscribed = false;
            let result = tokio::select! {
                _ = shutdown.changed() => return,
                result = self.listen(&mut subscribed) => result,
            };
            if subscribed {
                backoff.reset();
                if up != Some(true) {
                    info!("subscribed to sale events");
                }
                up = Some(true);
            }
            let error = result
                .err()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "subscription ended".into());
            if up != Some(false) {
                warn!(%error, "sale events subscription down; retrying until redis answers");
                up = Some(false);
            } else {
                debug!(%error, "sale events subscription still down");
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flashgate_common::keys::SaleKeys;

    use super::*;
    use crate::infra::Breaker;
    use crate::infra::RedisServer;

    /// A listener of its own Redis, running until `shutdown` says so.
    fn listening(redis: &RedisServer) -> (Arc<SaleCache>, tokio::sync::watch::Sender<bool>) {
        let sales = Arc::new(SaleCache::new(Duration::from_millis(250)));
        let client = Arc::new(RedisClient::standalone(
            &redis.url(),
            Duration::from_millis(500),
            Breaker::new(5, Duration::from_secs(1)),
        ));
        let listener = EventListener {
            redis: RedisConfig::standalone(redis.url()),
            client,
            sales: sales.clone(),
            switches: Arc::new(Switches::default()),
            shop_cache: None,
        };
        let (shutdown, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move { listener.run(watch).await });
        (sales, shutdown)
    }

    async fn publish(redis: &RedisServer, message: &str) {
        let () = redis::cmd("PUBLISH")
            .arg(EVENTS_CHANNEL)
            .arg(message)
            .query_async(&mut redis.conn().await)
            .await
            .unwrap();
    }

    /// Waits until `sale` is flagged sold out on `sales` (events are applied in order).
    async fn until_flagged(sales: &SaleCache, sale: &str, redis: &RedisServer, announce: &str) {
        for _ in 0..100 {
            if sales.is_sold_out(sale) {
                return;
            }
            publish(redis, announce).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{sale} never flagged");
    }

    #[tokio::test]
    async fn a_sold_out_announced_after_a_change_but_decided_before_it_flags_nothing() {
        let redis = RedisServer::private();
        let meta = SaleKeys::new("s").meta;
        let () = redis::cmd("HSET")
            .arg(&meta)
            .arg("epoch")
            .arg(5)
            .query_async(&mut redis.conn().await)
            .await
            .unwrap();
        let (sales, _shutdown) = listening(&redis);
        until_flagged(&sales, "s", &redis, "sold_out:s:e5").await;
        // Items come back (the epoch moves on) and the backend announces it.
        let () = redis::cmd("HINCRBY")
            .arg(&meta)
            .arg("epoch")
            .arg(1)
            .query_async(&mut redis.conn().await)
            .await
            .unwrap();
        publish(&redis, "changed:s").await;
        // A gateway's sold out decided before the change, announced after
        // it, in either form; then a marker, applied after both.
        publish(&redis, "sold_out:s:e5").await;
        publish(&redis, "sold_out:s").await;
        until_flagged(&sales, "marker", &redis, "sold_out:marker:e1").await;
        assert!(
            !sales.is_sold_out("s"),
            "a stale sold out flagged the sale while Redis holds stock"
        );
        // A sold out decided at the new epoch flags it.
        until_flagged(&sales, "s", &redis, "sold_out:s:e6").await;
    }

    #[tokio::test]
    async fn every_flag_is_cleared_when_the_subscription_stands_again() {
        let redis = RedisServer::private();
        let (sales, _shutdown) = listening(&redis);
        until_flagged(&sales, "s", &redis, "sold_out:s:e1").await;
        // The subscription drops: a `changed` sent meanwhile would be lost.
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut redis.conn().await)
            .await
            .unwrap();
        for _ in 0..100 {
            if !sales.is_sold_out("s") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("a flag set before the subscription dropped outlived it");
    }
}
