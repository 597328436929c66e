//! The reservation record and the order API between gateway and backend.
//!
//! A reservation is what the deduct script appends to a sale's stream when a
//! buyer wins. It is the durable promise of an order: the backend turns each
//! record into exactly one order row (unique on `reservation_id`), whether it
//! arrives through the gateway's forward or through the stream.
//!
//! The record (`fg_deduct` in `lua/lib/deduct.lua`, one per win, batched
//! or not: `XADD fg:{sale:ID}:stream * ...`; field names in [`fields`]):
//!
//! | field | meaning |
//! |---|---|
//! | `rid` | reservation id `<sale_id>.<32 hex>` (random 128 bits; the sale id lets any process find the sale's keys) |
//! | `sale` | sale id (the real one, also for a bucket's stream) |
//! | `user` | user id (the JWT's `sub`; `[A-Za-z0-9._@-]{1,128}`) |
//! | `idem` | Idempotency-Key, empty if none |
//! | `ts` | Redis server time of the reservation, ms; the script also returns it with the win, so the forward carries the same value and the order's `reserved_at_ms` (where the payment timeout runs from) does not depend on which path wrote it |
//!
//! The same record travels as JSON in `POST /internal/orders/batch`, one
//! element per winner with the gateway's request id ([`ForwardedWinner`]).

use serde::{Deserialize, Serialize};

/// Stream field names of a reservation record, as written by `lua/deduct_batch.lua`.
pub mod fields {
    pub const RESERVATION_ID: &str = "rid";
    pub const SALE_ID: &str = "sale";
    pub const USER_ID: &str = "user";
    pub const IDEMPOTENCY_KEY: &str = "idem";
    pub const RESERVED_AT_MS: &str = "ts";
}

/// One winner's reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub reservation_id: String,
    pub sale_id: String,
    pub user_id: String,
    /// Empty when the buyer sent no `Idempotency-Key`.
    #[serde(default)]
    pub idempotency_key: String,
    pub reserved_at_ms: i64,
}

impl Reservation {
    /// Builds a record from a stream entry's field/value pairs.
    /// Returns the name of the first missing or malformed field on failure.
    pub fn from_fields<'a>(
        mut get: impl FnMut(&str) -> Option<&'a str>,
    ) -> Result<Self, &'static str> {
        let mut field = |name: &'static str| get(name).ok_or(name);
        let reservation_id = field(fields::RESERVATION_ID)?.to_owned();
        let sale_id = field(fields::SALE_ID)?.to_owned();
        let user_id = field(fields::USER_ID)?.to_owned();
        let idempotency_key = field(fields::IDEMPOTENCY_KEY).unwrap_or("").to_owned();
        let reserved_at_ms = field(fields::RESERVED_AT_MS)?
            .parse()
            .map_err(|_| fields::RESERVED_AT_MS)?;
        Ok(Self {
            reservation_id,
            sale_id,
            user_id,
            idempotency_key,
            reserved_at_ms,
        })
    }
}

/// A winner as the gateway forwards it: the reservation, and the request id
/// of the buy that won it (so both sides' logs can be joined).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardedWinner {
    #[serde(flatten)]
    pub reservation: Reservation,
    #[serde(default)]
    pub request_id: String,
}

/// Builds a reservation id `<sale_id>.<32 hex digits>` from 128 random bits.
/// The sale id inside lets `GET /flashgate/api/reservations/{id}` find the sale's keys.
pub fn reservation_id(sale_id: &str, random: u128) -> String {
    let mut id = String::with_capacity(sale_id.len() + 33);
    id.push_str(sale_id);
    id.push('.');
    push_hex(&mut id, random, 32);
    id
}

/// Appends the low `digits` hex digits of `value` (lower case, zero-padded):
/// `format!("{value:032x}")` without the formatting machinery, for the ids
/// and nonces every buy makes.
pub fn push_hex(out: &mut String, value: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..digits.min(32)).rev() {
        out.push(char::from(HEX[((value >> (4 * shift)) & 0xf) as usize]));
    }
}

/// The sale id inside a reservation id, if the id is well-formed.
pub fn sale_of_reservation(reservation_id: &str) -> Option<&str> {
    let (sale, random) = reservation_id.rsplit_once('.')?;
    let well_formed = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
    (well_formed && crate::sale::valid_sale_id(sale)).then_some(sale)
}

/// Order lifecycle as the buyer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationStatus {
    /// Reserved in Redis, no order row yet.
    Queued,
    /// The order row exists.
    Confirmed,
    /// The order was cancelled (for example, unpaid in time).
    Cancelled,
}

/// The backend's answer for one reservation's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderView {
    pub order_id: String,
    pub reservation_id: String,
    pub sale_id: String,
    pub user_id: String,
    pub status: ReservationStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_id_round_trips_to_its_sale() {
        let rid = reservation_id("summer-drop_1", 0xabc);
        assert_eq!(sale_of_reservation(&rid), Some("summer-drop_1"));
    }

    #[test]
    fn hex_digits_are_those_format_writes() {
        for value in [
            0,
            0xabc,
            u128::from(u64::MAX),
            u128::MAX,
            0x0123_4567_89ab_cdef << 64,
        ] {
            assert_eq!(reservation_id("s", value), format!("s.{value:032x}"));
            let mut nonce = String::new();
            push_hex(&mut nonce, value & u128::from(u64::MAX), 16);
            assert_eq!(nonce, format!("{:016x}", value & u128::from(u64::MAX)));
        }
    }

    #[test]
    fn malformed_reservation_ids_have_no_sale() {
        for rid in [
            "",
            "nodot",
            "s.123",
            "s.zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
            ".00000000000000000000000000000000",
            "a b.00000000000000000000000000000000",
        ] {
            assert_eq!(sale_of_reservation(rid), None, "{rid}");
        }
    }

    #[test]
    fn record_parses_from_stream_fields_and_names_missing_ones() {
        let pairs = [
            ("rid", "s.1"),
            ("sale", "s"),
            ("user", "u"),
            ("idem", ""),
            ("ts", "5"),
        ];
        let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let r = Reservation::from_fields(get).unwrap();
        assert_eq!(r.reserved_at_ms, 5);
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k && k != "user")
                .map(|(_, v)| *v)
        };
        assert_eq!(Reservation::from_fields(get), Err("user"));
    }
}
