//! The JWKS's tests: which keys are kept, tokens of each algorithm, the
//! last good set kept when a load fails. The set comes from a real file;
//! the URL is exercised end to end in `tests/tests/identity.rs`.

use std::time::Duration;

use flashgate_common::config::{AuthConfig, JwksConfig, JwksSource, JwtAlgorithm};
use flashgate_testkit::{jwks, SigningKey, TempDir};
use futures_util::FutureExt;
use serde_json::json;

use super::*;
use crate::admission::auth::{AuthError, Verifier};

fn claims(user: &str) -> serde_json::Value {
    json!({"sub": user, "exp": flashgate_common::now_ms() / 1000 + 600})
}

fn file_config(path: PathBuf) -> JwksConfig {
    JwksConfig {
        source: JwksSource::File(path),
        refetch_interval: Duration::from_secs(600),
        timeout: Duration::from_secs(1),
        refresh: Duration::from_secs(600),
    }
}

fn loads() -> IntCounterVec {
    crate::infra::Metrics::register().jwks_loads
}

fn asymmetric() -> AuthConfig {
    AuthConfig {
        algorithms: vec![
            JwtAlgorithm::RS256,
            JwtAlgorithm::ES256,
            JwtAlgorithm::EdDSA,
        ],
        ..AuthConfig::default()
    }
}

/// The verifier's answer, which must come without waiting (every `kid`
/// here is known, or the refetch bound forbids a fetch).
fn verify(v: &Verifier, token: &str) -> Result<String, AuthError> {
    v.verify(token)
        .now_or_never()
        .expect("answered without waiting")
}

