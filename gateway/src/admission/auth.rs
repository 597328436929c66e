//! Buyer identity: HS256 JWTs verified at the edge.
//!
//! A token must be signed with the configured secret, carry `sub` (the user
//! id) and `exp`, and, when `auth.audience` / `auth.issuer` are set, that
//! `aud` / `iss`. A token carrying `nbf` is refused before that time. Only
//! HS256 is accepted, so `alg: none` and algorithm confusion are rejected
//! by construction. User ids end up inside Redis keys, so they are
//! restricted to a safe character set.
//!
//! A token is verified once: its user id and `exp` are then remembered
//! under the SHA-256 digest of the token's bytes (a client chooses those
//! bytes, so only a collision-resistant digest may stand for them; the
//! digest is also a fixed 32 bytes, cheap to index and compare). A
//! remembered token is still refused from its `exp` (plus the same
//! leeway) on, as the full check would. The memory is a fixed table of
//! 65,536 slots (the slot picked by the digest): a token stored into a
//! taken slot replaces its occupant, so a crowd larger than the table costs
//! what it would cost without one, a signature check of about 2 µs
//! (`cargo bench -p flashgate --bench token_verify`).

use std::sync::{Arc, Mutex};

use flashgate_common::config::AuthConfig;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest user id accepted in a token's `sub`.
pub const MAX_USER_ID_LEN: usize = 128;

/// The claims read from a token (`aud` and `iss` are checked by the
/// validation, which also takes an `aud` list).
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
}

/// The claims of a minted token.
#[derive(Serialize)]
struct MintedClaims<'a> {
    #[serde(flatten)]
    claims: Claims,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
}

/// Why a request carries no verified identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token")]
    Missing,
    #[error("token expired")]
    Expired,
    #[error("invalid token")]
    Invalid,
}

impl AuthError {
    /// The message of the 401's body.
    pub fn message(self) -> &'static str {
        match self {
            AuthError::Missing => "missing bearer token",
            AuthError::Expired => "token expired",
            AuthError::Invalid => "invalid token",
        }
    }
}

/// Slots of remembered tokens, so a buyer hammering with one token pays
/// for the signature check once, not per request (a power of two: the
/// digest's low bits pick the slot): about 5 MiB.
const REMEMBERED_SLOTS: usize = 1 << 16;
/// Clock leeway on `exp` and `nbf`, as in the full check.
const LEEWAY_SECONDS: u64 = 5;
/// Longest lifetime [`mint`] gives a token.
pub const MAX_MINT_TTL_SECONDS: u64 = 366 * 86_400;

/// How long a verified token is remembered at most, in seconds (its
/// `exp` ends it sooner).
const REMEMBERED_SECONDS: u64 = 300;

/// The SHA-256 of a token's bytes: what a verified token is remembered by.
type TokenDigest = [u8; 32];

/// Verifies buyer tokens; built once from the secret and shared.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
    verified: Remembered,
}

/// Verified tokens in a fixed table of slots, one token per slot, the slot
/// picked by the token's digest.
///
/// Why not a cache crate: in a sale with more buyers than slots most
/// tokens are seen about once, and then a general cache's admission,
/// eviction and rehashing cost more than the signature check they would
/// save. Here a lookup or a store is one slot lock and a 32-byte compare,
/// and the table never grows or runs maintenance. A token stored into a
/// taken slot replaces its occupant, which is verified in full again when
/// it comes back. The digests are SHA-256 of client-chosen bytes: crafting
/// tokens that share a slot takes grinding digests, and only buys the
/// re-verification of the tokens they push out.
struct Remembered {
    slots: Box<[Mutex<Option<RememberedToken>>]>,
}

struct RememberedToken {
    digest: TokenDigest,
    user: Arc<str>,
    /// The token's `exp`.
    exp: u64,
    /// Forgotten from then on (seconds), whatever `exp` says.
    until: u64,
}

