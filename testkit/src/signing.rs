//! Signing keys of an identity provider of the test's own: RSA, EC P-256
//! and Ed25519 keys made with OpenSSL, their public halves as JWKs (RFC
//! 7517) and tokens signed with them, for the gateway's JWKS tests.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use openssl::bn::BigNumContext;
use openssl::ec::{EcGroup, EcKey};
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use serde::Serialize;
use serde_json::{json, Value};

/// One private key and the `kid` it is published under.
pub struct SigningKey {
    pub kid: String,
    pub alg: Algorithm,
    key: PKey<Private>,
}

impl SigningKey {
    /// A 2048-bit RSA key (RS256).
    ///
    /// # Panics
    /// When OpenSSL cannot make the key.
    pub fn rsa(kid: &str) -> Self {
        let key = PKey::from_rsa(Rsa::generate(2048).expect("rsa key")).expect("pkey");
        Self::new(kid, Algorithm::RS256, key)
    }

    /// An EC key on P-256 (ES256).
    ///
    /// # Panics
    /// When OpenSSL cannot make the key.
    pub fn ec(kid: &str) -> Self {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
        let key = PKey::from_ec_key(EcKey::generate(&group).expect("ec key")).expect("pkey");
        Self::new(kid, Algorithm::ES256, key)
    }

    /// An Ed25519 key (EdDSA).
    ///
    /// # Panics
    /// When OpenSSL cannot make the key.
    pub fn ed25519(kid: &str) -> Self {
        Self::new(
            kid,
            Algorithm::EdDSA,
            PKey::generate_ed25519().expect("ed25519 key"),
        )
    }

    fn new(kid: &str, alg: Algorithm, key: PKey<Private>) -> Self {
        Self {
            kid: kid.to_owned(),
            alg,
            key,
        }
    }

    /// The public key as a JWK, with its `kid`, `use` and `alg`.
    ///
    /// # Panics
    /// When OpenSSL cannot read its own key.
    pub fn jwk(&self) -> Value {
        let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        let mut jwk = match self.alg {
            Algorithm::RS256 => {
                let rsa = self.key.rsa().expect("rsa");
                json!({"kty": "RSA", "n": b64(&rsa.n().to_vec()), "e": b64(&rsa.e().to_vec())})
            }
            Algorithm::ES256 => {
                let ec = self.key.ec_key().expect("ec");
                let mut ctx = BigNumContext::new().expect("bn ctx");
                let (mut x, mut y) = (
                    openssl::bn::BigNum::new().expect("bn"),
                    openssl::bn::BigNum::new().expect("bn"),
                );
                ec.public_key()
                    .affine_coordinates(ec.group(), &mut x, &mut y, &mut ctx)
                    .expect("coordinates");
                json!({
                    "kty": "EC",
                    "crv": "P-256",
                    "x": b64(&x.to_vec_padded(32).expect("x")),
                    "y": b64(&y.to_vec_padded(32).expect("y")),
                })
            }
            _ => json!({
                "kty": "OKP",
                "crv": "Ed25519",
                "x": b64(&self.key.raw_public_key().expect("raw public key")),
            }),
        };
        jwk["kid"] = json!(self.kid);
        jwk["use"] = json!("sig");
        jwk["alg"] = json!(alg_name(self.alg));
        jwk
    }

    /// The public key in PEM (SubjectPublicKeyInfo): what an attacker who
    /// swaps `alg` to HS256 would use as the HMAC secret.
    ///
    /// # Panics
    /// When OpenSSL cannot write its own key.
    pub fn public_pem(&self) -> Vec<u8> {
        self.key.public_key_to_pem().expect("public pem")
    }

    /// `claims` signed with this key, its `kid` in the header.
    pub fn sign(&self, claims: &impl Serialize) -> String {
        self.sign_as(claims, Some(&self.kid))
    }

    /// `claims` signed with this key under any `kid` (or none).
    ///
    /// # Panics
    /// When the key or claims cannot be encoded.
    pub fn sign_as(&self, claims: &impl Serialize, kid: Option<&str>) -> String {
        let pem = self.key.private_key_to_pem_pkcs8().expect("pkcs8 pem");
        let key = match self.alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            _ => EncodingKey::from_ed_pem(&pem),
        }
        .expect("encoding key");
        let mut header = Header::new(self.alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &key).expect("signed token")
    }
}

/// A JWKS document of `keys`.
pub fn jwks(keys: &[&SigningKey]) -> String {
    json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() }).to_string()
}

fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::RS256 => "RS256",
        Algorithm::ES256 => "ES256",
        _ => "EdDSA",
    }
}
