//! The reservation record and the order API between gateway and backend.
//!
//! A reservation is what the deduct script appends to a sale's stream when a
//! buyer wins. It is the durable promise of an order: the backend turns each
//! record into exactly one order row (unique on `reservation_id`), whether it
//! arrives through the gateway's forward or through the stream.
//!
//! The record (`fg_take` in `lua/lib/decide.lua`, one per win, batched
//! or not): `XADD fg:{sale:ID}:stream * r "<rid> <sale> <user> <ts> <idem>"`, one
//! field ([`fields::RECORD`]) whose value is the reservation's parts
//! joined by single spaces, the Idempotency-Key last (it may hold spaces;
//! the other parts never do):
//!
//! | part | meaning |
//! |---|---|
//! | `rid` | reservation id `<sale_id>.<32 hex>` (random 128 bits; the sale id lets any process find the sale's keys) |
//! | `sale` | sale id (the real one, also for a bucket's stream) |
//! | `user` | user id (the JWT's `sub`; `[A-Za-z0-9._@-]{1,128}`) |
//! | `ts` | Redis server time of the reservation, ms; the script also returns it with the win, so the forward carries the same value and the order's `reserved_at_ms` (where the payment timeout runs from) does not depend on which path wrote it |
//! | `idem` | Idempotency-Key, empty if none |
//!
//! One field, not one per part: every win is written once and read back at
//! least once, and each field is two more strings for Redis to store and
//! send and for the backend to parse. Records of the earlier layout, one
//! field per part (`rid`, `sale`, `user`, `idem`, `ts`: [`fields`]), are
//! still read, so a stream written before an upgrade drains after it.
//!
//! The same record travels as JSON in `POST /internal/orders/batch`, one
//! element per winner with the gateway's request id ([`ForwardedWinner`]).

use serde::{Deserialize, Serialize};

/// Stream field names of a reservation record: [`fields::RECORD`] as
/// `lua/lib/decide.lua` writes it, the others those of the earlier layout.
pub mod fields {
    /// The one field of a record: its parts joined by spaces.
    pub const RECORD: &str = "r";
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
    /// Builds a record from a stream entry's field/value pairs, in either
    /// layout (see the module doc). Returns the name of the first missing
    /// or malformed field (or part) on failure.
    pub fn from_fields<'a>(
        mut get: impl FnMut(&str) -> Option<&'a str>,
    ) -> Result<Self, &'static str> {
        if let Some(record) = get(fields::RECORD) {
            return Self::from_record(record);
        }
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

    /// The value of this reservation's one-field record ([`fields::RECORD`]),
    /// as `lua/lib/decide.lua` writes it.
    pub fn record(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.reservation_id,
            self.sale_id,
            self.user_id,
            self.reserved_at_ms,
            self.idempotency_key
        )
    }

    /// Parses the one-field record `<rid> <sale> <user> <ts> <idem>`.
    fn from_record(record: &str) -> Result<Self, &'static str> {
        let mut parts = record.splitn(5, ' ');
        let mut part = |name: &'static str| parts.next().filter(|p| !p.is_empty()).ok_or(name);
        let reservation_id = part(fields::RESERVATION_ID)?;
        let sale_id = part(fields::SALE_ID)?;
        let user_id = part(fields::USER_ID)?;
        let reserved_at_ms = part(fields::RESERVED_AT_MS)?
            .parse()
            .map_err(|_| fields::RESERVED_AT_MS)?;
        let idempotency_key = parts.next().ok_or(fields::IDEMPOTENCY_KEY)?;
        Ok(Self {
            reservation_id: reservation_id.to_owned(),
            sale_id: sale_id.to_owned(),
            user_id: user_id.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
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
    fn a_one_field_record_parses_with_a_key_that_holds_spaces() {
        let rid = reservation_id("s-1", 7);
        let record = format!("{rid} s-1 u@x 5 key with spaces");
        let get = |k: &str| (k == "r").then_some(record.as_str());
        let r = Reservation::from_fields(get).unwrap();
        assert_eq!(
            r,
            Reservation {
                reservation_id: rid.clone(),
                sale_id: "s-1".into(),
                user_id: "u@x".into(),
                idempotency_key: "key with spaces".into(),
                reserved_at_ms: 5,
            }
        );
        let unkeyed = Reservation {
            idempotency_key: String::new(),
            ..r
        };
        let record = unkeyed.record();
        assert_eq!(record, format!("{rid} s-1 u@x 5 "));
        let get = |k: &str| (k == "r").then_some(record.as_str());
        assert_eq!(Reservation::from_fields(get), Ok(unkeyed));
    }

    #[test]
    fn a_malformed_one_field_record_names_its_bad_part() {
        let rid = reservation_id("s", 7);
        for (record, bad) in [
            (String::new(), "rid"),
            (rid.clone(), "sale"),
            (format!("{rid} s"), "user"),
            (format!("{rid} s  5 k"), "user"),
            (format!("{rid} s u"), "ts"),
            (format!("{rid} s u five k"), "ts"),
            (format!("{rid} s u 5"), "idem"),
        ] {
            let get = |k: &str| (k == "r").then_some(record.as_str());
            assert_eq!(Reservation::from_fields(get), Err(bad), "{record:?}");
        }
    }

    #[test]
    fn a_record_of_the_earlier_layout_parses_and_names_missing_fields() {
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
