//! The stream consumer: every reservation the gateway appends to a sale's
//! stream becomes exactly one order row, even when the gateway's direct
//! forward was lost.
//!
//! One task per live sale known to the database ([`run`] polls for new
//! ones, and stops the consumers of archived sales).
//! Each task reads its stream in the consumer group `orders` on its own
//! Redis connection. While the gateway's forward is delivering, it holds a
//! batch until its newest entry is `backend.forward_grace_ms` old, so that
//! the forward is the one write of each order (see `ForwardWatch`); then
//! it reads which of the batch's reservations have orders (one query),
//! writes the rest with one multi-row insert, and only after the commit
//! acknowledges the batch (one `XACK`). While the forward is not
//! delivering, the read is skipped: the insert skips the reservations that
//! have an order and says which. What is read but
//! not acknowledged stays in the group's pending list: the task re-reads its
//! own pending entries when it (re)starts, and `XAUTOCLAIM` takes over those
//! of a consumer that died. Inserts are idempotent on the reservation id,
//! so delivering an entry twice is harmless; losing one is not possible.
//!
//! Poison entries: a malformed entry, or one the database rejects on its
//! own (while a probe write shows the database takes other writes) after
//! `backend.max_deliveries` deliveries, is moved to the sale's dead-letter
//! stream with its error (see [`super::dead_letter`]) and acknowledged, so it
//! never blocks the entries behind it. A database that refuses every write
//! is an outage, not poison: nothing is dead-lettered then.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use flashgate_common::config::{BackendConfig, RedisConfig};
use flashgate_common::dependency::Dependency;
use flashgate_common::keys::{SaleKeys, CONSUMER_GROUP};
use flashgate_common::redis_conn::RedisHandle;
use flashgate_common::reservation::{fields, sale_of_reservation, Reservation};
use flashgate_common::sale::SaleSpec;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::RedisError;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::entry::parse;
use super::{dead_letter, retention};
use crate::counted::{write_counted, WriteError};
use crate::metrics::Metrics;
use crate::redis_io;
use crate::store::{Store, StoreError};

/// Settings of the consumers, taken from `[backend]` and `[redis]`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub redis: RedisConfig,
    /// This process's name in the consumer group; keeping it across
    /// restarts lets a restarted process pick up its own pending entries.
    pub consumer_name: String,
    pub batch_size: usize,
    pub block: Duration,
    pub claim_idle: Duration,
    /// How old the newest entry of a batch must be (by Redis's clock)
    /// before the batch is written, while the forward is delivering (see
    /// `ForwardWatch`): the gateway's forward has normally committed
    /// those orders by then, so the batch costs one read of which have
    /// orders and one `XACK`. Zero: written at once.
    pub forward_grace: Duration,
    pub sale_poll: Duration,
    /// Deliveries after which an entry the database keeps rejecting is
    /// dead-lettered.
    pub max_deliveries: u32,
    /// Orders written, batch sizes, claims, dead letters.
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// When set, a consumer waits while Redis or the database is away (the
    /// monitor has logged it) instead of failing and logging every retry.
    pub readiness: Option<crate::readiness::Readiness>,
}

impl Settings {
    /// The consumers' settings from the config; they count into `metrics`,
    /// the registry the backend serves.
    pub fn new(
        redis: &RedisConfig,
        backend: &BackendConfig,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> Self {
        Self {
            redis: redis.clone(),
            consumer_name: backend
                .consumer_name
                .clone()
                .unwrap_or_else(default_consumer_name),
            batch_size: backend.batch_size,
            block: backend.block,
            claim_idle: backend.claim_idle,
            forward_grace: backend.forward_grace,
            sale_poll: backend.sale_poll,
            max_deliveries: backend.max_deliveries,
            metrics,
            readiness: None,
        }
    }
}

/// A consumer name unique per process on a host, `<host>-<pid>`, for a
/// backend configured without one (read here, at start, so that parsing
/// the config reads nothing from the machine).
fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "host".into());
    format!("{}-{}", host.trim(), std::process::id())
}

/// Why one consumer session ended; the task logs it, backs off and starts
/// a new session.
#[derive(Debug, thiserror::Error)]
enum ConsumeError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("database: {0}")]
    Store(#[from] StoreError),
    #[error("{0} entries rejected by the database; retrying until dead-lettered")]
    Rejected(usize),
}

