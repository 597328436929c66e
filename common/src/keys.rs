//! The Redis key layout.
//!
//! Every key of one sale carries the hash tag `{sale:<id>}`, so all of them
//! live in one Redis Cluster slot and the deduct script (which touches the
//! stock, the buyers, the idempotency key, the stream and the reservation
//! index at once) runs on a cluster on the master of that slot (a script
//! call is routed by its first key, so every call passes at least one).
//!
//! The keys outside a sale, [`SALES_INDEX`], [`ARCHIVED_SALES`],
//! [`GLOBAL_SWITCH`], the gateway's cluster-wide bucket
//! [`CLUSTER_GLOBAL_LIMIT`], the replica wait's [`WAIT_MARK_KEY`] and the
//! [`EVENTS_CHANNEL`] and the shop cache's [`SHOP_PURGES_STREAM`], keep their names in every mode: on a cluster
//! each lives on its own slot, which is fine because no script, `MULTI` or
//! multi-key command spans two of them (a plain pipeline that reads two is
//! sent as single commands by `redis_conn`). A shared tag would buy nothing
//! and a rename would need an upgrade path for existing deployments. A plain
//! `PUBLISH` reaches every node of a cluster, so the channel needs no tag.
//!
//! Every name is made here, in [`SaleKeys`]; a script gets the names it
//! touches as `KEYS`. The one exception is `lua/draw_run.lua`, which
//! decides entrants it only learns inside the call: it gets the prefixes
//! of a buyer's keys instead ([`BuyerKeyPrefixes`], three arguments), and
//! names each key by the one rule written there: the prefix, the user id,
//! and for the two keys of one buy `:` and the Idempotency-Key or nonce.
//!
//! A bucketed sale (`buckets = N`, see [`crate::buckets`]) keeps its
//! definition in `fg:{sale:ID}:meta` (with `buckets`) and sells from N
//! buckets, bucket `k` holding every key of a sale under the tag
//! `{sale:ID:bk}` ([`SaleKeys::bucket`]).
//!
//! Every key, its type, its writers and what it holds: the table in
//! docs/ARCHITECTURE.md ("Redis keys"), the one list; the test in
//! `keys/key_layout.rs` fails when that table and the keys built here
//! disagree.

/// Set of the ids of every preheated sale.
pub const SALES_INDEX: &str = "fg:sales";

/// Set of the ids of archived sales: ended, every stream entry written as
/// an order and acknowledged, every order settled. Written by the backend
/// only; nobody consumes, polls or reconciles an archived sale. Read
/// outside scripts only, like [`SALES_INDEX`].
pub const ARCHIVED_SALES: &str = "fg:archived";

/// `paused` stops every buy on every gateway (the global degrade switch).
pub const GLOBAL_SWITCH: &str = "fg:switch";

/// The value of [`GLOBAL_SWITCH`] (and of the backend's record of it):
/// `paused` or `open`.
pub fn switch_value(paused: bool) -> &'static str {
    if paused {
        "paused"
    } else {
        "open"
    }
}

/// The cluster-wide bucket of buys (`[limits.cluster_global]`, run by
/// `lua/gcra.lua`): one key on one master, which sees every admitted buy.
pub const CLUSTER_GLOBAL_LIMIT: &str = "fg:{limit}:global";

/// The replica wait's mark outside a cluster, where one master holds every
/// sale; on a cluster each sale's own [`SaleKeys::wait_mark`] routes the
/// round to the sale's master (see `gateway/src/buy/replica_wait.rs`).
pub const WAIT_MARK_KEY: &str = "fg:wait-mark";

/// Consumer group the backend reads each sale's stream with.
pub const CONSUMER_GROUP: &str = "orders";

/// The keys of one waiting room (`[[shop.waiting_rooms]]`), all in the
/// room's slot (`{room:NAME}`): each room script runs on one master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomKeys {
    /// Visitor id → place score, lowest first.
    pub queue: String,
    /// Visitor id → until when (Unix ms) they are inside.
    pub inside: String,
    /// The room's counters: next ticket, mode switch, rate bucket, measured rate.
    pub state: String,
    /// Visitor id → when their place was used (called in); kept a day.
    pub called: String,
}

