//! The buy attempt in Redis: the deduct (`fg_deduct`, `lua/lib/deduct.lua`)
//! checks the Idempotency-Key, the sale window, the per-user limit and the
//! stock, and on a win decrements the stock and appends the reservation
//! record to the sale's stream, all atomically. One attempt per EVALSHA of
//! `lua/deduct.lua` ([`deduct`]), or many of one sale per EVALSHA of
//! `lua/deduct_batch.lua` ([`deduct_many`], what the buy path sends through
//! `crate::deduct_batch`). Each reply is parsed once into
//! [`DeductOutcome`]; business results are values, not errors.

use flashgate_common::config::RedisTarget;
use flashgate_common::keys::SaleKeys;

use crate::redis_client::{RedisClient, RedisError};

/// Most Idempotency-Keys that did not win remembered per user and sale
/// (`lua/deduct.lua`). Past it, a key that did not win is not stored, and
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
    /// `crate::draw`). A replay of a buy the draw already holds (its
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
    /// `lua/deduct.lua`).
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

/// Runs the deduct script once, for one attempt of its own. The buy path
/// goes through [`crate::deduct_batch::DeductBatcher`], which sends the
/// concurrent attempts of a sale together ([`deduct_many`]); this is the
/// same decision for callers with one attempt and nothing to group it with.
///
/// # Errors
/// [`RedisError`] when Redis fails, times out, or answers something the
/// script never returns.
pub async fn deduct(redis: &RedisClient, attempt: &BuyAttempt<'_>) -> Result<Decision, RedisError> {
    let keys = SaleKeys::home(attempt.sale_id, attempt.buckets, attempt.user_id);
    let mut conn = redis.conn().await?;
    let mut invocation = redis.deduct.prepare_invoke();
    invocation
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(attempt_key(&keys, attempt))
        .key(&keys.stream)
        .key(&keys.reservations)
        .key(keys.idempotency_misses(attempt.user_id))
        .key(&keys.synced);
    if with_draw_keys(redis, attempt.buckets) {
        invocation
            .key(&keys.draw.state)
            .key(&keys.draw.entries)
            .key(&keys.draw.index)
            .key(&keys.draw.outcomes);
    }
    push_args(&mut invocation, attempt);
    let reply: Vec<String> = redis.bounded(invocation.invoke_async(&mut conn)).await??;
    decision_of(&reply)
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
    let keys = SaleKeys::home(first.sale_id, first.buckets, first.user_id);
    let mut conn = redis.conn().await?;
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
    let replies: Vec<redis::Value> = redis.bounded(invocation.invoke_async(&mut conn)).await??;
    if replies.len() != attempts.len() {
        return Err(unexpected(
            "deduct batch answered another number of attempts",
            format!("{} for {}", replies.len(), attempts.len()),
        ));
    }
    Ok(replies.into_iter().map(attempt_decision).collect())
}

/// One attempt's part of a batch's reply: its decision, its own script
/// error (`{"error", message}`), or a reply of the wrong shape.
fn attempt_decision(reply: redis::Value) -> Result<Decision, RedisError> {
    let shown = format!("{reply:?}");
    let reply: Vec<String> =
        redis::from_redis_value(reply).map_err(|_| unexpected("unknown deduct reply", shown))?;
    match reply.as_slice() {
        [code, message] if code == "error" => Err(RedisError::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "deduct attempt failed",
            message.clone(),
        )))),
        reply => decision_of(reply),
    }
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

/// The attempt's ARGV[1..9] of `lua/deduct.lua` (the same nine per attempt
/// in `lua/deduct_batch.lua`).
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

/// One attempt's reply, parsed.
fn decision_of(reply: &[String]) -> Result<Decision, RedisError> {
    let parsed = match reply {
        [code, entry, closes_in] if code == "entered" || code == "joined" => {
            parse_entered(entry, closes_in, code == "joined")
        }
        [code, detail] => parse_reply(code, detail.clone(), None, None),
        // A fresh sold out, with the stock epoch it was decided at.
        [code, detail, epoch] if code == "sold_out" => epoch.parse().ok().and_then(|epoch| {
            Some(Decision {
                epoch,
                ..parse_reply(code, detail.clone(), None, None)?
            })
        }),
        // A remembered win, with the id of the Redis holding it.
        [code, detail, node] => parse_reply(code, detail.clone(), None, Some(node)),
        [code, detail, at, node] => parse_reply(code, detail.clone(), Some(at), Some(node)),
        _ => None,
    };
    parsed.ok_or_else(|| unexpected("unknown deduct reply", reply.join("|")))
}

