//! The challenge itself, pure: issued and verified from plain values (the
//! time comes in as a parameter), no Redis, no state.
//!
//! A challenge is the base64url (no padding, so no `.` and no `=`) of 54
//! bytes, 72 characters:
//!
//! ```text
//! version 1 | difficulty 1 | expires_at_ms 8 (big endian) | id 12 (random)
//!   | user binding 8 | sale binding 8 | tag 16
//! ```
//!
//! The bindings are the first 8 bytes of HMAC-SHA256(secret, user) and
//! (secret, sale), each with its own domain byte and a length prefix: only
//! a holder of the secret can compute them, so a challenge cannot be
//! pointed at another user or sale, and a mismatch says which one it was
//! issued for. The tag is the first 16 bytes of HMAC-SHA256 over the 38
//! bytes before it (its own domain byte), compared in constant time. Any
//! gateway with the same secret verifies any other's challenges.
//!
//! The client answers with the header `Flashgate-Pow: <challenge>.<nonce>`
//! (split at the last `.`; the nonce is 1 to 64 of `[A-Za-z0-9_-]`). It is
//! valid when SHA-256 of that ASCII string, the whole header value, starts
//! with at least `difficulty` zero bits. Verifying costs about 0.6 µs
//! (`cargo bench -p flashgate --bench challenge_verify`), so a buy without a
//! valid solution is turned away before any Redis call.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The request header carrying a solution.
pub const POW_HEADER: &str = "flashgate-pow";
/// Characters of an encoded challenge.
pub const CHALLENGE_CHARS: usize = 72;
/// Longest nonce accepted.
pub const MAX_NONCE_CHARS: usize = 64;
/// Random bytes naming a challenge (its used-solution record in Redis).
pub const ID_BYTES: usize = 12;

const VERSION: u8 = 1;
const BIND_BYTES: usize = 8;
const TAG_BYTES: usize = 16;
const PAYLOAD_BYTES: usize = 2 + 8 + ID_BYTES + 2 * BIND_BYTES;
const RAW_BYTES: usize = PAYLOAD_BYTES + TAG_BYTES;

/// Domain bytes: a tag can never be passed off as a binding, nor a user's
/// binding as a sale's.
const DOMAIN_TAG: u8 = b't';
const DOMAIN_USER: u8 = b'u';
const DOMAIN_SALE: u8 = b's';

/// Why a solution was not accepted; each is a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Flashgate-Pow` header.
    Missing,
    /// Not `<challenge>.<nonce>` in the expected shape: `400 bad_request`.
    Malformed,
    /// Well formed, but not signed with this secret (or of an unknown version).
    Forged,
    /// Issued to another user.
    OtherUser,
    /// Issued for another sale.
    OtherSale,
    /// Past its `expires_at`.
    Expired,
    /// Fewer leading zero bits than the challenge asks, or a challenge
    /// easier than the configured base difficulty.
    TooEasy,
    /// The challenge was already used by another buy.
    Replayed,
}

impl Refusal {
    /// The `reason` label of `flashgate_challenges_rejected_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Forged => "forged",
            Refusal::OtherUser => "other_user",
            Refusal::OtherSale => "other_sale",
            Refusal::Expired => "expired",
            Refusal::TooEasy => "too_easy",
            Refusal::Replayed => "replayed",
        }
    }

    /// The `message` of the answer: what the client should do.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "this sale asks for a proof of work: solve the challenge and send it in the Flashgate-Pow header",
            Refusal::Malformed => "Flashgate-Pow must be <challenge>.<nonce>, the nonce 1 to 64 of A-Z a-z 0-9 _ -",
            Refusal::Forged => "the challenge was not issued by this sale's gateways: solve the new one",
            Refusal::OtherUser => "the challenge was issued to another user: solve the new one",
            Refusal::OtherSale => "the challenge was issued for another sale: solve the new one",
            Refusal::Expired => "the challenge has expired: solve the new one",
            Refusal::TooEasy => "the solution does not have enough leading zero bits: solve the new challenge",
            Refusal::Replayed => "this solution was already used: solve the new challenge",
        }
    }
}

/// A challenge as handed to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub challenge: String,
    pub difficulty_bits: u8,
    pub expires_at_ms: i64,
}

/// A solution that passed every check this module can make; whether it was
/// used before is for Redis to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    /// The challenge's id, base64url (16 characters): its key in Redis.
    pub id: String,
    pub expires_at_ms: i64,
    pub difficulty_bits: u8,
}

/// Issues and verifies challenges with one secret.
#[derive(Clone)]
pub struct Signer {
    /// Keyed once; each use clones the precomputed inner and outer states
    /// instead of hashing the key again.
    mac: Hmac<Sha256>,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Self {
        // HMAC takes keys of any length.
        Self {
            mac: Hmac::new_from_slice(secret).expect("HMAC accepts any key length"),
        }
    }

    fn keyed(&self, domain: u8, data: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(&[domain]);
        mac.update(&(data.len() as u64).to_be_bytes());
        mac.update(data);
        mac
    }