impl RoomKeys {
    pub fn new(room: &str) -> Self {
        Self {
            queue: format!("fg:{{room:{room}}}:queue"),
            inside: format!("fg:{{room:{room}}}:inside"),
            state: format!("fg:{{room:{room}}}:state"),
            called: format!("fg:{{room:{room}}}:called"),
        }
    }
}

/// The keys of one sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleKeys {
    pub meta: String,
    pub remaining: String,
    pub buyers: String,
    pub stream: String,
    pub reservations: String,
    /// Reservation ids whose item was returned (`lua/release.lua`).
    pub released: String,
    /// Dead-letter stream of entries that could not become orders.
    pub dead: String,
    /// Held by the backend restoring this sale after Redis lost it.
    pub restoring: String,
    /// The `master_replid` of the Redis that was made to agree with the
    /// database on this sale (by its install or by a re-sync). A Redis
    /// gets a new replication id whenever it becomes a master: when a
    /// replica is promoted and when a process starts. Such a Redis may
    /// lack the last writes, so while this key differs from the id of the
    /// Redis holding it, the sale is fenced: the deduct script sells
    /// nothing until the backend has counted every order of the database
    /// in it (see `backend/src/fence.rs`).
    pub synced: String,
    restore_prefix: String,
    pow_prefix: String,
    /// Written before each replica `WAIT` round of the sale (see
    /// `gateway/src/buy/replica_wait.rs`).
    pub wait_mark: String,
    /// The opening draw's record (`lua/draw_run.lua`).
    pub draw: DrawKeys,
    /// A bucket's outgoing transfers, every one kept for the books
    /// (`lua/xfer_out.lua`, `lua/xfer_ack.lua`).
    pub xfer_out: String,
    /// A bucket's outgoing transfers still open (not acknowledged), by
    /// time: what the transit repair and the books read.
    pub xfer_open: String,
    /// A bucket's incoming transfers: each transfer id adds its items once
    /// (`lua/xfer_in.lua`).
    pub xfer_in: String,
    /// A bucket's "stock move in flight" marker, set (with a TTL) by
    /// `lua/bucket_stock.lua` whenever it moves the bucket's base: while it
    /// is set the sold-out confirmation never calls the bucket dry.
    pub moving: String,
    /// The token fence of a bucket's incoming transfers: `D:REPLID` of
    /// each donor Redis a failed-over donor's re-sync fenced off
    /// (`lua/xfer_in.lua` refuses their gives).
    pub xfer_refuse: String,
}

/// The keys of a sale's opening draw (see [`crate::draw`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawKeys {
    pub state: String,
    pub entries: String,
    pub index: String,
    pub outcomes: String,
    pub order: String,
    pub perm: String,
    /// The prefixes of a buyer's keys in the sale, which
    /// [`SaleKeys::idempotency`], [`SaleKeys::call`] and
    /// [`SaleKeys::idempotency_misses`] name from, and the draw script's
    /// arguments for naming an entrant's keys.
    pub prefix: BuyerKeyPrefixes,
}

/// The prefixes of a buyer's keys in one sale (all in the sale's slot).
/// A key is its prefix and the user id, and for the two keys of one buy
/// (`idempotency`, `call`) then `:` and the Idempotency-Key or the call's
/// nonce: the one rule, applied by [`SaleKeys`] and by `lua/draw_run.lua`.
///
/// As a Redis argument it is three: `idempotency`, `call`,
/// `idempotency_misses` (`ARGV[6..8]` of `lua/draw_run.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuyerKeyPrefixes {
    /// `fg:{sale:ID}:idem:`
    pub idempotency: String,
    /// `fg:{sale:ID}:call:`
    pub call: String,
    /// `fg:{sale:ID}:idem-misses:`
    pub idempotency_misses: String,
}

