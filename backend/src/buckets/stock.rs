//! The stock of a bucketed sale: each bucket's **base** (its meta's
//! `stock`) and the rule that ties them to the database, Σ bases = the
//! sale's `stock` row. An operator's stock change moves the bases to the
//! new stock ([`move_to`]); reconciliation moves them back to the
//! database's stock when a change died half way.
//!
//! Every change to one bucket is one script in its slot
//! (`lua/bucket_stock.lua`) moving its base and its `remaining` together,
//! so the bucket's books (`remaining + reserved + Σ sent − Σ received =
//! base`) hold at every instant:
//! - an increase by Δ is spread like a preheat, `split_stock(Δ, N)`, each
//!   bucket's share added to its base and its remaining; gateways are told
//!   (`stocked:ID:bK`) so they clear the bucket's empty flag;
//! - a decrease by Δ takes unsold items only, from the buckets holding the
//!   most first, each script taking `min(remaining, still needed)`; items
//!   reserved or in transit are never taken. When the buckets hold fewer
//!   than Δ unsold items, nothing is taken (the first read finds too few)
//!   or what was taken is given back (buys took items meanwhile), and the
//!   buckets given items back are announced as stocked.
//!
//! Every script that moves a base also sets the bucket's `moving` marker
//! (deleted when [`move_to`] ends, or when the caller of
//! [`move_keeping_markers`] ends its [`Markers`] once its move is final;
//! with a TTL if the backend dies): the
//! sold-out confirmation (`flashgate_common::transfer::confirm_dry`) never
//! calls a bucket dry while it is set, and it compares the bases of its
//! two reads, so items added or taken and given back by a move are never
//! mistaken for a sold-out sale. The operator's change lowers the bases
//! before its commit and raises them after it (`api::admin`), so a crash
//! never leaves more items in the buckets than the database's stock.
//!
//! [`move_to`] aims at a **target** Σ bases, not a difference: it reads
//! the bases first, so running it again (an operator's retry after a
//! crash, or reconciliation) does not apply a change twice. Callers hold
//! the sale's row exclusively (`SaleWrite::held` or
//! `SaleLocks::begin_resync`), so no other change, repair or re-sync of the
//! sale moves the bases meanwhile; buys and transfers go on (they keep
//! every base).
//!
//! Known limits: a backend whose database connection drops in the middle
//! of a move keeps issuing the moves it planned while another backend may
//! take the hold. Each move is atomic per bucket and never takes items
//! reserved or in transit, so nothing is oversold by it, but the two plans
//! can overshoot the target; the next reconciliation pass reports it
//! (`bases_off`) and moves the bases back where items are unsold. A
//! process that dies during a decrease may leave a bucket's `moving`
//! marker for its 10 s TTL, during which that bucket's buyers may hear
//! `503` instead of `sold_out`.

use flashgate_common::buckets::split_stock;
use flashgate_common::keys::{SaleEvent, SaleKeys};
use flashgate_common::scripts::BUCKET_STOCK;
use redis::aio::ConnectionLike;
use redis::RedisError;

use crate::error::SaleError;
use crate::redis_io::announce;

/// Passes over the buckets a decrease makes before it gives up: items
/// move between buckets while it runs (transfers, returns), so a second
/// pass finds those that left a bucket already passed.
const TAKE_PASSES: usize = 3;

/// How long a bucket's "stock move in flight" marker lives (ms) when the
/// backend moving the base dies before it deletes the marker: meanwhile
/// gateways answer unavailable rather than `sold_out` for that bucket.
const MOVING_MS: i64 = 10_000;

/// Whether a decrease may stop short of its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// All or nothing: short, everything taken is given back (an
    /// operator's change, refused as a whole).
    GiveBack,
    /// Keep what could be taken (reconciliation: every item it removes
    /// brings Σ bases nearer to the database's stock).
    Keep,
}

/// What [`move_to`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    /// The bases were moved (or already were at the target): `changes[k]`
    /// is what bucket k's base moved by (signed); `missing` items could
    /// not be taken ([`Short::Keep`] only; 0 when the target was reached).
    Done { changes: Vec<i64>, missing: i64 },
    /// [`Short::GiveBack`]: the buckets hold too few unsold items, and
    /// nothing changed; `sold` = Σ bases − the unsold items found, the
    /// least the stock can be now.
    Refused { sold: i64 },
}

/// Each bucket's base (0 for an absent bucket).
///
/// # Errors
/// Redis failed.
pub async fn bases<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
) -> Result<Vec<i64>, RedisError> {
    let mut out = Vec::with_capacity(buckets as usize);
    for k in 0..buckets {
        let base: Option<i64> = redis::cmd("HGET")
            .arg(SaleKeys::bucket(id, k).meta)
            .arg("stock")
            .query_async(conn)
            .await?;
        out.push(base.unwrap_or(0));
    }
    Ok(out)
}

