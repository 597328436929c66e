//! Sale events between gateways, over Redis pub/sub.
//!
//! Each gateway subscribes to [`EVENTS_CHANNEL`] and applies what it hears
//! to its [`SaleCache`]: another gateway's sold-out, an operator's change;
//! and another gateway's shop cache purge to its [`ShopCache`].
//! A lost subscription is re-established with backoff; while it is down
//! the local flags still expire on their own (see `sales`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashgate_common::backoff::Backoff;
use flashgate_common::config::RedisConfig;
use flashgate_common::keys::{SaleEvent, EVENTS_CHANNEL};
use flashgate_common::redis_conn::EventSubscription;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tracing::{debug, info, warn};

use crate::sales::SaleCache;
use crate::shop_cache::ShopCache;
use crate::switches::Switches;

pub struct EventListener {
    /// Where to subscribe, in the configured `redis.mode`.
    pub redis: RedisConfig,
    pub sales: Arc<SaleCache>,
    pub switches: Arc<Switches>,
    /// Applies other gateways' purges; `None` while the shop cache is off.
    pub shop_cache: Option<Arc<ShopCache>>,
}

impl EventListener {
    /// Subscribes and applies events until the subscription ends; sets
    /// `subscribed` once the subscription stands.
    async fn listen(&self, subscribed: &mut bool) -> redis::RedisResult<()> {
        let mut events = EventSubscription::subscribe(&self.redis, EVENTS_CHANNEL).await?;
        *subscribed = true;
        while let Some(payload) = events.next().await {
            match SaleEvent::decode(&payload) {
                Some(SaleEvent::SoldOut(id)) => self.sales.mark_sold_out(&id),
                Some(SaleEvent::BucketSoldOut { sale, bucket }) => self.sales.mark_bucket_empty(&sale, bucket),
                Some(SaleEvent::BucketStocked { sale, bucket }) => self.sales.bucket_stocked(&sale, bucket).await,
                Some(SaleEvent::Changed(id)) => self.sales.forget(&id).await,
                Some(SaleEvent::AllPaused(paused)) => self.switches.set_all_paused(paused),
                Some(purge @ SaleEvent::ShopPurge { .. }) => {
                    if let Some(cache) = &self.shop_cache {
                        cache.apply_announced(&purge);
                    }
                }
                None => debug!(payload, "ignoring unknown sale event"),
            }
        }
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for EventListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
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
            let error = result.err().map(|e| e.to_string()).unwrap_or_else(|| "subscription ended".into());
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

pub use flashgate_common::keys::publish;
