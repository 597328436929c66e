//! What the gateway answers: a status, headers and a body, written to the
//! client in one place (the proxy adapter). Every error is JSON
//! `{"code": "...", "message": "..."}`; the status of each code is decided
//! here, once.

use bytes::Bytes;
use http::header::{HeaderName, ALLOW, CACHE_CONTROL, RETRY_AFTER, WWW_AUTHENTICATE};
use serde::Serialize;

use flashgate_common::secret::{BEARER_CHALLENGE, BEARER_INVALID_TOKEN};

use crate::admission::token::Issued;
use crate::admission::AuthError;
use crate::buy::BuyOutcome;
pub use crate::rejection::Rejection;

/// A complete response, built by a handler and written by the proxy.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    /// Names prebuilt (`http::header` or the constants below), so that
    /// writing an answer parses none.
    pub headers: Vec<(HeaderName, String)>,
    pub body: Bytes,
}

/// The buckets' own headers (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// On an answer replayed for a known `Idempotency-Key`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

impl Reply {
    /// A JSON body with `status`.
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        // Serializing plain structs of strings and numbers cannot fail.
        let body = serde_json::to_vec(value).unwrap_or_default();
        Self {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub fn header(mut self, name: HeaderName, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

/// The HTTP status of each rejection, decided here once.
impl Rejection {
    pub fn status(&self) -> u16 {
        match self {
            Rejection::BadRequest(_) => 400,
            Rejection::Unauthorized(_) => 401,
            Rejection::NotStarted(_) | Rejection::Denied | Rejection::CsrfRejected => 403,
            Rejection::ChallengeRequired(..) => 428,
            Rejection::NotFound(_) => 404,
            Rejection::MethodNotAllowed(_) => 405,
            Rejection::LimitReached => 409,
            Rejection::SoldOut | Rejection::Ended => 410,
            Rejection::PayloadTooLarge => 413,
            Rejection::HeadersTooLarge => 431,
            Rejection::RateLimited(_) => 429,
            Rejection::Paused | Rejection::Unavailable | Rejection::NotReplicated => 503,
        }
    }
}

/// A won Idempotency-Key replayed once its order exists: `201 confirmed`
/// while the order holds its item (created or paid), `410 order_cancelled`
/// once it was cancelled (unpaid in time), with the ids either way; a
/// `201` carries the sale's `checkout_url` when it has one.
pub fn replayed_order(
    order: &flashgate_common::reservation::OrderView,
    checkout_url: Option<String>,
) -> Reply {
    use flashgate_common::reservation::ReservationStatus;
    let ids = (order.reservation_id.as_str(), order.order_id.as_str());
    match order.status {
        ReservationStatus::Cancelled => Reply::json(
            410,
            &serde_json::json!({
                "code": "order_cancelled",
                "message": "this purchase was cancelled: it was not paid in time",
                "status": order.status,
                "reservation_id": ids.0,
                "order_id": ids.1,
            }),
        ),
        ReservationStatus::Confirmed | ReservationStatus::Queued => {
            let mut body = serde_json::json!({"status": ReservationStatus::Confirmed, "reservation_id": ids.0, "order_id": ids.1});
            if let Some(url) = checkout_url {
                body["checkout_url"] = url.into();
            }
            Reply::json(201, &body)
        }
    }
}

/// A buy's answer: `202 queued` for a win; a replayed win answers its
/// order's state (or `202 queued` again) with `Idempotent-Replayed: true`;
/// a refusal is its rejection (a remembered one included, without the
/// replay header).
impl From<BuyOutcome> for Reply {
    fn from(outcome: BuyOutcome) -> Self {
        match outcome {
            BuyOutcome::Won {
                reservation_id,
                checkout_url,
            } => queued(&reservation_id, checkout_url),
            BuyOutcome::Replayed {
                reservation_id,
                order,
                checkout_url,
            } => {
                let reply = match order {
                    Some(order) => replayed_order(&order, checkout_url),
                    None => queued(&reservation_id, checkout_url),
                };
                reply.header(IDEMPOTENT_REPLAYED, "true")
            }
            BuyOutcome::Refused(rejection) => rejection.into(),
        }
    }
}

/// The body of `202 queued`, written straight from its fields (every win
/// answers it), in the order a `json!` map had them.
#[derive(Serialize)]
struct QueuedBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    checkout_url: Option<String>,
    reservation_id: &'a str,
    status: &'static str,
}

fn queued(reservation_id: &str, checkout_url: Option<String>) -> Reply {
    let body = QueuedBody {
        checkout_url,
        reservation_id,
        status: "queued",
    };
    Reply::json(202, &body)
}

/// A challenge as JSON: the 428's extra fields, and the whole answer of
/// `GET /flashgate/api/sales/{id}/challenge`.
pub fn challenge_fields(issued: &Issued) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    fields.insert("challenge".into(), issued.challenge.clone().into());
    fields.insert("difficulty_bits".into(), issued.difficulty_bits.into());
    fields.insert(
        "expires_at".into(),
        flashgate_common::rfc3339(issued.expires_at_ms).into(),
    );
    fields
}

impl From<Rejection> for Reply {
    fn from(r: Rejection) -> Self {
        if let Rejection::ChallengeRequired(issued, _) = &r {
            let mut body = challenge_fields(issued);
            body.insert("code".into(), r.code().into());
            body.insert("message".into(), r.message().into());
            return Reply::json(r.status(), &body).header(CACHE_CONTROL, "no-store");
        }
        let reply = Reply::json(
            r.status(),
            &ErrorBody {
                code: r.code(),
                message: r.message(),
            },
        );
        match r {
            Rejection::RateLimited(l) => reply
                .header(RETRY_AFTER, l.retry_after_header())
                .header(RATELIMIT_POLICY, l.policy_header())
                .header(RATELIMIT, l.state_header()),
            Rejection::NotStarted(secs) => reply.header(RETRY_AFTER, secs.max(1).to_string()),
            Rejection::Unavailable | Rejection::NotReplicated => reply.header(RETRY_AFTER, "1"),
            Rejection::Paused => reply.header(RETRY_AFTER, "5"),
            Rejection::MethodNotAllowed(allow) => reply.header(ALLOW, allow),
            // RFC 6750 §3: an error code only when a token was sent.
            Rejection::Unauthorized(AuthError::Missing) => {
                reply.header(WWW_AUTHENTICATE, BEARER_CHALLENGE)
            }
            Rejection::Unauthorized(AuthError::Expired | AuthError::Invalid) => {
                reply.header(WWW_AUTHENTICATE, BEARER_INVALID_TOKEN)
            }
            _ => reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_are_json_with_code_and_message() {
        let r = Reply::from(Rejection::SoldOut);
        assert_eq!(r.status, 410);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["code"], "sold_out");
        assert!(v["message"].is_string());
    }

    #[test]
    fn a_replayed_cancelled_order_answers_its_own_status_not_confirmed() {
        use flashgate_common::reservation::{OrderView, ReservationStatus};
        let mut order = OrderView {
            order_id: "o-1".into(),
            reservation_id: "s.1".into(),
            sale_id: "s".into(),
            user_id: "u".into(),
            status: ReservationStatus::Cancelled,
        };
        let r = replayed_order(&order, None);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            (r.status, v["code"].as_str(), v["status"].as_str()),
            (410, Some("order_cancelled"), Some("cancelled"))
        );
        assert_eq!(
            (v["order_id"].as_str(), v["message"].is_string()),
            (Some("o-1"), true)
        );
        order.status = ReservationStatus::Confirmed;
        let r = replayed_order(&order, Some("https://shop.test/pay/o-1".into()));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            (r.status, v["status"].as_str(), v["order_id"].as_str()),
            (201, Some("confirmed"), Some("o-1"))
        );
        assert_eq!(v["checkout_url"], "https://shop.test/pay/o-1");
        let won = Reply::from(BuyOutcome::Won {
            reservation_id: "s.1".into(),
            checkout_url: Some("https://shop.test/pay?r=s.1".into()),
        });
        let v: serde_json::Value = serde_json::from_slice(&won.body).unwrap();
        assert_eq!(
            (won.status, v["status"].as_str(), v["checkout_url"].as_str()),
            (202, Some("queued"), Some("https://shop.test/pay?r=s.1"))
        );
        let plain = Reply::from(BuyOutcome::Won {
            reservation_id: "s.1".into(),
            checkout_url: None,
        });
        let v: serde_json::Value = serde_json::from_slice(&plain.body).unwrap();
        assert!(v.get("checkout_url").is_none(), "no template, no field");
    }

