//! Verified tokens in a fixed table of slots, one token per slot, the slot
//! picked by the SHA-256 digest of the token's bytes (a client chooses
//! those bytes, so only a collision-resistant digest may stand for them;
//! the digest is also a fixed 32 bytes, cheap to index and compare).
//!
//! Why not a cache crate: in a sale with more buyers than slots most
//! tokens are seen about once, and then a general cache's admission,
//! eviction and rehashing cost more than the signature check they would
//! save. Here a lookup or a store is one slot lock and a 32-byte compare,
//! and the table never grows or runs maintenance. A token stored into a
//! taken slot replaces its occupant, which is verified in full again when
//! it comes back. Crafting tokens that share a slot takes grinding
//! digests, and only buys the re-verification of the tokens they push out.

use std::sync::{Arc, Mutex};

/// The SHA-256 of a token's bytes: what a verified token is remembered by.
pub(super) type TokenDigest = [u8; 32];

/// How long a verified token is remembered at most, in seconds (its
/// `exp` ends it sooner).
const REMEMBERED_SECONDS: u64 = 300;

pub(super) struct Remembered {
    slots: Box<[Mutex<Option<RememberedToken>>]>,
}

struct RememberedToken {
    digest: TokenDigest,
    user: Arc<str>,
    /// The token's `exp`.
    exp: u64,
    /// Forgotten from then on (seconds), whatever `exp` says.
    until: u64,
    /// The key set's generation it was verified under: a token is
    /// forgotten once the set changes (a key removed must stop working).
    generation: u64,
}

impl Remembered {
    pub(super) fn new(slots: usize) -> Self {
        Self {
            slots: (0..slots.max(1)).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn slot(&self, digest: &TokenDigest) -> &Mutex<Option<RememberedToken>> {
        let low = u64::from_le_bytes(digest[..8].try_into().unwrap_or_default());
        &self.slots[(low % self.slots.len() as u64) as usize]
    }

    /// The user id and `exp` of a token remembered under `digest`. A slot
    /// another thread holds right now answers "not remembered": the
    /// caller verifies in full rather than wait.
    pub(super) fn get(
        &self,
        digest: &TokenDigest,
        now: u64,
        generation: u64,
    ) -> Option<(Arc<str>, u64)> {
        let slot = self.slot(digest).try_lock().ok()?;
        slot.as_ref()
            .filter(|t| t.digest == *digest && now < t.until && t.generation == generation)
            .map(|t| (t.user.clone(), t.exp))
    }

    pub(super) fn remember(
        &self,
        digest: TokenDigest,
        user: Arc<str>,
        exp: u64,
        now: u64,
        generation: u64,
    ) {
        if let Ok(mut slot) = self.slot(&digest).try_lock() {
            *slot = Some(RememberedToken {
                digest,
                user,
                exp,
                until: now.saturating_add(REMEMBERED_SECONDS),
                generation,
            });
        }
    }
}
