//! The cache's storage: complete responses in memory, keyed by their
//! cache key (URL and variant), with the bytes held counted.
//!
//! pingora-cache ships only `MemCache`, which its authors mark as for tests:
//! it panics when an entry is purged or evicted while it is being filled or
//! revalidated, which an admin purge or a full cache makes routine. This
//! store keeps the same contract without those panics, and adds what the
//! gateway needs: the bytes held (the eviction manager bounds them), and the
//! URL and tags ([`Tags`]) of each entry, so a purge can find every variant
//! of a URL, every URL under a prefix, or every response with a tag.
//!
//! Memory: each entry weighs its header, body, URL and tag bytes plus
//! [`ENTRY_OVERHEAD`] (what the eviction manager bounds), and fills in
//! progress together hold at most a budget of their own (counted as they
//! will be weighed once stored; a fill past it is abandoned, not failed,
//! and its response still reaches the client): the gateway gives a quarter of `shop.cache.max_bytes` to
//! fills and the rest to stored entries, so a crowd of slow misses on many
//! URLs cannot push the memory held past `max_bytes`.
//!
//! A response is visible only once complete; concurrent misses wait on the
//! cache lock for it instead of reading a half-written body. A fill that
//! was running when a purge of its URL happened is not stored: it may hold
//! what the purge meant to remove. Fills of other URLs are kept; the last
//! [`RECENT_PURGES`] purges are remembered for that, and a fill older than
//! all of them is dropped.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use pingora::cache::key::{CacheHashKey, CompactCacheKey};
use pingora::cache::storage::{
    HandleHit, HandleMiss, HitHandler, MissFinishType, MissHandler, PurgeOutcome, PurgeTarget,
    PurgeType,
};
use pingora::cache::trace::SpanHandle;
use pingora::cache::{CacheKey, CacheMeta, Storage};
use pingora::{Error, ErrorType, Result};
use prometheus::{IntCounter, IntGauge};

use super::tags::Tags;

/// The primary key's separator between host and path: a header value
/// never holds a newline, so the split is unambiguous.
pub const KEY_SEPARATOR: char = '\n';

/// Purges remembered to decide whether a fill in progress meets one.
pub const RECENT_PURGES: usize = 64;

/// Which stored entries a purge removes, by their path and tags.
pub type PathMatch = Arc<dyn Fn(&str, &Tags) -> bool + Send + Sync>;

/// Bytes counted per entry besides its headers, body and URL: the map slot,
/// the entry, its key and the eviction manager's LRU node.
pub const ENTRY_OVERHEAD: usize = 256;

/// One stored response.
struct Entry {
    meta: (Vec<u8>, Vec<u8>),
    body: Bytes,
    /// Header, body and URL bytes plus [`ENTRY_OVERHEAD`]: what the
    /// eviction manager weighs.
    size: usize,
    /// The request path and query, for purges by URL and prefix.
    path: Box<str>,
    /// The shop's tags, for purges by tag.
    tags: Tags,
    key: CompactCacheKey,
}

/// What the store reports to Prometheus.
#[derive(Clone)]
pub struct StoreGauges {
    pub bytes: IntGauge,
    pub objects: IntGauge,
    pub evictions: IntCounter,
}

/// Complete responses in memory.
pub struct MemoryStore {
    entries: RwLock<HashMap<u128, Entry>>,
    bytes: AtomicUsize,
    /// Bumped by every purge; a fill started before it is checked against
    /// the purges since.
    purge_epoch: AtomicU64,
    /// The last purges, with the epoch each moved to.
    recent_purges: Mutex<VecDeque<(u64, PathMatch)>>,
    max_object_bytes: usize,
    /// Bytes fills in progress may hold together, and what they hold now.
    fill_budget: usize,
    filling: AtomicUsize,
    /// The response header the shop tags responses with (lower case).
    tag_header: Box<str>,
    gauges: StoreGauges,
}

fn slot(key: &impl CacheHashKey) -> u128 {
    u128::from_be_bytes(key.combined_bin())
}

fn internal(why: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, why)
}

