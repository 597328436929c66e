//! Items moving between the buckets of a bucketed sale (see
//! [`crate::buckets`]), and the books that prove none is created or lost.
//!
//! A transfer of transfer id `xid` from donor bucket D to bucket K:
//! 1. [`take`] (`lua/xfer_out.lua` on D): takes a batch out of D's
//!    `remaining` and records `xid` as open in D's `xfer-out`/`xfer-open`;
//!    a retry with the same `xid` answers the same batch, nothing more;
//! 2. [`give`] (`lua/xfer_in.lua` on K): adds the batch to K's `remaining`
//!    once (`xid` in K's `xfer-in`, recording `{from: D, n}`), unless the
//!    take ran on a Redis of D that D's re-sync fenced off (the token
//!    fence below);
//! 3. [`close`] (`lua/xfer_ack.lua` on D): moves `xid` from open to done.
//!
//! Each side is one atomic script in its bucket's slot. A crash between 1
//! and 2 leaves the transfer open, its items **in transit**; the backend's
//! transit repair ([`repair`]) completes every open transfer older than
//! [`REPAIR_AFTER_MS`] with 2 and 3, which are idempotent, so it may race
//! the gateway that started it or run twice.
//!
//! **Token fence.** Every give carries the replication id of D's Redis
//! where the take ran (`lua/xfer_out.lua` answers it with the take, with
//! a retry of the same `xid`, and with an `in_transit` answer). When D's
//! Redis fails over, its take records may be lost; D's re-sync
//! (`backend/src/fence/bucketed.rs`) first adds `D:<replication id D was
//! synced on>` to every other bucket's `xfer-refuse`, then reads their
//! `xfer-in` for the takes D lost. A give of such a take arriving later
//! (a retry, a stalled gateway, a repair reading an old master) is
//! refused ([`Given::Refused`]), so the re-sync never misses an add it
//! did not see. A give whose record survived on D's new master carries
//! the new replication id and is accepted.
//!
//! Books: per bucket, at every instant (each change is one script in the
//! bucket's slot), `remaining + reserved + Σ sent − Σ received = base`
//! (its meta's `stock`: its preheat share, moved by stock changes;
//! [`ledger`]); per sale ([`books`]), `Σ remaining + in transit + reserved
//! = stock`, where in transit counts the open transfers whose target has
//! not added them yet, and reserved is each bucket's reservations minus
//! those returned.
//!
//! The transit repair runs in the backend's restore loop (every
//! `backend.restore_poll_ms`); it asks `lua/xfer_out.lua` again with the
//! same `xid` to learn the replication id of the Redis holding the record,
//! which its give carries. A gateway that meets an open transfer first (a
//! donor answering `in_transit`) completes it itself.

use redis::aio::ConnectionLike;
use redis::RedisResult;

use crate::keys::SaleKeys;
use crate::scripts::{BUCKET_STATE, XFER_ACK, XFER_IN, XFER_OUT};

/// An open transfer younger than this is left to the gateway that started
/// it (it finishes within its deal deadline, well under a second); older,
/// the backend's transit repair completes it.
pub const REPAIR_AFTER_MS: i64 = 2_000;

/// What the donor side of a transfer answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// This many items left the donor (now in transit).
    Moved(i64),
    /// The donor has nothing and no transfer out of it is open.
    Empty,
    /// The donor has nothing, but items it gave are on their way to bucket
    /// `to`: transfer `xid` of `n` items, which the caller may complete
    /// ([`complete`]).
    /// `replid` is the donor Redis's replication id, what the give of
    /// that transfer carries (the token fence).
    InTransit {
        to: u32,
        xid: String,
        n: i64,
        replid: String,
    },
    /// The donor bucket is not in Redis.
    NotFound,
    /// The donor's Redis failed over since it was installed.
    Fenced,
    /// Asked to give to itself (donor = target) while it holds items:
    /// nothing taken, the caller deducts again.
    Stocked,
}