/// Runs a consumer for every live sale in the database until `shutdown`
/// turns true, then waits for each to finish the batch it is writing; a
/// batch still held for the grace is left unwritten, pending under this
/// consumer's name, and is re-read at the next start.
///
/// Every `backend.sale_poll_ms` it starts consumers for new sales and stops
/// those of archived ones; every [`retention::MAINTENANCE_INTERVAL`] it
/// trims the written entries of live sales' streams and archives the
/// finished ones (see [`super::retention`]). A sale found finished before
/// its consumer started never gets one.
pub async fn run(store: Store, settings: Settings, mut shutdown: watch::Receiver<bool>) {
    let mut tasks = JoinSet::new();
    let mut running: HashMap<String, watch::Sender<bool>> = HashMap::new();
    let mut redis = None;
    let mut archived = HashSet::new();
    let mut last_maintenance: Option<Instant> = None;
    // While the database is away, one line when listing starts failing and
    // one when it works again, not one per poll.
    let sale_list = Dependency::assumed_ready("sale list");
    loop {
        while let Some(done) = tasks.try_join_next() {
            if let Ok(sale) = done {
                running.remove(&sale);
            }
        }
        if redis.is_none() {
            redis = redis_io::shared_connection(&settings.redis).await.ok();
        }
        if let Some(conn) = redis.as_mut() {
            // Unreadable: keep the last known set rather than restart
            // every archived sale's consumer.
            match retention::archived(conn).await {
                Ok(now) => archived = now,
                Err(error) => tracing::debug!(%error, "cannot read the archived sales; will retry"),
            }
        }
        let sales = store.sales().all().await;
        if let (Some(conn), Ok(sales)) = (redis.as_mut(), &sales) {
            reopen_unfinished(conn, sales, &mut archived).await;
        }
        let maintain =
            last_maintenance.is_none_or(|t| t.elapsed() >= retention::MAINTENANCE_INTERVAL);
        match sales {
            Ok(sales) => {
                sale_list.ready();
                if maintain {
                    last_maintenance = Some(Instant::now());
                    if let Some(conn) = redis.as_mut() {
                        for sale in &sales {
                            if !archived.contains(&sale.id)
                                && maintain_sale(conn, &store, &settings.metrics, sale).await
                            {
                                archived.insert(sale.id.clone());
                            }
                        }
                    }
                }
                for sale in sales {
                    if archived.contains(&sale.id) {
                        if let Some(stop) = running.remove(&sale.id) {
                            tracing::info!(sale = %sale.id, "sale archived: stream consumer stopped");
                            let _ = stop.send(true);
                        }
                    } else if let std::collections::hash_map::Entry::Vacant(slot) =
                        running.entry(sale.id.clone())
                    {
                        if !retention::within_grace(
                            sale.ends_at_ms,
                            retention::ARCHIVE_GRACE,
                            flashgate_common::now_ms(),
                        ) {
                            if let Some(conn) = redis.as_mut() {
                                if maintain_sale(conn, &store, &settings.metrics, &sale).await {
                                    archived.insert(sale.id);
                                    continue;
                                }
                            }
                        }
                        tracing::info!(sale = %sale.id, "starting stream consumer");
                        let (stop, stopped) = watch::channel(false);
                        let (store, settings) = (store.clone(), settings.clone());
                        tasks.spawn(async move {
                            if sale.buckets > 1 {
                                consume_buckets(
                                    sale.id.clone(),
                                    sale.buckets,
                                    store,
                                    settings,
                                    stopped,
                                )
                                .await;
                            } else {
                                consume_sale(sale.id.clone(), store, settings, stopped).await;
                            }
                            sale.id
                        });
                        slot.insert(stop);
                    }
                }
            }
            Err(error) => sale_list.observe(crate::readiness::store_state(&error), &error),
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.sale_poll) => {}
            _ = stopped(&mut shutdown) => break,
        }
    }
    for stop in running.values() {
        let _ = stop.send(true);
    }
    while tasks.join_next().await.is_some() {}
}

