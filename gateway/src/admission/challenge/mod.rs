//! The proof-of-work challenge of buys (`[challenge]`, off by default).
//!
//! With `challenge.mode` on, a buy must carry `Flashgate-Pow:
//! <challenge>.<nonce>`, a solution of a challenge this sale's gateways
//! issued to this user: SHA-256 of the header value with at least the
//! challenge's number of leading zero bits. Without one the buy gets `428
//! challenge_required` with a fresh challenge; a client may also fetch one
//! ahead with `GET /flashgate/api/sales/{id}/challenge` (the sale page does, during
//! the countdown, and solves it in a Web Worker).
//!
//! Layout:
//! - [`token`]: the challenge, issued and verified without state (HMAC-SHA256
//!   with `FLASHGATE_CHALLENGE_SECRET`, bound to user and sale, expiring,
//!   carrying its difficulty).
//! - [`rates`]: the adaptive difficulty from the request rates of the
//!   user, the IP and the sale, in bounded caches.
//! - [`ChallengeGate`] (here): what a buy's admission asks: verify, then
//!   record the solution as used in Redis (`SET NX`, one round trip, in the
//!   sale's slot: `fg:{sale:ID}:pow:<challenge id>`), so each solution buys
//!   once across every gateway.
//!
//! A solution is used by one buy. The one exception is a re-send of that
//! same buy: the same solution with the same non-empty Idempotency-Key
//! passes again (the used record holds the key), so a client's retry after
//! a network error is answered with the first outcome like any keyed
//! retry; it can never take a second item, because the deduct script
//! answers a known key from memory. Any other reuse is `replayed`.

pub mod rates;
pub mod token;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use flashgate_common::config::{ChallengeConfig, ChallengeMode};
use flashgate_common::keys::SaleKeys;

use crate::infra::Metrics;
use crate::infra::{RedisClient, RedisError};
use crate::rejection::{unavailable, Rejection};
use rates::Rates;
use token::{Issued, Refusal, Signer, Solved, ID_BYTES};

/// How long a used solution is remembered past its challenge's expiry:
/// covers clocks that differ between gateways (each checks the expiry
/// with its own).
const USED_MARGIN_MS: i64 = 60_000;

/// Most re-sends of one buy (same Idempotency-Key) with one solution: the
/// sale page's network retries, not a way to poll the sale.
pub const MAX_RESENDS: u32 = 3;

/// Records a solution's use (`lua/pow_use.lua`).
static POW_USE: &flashgate_common::scripts::Script = &flashgate_common::scripts::POW_USE;

/// What a buy brings to the challenge check.
#[derive(Debug, Clone, Copy)]
pub struct BuyChallenge<'a> {
    pub sale_id: &'a str,
    /// The verified user (the token's `sub`).
    pub user: &'a str,
    /// The client address, as the limits see it.
    pub ip: IpAddr,
    /// Empty when the buy carries none.
    pub idempotency_key: &'a str,
    /// The `Flashgate-Pow` header, if sent.
    pub solution: Option<&'a [u8]>,
}

/// The challenge check of one gateway; off unless configured with a secret.
pub struct ChallengeGate {
    active: Option<Active>,
    metrics: Arc<Metrics>,
}

struct Active {
    signer: Signer,
    config: ChallengeConfig,
    /// Adaptive mode only.
    rates: Option<Rates>,
}

impl ChallengeGate {
    /// No challenge: every buy passes, nothing is counted.
    pub fn off(metrics: Arc<Metrics>) -> Self {
        Self {
            active: None,
            metrics,
        }
    }

    /// The gate `config` describes, signing with `secret`; off when the
    /// mode is off. `max_keys` bounds each adaptive rate cache.
    pub fn new(
        config: &ChallengeConfig,
        secret: &str,
        max_keys: u64,
        metrics: Arc<Metrics>,
    ) -> Self {
        let rates = match config.mode {
            ChallengeMode::Off => return Self::off(metrics),
            ChallengeMode::Always => None,
            ChallengeMode::Adaptive => Some(Rates::new(config, max_keys)),
        };
        Self {
            active: Some(Active {
                signer: Signer::new(secret.as_bytes()),
                config: config.clone(),
                rates,
            }),
            metrics,
        }
    }

