//! [`SaleCache`]: everything one gateway holds about its sales.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use flashgate_common::keys::SALES_INDEX;

use super::map::SaleMap;
use super::snapshot::{
    read_snapshot, SaleSnapshot, SaleSummary, SaleView, SaleWindow, WindowCheck,
};
use crate::infra::OrderClient;
use crate::infra::{RedisClient, RedisError};

/// How old a snapshot may be for a buy's window check.
pub const WINDOW_TTL: Duration = Duration::from_secs(2);
/// How long a sold-out flag is trusted without news.
pub const SOLD_OUT_TTL: Duration = Duration::from_secs(30);
/// How long the backend's answer about a sale missing from Redis is trusted.
pub const MISSING_TTL: Duration = Duration::from_secs(1);
/// Most sales tracked at once.
const MAX_SALES: u64 = 10_000;
/// How long the buyers of a sold-out sale, as read, answer its keyed buys:
/// past it, keyed buys go to the script again until one finds it sold out,
/// which renews them (read anew if its stock epoch moved), or, for a buy
/// that cannot reach the script ([`SaleCache::read_buyers`]), a read of the
/// same proof renews them. It bounds how long a buyer who won after items
/// came back, unheard of here, can be told "sold out" on a retry.
pub const BUYERS_TTL: Duration = Duration::from_secs(1);
/// Most buyers held per sale (about 100 bytes each); a sale with more
/// leaves keyed buys' answers to the script.
const MAX_BUYERS: usize = 20_000;
/// Least time between two reads of a sale's buyers by one gateway
/// (renewals of held ones read no buyers: [`BUYERS_RETRY`]).
pub const BUYERS_READ_INTERVAL: Duration = Duration::from_secs(5);
/// Least time between two renewals of held buyers by
/// [`SaleCache::read_buyers`], from the end of one to the start of the next.
const BUYERS_RETRY: Duration = Duration::from_millis(100);

/// Who has ever reserved an item of a sold-out sale, as read from Redis:
/// a keyed buy of anyone else can only be answered "sold out" (there is no
/// win of theirs to replay), so it is answered here.
struct Buyers {
    users: std::collections::HashSet<String, Hasher>,
    /// When a proof last began that these buyers are complete: the script
    /// found the sale sold out at `epoch`, or a read found none left at
    /// `epoch` ([`SaleCache::read_buyers`]).
    read_at: Instant,
    /// The stock epoch of that proof: a win after it needs items back,
    /// which moves the epoch.
    epoch: u64,
    /// When the last renewal by [`SaleCache::read_buyers`] ended.
    renewed: Option<Instant>,
    /// The sale's clears when the read began: a clear since (items back, a
    /// change) makes the read stale.
    clears: Clears,
}

/// A snapshot and when it was read.
#[derive(Clone)]
struct Held {
    snapshot: Arc<SaleSnapshot>,
    read_at: Instant,
}

/// What the backend said about a sale Redis does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingSale {
    /// The database has it: Redis lost it and it is being restored.
    Restoring,
    /// Nobody knows this sale.
    Unknown,
    /// The backend did not answer: refuse to sell, but do not say 404.
    NoAnswer,
}

/// What one gateway knows of a sale's stock: its sold-out flag, and what
/// tells a stale `sold_out` from a fresh one.
#[derive(Debug, Clone, Copy, Default)]
struct Stock {
    /// The newest stock epoch known (`lua/release.lua`): from `sold_out`
    /// answers and events, and read from Redis on each `changed` event. A
    /// `sold_out` decided at an older epoch was decided before items came
    /// back, and flags nothing.
    epoch: u64,
    /// Flagged sold out until then: unkeyed buys are answered without Redis.
    sold_out_until: Option<Instant>,
    /// The sale's clears so far (see [`Clears`]).
    clears: Clears,
    /// Since a blind clear (its epoch unknown here): another gateway's
    /// `sold_out` may be older than the change and this gateway cannot
    /// tell, so announced ones flag nothing until an epoch is known again
    /// (a clear whose epoch was read, or a `sold_out` of its own deducts
    /// sent after the clear).
    distrust_announced: bool,
}

/// Where a sale stands in its clears (a change, items back, a bucket
/// stocked, the subscription re-established): taken before a call whose
/// `sold_out` is read later, it tells whether stock may have come back
/// since ([`SaleCache::flag_sold_out`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clears {
    /// The number of the sale's last clear of any kind.
    all: u64,
    /// The number of its last clear whose new stock epoch is not known
    /// here (its read failed, or it has none: a bucket stocked): only
    /// these can make a `sold_out` that carries its epoch stale unseen.
    blind: u64,
}

impl Stock {
    fn flagged(&self) -> bool {
        self.sold_out_until
            .is_some_and(|until| Instant::now() < until)
    }
}

/// The hasher of every table here: aHash, seeded at random per process.
/// Sale ids come from request paths, so a client chooses the ones it asks
/// for (and unknown ones are remembered in `absent`); the random seed
/// keeps it from aiming them at one bucket, at a fraction of SipHash's
/// cost on every buy's lookups.
type Hasher = ahash::RandomState;