/// Makes live again every archived sale whose window in the database has
/// not ended plus [`retention::ARCHIVE_GRACE`] by Redis's clock: the one
/// place that repairs an archiving a change failed to undo (an operator's
/// new window whose unarchive failed, a race the archiver missed). Failures
/// are logged; the next poll tries again.
async fn reopen_unfinished<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    sales: &[SaleSpec],
    archived: &mut HashSet<String>,
) {
    let unfinished: Vec<&SaleSpec> = sales.iter().filter(|s| archived.contains(&s.id)).collect();
    if unfinished.is_empty() {
        return;
    }
    let now = match retention::redis_now_ms(conn).await {
        Ok(now) => now,
        Err(error) => return tracing::debug!(%error, "cannot read redis's clock; will retry"),
    };
    for sale in unfinished {
        // Redis sells by its own copy of the window, which a change that
        // failed half-way may have moved past the database's.
        let keys = flashgate_common::keys::SaleKeys::new(&sale.id);
        let redis_ends: Option<i64> = redis::cmd("HGET")
            .arg(&keys.meta)
            .arg("ends_at_ms")
            .query_async(conn)
            .await
            .unwrap_or(None);
        let ends_at_ms = redis_ends.map_or(sale.ends_at_ms, |r| r.max(sale.ends_at_ms));
        if !retention::within_grace(ends_at_ms, retention::ARCHIVE_GRACE, now) {
            continue;
        }
        match retention::unarchive(conn, &sale.id).await {
            Ok(()) => {
                tracing::warn!(sale = %sale.id, "archived sale whose window is open again made live");
                archived.remove(&sale.id);
            }
            Err(error) => {
                tracing::warn!(%error, sale = %sale.id, "cannot unarchive a sale whose window is open; will retry")
            }
        }
    }
}

/// Trims the sale's written stream entries (every bucket's too) and
/// archives it when it is finished; answers whether it is archived.
/// Failures are logged: the next maintenance tries again.
async fn maintain_sale<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    store: &Store,
    metrics: &Metrics,
    sale: &SaleSpec,
) -> bool {
    let sale_id = sale.id.as_str();
    match retention::trim_all_written(conn, store, sale_id, sale.buckets).await {
        Ok((0, _)) => {}
        Ok((scripts, trimmed)) => {
            metrics.trim_scripts.inc_by(scripts);
            tracing::debug!(
                sale = sale_id,
                trimmed,
                "stream entries written as orders trimmed"
            );
        }
        Err(error) => tracing::warn!(%error, sale = sale_id, "cannot trim the stream"),
    }
    match retention::try_archive_all(conn, store, sale_id, sale.buckets, retention::ARCHIVE_GRACE)
        .await
    {
        Ok(true) => {
            tracing::info!(
                sale = sale_id,
                "sale finished and archived: no consumer, polling or reconciliation any more"
            );
            true
        }
        Ok(false) => false,
        Err(error) => {
            tracing::warn!(%error, sale = sale_id, "cannot check whether the sale is finished");
            false
        }
    }
}

/// Consumes every stream of bucketed sale `sale_id` until `shutdown`
/// turns true: each bucket's, where its buys append, and the sale's own,
/// where a dead letter retried by an operator goes back. Each stream is
/// read in the consumer group like a sale's, so several backends share
/// them.
pub async fn consume_buckets(
    sale_id: String,
    buckets: u32,
    store: Store,
    settings: Settings,
    shutdown: watch::Receiver<bool>,
) {
    let mut streams = JoinSet::new();
    let own = std::iter::once(SaleKeys::new(&sale_id).stream);
    for stream in own.chain((0..buckets).map(|k| SaleKeys::bucket(&sale_id, k).stream)) {
        let (sale_id, store, settings, shutdown) = (
            sale_id.clone(),
            store.clone(),
            settings.clone(),
            shutdown.clone(),
        );
        streams
            .spawn(async move { consume_stream(sale_id, stream, store, settings, shutdown).await });
    }
    while streams.join_next().await.is_some() {}
}

/// Consumes the stream of `sale_id` until `shutdown` turns true. Never
/// gives up: Redis or database failures are logged and retried with
/// backoff.
pub async fn consume_sale(
    sale_id: String,
    store: Store,
    settings: Settings,
    shutdown: watch::Receiver<bool>,
) {
    let stream = SaleKeys::new(&sale_id).stream;
    consume_stream(sale_id, stream, store, settings, shutdown).await;
}

