//! The buy attempt in Redis: one EVALSHA of `lua/deduct.lua`, which checks
//! the Idempotency-Key, the sale window, the per-user limit and the stock,
//! and on a win decrements the stock and appends the reservation record to
//! the sale's stream, all atomically. Its reply is parsed once into
//! [`DeductOutcome`]; business results are values, not errors.

use flashgate_common::keys::SaleKeys;

use crate::redis_client::{RedisClient, RedisError};

/// What the script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeductOutcome {
    Won { reservation_id: String },
    SoldOut,
    LimitReached,
    Ended,
    NotStarted { starts_at_ms: i64 },
    Paused,
    NotFound,
}

/// A decision, and whether it was remembered from an earlier attempt with
/// the same Idempotency-Key (then nothing was deducted this time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: DeductOutcome,
    pub replayed: bool,
}

/// One buy attempt's inputs.
pub struct BuyAttempt<'a> {
    pub sale_id: &'a str,
    pub user_id: &'a str,
    /// Empty when the buyer sent none.
    pub idempotency_key: &'a str,
    /// Used only if the attempt wins.
    pub reservation_id: &'a str,
    pub idempotency_ttl_seconds: u64,
}

/// Runs the deduct script once.
///
/// # Errors
/// [`RedisError`] when Redis fails, times out, or answers something the
/// script never returns.
pub async fn deduct(redis: &RedisClient, attempt: &BuyAttempt<'_>) -> Result<Decision, RedisError> {
    let keys = SaleKeys::new(attempt.sale_id);
    let mut conn = redis.conn().await?;
    let mut invocation = redis.deduct.prepare_invoke();
    invocation
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(keys.idempotency(attempt.user_id, attempt.idempotency_key))
        .key(&keys.stream)
        .key(&keys.reservations)
        .arg(attempt.user_id)
        .arg(attempt.idempotency_key)
        .arg(attempt.reservation_id)
        .arg(attempt.idempotency_ttl_seconds)
        .arg(attempt.sale_id);
    let (code, detail): (String, String) = redis.bounded(invocation.invoke_async(&mut conn)).await??;
    parse_reply(&code, detail).ok_or_else(|| {
        RedisError::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unknown deduct reply",
            code,
        )))
    })
}

/// The remembered outcome of `user`'s Idempotency-Key, without running the
/// script: how a retry learns it won even after the gateway stopped sending
/// buys to Redis (sold out, ended).
///
/// # Errors
/// [`RedisError`] when Redis fails or times out.
pub async fn remembered(redis: &RedisClient, sale_id: &str, user_id: &str, idempotency_key: &str) -> Result<Option<Decision>, RedisError> {
    let key = SaleKeys::new(sale_id).idempotency(user_id, idempotency_key);
    let mut conn = redis.conn().await?;
    let value: Option<String> = redis.bounded(redis::cmd("GET").arg(key).query_async(&mut conn)).await??;
    Ok(value.and_then(|v| {
        let (code, detail) = v.split_once('|')?;
        parse_reply(code, detail.to_owned()).map(|d| Decision { replayed: true, ..d })
    }))
}

fn parse_reply(code: &str, detail: String) -> Option<Decision> {
    let (replayed, code) = match code.strip_prefix("replay:") {
        Some(rest) => (true, rest),
        None => (false, code),
    };
    let outcome = match code {
        "won" => DeductOutcome::Won { reservation_id: detail },
        "sold_out" => DeductOutcome::SoldOut,
        "limit_reached" => DeductOutcome::LimitReached,
        "ended" => DeductOutcome::Ended,
        "not_started" => DeductOutcome::NotStarted { starts_at_ms: detail.parse().ok()? },
        "paused" => DeductOutcome::Paused,
        "not_found" => DeductOutcome::NotFound,
        _ => return None,
    };
    Some(Decision { outcome, replayed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_into_outcomes() {
        let d = parse_reply("replay:won", "s.1".into()).unwrap();
        assert!(d.replayed);
        assert_eq!(d.outcome, DeductOutcome::Won { reservation_id: "s.1".into() });
        let d = parse_reply("not_started", "1700".into()).unwrap();
        assert_eq!(d.outcome, DeductOutcome::NotStarted { starts_at_ms: 1700 });
        assert!(parse_reply("bogus", String::new()).is_none());
        assert!(parse_reply("not_started", "x".into()).is_none());
    }
}
