//! Buyer identity: JWTs verified at the edge, HS256 with the shared
//! secret and RS256, ES256 and EdDSA against the identity provider's
//! public keys (`jwks`), as `auth.algorithms` allows.
//!
//! A token comes from `Authorization: Bearer`, else from the sign-in
//! cookie named by `auth.cookie` (the caller learns which: a buy signed in
//! by cookie must pass the CSRF check, `admission::csrf`). It must be
//! signed by an allowed algorithm, carry `sub` (the user id) and `exp`,
//! and, when `auth.audience` / `auth.issuer` are set, that `aud` / `iss`.
//! A token carrying `nbf` is refused before that time. The algorithm is
//! read from the token's header and must be allowed; an HS256 token is
//! only ever checked with the secret and an asymmetric one only with the
//! JWKS key its `kid` names, whose type fixes its one algorithm, so `alg:
//! none` and algorithm confusion (a public key used as an HMAC secret)
//! are refused by construction. User ids end up inside Redis keys, so they
//! are restricted to a safe character set.
//!
//! A token is verified once: its user id and `exp` are then remembered
//! under the SHA-256 digest of the token's bytes (`remembered`). A
//! remembered token is still refused from its `exp` (plus the same
//! leeway) on, as the full check would, and is checked in full again once
//! the JWKS changes (a key the provider removed stops working at the next
//! load, not minutes later). The memory is a fixed table of
//! 65,536 slots: a crowd larger than the table costs what it would cost
//! without one, a signature check of about 2 µs for HS256 (`cargo bench
//! -p flashgate --bench token_verify`). A remembered token and an HS256
//! or known-`kid` token are answered without waiting; only a token naming
//! a `kid` the set lacks waits for the set to be fetched again.

mod jwks;
mod remembered;

use std::sync::Arc;

use flashgate_common::config::{AuthConfig, JwtAlgorithm};
use http::HeaderMap;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use jwks::{Jwks, JwksError, JwksRefresher};
use remembered::{Remembered, TokenDigest};

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

/// Where a request's token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `Authorization: Bearer`: a cross-site page cannot make a browser
    /// send it.
    Bearer,
    /// The sign-in cookie, which a browser sends with any request to the
    /// site, a cross-site form's included.
    Cookie,
}

/// A verified buyer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub via: Via,
}

/// Slots of remembered tokens, so a buyer hammering with one token pays
/// for the signature check once, not per request (a power of two: the
/// digest's low bits pick the slot): about 5 MiB.
const REMEMBERED_SLOTS: usize = 1 << 16;
/// Clock leeway on `exp` and `nbf`, as in the full check.
const LEEWAY_SECONDS: u64 = 5;
/// Longest lifetime [`mint`] gives a token.
pub const MAX_MINT_TTL_SECONDS: u64 = 366 * 86_400;

/// What the signature check of a token found.
enum Checked {
    Done(Result<Claims, AuthError>),
    /// The token names a `kid` the JWKS lacks (yet).
    UnknownKid(String),
}

/// Verifies buyer tokens; built once from the config and shared.
pub struct Verifier {
    /// The HS256 key, when HS256 is allowed and a secret is set.
    secret: Option<DecodingKey>,
    /// One validation per allowed algorithm: the same claim rules, each
    /// accepting only its own `alg`.
    validations: Vec<(Algorithm, Validation)>,
    /// The public keys, when an asymmetric algorithm is allowed.
    jwks: Option<Arc<Jwks>>,
    /// The sign-in cookie's name (`auth.cookie`).
    cookie: Option<Box<str>>,
    verified: Remembered,
}

impl Verifier {
    /// An HS256 verifier of `sub` and `exp` only; a token carrying an
    /// `aud` is refused (it was minted for someone else).
    pub fn new(secret: &[u8]) -> Self {
        Self::expecting(secret, &AuthConfig::default())
    }

    /// An HS256 verifier that also requires the configured `aud` and `iss`.
    pub fn expecting(secret: &[u8], expected: &AuthConfig) -> Self {
        let hs256 = AuthConfig {
            algorithms: vec![JwtAlgorithm::HS256],
            ..expected.clone()
        };
        Self::with_keys(Some(secret), &hs256, None)
    }

    /// A verifier of `auth.algorithms`: HS256 with `secret` (when given),
    /// the others with `jwks` (when given); an algorithm without its key
    /// is refused like one not listed.
    pub fn with_keys(secret: Option<&[u8]>, auth: &AuthConfig, jwks: Option<Arc<Jwks>>) -> Self {
        let mut required = vec!["exp", "sub"];
        if auth.audience.is_some() {
            required.push("aud");
        }
        if auth.issuer.is_some() {
            required.push("iss");
        }
        let validation = |alg: Algorithm| {
            let mut validation = Validation::new(alg);
            if let Some(aud) = &auth.audience {
                validation.set_audience(&[aud]);
            }
            if let Some(iss) = &auth.issuer {
                validation.set_issuer(&[iss]);
            }
            validation.set_required_spec_claims(&required);
            validation.leeway = LEEWAY_SECONDS;
            validation.validate_nbf = true;
            validation
        };
        let validations = auth
            .algorithms
            .iter()
            .filter(|a| {
                if a.is_asymmetric() {
                    jwks.is_some()
                } else {
                    secret.is_some()
                }
            })
            .map(|a| {
                let alg = algorithm(*a);
                (alg, validation(alg))
            })
            .collect::<Vec<_>>();
        let has = |alg: Algorithm| validations.iter().any(|(a, _)| *a == alg);
        Self {
            secret: secret
                .filter(|_| has(Algorithm::HS256))
                .map(DecodingKey::from_secret),
            jwks: jwks.filter(|_| validations.iter().any(|(a, _)| *a != Algorithm::HS256)),
            validations,
            cookie: auth.cookie.as_deref().map(Box::from),
            verified: Remembered::new(REMEMBERED_SLOTS),
        }
    }