/// Consumes `stream`, which holds reservations of `sale_id`, until
/// `shutdown` turns true.
async fn consume_stream(
    sale_id: String,
    stream: String,
    store: Store,
    settings: Settings,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Some(readiness) = &settings.readiness {
            if !readiness.wait_dependencies(&mut shutdown).await {
                return;
            }
        }
        let mut consumer = Consumer {
            stream: stream.clone(),
            sale_id: &sale_id,
            store: &store,
            settings: &settings,
        };
        match consumer.session(&mut shutdown, &mut backoff).await {
            Ok(()) => return,
            Err(error) => {
                let wait = backoff.next();
                if settings
                    .readiness
                    .as_ref()
                    .is_some_and(|r| !r.dependencies_ready())
                {
                    // The dependency monitor has said what is away.
                    tracing::debug!(%error, sale = %sale_id, "stream consumer paused while a dependency is away");
                } else {
                    tracing::error!(%error, sale = %sale_id, retry_in_ms = wait.as_millis() as u64, "stream consumer failed");
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stopped(&mut shutdown) => return,
                }
            }
        }
    }
}

/// Resolves once the shutdown flag is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Exponential backoff from 200 ms to 5 s, reset by a successful batch.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let wait = Duration::from_millis(200u64.saturating_mul(1 << self.failures.min(5)))
            .min(Duration::from_secs(5));
        self.failures = self.failures.saturating_add(1);
        wait
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

struct Consumer<'a> {
    sale_id: &'a str,
    stream: String,
    store: &'a Store,
    settings: &'a Settings,
}