/// Runs `lua/bucket_stock.lua` on bucket `k`: adds `n` (> 0) or takes at
/// most `-n` unsold items (< 0); answers the signed change made.
async fn change<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    k: u32,
    n: i64,
) -> Result<i64, SaleError> {
    let keys = SaleKeys::bucket(id, k);
    let (code, made): (String, i64) = BUCKET_STOCK
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.synced)
        .key(&keys.moving)
        .arg(n)
        .arg(MOVING_MS)
        .invoke_async(conn)
        .await?;
    match code.as_str() {
        "ok" => Ok(made),
        "absent" => Err(SaleError::BucketUnavailable {
            bucket: k,
            why: "absent",
        }),
        "fenced" => Err(SaleError::BucketUnavailable {
            bucket: k,
            why: "fenced (its redis failed over)",
        }),
        _ => Err(SaleError::BadReply(vec![made])),
    }
}

/// Whether every bucket of sale `id` can have its base moved now: `Ok`
/// when all are present and none is fenced; else the first that is not.
///
/// # Errors
/// Redis failed, or a bucket is absent or fenced.
pub async fn check<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
) -> Result<(), SaleError> {
    for k in 0..buckets {
        change(conn, id, k, 0).await?;
    }
    Ok(())
}

/// Ends the "stock move in flight" markers of the buckets `changes` moved
/// (the TTL ends them if this fails).
async fn moved_done<C: ConnectionLike + Send>(conn: &mut C, id: &str, changes: &[i64]) {
    end_markers(
        conn,
        id,
        changes
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != 0)
            .map(|(k, _)| k as u32),
    )
    .await;
}

/// Deletes the markers of `buckets` (logged if Redis fails: they expire).
async fn end_markers<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: impl Iterator<Item = u32>,
) {
    for k in buckets {
        let done: Result<i64, RedisError> = redis::cmd("DEL")
            .arg(SaleKeys::bucket(id, k).moving)
            .query_async(conn)
            .await;
        if let Err(error) = done {
            tracing::warn!(%error, sale = id, bucket = k, "cannot end a bucket's stock-move marker; it expires on its own");
        }
    }
}

/// The "stock move in flight" markers a move left set, for a caller whose
/// move is not final yet (an operator's decrease, moved back if its
/// commit fails): it calls [`Markers::refresh`] while it waits and
/// [`Markers::end`] once the bases are final (committed, or moved back).
/// Dropped without `end` (the backend dies, the request is cancelled), the
/// markers expire on their own after [`MOVING_MS`].
#[derive(Debug, Default)]
#[must_use = "the markers stay until their TTL unless ended"]
pub struct Markers {
    id: String,
    buckets: Vec<u32>,
}

impl Markers {
    /// Sets every marker again with a full TTL: the move is still not
    /// final (e.g. before a commit that may take a while).
    pub async fn refresh<C: ConnectionLike + Send>(&self, conn: &mut C) {
        for k in &self.buckets {
            let set: Result<(), RedisError> = redis::cmd("SET")
                .arg(SaleKeys::bucket(&self.id, *k).moving)
                .arg("1")
                .arg("PX")
                .arg(MOVING_MS)
                .query_async(conn)
                .await;
            if let Err(error) = set {
                tracing::warn!(%error, sale = %self.id, bucket = k, "cannot renew a bucket's stock-move marker");
            }
        }
    }

    /// Ends the markers: the bases are final.
    pub async fn end<C: ConnectionLike + Send>(self, conn: &mut C) {
        end_markers(conn, &self.id, self.buckets.iter().copied()).await;
    }
}

/// [`move_to`], but a [`Moved::Done`] that moved a base leaves its
/// buckets' markers set, for the caller to end ([`Markers`]); any other
/// outcome ends them here (nothing moved, or everything was given back).
///
/// # Errors
/// As [`move_to`].
pub async fn move_keeping_markers<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
    target: i64,
    short: Short,
) -> Result<(Moved, Markers), SaleError> {
    let mut changes = vec![0_i64; buckets as usize];
    let moved = move_inner(conn, id, target, short, &mut changes).await;
    match moved {
        Ok(moved @ Moved::Done { .. }) => {
            let touched = changes
                .iter()
                .enumerate()
                .filter(|(_, c)| **c != 0)
                .map(|(k, _)| k as u32)
                .collect();
            Ok((
                moved,
                Markers {
                    id: id.to_owned(),
                    buckets: touched,
                },
            ))
        }
        other => {
            moved_done(conn, id, &changes).await;
            other.map(|m| (m, Markers::default()))
        }
    }
}