    fn binding(&self, domain: u8, data: &str) -> [u8; BIND_BYTES] {
        let full = self.keyed(domain, data.as_bytes()).finalize().into_bytes();
        let mut out = [0; BIND_BYTES];
        out.copy_from_slice(&full[..BIND_BYTES]);
        out
    }

    /// A challenge for `user` buying in `sale`, asking `difficulty_bits`,
    /// valid until `expires_at_ms`, named by the random `id`.
    pub fn issue(
        &self,
        user: &str,
        sale: &str,
        difficulty_bits: u8,
        expires_at_ms: i64,
        id: [u8; ID_BYTES],
    ) -> Issued {
        let mut raw = [0u8; RAW_BYTES];
        raw[0] = VERSION;
        raw[1] = difficulty_bits;
        raw[2..10].copy_from_slice(&expires_at_ms.to_be_bytes());
        raw[10..10 + ID_BYTES].copy_from_slice(&id);
        let at = 10 + ID_BYTES;
        raw[at..at + BIND_BYTES].copy_from_slice(&self.binding(DOMAIN_USER, user));
        raw[at + BIND_BYTES..PAYLOAD_BYTES].copy_from_slice(&self.binding(DOMAIN_SALE, sale));
        let tag = self
            .keyed(DOMAIN_TAG, &raw[..PAYLOAD_BYTES])
            .finalize()
            .into_bytes();
        raw[PAYLOAD_BYTES..].copy_from_slice(&tag[..TAG_BYTES]);
        Issued {
            challenge: URL_SAFE_NO_PAD.encode(raw),
            difficulty_bits,
            expires_at_ms,
        }
    }

    /// Checks a `Flashgate-Pow` header value for `user` buying in `sale`
    /// at `now_ms`; a challenge easier than `min_bits` is refused too.
    ///
    /// # Errors
    /// The first [`Refusal`] found, in this order: malformed, forged,
    /// other user, other sale, expired, too easy.
    pub fn verify(
        &self,
        header: &[u8],
        user: &str,
        sale: &str,
        now_ms: i64,
        min_bits: u8,
    ) -> Result<Solved, Refusal> {
        let challenge = split(header)?;
        let mut raw = [0u8; RAW_BYTES];
        match URL_SAFE_NO_PAD.decode_slice(challenge, &mut raw) {
            Ok(RAW_BYTES) => {}
            _ => return Err(Refusal::Malformed),
        }
        let tag = self.keyed(DOMAIN_TAG, &raw[..PAYLOAD_BYTES]);
        tag.verify_truncated_left(&raw[PAYLOAD_BYTES..])
            .map_err(|_| Refusal::Forged)?;
        if raw[0] != VERSION {
            return Err(Refusal::Forged);
        }
        let at = 10 + ID_BYTES;
        if raw[at..at + BIND_BYTES] != self.binding(DOMAIN_USER, user) {
            return Err(Refusal::OtherUser);
        }
        if raw[at + BIND_BYTES..PAYLOAD_BYTES] != self.binding(DOMAIN_SALE, sale) {
            return Err(Refusal::OtherSale);
        }
        let mut expires = [0u8; 8];
        expires.copy_from_slice(&raw[2..10]);
        let expires_at_ms = i64::from_be_bytes(expires);
        if now_ms > expires_at_ms {
            return Err(Refusal::Expired);
        }
        let difficulty_bits = raw[1];
        if difficulty_bits < min_bits || solution_bits(header) < u32::from(difficulty_bits) {
            return Err(Refusal::TooEasy);
        }
        Ok(Solved {
            id: URL_SAFE_NO_PAD.encode(&raw[10..10 + ID_BYTES]),
            expires_at_ms,
            difficulty_bits,
        })
    }
}

/// The challenge of `<challenge>.<nonce>`, split at the last dot, each
/// part checked for shape (the challenge's exact length, the nonce's
/// alphabet and length).
fn split(header: &[u8]) -> Result<&[u8], Refusal> {
    let dot = header
        .iter()
        .rposition(|&b| b == b'.')
        .ok_or(Refusal::Malformed)?;
    let (challenge, nonce) = (&header[..dot], &header[dot + 1..]);
    let nonce_ok = (1..=MAX_NONCE_CHARS).contains(&nonce.len())
        && nonce
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if challenge.len() != CHALLENGE_CHARS || !nonce_ok {
        return Err(Refusal::Malformed);
    }
    Ok(challenge)
}

/// Leading zero bits of SHA-256 of a `Flashgate-Pow` header value: what
/// the solution is worth.
pub fn solution_bits(header: &[u8]) -> u32 {
    leading_zero_bits(&Sha256::digest(header))
}

