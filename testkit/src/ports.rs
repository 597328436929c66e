//! Listening ports for test processes, never handed to two tests at once.
//!
//! Binding port 0 and dropping the listener is a race: between the drop and
//! the process that later binds the port, another test (nextest runs them
//! in parallel, one process each) may be handed the same port, and any
//! outgoing connection may take it as its ephemeral source port. So ports
//! come from below the kernel's ephemeral range (32768 up on Linux), and a
//! port is claimed by an exclusive lock on a file named after it, held by
//! the test process until it exits (a crashed test frees its ports too).

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Ports handed out: below the ephemeral range, above the usual services.
const RANGE: std::ops::Range<u16> = 20_000..32_000;

/// The lock files this process holds; kept open until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("flashgate-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock dir");
    dir
}

/// A loopback port no other test holds and nothing listens on now.
pub fn free_port() -> u16 {
    let dir = lock_dir();
    let len = u32::from(RANGE.end - RANGE.start);
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    for i in 0..len {
        let port = RANGE.start + ((seed.wrapping_add(i)) % len) as u16;
        let Ok(file) = File::options().create(true).truncate(false).write(true).open(dir.join(port.to_string())) else { continue };
        if file.try_lock().is_err() {
            continue;
        }
        // Held by nobody else; make sure nothing outside the tests listens there.
        // (A host without IPv6 only fails the second bind for another reason.)
        let v6_taken = matches!(TcpListener::bind(("::", port)), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse);
        if TcpListener::bind(("127.0.0.1", port)).is_err() || v6_taken {
            continue;
        }
        HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
        return port;
    }
    panic!("no free port in {RANGE:?}");
}
