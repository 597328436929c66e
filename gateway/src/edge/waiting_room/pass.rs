//! The room's cookie, `fg_room_<name>`: a JWT (HS256, RFC 7519) signed
//! with `FLASHGATE_WAITING_ROOM_SECRET`, so any gateway verifies any
//! other's without asking Redis. It names the room, the visitor (a random
//! id) and where they stand: proving (a proof of work owed), waiting (the
//! place's score, which also puts the place back should Redis lose it), or
//! inside (until when).

use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::RngCore;
use serde::{Deserialize, Serialize};

/// How long a waiting visitor's cookie keeps their place, from when the
/// place was drawn (as long as the room remembers used places).
pub const WAITING_SECONDS: i64 = 86_400;

/// Where a visitor stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Owes a proof of work before a place is given.
    Proving,
    /// Holds the place of this score.
    Waiting { score: u64 },
    /// Let in, until this Unix ms.
    Inside { until_ms: i64 },
}

/// A verified cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    pub visitor: String,
    pub standing: Standing,
    /// Its `exp` (Unix seconds).
    pub expires_s: i64,
}

/// Why a cookie was refused; each a bounded metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not signed with this secret, or not a token at all.
    Forged,
    /// Past its `exp`.
    Expired,
    /// Signed, but for another room.
    OtherRoom,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Forged => "forged",
            Refused::Expired => "expired",
            Refused::OtherRoom => "other_room",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Claims {
    room: String,
    vid: String,
    /// `p` proving, `w` waiting, `i` inside.
    st: String,
    /// Waiting: the place's score. Inside: until when (Unix ms).
    #[serde(default)]
    n: i64,
    exp: i64,
}

/// Signs and verifies one room's cookies.
pub struct Passes {
    room: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl Passes {
    pub fn new(room: &str, secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp"]);
        Self {
            room: room.to_owned(),
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    /// A new visitor's id: 128 random bits, base64url.
    pub fn new_visitor() -> String {
        use base64::Engine;
        let mut id = [0u8; 16];
        rand::rng().fill_bytes(&mut id);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
    }

    /// The cookie's value for `visitor` standing so, valid until
    /// `expires_s` (Unix seconds).
    pub fn sign(&self, visitor: &str, standing: Standing, expires_s: i64) -> String {
        let (st, n) = match standing {
            Standing::Proving => ("p", 0),
            Standing::Waiting { score } => ("w", i64::try_from(score).unwrap_or(i64::MAX)),
            Standing::Inside { until_ms } => ("i", until_ms),
        };
        let exp = expires_s;
        let claims = Claims {
            room: self.room.clone(),
            vid: visitor.to_owned(),
            st: st.to_owned(),
            n,
            exp,
        };
        // HS256 over plain claims cannot fail.
        encode(&Header::new(Algorithm::HS256), &claims, &self.encoding).unwrap_or_default()
    }

    /// The cookie `value` verified: signature, expiry, room.
    ///
    /// # Errors
    /// Why it was refused.
    pub fn verify(&self, value: &str) -> Result<Pass, Refused> {
        use jsonwebtoken::errors::ErrorKind;
        let claims = decode::<Claims>(value, &self.decoding, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => Refused::Expired,
                _ => Refused::Forged,
            })?
            .claims;
        if claims.room != self.room {
            return Err(Refused::OtherRoom);
        }
        let standing = match claims.st.as_str() {
            "p" => Standing::Proving,
            "w" => Standing::Waiting {
                score: u64::try_from(claims.n).map_err(|_| Refused::Forged)?,
            },
            "i" => Standing::Inside { until_ms: claims.n },
            _ => return Err(Refused::Forged),
        };
        Ok(Pass {
            visitor: claims.vid,
            standing,
            expires_s: claims.exp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a-waiting-room-secret-of-32-bytes!!";

    fn inside(until_ms: i64) -> Standing {
        Standing::Inside { until_ms }
    }

    #[test]
    fn a_signed_cookie_verifies_with_its_standing() {
        let passes = Passes::new("checkout", SECRET);
        let now = flashgate_common::now_ms();
        let exp = now / 1000 + 60;
        for standing in [
            Standing::Proving,
            Standing::Waiting { score: 1 << 41 },
            inside(now + 60_000),
        ] {
            let cookie = passes.sign("v1", standing, exp);
            let expected = Pass {
                visitor: "v1".into(),
                standing,
                expires_s: exp,
            };
            assert_eq!(passes.verify(&cookie), Ok(expected));
        }
    }

    #[test]
    fn a_forged_expired_or_other_rooms_cookie_is_refused_by_its_reason() {
        let passes = Passes::new("checkout", SECRET);
        let now = flashgate_common::now_ms();
        let later = now / 1000 + 60;
        let other_secret = Passes::new("checkout", b"another-secret-another-secret-32b");
        let forged = other_secret.sign("v1", inside(now + 60_000), later);
        assert_eq!(passes.verify(&forged), Err(Refused::Forged));
        assert_eq!(passes.verify("not a token"), Err(Refused::Forged));
        let expired = passes.sign("v1", inside(now - 5_000), now / 1000 - 5);
        assert_eq!(passes.verify(&expired), Err(Refused::Expired));
        let other_room = Passes::new("basket", SECRET).sign("v1", inside(now + 60_000), later);
        assert_eq!(passes.verify(&other_room), Err(Refused::OtherRoom));
    }
}