impl Remembered {
    fn new(slots: usize) -> Self {
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
    fn get(&self, digest: &TokenDigest, now: u64) -> Option<(Arc<str>, u64)> {
        let slot = self.slot(digest).try_lock().ok()?;
        slot.as_ref()
            .filter(|t| t.digest == *digest && now < t.until)
            .map(|t| (t.user.clone(), t.exp))
    }

    fn remember(&self, digest: TokenDigest, user: Arc<str>, exp: u64, now: u64) {
        if let Ok(mut slot) = self.slot(&digest).try_lock() {
            *slot = Some(RememberedToken {
                digest,
                user,
                exp,
                until: now.saturating_add(REMEMBERED_SECONDS),
            });
        }
    }
}

impl Verifier {
    /// A verifier of `sub` and `exp` only; a token carrying an `aud` is
    /// refused (it was minted for someone else).
    pub fn new(secret: &[u8]) -> Self {
        Self::expecting(secret, &AuthConfig::default())
    }

    /// A verifier that also requires the configured `aud` and `iss`.
    pub fn expecting(secret: &[u8], expected: &AuthConfig) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        let mut required = vec!["exp", "sub"];
        if let Some(aud) = &expected.audience {
            validation.set_audience(&[aud]);
            required.push("aud");
        }
        if let Some(iss) = &expected.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_nbf = true;
        Self {
            key: DecodingKey::from_secret(secret),
            validation,
            verified: Remembered::new(REMEMBERED_SLOTS),
        }
    }

    /// Returns the user id of a valid `Authorization: Bearer <jwt>` value.
    ///
    /// # Errors
    /// [`AuthError`] for a missing, expired, badly signed or malformed token,
    /// or one whose `sub` is not a valid user id.
    pub fn verify(&self, authorization: Option<&[u8]>) -> Result<String, AuthError> {
        let header = authorization.ok_or(AuthError::Missing)?;
        let token = header
            .strip_prefix(b"Bearer ")
            .and_then(|t| std::str::from_utf8(t).ok())
            .ok_or(AuthError::Missing)?
            .trim();
        let now = now_seconds();
        let digest: TokenDigest = Sha256::digest(token.as_bytes()).into();
        if let Some((user, exp)) = self.verified.get(&digest, now) {
            // Saturating: a token signed with our secret may say any `exp`.
            // As jsonwebtoken's check: refused once `exp + leeway < now`.
            if now <= exp.saturating_add(LEEWAY_SECONDS) {
                return Ok(user.to_string());
            }
            return Err(AuthError::Expired);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
                _ => AuthError::Invalid,
            },
        )?;
        if !valid_user_id(&data.claims.sub) {
            return Err(AuthError::Invalid);
        }
        self.verified.remember(
            digest,
            Arc::from(data.claims.sub.as_str()),
            data.claims.exp,
            now,
        );
        Ok(data.claims.sub)
    }
}

/// The wall clock in whole seconds, as `exp`, `nbf` and `iat` count.
fn now_seconds() -> u64 {
    flashgate_common::now_ms().max(0) as u64 / 1000
}

/// User ids are 1 to 128 characters of `[A-Za-z0-9._@-]`: no `:` (the
/// separator inside idempotency keys) and nothing that needs escaping.
pub fn valid_user_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_USER_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'))
}