/// Everything this gateway holds about one sale: one entry, so one bound
/// and one lifetime for all of it. Each part says itself how long it is
/// trusted (a snapshot's age, a bucket hint's deadline).
#[derive(Default)]
struct Sale {
    /// The latest snapshot and when it was read; `None` before the first
    /// read, after a change, or while Redis does not have the sale.
    snapshot: Mutex<Option<Held>>,
    /// Held by the one caller reading a new snapshot: concurrent callers
    /// that find it stale wait for that read instead of making their own.
    refresh: tokio::sync::Mutex<()>,
    /// The sold-out flag, stock epoch and clears (see [`Stock`]).
    stock: Mutex<Stock>,
    /// Buckets flagged empty, each until when the hint is trusted: set
    /// from a deduct's `sold_out` on a bucket or a transfer finding a
    /// bucket empty (here or announced), cleared when items move into the
    /// bucket. The sale's own flag is set only once every bucket was
    /// confirmed dry in Redis; these are hints for choosing donors.
    empty_buckets: Mutex<HashMap<u32, Instant>>,
    /// The bucket count as last read (0: not read yet): it never changes
    /// for a saved sale, so a buy answered locally finds its home bucket
    /// without Redis.
    buckets: AtomicU32,
    /// The sale's buyers, read once it was found sold out (see [`Buyers`]).
    buyers: Mutex<Option<Buyers>>,
    /// Held by the one caller reading the buyers; when the last read of
    /// them began (and, for [`SaleCache::read_buyers`]'s, ended).
    buyers_read: tokio::sync::Mutex<Option<Instant>>,
    /// When a read began that found no reservation of the sale, and the
    /// sale's clears then (see [`SaleCache::never_sold`]).
    unsold: Mutex<Option<(Instant, Clears)>>,
    /// Held by the one caller reading whether the sale sold anything.
    unsold_read: tokio::sync::Mutex<()>,
}

/// A lock that a panicking holder left behind is still usable: every
/// critical section here leaves its value whole.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sale {
    /// The snapshot if it was read at most `max_age` ago.
    fn fresh(&self, max_age: Duration) -> Option<Held> {
        locked(&self.snapshot)
            .clone()
            .filter(|h| h.read_at.elapsed() <= max_age)
    }

    /// The clears and stock epoch of the sale's sold-out flag, while it is
    /// flagged.
    fn flag(&self) -> Option<(Clears, u64)> {
        let stock = locked(&self.stock);
        stock.flagged().then_some((stock.clears, stock.epoch))
    }

    /// Whether the sale is flagged and its buyers, read at most
    /// [`BUYERS_TTL`] ago with no clear since and at an epoch no older
    /// than the flag's, are held (and do not include `user`, when given).
    fn buyers_answer(&self, user: Option<&str>) -> bool {
        let Some((clears, epoch)) = self.flag() else {
            return false;
        };
        locked(&self.buyers).as_ref().is_some_and(|b| {
            // A newer epoch known here (an announced sold out) may have
            // winners this read never saw.
            b.clears == clears
                && b.epoch >= epoch
                && b.read_at.elapsed() < BUYERS_TTL
                && user.is_none_or(|u| !b.users.contains(u))
        })
    }

    /// Whether a read of the sale's reservations, begun at most
    /// [`BUYERS_TTL`] ago with no clear since, found none.
    fn unsold(&self) -> bool {
        let clears = locked(&self.stock).clears;
        locked(&self.unsold).is_some_and(|(at, c)| c == clears && at.elapsed() < BUYERS_TTL)
    }

    /// Whether this entry holds nothing worth keeping: a first read found
    /// no sale, and no event or answer ever told of one.
    fn is_blank(&self) -> bool {
        let stock = locked(&self.stock);
        locked(&self.snapshot).is_none()
            && stock.epoch == 0
            && stock.clears == Clears::default()
            && stock.sold_out_until.is_none()
            && locked(&self.empty_buckets).is_empty()
    }
}

/// One per gateway, shared by the buy path, the sale routes and the
/// events listener.
pub struct SaleCache {
    /// One entry per sale (see [`Sale`]), at most [`MAX_SALES`]
    /// (`sales::map`: how the bound is kept).
    sales: SaleMap<Sale>,
    /// Sale ids Redis does not have, with when that was read; apart from
    /// `sales` so a flood of reads of made-up ids cannot evict the state
    /// real sales' buys use.
    absent: moka::future::Cache<String, Instant, Hasher>,
    /// What the backend said of an id Redis does not have, for
    /// [`MISSING_TTL`] (made-up ids too, hence apart from `sales` as well).
    missing: moka::future::Cache<String, MissingSale, Hasher>,
    view_ttl: Duration,
    /// Numbers the clears of every sale.
    clear_count: AtomicU64,
}

impl SaleCache {
    /// A cache whose views are at most `view_ttl` old (`pages.state_ttl_ms`).
    pub fn new(view_ttl: Duration) -> Self {
        Self {
            sales: SaleMap::new(MAX_SALES as usize, Sale::is_blank),
            absent: moka::future::Cache::builder()
                .max_capacity(MAX_SALES)
                .time_to_live(view_ttl.max(WINDOW_TTL))
                .build_with_hasher(Hasher::new()),
            missing: moka::future::Cache::builder()
                .max_capacity(MAX_SALES)
                .time_to_live(MISSING_TTL)
                .build_with_hasher(Hasher::new()),
            view_ttl,
            clear_count: AtomicU64::new(0),
        }
    }

