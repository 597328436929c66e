//! One sale as the gateway reads it from Redis: its meta hash and its
//! remaining stock, in one pipelined round trip, and what is derived from
//! that read (the window a buy is checked against, the view buyers poll).
//! Values only: nothing here caches or answers HTTP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};

use flashgate_common::keys::SaleKeys;
use flashgate_common::rfc3339;
use flashgate_common::sale::{SaleSpec, SaleState};
use serde::Serialize;

use crate::infra::{RedisClient, RedisError};

/// A sale's window: all a buy needs to be answered without the script
/// before the start, after the end or while paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleWindow {
    pub starts_at_ms: i64,
    pub ends_at_ms: i64,
    pub paused: bool,
    /// How many buckets the sale's stock is split over (meta `buckets`,
    /// 1 when absent): where a buy runs (see `flashgate_common::buckets`).
    pub buckets: u32,
}

/// Where `now` falls in a sale's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowCheck {
    Open,
    /// Carries the whole seconds until the start (at least 1).
    NotStarted {
        wait_secs: u64,
    },
    Ended,
    Paused,
}

impl SaleWindow {
    /// Ended wins over paused, paused over not started: the order the
    /// deduct script checks them in.
    pub fn check(&self, now_ms: i64) -> WindowCheck {
        if now_ms >= self.ends_at_ms {
            WindowCheck::Ended
        } else if self.paused {
            WindowCheck::Paused
        } else if now_ms < self.starts_at_ms {
            WindowCheck::NotStarted {
                wait_secs: ((self.starts_at_ms - now_ms) as u64).div_ceil(1000),
            }
        } else {
            WindowCheck::Open
        }
    }
}

/// What one read of a sale's keys said.
#[derive(Debug)]
pub struct SaleSnapshot {
    pub window: SaleWindow,
    /// The rest of the listing; `None` when the meta hash lacks a field the
    /// view needs (the window alone still answers buys, as the script does).
    pub spec: Option<SaleSpec>,
    /// The sale's checkout template (meta `checkout_url`), for the buy
    /// answers of its winners; apart from `spec` so that a buy never
    /// depends on the view's fields.
    pub checkout_url: Option<String>,
    /// As read, minus this gateway's wins since: a buyer polling the sale
    /// right after winning sees their item gone, even though the buy path
    /// read the snapshot just before. Other gateways' wins show at the
    /// next read.
    remaining: AtomicI64,
}

/// A sale as buyers see it (`GET /flashgate/api/sales/{id}`).
#[derive(Debug, Serialize)]
pub struct SaleView {
    pub id: String,
    pub name: String,
    pub state: SaleState,
    pub starts_at: String,
    pub ends_at: String,
    pub server_time: String,
    pub stock: i64,
    pub remaining: i64,
}

/// One entry of the sale list (`GET /flashgate/api/sales`).
#[derive(Debug, Serialize)]
pub struct SaleSummary {
    pub id: String,
    pub name: String,
    pub state: SaleState,
    pub starts_at: String,
    pub ends_at: String,
}

impl SaleSnapshot {
    /// The view buyers see at `now_ms`: rendered per request, so the state
    /// flips to open exactly at the start and `server_time` (which the
    /// page's countdown syncs to) is always the current time.
    pub fn view(&self, now_ms: i64) -> Option<SaleView> {
        let spec = self.spec.as_ref()?;
        let remaining = self.remaining();
        Some(SaleView {
            id: spec.id.clone(),
            name: spec.name.clone(),
            state: SaleState::at(now_ms, spec, self.window.paused, remaining),
            starts_at: rfc3339(spec.starts_at_ms),
            ends_at: rfc3339(spec.ends_at_ms),
            server_time: rfc3339(now_ms),
            stock: spec.stock,
            remaining: remaining.max(0),
        })
    }

    pub fn remaining(&self) -> i64 {
        self.remaining.load(Ordering::Relaxed)
    }

    /// Counts a win of this gateway's: one item fewer.
    pub fn took_one(&self) {
        self.remaining.fetch_sub(1, Ordering::Relaxed);
    }

    /// The script found the sale sold out.
    pub fn sold_out(&self) {
        self.remaining.store(0, Ordering::Relaxed);
    }

    /// The sale's entry in the list at `now_ms`.
    pub fn summary(&self, now_ms: i64) -> Option<SaleSummary> {
        let v = self.view(now_ms)?;
        Some(SaleSummary {
            id: v.id,
            name: v.name,
            state: v.state,
            starts_at: v.starts_at,
            ends_at: v.ends_at,
        })
    }
}

/// Reads a sale's meta hash and remaining stock in one round trip (a
/// bucketed sale's remaining: one more read per bucket); `None` when the
/// sale is not in Redis.
///
/// # Errors
/// When Redis fails or times out.
pub async fn read_snapshot(
    redis: &RedisClient,
    sale_id: &str,
) -> Result<Option<SaleSnapshot>, RedisError> {
    let keys = SaleKeys::new(sale_id);
    let mut pipe = redis::pipe();
    pipe.hgetall(&keys.meta).get(&keys.remaining);
    let (meta, remaining): (HashMap<String, String>, Option<i64>) = redis
        .call(|mut conn| async move { pipe.query_async(&mut conn).await })
        .await?;
    let Some(snapshot) = parse(sale_id, &meta, remaining.unwrap_or(0)) else {
        return Ok(None);
    };
    if snapshot.window.buckets > 1 {
        // The items are in the buckets (and in transit between them): a
        // display figure for `GET /flashgate/api/sales/{id}` only. The buy path needs
        // the window above, so a bucket that cannot be read is left out of
        // the sum (logged) rather than failing the snapshot.
        let mut left = 0;
        for k in 0..snapshot.window.buckets {
            match redis
                .call(|mut conn| async move {
                    flashgate_common::transfer::left_in(&mut conn, sale_id, k).await
                })
                .await
            {
                Ok(n) => left += n,
                Err(error) => {
                    tracing::debug!(%error, sale = sale_id, bucket = k, "bucket left out of the remaining items")
                }
            }
        }
        snapshot.remaining.store(left, Ordering::Relaxed);
    }
    Ok(Some(snapshot))
}