impl BuyerKeyPrefixes {
    /// The key of one buy of `user` under `prefix` (one of this type's),
    /// named by its Idempotency-Key or nonce `of`.
    fn of_buy(prefix: &str, user: &str, of: &str) -> String {
        let mut key = String::with_capacity(prefix.len() + user.len() + 1 + of.len());
        key.push_str(prefix);
        key.push_str(user);
        key.push(':');
        key.push_str(of);
        key
    }
}

impl redis::ToRedisArgs for BuyerKeyPrefixes {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(self.idempotency.as_bytes());
        out.write_arg(self.call.as_bytes());
        out.write_arg(self.idempotency_misses.as_bytes());
    }

    fn num_of_args(&self) -> usize {
        3
    }
}

/// Where one restore builds a sale's state before installing it at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreScratch {
    pub buyers: String,
    pub reservations: String,
    pub released: String,
}

impl SaleKeys {
    pub fn new(sale_id: &str) -> Self {
        let tag = format!("fg:{{sale:{sale_id}}}");
        Self {
            meta: format!("{tag}:meta"),
            remaining: format!("{tag}:remaining"),
            buyers: format!("{tag}:buyers"),
            stream: format!("{tag}:stream"),
            reservations: format!("{tag}:resv"),
            released: format!("{tag}:released"),
            dead: format!("{tag}:dead"),
            restoring: format!("{tag}:restoring"),
            synced: format!("{tag}:synced"),
            restore_prefix: format!("{tag}:restore:"),
            wait_mark: format!("{tag}:wait-mark"),
            pow_prefix: format!("{tag}:pow:"),
            draw: DrawKeys {
                state: format!("{tag}:draw:state"),
                entries: format!("{tag}:draw:entries"),
                index: format!("{tag}:draw:index"),
                outcomes: format!("{tag}:draw:outcomes"),
                order: format!("{tag}:draw:order"),
                perm: format!("{tag}:draw:perm"),
                prefix: BuyerKeyPrefixes {
                    idempotency: format!("{tag}:idem:"),
                    call: format!("{tag}:call:"),
                    idempotency_misses: format!("{tag}:idem-misses:"),
                },
            },
            xfer_out: format!("{tag}:xfer-out"),
            xfer_open: format!("{tag}:xfer-open"),
            xfer_in: format!("{tag}:xfer-in"),
            moving: format!("{tag}:moving"),
            xfer_refuse: format!("{tag}:xfer-refuse"),
        }
    }

    /// The key remembering the first outcome of `user`'s `idempotency_key`.
    /// Keyed by user too, so two users cannot collide on the same key.
    pub fn idempotency(&self, user: &str, idempotency_key: &str) -> String {
        BuyerKeyPrefixes::of_buy(&self.draw.prefix.idempotency, user, idempotency_key)
    }

    /// The key of one buy call sent without an Idempotency-Key (`nonce`,
    /// made by the gateway per call): a win remembered for the call's
    /// re-sends only.
    pub fn call(&self, user: &str, nonce: &str) -> String {
        BuyerKeyPrefixes::of_buy(&self.draw.prefix.call, user, nonce)
    }

    /// The record of a used proof-of-work solution, by its challenge's id
    /// (the gateway's `challenge` module): set once with `SET NX`, so a
    /// solution buys once across every gateway.
    pub fn pow(&self, challenge_id: &str) -> String {
        format!("{}{}", self.pow_prefix, challenge_id)
    }

    /// The hash remembering `user`'s Idempotency-Keys that did not win
    /// (key -> outcome), capped in size by the deduct script.
    pub fn idempotency_misses(&self, user: &str) -> String {
        [self.draw.prefix.idempotency_misses.as_str(), user].concat()
    }

    /// The scratch keys of the restore holding lock token `token`: its own,
    /// so two restorers never write into each other's rebuild, and in the
    /// sale's slot, so the install script can rename them into place.
    pub fn restore_scratch(&self, token: &str) -> RestoreScratch {
        let prefix = format!("{}{token}:", self.restore_prefix);
        RestoreScratch {
            buyers: format!("{prefix}buyers"),
            reservations: format!("{prefix}resv"),
            released: format!("{prefix}released"),
        }
    }
}