    pub fn is_on(&self) -> bool {
        self.active.is_some()
    }

    /// A fresh challenge for `user` in `sale`, at the difficulty their
    /// rates ask now (this request counted); `None` when challenges are off.
    pub fn offer(&self, sale_id: &str, user: &str, ip: IpAddr, now_ms: i64) -> Option<Issued> {
        let active = self.active.as_ref()?;
        Some(self.issue(active, sale_id, user, ip, now_ms, false))
    }

    /// A challenge, counted in the rates: a fetch (`buy == false`) for its
    /// user only, a refused buy for its user, IP and sale.
    fn issue(
        &self,
        active: &Active,
        sale_id: &str,
        user: &str,
        ip: IpAddr,
        now_ms: i64,
        buy: bool,
    ) -> Issued {
        let bits = match &active.rates {
            Some(rates) => rates.hit(user, ip, sale_id, Instant::now(), buy),
            None => active.config.difficulty_bits,
        };
        let expires_at_ms = now_ms.saturating_add(active.config.ttl.as_millis() as i64);
        let issued = active.signer.issue(
            user,
            sale_id,
            bits,
            expires_at_ms,
            rand::random::<[u8; ID_BYTES]>(),
        );
        self.metrics.challenges_issued.inc();
        self.metrics.challenge_difficulty.observe(f64::from(bits));
        issued
    }

    /// Admits a buy with a valid, unused solution (or any buy when off).
    ///
    /// # Errors
    /// `428 challenge_required` with a fresh challenge when the solution is
    /// missing, forged, for another user or sale, expired, too easy or
    /// used; `400 bad_request` when the header is malformed; `503
    /// unavailable` when Redis cannot record the solution.
    pub async fn admit(
        &self,
        redis: &RedisClient,
        buy: BuyChallenge<'_>,
        now_ms: i64,
    ) -> Result<(), Rejection> {
        let Some(active) = &self.active else {
            return Ok(());
        };
        let refusal = match buy.solution {
            None => Refusal::Missing,
            Some(header) => match active.signer.verify(
                header,
                buy.user,
                buy.sale_id,
                now_ms,
                active.config.difficulty_bits,
            ) {
                Ok(solved) => match self.record_use(redis, &buy, &solved, now_ms).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => Refusal::Replayed,
                    Err(e) => return Err(unavailable(&self.metrics, &e)),
                },
                Err(refusal) => refusal,
            },
        };
        self.metrics
            .challenges_rejected
            .with_label_values(&[refusal.as_str()])
            .inc();
        if refusal == Refusal::Malformed {
            return Err(Rejection::BadRequest(refusal.message()));
        }
        let offer = self.issue(active, buy.sale_id, buy.user, buy.ip, now_ms, true);
        Err(Rejection::ChallengeRequired(Box::new(offer), refusal))
    }

    /// Records `solved` as used by this buy (`lua/pow_use.lua`): `Ok(true)`
    /// when it was not used before, or is re-sent by this same buy (same
    /// non-empty Idempotency-Key) at most [`MAX_RESENDS`] times;
    /// `Ok(false)` otherwise.
    async fn record_use(
        &self,
        redis: &RedisClient,
        buy: &BuyChallenge<'_>,
        solved: &Solved,
        now_ms: i64,
    ) -> Result<bool, RedisError> {
        let key = SaleKeys::new(buy.sale_id).pow(&solved.id);
        let marker = format!("k:{}", buy.idempotency_key);
        let ttl_ms = (solved.expires_at_ms - now_ms).max(0) + USED_MARGIN_MS;
        let mut invocation = POW_USE.prepare_invoke();
        invocation
            .key(&key)
            .arg(&marker)
            .arg(ttl_ms)
            .arg(MAX_RESENDS);
        let used: i64 = redis
            .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        if used == 1 {
            self.metrics.challenges_solved.inc();
        }
        Ok(used > 0)
    }
}