/// The sale's stock epoch (`lua/release.lua`; 0 when unset or the sale
/// is absent).
///
/// # Errors
/// When Redis fails or times out.
pub async fn read_stock_epoch(redis: &RedisClient, sale_id: &str) -> Result<u64, RedisError> {
    let meta = SaleKeys::new(sale_id).meta;
    let epoch: Option<u64> = redis
        .call(|mut conn| async move {
            redis::cmd("HGET")
                .arg(meta)
                .arg("epoch")
                .query_async(&mut conn)
                .await
        })
        .await?;
    Ok(epoch.unwrap_or(0))
}

/// A snapshot from the meta hash: a sale exists for buys when its window
/// parses, for the view when every listed field does.
pub fn parse(
    sale_id: &str,
    meta: &HashMap<String, String>,
    remaining: i64,
) -> Option<SaleSnapshot> {
    let int = |k: &str| meta.get(k).and_then(|v| v.parse::<i64>().ok());
    let window = SaleWindow {
        starts_at_ms: int("starts_at_ms")?,
        ends_at_ms: int("ends_at_ms")?,
        paused: meta.get("paused").is_some_and(|p| p == "1"),
        buckets: int("buckets")
            .and_then(|b| u32::try_from(b).ok())
            .filter(|b| (1..=64).contains(b))
            .unwrap_or(1),
    };
    let spec = (|| {
        Some(SaleSpec {
            id: sale_id.to_owned(),
            name: meta.get("name")?.clone(),
            stock: int("stock")?,
            per_user_limit: int("per_user_limit")?,
            starts_at_ms: window.starts_at_ms,
            ends_at_ms: window.ends_at_ms,
            draw_window_ms: int("draw_window_ms"),
            buckets: window.buckets,
            checkout_url: meta.get("checkout_url").cloned(),
        })
    })();
    Some(SaleSnapshot {
        window,
        spec,
        checkout_url: meta.get("checkout_url").cloned(),
        remaining: AtomicI64::new(remaining),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(fields: &[(&str, &str)]) -> HashMap<String, String> {
        fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_view_is_rendered_at_request_time() {
        let m = meta(&[
            ("name", "Sneaker"),
            ("stock", "10"),
            ("per_user_limit", "1"),
            ("starts_at_ms", "1000"),
            ("ends_at_ms", "5000"),
        ]);
        let s = parse("s", &m, 3).unwrap();
        assert_eq!(s.view(999).unwrap().state, SaleState::Upcoming);
        let open = s.view(1000).unwrap();
        assert_eq!(
            (open.state, open.remaining, open.stock),
            (SaleState::Open, 3, 10)
        );
        assert_eq!(open.server_time, rfc3339(1000));
        assert_eq!(
            parse("s", &m, 0).unwrap().view(2000).unwrap().state,
            SaleState::SoldOut
        );
        assert!(parse("s", &HashMap::new(), 3).is_none());
    }

    #[test]
    fn the_bucket_count_comes_from_the_meta_and_defaults_to_one() {
        let m = meta(&[("starts_at_ms", "1000"), ("ends_at_ms", "5000")]);
        assert_eq!(parse("s", &m, 3).unwrap().window.buckets, 1);
        let m = meta(&[
            ("starts_at_ms", "1000"),
            ("ends_at_ms", "5000"),
            ("buckets", "6"),
        ]);
        assert_eq!(parse("s", &m, 3).unwrap().window.buckets, 6);
        let m = meta(&[
            ("starts_at_ms", "1000"),
            ("ends_at_ms", "5000"),
            ("buckets", "0"),
        ]);
        assert_eq!(
            parse("s", &m, 3).unwrap().window.buckets,
            1,
            "nonsense is one bucket"
        );
    }

    #[test]
    fn a_window_without_the_listing_still_answers_buys_but_no_view() {
        let s = parse(
            "s",
            &meta(&[
                ("starts_at_ms", "1000"),
                ("ends_at_ms", "5000"),
                ("paused", "1"),
            ]),
            3,
        )
        .unwrap();
        assert!(s.view(2000).is_none());
        assert_eq!(s.window.check(2000), WindowCheck::Paused);
    }

    #[test]
    fn window_checks_follow_the_scripts_order() {
        let w = SaleWindow {
            starts_at_ms: 10_000,
            ends_at_ms: 20_000,
            paused: false,
            buckets: 1,
        };
        assert_eq!(w.check(8_500), WindowCheck::NotStarted { wait_secs: 2 });
        assert_eq!(w.check(10_000), WindowCheck::Open);
        assert_eq!(w.check(20_000), WindowCheck::Ended);
        let paused = SaleWindow { paused: true, ..w };
        assert_eq!(paused.check(5_000), WindowCheck::Paused);
        assert_eq!(paused.check(25_000), WindowCheck::Ended);
    }
}
