//! Bucketed stock: one hot sale's stock split over several Redis Cluster
//! slots, so more than one master decides its buys.
//!
//! A sale declared with `buckets = N` (N > 1) keeps its definition in its
//! own meta hash (`fg:{sale:ID}:meta`, with `buckets = N`), and sells from N
//! buckets. Bucket `k` is a sub-sale for Redis: it has exactly the key set
//! of a sale whose id is `ID:bk` (`SaleKeys::bucket` in [`crate::keys`]), so every per-sale
//! script (deduct, release, remembered, ...) works on a bucket unchanged.
//! Sale ids never contain `:`, so a bucket's keys never collide with a real
//! sale's. A buyer's **home bucket** ([`home_bucket`]) is a stable hash of
//! the user id: their per-user count, their Idempotency-Keys and their
//! reservations live there, so the per-user limit stays one atomic script.
//!
//! With N = 1 (the default) nothing of this applies: the sale's keys are
//! today's: `SaleKeys::home` answers `SaleKeys::new`.
//!
//! Every per-sale script is given the bucket's keys and the real sale id as
//! the sale, so stream records and orders carry the real id. Each bucket's
//! meta is a copy of the definition (name, per-user limit, window, pause,
//! plus its `bucket` and `buckets`) whose `stock` is the bucket's **base**
//! (its share at preheat, [`split_stock`], moved by stock changes), so a
//! deduct on a bucket reads everything in its slot. The sale's own
//! `remaining` is 0 and its own keys stay fenced: nothing is ever sold from
//! them. The count is 1 to [`MAX_BUCKETS`] and fixed once the sale is
//! saved (the items would have to be re-split over other hash tags).
//!
//! Items move between buckets with the transfer protocol of
//! [`crate::transfer`]. docs/ARCHITECTURE.md ("Bucketed stock") maps the
//! rest: the refill in the gateway, preheat, stock changes, the failover
//! re-sync and reconciliation in the backend.

/// Most buckets a sale may have: more than the masters of any cluster we
/// run, few enough that summing a sale's buckets stays cheap.
pub const MAX_BUCKETS: i64 = 64;

/// Validates a sale's bucket count (1 to [`MAX_BUCKETS`]), naming `key`.
///
/// # Errors
/// The value is out of range; the message names `key`.
pub fn validate(key: &str, buckets: i64) -> Result<u32, String> {
    if (1..=MAX_BUCKETS).contains(&buckets) {
        Ok(buckets as u32)
    } else {
        Err(format!("{key}: must be between 1 and {MAX_BUCKETS}"))
    }
}

/// FNV-1a, 64 bits: small, fast, and fixed forever (a change would move
/// every buyer of a running sale to another bucket). Not a defence against
/// a chosen user id: user ids come from signed tokens the shop mints.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The home bucket of `user` in a sale of `buckets` buckets: FNV-1a 64 of
/// the user id's UTF-8 bytes, modulo `buckets` (0 when `buckets` <= 1).
/// The gateway buys there and the backend finds the order's reservation
/// there: both must compute the same, so this is the one definition.
pub fn home_bucket(user: &str, buckets: u32) -> u32 {
    if buckets <= 1 {
        return 0;
    }
    (fnv1a64(user.as_bytes()) % u64::from(buckets)) as u32
}

/// The id under which bucket `k` of `sale_id` keeps its keys (`ID:bk`).
pub fn bucket_id(sale_id: &str, k: u32) -> String {
    format!("{sale_id}:b{k}")
}

/// How the stock is split at preheat: each bucket gets `stock / buckets`,
/// and the remainder goes one each to the first buckets.
pub fn split_stock(stock: i64, buckets: u32) -> Vec<i64> {
    let n = i64::from(buckets.max(1));
    let (share, extra) = (stock / n, stock % n);
    (0..n).map(|k| share + i64::from(k < extra)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_buckets_are_pinned_and_spread() {
        // Pinned: a change would move buyers of running sales.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(home_bucket("alice", 6), (fnv1a64(b"alice") % 6) as u32);
        assert_eq!(
            [
                home_bucket("alice", 6),
                home_bucket("bob", 6),
                home_bucket("u-1", 6),
                home_bucket("u-2", 6)
            ],
            PINNED
        );
        assert_eq!(home_bucket("alice", 1), 0);
        assert_eq!(home_bucket("alice", 0), 0);
        let mut seen = [0_u32; 6];
        for i in 0..6000 {
            seen[home_bucket(&format!("user-{i}"), 6) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    const PINNED: [u32; 4] = [5, 0, 2, 1];

    #[test]
    fn stock_splits_with_the_remainder_first() {
        assert_eq!(split_stock(600, 6), vec![100; 6]);
        assert_eq!(split_stock(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(split_stock(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(split_stock(7, 1), vec![7]);
        assert_eq!(split_stock(10, 4).iter().sum::<i64>(), 10);
    }

    #[test]
    fn bucket_counts_are_validated_by_key() {
        assert_eq!(validate("buckets", 1), Ok(1));
        assert_eq!(validate("buckets", 64), Ok(64));
        assert!(validate("sales[0].buckets", 0)
            .unwrap_err()
            .starts_with("sales[0].buckets: "));
        assert!(validate("buckets", 65).is_err());
    }
}