    /// The sale's entry, made empty if it has none yet.
    fn sale(&self, sale_id: &str) -> Arc<Sale> {
        self.sales.get_or_default(sale_id)
    }

    /// The sale's snapshot, at most `max_age` old: from memory, or one Redis
    /// read shared by every concurrent caller (they queue on the entry's
    /// `refresh` and find the snapshot the first one read).
    ///
    /// # Errors
    /// When Redis cannot be read; nothing is cached then, and the next call
    /// retries.
    async fn snapshot(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        max_age: Duration,
    ) -> Result<Option<Arc<SaleSnapshot>>, Arc<RedisError>> {
        // The buy path's common case, in one lookup. A read that finds the
        // sale gone clears the entry's snapshot, so a held one is newer than
        // any `absent` record of that entry; either answer is within
        // `max_age`, and the deduct script has the last word on a buy.
        if let Some(held) = self.sales.get(sale_id).and_then(|s| s.fresh(max_age)) {
            return Ok(Some(held.snapshot));
        }
        if let Some(read_at) = self.absent.get(sale_id).await {
            if read_at.elapsed() <= max_age {
                return Ok(None);
            }
        }
        let sale = self.sale(sale_id);
        let _reading = sale.refresh.lock().await;
        if let Some(held) = sale.fresh(max_age) {
            return Ok(Some(held.snapshot));
        }
        if let Some(read_at) = self.absent.get(sale_id).await {
            if read_at.elapsed() <= max_age {
                return Ok(None);
            }
        }
        let read_at = Instant::now();
        // Boxed: held inline, the read's future would grow the future of
        // every request that can reach here, where only a miss needs it.
        let read = Box::pin(read_snapshot(redis, sale_id)).await;
        let snapshot = match read {
            Ok(Some(snapshot)) => snapshot,
            Ok(None) => {
                *locked(&sale.snapshot) = None;
                self.sales.remove_blank(sale_id, &sale);
                self.absent.insert(sale_id.to_owned(), read_at).await;
                return Ok(None);
            }
            Err(error) => {
                self.sales.remove_blank(sale_id, &sale);
                return Err(Arc::new(error));
            }
        };
        let snapshot = Arc::new(snapshot);
        sale.buckets
            .store(snapshot.window.buckets, Ordering::Relaxed);
        *locked(&sale.snapshot) = Some(Held {
            snapshot: snapshot.clone(),
            read_at,
        });
        Ok(Some(snapshot))
    }

    /// The sale's window for a buy (`None`: not in Redis), at most
    /// [`WINDOW_TTL`] old.
    ///
    /// # Errors
    /// When Redis cannot be read.
    pub async fn window(
        &self,
        redis: &RedisClient,
        sale_id: &str,
    ) -> Result<Option<SaleWindow>, Arc<RedisError>> {
        Ok(self
            .snapshot(redis, sale_id, WINDOW_TTL)
            .await?
            .map(|s| s.window))
    }

    /// The sale's checkout template (`checkout_url`), from the snapshot a
    /// buy reads (at most [`WINDOW_TTL`] old); `None` when it has none, or
    /// the sale cannot be read (the win stands; its answer goes without).
    pub async fn checkout_url(&self, redis: &RedisClient, sale_id: &str) -> Option<String> {
        match self.snapshot(redis, sale_id, WINDOW_TTL).await {
            Ok(snapshot) => snapshot.and_then(|s| s.checkout_url.clone()),
            Err(error) => {
                tracing::warn!(%error, sale = sale_id, "cannot read the sale's checkout_url");
                None
            }
        }
    }

    /// The sale's view at `now_ms`, from a snapshot at most
    /// `pages.state_ttl_ms` old.
    ///
    /// # Errors
    /// When Redis cannot be read.
    pub async fn view(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        now_ms: i64,
    ) -> Result<Option<SaleView>, Arc<RedisError>> {
        Ok(self
            .snapshot(redis, sale_id, self.view_ttl)
            .await?
            .and_then(|s| s.view(now_ms)))
    }

