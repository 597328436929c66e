//! The checkout hand-off (docs/CHECKOUT.md): a sale's `checkout_url` is a
//! template the gateway fills in for each winner, and `{handoff}` a short
//! JWT (HS256) naming the winner, which the shop verifies offline with the
//! key it shares with the gateways (`FLASHGATE_HANDOFF_SECRET`).
//!
//! Shared by the backend and the config (which validate templates) and
//! the gateway (which expands them and mints the token), so that a
//! template both accept is one the gateway can fill in.

use serde::{Deserialize, Serialize};

/// The placeholders a template may hold, each as `{name}`.
pub const PLACEHOLDERS: [&str; 4] = ["sale_id", "reservation_id", "order_id", "handoff"];

/// The `aud` of every hand-off token: a shop checking it knows the token
/// was minted for checkout, not for anything else signed with the key.
pub const HANDOFF_AUDIENCE: &str = "flashgate-checkout";

/// Longest template accepted: URLs beyond 2000 characters break in
/// browsers and proxies, and the token adds about 300.
pub const MAX_TEMPLATE_LEN: usize = 1500;

/// What the hand-off token says (its JWT claims).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffClaims {
    /// The winner: the user id of their buyer token.
    pub sub: String,
    /// The sale id.
    pub sale: String,
    /// The reservation id the buy answered.
    pub rid: String,
    /// Unix seconds after which the shop refuses the token.
    pub exp: i64,
    /// Unix seconds when it was minted.
    pub iat: i64,
    /// Always [`HANDOFF_AUDIENCE`].
    pub aud: String,
}

/// One piece of a template.
enum Piece<'a> {
    Text(&'a str),
    Placeholder(&'a str),
}

/// Splits `template` into text and `{placeholder}`s.
fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err("checkout_url: a `}` without its `{`".into());
        }
        out.push(Piece::Text(&rest[..open]));
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| "checkout_url: a `{` without its `}`".to_owned())?;
        let name = &after[..close];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!(
                "checkout_url: unknown placeholder `{{{name}}}` (known: {{sale_id}}, {{reservation_id}}, {{order_id}}, {{handoff}})"
            ));
        }
        out.push(Piece::Placeholder(name));
        rest = &after[close + 1..];
    }
    out.push(Piece::Text(rest));
    Ok(out)
}

/// Checks a sale's `checkout_url`: an `https://` (or `http://`) URL of at
/// most [`MAX_TEMPLATE_LEN`] characters, no whitespace, and only known
/// placeholders.
///
/// # Errors
/// What is wrong, starting with `checkout_url:`.
pub fn validate(template: &str) -> Result<(), String> {
    let scheme_ok = ["https://", "http://"].iter().any(|s| {
        template
            .strip_prefix(s)
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with(['/', '{']))
    });
    if !scheme_ok {
        return Err("checkout_url: must be an https:// or http:// URL with a host".into());
    }
    if template.len() > MAX_TEMPLATE_LEN {
        return Err(format!(
            "checkout_url: must be at most {MAX_TEMPLATE_LEN} characters"
        ));
    }
    if template
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("checkout_url: must not contain whitespace".into());
    }
    pieces(template).map(|_| ())
}

/// Whether the template asks for the hand-off token.
pub fn needs_handoff(template: &str) -> bool {
    template.contains("{handoff}")
}

/// The values a template is filled in with.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    pub sale_id: &'a str,
    pub reservation_id: &'a str,
    /// Empty while the order is not written yet (a `202 queued` answer).
    pub order_id: &'a str,
    /// Empty when the template does not ask for it.
    pub handoff: &'a str,
}

/// `template` with each placeholder replaced by its value, percent-encoded
/// where it is not a URL's unreserved character (ids and JWTs never need
/// it; a value cannot change the URL's shape either way).
///
/// # Errors
/// The template does not [`validate`].
pub fn expand(template: &str, values: &Values<'_>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + values.handoff.len());
    for piece in pieces(template)? {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Placeholder(name) => {
                let value = match name {
                    "sale_id" => values.sale_id,
                    "reservation_id" => values.reservation_id,
                    "order_id" => values.order_id,
                    _ => values.handoff,
                };
                for b in value.bytes() {
                    if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                        out.push(char::from(b));
                    } else {
                        out.push_str(&format!("%{b:02X}"));
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_only_known_placeholders_in_a_web_url() {
        assert_eq!(
            validate("https://shop.example/checkout?r={reservation_id}&t={handoff}"),
            Ok(())
        );
        assert_eq!(validate("http://127.0.0.1:8000/pay/{order_id}"), Ok(()));
        for (bad, says) in [
            ("ftp://shop/{handoff}", "https:// or http://"),
            ("https://", "https:// or http://"),
            ("https://shop/{user}", "unknown placeholder `{user}`"),
            ("https://shop/{handoff", "without its `}`"),
            ("https://shop/handoff}", "without its `{`"),
            ("https://shop/a b", "whitespace"),
        ] {
            let err = validate(bad).unwrap_err();
            assert!(
                err.starts_with("checkout_url: ") && err.contains(says),
                "{bad}: {err}"
            );
        }
        let long = format!("https://shop/{}", "a".repeat(MAX_TEMPLATE_LEN));
        assert!(validate(&long).unwrap_err().contains("at most"));
    }

    #[test]
    fn every_placeholder_is_filled_in_and_encoded() {
        let values = Values {
            sale_id: "drop-1",
            reservation_id: "drop-1.00ab",
            order_id: "",
            handoff: "a.b c",
        };
        assert_eq!(
            expand(
                "https://shop/c/{sale_id}?r={reservation_id}&o={order_id}&t={handoff}",
                &values
            )
            .unwrap(),
            "https://shop/c/drop-1?r=drop-1.00ab&o=&t=a.b%20c"
        );
        assert!(needs_handoff("https://shop/?t={handoff}"));
        assert!(!needs_handoff("https://shop/?r={reservation_id}"));
    }
}
