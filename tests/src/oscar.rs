//! A real open-source shop for the tests: django-oscar under gunicorn,
//! installed from PyPI by `tests/shop/oscar.sh` into a venv cached across
//! runs (the first run takes about a minute; `make test` builds the cache
//! before the tests), its assets served by the shop itself (WhiteNoise)
//! under `/static/`, with sessions and CSRF-protected forms. One customer
//! and one product in stock, on an SQLite file in the shop's own temp dir;
//! stopped by PID on drop.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_port, Proc, TempDir};

/// A running Oscar shop.
pub struct OscarShop {
    pub addr: SocketAddr,
    /// The customer's sign-in.
    pub email: String,
    pub password: String,
    /// Path of the product page (`/catalogue/...`).
    pub product_path: String,
    proc: Proc,
    pub dir: TempDir,
}

/// How a test runs the shop.
#[derive(Default)]
pub struct OscarOptions {
    /// Origins (`scheme://host:port`) its forms may be posted from, besides
    /// its own host (Django's `CSRF_TRUSTED_ORIGINS`).
    pub csrf_trusted_origins: Vec<String>,
    /// Give every page without a `Cache-Control` of its own `max-age=N`,
    /// signed-in pages included, as a site-wide cache header would.
    pub page_max_age_seconds: Option<u32>,
}

impl OscarShop {
    /// Prepares a site (venv and prepared copy from the cache) and starts
    /// gunicorn on a free port; waits until it answers.
    ///
    /// # Panics
    /// When the set-up fails (python3 with venv missing: run
    /// `bash deploy/local/install-deps.sh --test`) or the shop does not
    /// listen within a minute.
    pub fn start(opts: &OscarOptions) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("shop/oscar.sh");
        let dir = TempDir::new("oscar");
        let data = dir.0.join("site");
        let out = Command::new("bash")
            .arg(&script)
            .arg("prepare")
            .arg(&data)
            .stdin(Stdio::null())
            .output()
            .expect("bash on PATH");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "oscar.sh prepare failed ({}); python3 and python3-venv come from \
             `bash deploy/local/install-deps.sh --test`:\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |name: &str| {
            stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("oscar.sh printed no {name}: {stdout}"))
                .to_owned()
        };
        let (email, password, product_path) = (field("email"), field("password"), field("product"));

        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let log = std::fs::File::create(dir.0.join("oscar.log")).unwrap();
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg("serve")
            .arg(&data)
            .arg(addr.port().to_string())
            .env(
                "OSCAR_CSRF_TRUSTED_ORIGINS",
                opts.csrf_trusted_origins.join(" "),
            )
            .env_remove("OSCAR_PAGE_MAX_AGE")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(age) = opts.page_max_age_seconds {
            cmd.env("OSCAR_PAGE_MAX_AGE", age.to_string());
        }
        let proc = Proc {
            child: cmd.spawn().unwrap(),
            name: "oscar",
        };
        let shop = Self {
            addr,
            email,
            password,
            product_path,
            proc,
            dir,
        };
        assert!(
            wait_port(addr, Duration::from_secs(60)),
            "the Oscar shop did not listen:\n{}",
            shop.log()
        );
        shop
    }

    /// What gunicorn and Django wrote (access log, errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("oscar.log")).unwrap_or_default()
    }
}

impl Drop for OscarShop {
    fn drop(&mut self) {
        // gunicorn's master stops its workers on TERM; KILL (Proc's drop)
        // would leave them to notice on their own.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.proc.pid().to_string())
            .stderr(Stdio::null())
            .status();
        self.proc.wait_exit(Duration::from_secs(10));
    }
}
