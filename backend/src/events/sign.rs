//! The webhook signature: `Flashgate-Signature: v1=<hex>`, where `<hex>` is
//! HMAC-SHA256 keyed with `FLASHGATE_WEBHOOK_SECRET` over the
//! `Flashgate-Timestamp` value (unix seconds), a `.`, and the body's bytes.
//! Signing the timestamp with the body lets the shop reject an old request
//! replayed as is (see docs/EVENTS.md).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Flashgate-Signature";
/// The header carrying the signing time, unix seconds.
pub const TIMESTAMP_HEADER: &str = "Flashgate-Timestamp";
/// The header carrying the event id (also the body's `id`).
pub const EVENT_ID_HEADER: &str = "Flashgate-Event-Id";
/// The header carrying the event type (also the body's `type`).
pub const EVENT_TYPE_HEADER: &str = "Flashgate-Event-Type";

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `Flashgate-Signature` value of `body` sent at `timestamp`.
pub fn signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!(
        "v1={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
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

/// Checks a request as a shop should: the timestamp within `tolerance_s`
/// of `now_s`, and one of the `v1=` signatures in `header` (comma
/// separated, so a secret can be rotated) matching, compared in constant
/// time. Deduplicating by event id is the shop's other half.
///
/// # Errors
/// [`VerifyError`].
pub fn verify(
    secret: &[u8],
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
        .split(',')
        .filter_map(|part| part.trim().strip_prefix("v1="))
        .filter_map(|h| hex::decode(h).ok())
        .any(|expected| mac(secret, ts, body).verify_slice(&expected).is_ok());
    if matches {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_signature_verifies_and_a_tampered_body_or_old_timestamp_does_not() {
        let body = br#"{"id":"ev-1","type":"order.paid"}"#;
        let sig = signature(SECRET, 1_700_000_000, body);
        assert!(sig.starts_with("v1=") && sig.len() == 3 + 64, "{sig}");
        assert_eq!(
            verify(SECRET, "1700000000", &sig, body, 1_700_000_100, 300),
            Ok(())
        );
        assert_eq!(
            verify(
                SECRET,
                "1700000000",
                &sig,
                br#"{"id":"ev-1","type":"order.cancelled"}"#,
                1_700_000_100,
                300
            ),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(SECRET, "1700000001", &sig, body, 1_700_000_100, 300),
            Err(VerifyError::Mismatch),
            "the timestamp is signed"
        );
        assert_eq!(
            verify(SECRET, "1700000000", &sig, body, 1_700_000_400, 300),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            verify(
                b"another secret of thirty-two bytes!",
                "1700000000",
                &sig,
                body,
                1_700_000_100,
                300
            ),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(SECRET, "soon", &sig, body, 1_700_000_100, 300),
            Err(VerifyError::BadTimestamp)
        );
        assert_eq!(
            verify(
                SECRET,
                "1700000000",
                &format!("v1=00, {sig}"),
                body,
                1_700_000_100,
                300
            ),
            Ok(()),
            "rotation: any v1 matches"
        );
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // RFC 4231 test case 2 key and data, split as "<ts>.<body>".
        let sig = signature(b"Jefe", 42, b"what do ya want for nothing?");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"42.what do ya want for nothing?");
        assert_eq!(
            sig,
            format!("v1={}", hex::encode(mac.finalize().into_bytes()))
        );
    }
}