impl MemoryStore {
    pub fn new(
        max_object_bytes: usize,
        fill_budget: usize,
        tag_header: &str,
        gauges: StoreGauges,
    ) -> Self {
        Self {
            entries: RwLock::new(HashMap::new()),
            bytes: AtomicUsize::new(0),
            purge_epoch: AtomicU64::new(0),
            recent_purges: Mutex::new(VecDeque::new()),
            max_object_bytes,
            fill_budget,
            filling: AtomicUsize::new(0),
            tag_header: tag_header.to_ascii_lowercase().into(),
            gauges,
        }
    }

    /// Bytes held by fills in progress (the tests watch the budget).
    #[cfg(test)]
    fn filling(&self) -> usize {
        self.filling.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the fill budget, or refuses.
    fn reserve(&'static self, bytes: usize) -> Result<()> {
        let mut held = self.filling.load(Ordering::Relaxed);
        loop {
            let next = held.saturating_add(bytes);
            if next > self.fill_budget {
                return Err(internal("fills in progress hold their whole budget"));
            }
            match self.filling.compare_exchange_weak(
                held,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => held = now,
            }
        }
    }

    /// Header and body bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Removes every entry whose path and tags `matches`, and returns their keys
    /// (for the eviction manager). Runs over all entries under the write
    /// lock: entries are bounded by `shop.cache.max_bytes`, and purges are
    /// rare operator actions.
    pub fn purge_where(
        &self,
        matches: impl Fn(&str, &Tags) -> bool + Send + Sync + 'static,
    ) -> Vec<CompactCacheKey> {
        let matches: PathMatch = Arc::new(matches);
        let mut removed = Vec::new();
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        // Under the entries lock, as `insert` reads both.
        let epoch = self.purge_epoch.fetch_add(1, Ordering::SeqCst) + 1;
        {
            let mut recent = self.recent_purges.lock().unwrap_or_else(|p| p.into_inner());
            recent.push_back((epoch, matches.clone()));
            if recent.len() > RECENT_PURGES {
                recent.pop_front();
            }
        }
        entries.retain(|_, e| {
            if matches(&e.path, &e.tags) {
                self.bytes.fetch_sub(e.size, Ordering::Relaxed);
                removed.push(e.key.clone());
                false
            } else {
                true
            }
        });
        self.publish(&entries);
        removed
    }

    fn publish(&self, entries: &HashMap<u128, Entry>) {
        self.gauges
            .bytes
            .set(i64::try_from(self.bytes()).unwrap_or(i64::MAX));
        self.gauges
            .objects
            .set(i64::try_from(entries.len()).unwrap_or(i64::MAX));
    }

    fn insert(&self, epoch: u64, entry: Entry) -> bool {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        // Checked under the lock a purge takes: a purge either ran before
        // (the epoch moved: not stored if it names this path, or if it is
        // too old to tell) or runs after (and removes it).
        if self.purge_epoch.load(Ordering::SeqCst) != epoch {
            let recent = self.recent_purges.lock().unwrap_or_else(|p| p.into_inner());
            let known = recent.front().is_some_and(|(first, _)| *first <= epoch + 1);
            if !known
                || recent
                    .iter()
                    .any(|(e, matches)| *e > epoch && matches(&entry.path, &entry.tags))
            {
                return false;
            }
        }
        self.bytes.fetch_add(entry.size, Ordering::Relaxed);
        if let Some(old) = entries.insert(slot(&entry.key), entry) {
            self.bytes.fetch_sub(old.size, Ordering::Relaxed);
        }
        self.publish(&entries);
        true
    }

    /// Whether `key` is stored now (complete: fills become visible only
    /// when finished).
    pub fn holds(&self, key: &impl CacheHashKey) -> bool {
        self.entries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&slot(key))
    }

    fn remove(&self, key: &CompactCacheKey) -> bool {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let removed = entries.remove(&slot(key));
        if let Some(old) = &removed {
            self.bytes.fetch_sub(old.size, Ordering::Relaxed);
        }
        self.publish(&entries);
        removed.is_some()
    }
}

#[async_trait]
impl Storage for MemoryStore {
    async fn lookup(
        &'static self,
        key: &CacheKey,
        _trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        let found = {
            let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
            entries
                .get(&slot(key))
                .map(|e| (e.meta.clone(), e.body.clone(), e.size))
        };
        let Some((meta, body, size)) = found else {
            return Ok(None);
        };
        let meta = CacheMeta::deserialize(&meta.0, &meta.1)?;
        let end = body.len();
        Ok(Some((
            meta,
            Box::new(Hit {
                body,
                size,
                done: false,
                start: 0,
                end,
            }),
        )))
    }