    /// The JWKS, for its refresher (when an asymmetric algorithm is
    /// allowed).
    pub fn jwks(&self) -> Option<Arc<Jwks>> {
        self.jwks.clone()
    }

    /// The verified buyer of a request: its bearer token, else its sign-in
    /// cookie.
    ///
    /// # Errors
    /// [`AuthError`] for a missing, expired, badly signed or malformed token,
    /// or one whose `sub` is not a valid user id.
    pub async fn identify(&self, headers: &HeaderMap) -> Result<Identity, AuthError> {
        let (token, via) = self.token(headers)?;
        let user = self.verify(token).await?;
        Ok(Identity { user, via })
    }

    /// The token of a request and where it came from.
    fn token<'h>(&self, headers: &'h HeaderMap) -> Result<(&'h str, Via), AuthError> {
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .and_then(|t| std::str::from_utf8(t).ok())
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(token) = bearer {
            return Ok((token, Via::Bearer));
        }
        self.cookie
            .as_deref()
            .and_then(|name| cookie(headers, name))
            .map(|token| (token, Via::Cookie))
            .ok_or(AuthError::Missing)
    }

    /// The user id of a valid token.
    ///
    /// # Errors
    /// As [`Verifier::identify`].
    pub async fn verify(&self, token: &str) -> Result<String, AuthError> {
        let now = now_seconds();
        let digest: TokenDigest = Sha256::digest(token.as_bytes()).into();
        // Read before the check: a set that changes during it makes the
        // entry stale at once.
        let generation = self.jwks.as_ref().map_or(0, |j| j.generation());
        if let Some((user, exp)) = self.verified.get(&digest, now, generation) {
            // Saturating: a token signed with our key may say any `exp`.
            // As jsonwebtoken's check: refused once `exp + leeway < now`.
            if now <= exp.saturating_add(LEEWAY_SECONDS) {
                return Ok(user.to_string());
            }
            return Err(AuthError::Expired);
        }
        let claims = match self.check(token) {
            Checked::Done(claims) => claims?,
            // Boxed: only a token of a rotated key waits for the fetch, and
            // the other requests' futures stay small.
            Checked::UnknownKid(kid) => Box::pin(self.check_after_refetch(token, kid)).await?,
        };
        if !valid_user_id(&claims.sub) {
            return Err(AuthError::Invalid);
        }
        self.verified.remember(
            digest,
            Arc::from(claims.sub.as_str()),
            claims.exp,
            now,
            generation,
        );
        Ok(claims.sub)
    }

    /// The full check of a token, without waiting.
    fn check(&self, token: &str) -> Checked {
        let alg = if self.jwks.is_none() {
            // HS256 only: the check itself refuses any other `alg`.
            Algorithm::HS256
        } else {
            match jsonwebtoken::decode_header(token) {
                Ok(header) if header.alg == Algorithm::HS256 => Algorithm::HS256,
                Ok(header) => return self.check_public(token, header),
                Err(_) => return Checked::Done(Err(AuthError::Invalid)),
            }
        };
        Checked::Done(match (&self.secret, self.validation(alg)) {
            (Some(key), Some(validation)) => decode(token, key, validation),
            _ => Err(AuthError::Invalid),
        })
    }

    /// The check of a token of an asymmetric algorithm, with the key its
    /// `kid` names.
    fn check_public(&self, token: &str, header: Header) -> Checked {
        let (Some(jwks), Some(validation), Some(kid)) =
            (&self.jwks, self.validation(header.alg), header.kid)
        else {
            return Checked::Done(Err(AuthError::Invalid));
        };
        let keys = jwks.keys();
        match keys.get(&kid) {
            Some(key) if key.alg == header.alg => {
                Checked::Done(decode(token, &key.key, validation))
            }
            Some(_) => Checked::Done(Err(AuthError::Invalid)),
            None => Checked::UnknownKid(kid),
        }
    }

    /// The check of a token whose `kid` the set lacked, after the set was
    /// fetched again (if the refetch bound allowed it).
    async fn check_after_refetch(&self, token: &str, kid: String) -> Result<Claims, AuthError> {
        let Some(jwks) = &self.jwks else {
            return Err(AuthError::Invalid);
        };
        if !jwks.refetch_for(&kid).await {
            return Err(AuthError::Invalid);
        }
        match self.check(token) {
            Checked::Done(claims) => claims,
            Checked::UnknownKid(_) => Err(AuthError::Invalid),
        }
    }

    fn validation(&self, alg: Algorithm) -> Option<&Validation> {
        self.validations
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, v)| v)
    }
}

/// The signature and claims check of one token.
fn decode(token: &str, key: &DecodingKey, validation: &Validation) -> Result<Claims, AuthError> {
    jsonwebtoken::decode::<Claims>(token, key, validation)
        .map(|data| data.claims)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
            _ => AuthError::Invalid,
        })
}

fn algorithm(alg: JwtAlgorithm) -> Algorithm {
    match alg {
        JwtAlgorithm::HS256 => Algorithm::HS256,
        JwtAlgorithm::RS256 => Algorithm::RS256,
        JwtAlgorithm::ES256 => Algorithm::ES256,
        JwtAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

/// The value of cookie `name` in the request's `Cookie` headers (RFC
/// 6265: `name=value` pairs split by `;`, a value optionally in double
/// quotes); an empty value counts as none.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| {
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value)
        })
        .filter(|value| !value.is_empty())
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
mod tests;
