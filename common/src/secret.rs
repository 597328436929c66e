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
    #[error("{name} is {len} bytes long; it must be at least {MIN_SECRET_BYTES}")]
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

/// Checks an `Authorization` header value against the expected bearer token
/// in constant time, so the token cannot be guessed byte by byte from timing.
pub fn bearer_matches(header: Option<&str>, expected: &str) -> bool {
    let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return false;
    };
    !expected.is_empty() && token.as_bytes().ct_eq(expected.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::bearer_matches;

    #[test]
    fn only_the_exact_bearer_token_matches() {
        assert!(bearer_matches(Some("Bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(Some("s3cret"), "s3cret"));
        assert!(!bearer_matches(None, "s3cret"));
        assert!(!bearer_matches(Some("Bearer "), ""));
    }

    #[test]
    fn secrets_missing_or_under_32_bytes_are_refused_by_name() {
        use super::{required, SecretError};
        assert_eq!(required("X", None), Err(SecretError::Missing("X")));
        assert_eq!(required("X", Some("")), Err(SecretError::Missing("X")));
        assert_eq!(required("X", Some(&"k".repeat(31))), Err(SecretError::TooShort { name: "X", len: 31 }));
        let long = "k".repeat(32);
        assert_eq!(required("X", Some(&long)), Ok(long.as_str()));
    }
}