impl Consumer<'_> {
    /// One connection's worth of consuming; returns `Ok` only on shutdown.
    async fn session(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
        backoff: &mut Backoff,
    ) -> Result<(), ConsumeError> {
        let mut conn =
            redis_io::consumer_connection(&self.settings.redis, self.settings.block).await?;
        self.ensure_group(&mut conn).await?;
        let mut forward = ForwardWatch::default();

        // Entries delivered to this consumer name before a crash or restart.
        let mut cursor = "0".to_owned();
        loop {
            let entries = self.read(&mut conn, &cursor, None).await?;
            let Some(last) = entries.last() else { break };
            cursor = last.id.clone();
            if !self
                .settle(&mut conn, &entries, &mut forward, shutdown)
                .await?
            {
                return Ok(());
            }
            forward.checked(self.process(&mut conn, entries, forward.delivering).await?);
        }
        backoff.reset();

        let mut last_claim = Instant::now();
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            if last_claim.elapsed() >= self.settings.claim_idle {
                self.claim_idle(&mut conn).await?;
                last_claim = Instant::now();
            }
            // Dropping a read on shutdown is safe: anything Redis delivered
            // stays pending under this name and is re-read at next start.
            let entries = tokio::select! {
                read = self.read(&mut conn, ">", Some(self.settings.block)) => read?,
                _ = stopped(shutdown) => return Ok(()),
            };
            if !entries.is_empty() {
                if !self
                    .settle(&mut conn, &entries, &mut forward, shutdown)
                    .await?
                {
                    return Ok(());
                }
                forward.checked(self.process(&mut conn, entries, forward.delivering).await?);
                backoff.reset();
            }
        }
    }

    /// Waits, while the forward is delivering (see [`ForwardWatch`]), until
    /// the newest of `entries` is `forward_grace` old, so that the forward
    /// has committed the orders they bring (see [`Settings::forward_grace`]);
    /// false when shutdown came first (the entries stay pending under this
    /// name and are re-read at the next start).
    ///
    /// The entries' age is measured against a `TIME` read now on the
    /// stream's own master, whose clock made their ids (a clock that
    /// stepped since, or another node's in a cluster, would skew it), and
    /// the wait runs on this host's monotonic clock, never longer than the
    /// grace.
    async fn settle(
        &self,
        conn: &mut RedisHandle,
        entries: &[StreamId],
        forward: &mut ForwardWatch,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<bool, RedisError> {
        let grace = self.settings.forward_grace;
        let Some(newest) = entries.iter().filter_map(|e| entry_ms(&e.id)).max() else {
            return Ok(true);
        };
        if !forward.waits(grace, Instant::now()) {
            return Ok(true);
        }
        forward.settling(Instant::now());
        let now = redis_time_of(conn, &self.stream).await?;
        let wait = wait_left(grace, now - newest);
        if wait.is_zero() {
            return Ok(true);
        }
        Ok(tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stopped(shutdown) => false,
        })
    }

    async fn ensure_group(&self, conn: &mut RedisHandle) -> Result<(), RedisError> {
        let created: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(CONSUMER_GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => Err(e),
            _ => Ok(()),
        }
    }

    /// `XREADGROUP` from `id` (`>` for new entries, an id for own pending ones).
    async fn read(
        &self,
        conn: &mut RedisHandle,
        id: &str,
        block: Option<Duration>,
    ) -> Result<Vec<StreamId>, RedisError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(CONSUMER_GROUP)
            .arg(&self.settings.consumer_name)
            .arg("COUNT")
            .arg(self.settings.batch_size);
        if let Some(block) = block {
            cmd.arg("BLOCK").arg(block.as_millis().max(1) as u64);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(id);
        // A timed-out BLOCK answers nil.
        let reply: Option<StreamReadReply> = cmd.query_async(conn).await?;
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .collect())
    }

    /// Takes over entries idle longer than `claim_idle` on any consumer
    /// (typically a dead process) and processes them.
    async fn claim_idle(&self, conn: &mut RedisHandle) -> Result<(), ConsumeError> {
        let mut cursor = "0-0".to_owned();
        loop {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(&self.stream)
                .arg(CONSUMER_GROUP)
                .arg(&self.settings.consumer_name)
                .arg(self.settings.claim_idle.as_millis() as u64)
                .arg(&cursor)
                .arg("COUNT")
                .arg(self.settings.batch_size)
                .query_async(conn)
                .await?;
            if !reply.claimed.is_empty() {
                self.settings
                    .metrics
                    .claimed_entries
                    .inc_by(reply.claimed.len() as u64);
                tracing::info!(
                    sale = self.sale_id,
                    claimed = reply.claimed.len(),
                    "claimed idle stream entries"
                );
                self.process(conn, reply.claimed, true).await?;
            }
            if reply.next_stream_id == "0-0" {
                return Ok(());
            }
            cursor = reply.next_stream_id;
        }
    }

    /// Writes the orders of a batch with one insert, then acknowledges all
    /// of it with one `XACK`. With `read_first` (the forward is delivering,
    /// so most orders exist already), one read of which entries have their
    /// order comes first, and the write (a hold, a Redis check, an insert)
    /// is only for the rest, usually none; without it every entry goes to
    /// the insert, which skips those that have an order and says which
    /// (the read would find next to nothing, and costs the database more
    /// than an insert of new rows). Nothing is acknowledged unless
    /// its order exists (written before or committed here) or the entry was
    /// moved to the dead-letter stream. Answers what the check found, for
    /// [`ForwardWatch`].
    async fn process(
        &self,
        conn: &mut RedisHandle,
        entries: Vec<StreamId>,
        read_first: bool,
    ) -> Result<Checked, ConsumeError> {
        let mut ids = Vec::with_capacity(entries.len());
        let mut good: Vec<(&StreamId, Reservation)> = Vec::with_capacity(entries.len());
        for entry in &entries {
            match parse(entry).and_then(|r| belongs_to(r, self.sale_id)) {
                Ok(r) => good.push((entry, r)),
                Err(field) => {
                    let error =
                        format!("malformed reservation entry: field `{field}` missing or invalid");
                    tracing::error!(sale = self.sale_id, entry = %entry.id, field, "malformed reservation entry; moving it to the dead-letter stream");
                    dead_letter::bury(conn, self.sale_id, entry, &error, 1).await?;
                    self.settings.metrics.dead_letters.inc();
                    ids.push(entry.id.as_str());
                }
            }
        }
        // Each entry is counted once per check, and those the read found
        // written are acknowledged even if the write of the rest fails, so
        // a retry does not count them again.
        let rids: Vec<&str> = good
            .iter()
            .map(|(_, r)| r.reservation_id.as_str())
            .collect();
        let written = if read_first {
            match self.store.orders().existing(&rids).await {
                Ok(written) => written,
                Err(error) => {
                    self.ack(conn, &ids).await?;
                    return Err(error.into());
                }
            }
        } else {
            HashSet::new()
        };
        let total = good.len();
        let (done, fresh): (Vec<_>, Vec<_>) = good
            .into_iter()
            .partition(|(_, r)| written.contains(&r.reservation_id));
        self.settings
            .metrics
            .stream_already_written
            .inc_by(done.len() as u64);
        ids.extend(done.iter().map(|(e, _)| e.id.as_str()));
        let mut checked = Checked {
            entries: total,
            written: done.len(),
        };
        if fresh.is_empty() {
            self.settings.metrics.batch_size.observe(total as f64);
            self.ack(conn, &ids).await?;
            return Ok(checked);
        }

        let reservations: Vec<Reservation> = fresh.iter().map(|(_, r)| r.clone()).collect();
        let mut rejected = 0;
        match self.write(conn, &reservations).await {
            Ok(existing) => {
                checked.written += existing;
                self.settings.metrics.batch_size.observe(total as f64);
                ids.extend(fresh.iter().map(|(e, _)| e.id.as_str()));
                tracing::debug!(
                    sale = self.sale_id,
                    read = entries.len(),
                    written = reservations.len(),
                    "stream batch committed"
                );
            }
            Err(WriteError::Redis(error)) => {
                self.ack(conn, &ids).await?;
                return Err(error.into());
            }
            Err(WriteError::Store(error))
                if !error.is_rejection() || !self.store.orders().writable().await =>
            {
                self.ack(conn, &ids).await?;
                return Err(error.into());
            }
            Err(WriteError::Store(error)) => {
                tracing::warn!(%error, sale = self.sale_id, "batch rejected by the database; writing its entries one by one");
                for (entry, r) in &fresh {
                    let id = entry.id.as_str();
                    match self.write(conn, std::slice::from_ref(r)).await {
                        Ok(existing) => {
                            checked.written += existing;
                            ids.push(id);
                        }
                        Err(WriteError::Redis(e)) => {
                            self.ack(conn, &ids).await?;
                            return Err(e.into());
                        }
                        Err(WriteError::Store(e)) if !e.is_rejection() => {
                            self.ack(conn, &ids).await?;
                            return Err(e.into());
                        }
                        Err(WriteError::Store(e)) => {
                            let deliveries =
                                dead_letter::deliveries(conn, &self.stream, id).await?;
                            if deliveries >= u64::from(self.settings.max_deliveries) {
                                tracing::error!(error = %e, sale = self.sale_id, entry = id, deliveries, "entry keeps failing; moving it to the dead-letter stream");
                                dead_letter::bury(
                                    conn,
                                    self.sale_id,
                                    entry,
                                    &e.to_string(),
                                    deliveries,
                                )
                                .await?;
                                self.settings.metrics.dead_letters.inc();
                                ids.push(id);
                            } else {
                                tracing::warn!(error = %e, sale = self.sale_id, entry = id, deliveries, "entry rejected by the database; will retry");
                                rejected += 1;
                            }
                        }
                    }
                }
            }
        }
        self.ack(conn, &ids).await?;
        if rejected > 0 {
            // The session restarts and re-reads its pending entries, which
            // counts one more delivery for each rejected one.
            return Err(ConsumeError::Rejected(rejected));
        }
        Ok(checked)
    }

    /// Writes the orders of the reservations Redis counts (see
    /// [`crate::counted`]), counting the orders created; answers how many
    /// were found created meanwhile by the other path (the forward won the
    /// race). An entry Redis does not count was read from a Redis that
    /// failed over before its write reached the promoted one: it is not
    /// written, and acknowledging it changes nothing there.
    async fn write(
        &self,
        conn: &mut RedisHandle,
        reservations: &[Reservation],
    ) -> Result<usize, WriteError> {
        let written = write_counted(self.store, conn, reservations).await?;
        // An entry Redis no longer counts may have had its order all along
        // (written, then its item returned): a batch written without the
        // read first meets those here. Rare, so one read of just them.
        let uncounted: Vec<&str> = written
            .uncounted
            .iter()
            .map(|r| r.reservation_id.as_str())
            .collect();
        let ordered = if uncounted.is_empty() {
            HashSet::new()
        } else {
            self.store.orders().existing(&uncounted).await?
        };
        let existing = written.counted.len() - written.created.len() + ordered.len();
        self.settings
            .metrics
            .orders_created
            .with_label_values(&["stream"])
            .inc_by(written.created.len() as u64);
        self.settings
            .metrics
            .orders_existing
            .with_label_values(&["stream"])
            .inc_by(existing as u64);
        for r in written
            .uncounted
            .iter()
            .filter(|r| !ordered.contains(&r.reservation_id))
        {
            tracing::warn!(sale = self.sale_id, reservation = %r.reservation_id, "stream entry redis no longer counts (lost in a failover); no order written");
        }
        Ok(existing)
    }

    async fn ack(&self, conn: &mut RedisHandle, ids: &[&str]) -> Result<(), RedisError> {
        if ids.is_empty() {
            return Ok(());
        }
        redis::cmd("XACK")
            .arg(&self.stream)
            .arg(CONSUMER_GROUP)
            .arg(ids)
            .query_async::<i64>(conn)
            .await
            .map(drop)
    }
}