impl SaleKeys {
    /// The keys of bucket `k` of `sale_id`: those of the sub-sale `ID:bk`
    /// (hash tag `{sale:ID:bk}`).
    pub fn bucket(sale_id: &str, k: u32) -> Self {
        Self::new(&crate::buckets::bucket_id(sale_id, k))
    }

    /// The keys where `user` buys in `sale_id` of `buckets` buckets: the
    /// sale's own keys when it has one bucket, else the user's home bucket's.
    pub fn home(sale_id: &str, buckets: u32, user: &str) -> Self {
        if buckets <= 1 {
            Self::new(sale_id)
        } else {
            Self::bucket(sale_id, crate::buckets::home_bucket(user, buckets))
        }
    }
}

/// The id whose keys hold `user`'s buys in `sale_id` (the sale itself, or
/// its home bucket's `ID:bk`), for calls that name keys by id.
pub fn home_id(sale_id: &str, buckets: u32, user: &str) -> String {
    if buckets <= 1 {
        sale_id.to_owned()
    } else {
        crate::buckets::bucket_id(sale_id, crate::buckets::home_bucket(user, buckets))
    }
}

/// The bucket count Redis holds for sale `id` (its meta's `buckets`; 1
/// when absent or unreadable as a count).
///
/// # Errors
/// Redis failed.
pub async fn buckets_in_redis<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    id: &str,
) -> redis::RedisResult<u32> {
    let n: Option<String> = redis::cmd("HGET")
        .arg(SaleKeys::new(id).meta)
        .arg("buckets")
        .query_async(conn)
        .await?;
    Ok(n.and_then(|n| n.parse().ok())
        .filter(|n| (1..=crate::buckets::MAX_BUCKETS as u32).contains(n))
        .unwrap_or(1))
}

#[cfg(test)]
mod key_layout;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bucket_keeps_todays_keys() {
        assert_eq!(SaleKeys::home("s1", 1, "alice"), SaleKeys::new("s1"));
        assert_eq!(home_id("s1", 1, "alice"), "s1");
        let b = SaleKeys::bucket("s1", 3);
        assert_eq!(b.meta, "fg:{sale:s1:b3}:meta");
        assert_eq!(b.remaining, "fg:{sale:s1:b3}:remaining");
        assert_eq!(
            SaleKeys::home("s1", 6, "alice"),
            SaleKeys::bucket("s1", crate::buckets::home_bucket("alice", 6))
        );
    }

    #[test]
    fn every_key_of_a_sale_shares_one_hash_tag() {
        let k = SaleKeys::new("s1");
        for (name, key) in super::key_layout::sale_keys(&k) {
            assert!(key.starts_with("fg:{sale:s1}:"), "{name}: {key}");
        }
        // lua/draw_run.lua names an entrant's keys from the prefixes, by
        // the rule of `BuyerKeyPrefixes`.
        let p = &k.draw.prefix;
        for prefix in [&p.idempotency, &p.call, &p.idempotency_misses] {
            assert!(prefix.starts_with("fg:{sale:s1}:"), "{prefix}");
        }
        assert_eq!(k.idempotency("u", "i"), format!("{}u:i", p.idempotency));
        assert_eq!(k.call("u", "n"), format!("{}u:n", p.call));
        assert_eq!(
            k.idempotency_misses("u"),
            format!("{}u", p.idempotency_misses)
        );
        // Three arguments of the draw script, in its order.
        assert_eq!(
            redis::ToRedisArgs::to_redis_args(p),
            vec![
                b"fg:{sale:s1}:idem:".to_vec(),
                b"fg:{sale:s1}:call:".to_vec(),
                b"fg:{sale:s1}:idem-misses:".to_vec(),
            ]
        );
        // Today's names, which keys already in Redis carry.
        assert_eq!(k.idempotency("u", "i"), "fg:{sale:s1}:idem:u:i");
        assert_eq!(k.call("u", "n"), "fg:{sale:s1}:call:u:n");
        assert_eq!(k.idempotency_misses("u"), "fg:{sale:s1}:idem-misses:u");
    }
}