/// Step 1: takes at most `most` items (half of what is left, rounded up)
/// out of bucket `from` for bucket `to`, recorded under `xid`.
///
/// # Errors
/// Redis failed, or answered something the script never returns.
pub async fn take<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    from: u32,
    to: u32,
    xid: &str,
    most: i64,
) -> RedisResult<Taken> {
    Ok(take_on(conn, sale_id, from, to, xid, most).await?.0)
}

/// [`take`], with the replication id of the Redis that holds the take
/// record when items moved (`None` otherwise): what a replica wait for
/// the take names.
///
/// # Errors
/// Redis failed, or answered something the script never returns.
pub async fn take_on<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    from: u32,
    to: u32,
    xid: &str,
    most: i64,
) -> RedisResult<(Taken, Option<String>)> {
    let d = SaleKeys::bucket(sale_id, from);
    let reply: Vec<String> = XFER_OUT
        .key(&d.meta)
        .key(&d.remaining)
        .key(&d.xfer_out)
        .key(&d.xfer_open)
        .key(&d.synced)
        .arg(xid)
        .arg(to)
        .arg(most)
        .arg(if from == to { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    let parsed = match reply.as_slice() {
        [code, n, node] if code == "moved" => {
            return n
                .parse()
                .map(|n| (Taken::Moved(n), Some(node.clone())))
                .map_err(|_| bad_take(&reply))
        }
        [code, _] if code == "empty" => Some(Taken::Empty),
        [code, to, xid, n, replid] if code == "in_transit" => match (to.parse(), n.parse()) {
            (Ok(to), Ok(n)) => Some(Taken::InTransit {
                to,
                xid: xid.clone(),
                n,
                replid: replid.clone(),
            }),
            _ => None,
        },
        [code, _] if code == "not_found" => Some(Taken::NotFound),
        [code, _] if code == "fenced" => Some(Taken::Fenced),
        [code, _] if code == "stocked" => Some(Taken::Stocked),
        _ => None,
    };
    parsed.map(|t| (t, None)).ok_or_else(|| bad_take(&reply))
}

fn bad_take(reply: &[String]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unknown xfer_out reply",
        reply.join("|"),
    ))
}

/// What the receiving side of a transfer answered ([`give`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    /// The items were added now.
    Added,
    /// They were added before: nothing changed.
    Before,
    /// The target bucket is not in Redis: nothing changed.
    Absent,
    /// The take ran on a Redis of the donor that the donor's re-sync has
    /// fenced off (the token fence): nothing changed, the transfer stays
    /// open wherever its record survived.
    Refused,
}

impl Given {
    /// Whether the items are in the target now (added now or before).
    pub fn landed(self) -> bool {
        matches!(self, Self::Added | Self::Before)
    }
}

/// Step 2: adds transfer `xid`'s `n` items, taken out of bucket `from` on
/// the Redis of replication id `replid`, to bucket `to`, once. The record
/// names its donor ([`Received`]).
///
/// # Errors
/// Redis failed.
pub async fn give<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    from: u32,
    to: u32,
    xid: &str,
    n: i64,
    replid: &str,
) -> RedisResult<Given> {
    let k = SaleKeys::bucket(sale_id, to);
    let reply: i64 = XFER_IN
        .key(&k.meta)
        .key(&k.remaining)
        .key(&k.xfer_in)
        .key(&k.xfer_refuse)
        .arg(xid)
        .arg(n)
        .arg(from)
        .arg(replid)
        .invoke_async(conn)
        .await?;
    Ok(match reply {
        1 => Given::Added,
        0 => Given::Before,
        -2 => Given::Refused,
        _ => Given::Absent,
    })
}

/// Step 3: closes transfer `xid` of donor bucket `from`; `true` if it was
/// open until now.
///
/// # Errors
/// Redis failed.
pub async fn close<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    from: u32,
    xid: &str,
) -> RedisResult<bool> {
    let d = SaleKeys::bucket(sale_id, from);
    let closed: i64 = XFER_ACK
        .key(&d.xfer_out)
        .key(&d.xfer_open)
        .arg(xid)
        .invoke_async(conn)
        .await?;
    Ok(closed == 1)
}

