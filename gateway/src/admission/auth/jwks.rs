//! The identity provider's public keys: a JSON Web Key Set (RFC 7517),
//! from `auth.jwks_url` or `auth.jwks_file`.
//!
//! The set is held whole behind an `ArcSwap`, so a token's check reads it
//! without a lock. It is loaded again every `auth.jwks_refresh_seconds`
//! ([`JwksRefresher`]), and at once when a token names a `kid` the set
//! lacks (the provider rotated its keys) — at most once per
//! `auth.jwks_refetch_interval_ms`, so a stream of made-up `kid`s cannot
//! turn the gateway into a flood on the provider. A load that fails (the
//! URL down, a bad answer, a set with no usable key) keeps the last good
//! set: tokens of known keys go on being accepted while the provider is
//! away.
//!
//! Only public keys that can verify an allowed algorithm are kept, each
//! bound to the one algorithm its type fixes: RSA to RS256, EC P-256 to
//! ES256, Ed25519 to EdDSA (a key's own `alg`, when it has one, must
//! agree). Symmetric (`oct`) keys, encryption keys and keys without a
//! `kid` are skipped, as are entries this version cannot read, so one odd
//! key does not cost the whole set.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use flashgate_common::config::{JwksConfig, JwksSource};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use prometheus::IntCounterVec;
use sha2::{Digest, Sha256};

use crate::infra::{Shutdown, Task};

/// Largest JWKS read: a provider's set is a few kilobytes.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// Why a load of the set failed (the last good set stays).
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("fetching the JWKS: {0}")]
    Fetch(#[from] reqwest::Error),
    #[error("the JWKS URL answered HTTP {0}")]
    Status(u16),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the JWKS is larger than {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    #[error("the JWKS is not a JSON object with a `keys` array: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("the JWKS holds no usable key (RSA, EC P-256 or Ed25519 public keys with a `kid`)")]
    NoUsableKeys,
}

/// One public key and the algorithm it verifies.
pub(super) struct PublicKey {
    pub(super) key: DecodingKey,
    pub(super) alg: Algorithm,
}

/// The usable keys of one JWKS, by `kid`.
#[derive(Default)]
pub(super) struct KeySet {
    keys: HashMap<String, PublicKey>,
}

impl KeySet {
    pub(super) fn get(&self, kid: &str) -> Option<&PublicKey> {
        self.keys.get(kid)
    }

    /// Reads a JWKS document, keeping the usable keys.
    ///
    /// # Errors
    /// When the document is not a JWKS, or none of its keys is usable.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, JwksError> {
        #[derive(serde::Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document = serde_json::from_slice(bytes)?;
        let keys: HashMap<String, PublicKey> = document
            .keys
            .into_iter()
            .filter_map(|value| serde_json::from_value::<Jwk>(value).ok())
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, usable(&jwk)?)))
            .collect();
        if keys.is_empty() {
            return Err(JwksError::NoUsableKeys);
        }
        Ok(Self { keys })
    }
}

/// The key of `jwk` and its algorithm, when it is a signing public key
/// of an algorithm the gateway verifies.
fn usable(jwk: &Jwk) -> Option<PublicKey> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let stated = match jwk.common.key_algorithm {
        None => alg,
        Some(KeyAlgorithm::RS256) => Algorithm::RS256,
        Some(KeyAlgorithm::ES256) => Algorithm::ES256,
        Some(KeyAlgorithm::EdDSA) => Algorithm::EdDSA,
        Some(_) => return None,
    };
    if stated != alg {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(PublicKey { key, alg })
}

enum Source {
    Url { http: reqwest::Client, url: String },
    File(PathBuf),
}

/// The current set, where it comes from, and the bound on refetches.
pub struct Jwks {
    source: Source,
    keys: ArcSwap<KeySet>,
    /// Held by every load, so concurrent tokens of one new `kid` cause one
    /// fetch; holds when the last refetch for an unknown `kid` started.
    loading: tokio::sync::Mutex<Option<Instant>>,
    refetch_interval: Duration,
    refresh: Duration,
    /// `flashgate_jwks_loads_total`, by result.
    loads: IntCounterVec,
    /// Bumped whenever a load brings a set that differs from the last one:
    /// tokens remembered before were verified with keys that may be gone.
    generation: AtomicU64,
    /// SHA-256 of the last document loaded.
    last_document: std::sync::Mutex<[u8; 32]>,
}

