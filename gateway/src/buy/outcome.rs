//! What a buy comes to, as values: the admitted request, and the
//! [`BuyOutcome`] that `reply` turns into the HTTP answer.

use flashgate_common::reservation::OrderView;

use crate::rejection::Rejection;

/// Longest Idempotency-Key accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 64;

/// A buy that passed admission: who buys, with which key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The verified user id of the bearer token.
    pub user: String,
    /// Empty when the buyer sent none.
    pub idempotency_key: String,
}

/// One buy attempt's inputs, once admitted and its body read.
#[derive(Debug, Clone, Copy)]
pub struct BuyRequest<'a> {
    pub sale_id: &'a str,
    pub user: &'a str,
    /// Empty when the buyer sent none.
    pub idempotency_key: &'a str,
    /// Sent on with a winner, for log correlation.
    pub request_id: &'a str,
}

/// What a buy came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuyOutcome {
    /// Won just now: the reservation is in the sale's stream and queued
    /// for the backend (`202 queued`), with the sale's checkout URL filled
    /// in for the winner when it has one (`checkout`).
    Won {
        reservation_id: String,
        checkout_url: Option<String>,
    },
    /// A won Idempotency-Key retried: its order once written (`201
    /// confirmed` or `410 order_cancelled`), else `202 queued` again; the
    /// checkout URL too unless the order was cancelled.
    Replayed {
        reservation_id: String,
        order: Option<OrderView>,
        checkout_url: Option<String>,
    },
    /// Turned down, here or by the script (a remembered refusal included).
    Refused(Rejection),
}

/// Validates the optional `Idempotency-Key`: 1 to 64 printable ASCII
/// characters. Absent means "" (no idempotency).
///
/// # Errors
/// `BadRequest` for anything else.
pub fn idempotency_key(value: Option<&[u8]>) -> Result<&str, Rejection> {
    let Some(v) = value else { return Ok("") };
    let ok = (1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&v.len())
        && v.iter().all(|b| (0x20..0x7f).contains(b));
    if !ok {
        return Err(Rejection::BadRequest(
            "Idempotency-Key must be 1 to 64 printable ASCII characters",
        ));
    }
    // Checked ASCII above.
    std::str::from_utf8(v).map_err(|_| Rejection::BadRequest("Idempotency-Key must be ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_must_be_short_printable_ascii() {
        assert_eq!(idempotency_key(None), Ok(""));
        assert_eq!(idempotency_key(Some(b"retry-1")), Ok("retry-1"));
        assert!(idempotency_key(Some(b"")).is_err());
        assert!(idempotency_key(Some(&[b'a'; 65])).is_err());
        assert!(idempotency_key(Some("clé".as_bytes())).is_err());
        assert!(idempotency_key(Some(b"a\x01b")).is_err());
    }
}