/// What one batch's check found: the entries with a reservation, and how
/// many of them had their order written by the other path (found by the
/// read of which have orders, or on insert).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Checked {
    entries: usize,
    written: usize,
}

/// Whether the gateway's forward is delivering, as this consumer's batches
/// show it; only then is a batch held for the grace. The wait is worth it
/// while the forward writes the orders (each is then written once); when
/// it does not (its queue full, its calls failing, the gateway dead), the
/// consumer's write is the only one, and holding it back would only widen
/// the window in which a Redis that loses its last second (`appendfsync
/// everysec`) takes those winners with it.
///
/// The rule: a session starts waiting. A checked batch of which fewer than
/// half the entries were written by the forward stops the waiting: the
/// next batches are written at once. A batch of which at least half were
/// (the forward won the race even so) resumes it. While not waiting, one
/// batch every [`PROBE_GRACES`] graces waits again, so that a forward that
/// came back is seen even when the consumer, reading each entry the instant
/// it is appended, wins every race.
#[derive(Debug, Clone, Copy)]
struct ForwardWatch {
    delivering: bool,
    /// When a batch was last held for the grace.
    last_held: Option<Instant>,
}

/// While the forward is not delivering, one batch in this many graces is
/// held to see whether it is back.
const PROBE_GRACES: u32 = 10;