/// Leading zero bits of a digest.
pub fn leading_zero_bits(digest: &[u8]) -> u32 {
    let mut bits = 0;
    for &b in digest {
        if b != 0 {
            return bits + b.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// Finds a nonce for `challenge` with at least `bits` leading zero bits by
/// counting up from `start`: what a client does (tests, tools, the bench).
pub fn solve(challenge: &str, bits: u8, start: u64) -> String {
    (start..)
        .map(|n| format!("{challenge}.{n}"))
        .find(|candidate| solution_bits(candidate.as_bytes()) >= u32::from(bits))
        .expect("some nonce below 2^64 has the bits")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn signer() -> Signer {
        Signer::new(b"a challenge secret of at least thirty-two bytes")
    }

    fn issued(bits: u8) -> Issued {
        signer().issue("alice", "drop", bits, NOW + 60_000, [7; ID_BYTES])
    }

    /// A header whose hash has fewer than `bits` leading zero bits.
    fn unsolved(challenge: &str, bits: u8) -> String {
        (0..)
            .map(|n| format!("{challenge}.{n}"))
            .find(|c| solution_bits(c.as_bytes()) < u32::from(bits))
            .unwrap()
    }

    #[test]
    fn a_challenge_is_72_url_safe_characters_without_a_dot() {
        let c = issued(8);
        assert_eq!(c.challenge.len(), CHALLENGE_CHARS);
        assert!(
            c.challenge
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{}",
            c.challenge
        );
        assert_eq!((c.difficulty_bits, c.expires_at_ms), (8, NOW + 60_000));
    }

    #[test]
    fn a_solution_passes_for_its_user_and_sale_until_it_expires() {
        let c = issued(8);
        let header = solve(&c.challenge, 8, 0);
        let solved = signer()
            .verify(header.as_bytes(), "alice", "drop", NOW, 8)
            .unwrap();
        assert_eq!(
            (
                solved.difficulty_bits,
                solved.expires_at_ms,
                solved.id.len()
            ),
            (8, NOW + 60_000, 16)
        );
        assert_eq!(
            signer()
                .verify(header.as_bytes(), "alice", "drop", NOW + 60_000, 8)
                .map(|s| s.id),
            Ok(solved.id)
        );
        assert_eq!(
            signer().verify(header.as_bytes(), "alice", "drop", NOW + 60_001, 8),
            Err(Refusal::Expired)
        );
    }

    #[test]
    fn a_challenge_for_another_user_or_sale_is_refused_as_such() {
        let c = issued(4);
        let header = solve(&c.challenge, 4, 0);
        assert_eq!(
            signer().verify(header.as_bytes(), "bob", "drop", NOW, 4),
            Err(Refusal::OtherUser)
        );
        assert_eq!(
            signer().verify(header.as_bytes(), "alice", "other", NOW, 4),
            Err(Refusal::OtherSale)
        );
    }

    #[test]
    fn a_changed_byte_or_another_secret_is_forged() {
        let c = issued(0);
        let other = Signer::new(b"another secret of at least thirty-two bytes!!");
        assert_eq!(
            other.verify(
                format!("{}.1", c.challenge).as_bytes(),
                "alice",
                "drop",
                NOW,
                0
            ),
            Err(Refusal::Forged)
        );
        let mut raw = URL_SAFE_NO_PAD.decode(&c.challenge).unwrap();
        for i in [0, 1, 5, 12, 25, 40, RAW_BYTES - 1] {
            raw[i] ^= 1;
            let tampered = format!("{}.1", URL_SAFE_NO_PAD.encode(&raw));
            assert_eq!(
                signer().verify(tampered.as_bytes(), "alice", "drop", NOW, 0),
                Err(Refusal::Forged),
                "byte {i}"
            );
            raw[i] ^= 1;
        }
    }

    #[test]
    fn too_few_zero_bits_or_an_easier_challenge_than_the_base_is_too_easy() {
        let c = issued(12);
        let header = unsolved(&c.challenge, 12);
        assert_eq!(
            signer().verify(header.as_bytes(), "alice", "drop", NOW, 12),
            Err(Refusal::TooEasy)
        );
        let easy = issued(2);
        let header = solve(&easy.challenge, 2, 0);
        assert_eq!(
            signer().verify(header.as_bytes(), "alice", "drop", NOW, 10),
            Err(Refusal::TooEasy)
        );
    }

    #[test]
    fn any_shape_but_challenge_dot_nonce_is_malformed_and_never_panics() {
        let c = issued(0).challenge;
        let long = "1".repeat(MAX_NONCE_CHARS + 1);
        let cases = [
            String::new(),
            ".".into(),
            c.clone(),
            format!("{c}."),
            format!("{c}.{long}"),
            format!("{c}.a b"),
            format!("{c}.é"),
            format!("{c}.a.b"),
            format!("x{c}.1"),
            format!("{}.1", &c[1..]),
            format!("{}!.1", &c[1..]),
            format!("{}=.1", &c[1..]),
        ];
        for h in &cases {
            assert_eq!(
                signer().verify(h.as_bytes(), "alice", "drop", NOW, 0),
                Err(Refusal::Malformed),
                "{h:?}"
            );
        }
        assert_eq!(
            signer().verify(&[0xff; 80], "alice", "drop", NOW, 0),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn leading_zero_bits_are_counted_across_bytes() {
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0x00, 0x01]), 15);
        assert_eq!(leading_zero_bits(&[0x00, 0x00]), 16);
        assert_eq!(leading_zero_bits(&[0x0f, 0x00]), 4);
    }
}