    #[test]
    fn a_required_challenge_is_428_with_exactly_the_challenge_fields() {
        use crate::admission::token::Refusal;
        let issued = Issued {
            challenge: "c".repeat(72),
            difficulty_bits: 14,
            expires_at_ms: 1_800_000_000_000,
        };
        let r = Reply::from(Rejection::ChallengeRequired(
            Box::new(issued),
            Refusal::Replayed,
        ));
        assert_eq!(r.status, 428);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "challenge",
                "code",
                "difficulty_bits",
                "expires_at",
                "message"
            ]
        );
        assert_eq!(
            (v["code"].as_str(), v["difficulty_bits"].as_u64()),
            (Some("challenge_required"), Some(14))
        );
        assert_eq!(v["expires_at"], "2027-01-15T08:00:00.000Z");
        assert!(v["message"].as_str().unwrap().contains("already used"));
    }

    #[test]
    fn waiting_rejections_carry_retry_after() {
        let r = Reply::from(Rejection::NotStarted(42));
        assert_eq!(r.status, 403);
        assert!(r.headers.contains(&(RETRY_AFTER, "42".to_string())));
        let r = Reply::from(Rejection::Unavailable);
        assert!(r.headers.iter().any(|(n, _)| *n == RETRY_AFTER));
        let r = Reply::from(Rejection::NotReplicated);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            (r.status, v["code"].as_str()),
            (503, Some("unavailable")),
            "a win not on enough replicas answers like any 503"
        );
        assert!(r.headers.contains(&(RETRY_AFTER, "1".to_string())));
    }
}