fn unexpected(what: &'static str, detail: String) -> RedisError {
    RedisError::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        what,
        detail,
    )))
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
    let keys = SaleKeys::home(sale_id, buckets, user_id);
    let mut conn = redis.conn().await?;
    // Where the script remembers a key: a win on its own, the others in
    // the user's capped hash. One round trip for both, and the id of the
    // Redis that answers (a remembered win waits for replicas there).
    let mut invocation = REMEMBERED.prepare_invoke();
    invocation
        .key(keys.idempotency(user_id, idempotency_key))
        .key(keys.idempotency_misses(user_id))
        .arg(idempotency_key);
    let (first, node): (String, String) =
        redis.bounded(invocation.invoke_async(&mut conn)).await??;
    Ok(parse_remembered(&first).map(|d| Decision {
        node: Some(node),
        ..d
    }))
}

/// Reads a remembered outcome (`lua/remembered.lua`).
static REMEMBERED: &flashgate_common::scripts::Script = &flashgate_common::scripts::REMEMBERED;

/// Parses an outcome as the script stores it (`code|detail`): a replay.
fn parse_remembered(value: &str) -> Option<Decision> {
    let (code, detail) = value.split_once('|')?;
    let outcome = parse_outcome(code, detail.to_owned(), None, true)?;
    Some(Decision {
        outcome,
        replayed: true,
        node: None,
        epoch: 0,
    })
}

/// Parses an `entered` reply: the entry number and the ms until the draw
/// closes.
fn parse_entered(entry: &str, closes_in: &str, joined: bool) -> Option<Decision> {
    let outcome = DeductOutcome::Entered {
        entry: entry.parse().ok()?,
        closes_in_ms: closes_in.parse().ok()?,
    };
    Some(Decision {
        outcome,
        replayed: joined,
        node: None,
        epoch: 0,
    })
}

/// Parses the script's reply; `at` is the time that comes with a live win,
/// `node` the replication id that comes with every win.
fn parse_reply(
    code: &str,
    detail: String,
    at: Option<&str>,
    node: Option<&str>,
) -> Option<Decision> {
    let (replayed, code) = match code.strip_prefix("replay:") {
        Some(rest) => (true, rest),
        None => (false, code),
    };
    let outcome = parse_outcome(code, detail, at, replayed)?;
    Some(Decision {
        outcome,
        replayed,
        node: node.map(str::to_owned),
        epoch: 0,
    })
}