/// Pub/sub channel on which gateways and the backend announce sale changes.
pub const EVENTS_CHANNEL: &str = "fg:events";

/// A message on [`EVENTS_CHANNEL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaleEvent {
    /// A gateway saw the script answer "sold out" at the sale's stock
    /// `epoch` (`lua/release.lua`): stop sending unkeyed buys to Redis,
    /// unless a newer epoch is known (the stock came back since). Encoded
    /// `sold_out:ID:eEPOCH`; the older `sold_out:ID` decodes as epoch 0.
    SoldOut { sale: String, epoch: u64 },
    /// Bucket `bucket` of a bucketed sale was found empty (a deduct's
    /// `sold_out`, or a transfer finding nothing to give): gateways flag
    /// that bucket; the sale is answered sold out once every bucket is.
    /// Encoded `sold_out:ID:bK`, beside the sale-wide `sold_out:ID`.
    BucketSoldOut { sale: String, bucket: u32 },
    /// Items were moved into bucket `bucket` of a bucketed sale: gateways
    /// clear its sold-out flag. Encoded `stocked:ID:bK`.
    BucketStocked { sale: String, bucket: u32 },
    /// An operator changed the sale (stock, window, pause): forget local state.
    Changed(String),
    /// The global switch changed: `true` pauses every sale.
    AllPaused(bool),
    /// An operator purged the shop cache of gateway `from`
    /// (`POST /cache/purge`); every other gateway purges the same: one URL
    /// (path and query), every path under a prefix, or every response the
    /// shop tagged `value`.
    ShopPurge {
        from: String,
        kind: PurgeKind,
        value: String,
    },
}

/// What a [`SaleEvent::ShopPurge`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeKind {
    /// One path and query.
    Url,
    /// Every path starting with it.
    Prefix,
    /// Every response the shop tagged with it.
    Tag,
}

impl PurgeKind {
    /// Its name in events, answers and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            PurgeKind::Url => "url",
            PurgeKind::Prefix => "prefix",
            PurgeKind::Tag => "tag",
        }
    }

    /// Whether `value` may be purged as this kind.
    pub fn valid(self, value: &str) -> bool {
        match self {
            PurgeKind::Url | PurgeKind::Prefix => valid_purge_path(value),
            PurgeKind::Tag => valid_purge_tag(value),
        }
    }
}

/// Every purge of the shop cache, in order, the last
/// [`SHOP_PURGES_KEPT`] or so (`XADD MAXLEN ~`): field `e` holds the
/// [`SaleEvent::ShopPurge`] as announced. The announcement on
/// [`EVENTS_CHANNEL`] is the doorbell; this is what a gateway reads to
/// learn every purge since the last one it applied, also those announced
/// while its subscription was down.
pub const SHOP_PURGES_STREAM: &str = "fg:cache:purges";

/// About how many purges [`SHOP_PURGES_STREAM`] keeps; a gateway away for
/// more than this many drops its whole cache when it comes back.
pub const SHOP_PURGES_KEPT: usize = 10_000;

/// Longest tag a purge names (longer tags are not indexed either).
pub const MAX_PURGE_TAG_BYTES: usize = 128;

/// Whether `tag` may be purged: 1 to [`MAX_PURGE_TAG_BYTES`] visible ASCII
/// characters, no comma (tags are separated by spaces or commas).
pub fn valid_purge_tag(tag: &str) -> bool {
    (1..=MAX_PURGE_TAG_BYTES).contains(&tag.len())
        && tag.bytes().all(|b| b.is_ascii_graphic() && b != b',')
}

/// Records a shop cache purge in [`SHOP_PURGES_STREAM`]; answers its id.
///
/// # Errors
/// When Redis cannot be reached.
pub async fn record_purge(
    conn: &mut impl redis::aio::ConnectionLike,
    event: &SaleEvent,
) -> redis::RedisResult<String> {
    redis::cmd("XADD")
        .arg(SHOP_PURGES_STREAM)
        .arg("MAXLEN")
        .arg("~")
        .arg(SHOP_PURGES_KEPT)
        .arg("*")
        .arg("e")
        .arg(event.encode())
        .query_async(conn)
        .await
}

