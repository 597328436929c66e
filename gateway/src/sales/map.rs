//! [`SaleMap`]: the sales one gateway tracks, by id, read on every buy.
//!
//! A buy reads its sale's entry several times (its flags before and after
//! the body, its window, its clears around the deduct), so the read is
//! what this map is for: a lock-free lookup (papaya) that writes nothing
//! shared, where a general cache records every read for its eviction
//! policy and reads the clock. The price is the bound, kept here by hand:
//! entries are made only for ids a read or an event names, and when the
//! map is full one caller at a time sweeps it: the blank entries go (they
//! hold nothing: a made-up id's passing entry, a first read in flight),
//! then, down to nine tenths of the bound, others in the table's order (by
//! a hash seeded at random, blind to use). So a sweep comes at most once
//! per tenth of the bound new ids. A sale whose entry went holds nothing
//! here until read or told of again (its flag, epoch and clears start
//! over), so its buys go to the deduct script, which decides them anyway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The ids and their entries; `V` is a sale's entry (`sales::cache`).
pub(super) struct SaleMap<V> {
    entries: papaya::HashMap<String, Arc<V>, ahash::RandomState>,
    max: usize,
    /// Whether an entry holds nothing (a sale's: `Sale::is_blank`).
    blank: fn(&V) -> bool,
    /// Held by the one caller sweeping a full map; the others insert.
    sweeping: AtomicBool,
}

impl<V: Default> SaleMap<V> {
    /// A map of at most `max` entries, `blank` telling those that hold
    /// nothing; its hash is seeded at random: sale ids come from request
    /// paths, so a client picks the ones it asks for.
    pub(super) fn new(max: usize, blank: fn(&V) -> bool) -> Self {
        Self {
            entries: papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .build(),
            max,
            blank,
            sweeping: AtomicBool::new(false),
        }
    }

    /// The entry of `id`, if one is kept.
    pub(super) fn get(&self, id: &str) -> Option<Arc<V>> {
        self.entries.pin().get(id).cloned()
    }

    /// The entry of `id`, made empty if it has none; a full map is swept
    /// first (see the module's doc).
    pub(super) fn get_or_default(&self, id: &str) -> Arc<V> {
        let entries = self.entries.pin();
        if let Some(entry) = entries.get(id) {
            return entry.clone();
        }
        if entries.len() >= self.max
            && self
                .sweeping
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            entries.retain(|_, entry| !(self.blank)(entry));
            let mut evict = entries.len().saturating_sub(self.max * 9 / 10);
            entries.retain(|_, _| {
                let keep = evict == 0;
                evict = evict.saturating_sub(1);
                keep
            });
            self.sweeping.store(false, Ordering::Release);
        }
        entries
            .get_or_insert_with(id.to_owned(), Arc::default)
            .clone()
    }

    /// Drops `entry` as the entry of `id` if it holds nothing (not an
    /// entry made for `id` since, nor one written to meanwhile).
    pub(super) fn remove_blank(&self, id: &str, entry: &Arc<V>) {
        let _ = self
            .entries
            .pin()
            .remove_if(id, |_, kept| Arc::ptr_eq(kept, entry) && (self.blank)(kept));
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps the entries for which `keep` answers true.
    pub(super) fn retain(&self, mut keep: impl FnMut(&V) -> bool) {
        self.entries.pin().retain(|_, entry| keep(entry));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Entry {
        held: AtomicBool,
    }

    fn blank(e: &Entry) -> bool {
        !e.held.load(Ordering::Relaxed)
    }

    #[test]
    fn an_id_keeps_one_entry_until_it_is_dropped_blank() {
        let map = SaleMap::<Entry>::new(4, blank);
        let first = map.get_or_default("a");
        assert!(Arc::ptr_eq(&first, &map.get_or_default("a")));
        assert!(Arc::ptr_eq(&first, &map.get("a").unwrap()));
        first.held.store(true, Ordering::Relaxed);
        map.remove_blank("a", &first);
        assert!(map.get("a").is_some(), "an entry holding something stays");
        first.held.store(false, Ordering::Relaxed);
        map.remove_blank("a", &first);
        assert!(map.get("a").is_none());
    }

    #[test]
    fn removing_an_older_entry_leaves_the_newer_one() {
        let map = SaleMap::<Entry>::new(4, blank);
        let old = map.get_or_default("a");
        map.remove_blank("a", &old);
        let new = map.get_or_default("a");
        map.remove_blank("a", &old);
        assert!(Arc::ptr_eq(&new, &map.get("a").unwrap()));
    }

    #[test]
    fn a_full_map_drops_blank_entries_before_any_that_hold_something() {
        let map = SaleMap::<Entry>::new(2, blank);
        map.get_or_default("held")
            .held
            .store(true, Ordering::Relaxed);
        map.get_or_default("blank");
        // Full: the blank entry makes room.
        map.get_or_default("new")
            .held
            .store(true, Ordering::Relaxed);
        assert!(map.get("blank").is_none());
        assert!(map.get("held").is_some() && map.get("new").is_some());
    }

    #[test]
    fn a_map_full_of_held_entries_evicts_down_to_nine_tenths_and_keeps_the_new_one() {
        let map = SaleMap::<Entry>::new(20, blank);
        for n in 0..20 {
            map.get_or_default(&format!("s{n}"))
                .held
                .store(true, Ordering::Relaxed);
        }
        let new = map.get_or_default("new");
        assert!(Arc::ptr_eq(&new, &map.get("new").unwrap()));
        assert_eq!(map.len(), 19, "two of the twenty went, the new one came");
    }
}
