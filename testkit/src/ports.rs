//! Listening ports for test processes, never handed to two tests at once.
//!
//! Binding port 0 and dropping the listener is a race: between the drop and
//! the process that later binds the port, another test (nextest runs them
//! in parallel, one process each) may be handed the same port, and any
//! outgoing connection may take it as its ephemeral source port. So ports
//! come from below the kernel's ephemeral range (32768 up on Linux), and a
//! port is claimed by an exclusive lock on a file named after it, held by
//! the test process until it exits (a crashed test frees its ports too).
//!
//! A Redis Cluster node also listens on its cluster bus, port + 10000
//! ([`free_port_with_bus`]): both ports are claimed with the same lock
//! files, so [`free_port`] never hands out a bus port another test holds,
//! and both stay below the ephemeral range.

use std::fs::File;
use std::net::TcpListener;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Ports handed out: below the ephemeral range, above the usual services.
const RANGE: Range<u16> = 20_000..32_000;

/// Redis Cluster's bus port is the client port plus this.
pub const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// Client ports of cluster nodes: their bus ports (30000..32000) stay
/// inside [`RANGE`], so both are claimed through the same lock files.
const BUS_RANGE: Range<u16> = 20_000..22_000;

/// The lock files this process holds; kept open until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("flashgate-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock dir");
    dir
}

/// Where to start scanning a range: differs between test processes, so
/// parallel tests rarely contend for the same lock files.
fn seed() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761)
}

/// Claims `port`: locks its file and checks nothing listens there now.
/// The lock is released when the returned file is dropped.
fn claim(dir: &std::path::Path, port: u16) -> Option<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    file.try_lock().ok()?;
    // Held by nobody else; make sure nothing outside the tests listens there.
    // (A host without IPv6 only fails the second bind for another reason.)
    let v6_taken = matches!(TcpListener::bind(("::", port)), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse);
    if TcpListener::bind(("127.0.0.1", port)).is_err() || v6_taken {
        return None;
    }
    Some(file)
}

fn hold(files: impl IntoIterator<Item = File>) {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).extend(files);
}

/// The ports of `range`, each once, from a point that differs per process.
fn scan(range: Range<u16>) -> impl Iterator<Item = u16> {
    let len = u32::from(range.end - range.start);
    let seed = seed();
    (0..len).map(move |i| range.start + (seed.wrapping_add(i) % len) as u16)
}

/// A loopback port no other test holds and nothing listens on now.
pub fn free_port() -> u16 {
    let dir = lock_dir();
    for port in scan(RANGE) {
        if let Some(file) = claim(&dir, port) {
            hold([file]);
            return port;
        }
    }
    panic!("no free port in {RANGE:?}");
}

/// A port P for a Redis Cluster node, with P + [`CLUSTER_BUS_OFFSET`] (its
/// cluster bus) claimed too: neither is held by another test nor listened on.
pub fn free_port_with_bus() -> u16 {
    let dir = lock_dir();
    for port in scan(BUS_RANGE) {
        let Some(client) = claim(&dir, port) else {
            continue;
        };
        // Dropping `client` on failure releases it for the next caller.
        if let Some(bus) = claim(&dir, port + CLUSTER_BUS_OFFSET) {
            hold([client, bus]);
            return port;
        }
    }
    panic!("no free port pair in {BUS_RANGE:?} (+{CLUSTER_BUS_OFFSET})");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bus_port_is_claimed_with_its_client_port() {
        let port = free_port_with_bus();
        assert!(BUS_RANGE.contains(&port));
        let bus = port + CLUSTER_BUS_OFFSET;
        assert!(
            RANGE.contains(&bus) && bus < 32_768,
            "the bus port stays below the ephemeral range"
        );
        // flock conflicts between two open files even in one process: the
        // lock free_port would need for either port is taken.
        for p in [port, bus] {
            let again = File::options()
                .write(true)
                .open(lock_dir().join(p.to_string()))
                .unwrap();
            assert!(again.try_lock().is_err(), "port {p} is not held");
        }
        for _ in 0..50 {
            let other = free_port();
            assert!(other != port && other != bus);
        }
    }
}
