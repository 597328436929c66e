//! The one parser of the deduct's answers: a `lua/deduct_batch.lua`
//! attempt's reply, an outcome `lua/remembered.lua` reads back, and an
//! outcome the opening draw decided (`lua/draw_run.lua`) all become a
//! [`Decision`] here, through one table of outcome codes
//! ([`parse_outcome`]).

use flashgate_common::draw::Outcome;

use super::{Decision, DeductOutcome};
use crate::infra::RedisError;

/// One attempt's part of a batch's reply: its decision, its own script
/// error (`{"error", message}`), or a reply of the wrong shape.
pub(super) fn attempt_decision(reply: redis::Value) -> Result<Decision, RedisError> {
    // Shown only when it cannot be read: formatting it costs more than
    // reading it.
    let reply: Vec<String> = redis::FromRedisValue::from_redis_value_ref(&reply)
        .map_err(|_| unexpected("unknown deduct reply", format!("{reply:?}")))?;
    match reply.as_slice() {
        [code, message] if code == "error" => Err(RedisError::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "deduct attempt failed",
            message.clone(),
        )))),
        reply => decision_of(reply),
    }
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

pub(super) fn unexpected(what: &'static str, detail: String) -> RedisError {
    RedisError::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        what,
        detail,
    )))
}

impl Decision {
    /// An outcome the opening draw decided, as a deduct decision: a win
    /// carries its reservation time (the `ts` of its stream record) unless
    /// replayed, like a replayed deduct win. `None` for anything a draw
    /// never decides.
    pub fn drawn(o: Outcome, replayed: bool) -> Option<Decision> {
        let outcome = parse_outcome(&o.outcome, o.detail, Some(o.ts), replayed)?;
        let decided = matches!(
            outcome,
            DeductOutcome::Won { .. }
                | DeductOutcome::SoldOut
                | DeductOutcome::LimitReached
                | DeductOutcome::Ended
        );
        decided.then_some(Decision {
            outcome,
            replayed,
            node: o.node,
            epoch: 0,
        })
    }
}

/// Parses an outcome as the script stores it (`code|detail`): a replay.
pub(super) fn remembered_decision(value: &str) -> Option<Decision> {
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
    let at = match at {
        Some(at) => Some(at.parse().ok()?),
        None => None,
    };
    let outcome = parse_outcome(code, detail, at, replayed)?;
    Some(Decision {
        outcome,
        replayed,
        node: node.map(str::to_owned),
        epoch: 0,
    })
}

/// The outcome codes, the one table of them: `code` with its `detail`,
/// and `at`, the reservation time that comes with a live win.
fn parse_outcome(
    code: &str,
    detail: String,
    at: Option<i64>,
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
            reserved_at_ms: Some(at?),
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
        let d = remembered_decision("won|s.1").unwrap();
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
        let d = remembered_decision("sold_out|").unwrap();
        assert!(d.replayed && !d.found_sold_out());
        assert!(remembered_decision("won").is_none());
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

    #[test]
    fn draw_outcomes_become_decisions() {
        let outcome = |o: &str, d: &str| Outcome {
            outcome: o.into(),
            detail: d.into(),
            ts: 1700,
            node: Some("ab".into()),
            user: "u".into(),
            rid: "s.1".into(),
        };
        let won = Decision::drawn(outcome("won", "s.1"), false).unwrap();
        assert_eq!(
            won.outcome,
            DeductOutcome::Won {
                reservation_id: "s.1".into(),
                reserved_at_ms: Some(1700)
            }
        );
        assert_eq!(won.node.as_deref(), Some("ab"));
        let replayed = Decision::drawn(outcome("won", "s.1"), true).unwrap();
        assert_eq!(
            replayed.outcome,
            DeductOutcome::Won {
                reservation_id: "s.1".into(),
                reserved_at_ms: None
            }
        );
        assert_eq!(
            Decision::drawn(outcome("sold_out", ""), false)
                .unwrap()
                .outcome,
            DeductOutcome::SoldOut
        );
        assert!(
            Decision::drawn(outcome("paused", ""), false).is_none(),
            "never an outcome of the draw"
        );
        assert!(Decision::drawn(outcome("bogus", ""), false).is_none());
    }
}
