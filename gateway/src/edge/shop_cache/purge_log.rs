//! Purges a gateway missed while it was away: every purge is recorded in
//! the Redis stream [`SHOP_PURGES_STREAM`] (about the last
//! [`SHOP_PURGES_KEPT`]) before it is announced on `fg:events`, and each
//! gateway remembers the id of the last recorded purge it applied.
//!
//! The announcement is only the doorbell: on each one, and each time the
//! `fg:events` subscription stands again (at start and after Redis was
//! cut off), the gateway reads the stream from that id and applies every
//! purge after it, so one announced while its subscription was down is
//! applied on reconnect. Applying a purge twice removes nothing the second
//! time. When the gateway cannot prove it saw every purge since its id (the
//! id was trimmed from the stream, or the stream is gone: Redis lost its
//! data), or has never read the stream while holding responses, it drops
//! its whole cache: it cannot tell which of them were purged. A gateway
//! started after a purge starts empty, and just notes the newest id.

use std::sync::Mutex;

use flashgate_common::keys::{SaleEvent, SHOP_PURGES_KEPT, SHOP_PURGES_STREAM};
use redis::streams::StreamRangeReply;

use super::ShopCache;
use crate::infra::{RedisClient, RedisError};

/// Entries read per `XRANGE`.
const PAGE: usize = 256;

/// The id before every stream id: "the stream was empty when read".
const BEFORE_ALL: &str = "0-0";

/// What one catch-up did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Applied this many recorded purges of other gateways.
    Applied(usize),
    /// Could not prove the cache fresh: dropped this many responses.
    Dropped(usize),
}

/// The last recorded purge this gateway applied.
#[derive(Default)]
pub struct PurgeLog {
    /// `None` until the stream was first read.
    last: Mutex<Option<String>>,
}

async fn range(
    client: &RedisClient,
    start: &str,
    count: usize,
) -> Result<StreamRangeReply, RedisError> {
    client
        .call(|mut conn| async move {
            redis::cmd("XRANGE")
                .arg(SHOP_PURGES_STREAM)
                .arg(start)
                .arg("+")
                .arg("COUNT")
                .arg(count)
                .query_async::<StreamRangeReply>(&mut conn)
                .await
        })
        .await
}

/// The newest recorded purge's id, or [`BEFORE_ALL`].
async fn newest(client: &RedisClient) -> Result<String, RedisError> {
    let reply: StreamRangeReply = client
        .call(|mut conn| async move {
            redis::cmd("XREVRANGE")
                .arg(SHOP_PURGES_STREAM)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async::<StreamRangeReply>(&mut conn)
                .await
        })
        .await?;
    Ok(reply
        .ids
        .into_iter()
        .next()
        .map_or_else(|| BEFORE_ALL.to_owned(), |e| e.id))
}

impl PurgeLog {
    fn set(&self, id: String) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }

    /// Applies to `cache` every recorded purge after the last one applied
    /// (or drops the cache when that cannot be proven); `seen` collects the
    /// events read, so an announcement missing from the stream is known.
    ///
    /// # Errors
    /// When Redis cannot be read; nothing is noted then.
    pub async fn catch_up(
        &self,
        client: &RedisClient,
        cache: &ShopCache,
        seen: &mut Vec<SaleEvent>,
    ) -> Result<CatchUp, RedisError> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let start = match last.as_deref() {
            None => return self.restart(client, cache).await,
            // Nothing is trimmed from a stream shorter than its bound.
            Some(BEFORE_ALL) => {
                let len: usize = client
                    .call(|mut conn| async move {
                        redis::cmd("XLEN")
                            .arg(SHOP_PURGES_STREAM)
                            .query_async::<usize>(&mut conn)
                            .await
                    })
                    .await?;
                if len >= SHOP_PURGES_KEPT {
                    return self.restart(client, cache).await;
                }
                "-".to_owned()
            }
            Some(id) => {
                let found = range(client, id, 1).await?;
                if found.ids.first().map(|e| e.id.as_str()) != Some(id) {
                    return self.restart(client, cache).await;
                }
                format!("({id}")
            }
        };
        let mut start = start;
        let mut applied = 0;
        loop {
            let page = range(client, &start, PAGE).await?;
            let full = page.ids.len() == PAGE;
            for entry in page.ids {
                let event = entry.get::<String>("e").and_then(|e| SaleEvent::decode(&e));
                if let Some(event) = event {
                    if cache.apply_announced(&event) {
                        applied += 1;
                    }
                    seen.push(event);
                }
                start = format!("({}", entry.id);
                self.set(entry.id);
            }
            if !full {
                return Ok(CatchUp::Applied(applied));
            }
        }
    }

    /// Drops what the cache holds (it cannot be proven fresh) and starts
    /// from the newest recorded purge.
    async fn restart(
        &self,
        client: &RedisClient,
        cache: &ShopCache,
    ) -> Result<CatchUp, RedisError> {
        let newest = newest(client).await?;
        let dropped = cache.drop_all();
        self.set(newest);
        Ok(CatchUp::Dropped(dropped))
    }
}
