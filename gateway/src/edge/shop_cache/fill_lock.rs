//! The cache lock, closed against a fill that finishes between a miss's
//! lookup and its lock.
//!
//! Pingora looks a key up, and on a miss takes the key's lock: the first
//! request becomes the writer, the rest wait for it. The two steps are not
//! one: a writer can store its response and release the lock after a
//! request's lookup missed but before that request asks for the lock. The
//! late request would then become a second writer and fetch the page from
//! the shop again, although the stored copy is there. [`FillLock`] looks
//! at the store once more when it grants a write lock for a miss: if the
//! key is stored now, the request gets a read lock that is already
//! released, so pingora looks the key up again and answers from the copy.
//!
//! Only keys without a variance are checked. A stored variant (`Vary`) can
//! be present yet refused by pingora's lookup (older than its primary's
//! provenance, pingora's tombstone for every variant); sending such a miss
//! back to look again would keep it from ever replacing the refused copy.
//! A variant keeps pingora's plain lock, and with it the rare second fetch.

use std::time::Duration;

use http::Extensions;
use pingora::cache::key::CacheHashKey;
use pingora::cache::lock::{CacheKeyLock, CacheLock, LockStatus, Locked, WritePermit};
use pingora::cache::CacheKey;

use super::storage::MemoryStore;

/// Pingora's [`CacheLock`], with the store checked again before a miss
/// becomes a writer.
pub struct FillLock {
    inner: CacheLock,
    store: &'static MemoryStore,
}

impl FillLock {
    /// `age_timeout`: how long a writer may hold a key before waiters
    /// compete for it again (`shop.cache.lock_timeout_ms`).
    pub fn new(age_timeout: Duration, store: &'static MemoryStore) -> Self {
        Self {
            inner: CacheLock::new(age_timeout),
            store,
        }
    }
}

impl CacheKeyLock for FillLock {
    fn lock(&self, key: &CacheKey, stale_writer: bool) -> Locked {
        let locked = self.inner.lock(key, stale_writer);
        let Locked::Write(permit) = locked else {
            return locked;
        };
        // A revalidation writer found the stored copy stale on purpose; a
        // variant may be stored and still refused by the lookup (above).
        if stale_writer || key.variance_bin().is_some() || !self.store.holds(key) {
            return Locked::Write(permit);
        }
        // Stored after this request's lookup: give the key back (anyone who
        // queued on it in the meantime looks again too) and look again.
        self.inner.release(key, permit, LockStatus::Done);
        let (mut released, stub) = WritePermit::new(Duration::ZERO, false, Extensions::new());
        released.unlock(LockStatus::Done);
        Locked::Read(stub.read_lock())
    }

    fn release(&self, key: &CacheKey, permit: WritePermit, reason: LockStatus) {
        self.inner.release(key, permit, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::super::storage::tests::{fill, fill_key, key, store};
    use super::*;

    #[tokio::test]
    async fn a_miss_of_an_absent_key_becomes_the_writer_and_the_next_waits() {
        let lock = FillLock::new(Duration::from_secs(10), store());
        let Locked::Write(permit) = lock.lock(&key("/a"), false) else {
            panic!("the first miss writes")
        };
        let Locked::Read(waiter) = lock.lock(&key("/a"), false) else {
            panic!("the second miss waits")
        };
        assert!(waiter.locked());
        lock.release(&key("/a"), permit, LockStatus::Done);
        assert!(!waiter.locked());
    }

    #[tokio::test]
    async fn a_miss_whose_key_was_stored_after_its_lookup_looks_again_instead_of_fetching() {
        let store = store();
        let lock = FillLock::new(Duration::from_secs(10), store);
        // The writer's fill lands and its lock is released before the late
        // miss asks for the lock.
        fill(store, "/a", b"page").await;
        let Locked::Read(late) = lock.lock(&key("/a"), false) else {
            panic!("a stored key is not fetched again")
        };
        assert!(!late.locked(), "released at once");
        assert_eq!(late.lock_status(), LockStatus::Done);
        // The key's lock was given back: once the copy is gone, a miss writes.
        store.purge_where(|_, _| true);
        let Locked::Write(permit) = lock.lock(&key("/a"), false) else {
            panic!("a miss of a purged key writes")
        };
        lock.release(&key("/a"), permit, LockStatus::Done);
    }

    #[tokio::test]
    async fn a_revalidation_of_a_stored_key_still_becomes_the_writer() {
        let store = store();
        let lock = FillLock::new(Duration::from_secs(10), store);
        fill(store, "/a", b"page").await;
        let Locked::Write(permit) = lock.lock(&key("/a"), true) else {
            panic!("a revalidation writes")
        };
        lock.release(&key("/a"), permit, LockStatus::Done);
    }

    #[tokio::test]
    async fn a_miss_of_a_stored_variant_keeps_the_plain_lock_and_writes() {
        let store = store();
        let lock = FillLock::new(Duration::from_secs(10), store);
        let mut variant = key("/v");
        variant.set_variance_key(*b"0123456789abcdef");
        fill_key(store, &variant, b"gzip page").await;
        assert!(store.holds(&variant));
        let Locked::Write(permit) = lock.lock(&variant, false) else {
            panic!("a stored variant the lookup refused must be replaceable")
        };
        lock.release(&variant, permit, LockStatus::Done);
    }
}