impl Jwks {
    /// The set of `config`. A file is read now; a URL is first fetched by
    /// the [`JwksRefresher`] (or by the first token that needs it).
    ///
    /// # Errors
    /// When the file cannot be read or holds no usable key, or the HTTP
    /// client cannot be built.
    pub fn new(config: &JwksConfig, loads: IntCounterVec) -> Result<Self, JwksError> {
        let (source, keys, digest) = match &config.source {
            JwksSource::Url(url) => {
                // No redirects: the keys come from the configured URL only.
                let http = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .timeout(config.timeout)
                    .connect_timeout(config.timeout)
                    .build()?;
                let source = Source::Url {
                    http,
                    url: url.clone(),
                };
                (source, KeySet::default(), [0; 32])
            }
            JwksSource::File(path) => {
                let bytes = std::fs::read(path).map_err(|source| JwksError::Read {
                    path: path.clone(),
                    source,
                })?;
                let digest = Sha256::digest(&bytes).into();
                (Source::File(path.clone()), KeySet::parse(&bytes)?, digest)
            }
        };
        Ok(Self {
            source,
            keys: ArcSwap::from_pointee(keys),
            loading: tokio::sync::Mutex::new(None),
            refetch_interval: config.refetch_interval,
            refresh: config.refresh,
            loads,
            generation: AtomicU64::new(0),
            last_document: std::sync::Mutex::new(digest),
        })
    }

    /// Changes whenever the key set does (see `Verifier::verify`, which
    /// forgets tokens remembered under an older set).
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current set.
    pub(super) fn keys(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.keys.load()
    }

    /// Loads the set again, unless another load is running (then waits
    /// for it).
    ///
    /// # Errors
    /// Why the load failed; the last good set stays.
    pub async fn reload(&self) -> Result<(), JwksError> {
        let _loading = self.loading.lock().await;
        self.load().await
    }

    /// After a token named `kid`, which the set lacks: loads the set again
    /// unless a refetch ran less than the refetch interval ago. Whether
    /// the set now holds `kid`.
    pub(super) async fn refetch_for(&self, kid: &str) -> bool {
        let mut last = self.loading.lock().await;
        // Loaded meanwhile, by the refresher or a token of the same `kid`.
        if self.keys.load().get(kid).is_some() {
            return true;
        }
        if last.is_some_and(|at| at.elapsed() < self.refetch_interval) {
            return false;
        }
        *last = Some(Instant::now());
        if let Err(error) = self.load().await {
            tracing::warn!(%error, "jwks: refetch for an unknown kid failed; keeping the last good set");
        }
        self.keys.load().get(kid).is_some()
    }

    /// One load, counted; the caller holds `loading`.
    async fn load(&self) -> Result<(), JwksError> {
        let loaded = match self.read().await {
            Ok(bytes) => KeySet::parse(&bytes).map(|set| (set, Sha256::digest(&bytes).into())),
            Err(error) => Err(error),
        };
        let result = if loaded.is_ok() { "ok" } else { "error" };
        self.loads.with_label_values(&[result]).inc();
        let (set, digest): (KeySet, [u8; 32]) = loaded?;
        tracing::debug!(keys = set.keys.len(), "jwks: loaded");
        self.keys.store(Arc::new(set));
        let mut last = self
            .last_document
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last != digest {
            *last = digest;
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    async fn read(&self) -> Result<Vec<u8>, JwksError> {
        match &self.source {
            Source::Url { http, url } => {
                let mut response = http.get(url).send().await?;
                if !response.status().is_success() {
                    return Err(JwksError::Status(response.status().as_u16()));
                }
                let mut body = Vec::new();
                while let Some(chunk) = response.chunk().await? {
                    if body.len() + chunk.len() > MAX_JWKS_BYTES {
                        return Err(JwksError::TooLarge);
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(body)
            }
            Source::File(path) => {
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|source| JwksError::Read {
                        path: path.clone(),
                        source,
                    })?;
                if bytes.len() > MAX_JWKS_BYTES {
                    return Err(JwksError::TooLarge);
                }
                Ok(bytes)
            }
        }
    }
}

/// Loads the set at start, then every `auth.jwks_refresh_seconds`; after a
/// failed load, again after the refetch interval.
pub struct JwksRefresher(pub Arc<Jwks>);

#[async_trait]
impl Task for JwksRefresher {
    async fn run(&self, mut shutdown: Shutdown) {
        loop {
            let wait = match self.0.reload().await {
                Ok(()) => self.0.refresh,
                Err(error) => {
                    tracing::warn!(%error, "jwks: load failed; keeping the last good set");
                    self.0.refetch_interval
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
