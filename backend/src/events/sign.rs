//! The webhook signature, as Standard Webhooks specifies
//! (<https://www.standardwebhooks.com/>), so a shop verifies events with
//! that spec's maintained libraries: `webhook-signature: v1,<base64>`, where
//! `<base64>` is HMAC-SHA256, keyed with the key of
//! `FLASHGATE_WEBHOOK_SECRET` (`whsec_<base64 key>`), over
//! `{webhook-id}.{webhook-timestamp}.{body}`. Signing the id and the time
//! with the body lets the shop reject an old request replayed as is, and
//! deduplicate by id (see docs/EVENTS.md).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the event's id (also the body's `id`): the same on
/// every attempt, the shop's deduplication key.
pub const ID_HEADER: &str = "webhook-id";
/// The header carrying the signing time, unix seconds.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header carrying the signature(s), space separated.
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// Also sent, beside the Standard Webhooks headers: the event id.
pub const EVENT_ID_HEADER: &str = "Flashgate-Event-Id";
/// Also sent: the event type (also the body's `type`).
pub const EVENT_TYPE_HEADER: &str = "Flashgate-Event-Type";

fn mac(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `webhook-signature` value of event `id` with `body`, sent at
/// `timestamp`: `v1,` and the base64 of the HMAC.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    format!(
        "v1,{}",
        STANDARD.encode(mac(key, id, timestamp, body).finalize().into_bytes())
    )
}

/// Why a request does not carry a valid signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the timestamp is not a number")]
    BadTimestamp,
    #[error("the timestamp is further than the tolerance from now")]
    Stale,
    #[error("no v1 signature matches")]
    Mismatch,
}

/// Checks a request as the spec's libraries do: the timestamp within
/// `tolerance_s` of `now_s`, and one of the space-separated `v1,`
/// signatures in `header` (several while a secret is rotated) matching,
/// compared in constant time. Used by the tests; shops use the libraries.
///
/// # Errors
/// [`VerifyError`].
pub fn verify(
    key: &[u8],
    id: &str,
    timestamp: &str,
    header: &str,
    body: &[u8],
    now_s: i64,
    tolerance_s: i64,
) -> Result<(), VerifyError> {
    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp)?;
    if now_s.abs_diff(ts) > tolerance_s.unsigned_abs() {
        return Err(VerifyError::Stale);
    }
    let matches = header
        .split(' ')
        .filter_map(|part| part.strip_prefix("v1,"))
        .filter_map(|s| STANDARD.decode(s).ok())
        .any(|expected| mac(key, id, ts, body).verify_slice(&expected).is_ok());
    if matches {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_signature_verifies_and_a_tampered_body_id_or_old_timestamp_does_not() {
        let body = br#"{"id":"ev-1","type":"order.paid"}"#;
        let sig = signature(KEY, "ev-1", 1_700_000_000, body);
        assert!(sig.starts_with("v1,") && sig.len() == 3 + 44, "{sig}");
        let check = |id: &str, ts: &str, header: &str, body: &[u8], now: i64| {
            verify(KEY, id, ts, header, body, now, 300)
        };
        assert_eq!(
            check("ev-1", "1700000000", &sig, body, 1_700_000_100),
            Ok(())
        );
        assert_eq!(
            check("ev-1", "1700000000", &sig, b"{}", 1_700_000_100),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            check("ev-2", "1700000000", &sig, body, 1_700_000_100),
            Err(VerifyError::Mismatch),
            "the id is signed"
        );
        assert_eq!(
            check("ev-1", "1700000001", &sig, body, 1_700_000_100),
            Err(VerifyError::Mismatch),
            "the timestamp is signed"
        );
        assert_eq!(
            check("ev-1", "1700000000", &sig, body, 1_700_000_400),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            check("ev-1", "soon", &sig, body, 1_700_000_100),
            Err(VerifyError::BadTimestamp)
        );
        assert_eq!(
            check(
                "ev-1",
                "1700000000",
                &format!("v1,AAAA {sig}"),
                body,
                1_700_000_100
            ),
            Ok(()),
            "rotation: any v1 matches"
        );
    }

    #[test]
    fn the_signature_matches_the_specs_published_example() {
        // The example of the Standard Webhooks spec (and of its libraries'
        // tests): secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`.
        let key = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