/// Moves the bases of sale `id` (`buckets` of them, all in Redis) so they
/// sum to `target`; see the module doc. A failure half way gives back what
/// this call changed before answering the error (logged if that fails
/// too: Σ bases then differs from the database, which reconciliation
/// repairs).
///
/// # Errors
/// Redis failed, or a bucket is absent or fenced.
pub async fn move_to<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    buckets: u32,
    target: i64,
    short: Short,
) -> Result<Moved, SaleError> {
    let mut changes = vec![0_i64; buckets as usize];
    let moved = move_inner(conn, id, target, short, &mut changes).await;
    // Every bucket this call touched (given back or not) ends its marker:
    // the bases are final until the next move.
    moved_done(conn, id, &changes).await;
    moved
}

/// [`move_to`] without ending the markers; `changes[k]` is what bucket k's
/// base moved by before any give-back ([`undo`] reads it and leaves it
/// as it is), so every bucket touched is nonzero there.
async fn move_inner<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    target: i64,
    short: Short,
    changes: &mut [i64],
) -> Result<Moved, SaleError> {
    let buckets = changes.len() as u32;
    let bases = bases(conn, id, buckets).await?;
    let sum: i64 = bases.iter().sum();
    let result = if target >= sum {
        add(conn, id, target - sum, changes).await
    } else {
        take(conn, id, sum - target, short, changes).await
    };
    let missing = match result {
        Ok(missing) => missing,
        Err(error) => {
            undo(conn, id, changes).await;
            return Err(error);
        }
    };
    if missing > 0 && short == Short::GiveBack {
        undo(conn, id, changes).await;
        let found = (sum - target) - missing;
        return Ok(Moved::Refused { sold: sum - found });
    }
    for (k, c) in changes.iter().enumerate() {
        if *c > 0 {
            announce(
                conn,
                &SaleEvent::BucketStocked {
                    sale: id.to_owned(),
                    bucket: k as u32,
                },
            )
            .await;
        }
    }
    Ok(Moved::Done {
        changes: changes.to_vec(),
        missing,
    })
}

/// Adds `delta` items, spread as a preheat spreads the stock.
async fn add<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    delta: i64,
    changes: &mut [i64],
) -> Result<i64, SaleError> {
    for (k, share) in split_stock(delta, changes.len() as u32)
        .into_iter()
        .enumerate()
    {
        if share > 0 {
            changes[k] += change(conn, id, k as u32, share).await?;
        }
    }
    Ok(0)
}

/// Takes `delta` unsold items, from the buckets holding the most first;
/// answers how many could not be found. With [`Short::GiveBack`], when the
/// first read already finds too few, nothing is taken at all (answering
/// the same shortfall): taking items only to give them back would let a
/// gateway see every bucket dry meanwhile and answer `sold_out`.
async fn take<C: ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
    delta: i64,
    short: Short,
    changes: &mut [i64],
) -> Result<i64, SaleError> {
    let mut need = delta;
    for pass in 0..TAKE_PASSES {
        let mut holding = Vec::with_capacity(changes.len());
        for k in 0..changes.len() as u32 {
            let left: Option<i64> = redis::cmd("GET")
                .arg(SaleKeys::bucket(id, k).remaining)
                .query_async(conn)
                .await?;
            holding.push((k, left.unwrap_or(0)));
        }
        let unsold: i64 = holding.iter().map(|(_, left)| (*left).max(0)).sum();
        if pass == 0 && short == Short::GiveBack && unsold < need {
            return Ok(need - unsold);
        }
        holding.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let before = need;
        for (k, left) in holding {
            if need == 0 || left <= 0 {
                break;
            }
            let made = change(conn, id, k, -left.min(need)).await?;
            changes[k as usize] += made;
            need += made;
        }
        if need == 0 || need == before {
            break;
        }
    }
    Ok(need)
}

/// Reverses `changes` as far as it can: items taken are added back (always
/// possible); items added are taken back while still unsold. What cannot be
/// reversed is logged: Σ bases then differs from the database's stock
/// until reconciliation moves them back.
async fn undo<C: ConnectionLike + Send>(conn: &mut C, id: &str, changes: &[i64]) {
    for (k, c) in changes.iter().enumerate().filter(|(_, c)| **c != 0) {
        let k = k as u32;
        let back = change(conn, id, k, -c).await;
        if matches!(back, Ok(made) if made > 0) {
            // Items are back in a bucket a gateway may have seen dry.
            announce(
                conn,
                &SaleEvent::BucketStocked {
                    sale: id.to_owned(),
                    bucket: k,
                },
            )
            .await;
        }
        match back {
            Ok(made) if made == -c => {}
            Ok(made) => {
                tracing::error!(
                    sale = id,
                    bucket = k,
                    wanted = -c,
                    made,
                    "a stock change could only be partly reversed; reconciliation repairs the bases"
                )
            }
            Err(error) => {
                tracing::error!(%error, sale = id, bucket = k, wanted = -c, "cannot reverse a stock change; reconciliation repairs the bases")
            }
        }
    }
}
