//! Every way a request to a gateway route can be turned down, as a value:
//! a code, a metric label and a message. The HTTP status and headers of
//! each are decided in `reply`, the only place that knows HTTP.

use crate::admission::token::{Issued, Refusal};
use crate::admission::AuthError;
use crate::infra::Metrics;
use crate::infra::RedisError;

/// Every way a request to a gateway route can be turned down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    BadRequest(&'static str),
    /// No token, or a refused one: the 401 says which (`reply`).
    Unauthorized(AuthError),
    NotFound(&'static str),
    MethodNotAllowed(&'static str),
    PayloadTooLarge,
    /// The request's headers add up to more than the gateway accepts.
    HeadersTooLarge,
    LimitReached,
    SoldOut,
    Ended,
    /// Carries the seconds until the sale starts.
    NotStarted(u64),
    Paused,
    /// Redis unreachable or too slow.
    Unavailable,
    /// A win not yet held by `redis.wait_replicas` replicas: answered like
    /// [`Rejection::Unavailable`]; the reservation stays, and a retry with
    /// the same Idempotency-Key answers it once the replicas caught up.
    NotReplicated,
    /// A token bucket is empty.
    RateLimited(crate::admission::Limited),
    /// The user or IP is on a deny list.
    Denied,
    /// A buy signed in by cookie without proof that the shop's own pages
    /// sent it (`admission::csrf`).
    CsrfRejected,
    /// The buy carries no valid proof-of-work solution: a fresh challenge,
    /// and why the sent one (if any) was refused.
    ChallengeRequired(Box<Issued>, Refusal),
}

impl Rejection {
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::BadRequest(_) => "bad_request",
            Rejection::Unauthorized(_) => "unauthorized",
            Rejection::NotFound(_) => "not_found",
            Rejection::MethodNotAllowed(_) => "method_not_allowed",
            Rejection::PayloadTooLarge => "payload_too_large",
            Rejection::HeadersTooLarge => "headers_too_large",
            Rejection::LimitReached => "limit_reached",
            Rejection::SoldOut => "sold_out",
            Rejection::Ended => "ended",
            Rejection::NotStarted(_) => "not_started",
            Rejection::Paused => "paused",
            Rejection::Unavailable | Rejection::NotReplicated => "unavailable",
            Rejection::RateLimited(_) => "rate_limited",
            Rejection::Denied => "denied",
            Rejection::CsrfRejected => "csrf_rejected",
            Rejection::ChallengeRequired(..) => "challenge_required",
        }
    }

    /// The metric label: the code, with the bucket's scope for rate limits.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::RateLimited(l) => match l.scope {
                crate::admission::Scope::User => "rate_limited_user",
                crate::admission::Scope::Ip => "rate_limited_ip",
                crate::admission::Scope::Global => "rate_limited_global",
                crate::admission::Scope::Cluster => "rate_limited_cluster",
            },
            Rejection::NotReplicated => "replica_wait_timeout",
            other => other.code(),
        }
    }

    /// The human-readable message of the error body.
    pub fn message(&self) -> &'static str {
        match self {
            Rejection::BadRequest(m) | Rejection::NotFound(m) => m,
            Rejection::Unauthorized(e) => e.message(),
            Rejection::MethodNotAllowed(_) => "method not allowed on this path",
            Rejection::PayloadTooLarge => "request body too large",
            Rejection::HeadersTooLarge => "request headers too large",
            Rejection::LimitReached => "you already bought the most this sale allows",
            Rejection::SoldOut => "sold out",
            Rejection::Ended => "the sale has ended",
            Rejection::NotStarted(_) => "the sale has not started yet",
            Rejection::Paused => "the sale is paused, try again shortly",
            Rejection::Unavailable => "temporarily unavailable, try again shortly",
            Rejection::NotReplicated => {
                "not confirmed yet, retry shortly with the same Idempotency-Key"
            }
            Rejection::RateLimited(_) => "too many requests, slow down",
            Rejection::Denied => "access denied",
            Rejection::CsrfRejected => {
                "a buy signed in by cookie must come from the shop's own pages (same-origin Origin or Sec-Fetch-Site, or X-Flashgate-CSRF: 1)"
            }
            Rejection::ChallengeRequired(_, why) => why.message(),
        }
    }
}

/// Counts a failed Redis call and turns it into [`Rejection::Unavailable`].
/// Not logged per request (an outage would flood the log); the breaker
/// logs when it opens and closes.
pub fn unavailable(metrics: &Metrics, error: &RedisError) -> Rejection {
    let kind = match error {
        RedisError::Redis(_) => "error",
        RedisError::Timeout(_) => "timeout",
        RedisError::CircuitOpen => "circuit_open",
        RedisError::QueueFull => "queue_full",
    };
    metrics.redis_errors.with_label_values(&[kind]).inc();
    tracing::debug!(%error, "redis unavailable");
    Rejection::Unavailable
}
