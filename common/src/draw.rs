//! The opening draw of a sale (`[fairness] window_ms`): its record in
//! Redis, the order it decides, and the one function that recomputes that
//! order from the recorded seed, for audits.
//!
//! Every buy that arrives within the window after the sale starts enters
//! the draw (`lua/deduct_batch.lua` answers `entered`); once the window closes,
//! `lua/draw_run.lua` (run by whichever gateway asks first, in chunks)
//! fixes a seed and decides the entrants in the order [`decided_order`]
//! gives, each by the rules of any other buy (`lua/lib/decide.lua`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::keys::SaleKeys;

/// One buy in the draw, as `lua/deduct_batch.lua` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entrant {
    pub user: String,
    /// The buyer's Idempotency-Key, "" when none was sent.
    pub idem: String,
    /// The call's nonce when no Idempotency-Key was sent.
    #[serde(default)]
    pub nonce: String,
    /// The reservation id the entrant gets if it wins.
    pub rid: String,
    /// Arrival, Redis TIME in ms.
    pub at: i64,
}

/// What the draw decided for one entrant, as `lua/draw_run.lua` records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// `won`, `sold_out`, `limit_reached` or `ended`.
    #[serde(rename = "o")]
    pub outcome: String,
    /// The reservation id of a win, else "".
    #[serde(rename = "d", default)]
    pub detail: String,
    /// When it was decided (Redis TIME, ms): a win's reservation time, the
    /// `ts` of its stream record.
    pub ts: i64,
    /// A win: the replication id of the Redis that decided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The entrant decided: its user and the reservation id its entering
    /// call offered. Entry numbers are reused after a failover that lost
    /// entries, so a gateway holding an entry checks these are its own.
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub rid: String,
}

/// The entry numbers `1..=entrants` in the order the draw decides them.
///
/// A forward Fisher-Yates shuffle driven by SHA-1, exactly as
/// `lua/draw_run.lua` runs it: `p = [1..n]`; for `i` in `1..=n`,
/// `r` = the first 13 hex digits of `SHA1(seed + ":" + i)` (52 bits),
/// `j = i + r mod (n - i + 1)`, swap `p[i]` and `p[j]`. The seed is fixed
/// only after the window has closed, so no entrant can know it.
pub fn decided_order(seed: &str, entrants: u64) -> Vec<u64> {
    let mut p: Vec<u64> = (1..=entrants).collect();
    for i in 1..=entrants {
        let digest = sha1_smol::Sha1::from(format!("{seed}:{i}"))
            .digest()
            .to_string();
        // 13 hex digits always parse: a SHA-1 digest is 40 of them.
        let r = u64::from_str_radix(&digest[..13], 16).unwrap_or(0);
        let j = i + r % (entrants - i + 1);
        p.swap((i - 1) as usize, (j - 1) as usize);
    }
    p
}

/// A sale's draw record, read back from Redis for an audit.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// `closes_at_ms`, `seed`, `entrants`, `cursor`, `done`, ... as stored.
    pub state: HashMap<String, String>,
    /// Entrants by entry number, in arrival order.
    pub entrants: Vec<(u64, Entrant)>,
    /// Entry numbers in the order decided.
    pub order: Vec<u64>,
    /// Outcomes by entry number.
    pub outcomes: Vec<(u64, Outcome)>,
    /// Whether `order` is what [`decided_order`] computes from the seed
    /// (as far as decided); `None` before a seed is fixed.
    pub order_matches_seed: Option<bool>,
}

/// Reads the draw record of `sale_id`; `None` when the sale has none.
///
/// # Errors
/// Redis failed, or a stored entry is not the JSON the scripts write.
pub async fn read_record(
    conn: &mut impl redis::aio::ConnectionLike,
    sale_id: &str,
) -> redis::RedisResult<Option<Record>> {
    let keys = SaleKeys::new(sale_id);
    let d = &keys.draw;
    // One key per command: a plain pipeline is fine on a cluster (same slot).
    type ByEntry = HashMap<u64, String>;
    let (state, entries, order, outcomes): (HashMap<String, String>, ByEntry, Vec<u64>, ByEntry) =
        redis::pipe()
            .hgetall(&d.state)
            .hgetall(&d.entries)
            .lrange(&d.order, 0, -1)
            .hgetall(&d.outcomes)
            .query_async(conn)
            .await?;
    if state.is_empty() {
        return Ok(None);
    }
    let bad = |e: serde_json::Error| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "bad draw record",
            e.to_string(),
        ))
    };
    let mut entrants = entries
        .into_iter()
        .map(|(n, v)| serde_json::from_str(&v).map(|e| (n, e)).map_err(bad))
        .collect::<redis::RedisResult<Vec<(u64, Entrant)>>>()?;
    entrants.sort_by_key(|(n, _)| *n);
    let mut outcomes = outcomes
        .into_iter()
        .map(|(n, v)| serde_json::from_str(&v).map(|o| (n, o)).map_err(bad))
        .collect::<redis::RedisResult<Vec<(u64, Outcome)>>>()?;
    outcomes.sort_by_key(|(n, _)| *n);
    let order_matches_seed = match (
        state.get("seed"),
        state.get("entrants").and_then(|n| n.parse::<u64>().ok()),
    ) {
        (Some(seed), Some(n)) => {
            Some(decided_order(seed, n).get(..order.len()) == Some(&order[..]))
        }
        _ => None,
    };
    Ok(Some(Record {
        state,
        entrants,
        order,
        outcomes,
        order_matches_seed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_a_permutation_fixed_by_the_seed() {
        let a = decided_order("seed-1", 500);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=500).collect::<Vec<_>>());
        assert_eq!(a, decided_order("seed-1", 500));
        assert_ne!(a, decided_order("seed-2", 500));
        assert_ne!(a, sorted, "a shuffle, not arrival order");
        assert!(decided_order("s", 0).is_empty());
        assert_eq!(decided_order("s", 1), vec![1]);
    }

    #[test]
    fn windows_are_bounded() {
        use crate::sale::{draw_window_ms, MAX_DRAW_WINDOW_MS};
        assert_eq!(draw_window_ms("fairness.window_ms", 0), Ok(0));
        assert_eq!(draw_window_ms("fairness.window_ms", 200), Ok(200));
        assert!(draw_window_ms("draw_window_ms", -1)
            .unwrap_err()
            .starts_with("draw_window_ms:"));
        assert!(draw_window_ms("draw_window_ms", MAX_DRAW_WINDOW_MS + 1).is_err());
    }
}