    async fn get_miss_handler(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        _trace: &SpanHandle,
    ) -> Result<MissHandler> {
        let path = key
            .primary_key_str()
            .and_then(|k| k.split_once(KEY_SEPARATOR))
            .map_or("", |(_, path)| path);
        let tags = Tags::of(meta.response_header(), &self.tag_header);
        let meta = meta.serialize()?;
        let base = meta.0.len() + meta.1.len() + path.len() + tags.bytes() + ENTRY_OVERHEAD;
        // Over budget, the fill is abandoned from the start: the response
        // still reaches the client, it is just not stored.
        let abandoned = self.reserve(base).is_err();
        Ok(Box::new(Fill {
            reserved: Reserved {
                store: self,
                bytes: if abandoned { 0 } else { base },
            },
            abandoned,
            epoch: self.purge_epoch.load(Ordering::SeqCst),
            meta,
            body: BytesMut::new(),
            done: false,
            path: path.into(),
            tags,
            key: key.to_compact(),
        }))
    }

    async fn purge(
        &'static self,
        target: PurgeTarget<'_>,
        kind: PurgeType,
        _trace: &SpanHandle,
    ) -> Result<PurgeOutcome> {
        if !self.remove(target.key()) {
            return Ok(PurgeOutcome::NotFound);
        }
        if matches!(kind, PurgeType::Eviction) {
            self.gauges.evictions.inc();
        }
        Ok(PurgeOutcome::Purged(None))
    }

    async fn expire(
        &'static self,
        target: PurgeTarget<'_>,
        _trace: &SpanHandle,
    ) -> Result<PurgeOutcome> {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = entries.get_mut(&slot(target.key())) else {
            return Ok(PurgeOutcome::NotFound);
        };
        let mut meta = CacheMeta::deserialize(&entry.meta.0, &entry.meta.1)?;
        meta.expire_at(SystemTime::now());
        entry.meta = meta.serialize()?;
        Ok(PurgeOutcome::Expired)
    }

    /// A revalidated (304) response's new freshness. The entry may have been
    /// purged or evicted meanwhile: then there is nothing to update.
    async fn update_meta(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        _trace: &SpanHandle,
    ) -> Result<bool> {
        // The shop may retag a page when it confirms it.
        let tags = Tags::of(meta.response_header(), &self.tag_header);
        let meta = meta.serialize()?;
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        let updated = match entries.get_mut(&slot(key)) {
            Some(entry) => {
                let size =
                    entry.size - entry.meta.0.len() - entry.meta.1.len() - entry.tags.bytes()
                        + meta.0.len()
                        + meta.1.len()
                        + tags.bytes();
                entry.tags = tags;
                self.bytes.fetch_add(size, Ordering::Relaxed);
                self.bytes.fetch_sub(entry.size, Ordering::Relaxed);
                entry.size = size;
                entry.meta = meta;
                true
            }
            None => false,
        };
        self.publish(&entries);
        Ok(updated)
    }

    fn support_streaming_partial_write(&self) -> bool {
        false
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync + 'static) {
        self
    }
}

/// A stored body being served, whole or as one range.
struct Hit {
    body: Bytes,
    size: usize,
    done: bool,
    start: usize,
    end: usize,
}

#[async_trait]
impl HandleHit for Hit {
    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        if self.done {
            return Ok(None);
        }
        self.done = true;
        Ok(Some(self.body.slice(self.start..self.end)))
    }

    async fn finish(
        self: Box<Self>,
        _storage: &'static (dyn Storage + Sync),
        _key: &CacheKey,
        _trace: &SpanHandle,
    ) -> Result<()> {
        Ok(())
    }

    fn can_seek(&self) -> bool {
        true
    }

    fn seek(&mut self, start: usize, end: Option<usize>) -> Result<()> {
        if start >= self.body.len() {
            return Err(internal("range start past the body"));
        }
        self.start = start;
        self.end = end
            .map_or(self.body.len(), |e| e.min(self.body.len()))
            .max(start);
        self.done = false;
        Ok(())
    }

    fn get_eviction_weight(&self) -> usize {
        self.size
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }

    fn as_any_mut(&mut self) -> &mut (dyn Any + Send + Sync) {
        self
    }
}

