//! Bearer-token comparison for admin endpoints.

use subtle::ConstantTimeEq;

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
}