    /// Every preheated sale, sorted by start time. Each sale comes from its
    /// snapshot, so listing costs what reading each sale costs.
    ///
    /// # Errors
    /// When Redis fails or times out.
    pub async fn list(
        &self,
        redis: &RedisClient,
        now_ms: i64,
    ) -> Result<Vec<SaleSummary>, Arc<RedisError>> {
        let ids: Vec<String> = redis
            .call(|mut conn| async move {
                redis::cmd("SMEMBERS")
                    .arg(SALES_INDEX)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(s) = self
                .snapshot(redis, &id, self.view_ttl)
                .await?
                .and_then(|s| s.summary(now_ms))
            {
                out.push(s);
            }
        }
        out.sort_by(|a, b| a.starts_at.cmp(&b.starts_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The held snapshot of a sale, whatever its age.
    fn held(&self, sale_id: &str) -> Option<Held> {
        self.sales
            .get(sale_id)
            .and_then(|sale| locked(&sale.snapshot).clone())
    }

    /// Counts a win of this gateway's in the sale's snapshot, if held (no
    /// Redis call), so its own buyers' next view shows the item gone. Only
    /// a snapshot read before the win's script was sent (`sent_at`) is
    /// counted down: one read after it may already hold the win, and
    /// counting it twice would show items gone that are still for sale
    /// (an over-report until the next refresh is the lesser error).
    pub async fn took_one(&self, sale_id: &str, sent_at: Instant) {
        if let Some(held) = self.held(sale_id) {
            if held.read_at < sent_at {
                held.snapshot.took_one();
            }
        }
    }

    /// Whether the sale is flagged sold out here: an unkeyed buy is then
    /// answered without Redis.
    pub fn is_sold_out(&self, sale_id: &str) -> bool {
        self.sales
            .get(sale_id)
            .is_some_and(|sale| locked(&sale.stock).flagged())
    }

    /// Whether a keyed buy of `user` is answered "sold out" here: the sale
    /// is flagged, and its buyers, read at most [`BUYERS_TTL`] ago with no
    /// clear since, do not include `user`. A buyer's keyed retry goes to
    /// the script, which replays their win. Such an answer is not
    /// remembered under the key: a retry after items came back may win.
    pub fn sold_out_for_keyed(&self, sale_id: &str, user: &str) -> bool {
        self.sales
            .get(sale_id)
            .is_some_and(|sale| sale.buyers_answer(Some(user)))
    }

    /// Keeps the buyers of a one-bucket sale the script found sold out at
    /// stock `epoch`, in a call sent at `sent_at` after `clears` was taken:
    /// a read of the same epoch with no clear since is still complete, and
    /// is only renewed; otherwise they are read again (the users of the
    /// sale's reservations, returned ones included), at most once per
    /// [`BUYERS_READ_INTERVAL`] per sale whatever the read found, so
    /// returns at a sale's sell-out cannot turn into a read per return on
    /// every gateway. A sale with more than [`MAX_BUYERS`] reservations
    /// keeps sending keyed buys to the script.
    pub async fn keep_buyers(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        clears: Clears,
        epoch: u64,
        sent_at: Instant,
    ) {
        let sale = self.sale(sale_id);
        if let Some(b) = locked(&sale.buyers)
            .as_mut()
            .filter(|b| b.clears == clears && b.epoch == epoch)
        {
            // Proven complete when the script ran, not when its answer came.
            b.read_at = b.read_at.max(sent_at);
            return;
        }
        let Ok(mut last_read) = sale.buyers_read.try_lock() else {
            return;
        };
        if last_read.is_some_and(|at| at.elapsed() < BUYERS_READ_INTERVAL) {
            return;
        }
        *last_read = Some(Instant::now());
        let resv = flashgate_common::keys::SaleKeys::new(sale_id).reservations;
        let users: Result<Option<Vec<String>>, RedisError> = redis
            .call(|mut conn| async move {
                let n: usize = redis::cmd("HLEN").arg(&resv).query_async(&mut conn).await?;
                if n > MAX_BUYERS {
                    return Ok::<_, redis::RedisError>(None);
                }
                redis::cmd("HVALS")
                    .arg(&resv)
                    .query_async(&mut conn)
                    .await
                    .map(Some)
            })
            .await;
        let Ok(Some(users)) = users else {
            return;
        };
        // Read after the script's sold out: every win before it is here; a
        // win after it needs items back, a clear, which voids this read.
        if locked(&sale.stock).clears == clears {
            *locked(&sale.buyers) = Some(Buyers {
                users: users.into_iter().collect(),
                read_at: sent_at,
                epoch,
                clears,
                renewed: None,
            });
        }
    }

    /// Keeps the buyers of a one-bucket sale flagged sold out here without
    /// this gateway's script having found it so (another gateway's
    /// announce), for keyed buys that cannot reach the script to have them
    /// proven (under `[challenge]`, a buy without a solution). They are
    /// read by `lua/buyers_read.lua` with the proof the script's `sold_out`
    /// gives (the sale here, one bucket, not fenced, no item left) and its
    /// stock epoch; held ones are renewed by the same proof without reading
    /// them again, and voided when the proof fails or the epoch moved. A read of
    /// the buyers happens at most once per [`BUYERS_READ_INTERVAL`] per
    /// sale, as `keep_buyers`'s, a renewal once per [`BUYERS_RETRY`];
    /// concurrent callers wait for the one under way and use what it found.
    pub async fn read_buyers(&self, redis: &RedisClient, sale_id: &str) {
        let Some(sale) = self.sales.get(sale_id) else {
            return;
        };
        let mut last_read = sale.buyers_read.lock().await;
        if sale.buyers_answer(None) {
            return;
        }
        let Some((clears, epoch)) = sale.flag() else {
            return;
        };
        // Held ones of this stock epoch, no clear since: only renewed.
        let renew = locked(&sale.buyers)
            .as_ref()
            .filter(|b| b.clears == clears && b.epoch >= epoch)
            .map(|b| (b.epoch, b.renewed));
        let due = match renew {
            Some((_, renewed)) => renewed.is_none_or(|at| at.elapsed() >= BUYERS_RETRY),
            None => last_read.is_none_or(|at| at.elapsed() >= BUYERS_READ_INTERVAL),
        };
        if !due {
            return;
        }
        let began = Instant::now();
        let keys = flashgate_common::keys::SaleKeys::new(sale_id);
        let mut invocation = flashgate_common::scripts::BUYERS_READ.prepare_invoke();
        invocation
            .key(&keys.meta)
            .key(&keys.remaining)
            .key(&keys.reservations)
            .key(&keys.synced)
            .arg(if renew.is_some() { "" } else { "1" })
            .arg(MAX_BUYERS);
        // Stamped when the read begins (a caller dropped mid-read still
        // spends the interval) and again when it is over (a caller that
        // waited for it uses what it found, however long it took).
        if renew.is_none() {
            *last_read = Some(began);
        }
        let read: Result<Vec<String>, RedisError> = redis
            .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await;
        if renew.is_none() {
            *last_read = Some(Instant::now());
        }
        let failed = read.is_err();
        let mut reply = read.unwrap_or_default().into_iter();
        let proven = reply.next().as_deref() == Some("proven");
        let read_epoch = reply.next().and_then(|e| e.parse::<u64>().ok());
        let users = (proven && renew.is_none())
            .then(|| reply.collect::<std::collections::HashSet<String, Hasher>>());
        // A clear since voids the read (one after this check leaves
        // buyers of old clears, which answer nothing).
        if locked(&sale.stock).clears != clears {
            return;
        }
        let mut buyers = locked(&sale.buyers);
        match (renew, users) {
            (Some((held, _)), None) => {
                if let Some(b) = buyers.as_mut().filter(|b| b.clears == clears) {
                    if proven && read_epoch == Some(held) {
                        b.read_at = b.read_at.max(began);
                    } else if !failed {
                        // Items back since, or the proof failed: read them
                        // all next time.
                        *buyers = None;
                        return;
                    }
                    b.renewed = Some(Instant::now());
                }
            }
            (None, Some(users)) => {
                if let Some(epoch) = read_epoch {
                    *buyers = Some(Buyers {
                        users,
                        read_at: began,
                        epoch,
                        clears,
                        renewed: None,
                    });
                }
            }
            _ => {}
        }
    }

    /// Whether the one-bucket sale `sale_id` had no reservation at all, in
    /// a read begun at most [`BUYERS_TTL`] ago with no clear since (a
    /// change, items back): then no Idempotency-Key of it holds a win, and
    /// a keyed buy refused before the start has nothing to replay. One
    /// `HLEN` per sale per [`BUYERS_TTL`]; while another caller reads, or
    /// when Redis fails, `false` (the caller asks Redis for the key).
    pub async fn never_sold(&self, redis: &RedisClient, sale_id: &str) -> bool {
        let sale = self.sale(sale_id);
        if sale.unsold() {
            return true;
        }
        let Ok(_reading) = sale.unsold_read.try_lock() else {
            return false;
        };
        let (began, clears) = (Instant::now(), locked(&sale.stock).clears);
        let resv = flashgate_common::keys::SaleKeys::new(sale_id).reservations;
        let held: Result<usize, RedisError> =
            redis
                .call(|mut conn| async move {
                    redis::cmd("HLEN").arg(&resv).query_async(&mut conn).await
                })
                .await;
        if held.is_ok_and(|n| n == 0) {
            *locked(&sale.unsold) = Some((began, clears));
        }
        sale.unsold()
    }

    /// How long until the sale starts, when what is held here, without
    /// Redis, says a buy is refused "not started" with nothing to replay:
    /// its window (read at most [`WINDOW_TTL`] ago) has not opened, it is
    /// not flagged sold out, and for a `keyed` buy it has one bucket and
    /// [`SaleCache::never_sold`] holds. `None` leaves the buy to the
    /// checks that may read Redis.
    pub fn held_not_started(&self, sale_id: &str, now_ms: i64, keyed: bool) -> Option<u64> {
        let sale = self.sales.get(sale_id)?;
        let window = sale.fresh(WINDOW_TTL)?.snapshot.window;
        let WindowCheck::NotStarted { wait_secs } = window.check(now_ms) else {
            return None;
        };
        if locked(&sale.stock).flagged() || (keyed && (window.buckets != 1 || !sale.unsold())) {
            return None;
        }
        Some(wait_secs)
    }

    /// Flags the sale sold out (or renews its flag) for a `sold_out`
    /// decided at stock `epoch`, unless stock came back after it was
    /// decided: a newer epoch is known, or the sale was cleared since
    /// `clears` was taken (before the call that found it) in a way its
    /// epoch cannot tell. Without an epoch (the draw's outcome, a bucketed
    /// sale confirmed dry) it is judged at the newest epoch known, by every
    /// clear since `clears`. The epoch flagged at when the sale was not
    /// flagged before (the caller announces it with that epoch).
    pub fn flag_sold_out(
        &self,
        sale_id: &str,
        epoch: Option<u64>,
        clears: Option<Clears>,
    ) -> Option<u64> {
        let sale = self.sale(sale_id);
        let mut stock = locked(&sale.stock);
        let cleared = match clears {
            Some(c) if epoch.is_some() => c.blind != stock.clears.blind,
            Some(c) => c != stock.clears,
            // Announced by another gateway.
            None => stock.distrust_announced,
        };
        let carried = epoch.is_some();
        let epoch = epoch.unwrap_or(stock.epoch);
        if epoch < stock.epoch || cleared {
            return None;
        }
        let newly = (!stock.flagged()).then_some(epoch);
        stock.distrust_announced &= !(carried && clears.is_some());
        stock.epoch = epoch;
        stock.sold_out_until = Some(Instant::now() + SOLD_OUT_TTL);
        newly
    }

    /// The script found `sale_id` sold out just now, at stock `epoch`, for
    /// a call sent at `clears`: flagged as [`SaleCache::flag_sold_out`]
    /// does, and its snapshot shows no stock left.
    pub async fn found_sold_out(
        &self,
        sale_id: &str,
        epoch: Option<u64>,
        clears: Clears,
    ) -> Option<u64> {
        let newly = self.flag_sold_out(sale_id, epoch, Some(clears));
        if self.is_sold_out(sale_id) {
            if let Some(held) = self.held(sale_id) {
                held.snapshot.sold_out();
            }
        }
        newly
    }

    /// Where the sale stands in its clears ([`Clears`]).
    pub fn clears(&self, sale_id: &str) -> Clears {
        self.sales
            .get(sale_id)
            .map(|sale| locked(&sale.stock).clears)
            .unwrap_or_default()
    }

    /// Clears the sale's flag and counts a clear; the stock epoch rises to
    /// `epoch` when one is given (else the clear is a blind one).
    fn clear(&self, sale: &Sale, epoch: Option<u64>) {
        let number = self.clear_count.fetch_add(1, Ordering::Relaxed) + 1;
        // Void now (their clears no longer match): freed at once.
        *locked(&sale.buyers) = None;
        let mut stock = locked(&sale.stock);
        let blind = if epoch.is_some() {
            stock.clears.blind
        } else {
            number
        };
        *stock = Stock {
            epoch: stock.epoch.max(epoch.unwrap_or(0)),
            sold_out_until: None,
            clears: Clears { all: number, blind },
            distrust_announced: epoch.is_none(),
        };
    }

    /// Every sold-out flag cleared, the epochs kept: sale events may have
    /// been missed (the subscription was down), so no flag can be trusted.
    pub fn clear_all_flags(&self) {
        // A blank entry is dropped, not cleared: a clear would make it
        // hold something, and made-up ids' entries would stay for good.
        self.sales.retain(|sale| {
            if sale.is_blank() {
                return false;
            }
            self.clear(sale, None);
            locked(&sale.empty_buckets).clear();
            true
        });
    }

    /// The sale's bucket count, from its snapshot (at most [`WINDOW_TTL`]
    /// old; 1 when Redis cannot be read: the sale's own keys then sell
    /// nothing, its buys answer 503 fenced, never a wrong win).
    pub async fn buckets(&self, redis: &RedisClient, sale_id: &str) -> u32 {
        if let Some(n) = self
            .sales
            .get(sale_id)
            .map(|sale| sale.buckets.load(Ordering::Relaxed))
            .filter(|n| *n > 0)
        {
            return n;
        }
        self.window(redis, sale_id)
            .await
            .ok()
            .flatten()
            .map_or(1, |w| w.buckets)
    }

    /// Whether bucket `bucket` of `sale_id` is flagged empty here.
    pub fn bucket_empty(&self, sale_id: &str, bucket: u32) -> bool {
        self.sales.get(sale_id).is_some_and(|sale| {
            locked(&sale.empty_buckets)
                .get(&bucket)
                .is_some_and(|until| Instant::now() < *until)
        })
    }

    /// Flags bucket `bucket` of a sale empty: a hint for choosing donors
    /// only, trusted for [`SOLD_OUT_TTL`]. The sale itself is flagged sold
    /// out only after every bucket was confirmed dry in Redis (`crate::buy`
    /// refill).
    pub fn mark_bucket_empty(&self, sale_id: &str, bucket: u32) {
        let sale = self.sale(sale_id);
        locked(&sale.empty_buckets).insert(bucket, Instant::now() + SOLD_OUT_TTL);
    }

    /// Items moved into bucket `bucket` of `sale_id`: it is not empty, so
    /// neither is the sale. It counts as a clear ([`SaleCache::clears`]):
    /// a refill that confirmed every bucket dry before this then does not
    /// flag the sale sold out again.
    pub fn bucket_stocked(&self, sale_id: &str, bucket: u32) {
        let sale = self.sale(sale_id);
        self.clear(&sale, None);
        locked(&sale.empty_buckets).remove(&bucket);
    }

    /// Forgets everything about a sale but its stock epoch and clears: an
    /// operator changed it, or items went back to its stock (so someone may
    /// win in it again). `epoch`: the sale's stock epoch read after the
    /// change, when known.
    pub async fn forget(&self, sale_id: &str, epoch: Option<u64>) {
        let sale = self.sale(sale_id);
        self.clear(&sale, epoch);
        *locked(&sale.snapshot) = None;
        sale.buckets.store(0, Ordering::Relaxed);
        locked(&sale.empty_buckets).clear();
        self.absent.invalidate(sale_id).await;
    }

    /// What the backend says of a sale Redis does not have. One backend
    /// call per sale per [`MISSING_TTL`]; each call also drops the sale's
    /// snapshot, so a restored sale sells again at once.
    pub async fn missing(&self, backend: &OrderClient, sale_id: &str) -> MissingSale {
        // Boxed: moka's single-flight future is many kilobytes, and held
        // inline it would grow the future of every request that can reach
        // here (moved into its box on each request), where only a miss
        // needs it.
        Box::pin(self.missing.get_with_by_ref(sale_id, async {
            if let Some(sale) = self.sales.get(sale_id) {
                *locked(&sale.snapshot) = None;
            }
            self.absent.invalidate(sale_id).await;
            match backend.sale_exists(sale_id).await {
                Ok(true) => MissingSale::Restoring,
                Ok(false) => MissingSale::Unknown,
                Err(error) => {
                    tracing::warn!(%error, sale = sale_id, "cannot ask the backend about a sale missing from redis");
                    MissingSale::NoAnswer
                }
            }
        }))
        .await
    }
}

#[cfg(test)]
mod tests {
    use flashgate_common::keys::SaleKeys;

    use super::*;
    use crate::infra::Breaker;
    use crate::infra::RedisServer;

    async fn put_sale(server: &RedisServer, id: &str) {
        let now = flashgate_common::now_ms();
        let meta = [
            ("name", "Sneaker".to_owned()),
            ("stock", "5".to_owned()),
            ("per_user_limit", "1".to_owned()),
            ("starts_at_ms", (now - 1000).to_string()),
            ("ends_at_ms", (now + 3_600_000).to_string()),
            ("paused", "0".to_owned()),
        ];
        let keys = SaleKeys::new(id);
        let () = redis::pipe()
            .hset_multiple(&keys.meta, &meta)
            .set(&keys.remaining, 5)
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
    }

    async fn redis_with_sale(id: &str) -> (RedisServer, RedisClient) {
        let server = RedisServer::private();
        put_sale(&server, id).await;
        let client = RedisClient::standalone(
            &server.url(),
            Duration::from_millis(500),
            Breaker::new(5, Duration::from_secs(1)),
        );
        (server, client)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_reads_of_a_sale_cost_one_redis_read() {
        let (server, redis) = redis_with_sale("s").await;
        let (redis, sales) = (
            Arc::new(redis),
            Arc::new(SaleCache::new(Duration::from_millis(250))),
        );
        let before = server.command_calls("hgetall").await;
        let mut reads = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let (redis, sales) = (redis.clone(), sales.clone());
            reads.spawn(async move { sales.window(&redis, "s").await.unwrap().is_some() });
        }
        while let Some(found) = reads.join_next().await {
            assert!(found.unwrap());
        }
        assert_eq!(server.command_calls("hgetall").await - before, 1);
    }

    #[tokio::test]
    async fn made_up_sale_ids_hold_no_entry_and_leave_a_real_sales_flag_and_epoch() {
        let (_server, redis) = redis_with_sale("s").await;
        let sales = SaleCache::new(Duration::from_millis(250));
        assert!(sales.window(&redis, "s").await.unwrap().is_some());
        assert_eq!(sales.flag_sold_out("s", Some(7), None), Some(7));
        for n in 0..500 {
            let id = format!("made-up-{n}");
            assert!(sales.window(&redis, &id).await.unwrap().is_none());
            assert!(!sales.is_sold_out(&id));
        }
        assert_eq!(sales.sales.len(), 1, "only the real sale has an entry");
        assert!(sales.is_sold_out("s"));
        assert_eq!(
            sales.flag_sold_out("s", Some(6), None),
            None,
            "its epoch is kept: an older sold out is stale"
        );
    }

    #[tokio::test]
    async fn a_sale_redis_lost_keeps_its_epoch_and_reads_again_after_the_backends_answer() {
        let (server, redis) = redis_with_sale("s").await;
        let sales = SaleCache::new(Duration::from_millis(250));
        assert!(sales.window(&redis, "s").await.unwrap().is_some());
        sales.clear(&sales.sale("s"), Some(9));
        let () = redis::cmd("FLUSHALL")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        sales.forget("s", None).await;
        assert!(sales.window(&redis, "s").await.unwrap().is_none());
        assert_eq!(
            sales.flag_sold_out("s", Some(8), None),
            None,
            "the epoch outlives the sale's absence"
        );
        // Nobody listens on port 9: the backend does not answer.
        let backend =
            OrderClient::new("http://127.0.0.1:9", Duration::from_millis(200), "t").unwrap();
        assert_eq!(sales.missing(&backend, "s").await, MissingSale::NoAnswer);
        put_sale(&server, "s").await;
        assert!(
            sales.window(&redis, "s").await.unwrap().is_some(),
            "read again at once, not after the absence's TTL"
        );
    }

    #[test]
    fn clearing_every_flag_drops_the_entries_that_hold_nothing() {
        let sales = SaleCache::new(Duration::from_millis(250));
        assert_eq!(sales.flag_sold_out("s", Some(3), None), Some(3));
        let _blank = sales.sale("made-up");
        sales.clear_all_flags();
        assert!(!sales.is_sold_out("s"));
        assert_eq!(
            sales.sales.len(),
            1,
            "the blank entry went, the sale stayed"
        );
        assert_eq!(
            sales.flag_sold_out("s", Some(2), None),
            None,
            "the sale kept its epoch"
        );
    }

    #[test]
    fn a_sold_out_older_than_the_known_epoch_or_sent_before_a_clear_flags_nothing() {
        let sales = SaleCache::new(Duration::from_millis(250));
        assert_eq!(
            sales.flag_sold_out("s", Some(7), None),
            Some(7),
            "flagged, to be announced at its epoch"
        );
        assert_eq!(
            sales.flag_sold_out("s", Some(7), None),
            None,
            "renewed, not announced again"
        );
        // A change whose new epoch was read clears it; an older sold out is stale.
        sales.clear(&sales.sale("s"), Some(9));
        assert!(!sales.is_sold_out("s"));
        assert_eq!(sales.flag_sold_out("s", Some(8), None), None);
        assert!(!sales.is_sold_out("s"));
        // A call sent before a clear whose epoch was read is judged by its
        // epoch: decided after the change, it flags the sale.
        let clears = sales.clears("s");
        sales.clear(&sales.sale("s"), Some(9));
        assert_eq!(sales.flag_sold_out("s", Some(9), Some(clears)), Some(9));
        // Before a clear whose epoch is not known (its read failed): stale
        // whatever its epoch, as this gateway cannot tell.
        let clears = sales.clears("s");
        sales.clear(&sales.sale("s"), None);
        assert_eq!(sales.flag_sold_out("s", Some(9), Some(clears)), None);
        assert_eq!(
            sales.flag_sold_out("s", Some(9), Some(sales.clears("s"))),
            Some(9)
        );
        // Without an epoch of its own (the draw's): at the newest known,
        // and stale after any clear since its call was sent.
        let clears = sales.clears("s");
        sales.clear(&sales.sale("s"), Some(9));
        assert_eq!(sales.flag_sold_out("s", None, Some(clears)), None);
        assert_eq!(sales.flag_sold_out("s", None, None), Some(9));
        sales.clear_all_flags();
        assert!(!sales.is_sold_out("s"), "cleared with every flag");
        assert_eq!(
            sales.flag_sold_out("s", Some(8), Some(sales.clears("s"))),
            None,
            "the epoch outlives the flags"
        );
        // After a blind clear, an announced sold out cannot be judged: it
        // flags nothing until this gateway's own deduct (sent after the
        // clear) tells the epoch again.
        assert_eq!(sales.flag_sold_out("s", Some(10), None), None);
        assert_eq!(
            sales.flag_sold_out("s", Some(10), Some(sales.clears("s"))),
            Some(10)
        );
        sales.clear(&sales.sale("s"), Some(11));
        assert_eq!(
            sales.flag_sold_out("s", Some(11), None),
            Some(11),
            "announced, once the epoch is known"
        );
    }

    #[tokio::test]
    async fn buyers_read_for_an_announced_flag_are_kept_only_under_the_scripts_proof() {
        let (server, redis) = redis_with_sale("s").await;
        let keys = SaleKeys::new("s");
        let mut conn = server.conn().await;
        let replid = crate::infra::master_replid(&mut conn).await;
        let () = redis::pipe()
            .hset(&keys.reservations, "r-1", "alice")
            .ignore()
            .hset(&keys.meta, "epoch", 7)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        // Each case on a gateway of its own (a read gates the next for 5 s):
        // the case, the keys it sets and deletes, the flag's epoch (the
        // meta's, but where the flag knows none: a draw's sold out on a
        // gateway that never read one) and whether a non-buyer is answered.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str], u64, bool);
        let cases: [Case<'_>; 6] = [
            ("sold out, not fenced", &[("remaining", "0")], &[], 7, true),
            ("an item left", &[("remaining", "1")], &[], 7, false),
            (
                "fenced",
                &[("remaining", "0"), ("synced", "other")],
                &[],
                7,
                false,
            ),
            (
                "bucketed",
                &[("remaining", "0"), ("buckets", "2")],
                &[],
                7,
                false,
            ),
            ("no count of items left", &[], &["remaining"], 7, false),
            ("the sale gone", &[("remaining", "0")], &["meta"], 0, false),
        ];
        for (case, set, del, epoch, answered) in cases {
            let key = |name: &str| match name {
                "remaining" => keys.remaining.clone(),
                "synced" => keys.synced.clone(),
                _ => keys.meta.clone(),
            };
            let mut pipe = redis::pipe();
            pipe.hset(&keys.meta, "buckets", 1)
                .ignore()
                .hset(&keys.meta, "epoch", 7)
                .ignore()
                .set(&keys.synced, &replid)
                .ignore();
            for (name, value) in set {
                match *name {
                    "buckets" => pipe.hset(&keys.meta, "buckets", *value).ignore(),
                    other => pipe.set(key(other), *value).ignore(),
                };
            }
            for name in del {
                pipe.del(key(name)).ignore();
            }
            let () = pipe.query_async(&mut conn).await.unwrap();
            let sales = SaleCache::new(Duration::from_millis(250));
            sales.flag_sold_out("s", Some(epoch), None);
            sales.read_buyers(&redis, "s").await;
            assert_eq!(sales.sold_out_for_keyed("s", "bob"), answered, "{case}");
            assert!(!sales.sold_out_for_keyed("s", "alice"), "{case}: a buyer");
        }
    }
}
