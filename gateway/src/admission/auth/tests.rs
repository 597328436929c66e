//! The verifier's tests: HS256 tokens (answered without waiting), the
//! remembered tokens, the sign-in cookie.

use futures_util::FutureExt;
use http::header::{AUTHORIZATION, COOKIE};
use http::HeaderValue;

use super::*;

/// `v`'s answer to a request with this `Authorization` value, which must
/// come without waiting (HS256 needs no fetch).
fn verify(v: &Verifier, authorization: Option<&[u8]>) -> Result<String, AuthError> {
    let mut headers = HeaderMap::new();
    if let Some(a) = authorization {
        headers.insert(AUTHORIZATION, HeaderValue::from_bytes(a).unwrap());
    }
    v.identify(&headers)
        .now_or_never()
        .expect("answered without waiting")
        .map(|identity| identity.user)
}

fn bearer(t: &str) -> Vec<u8> {
    format!("Bearer {t}").into_bytes()
}

#[test]
fn a_minted_token_verifies_to_its_user() {
    let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
    assert_eq!(
        verify(&Verifier::new(b"k"), Some(&bearer(&t))),
        Ok("alice".into())
    );
}

#[test]
fn wrong_secret_expired_and_missing_tokens_are_rejected() {
    let v = Verifier::new(b"k");
    let t = mint(b"other", "alice", 60, &AuthConfig::default()).unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Err(AuthError::Invalid));
    assert_eq!(verify(&v, None), Err(AuthError::Missing));
    assert_eq!(verify(&v, Some(b"Basic abc")), Err(AuthError::Missing));
    let old = Claims {
        sub: "alice".into(),
        exp: 1000,
        iat: None,
    };
    let t =
        jsonwebtoken::encode(&Header::default(), &old, &EncodingKey::from_secret(b"k")).unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Err(AuthError::Expired));
}

#[test]
fn a_remembered_token_still_expires() {
    let v = Verifier::new(b"k");
    let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Ok("alice".into()));
    // Second time from the cache: same answer.
    assert_eq!(verify(&v, Some(&bearer(&t))), Ok("alice".into()));
    let now = now_seconds();
    v.verified.remember(
        Sha256::digest(t.as_bytes()).into(),
        Arc::from("alice"),
        1000,
        now,
        0,
    );
    assert_eq!(verify(&v, Some(&bearer(&t))), Err(AuthError::Expired));
}

#[test]
fn a_remembered_token_is_checked_in_full_again_after_its_time() {
    let v = Verifier::new(b"k");
    let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
    // Remembered for someone else, but so long ago that it is forgotten:
    // the answer comes from the full check.
    v.verified.remember(
        Sha256::digest(t.as_bytes()).into(),
        Arc::from("mallory"),
        u64::MAX,
        0,
        0,
    );
    assert_eq!(verify(&v, Some(&bearer(&t))), Ok("alice".into()));
}

#[test]
fn tokens_sharing_a_slot_replace_each_other_and_each_still_answers_its_own_user() {
    let v = Verifier {
        verified: Remembered::new(1),
        ..Verifier::new(b"k")
    };
    let (a, b) = (
        mint(b"k", "alice", 60, &AuthConfig::default()).unwrap(),
        mint(b"k", "bob", 60, &AuthConfig::default()).unwrap(),
    );
    for _ in 0..3 {
        assert_eq!(verify(&v, Some(&bearer(&a))), Ok("alice".into()));
        assert_eq!(verify(&v, Some(&bearer(&b))), Ok("bob".into()));
    }
    let now = now_seconds();
    assert!(
        v.verified
            .get(&Sha256::digest(a.as_bytes()).into(), now, 0)
            .is_none(),
        "alice's token was pushed out by bob's"
    );
    assert_eq!(
        v.verified
            .get(&Sha256::digest(b.as_bytes()).into(), now, 0)
            .map(|(u, _)| u.to_string()),
        Some("bob".into())
    );
}