/// Steps 2 and 3 of transfer `xid` of `n` items from `from` (taken on
/// the Redis of replication id `replid`) to `to`: what the gateway that
/// took the items does next, and what anyone who finds the transfer open
/// may do (both steps are idempotent). `false` when the target bucket is
/// absent or refused the give (the transfer stays open).
///
/// # Errors
/// Redis failed; the transfer stays open, or added but not closed (a
/// later call closes it).
pub async fn complete<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    from: u32,
    to: u32,
    xid: &str,
    n: i64,
    replid: &str,
) -> RedisResult<bool> {
    if !give(conn, sale_id, from, to, xid, n, replid)
        .await?
        .landed()
    {
        return Ok(false);
    }
    close(conn, sale_id, from, xid).await?;
    Ok(true)
}

/// One bucket as [`confirm_dry`] reads it (`lua/bucket_state.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Whether the bucket is in Redis at all.
    pub present: bool,
    pub remaining: i64,
    /// Open transfers out of the bucket (items in transit from it).
    pub open_out: i64,
    /// Transfers ever added to the bucket.
    pub received: i64,
    /// Reservations ever returned to the bucket.
    pub returned: i64,
    /// The bucket's base (its meta's `stock`): an operator's stock change
    /// or a repair adds items by moving it, without a transfer or a
    /// return, so a change between two reads shows here.
    pub base: i64,
    /// A stock move is in flight on the bucket (`moving` marker): it may
    /// have taken items it gives back, so the bucket is not dry.
    pub moving: bool,
    /// The bucket's Redis failed over since it was synced: its counts may
    /// lack the last writes, so it is not called dry before its re-sync.
    pub fenced: bool,
}

impl BucketState {
    /// Present, nothing left, nothing on its way out and no stock move in
    /// flight.
    pub fn dry(&self) -> bool {
        self.present && self.remaining <= 0 && self.open_out == 0 && !self.moving && !self.fenced
    }
}

/// Reads bucket `k` of `sale_id` atomically (one script in its slot).
///
/// # Errors
/// Redis failed.
pub async fn state<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    k: u32,
) -> RedisResult<BucketState> {
    let keys = SaleKeys::bucket(sale_id, k);
    let r: (i64, i64, i64, i64, i64, i64, i64, i64) = BUCKET_STATE
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.xfer_open)
        .key(&keys.xfer_in)
        .key(&keys.released)
        .key(&keys.moving)
        .key(&keys.synced)
        .invoke_async(conn)
        .await?;
    Ok(BucketState {
        present: r.0 == 1,
        remaining: r.1,
        open_out: r.2,
        received: r.3,
        returned: r.4,
        base: r.5,
        moving: r.6 == 1,
        fenced: r.7 == 1,
    })
}

/// Whether every bucket of `sale_id` is dry at one instant: the buckets
/// are read twice, one call per bucket each time (`2 × buckets` calls);
/// `true` only if both reads find every bucket [`BucketState::dry`] and no
/// bucket received a transfer or a returned reservation, nor had its base
/// moved, between them. Items can only enter a bucket by those three ways
/// (a base moves by an operator's stock change or a repair, which also
/// sets the bucket's `moving` marker while in flight, so a decrease that
/// takes items and gives them back is never seen dry), and leave a bucket
/// only as an open transfer (seen), a sale, or a stock move (marked), so
/// two equal dry reads mean there was an instant with no item left
/// anywhere. A bucketed sale is
/// answered `sold_out` only after this answered `true`.
///
/// # Errors
/// Redis failed (the caller answers unavailable, never sold out).
pub async fn confirm_dry<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
) -> RedisResult<bool> {
    let mut first = Vec::with_capacity(buckets as usize);
    for k in 0..buckets {
        let s = state(conn, sale_id, k).await?;
        if !s.dry() {
            return Ok(false);
        }
        first.push(s);
    }
    for (k, before) in (0..buckets).zip(first) {
        if state(conn, sale_id, k).await? != before {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One recorded transfer out of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Record {
    pub to: u32,
    pub n: i64,
    pub at: i64,
    pub done: bool,
}

/// One recorded transfer into a bucket (`lua/xfer_in.lua`): its donor
/// bucket and its items. A record written before donors were recorded
/// (a bare count) has no donor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub from: Option<u32>,
    pub n: i64,
}

impl Received {
    /// Reads an `xfer-in` value: `{"from":D,"n":t}`, or a bare count.
    pub fn parse(raw: &str) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Json {
            from: u32,
            n: i64,
        }
        if let Ok(n) = raw.parse::<i64>() {
            return Some(Self { from: None, n });
        }
        serde_json::from_str::<Json>(raw).ok().map(|j| Self {
            from: Some(j.from),
            n: j.n,
        })
    }
}

async fn record<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &SaleKeys,
    xid: &str,
) -> RedisResult<Option<Record>> {
    let raw: Option<String> = redis::cmd("HGET")
        .arg(&keys.xfer_out)
        .arg(xid)
        .query_async(conn)
        .await?;
    Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
}

