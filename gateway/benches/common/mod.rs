//! The timing loop of the gateway's micro-benchmarks (no harness: each
//! prints a figure for the docs and the bench report, not a test), and
//! their allocator.

use std::time::Instant;

/// The gateway's allocator (gateway/src/main.rs): what a check allocates
/// (a token's decoded parts, a new user's bucket) costs what it costs
/// there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs `f(i)` for `i` in `0..warmup` untimed, then for `i` in
/// `0..rounds` timed, and prints the mean per call as
/// "<name>: <µs> µs per call (<rounds> calls)": the line the bench
/// report quotes.
pub fn per_call(name: &str, warmup: usize, rounds: usize, mut f: impl FnMut(usize)) {
    for i in 0..warmup {
        f(i);
    }
    let started = Instant::now();
    for i in 0..rounds {
        f(i);
    }
    let ns = started.elapsed().as_nanos() as f64 / rounds as f64;
    println!("{name}: {:.2} µs per call ({rounds} calls)", ns / 1000.0);
}