#[test]
fn remembered_tokens_each_answer_their_own_user() {
    let v = Verifier::new(b"k");
    let (a, b) = (
        mint(b"k", "alice", 60, &AuthConfig::default()).unwrap(),
        mint(b"k", "bob", 60, &AuthConfig::default()).unwrap(),
    );
    for _ in 0..2 {
        assert_eq!(verify(&v, Some(&bearer(&a))), Ok("alice".into()));
        assert_eq!(verify(&v, Some(&bearer(&b))), Ok("bob".into()));
    }
    // A remembered token's bytes changed by one character are a new
    // token: checked in full (and refused), not taken for the old one.
    let mut forged = a.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    assert_eq!(verify(&v, Some(&bearer(&forged))), Err(AuthError::Invalid));
}

#[test]
fn alg_none_and_tokens_without_exp_are_rejected() {
    let v = Verifier::new(b"k");
    // {"alg":"none","typ":"JWT"}.{"sub":"alice","exp":9999999999}.
    let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.";
    assert_eq!(verify(&v, Some(&bearer(none))), Err(AuthError::Invalid));
    #[derive(Serialize)]
    struct NoExp {
        sub: &'static str,
    }
    let t = jsonwebtoken::encode(
        &Header::default(),
        &NoExp { sub: "alice" },
        &EncodingKey::from_secret(b"k"),
    )
    .unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Err(AuthError::Invalid));
}

fn token_with(aud: Option<&str>, iss: Option<&str>) -> String {
    let claims = MintedClaims {
        claims: Claims {
            sub: "alice".into(),
            exp: 9_999_999_999,
            iat: None,
        },
        aud,
        iss,
    };
    jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"k")).unwrap()
}

#[test]
fn with_audience_and_issuer_configured_a_token_must_carry_both() {
    let expected = AuthConfig {
        audience: Some("flashgate".into()),
        issuer: Some("https://shop.example".into()),
        ..Default::default()
    };
    let v = Verifier::expecting(b"k", &expected);
    let good = token_with(Some("flashgate"), Some("https://shop.example"));
    assert_eq!(verify(&v, Some(&bearer(&good))), Ok("alice".into()));
    for bad in [
        token_with(Some("other-service"), Some("https://shop.example")),
        token_with(Some("flashgate"), Some("https://evil.example")),
        token_with(None, Some("https://shop.example")),
        token_with(Some("flashgate"), None),
        token_with(None, None),
    ] {
        assert_eq!(
            verify(&v, Some(&bearer(&bad))),
            Err(AuthError::Invalid),
            "{bad}"
        );
    }
}

#[test]
fn a_minted_token_carries_the_configured_claims() {
    let expected = AuthConfig {
        audience: Some("flashgate".into()),
        issuer: Some("shop".into()),
        ..Default::default()
    };
    let t = mint(b"k", "alice", 60, &expected).unwrap();
    assert_eq!(
        verify(&Verifier::expecting(b"k", &expected), Some(&bearer(&t))),
        Ok("alice".into())
    );
    assert_eq!(
        verify(&Verifier::new(b"k"), Some(&bearer(&t))),
        Err(AuthError::Invalid),
        "an aud meant for someone else"
    );
}

#[test]
fn a_token_expiring_at_the_end_of_time_is_valid_and_does_not_overflow() {
    let v = Verifier::new(b"k");
    let claims = Claims {
        sub: "alice".into(),
        exp: u64::MAX,
        iat: None,
    };
    let t =
        jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"k")).unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Ok("alice".into()));
    // Again from the remembered tokens, where `exp` plus the leeway is computed.
    assert_eq!(verify(&v, Some(&bearer(&t))), Ok("alice".into()));
}

#[test]
fn an_absurd_lifetime_is_refused_when_minting() {
    let err = mint(b"k", "alice", u64::MAX, &AuthConfig::default()).unwrap_err();
    assert!(err.to_string().contains("ttl"), "{err}");
    assert!(mint(b"k", "alice", MAX_MINT_TTL_SECONDS, &AuthConfig::default()).is_ok());
}