/// Completes every transfer out of any bucket of `sale_id` that is open
/// and was made before `now_ms - REPAIR_AFTER_MS` (steps 2 and 3); returns
/// how many it closed. Idempotent, and harmless beside a live gateway.
///
/// # Errors
/// Redis failed; what was done stays done, the next pass does the rest.
pub async fn repair<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
    now_ms: i64,
) -> RedisResult<u64> {
    let mut closed = 0;
    for from in 0..buckets {
        let d = SaleKeys::bucket(sale_id, from);
        let stale: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&d.xfer_open)
            .arg("-inf")
            .arg(now_ms - REPAIR_AFTER_MS)
            .arg("LIMIT")
            .arg(0)
            .arg(100)
            .query_async(conn)
            .await?;
        for xid in stale {
            let Some(r) = record(conn, &d, &xid).await? else {
                continue;
            };
            // The same transfer id asked again: the replication id of the
            // Redis holding the record, which the give carries.
            let (_, Some(replid)) = take_on(conn, sale_id, from, r.to, &xid, r.n).await? else {
                continue;
            };
            let given = give(conn, sale_id, from, r.to, &xid, r.n, &replid).await?;
            match given {
                Given::Absent => {
                    tracing::warn!(sale = sale_id, bucket = r.to, transfer = %xid, "transfer target bucket is not in redis; left open");
                    continue;
                }
                Given::Refused => {
                    tracing::warn!(sale = sale_id, from, to = r.to, transfer = %xid, "transfer refused by its target: its take ran on a redis the donor's re-sync fenced off; left open");
                    continue;
                }
                Given::Added | Given::Before => {}
            }
            if given == Given::Added {
                // Gateways that flagged the target empty learn it holds items.
                let stocked = crate::keys::SaleEvent::BucketStocked {
                    sale: sale_id.to_owned(),
                    bucket: r.to,
                };
                if let Err(error) = crate::keys::publish(conn, &stocked).await {
                    tracing::warn!(%error, sale = sale_id, bucket = r.to, "cannot announce a repaired transfer");
                }
            }
            if close(conn, sale_id, from, &xid).await? {
                closed += 1;
                tracing::info!(sale = sale_id, from, to = r.to, items = r.n, transfer = %xid, "transfer in transit completed by repair");
            }
        }
    }
    Ok(closed)
}

/// A bucketed sale's books, read bucket by bucket (not one snapshot: read
/// while nothing moves, or expect a transfer to be seen on both sides or
/// neither for an instant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Books {
    /// Each bucket's `remaining`.
    pub remaining: Vec<i64>,
    /// Items of open transfers their target has not added yet.
    pub in_transit: i64,
    /// Reservations minus returned ones, over every bucket.
    pub reserved: i64,
}

impl Books {
    /// `Σ remaining + in transit + reserved`: the sale's stock when the
    /// books balance.
    pub fn total(&self) -> i64 {
        self.remaining.iter().sum::<i64>() + self.in_transit + self.reserved
    }
}

