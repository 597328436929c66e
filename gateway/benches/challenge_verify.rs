//! What verifying a `Flashgate-Pow` header costs the gateway per buy: the
//! tag, both bindings and the solution's hash (no Redis), and what issuing
//! a challenge costs. Run with `cargo bench -p flashgate --bench
//! challenge_verify`; prints nanoseconds per call (no assertion: a figure
//! for the docs, not a test).

use std::hint::black_box;

use flashgate_gateway::admission::token::{solve, Signer};

mod common;
use common::per_call;

fn main() {
    let signer = Signer::new(b"a benchmark secret of at least thirty-two bytes");
    let now = flashgate_common::now_ms();
    let issued = signer.issue("buyer-42", "spring-drop", 14, now + 300_000, [9; 12]);
    let header = solve(&issued.challenge, 14, 0);
    assert!(signer
        .verify(header.as_bytes(), "buyer-42", "spring-drop", now, 14)
        .is_ok());
    let (challenge, nonce) = header.rsplit_once('.').expect("challenge.nonce");
    let last = if challenge.ends_with('A') { 'B' } else { 'A' };
    let forged = format!("{}{last}.{nonce}", &challenge[..challenge.len() - 1]);
    let rounds = 200_000;
    per_call("verify a valid solution", rounds / 10, rounds, |_| {
        black_box(signer.verify(
            black_box(header.as_bytes()),
            "buyer-42",
            "spring-drop",
            now,
            14,
        ))
        .ok();
    });
    per_call("refuse a forged challenge", rounds / 10, rounds, |_| {
        black_box(signer.verify(
            black_box(forged.as_bytes()),
            "buyer-42",
            "spring-drop",
            now,
            14,
        ))
        .ok();
    });
    per_call("issue a challenge", rounds / 10, rounds, |_| {
        black_box(signer.issue("buyer-42", "spring-drop", 14, now, black_box([1; 12])));
    });
}
