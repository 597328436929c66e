//! Python, as a shop runs it: scripts the tests write from the docs alone,
//! run with packages from PyPI (`PyJWT`, `standardwebhooks`) in a venv made
//! once per package set under the target directory and reused by every
//! later run (`python3 -m venv` needs Debian's `python3-venv`, installed by
//! `deploy/local/install-deps.sh --test`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The directory holding the venvs: `$CARGO_TARGET_DIR/pyvenv`, else
/// `target/pyvenv` beside the test binary (`target/debug/deps/...`).
fn venvs_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir).join("pyvenv");
    }
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.ancestors()
        .nth(3)
        .map(|target| target.join("pyvenv"))
        .expect("the test binary lives in <target>/<profile>/deps")
}

/// The `python` of a venv holding `packages` (pip requirement strings),
/// made on first use. Concurrent tests each build in a directory of their
/// own and the first to finish renames it into place; the rest use it.
///
/// # Panics
/// `python3 -m venv` or `pip install` fails (no python3-venv, no network
/// to PyPI): the test cannot run as a shop would.
pub fn venv(name: &str, packages: &[&str]) -> PathBuf {
    let dir = venvs_dir().join(format!("{name}-{}", short_hash(&packages.join(" "))));
    let python = dir.join("bin/python");
    if dir.join(".ready").exists() {
        return python;
    }
    std::fs::create_dir_all(venvs_dir()).expect("the venvs directory can be made");
    let building = venvs_dir().join(format!(
        ".{name}-{}-{}",
        std::process::id(),
        flashgate_common::now_ms()
    ));
    run_ok(Command::new("python3").arg("-m").arg("venv").arg(&building));
    run_ok(
        Command::new(building.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
    );
    std::fs::write(building.join(".ready"), packages.join("\n")).expect("marker written");
    if std::fs::rename(&building, &dir).is_err() {
        // Another test finished first: use its venv.
        let _ = std::fs::remove_dir_all(&building);
    }
    assert!(dir.join(".ready").exists(), "no venv at {}", dir.display());
    python
}

fn short_hash(text: &str) -> String {
    // FNV-1a: names the package set, nothing secret.
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

fn run_ok(command: &mut Command) {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `script` (Python source, written to `dir`) with `python` and
/// `args`; its output whatever its exit status.
pub fn run_script(python: &Path, dir: &Path, script: &str, args: &[&str]) -> Output {
    let path = dir.join(format!("script-{}.py", short_hash(script)));
    std::fs::write(&path, script).expect("script written");
    Command::new(python)
        .arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{} {}: {e}", python.display(), path.display()))
}