/// Reads the books of `sale_id` over its `buckets` buckets.
///
/// # Errors
/// Redis failed.
pub async fn books<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
) -> RedisResult<Books> {
    let mut out = Books {
        remaining: Vec::with_capacity(buckets as usize),
        in_transit: 0,
        reserved: 0,
    };
    for k in 0..buckets {
        let keys = SaleKeys::bucket(sale_id, k);
        // One atomic read per bucket: a return between a separate GET and
        // SCARD would count the item twice or not at all.
        let (remaining, resv, released, open): (Option<i64>, i64, i64, Vec<String>) = redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(&keys.remaining)
            .cmd("HLEN")
            .arg(&keys.reservations)
            .cmd("SCARD")
            .arg(&keys.released)
            .cmd("ZRANGE")
            .arg(&keys.xfer_open)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        out.remaining.push(remaining.unwrap_or(0));
        out.reserved += resv - released;
        for xid in open {
            let Some(r) = record(conn, &keys, &xid).await? else {
                continue;
            };
            let added: bool = redis::cmd("HEXISTS")
                .arg(SaleKeys::bucket(sale_id, r.to).xfer_in)
                .arg(&xid)
                .query_async(conn)
                .await?;
            if !added {
                out.in_transit += r.n;
            }
        }
    }
    Ok(out)
}

/// One bucket's ledger, read atomically (one `MULTI` in its slot): what
/// it was given at preheat (`stock`), what it holds, what it reserved,
/// and every transfer out of it and into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    pub stock: i64,
    pub remaining: i64,
    pub reserved: i64,
    /// Items of every transfer out of the bucket, open or done.
    pub sent: i64,
    /// Items of every transfer into the bucket.
    pub received: i64,
}

impl Ledger {
    /// Whether the bucket's own books balance: `remaining + reserved +
    /// sent - received = stock`. True at every instant (each change to a
    /// bucket is one script in its slot), so it can be checked while the
    /// sale sells, unlike the sale-wide [`books`].
    pub fn balances(&self) -> bool {
        self.remaining + self.reserved + self.sent - self.received == self.stock
    }
}

/// Reads bucket `k` of `sale_id`'s [`Ledger`] in one transaction.
///
/// # Errors
/// Redis failed.
pub async fn ledger<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    k: u32,
) -> RedisResult<Ledger> {
    let keys = SaleKeys::bucket(sale_id, k);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .hget(&keys.meta, "stock")
        .get(&keys.remaining)
        .hlen(&keys.reservations)
        .scard(&keys.released)
        .hgetall(&keys.xfer_out)
        .hvals(&keys.xfer_in);
    type Read = (
        Option<i64>,
        Option<i64>,
        i64,
        i64,
        std::collections::HashMap<String, String>,
        Vec<String>,
    );
    let (stock, remaining, resv, released, out, into): Read = pipe.query_async(conn).await?;
    let sent = out
        .iter()
        .filter(|(xid, _)| !xid.starts_with('#'))
        .filter_map(|(_, r)| serde_json::from_str::<Record>(r).ok())
        .map(|r| r.n)
        .sum();
    Ok(Ledger {
        stock: stock.unwrap_or(0),
        remaining: remaining.unwrap_or(0),
        reserved: resv - released,
        sent,
        received: into
            .iter()
            .filter_map(|r| Received::parse(r))
            .map(|r| r.n)
            .sum(),
    })
}

/// What buyers are shown as left: every bucket's `remaining` plus the
/// items in open transfers (`#open` of each `xfer-out`). Cheaper than
/// [`books`]; a transfer added but not closed yet counts twice for an
/// instant.
///
/// # Errors
/// Redis failed.
pub async fn left<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    buckets: u32,
) -> RedisResult<i64> {
    let mut total = 0;
    for k in 0..buckets {
        total += left_in(conn, sale_id, k).await?;
    }
    Ok(total)
}

