//! Bearer tokens: the constant-time check every protected endpoint uses,
//! and the start-time check of the secrets themselves.

use subtle::ConstantTimeEq;

/// Shortest secret accepted at start: 32 bytes, the size of an HS256 key
/// (so a JWT secret cannot be guessed offline from one token), e.g. 32
/// random bytes hex-encoded to 64 characters.
pub const MIN_SECRET_BYTES: usize = 32;

/// A secret that cannot protect anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{name}: must be at least {MIN_SECRET_BYTES} bytes (it has {len}); generate one with `openssl rand -hex 32`")]
    TooShort { name: &'static str, len: usize },
}

/// The secret `value` of environment variable `name`, refused when it is
/// missing or shorter than [`MIN_SECRET_BYTES`].
///
/// # Errors
/// [`SecretError`], naming the variable (never the value).
pub fn required<'a>(name: &'static str, value: Option<&'a str>) -> Result<&'a str, SecretError> {
    match value {
        None | Some("") => Err(SecretError::Missing(name)),
        Some(v) if v.len() < MIN_SECRET_BYTES => Err(SecretError::TooShort { name, len: v.len() }),
        Some(v) => Ok(v),
    }
}

/// The `WWW-Authenticate` challenge of a 401 to a request that sent no
/// bearer token: the scheme and realm, and no error code (RFC 6750 §3).
pub const BEARER_CHALLENGE: &str = r#"Bearer realm="flashgate""#;

/// The `WWW-Authenticate` challenge of a 401 to a request whose bearer
/// token was refused (wrong, expired or malformed; RFC 6750 §3.1).
pub const BEARER_INVALID_TOKEN: &str = r#"Bearer realm="flashgate", error="invalid_token""#;

/// The challenge of a 401 to a request whose `Authorization` was `header`:
/// [`BEARER_INVALID_TOKEN`] when it carried a bearer token (the scheme in
/// any case), [`BEARER_CHALLENGE`] when it carried none or another scheme.
pub fn bearer_challenge(header: Option<&str>) -> &'static str {
    let sent = header
        .and_then(|h| h.split_once(' '))
        .is_some_and(|(scheme, token)| {
            scheme.eq_ignore_ascii_case("Bearer") && !token.trim().is_empty()
        });
    if sent {
        BEARER_INVALID_TOKEN
    } else {
        BEARER_CHALLENGE
    }
}

/// Checks an `Authorization` header value (`Bearer <token>`, the scheme in
/// any case, RFC 9110 §11.1) against the expected bearer token in constant
/// time, so the token cannot be guessed byte by byte, nor its length
/// learned, from timing.
pub fn bearer_matches(header: Option<&str>, expected: &str) -> bool {
    let Some((scheme, token)) = header.and_then(|h| h.split_once(' ')) else {
        return false;
    };
    let token = token.trim_start_matches(' ');
    scheme.eq_ignore_ascii_case("Bearer")
        && !expected.is_empty()
        && equal_padded(token.as_bytes(), expected.as_bytes())
}

/// Compares `a` and `b` byte for byte over the longer of the two (the
/// shorter read as zeros past its end), with the lengths compared too: the
/// work does not stop at the first difference nor at a length mismatch
/// (`subtle`'s slice comparison returns at once when lengths differ, which
/// tells an attacker the token's length).
fn equal_padded(a: &[u8], b: &[u8]) -> bool {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let mut same = (a.len() as u64).ct_eq(&(b.len() as u64));
    for i in 0..a.len().max(b.len()) {
        same &= at(a, i).ct_eq(&at(b, i));
    }
    same.into()
}

#[cfg(test)]
mod tests {
    use super::{bearer_challenge, bearer_matches, BEARER_CHALLENGE, BEARER_INVALID_TOKEN};

    #[test]
    fn a_401_names_invalid_token_only_when_a_bearer_token_was_sent() {
        assert_eq!(bearer_challenge(None), BEARER_CHALLENGE);
        assert_eq!(bearer_challenge(Some("Basic YTpi")), BEARER_CHALLENGE);
        assert_eq!(bearer_challenge(Some("Bearer ")), BEARER_CHALLENGE);
        assert_eq!(bearer_challenge(Some("Bearer x")), BEARER_INVALID_TOKEN);
        assert_eq!(bearer_challenge(Some("bearer x")), BEARER_INVALID_TOKEN);
    }

    #[test]
    fn only_the_exact_bearer_token_matches() {
        assert!(bearer_matches(Some("Bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(Some("s3cret"), "s3cret"));
        assert!(!bearer_matches(None, "s3cret"));
        assert!(!bearer_matches(Some("Bearer "), ""));
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for header in [
            "bearer s3cret",
            "BEARER s3cret",
            "BeArEr s3cret",
            "Bearer  s3cret",
        ] {
            assert!(bearer_matches(Some(header), "s3cret"), "{header}");
        }
        assert!(!bearer_matches(Some("Basic s3cret"), "s3cret"));
        assert!(!bearer_matches(Some("Bearers3cret"), "s3cret"));
    }

    #[test]
    fn tokens_of_other_lengths_or_zero_padding_never_match() {
        use super::equal_padded;
        assert!(equal_padded(b"abc", b"abc"));
        assert!(
            !equal_padded(b"abc", b"abc\0"),
            "same bytes, zero-padded, other length"
        );
        assert!(!equal_padded(b"abc\0", b"abc"));
        assert!(!equal_padded(b"", b"\0"));
        assert!(!bearer_matches(Some("Bearer s3cret\0"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3cretX"), "s3cret"));
    }

    #[test]
    fn secrets_missing_or_under_32_bytes_are_refused_by_name() {
        use super::{required, SecretError};
        assert_eq!(required("X", None), Err(SecretError::Missing("X")));
        assert_eq!(required("X", Some("")), Err(SecretError::Missing("X")));
        assert_eq!(
            required("X", Some(&"k".repeat(31))),
            Err(SecretError::TooShort { name: "X", len: 31 })
        );
        let long = "k".repeat(32);
        assert_eq!(required("X", Some(&long)), Ok(long.as_str()));
    }
}