/// Longest path a [`SaleEvent::ShopPurge`] carries.
pub const MAX_PURGE_PATH_BYTES: usize = 4096;

/// Whether `path` may be purged: a path (and query) of at most
/// [`MAX_PURGE_PATH_BYTES`], without control characters.
pub fn valid_purge_path(path: &str) -> bool {
    path.starts_with('/')
        && path.len() <= MAX_PURGE_PATH_BYTES
        && !path.bytes().any(|b| b.is_ascii_control())
}

fn decode_purge(rest: &str) -> Option<SaleEvent> {
    let (from, rest) = rest.split_once(':')?;
    let (kind, value) = rest.split_once(':')?;
    let kind = match kind {
        "url" => PurgeKind::Url,
        "prefix" => PurgeKind::Prefix,
        "tag" => PurgeKind::Tag,
        _ => return None,
    };
    let from_ok = (1..=32).contains(&from.len()) && from.bytes().all(|b| b.is_ascii_alphanumeric());
    (from_ok && kind.valid(value)).then(|| SaleEvent::ShopPurge {
        from: from.to_owned(),
        kind,
        value: value.to_owned(),
    })
}

impl SaleEvent {
    pub fn encode(&self) -> String {
        match self {
            SaleEvent::SoldOut { sale, epoch } => format!("sold_out:{sale}:e{epoch}"),
            SaleEvent::BucketSoldOut { sale, bucket } => {
                format!("sold_out:{}", crate::buckets::bucket_id(sale, *bucket))
            }
            SaleEvent::BucketStocked { sale, bucket } => {
                format!("stocked:{}", crate::buckets::bucket_id(sale, *bucket))
            }
            SaleEvent::Changed(id) => format!("changed:{id}"),
            SaleEvent::AllPaused(true) => "switch:paused".into(),
            SaleEvent::AllPaused(false) => "switch:open".into(),
            SaleEvent::ShopPurge { from, kind, value } => {
                format!("purge:{from}:{}:{value}", kind.label())
            }
        }
    }

    pub fn decode(msg: &str) -> Option<Self> {
        let (kind, id) = msg.split_once(':')?;
        match (kind, id) {
            ("switch", "paused") => return Some(SaleEvent::AllPaused(true)),
            ("switch", "open") => return Some(SaleEvent::AllPaused(false)),
            ("purge", rest) => return decode_purge(rest),
            _ => {}
        }
        if let Some((sale, epoch)) = id.split_once(":e") {
            let epoch: u64 = epoch.parse().ok()?;
            let canonical = epoch.to_string() == id[sale.len() + 2..];
            return (kind == "sold_out" && canonical && crate::sale::valid_sale_id(sale)).then(
                || SaleEvent::SoldOut {
                    sale: sale.to_owned(),
                    epoch,
                },
            );
        }
        if let Some((sale, bucket)) = id.split_once(":b") {
            let bucket: u32 = bucket
                .parse()
                .ok()
                .filter(|b| i64::from(*b) < crate::buckets::MAX_BUCKETS)?;
            if !crate::sale::valid_sale_id(sale) || bucket.to_string() != id[sale.len() + 2..] {
                return None;
            }
            let sale = sale.to_owned();
            return match kind {
                "sold_out" => Some(SaleEvent::BucketSoldOut { sale, bucket }),
                "stocked" => Some(SaleEvent::BucketStocked { sale, bucket }),
                _ => None,
            };
        }
        if !crate::sale::valid_sale_id(id) {
            return None;
        }
        match kind {
            "sold_out" => Some(SaleEvent::SoldOut {
                sale: id.to_owned(),
                epoch: 0,
            }),
            "changed" => Some(SaleEvent::Changed(id.to_owned())),
            _ => None,
        }
    }
}

