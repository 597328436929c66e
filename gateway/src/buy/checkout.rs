//! The checkout hand-off of a win (docs/CHECKOUT.md): the sale's
//! `checkout_url` template filled in for the winner, its `{handoff}` a JWT
//! (HS256, keyed with `FLASHGATE_HANDOFF_SECRET`) the shop verifies offline
//! with the same key: `sub` the user, `sale`, `rid` the reservation, `iat`,
//! `exp` (`gateway.handoff_ttl_seconds` later) and `aud`
//! ([`HANDOFF_AUDIENCE`]). The template's rules and the claims are shared
//! with the backend in `flashgate_common::checkout`.

use std::time::Duration;

use flashgate_common::checkout::{self, HandoffClaims, Values, HANDOFF_AUDIENCE};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// Mints the hand-offs of one gateway.
pub struct Checkout {
    /// `None` without `FLASHGATE_HANDOFF_SECRET`: a template asking for
    /// `{handoff}` then gives no checkout URL at all (a URL without the
    /// token would send the winner to a checkout that refuses them).
    key: Option<EncodingKey>,
    /// How long a token is good for.
    ttl: Duration,
}

/// What a win's checkout URL is made of: the template's values (its
/// `handoff` signed here, when the template asks for one) and the winner.
#[derive(Debug, Clone, Copy)]
pub struct Winner<'a> {
    pub values: Values<'a>,
    pub user: &'a str,
}

impl Checkout {
    pub fn new(secret: Option<&str>, ttl: Duration) -> Self {
        Self {
            key: secret.map(|s| EncodingKey::from_secret(s.as_bytes())),
            ttl,
        }
    }

    /// The checkout URL of `winner` at `now_ms`, from the sale's
    /// `template`; `None` when the template is unusable or asks for a
    /// token this gateway cannot sign (both logged).
    pub fn url(&self, template: &str, winner: Winner<'_>, now_ms: i64) -> Option<String> {
        let handoff = if checkout::needs_handoff(template) {
            let Some(key) = &self.key else {
                tracing::warn!(
                    sale = winner.values.sale_id,
                    "the sale's checkout_url asks for {{handoff}} but FLASHGATE_HANDOFF_SECRET is not set; answering without a checkout_url"
                );
                return None;
            };
            let iat = now_ms.div_euclid(1000);
            let claims = HandoffClaims {
                sub: winner.user.to_owned(),
                sale: winner.values.sale_id.to_owned(),
                rid: winner.values.reservation_id.to_owned(),
                iat,
                exp: iat.saturating_add(i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX)),
                aud: HANDOFF_AUDIENCE.to_owned(),
            };
            match jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, key) {
                Ok(token) => token,
                Err(error) => {
                    tracing::warn!(%error, sale = winner.values.sale_id, "cannot sign the checkout hand-off");
                    return None;
                }
            }
        } else {
            String::new()
        };
        let values = Values {
            handoff: &handoff,
            ..winner.values
        };
        match checkout::expand(template, &values) {
            Ok(url) => Some(url),
            Err(error) => {
                tracing::warn!(%error, sale = winner.values.sale_id, "the sale's checkout_url is not a valid template");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{DecodingKey, Validation};

    const SECRET: &str = "test-handoff-secret-of-32-bytes-at-least";

    fn winner() -> Winner<'static> {
        Winner {
            values: Values {
                sale_id: "drop",
                reservation_id: "drop.00ab",
                order_id: "",
                handoff: "",
            },
            user: "alice",
        }
    }

    #[test]
    fn the_handoff_names_the_winner_and_expires_after_the_ttl() {
        let checkout = Checkout::new(Some(SECRET), Duration::from_secs(600));
        let url = checkout
            .url(
                "https://shop.test/pay?r={reservation_id}&t={handoff}",
                winner(),
                1_800_000_000_500,
            )
            .unwrap();
        let token = url.split("&t=").nth(1).unwrap();
        assert!(url.starts_with("https://shop.test/pay?r=drop.00ab&t="));
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[HANDOFF_AUDIENCE]);
        validation.validate_exp = false;
        let claims = jsonwebtoken::decode::<HandoffClaims>(
            token,
            &DecodingKey::from_secret(SECRET.as_bytes()),
            &validation,
        )
        .unwrap()
        .claims;
        assert_eq!(
            claims,
            HandoffClaims {
                sub: "alice".into(),
                sale: "drop".into(),
                rid: "drop.00ab".into(),
                iat: 1_800_000_000,
                exp: 1_800_000_600,
                aud: HANDOFF_AUDIENCE.into(),
            }
        );
    }

    #[test]
    fn no_secret_means_no_url_for_a_template_that_needs_one() {
        let checkout = Checkout::new(None, Duration::from_secs(600));
        assert_eq!(
            checkout.url("https://shop.test/?t={handoff}", winner(), 0),
            None
        );
        assert_eq!(
            checkout.url("https://shop.test/{sale_id}/{reservation_id}", winner(), 0),
            Some("https://shop.test/drop/drop.00ab".into())
        );
    }
}