/// [`left`] of bucket `k` alone: its `remaining` plus its items in open
/// transfers out of it, read in one round trip (one slot).
///
/// # Errors
/// Redis failed.
pub async fn left_in<C: ConnectionLike + Send>(
    conn: &mut C,
    sale_id: &str,
    k: u32,
) -> RedisResult<i64> {
    let keys = SaleKeys::bucket(sale_id, k);
    let mut pipe = redis::pipe();
    pipe.get(&keys.remaining).hget(&keys.xfer_out, "#open");
    let (remaining, open): (Option<i64>, Option<i64>) = pipe.query_async(conn).await?;
    Ok(remaining.unwrap_or(0).max(0) + open.unwrap_or(0).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buckets::split_stock;

    /// A bucketed sale of `stock` over `buckets`, installed as the
    /// backend's preheat does (open, synced).
    async fn install(
        conn: &mut redis::aio::MultiplexedConnection,
        sale: &str,
        stock: i64,
        buckets: u32,
    ) {
        let script = &crate::scripts::PREHEAT_BUCKET;
        for (k, share) in split_stock(stock, buckets).into_iter().enumerate() {
            let keys = SaleKeys::bucket(sale, k as u32);
            let installed: i64 = script
                .key(&keys.meta)
                .key(&keys.remaining)
                .key(&keys.stream)
                .key(&keys.synced)
                .arg("n")
                .arg(share)
                .arg(1)
                .arg(0)
                .arg(i64::MAX / 2)
                .arg("0")
                .arg(k)
                .arg(buckets)
                .arg(crate::keys::CONSUMER_GROUP)
                .invoke_async(conn)
                .await
                .unwrap();
            assert_eq!(installed, 1);
        }
    }

    #[tokio::test]
    async fn a_give_of_a_take_made_on_a_fenced_off_donor_redis_is_refused_and_changes_nothing() {
        let redis = flashgate_testkit::redis::RedisServer::private();
        let mut conn = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        install(&mut conn, "s", 10, 2).await;
        // Bucket 0's re-sync fenced off its old Redis "old" in bucket 1.
        let _: i64 = redis::cmd("SADD")
            .arg(SaleKeys::bucket("s", 1).xfer_refuse)
            .arg("0:old")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            give(&mut conn, "s", 0, 1, "late", 3, "old").await.unwrap(),
            Given::Refused
        );
        assert!(
            !complete(&mut conn, "s", 0, 1, "late", 3, "old")
                .await
                .unwrap(),
            "a refused give leaves the transfer open"
        );
        assert_eq!(
            books(&mut conn, "s", 2).await.unwrap().remaining,
            vec![5, 5],
            "nothing added"
        );
        let raw: Option<String> = redis::cmd("HGET")
            .arg(SaleKeys::bucket("s", 1).xfer_in)
            .arg("late")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(raw, None, "nothing recorded");
        // The same donor's take on its new Redis, and another donor, pass.
        assert_eq!(
            give(&mut conn, "s", 0, 1, "new", 2, "new").await.unwrap(),
            Given::Added
        );
        let _: i64 = redis::cmd("SADD")
            .arg(SaleKeys::bucket("s", 0).xfer_refuse)
            .arg("0:old")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            give(&mut conn, "s", 1, 0, "other", 1, "old").await.unwrap(),
            Given::Added,
            "the token names its donor"
        );
        // A give that landed before the fence stays landed, once.
        let _: i64 = redis::cmd("SADD")
            .arg(SaleKeys::bucket("s", 1).xfer_refuse)
            .arg("0:new")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            give(&mut conn, "s", 0, 1, "new", 2, "new").await.unwrap(),
            Given::Before
        );
        assert_eq!(
            books(&mut conn, "s", 2).await.unwrap().remaining,
            vec![6, 7]
        );
    }

    #[tokio::test]
    async fn every_side_of_a_transfer_is_idempotent_on_retries() {
        let redis = flashgate_testkit::redis::RedisServer::private();
        let mut conn = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        install(&mut conn, "s", 10, 2).await;
        // Bucket 0 holds 5: half, rounded up, capped at 8, is 3.
        assert_eq!(
            take(&mut conn, "s", 0, 1, "x1", 8).await.unwrap(),
            Taken::Moved(3)
        );
        assert_eq!(
            take(&mut conn, "s", 0, 1, "x1", 8).await.unwrap(),
            Taken::Moved(3),
            "a retry takes nothing more"
        );
        let here = flashgate_testkit::master_replid(&mut conn).await;
        assert_eq!(
            take_on(&mut conn, "s", 0, 1, "x1", 8).await.unwrap(),
            (Taken::Moved(3), Some(here)),
            "the Redis holding the take"
        );
        let b = books(&mut conn, "s", 2).await.unwrap();
        assert_eq!(
            (b.remaining.clone(), b.in_transit, b.total()),
            (vec![2, 5], 3, 10)
        );
        for k in 0..2 {
            assert!(
                ledger(&mut conn, "s", k).await.unwrap().balances(),
                "bucket {k} while in transit"
            );
        }
        assert_eq!(left(&mut conn, "s", 2).await.unwrap(), 10);
        assert_eq!(
            give(&mut conn, "s", 0, 1, "x1", 3, "r").await.unwrap(),
            Given::Added
        );
        assert_eq!(
            give(&mut conn, "s", 0, 1, "x1", 3, "r").await.unwrap(),
            Given::Before,
            "added once"
        );
        let raw: String = redis::cmd("HGET")
            .arg(SaleKeys::bucket("s", 1).xfer_in)
            .arg("x1")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            Received::parse(&raw),
            Some(Received {
                from: Some(0),
                n: 3
            }),
            "the record names its donor: {raw}"
        );
        let b = books(&mut conn, "s", 2).await.unwrap();
        assert_eq!(
            (b.remaining.clone(), b.in_transit, b.total()),
            (vec![2, 8], 0, 10)
        );
        assert!(close(&mut conn, "s", 0, "x1").await.unwrap());
        assert!(
            !close(&mut conn, "s", 0, "x1").await.unwrap(),
            "closed once"
        );
        assert_eq!(
            take(&mut conn, "s", 0, 1, "x1", 8).await.unwrap(),
            Taken::Moved(3),
            "a late retry of a closed transfer"
        );
        let b = books(&mut conn, "s", 2).await.unwrap();
        assert_eq!(
            (b.remaining.clone(), b.in_transit, b.total()),
            (vec![2, 8], 0, 10)
        );
        let (d, k) = (
            ledger(&mut conn, "s", 0).await.unwrap(),
            ledger(&mut conn, "s", 1).await.unwrap(),
        );
        assert!(d.balances() && k.balances(), "{d:?} {k:?}");
        assert_eq!((d.sent, k.received), (3, 3));
        assert_eq!(left(&mut conn, "s", 2).await.unwrap(), 10);
        assert_eq!(
            give(&mut conn, "s", 0, 7, "x9", 1, "r").await.unwrap(),
            Given::Absent,
            "an absent bucket gains nothing"
        );
        assert_eq!(
            Received::parse("4"),
            Some(Received { from: None, n: 4 }),
            "a record without its donor"
        );
    }

    #[tokio::test]
    async fn a_sale_is_confirmed_dry_only_with_no_item_left_nor_in_transit() {
        let redis = flashgate_testkit::redis::RedisServer::private();
        let mut conn = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        install(&mut conn, "s", 2, 2).await;
        assert!(
            !confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "both buckets hold an item"
        );
        // A bucket asked to give to itself while it holds items takes nothing.
        assert_eq!(
            take(&mut conn, "s", 0, 0, "self", 8).await.unwrap(),
            Taken::Stocked
        );
        assert_eq!(
            books(&mut conn, "s", 2).await.unwrap().remaining,
            vec![1, 1]
        );
        // Both items leave bucket 1's and bucket 0's remaining, one of them
        // still in transit: not dry.
        assert_eq!(
            take(&mut conn, "s", 0, 1, "x1", 8).await.unwrap(),
            Taken::Moved(1)
        );
        let _: i64 = redis::cmd("DECRBY")
            .arg(SaleKeys::bucket("s", 1).remaining)
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "an item in transit"
        );
        assert!(complete(&mut conn, "s", 0, 1, "x1", 1, "r").await.unwrap());
        assert!(
            !confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "the item arrived in bucket 1"
        );
        let _: i64 = redis::cmd("DECRBY")
            .arg(SaleKeys::bucket("s", 1).remaining)
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "nothing left anywhere"
        );
        assert!(
            !confirm_dry(&mut conn, "s", 3).await.unwrap(),
            "an absent bucket is never confirmed dry"
        );
    }

    #[tokio::test]
    async fn a_stock_move_in_flight_a_moved_base_or_a_fenced_bucket_is_never_confirmed_dry() {
        let redis = flashgate_testkit::redis::RedisServer::private();
        let mut conn = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        install(&mut conn, "s", 2, 2).await;
        for k in 0..2 {
            let _: i64 = redis::cmd("DECRBY")
                .arg(SaleKeys::bucket("s", k).remaining)
                .arg(1)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        assert!(
            confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "every item sold"
        );
        // A stock move in flight on bucket 1 (it may give items back).
        let moving = SaleKeys::bucket("s", 1).moving;
        let _: () = redis::cmd("SET")
            .arg(&moving)
            .arg("1")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            !state(&mut conn, "s", 1).await.unwrap().dry(),
            "a bucket with a move in flight is not dry"
        );
        assert!(
            !confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "a stock move in flight"
        );
        let _: i64 = redis::cmd("DEL")
            .arg(&moving)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "the move ended"
        );
        // A base moved between two reads (items added and sold meanwhile):
        // the reads differ, so the pair never confirms dry.
        let before = state(&mut conn, "s", 0).await.unwrap();
        let _: i64 = redis::cmd("HINCRBY")
            .arg(SaleKeys::bucket("s", 0).meta)
            .arg("stock")
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let after = state(&mut conn, "s", 0).await.unwrap();
        assert!(before.dry() && after.dry());
        assert_eq!(after.base, before.base + 1);
        assert_ne!(before, after, "a moved base is seen between two reads");
        // A bucket whose Redis failed over since it was synced (its `synced`
        // is another replication id) may lack a transfer or a return: never
        // dry until its re-sync writes `synced` again.
        let synced = SaleKeys::bucket("s", 1).synced;
        let replid: String = redis::cmd("GET")
            .arg(&synced)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(&synced)
            .arg("an-earlier-master")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(state(&mut conn, "s", 1).await.unwrap().fenced);
        assert!(
            !confirm_dry(&mut conn, "s", 2).await.unwrap(),
            "a fenced bucket"
        );
        let _: () = redis::cmd("SET")
            .arg(&synced)
            .arg(&replid)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(confirm_dry(&mut conn, "s", 2).await.unwrap(), "re-synced");
    }

    #[tokio::test]
    async fn an_empty_donor_points_at_its_items_in_transit_and_repair_delivers_them() {
        let redis = flashgate_testkit::redis::RedisServer::private();
        let mut conn = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        install(&mut conn, "s", 2, 2).await;
        // Bucket 1 holds 1: it all goes, and the taker "dies".
        assert_eq!(
            take(&mut conn, "s", 1, 0, "x1", 8).await.unwrap(),
            Taken::Moved(1)
        );
        assert_eq!(
            take(&mut conn, "s", 1, 0, "x2", 8).await.unwrap(),
            Taken::InTransit {
                to: 0,
                xid: "x1".into(),
                n: 1,
                replid: flashgate_testkit::master_replid(&mut conn).await
            }
        );
        assert_eq!(books(&mut conn, "s", 2).await.unwrap().in_transit, 1);
        // Too young: left to its gateway.
        assert_eq!(
            repair(&mut conn, "s", 2, crate::now_ms() - 10 * REPAIR_AFTER_MS)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            repair(&mut conn, "s", 2, crate::now_ms() + REPAIR_AFTER_MS)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            repair(&mut conn, "s", 2, crate::now_ms() + REPAIR_AFTER_MS)
                .await
                .unwrap(),
            0,
            "nothing twice"
        );
        let b = books(&mut conn, "s", 2).await.unwrap();
        assert_eq!(
            (b.remaining.clone(), b.in_transit, b.total()),
            (vec![2, 0], 0, 2)
        );
        assert_eq!(
            take(&mut conn, "s", 1, 0, "x3", 8).await.unwrap(),
            Taken::Empty
        );
        assert_eq!(
            take(&mut conn, "s", 5, 0, "x4", 8).await.unwrap(),
            Taken::NotFound
        );
    }
}