/// Announces `event` on [`EVENTS_CHANNEL`] to every gateway: the one
/// place a sale event is sent, by gateways and the backend alike.
///
/// # Errors
/// When Redis cannot be reached.
pub async fn publish(
    conn: &mut impl redis::aio::ConnectionLike,
    event: &SaleEvent,
) -> redis::RedisResult<()> {
    redis::cmd("PUBLISH")
        .arg(EVENTS_CHANNEL)
        .arg(event.encode())
        .query_async(conn)
        .await
}

#[cfg(test)]
mod event_tests {
    use super::SaleEvent;

    #[test]
    fn events_round_trip_and_garbage_is_ignored() {
        for e in [
            SaleEvent::SoldOut {
                sale: "s-1".into(),
                epoch: 1_733_000_000_007,
            },
            SaleEvent::Changed("s_2".into()),
            SaleEvent::AllPaused(true),
            SaleEvent::AllPaused(false),
        ] {
            assert_eq!(SaleEvent::decode(&e.encode()), Some(e));
        }
        assert_eq!(SaleEvent::decode("sold_out:a b"), None);
        assert_eq!(
            SaleEvent::decode("stocked:s"),
            None,
            "stocked is per bucket only"
        );
    }

    #[test]
    fn bucket_events_round_trip_and_one_bucket_keeps_the_old_form() {
        assert_eq!(
            SaleEvent::SoldOut {
                sale: "s".into(),
                epoch: 3
            }
            .encode(),
            "sold_out:s:e3"
        );
        assert_eq!(
            SaleEvent::decode("sold_out:s"),
            Some(SaleEvent::SoldOut {
                sale: "s".into(),
                epoch: 0
            }),
            "the older form"
        );
        for bad in [
            "sold_out:s:e",
            "sold_out:s:e03",
            "sold_out:s:ex",
            "sold_out::e1",
            "changed:s:e1",
            "sold_out:a b:e1",
        ] {
            assert_eq!(SaleEvent::decode(bad), None, "{bad}");
        }
        let e = SaleEvent::BucketSoldOut {
            sale: "s-1".into(),
            bucket: 3,
        };
        assert_eq!(e.encode(), "sold_out:s-1:b3");
        assert_eq!(SaleEvent::decode("sold_out:s-1:b3"), Some(e));
        let e = SaleEvent::BucketStocked {
            sale: "s".into(),
            bucket: 63,
        };
        assert_eq!(e.encode(), "stocked:s:b63");
        assert_eq!(SaleEvent::decode(&e.encode()), Some(e));
        for bad in [
            "sold_out:s:b",
            "sold_out:s:b64",
            "sold_out:s:b03",
            "sold_out:s:bx",
            "sold_out::b1",
            "changed:s:b1",
            "sold_out:a b:b1",
        ] {
            assert_eq!(SaleEvent::decode(bad), None, "{bad}");
        }
        assert_eq!(SaleEvent::decode("bogus:s"), None);
    }

    #[test]
    fn shop_purges_round_trip_and_bad_paths_are_ignored() {
        for e in [
            SaleEvent::ShopPurge {
                from: "a1".into(),
                kind: super::PurgeKind::Url,
                value: "/p?x=1:2".into(),
            },
            SaleEvent::ShopPurge {
                from: "b2".into(),
                kind: super::PurgeKind::Prefix,
                value: "/products/".into(),
            },
            SaleEvent::ShopPurge {
                from: "b2".into(),
                kind: super::PurgeKind::Tag,
                value: "product-42".into(),
            },
        ] {
            assert_eq!(SaleEvent::decode(&e.encode()), Some(e));
        }
        for bad in [
            "purge:a1:url:p",
            "purge:a1:all:/p",
            "purge:a-1:url:/p",
            "purge::url:/p",
            "purge:a1:url:/p\r\nx",
            "purge:a1:/p",
            "purge:a1:tag:",
            "purge:a1:tag:a b",
            "purge:a1:tag:a,b",
        ] {
            assert_eq!(SaleEvent::decode(bad), None, "{bad}");
        }
        assert_eq!(
            SaleEvent::decode(&format!(
                "purge:a1:url:/{}",
                "x".repeat(super::MAX_PURGE_PATH_BYTES)
            )),
            None
        );
    }
}
