//! The buy attempt in Redis: the deduct (`fg_deduct`, `lua/lib/deduct.lua`)
//! checks the Idempotency-Key, the sale window, the per-user limit and the
//! stock, and on a win decrements the stock and appends the reservation
//! record to the sale's stream, all atomically. The attempts of one sale
//! go to Redis in one EVALSHA of `lua/deduct_batch.lua` ([`deduct_many`];
//! the buy path sends them through [`DeductBatcher`], alone when
//! nothing waits). Every reply (a deduct's, a remembered outcome, a draw's
//! outcome) is parsed in one place, `reply`, into [`DeductOutcome`];
//! business results are values, not errors.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use flashgate_common::config::RedisTarget;
use flashgate_common::keys::{home_id, SaleKeys};

use crate::infra::{RedisClient, RedisError};

mod batch;
mod reply;

pub use batch::DeductBatcher;
use reply::{attempt_decision, remembered_decision, unexpected};

/// Most Idempotency-Keys that did not win remembered per user and sale
/// (`lua/deduct_batch.lua`). Past it, a key that did not win is not stored, and
/// its retry is answered from the sale's state at that moment: one
/// account sending random keys cannot grow Redis without bound.
pub const MISSES_REMEMBERED_PER_USER: u32 = 16;

/// What the script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeductOutcome {
    /// `reserved_at_ms` is the script's clock, the `ts` of the stream
    /// record; a replay of a remembered win does not carry it (`None`).
    Won {
        reservation_id: String,
        reserved_at_ms: Option<i64>,
    },
    SoldOut,
    LimitReached,
    Ended,
    NotStarted {
        starts_at_ms: i64,
    },
    Paused,
    NotFound,
    /// The Redis holding the sale became a master since the sale last
    /// agreed with the database (failover, restart): nothing is sold until
    /// the backend has re-synced it.
    Fenced,
    /// The buy arrived within the sale's opening draw window: it is entry
    /// `entry` of the draw, which closes `closes_in_ms` from now (see
    /// `crate::buy::draw`). A replay of a buy the draw already holds (its
    /// Idempotency-Key) joins that entry: then the decision is `replayed`,
    /// and its outcome will be too. The same call re-sent (its nonce) is
    /// answered as its first send was, not as a replay.
    Entered {
        entry: u64,
        closes_in_ms: u64,
    },
    /// The draw window has closed but the draw is not decided yet: no buy
    /// may take an item before it is.
    DrawPending,
}

/// A decision, and whether it was remembered from an earlier attempt with
/// the same Idempotency-Key (then nothing was deducted this time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: DeductOutcome,
    pub replayed: bool,
    /// For a win (live or remembered): the replication id (`master_replid`)
    /// of the Redis that holds it. A replica `WAIT` confirms the win only
    /// if its mark ran on that same Redis (see `replica_wait`).
    pub node: Option<String>,
    /// For a fresh `sold_out`: the sale's stock epoch it was decided at
    /// (`lua/release.lua`); 0 otherwise.
    pub epoch: u64,
}

impl Decision {
    /// Whether the script found the sale out of stock just now. A replayed
    /// `sold_out` only repeats what an earlier attempt was told; the stock
    /// may have come back since (returns, restock), so it says nothing
    /// about the sale today and must never close it.
    pub fn found_sold_out(&self) -> bool {
        !self.replayed && self.outcome == DeductOutcome::SoldOut
    }
}

/// One buy attempt's inputs.
pub struct BuyAttempt<'a> {
    pub sale_id: &'a str,
    pub user_id: &'a str,
    /// Empty when the buyer sent none.
    pub idempotency_key: &'a str,
    /// Used only if the attempt wins.
    pub reservation_id: &'a str,
    /// Per call, used only without an Idempotency-Key: the same call
    /// re-sent by the cluster client answers its first win (see
    /// `lua/deduct_batch.lua`).
    pub call_nonce: &'a str,
    pub idempotency_ttl_seconds: u64,
    /// `[fairness] window_ms`: the draw window of a sale without its own.
    pub draw_window_ms: u64,
    /// The sale's bucket count: above 1 the script runs on the user's home
    /// bucket (`flashgate_common::buckets`), without a draw.
    pub buckets: u32,
    /// For a bucketed sale: every bucket was confirmed dry, so the home
    /// bucket's `sold_out` is remembered under the key like any final
    /// answer (otherwise it is not: items may be moved into the bucket).
    pub dry_is_final: bool,
}