#[test]
fn only_signing_public_keys_with_a_kid_are_kept_each_bound_to_its_algorithm() {
    let (rsa, ec, ed) = (
        SigningKey::rsa("r"),
        SigningKey::ec("e"),
        SigningKey::ed25519("d"),
    );
    let mut no_kid = ed.jwk();
    no_kid.as_object_mut().unwrap().remove("kid");
    let mut enc = rsa.jwk();
    enc["kid"] = json!("enc");
    enc["use"] = json!("enc");
    let mut mislabelled = ec.jwk();
    mislabelled["kid"] = json!("mislabelled");
    mislabelled["alg"] = json!("RS256");
    let doc = json!({"keys": [
        rsa.jwk(), ec.jwk(), ed.jwk(), no_kid, enc, mislabelled,
        {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
        {"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AA", "y": "AA"},
        {"kty": "who-knows", "kid": "odd"},
    ]});
    let set = KeySet::parse(doc.to_string().as_bytes()).unwrap();
    let mut kept: Vec<(&str, Algorithm)> =
        set.keys.iter().map(|(k, v)| (k.as_str(), v.alg)).collect();
    kept.sort_by_key(|(k, _)| *k);
    assert_eq!(
        kept,
        [
            ("d", Algorithm::EdDSA),
            ("e", Algorithm::ES256),
            ("r", Algorithm::RS256)
        ]
    );
    assert!(matches!(
        KeySet::parse(br#"{"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]}"#),
        Err(JwksError::NoUsableKeys)
    ));
    assert!(matches!(KeySet::parse(b"[]"), Err(JwksError::Parse(_))));
}

#[test]
fn tokens_of_each_algorithm_verify_and_swapped_or_forged_ones_do_not() {
    let dir = TempDir::new("jwks");
    let path = dir.0.join("jwks.json");
    let (rsa, ec, ed) = (
        SigningKey::rsa("r"),
        SigningKey::ec("e"),
        SigningKey::ed25519("d"),
    );
    std::fs::write(&path, jwks(&[&rsa, &ec, &ed])).unwrap();
    let keys = Arc::new(Jwks::new(&file_config(path), loads()).unwrap());
    let v = Verifier::with_keys(Some(b"k"), &asymmetric(), Some(keys));
    for key in [&rsa, &ec, &ed] {
        assert_eq!(verify(&v, &key.sign(&claims("alice"))), Ok("alice".into()));
    }
    // An HS256 token is refused when HS256 is not allowed, even with the secret.
    let hs = crate::admission::mint(b"k", "alice", 60, &AuthConfig::default()).unwrap();
    assert_eq!(verify(&v, &hs), Err(AuthError::Invalid));
    // The RSA public key used as an HMAC secret, under the RSA key's kid.
    let mut header = jsonwebtoken::Header::new(Algorithm::HS256);
    header.kid = Some("r".into());
    let swapped = jsonwebtoken::encode(
        &header,
        &claims("mallory"),
        &jsonwebtoken::EncodingKey::from_secret(&rsa.public_pem()),
    )
    .unwrap();
    assert_eq!(verify(&v, &swapped), Err(AuthError::Invalid));
    // A key of another provider under a known kid; the EC key's kid on an
    // Ed25519 signature; no kid at all.
    let other = SigningKey::rsa("r");
    assert_eq!(
        verify(&v, &other.sign(&claims("mallory"))),
        Err(AuthError::Invalid)
    );
    assert_eq!(
        verify(&v, &ed.sign_as(&claims("mallory"), Some("e"))),
        Err(AuthError::Invalid)
    );
    assert_eq!(
        verify(&v, &rsa.sign_as(&claims("mallory"), None)),
        Err(AuthError::Invalid)
    );
}

#[test]
fn hs256_and_jwks_tokens_are_both_accepted_when_both_are_allowed() {
    let dir = TempDir::new("jwks");
    let path = dir.0.join("jwks.json");
    let rsa = SigningKey::rsa("r");
    std::fs::write(&path, jwks(&[&rsa])).unwrap();
    let both = AuthConfig {
        algorithms: vec![JwtAlgorithm::HS256, JwtAlgorithm::RS256],
        ..AuthConfig::default()
    };
    let keys = Arc::new(Jwks::new(&file_config(path), loads()).unwrap());
    let v = Verifier::with_keys(Some(b"k"), &both, Some(keys));
    let hs = crate::admission::mint(b"k", "bob", 60, &AuthConfig::default()).unwrap();
    assert_eq!(verify(&v, &hs), Ok("bob".into()));
    assert_eq!(verify(&v, &rsa.sign(&claims("alice"))), Ok("alice".into()));
    // ES256 is not in the list: refused even with a fitting key.
    let ec = SigningKey::ec("r");
    assert_eq!(
        verify(&v, &ec.sign(&claims("alice"))),
        Err(AuthError::Invalid)
    );
}

#[tokio::test]
async fn a_failed_load_keeps_the_last_good_set_and_a_refetch_finds_a_rotated_key() {
    let dir = TempDir::new("jwks");
    let path = dir.0.join("jwks.json");
    let (old, new) = (SigningKey::rsa("old"), SigningKey::ec("new"));
    std::fs::write(&path, jwks(&[&old])).unwrap();
    let counter = loads();
    let keys = Arc::new(Jwks::new(&file_config(path.clone()), counter.clone()).unwrap());
    let v = Verifier::with_keys(None, &asymmetric(), Some(keys.clone()));
    std::fs::write(&path, "not json").unwrap();
    assert!(keys.reload().await.is_err());
    std::fs::remove_file(&path).unwrap();
    assert!(keys.reload().await.is_err());
    assert_eq!(
        v.verify(&old.sign(&claims("alice"))).await,
        Ok("alice".into())
    );
    // Rotated: the first token of the new kid loads the set again.
    std::fs::write(&path, jwks(&[&old, &new])).unwrap();
    assert_eq!(v.verify(&new.sign(&claims("bob"))).await, Ok("bob".into()));
    assert_eq!(counter.with_label_values(&["ok"]).get(), 1);
    // Within the refetch interval, an unknown kid is refused without a load.
    let later = SigningKey::ed25519("later");
    std::fs::write(&path, jwks(&[&old, &new, &later])).unwrap();
    assert_eq!(
        verify(&v, &later.sign(&claims("carol"))),
        Err(AuthError::Invalid)
    );
    // The periodic refresh still picks it up.
    keys.reload().await.unwrap();
    assert_eq!(
        verify(&v, &later.sign(&claims("carol"))),
        Ok("carol".into())
    );
}

#[tokio::test]
async fn a_key_removed_from_the_set_stops_working_even_for_a_remembered_token() {
    let dir = TempDir::new("jwks-removed");
    let path = dir.0.join("jwks.json");
    let (kept, dropped) = (SigningKey::rsa("kept"), SigningKey::ec("dropped"));
    std::fs::write(&path, jwks(&[&kept, &dropped])).unwrap();
    let keys = Arc::new(Jwks::new(&file_config(path.clone()), loads()).unwrap());
    let v = Verifier::with_keys(None, &asymmetric(), Some(keys.clone()));
    let (a, b) = (
        kept.sign(&claims("alice")),
        dropped.sign(&claims("mallory")),
    );
    // Verified once, then remembered.
    assert_eq!(verify(&v, &a), Ok("alice".into()));
    assert_eq!(verify(&v, &b), Ok("mallory".into()));
    assert_eq!(verify(&v, &b), Ok("mallory".into()));
    // The same document again changes nothing.
    let generation = keys.generation();
    keys.reload().await.unwrap();
    assert_eq!(keys.generation(), generation);
    // The provider drops a key: its tokens are refused at once, remembered
    // or not; the other key's go on being accepted.
    std::fs::write(&path, jwks(&[&kept])).unwrap();
    keys.reload().await.unwrap();
    assert_ne!(keys.generation(), generation);
    // (Its kid is unknown now: one refetch, which finds it still gone.)
    assert_eq!(v.verify(&b).await, Err(AuthError::Invalid));
    assert_eq!(verify(&v, &a), Ok("alice".into()));
}