/// Mints a token for `user` valid for `ttl_seconds`, with the configured
/// `aud` and `iss` (demos, tests, load generators; a real shop mints its
/// own with the same secret).
///
/// # Errors
/// When `user` is not a valid user id, or `ttl_seconds` is more than
/// [`MAX_MINT_TTL_SECONDS`].
pub fn mint(
    secret: &[u8],
    user: &str,
    ttl_seconds: u64,
    expected: &AuthConfig,
) -> anyhow::Result<String> {
    anyhow::ensure!(
        valid_user_id(user),
        "user id must be 1 to 128 characters of A-Z a-z 0-9 . _ @ -"
    );
    anyhow::ensure!(
        ttl_seconds <= MAX_MINT_TTL_SECONDS,
        "ttl must be at most {} days",
        MAX_MINT_TTL_SECONDS / 86_400
    );
    let now = now_seconds();
    let claims = MintedClaims {
        claims: Claims {
            sub: user.to_owned(),
            exp: now.saturating_add(ttl_seconds),
            iat: Some(now),
        },
        aud: expected.audience.as_deref(),
        iss: expected.issuer.as_deref(),
    };
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(t: &str) -> Vec<u8> {
        format!("Bearer {t}").into_bytes()
    }

    #[test]
    fn a_minted_token_verifies_to_its_user() {
        let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
        assert_eq!(
            Verifier::new(b"k").verify(Some(&bearer(&t))),
            Ok("alice".into())
        );
    }

    #[test]
    fn wrong_secret_expired_and_missing_tokens_are_rejected() {
        let v = Verifier::new(b"k");
        let t = mint(b"other", "alice", 60, &AuthConfig::default()).unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Err(AuthError::Invalid));
        assert_eq!(v.verify(None), Err(AuthError::Missing));
        assert_eq!(v.verify(Some(b"Basic abc")), Err(AuthError::Missing));
        let old = Claims {
            sub: "alice".into(),
            exp: 1000,
            iat: None,
        };
        let t = jsonwebtoken::encode(&Header::default(), &old, &EncodingKey::from_secret(b"k"))
            .unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Err(AuthError::Expired));
    }

    #[test]
    fn a_remembered_token_still_expires() {
        let v = Verifier::new(b"k");
        let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Ok("alice".into()));
        // Second time from the cache: same answer.
        assert_eq!(v.verify(Some(&bearer(&t))), Ok("alice".into()));
        let now = now_seconds();
        v.verified.remember(
            Sha256::digest(t.as_bytes()).into(),
            Arc::from("alice"),
            1000,
            now,
        );
        assert_eq!(v.verify(Some(&bearer(&t))), Err(AuthError::Expired));
    }

    #[test]
    fn a_remembered_token_is_checked_in_full_again_after_its_time() {
        let v = Verifier::new(b"k");
        let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
        // Remembered for someone else, but so long ago that it is forgotten:
        // the answer comes from the full check.
        v.verified.remember(
            Sha256::digest(t.as_bytes()).into(),
            Arc::from("mallory"),
            u64::MAX,
            0,
        );
        assert_eq!(v.verify(Some(&bearer(&t))), Ok("alice".into()));
    }

    #[test]
    fn tokens_sharing_a_slot_replace_each_other_and_each_still_answers_its_own_user() {
        let v = Verifier {
            verified: Remembered::new(1),
            ..Verifier::new(b"k")
        };
        let (a, b) = (
            mint(b"k", "alice", 60, &AuthConfig::default()).unwrap(),
            mint(b"k", "bob", 60, &AuthConfig::default()).unwrap(),
        );
        for _ in 0..3 {
            assert_eq!(v.verify(Some(&bearer(&a))), Ok("alice".into()));
            assert_eq!(v.verify(Some(&bearer(&b))), Ok("bob".into()));
        }
        let now = now_seconds();
        assert!(
            v.verified
                .get(&Sha256::digest(a.as_bytes()).into(), now)
                .is_none(),
            "alice's token was pushed out by bob's"
        );
        assert_eq!(
            v.verified
                .get(&Sha256::digest(b.as_bytes()).into(), now)
                .map(|(u, _)| u.to_string()),
            Some("bob".into())
        );
    }

    #[test]
    fn remembered_tokens_each_answer_their_own_user() {
        let v = Verifier::new(b"k");
        let (a, b) = (
            mint(b"k", "alice", 60, &AuthConfig::default()).unwrap(),
            mint(b"k", "bob", 60, &AuthConfig::default()).unwrap(),
        );
        for _ in 0..2 {
            assert_eq!(v.verify(Some(&bearer(&a))), Ok("alice".into()));
            assert_eq!(v.verify(Some(&bearer(&b))), Ok("bob".into()));
        }
        // A remembered token's bytes changed by one character are a new
        // token: checked in full (and refused), not taken for the old one.
        let mut forged = a.clone();
        let last = forged.pop().unwrap();
        forged.push(if last == 'A' { 'B' } else { 'A' });
        assert_eq!(v.verify(Some(&bearer(&forged))), Err(AuthError::Invalid));
    }

    #[test]
    fn alg_none_and_tokens_without_exp_are_rejected() {
        let v = Verifier::new(b"k");
        // {"alg":"none","typ":"JWT"}.{"sub":"alice","exp":9999999999}.
        let none =
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.";
        assert_eq!(v.verify(Some(&bearer(none))), Err(AuthError::Invalid));
        #[derive(Serialize)]
        struct NoExp {
            sub: &'static str,
        }
        let t = jsonwebtoken::encode(
            &Header::default(),
            &NoExp { sub: "alice" },
            &EncodingKey::from_secret(b"k"),
        )
        .unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Err(AuthError::Invalid));
    }

    fn token_with(aud: Option<&str>, iss: Option<&str>) -> String {
        let claims = MintedClaims {
            claims: Claims {
                sub: "alice".into(),
                exp: 9_999_999_999,
                iat: None,
            },
            aud,
            iss,
        };
        jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"k")).unwrap()
    }

    #[test]
    fn with_audience_and_issuer_configured_a_token_must_carry_both() {
        let expected = AuthConfig {
            audience: Some("flashgate".into()),
            issuer: Some("https://shop.example".into()),
        };
        let v = Verifier::expecting(b"k", &expected);
        let good = token_with(Some("flashgate"), Some("https://shop.example"));
        assert_eq!(v.verify(Some(&bearer(&good))), Ok("alice".into()));
        for bad in [
            token_with(Some("other-service"), Some("https://shop.example")),
            token_with(Some("flashgate"), Some("https://evil.example")),
            token_with(None, Some("https://shop.example")),
            token_with(Some("flashgate"), None),
            token_with(None, None),
        ] {
            assert_eq!(
                v.verify(Some(&bearer(&bad))),
                Err(AuthError::Invalid),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_minted_token_carries_the_configured_claims() {
        let expected = AuthConfig {
            audience: Some("flashgate".into()),
            issuer: Some("shop".into()),
        };
        let t = mint(b"k", "alice", 60, &expected).unwrap();
        assert_eq!(
            Verifier::expecting(b"k", &expected).verify(Some(&bearer(&t))),
            Ok("alice".into())
        );
        assert_eq!(
            Verifier::new(b"k").verify(Some(&bearer(&t))),
            Err(AuthError::Invalid),
            "an aud meant for someone else"
        );
    }

    #[test]
    fn a_token_expiring_at_the_end_of_time_is_valid_and_does_not_overflow() {
        let v = Verifier::new(b"k");
        let claims = Claims {
            sub: "alice".into(),
            exp: u64::MAX,
            iat: None,
        };
        let t = jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"k"))
            .unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Ok("alice".into()));
        // Again from the remembered tokens, where `exp` plus the leeway is computed.
        assert_eq!(v.verify(Some(&bearer(&t))), Ok("alice".into()));
    }

    #[test]
    fn an_absurd_lifetime_is_refused_when_minting() {
        let err = mint(b"k", "alice", u64::MAX, &AuthConfig::default()).unwrap_err();
        assert!(err.to_string().contains("ttl"), "{err}");
        assert!(mint(b"k", "alice", MAX_MINT_TTL_SECONDS, &AuthConfig::default()).is_ok());
    }

    #[test]
    fn a_token_used_before_its_nbf_is_rejected() {
        #[derive(Serialize)]
        struct WithNbf {
            sub: &'static str,
            exp: u64,
            nbf: u64,
        }
        let v = Verifier::new(b"k");
        let now = now_seconds();
        let early = WithNbf {
            sub: "alice",
            exp: now + 7200,
            nbf: now + 3600,
        };
        let t = jsonwebtoken::encode(&Header::default(), &early, &EncodingKey::from_secret(b"k"))
            .unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Err(AuthError::Invalid));
        let ready = WithNbf {
            sub: "alice",
            exp: now + 7200,
            nbf: now - 60,
        };
        let t = jsonwebtoken::encode(&Header::default(), &ready, &EncodingKey::from_secret(b"k"))
            .unwrap();
        assert_eq!(v.verify(Some(&bearer(&t))), Ok("alice".into()));
    }

    #[test]
    fn user_ids_that_would_break_redis_keys_are_rejected() {
        assert!(valid_user_id("user-42@shop.example"));
        assert!(!valid_user_id("a:b"));
        assert!(!valid_user_id(""));
        assert!(!valid_user_id("a b"));
        assert!(mint(b"k", "a:b", 60, &AuthConfig::default()).is_err());
    }
}