#[test]
fn a_token_used_before_its_nbf_is_rejected() {
    #[derive(Serialize)]
    struct WithNbf {
        sub: &'static str,
        exp: u64,
        nbf: u64,
    }
    let v = Verifier::new(b"k");
    let now = now_seconds();
    let early = WithNbf {
        sub: "alice",
        exp: now + 7200,
        nbf: now + 3600,
    };
    let t =
        jsonwebtoken::encode(&Header::default(), &early, &EncodingKey::from_secret(b"k")).unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Err(AuthError::Invalid));
    let ready = WithNbf {
        sub: "alice",
        exp: now + 7200,
        nbf: now - 60,
    };
    let t =
        jsonwebtoken::encode(&Header::default(), &ready, &EncodingKey::from_secret(b"k")).unwrap();
    assert_eq!(verify(&v, Some(&bearer(&t))), Ok("alice".into()));
}

#[test]
fn user_ids_that_would_break_redis_keys_are_rejected() {
    assert!(valid_user_id("user-42@shop.example"));
    assert!(!valid_user_id("a:b"));
    assert!(!valid_user_id(""));
    assert!(!valid_user_id("a b"));
    assert!(mint(b"k", "a:b", 60, &AuthConfig::default()).is_err());
}

#[test]
fn a_token_comes_from_the_sign_in_cookie_only_when_one_is_configured() {
    let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        COOKIE,
        HeaderValue::from_str(&format!("theme=dark; fg_token={t}; x=1")).unwrap(),
    );
    let identify = |v: &Verifier, headers: &HeaderMap| {
        v.identify(headers)
            .now_or_never()
            .expect("answered without waiting")
    };
    assert_eq!(
        identify(&Verifier::new(b"k"), &headers),
        Err(AuthError::Missing)
    );
    let with_cookie = AuthConfig {
        cookie: Some("fg_token".into()),
        ..AuthConfig::default()
    };
    let v = Verifier::expecting(b"k", &with_cookie);
    assert_eq!(
        identify(&v, &headers),
        Ok(Identity {
            user: "alice".into(),
            via: Via::Cookie
        })
    );
    // An empty bearer is no bearer: the cookie signs in.
    headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
    assert_eq!(identify(&v, &headers).map(|i| i.via), Ok(Via::Cookie));
    // A bearer token wins over the cookie, and says so.
    let b = mint(b"k", "bob", 60, &AuthConfig::default()).unwrap();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {b}")).unwrap(),
    );
    assert_eq!(
        identify(&v, &headers),
        Ok(Identity {
            user: "bob".into(),
            via: Via::Bearer
        })
    );
}

#[test]
fn cookie_values_are_read_by_exact_name_quoted_or_not() {
    let mut headers = HeaderMap::new();
    headers.append(
        COOKIE,
        HeaderValue::from_static("fg_token_old=a; other=\"b\""),
    );
    headers.append(COOKIE, HeaderValue::from_static("fg_token=\"c\""));
    assert_eq!(cookie(&headers, "fg_token"), Some("c"));
    assert_eq!(cookie(&headers, "other"), Some("b"));
    assert_eq!(cookie(&headers, "fg"), None);
    headers.insert(COOKIE, HeaderValue::from_static("fg_token="));
    assert_eq!(cookie(&headers, "fg_token"), None);
}

#[test]
fn a_token_remembered_under_an_older_key_set_is_checked_in_full_again() {
    let v = Verifier::new(b"k");
    let t = mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
    let digest: TokenDigest = Sha256::digest(t.as_bytes()).into();
    let now = now_seconds();
    v.verified
        .remember(digest, Arc::from("mallory"), u64::MAX, now, 7);
    assert_eq!(
        v.verified.get(&digest, now, 8),
        None,
        "a set changed since: forgotten"
    );
    assert_eq!(
        v.verified.get(&digest, now, 7).map(|(u, _)| u.to_string()),
        Some("mallory".into())
    );
}