/// Runs the deduct of every attempt in `attempts` in ONE script call
/// (`lua/deduct_batch.lua`), in order, each decided exactly as if it had
/// been sent on its own after the ones before it. All of them must buy in
/// the same sale and, for a bucketed sale, in the same bucket (their keys
/// share one hash tag: the first attempt's home decides it). The outer
/// error is the call's (every attempt failed with it); an inner one is
/// that attempt's own (its script error; the others are decided).
///
/// # Errors
/// [`RedisError`] when Redis fails, times out, or answers a reply of the
/// wrong shape.
pub async fn deduct_many(
    redis: &RedisClient,
    attempts: &[BuyAttempt<'_>],
) -> Result<Vec<Result<Decision, RedisError>>, RedisError> {
    let Some(first) = attempts.first() else {
        return Ok(Vec::new());
    };
    let keys = home_keys(first.sale_id, first.buckets, first.user_id);
    let mut invocation = redis.deduct_batch.prepare_invoke();
    invocation
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(&keys.stream)
        .key(&keys.reservations)
        .key(&keys.synced);
    if with_draw_keys(redis, first.buckets) {
        invocation
            .key(&keys.draw.state)
            .key(&keys.draw.entries)
            .key(&keys.draw.index)
            .key(&keys.draw.outcomes);
    }
    invocation.arg(attempts.len());
    for attempt in attempts {
        invocation
            .key(attempt_key(&keys, attempt))
            .key(keys.idempotency_misses(attempt.user_id));
        push_args(&mut invocation, attempt);
    }
    // Each attempt's reply parsed on its own: one malformed reply is that
    // attempt's error, and the others (wins among them) keep theirs.
    let replies: Vec<redis::Value> = redis
        .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
        .await?;
    if replies.len() != attempts.len() {
        return Err(unexpected(
            "deduct batch answered another number of attempts",
            format!("{} for {}", replies.len(), attempts.len()),
        ));
    }
    Ok(replies.into_iter().map(attempt_decision).collect())
}

/// `SaleKeys::home(sale_id, buckets, user)`, kept per thread while the
/// same sale (or bucket) keeps buying: `SaleKeys::new` formats every key a
/// sale has, which cost a deduct call more than the rest of its
/// preparation, and a flash sale's buys all name the same keys.
fn home_keys(sale_id: &str, buckets: u32, user: &str) -> Arc<SaleKeys> {
    thread_local! {
        static LAST: RefCell<Option<(String, Arc<SaleKeys>)>> = const { RefCell::new(None) };
    }
    let id = if buckets <= 1 {
        Cow::Borrowed(sale_id)
    } else {
        Cow::Owned(home_id(sale_id, buckets, user))
    };
    LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return Arc::new(SaleKeys::new(&id));
        };
        if let Some((cached, keys)) = last.as_ref() {
            if *cached == *id {
                return keys.clone();
            }
        }
        let keys = Arc::new(SaleKeys::new(&id));
        *last = Some((id.into_owned(), keys.clone()));
        keys
    })
}

/// Whether the deduct runs with the sale's draw keys. No draws on Redis
/// Cluster (docs/RELIABILITY.md, known gaps): without the draw keys the
/// script has no draw. A bucketed sale has none either (a draw is one slot).
fn with_draw_keys(redis: &RedisClient, buckets: u32) -> bool {
    buckets <= 1 && !matches!(redis.config().target, RedisTarget::Cluster { .. })
}

/// The key that remembers the attempt's outcome: its Idempotency-Key's,
/// or without one the call's own (by its nonce).
fn attempt_key(keys: &SaleKeys, attempt: &BuyAttempt<'_>) -> String {
    if attempt.idempotency_key.is_empty() {
        keys.call(attempt.user_id, attempt.call_nonce)
    } else {
        keys.idempotency(attempt.user_id, attempt.idempotency_key)
    }
}

/// The attempt's nine arguments of `lua/deduct_batch.lua`.
fn push_args(invocation: &mut redis::ScriptInvocation<'_>, attempt: &BuyAttempt<'_>) {
    invocation
        .arg(attempt.user_id)
        .arg(attempt.idempotency_key)
        .arg(attempt.reservation_id)
        .arg(attempt.idempotency_ttl_seconds)
        .arg(attempt.sale_id)
        .arg(MISSES_REMEMBERED_PER_USER)
        .arg(if attempt.idempotency_key.is_empty() {
            attempt.call_nonce
        } else {
            ""
        })
        .arg(attempt.draw_window_ms)
        .arg(if attempt.buckets > 1 && !attempt.dry_is_final {
            "1"
        } else {
            "0"
        });
}

/// The remembered outcome of `user`'s Idempotency-Key, without running the
/// script: how a retry learns it won even after the gateway stopped sending
/// buys to Redis (sold out, ended).
///
/// # Errors
/// [`RedisError`] when Redis fails or times out.
pub async fn remembered(
    redis: &RedisClient,
    sale_id: &str,
    buckets: u32,
    user_id: &str,
    idempotency_key: &str,
) -> Result<Option<Decision>, RedisError> {
    // A bucketed sale remembers a user's keys in their home bucket.
    let keys = home_keys(sale_id, buckets, user_id);
    // Where the script remembers a key: a win on its own, the others in
    // the user's capped hash. One round trip for both, and the id of the
    // Redis that answers (a remembered win waits for replicas there).
    let mut invocation = REMEMBERED.prepare_invoke();
    invocation
        .key(keys.idempotency(user_id, idempotency_key))
        .key(keys.idempotency_misses(user_id))
        .arg(idempotency_key);
    let (first, node): (String, String) = redis
        .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
        .await?;
    Ok(remembered_decision(&first).map(|d| Decision {
        node: Some(node),
        ..d
    }))
}

/// Reads a remembered outcome (`lua/remembered.lua`).
static REMEMBERED: &flashgate_common::scripts::Script = &flashgate_common::scripts::REMEMBERED;

#[cfg(test)]
mod home_keys_tests {
    use super::*;

    #[test]
    fn kept_keys_are_those_of_the_sale_or_bucket_asked_for() {
        for (sale, buckets, user) in [
            ("s1", 1, "alice"),
            ("s1", 1, "bob"),
            ("s1", 6, "alice"),
            ("s1", 6, "bob"),
            ("s2", 1, "alice"),
            ("s1", 1, "alice"),
        ] {
            assert_eq!(
                *home_keys(sale, buckets, user),
                SaleKeys::home(sale, buckets, user),
                "{sale} {buckets} {user}"
            );
        }
    }
}