impl Default for ForwardWatch {
    fn default() -> Self {
        Self {
            delivering: true,
            last_held: None,
        }
    }
}

impl ForwardWatch {
    /// Whether a batch read at `now` is held for `grace`.
    fn waits(&self, grace: Duration, now: Instant) -> bool {
        !grace.is_zero()
            && (self.delivering
                || self
                    .last_held
                    .is_none_or(|held| now.saturating_duration_since(held) >= grace * PROBE_GRACES))
    }

    /// A batch is held, from `now`.
    fn settling(&mut self, now: Instant) {
        self.last_held = Some(now);
    }

    /// What the check of a batch found.
    fn checked(&mut self, batch: Checked) {
        if batch.entries > 0 {
            self.delivering = batch.written * 2 >= batch.entries;
        }
    }
}

/// Redis's clock (ms) on the master of `stream`, the node whose clock
/// gave its entries their ids (a cluster sends a keyless `TIME` to any
/// node).
async fn redis_time_of(conn: &mut RedisHandle, stream: &str) -> Result<i64, RedisError> {
    let reply = conn.on_master_of(stream, &redis::cmd("TIME")).await?;
    let (secs, micros): (i64, i64) = redis::FromRedisValue::from_redis_value(reply)?;
    Ok(secs.saturating_mul(1000).saturating_add(micros / 1000))
}

/// How much of `grace` is left for an entry `age_ms` old: at most the
/// grace, whatever the clocks say (an entry "from the future" waits the
/// grace, no more).
fn wait_left(grace: Duration, age_ms: i64) -> Duration {
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    Duration::from_millis(grace_ms.saturating_sub(age_ms.max(0)).clamp(0, grace_ms) as u64)
}

/// The Redis time (ms) in a stream entry id (`<ms>-<seq>`).
fn entry_ms(id: &str) -> Option<i64> {
    id.split_once('-').map_or(id, |(ms, _)| ms).parse().ok()
}

/// Checks that a record read from `sale_id`'s stream is about that sale
/// and carries a well-formed reservation id.
fn belongs_to(r: Reservation, sale_id: &str) -> Result<Reservation, &'static str> {
    if r.sale_id != sale_id {
        return Err(fields::SALE_ID);
    }
    if sale_of_reservation(&r.reservation_id) != Some(sale_id) {
        return Err(fields::RESERVATION_ID);
    }
    Ok(r)
}

#[cfg(test)]
mod tests;
