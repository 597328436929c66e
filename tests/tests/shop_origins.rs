//! Shop origins as operators name them, against the real gateway: an
//! `https://` origin by name (SNI, certificate verified against
//! `shop.ca_file`, `shop.host_header`, HTTP health checks, the forwarding
//! headers), and a name whose addresses change while the gateway runs (in
//! a private mount namespace with its own `/etc/hosts`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashgate_tests::pki::{write_replacing, Leaf, TestCa};
use flashgate_tests::{
    free_port, spawn_wrapped, wait_http_ready, wait_port, Stack, StackOptions, TempDir,
};
use openssl::pkey::PKey;
use openssl::ssl::{NameType, SslAcceptor, SslMethod, SslStream};
use openssl::x509::X509;
use serde_json::json;

/// One request an origin received.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    host: String,
    sni: Option<String>,
}

/// An HTTPS origin on 127.0.0.1:0 with a certificate for `localhost`:
/// `/health` answers `health_status`; every other path echoes its request
/// (path, headers, the SNI it was reached with) as JSON.
struct TlsOrigin {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    health_status: Arc<AtomicU16>,
    failed_handshakes: Arc<AtomicUsize>,
}

impl TlsOrigin {
    fn start(leaf: &Leaf) -> Self {
        let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
        let chain = X509::stack_from_pem(&leaf.cert_pem).unwrap();
        builder.set_certificate(&chain[0]).unwrap();
        builder
            .set_private_key(&PKey::private_key_from_pem(&leaf.key_pem).unwrap())
            .unwrap();
        let acceptor = Arc::new(builder.build());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = Self {
            port: listener.local_addr().unwrap().port(),
            seen: Arc::default(),
            health_status: Arc::new(AtomicU16::new(200)),
            failed_handshakes: Arc::default(),
        };
        let (seen, status, failed) = (
            origin.seen.clone(),
            origin.health_status.clone(),
            origin.failed_handshakes.clone(),
        );
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (acceptor, seen, status, failed) = (
                    acceptor.clone(),
                    seen.clone(),
                    status.clone(),
                    failed.clone(),
                );
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
                    match acceptor.accept(tcp) {
                        Ok(stream) => serve_tls(stream, &seen, &status),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        origin
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Answers the requests (no bodies) of one TLS connection.
fn serve_tls(mut stream: SslStream<TcpStream>, seen: &Mutex<Vec<Seen>>, status: &AtomicU16) {
    let sni = stream
        .ssl()
        .servername(NameType::HOST_NAME)
        .map(str::to_owned);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            let mut lines = head.split("\r\n");
            let path = lines
                .next()
                .and_then(|l| l.split(' ').nth(1))
                .unwrap_or("")
                .to_owned();
            let headers: HashMap<String, String> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            seen.lock().unwrap().push(Seen {
                path: path.clone(),
                host: headers.get("host").cloned().unwrap_or_default(),
                sni: sni.clone(),
            });
            let (code, body) = if path == "/health" {
                (status.load(Ordering::SeqCst), String::new())
            } else {
                (
                    200,
                    json!({"path": path, "headers": headers, "sni": sni}).to_string(),
                )
            };
            let resp = format!(
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if stream.write_all(resp.as_bytes()).is_err() {
                return;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A test CA and a certificate for `localhost` from it; the CA's PEM file.
fn localhost_pki(dir: &Path) -> (Leaf, std::path::PathBuf) {
    let ca = TestCa::root("Flashgate shop origin test CA");
    let ca_file = dir.join("origin-ca.pem");
    write_replacing(&ca_file, &ca.pem());
    (ca.leaf("localhost", &["localhost"], &[]), ca_file)
}

/// Polls `check` every 100 ms until it holds or `limit` passes.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get_status(stack: &Stack, path: &str) -> u16 {
    match stack.http.get(stack.url(path)).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_origin_by_name_gets_sni_the_fixed_host_and_the_forwarding_headers() {
    let dir = TempDir::new("origin-pki");
    let (leaf, ca_file) = localhost_pki(&dir.0);
    let origin = TlsOrigin::start(&leaf);
    let extra_toml = format!(
        "[shop]\nupstreams = [\"https://localhost:{}\"]\nca_file = \"{}\"\n\
         host_header = \"www.shop.example\"\nhealth_check_path = \"/health\"\nhealth_check_interval_ms = 200\n",
        origin.port,
        ca_file.display()
    );
    let stack = Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await;
    let echo = stack
        .shop_echo(
            "/echo/who?x=1",
            &[
                ("Host", "client.example"),
                ("X-Forwarded-For", "192.0.2.1"),
                ("X-Real-IP", "192.0.2.2"),
            ],
        )
        .await;
    assert_eq!(echo["path"], "/echo/who?x=1");
    assert_eq!(echo["sni"], "localhost", "SNI is the origin's name");
    let h = &echo["headers"];
    assert_eq!(h["host"], "www.shop.example", "{h}");
    assert_eq!(h["x-forwarded-host"], "client.example", "{h}");
    assert_eq!(h["x-forwarded-proto"], "http", "{h}");
    // No trusted proxies: the client's own chain and X-Real-IP are dropped.
    assert_eq!(h["x-forwarded-for"], "127.0.0.1", "{h}");
    assert_eq!(h["x-real-ip"], "127.0.0.1", "{h}");

    // The health check is a GET of the path, over TLS, with the shop's Host.
    let checked = origin
        .seen()
        .into_iter()
        .find(|s| s.path == "/health")
        .expect("the origin got a health check");
    assert_eq!(
        (checked.host.as_str(), checked.sni.as_deref()),
        ("www.shop.example", Some("localhost"))
    );
    // A redirect is healthy; a 503 takes the only origin out (502), and it
    // comes back once it answers 2xx again.
    let (stack, origin) = (&stack, &origin);
    origin.health_status.store(302, Ordering::SeqCst);
    let before = origin.seen().len();
    assert!(
        eventually(Duration::from_secs(10), || async move {
            origin.seen()[before..].iter().any(|s| s.path == "/health")
        })
        .await
    );
    assert_eq!(get_status(stack, "/echo/a").await, 200);
    origin.health_status.store(503, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(10), || async move {
            get_status(stack, "/echo/b").await == 502
        })
        .await,
        "an origin failing its HTTP health check still got requests"
    );
    origin.health_status.store(204, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(10), || async move {
            get_status(stack, "/echo/c").await == 200
        })
        .await,
        "a recovered origin got no requests"
    );
    assert_eq!(origin.failed_handshakes.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_origin_whose_certificate_is_not_trusted_gets_no_request() {
    let dir = TempDir::new("origin-pki");
    let (leaf, _ca_file) = localhost_pki(&dir.0);
    let origin = TlsOrigin::start(&leaf);
    // No shop.ca_file: the system's roots do not know the test CA.
    let extra_toml = format!(
        "[shop]\nupstreams = [\"https://localhost:{}\"]\n",
        origin.port
    );
    let stack = Stack::start(StackOptions {
        extra_toml,
        ..StackOptions::default()
    })
    .await;
    assert_eq!(get_status(&stack, "/echo/who").await, 502);
    assert!(
        origin.failed_handshakes.load(Ordering::SeqCst) > 0,
        "the gateway did not try TLS"
    );
    assert!(
        origin.seen().is_empty(),
        "a request crossed an unverified connection"
    );
}

/// A plain HTTP origin on `ip:port` answering every request with its name
/// in `X-Upstream`.
fn named_origin(ip: [u8; 4], port: u16, name: &'static str) {
    let listener = TcpListener::bind(SocketAddr::from((ip, port))).unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Upstream: {name}\r\n\r\n{name}",
                            name.len()
                        );
                        if conn.write_all(resp.as_bytes()).is_err() {
                            return;
                        }
                    }
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
}

/// Which origin answered a shop request, if any did.
async fn answered_by(stack: &Stack) -> Option<String> {
    let r = stack.http.get(stack.url("/products/1")).send().await.ok()?;
    r.headers()
        .get("x-upstream")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_names_new_addresses_are_followed_without_a_restart_and_a_failed_lookup_keeps_the_last() {
    let port = free_port();
    named_origin([127, 0, 0, 1], port, "first");
    named_origin([127, 0, 0, 2], port, "second");
    let mut stack = Stack::start(StackOptions::default()).await;
    // The gateway again, in a mount namespace of its own whose /etc/hosts
    // is a file of the test's (bind-mounted, so rewritten in place it
    // changes what the name resolves to) and whose hosts lookups read only
    // that file.
    stack.kill_gateway();
    let hosts = stack.dir.0.join("hosts");
    let nsswitch = stack.dir.0.join("nsswitch.conf");
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.1 shop-origin.test\n").unwrap();
    std::fs::write(&nsswitch, "hosts: files\n").unwrap();
    stack.edit_config(|text| {
        format!(
            "{text}\n[shop]\nupstreams = [\"http://shop-origin.test:{port}\"]\nresolve_interval_ms = 200\n"
        )
    });
    let script = "mount --bind \"$0\" /etc/hosts && mount --bind \"$1\" /etc/nsswitch.conf && shift && exec \"$@\"";
    let (hosts_arg, nsswitch_arg) = (hosts.display().to_string(), nsswitch.display().to_string());
    let proc = spawn_wrapped(
        &stack.dir.0,
        &stack.config_path,
        &[
            "unshare",
            "--mount",
            "--",
            "sh",
            "-c",
            script,
            &hosts_arg,
            &nsswitch_arg,
        ],
        "flashgate",
        "flashgate",
        &["serve"],
    );
    stack.gateway = Some(proc);
    let stack = &stack;
    assert!(
        wait_port(stack.gateway_addr, Duration::from_secs(30))
            && wait_http_ready(stack.gateway_admin_addr, Duration::from_secs(30)),
        "gateway did not start:\n{}",
        stack.log("flashgate")
    );
    assert!(
        eventually(Duration::from_secs(10), || async move {
            answered_by(stack).await.as_deref() == Some("first")
        })
        .await,
        "{}",
        stack.log("flashgate")
    );
    // The name moves: the gateway follows, no restart.
    write_in_place(&hosts, "127.0.0.1 localhost\n127.0.0.2 shop-origin.test\n");
    assert!(
        eventually(Duration::from_secs(15), || async move {
            answered_by(stack).await.as_deref() == Some("second")
        })
        .await,
        "the gateway kept the old address:\n{}",
        stack.log("flashgate")
    );
    // The name stops resolving: counted, and the last good address serves on.
    write_in_place(&hosts, "127.0.0.1 localhost\n");
    assert!(
        eventually(Duration::from_secs(15), || async move {
            stack
                .gateway_metric("flashgate_shop_resolve_failures_total")
                .await
                >= 2.0
        })
        .await,
        "no failed lookup counted:\n{}",
        stack.log("flashgate")
    );
    for _ in 0..5 {
        assert_eq!(answered_by(stack).await.as_deref(), Some("second"));
    }
    assert!(stack
        .log("flashgate")
        .contains("keeping its last good addresses"));
}

/// Rewrites `path` keeping its inode (a bind mount follows the inode).
fn write_in_place(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}
