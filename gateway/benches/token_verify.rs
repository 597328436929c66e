//! What verifying a buyer's bearer token costs the gateway per request:
//! a token seen before (answered from the remembered tokens) and a crowd
//! of tokens each seen about once (the full signature check, as in a sale
//! with more buyers than the gateway remembers). Run with `cargo bench -p
//! flashgate --bench token_verify`; prints microseconds per call (no
//! assertion: a figure for the docs, not a test).

use std::hint::black_box;

use flashgate_common::config::AuthConfig;
use flashgate_gateway::admission::{mint, Verifier};
use futures_util::FutureExt;
use http::{HeaderMap, HeaderValue};

mod common;
use common::per_call;

const SECRET: &[u8] = b"a benchmark secret of at least thirty-two bytes";

fn bearer(user: &str) -> HeaderMap {
    let token = mint(SECRET, user, 3600, &AuthConfig::default()).expect("mint");
    let value = HeaderValue::from_str(&format!("Bearer {token}")).expect("header value");
    HeaderMap::from_iter([(http::header::AUTHORIZATION, value)])
}

/// One verification: an HS256 token is answered without waiting.
fn verify(verifier: &Verifier, headers: &HeaderMap) -> bool {
    verifier
        .identify(headers)
        .now_or_never()
        .expect("HS256 needs no fetch")
        .is_ok()
}

fn main() {
    let one = bearer("buyer-42");
    let verifier = Verifier::new(SECRET);
    per_call("one token, seen before", 0, 1_000_000, |_| {
        black_box(verify(&verifier, black_box(&one)));
    });
    let crowd: Vec<HeaderMap> = (0..300_000)
        .map(|i| bearer(&format!("buyer-{i}")))
        .collect();
    let verifier = Verifier::new(SECRET);
    per_call("300,000 tokens, first sighting", 0, crowd.len(), |i| {
        black_box(verify(&verifier, black_box(&crowd[i])));
    });
    per_call("300,000 tokens, second sighting", 0, crowd.len(), |i| {
        black_box(verify(&verifier, black_box(&crowd[i])));
    });
    let few = &crowd[..20_000];
    per_call("20,000 tokens, cycled 10 times", 0, few.len() * 10, |i| {
        black_box(verify(&verifier, black_box(&few[i % few.len()])));
    });
}