/// Bytes of the fill budget a fill holds; given back when the fill ends,
/// stored or not.
struct Reserved {
    store: &'static MemoryStore,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.store.filling.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A response being stored; it becomes visible when finished.
struct Fill {
    reserved: Reserved,
    /// Past the fill budget: nothing more is buffered and nothing stored.
    abandoned: bool,
    epoch: u64,
    meta: (Vec<u8>, Vec<u8>),
    body: BytesMut,
    done: bool,
    path: Box<str>,
    tags: Tags,
    key: CompactCacheKey,
}

#[async_trait]
impl HandleMiss for Fill {
    async fn write_body(&mut self, data: Bytes, eof: bool) -> Result<()> {
        if self.done && !data.is_empty() {
            return Err(internal("body written after its end"));
        }
        if self.body.len() + data.len() > self.reserved.store.max_object_bytes {
            return Err(Error::explain(
                ErrorType::InternalError,
                "response larger than shop.cache.max_object_bytes",
            ));
        }
        self.done |= eof;
        if self.abandoned {
            return Ok(());
        }
        if self.reserved.store.reserve(data.len()).is_err() {
            // Not an error: pingora would fail the client's response.
            self.abandoned = true;
            self.body = BytesMut::new();
            self.reserved
                .store
                .filling
                .fetch_sub(std::mem::take(&mut self.reserved.bytes), Ordering::Relaxed);
            return Ok(());
        }
        self.reserved.bytes += data.len();
        self.body.extend_from_slice(&data);
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<MissFinishType> {
        if self.abandoned {
            return Ok(MissFinishType::Created(0));
        }
        let size = self.reserved.bytes;
        let store = self.reserved.store;
        let entry = Entry {
            meta: self.meta,
            body: self.body.freeze(),
            size,
            path: self.path,
            tags: self.tags,
            key: self.key,
        };
        // A fill a purge overtook is dropped; the eviction manager then
        // tracks a key of weight 0 that is not stored, which costs nothing.
        let stored = store.insert(self.epoch, entry);
        Ok(MissFinishType::Created(if stored { size } else { 0 }))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use pingora::http::ResponseHeader;

    pub(in crate::edge::shop_cache) fn nop() -> SpanHandle {
        pingora::cache::trace::Span::inactive().handle()
    }

    pub(in crate::edge::shop_cache) fn store() -> &'static MemoryStore {
        let gauges = StoreGauges {
            bytes: IntGauge::new("b", "b").unwrap(),
            objects: IntGauge::new("o", "o").unwrap(),
            evictions: IntCounter::new("e", "e").unwrap(),
        };
        Box::leak(Box::new(MemoryStore::new(
            1024,
            4096,
            "surrogate-key",
            gauges,
        )))
    }

    pub(in crate::edge::shop_cache) fn meta() -> CacheMeta {
        let now = SystemTime::now();
        CacheMeta::new(
            now + std::time::Duration::from_secs(60),
            now,
            0,
            0,
            ResponseHeader::build(200, None).unwrap(),
        )
    }

    pub(in crate::edge::shop_cache) fn key(path: &str) -> CacheKey {
        CacheKey::new(format!("shop{KEY_SEPARATOR}{path}"), "")
    }

    pub(in crate::edge::shop_cache) async fn fill(
        store: &'static MemoryStore,
        path: &str,
        body: &'static [u8],
    ) -> MissFinishType {
        fill_key(store, &key(path), body).await
    }

    /// [`fill`] under any key (a `Vary` variant's, say).
    pub(in crate::edge::shop_cache) async fn fill_key(
        store: &'static MemoryStore,
        key: &CacheKey,
        body: &'static [u8],
    ) -> MissFinishType {
        fill_meta(store, key, &meta(), body).await
    }

    /// [`fill_key`] with the stored response's own `meta`.
    pub(in crate::edge::shop_cache) async fn fill_meta(
        store: &'static MemoryStore,
        key: &CacheKey,
        meta: &CacheMeta,
        body: &'static [u8],
    ) -> MissFinishType {
        let mut miss = store.get_miss_handler(key, meta, &nop()).await.unwrap();
        miss.write_body(Bytes::from_static(body), true)
            .await
            .unwrap();
        miss.finish().await.unwrap()
    }

    #[tokio::test]
    async fn a_finished_fill_is_found_with_its_body_and_counted() {
        let store = store();
        assert!(store.lookup(&key("/a"), &nop()).await.unwrap().is_none());
        assert!(matches!(fill(store, "/a", b"hello").await, MissFinishType::Created(n) if n > 5));
        let (_, mut hit) = store.lookup(&key("/a"), &nop()).await.unwrap().unwrap();
        assert_eq!(hit.read_body().await.unwrap().unwrap(), "hello");
        assert_eq!(hit.read_body().await.unwrap(), None);
        hit.seek(1, Some(3)).unwrap();
        assert_eq!(hit.read_body().await.unwrap().unwrap(), "el");
        assert!(hit.seek(9, None).is_err());
        assert_eq!(store.gauges.objects.get(), 1);
        assert_eq!(
            store.bytes(),
            usize::try_from(store.gauges.bytes.get()).unwrap()
        );
    }

    #[tokio::test]
    async fn a_fill_overtaken_by_a_purge_is_not_stored_and_nothing_panics() {
        let store = store();
        let mut miss = store
            .get_miss_handler(&key("/p"), &meta(), &nop())
            .await
            .unwrap();
        miss.write_body(Bytes::from_static(b"old"), false)
            .await
            .unwrap();
        assert!(store.purge_where(|p, _| p.starts_with("/p")).is_empty());
        miss.write_body(Bytes::new(), true).await.unwrap();
        assert!(matches!(
            miss.finish().await.unwrap(),
            MissFinishType::Created(0)
        ));
        assert!(store.lookup(&key("/p"), &nop()).await.unwrap().is_none());
        // Revalidating an entry that is gone is not an error.
        assert!(!store
            .update_meta(&key("/p"), &meta(), &nop())
            .await
            .unwrap());
        assert_eq!(store.bytes(), 0);
    }

    #[tokio::test]
    async fn a_purge_of_another_url_keeps_a_fill_in_progress() {
        let store = store();
        let mut miss = store
            .get_miss_handler(&key("/kept"), &meta(), &nop())
            .await
            .unwrap();
        miss.write_body(Bytes::from_static(b"new"), false)
            .await
            .unwrap();
        store.purge_where(|p, _| p == "/other");
        miss.write_body(Bytes::new(), true).await.unwrap();
        assert!(matches!(miss.finish().await.unwrap(), MissFinishType::Created(n) if n > 0));
        assert!(store.lookup(&key("/kept"), &nop()).await.unwrap().is_some());
        // Past the purges remembered, a fill cannot tell: it is dropped.
        let mut miss = store
            .get_miss_handler(&key("/old"), &meta(), &nop())
            .await
            .unwrap();
        for _ in 0..=RECENT_PURGES {
            store.purge_where(|p, _| p == "/other");
        }
        miss.write_body(Bytes::from_static(b"x"), true)
            .await
            .unwrap();
        assert!(matches!(
            miss.finish().await.unwrap(),
            MissFinishType::Created(0)
        ));
    }

    #[tokio::test]
    async fn purges_match_paths_and_free_their_bytes() {
        let store = store();
        for path in ["/products/1", "/products/2", "/cart"] {
            fill(store, path, b"x").await;
        }
        assert_eq!(
            store.purge_where(|p, _| p.starts_with("/products/")).len(),
            2
        );
        assert!(store.lookup(&key("/cart"), &nop()).await.unwrap().is_some());
        assert!(store
            .lookup(&key("/products/1"), &nop())
            .await
            .unwrap()
            .is_none());
        let cart = key("/cart").to_compact();
        let entry = pingora::cache::CacheEntryKey::key_only(cart);
        let gone = store
            .purge(PurgeTarget::Exact(&entry), PurgeType::Eviction, &nop())
            .await
            .unwrap();
        assert_eq!(gone, PurgeOutcome::Purged(None));
        assert_eq!((store.bytes(), store.gauges.evictions.get()), (0, 1));
    }

    fn tagged(tags: &str) -> CacheMeta {
        let now = SystemTime::now();
        let mut header = ResponseHeader::build(200, None).unwrap();
        header.insert_header("Surrogate-Key", tags).unwrap();
        CacheMeta::new(now + std::time::Duration::from_secs(60), now, 0, 0, header)
    }

    #[tokio::test]
    async fn a_purge_by_tag_removes_every_response_with_it_and_its_tags_with_it() {
        let store = store();
        for (path, tags) in [
            ("/p/1", "product-1 list"),
            ("/p/2", "product-2 list"),
            ("/c", ""),
        ] {
            fill_meta(store, &key(path), &tagged(tags), b"x").await;
        }
        assert_eq!(store.purge_where(|_, t| t.contains("product-1")).len(), 1);
        assert_eq!(store.purge_where(|_, t| t.contains("list")).len(), 1);
        assert!(store.purge_where(|_, t| t.contains("list")).is_empty());
        assert!(store.lookup(&key("/c"), &nop()).await.unwrap().is_some());
        // The tags left with their entries: one untagged entry remains.
        let untagged = store.bytes();
        store.purge_where(|_, _| true);
        assert_eq!(store.bytes(), 0);
        fill_meta(store, &key("/c"), &tagged(""), b"x").await;
        assert_eq!(store.bytes(), untagged);
        // A fill overtaken by a purge of one of its tags is not stored.
        let mut miss = store
            .get_miss_handler(&key("/p/3"), &tagged("product-3"), &nop())
            .await
            .unwrap();
        store.purge_where(|_, t| t.contains("product-3"));
        miss.write_body(Bytes::from_static(b"x"), true)
            .await
            .unwrap();
        assert!(matches!(
            miss.finish().await.unwrap(),
            MissFinishType::Created(0)
        ));
    }

    #[tokio::test]
    async fn fills_in_progress_hold_at_most_their_budget_and_give_it_back() {
        let store = store();
        let mut fills = Vec::new();
        for i in 0..8 {
            let mut miss = store
                .get_miss_handler(&key(&format!("/f{i}")), &meta(), &nop())
                .await
                .unwrap();
            // Past the budget a fill is abandoned, not failed.
            miss.write_body(Bytes::from(vec![0; 512]), false)
                .await
                .unwrap();
            assert!(store.filling() <= 4096, "{} held by fills", store.filling());
            fills.push(miss);
        }
        assert!(
            store.filling() > 4096 - 1024,
            "{} held by fills",
            store.filling()
        );
        let last = fills.pop().unwrap();
        assert!(
            matches!(last.finish().await.unwrap(), MissFinishType::Created(0)),
            "an abandoned fill is not stored"
        );
        assert!(store.lookup(&key("/f7"), &nop()).await.unwrap().is_none());
        drop(fills);
        assert_eq!(store.filling(), 0, "abandoned fills give their budget back");
        assert!(
            matches!(fill(store, "/after", b"x").await, MissFinishType::Created(n) if n >= ENTRY_OVERHEAD + "/after".len())
        );
        assert_eq!(store.filling(), 0);
    }

    #[tokio::test]
    async fn a_revalidated_header_is_counted_at_its_new_size() {
        let store = store();
        fill(store, "/r", b"x").await;
        let before = store.bytes();
        let mut header = ResponseHeader::build(200, None).unwrap();
        header
            .insert_header("etag", "\"a-rather-long-entity-tag-value\"")
            .unwrap();
        let now = SystemTime::now();
        let longer = CacheMeta::new(now + std::time::Duration::from_secs(60), now, 0, 0, header);
        assert!(store
            .update_meta(&key("/r"), &longer, &nop())
            .await
            .unwrap());
        assert!(store.bytes() > before, "{} after {before}", store.bytes());
        assert_eq!(
            store.bytes(),
            usize::try_from(store.gauges.bytes.get()).unwrap()
        );
    }

    #[tokio::test]
    async fn a_body_over_the_object_limit_is_refused() {
        let store = store();
        let mut miss = store
            .get_miss_handler(&key("/big"), &meta(), &nop())
            .await
            .unwrap();
        assert!(miss
            .write_body(Bytes::from(vec![0; 2048]), true)
            .await
            .is_err());
    }
}