fn parse_outcome(
    code: &str,
    detail: String,
    at: Option<&str>,
    replayed: bool,
) -> Option<DeductOutcome> {
    Some(match code {
        // A live win always carries its time; a replay never needs it.
        "won" if replayed => DeductOutcome::Won {
            reservation_id: detail,
            reserved_at_ms: None,
        },
        "won" => DeductOutcome::Won {
            reservation_id: detail,
            reserved_at_ms: Some(at?.parse().ok()?),
        },
        "sold_out" => DeductOutcome::SoldOut,
        "limit_reached" => DeductOutcome::LimitReached,
        "ended" => DeductOutcome::Ended,
        "not_started" => DeductOutcome::NotStarted {
            starts_at_ms: detail.parse().ok()?,
        },
        "paused" => DeductOutcome::Paused,
        "not_found" => DeductOutcome::NotFound,
        "fenced" => DeductOutcome::Fenced,
        "draw_pending" if !replayed => DeductOutcome::DrawPending,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_into_outcomes() {
        let d = parse_reply("replay:won", "s.1".into(), None, Some("ab")).unwrap();
        assert!(d.replayed);
        assert_eq!(
            d.outcome,
            DeductOutcome::Won {
                reservation_id: "s.1".into(),
                reserved_at_ms: None
            }
        );
        let d = parse_reply("won", "s.1".into(), Some("1700"), Some("ab")).unwrap();
        assert_eq!(
            d.outcome,
            DeductOutcome::Won {
                reservation_id: "s.1".into(),
                reserved_at_ms: Some(1700)
            }
        );
        assert!(
            parse_reply("won", "s.1".into(), None, None).is_none(),
            "a live win without its time is malformed"
        );
        let d = parse_reply("not_started", "1700".into(), None, None).unwrap();
        assert_eq!(d.outcome, DeductOutcome::NotStarted { starts_at_ms: 1700 });
        assert!(parse_reply("bogus", String::new(), None, None).is_none());
        assert!(parse_reply("not_started", "x".into(), None, None).is_none());
        assert_eq!(
            parse_reply("draw_pending", String::new(), None, None)
                .unwrap()
                .outcome,
            DeductOutcome::DrawPending
        );
        assert!(
            parse_reply("replay:draw_pending", String::new(), None, None).is_none(),
            "never remembered"
        );
    }

    #[test]
    fn a_malformed_attempt_reply_is_only_that_attempts_error() {
        let text = |parts: &[&str]| {
            redis::Value::Array(
                parts
                    .iter()
                    .map(|p| redis::Value::BulkString(p.as_bytes().to_vec()))
                    .collect(),
            )
        };
        let win = attempt_decision(text(&["won", "s.1", "1700", "ab"])).unwrap();
        assert_eq!(
            win.outcome,
            DeductOutcome::Won {
                reservation_id: "s.1".into(),
                reserved_at_ms: Some(1700)
            }
        );
        assert!(
            attempt_decision(redis::Value::Int(3)).is_err(),
            "not an array"
        );
        assert!(
            attempt_decision(redis::Value::Array(vec![redis::Value::Nil])).is_err(),
            "not text"
        );
        assert!(attempt_decision(text(&["bogus", ""])).is_err());
        let own =
            attempt_decision(text(&["error", "WRONGTYPE Operation against a key"])).unwrap_err();
        assert!(own.to_string().contains("WRONGTYPE"), "{own}");
    }

    #[test]
    fn draw_entries_parse_with_their_closing_time() {
        let d = parse_entered("7", "120", false).unwrap();
        assert_eq!(
            (d.outcome, d.replayed),
            (
                DeductOutcome::Entered {
                    entry: 7,
                    closes_in_ms: 120
                },
                false
            )
        );
        assert!(parse_entered("7", "120", true).unwrap().replayed);
        assert!(parse_entered("x", "120", false).is_none());
        assert!(parse_entered("7", "-1", false).is_none());
    }

    #[test]
    fn remembered_outcomes_parse_as_replays() {
        let d = parse_remembered("won|s.1").unwrap();
        assert_eq!(
            (d.outcome, d.replayed),
            (
                DeductOutcome::Won {
                    reservation_id: "s.1".into(),
                    reserved_at_ms: None
                },
                true
            )
        );
        let d = parse_remembered("sold_out|").unwrap();
        assert!(d.replayed && !d.found_sold_out());
        assert!(parse_remembered("won").is_none());
    }

    #[test]
    fn a_fresh_sold_out_carries_its_stock_epoch() {
        let d = decision_of(&["sold_out".into(), String::new(), "42".into()]).unwrap();
        assert_eq!(
            (d.outcome, d.epoch, d.replayed),
            (DeductOutcome::SoldOut, 42, false)
        );
        assert!(decision_of(&["sold_out".into(), String::new(), "x".into()]).is_err());
    }

    #[test]
    fn only_a_live_sold_out_answer_finds_the_sale_sold_out() {
        assert!(parse_reply("sold_out", String::new(), None, None)
            .unwrap()
            .found_sold_out());
        assert!(!parse_reply("replay:sold_out", String::new(), None, None)
            .unwrap()
            .found_sold_out());
        assert!(!parse_reply("limit_reached", String::new(), None, None)
            .unwrap()
            .found_sold_out());
    }
}
