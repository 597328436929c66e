//! TLS and HTTP/2 at the edge, against a real stack: certificates made by
//! the test's own CA (`flashgate_tests::pki`), curl over HTTP/2 and
//! HTTP/1.1, OpenSSL and hyper clients for what curl cannot hold open, and
//! an HTTP/2-only shop (hyper) behind `[shop] h2 = true`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::X509;
use serde_json::Value;

use flashgate_tests::pki::{write_replacing, Leaf, TestCa};
use flashgate_tests::{bin, free_port, token, Stack, StackOptions, TempDir, JWT_SECRET};

/// The test's PKI on disk: a root, the default certificate (for
/// 127.0.0.1 / localhost, no SNI), `a.test` signed by the root and
/// `b.test` signed by an intermediate (so its file is a real chain).
struct Certs {
    dir: TempDir,
    ca: TestCa,
}

impl Certs {
    fn new() -> Self {
        let certs = Self {
            dir: TempDir::new("tls"),
            ca: TestCa::root("Flashgate Test Root"),
        };
        write_replacing(&certs.path("ca.pem"), &certs.ca.pem());
        certs
            .ca
            .leaf("default.test", &["localhost"], &["127.0.0.1"])
            .write(&certs.path("default.pem"), &certs.path("default.key"));
        certs
            .ca
            .leaf("a.test", &["a.test"], &[])
            .write(&certs.path("a.pem"), &certs.path("a.key"));
        certs
            .ca
            .intermediate("Flashgate Test Intermediate")
            .leaf("b.test", &["b.test", "*.b.test"], &[])
            .write(&certs.path("b.pem"), &certs.path("b.key"));
        certs
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// `[gateway.tls]` on `port` with the three certificates.
    fn toml(&self, port: u16, extra: &str) -> String {
        let p = |n: &str| self.path(n).display().to_string();
        format!(
            "[gateway.tls]\nlisten = \"127.0.0.1:{port}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\nreload_interval_ms = 200\n{extra}\n\
             [[gateway.tls.certificates]]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
             [[gateway.tls.certificates]]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            p("default.pem"),
            p("default.key"),
            p("a.pem"),
            p("a.key"),
            p("b.pem"),
            p("b.key"),
        )
    }
}

/// A stack with the HTTPS listener on; `tls_extra` goes into `[gateway.tls]`,
/// `extra` after it.
async fn tls_stack(certs: &Certs, tls_extra: &str, extra: &str) -> (Stack, u16) {
    let port = free_port();
    let opts = StackOptions {
        extra_toml: format!("{}\n{extra}", certs.toml(port, tls_extra)),
        ..StackOptions::default()
    };
    let stack = Stack::start(opts).await;
    assert!(
        flashgate_tests::wait_port(([127, 0, 0, 1], port).into(), Duration::from_secs(10)),
        "HTTPS listener:\n{}",
        stack.log("flashgate")
    );
    (stack, port)
}

/// What one curl call saw.
struct Curl {
    ok: bool,
    /// `%{http_code} %{http_version}` then the body.
    status: u16,
    version: String,
    body: String,
    /// The verbose log (handshake, certificate subject, ALPN).
    log: String,
}

impl Curl {
    /// The common name of the certificate the server presented.
    fn subject_cn(&self) -> Option<&str> {
        let line = self
            .log
            .lines()
            .find(|l| l.trim_start_matches(['*', ' ']).starts_with("subject:"))?;
        line.split("CN=")
            .nth(1)
            .map(|cn| cn.split([',', '/']).next().unwrap_or(cn).trim())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// curl `url` over HTTPS trusting only the test root, with `host` resolved
/// to loopback; `args` choose the protocol and anything else.
fn curl(certs: &Certs, host: &str, port: u16, path: &str, args: &[&str]) -> Curl {
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "10", "--cacert"])
        .arg(certs.path("ca.pem"))
        .args([
            "--resolve",
            &format!("{host}:{port}:127.0.0.1"),
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .args(args)
        .arg(format!("https://{host}:{port}{path}"))
        .output()
        .expect("curl on PATH (deploy/local/install-deps.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let (status, version) = tail.split_once(' ').unwrap_or(("0", ""));
    Curl {
        ok: out.status.success(),
        status: status.parse().unwrap_or(0),
        version: version.to_owned(),
        body: body.to_owned(),
        log: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_http2_or_http1_and_the_certificate_of_each_sni_name() {
    let certs = Certs::new();
    let (stack, port) = tls_stack(&certs, "", "").await;
    stack.open_sale("tls-sale", 5, 1).await;

    for (host, cn) in [
        ("a.test", "a.test"),
        ("b.test", "b.test"),
        ("shop.b.test", "b.test"),
        ("localhost", "default.test"),
    ] {
        for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
            let r = curl(&certs, host, port, "/flashgate/api/sales/tls-sale", &[flag]);
            assert!(
                r.ok && r.status == 200,
                "{host} {flag}: {} {}\n{}",
                r.status,
                r.body,
                r.log
            );
            assert_eq!(r.version, version, "{host} {flag}: negotiated protocol");
            assert_eq!(
                r.subject_cn(),
                Some(cn),
                "{host} {flag}: certificate chosen\n{}",
                r.log
            );
            assert_eq!(r.json()["remaining"], 5);
        }
    }
    // ALPN is what chose HTTP/2, not prior knowledge.
    let r = curl(
        &certs,
        "a.test",
        port,
        "/flashgate/static/sale.css",
        &["--http2"],
    );
    assert!(
        r.log.contains("ALPN: server accepted h2")
            || r.log.contains("ALPN, server accepted to use h2"),
        "{}",
        r.log
    );
    // A name no certificate covers gets the default one, which curl then
    // refuses for that name: the gateway never picks a certificate by guess.
    let r = curl(&certs, "other.test", port, "/", &["--http2"]);
    assert!(!r.ok, "other.test must not verify");
    assert!(r.log.contains("CN=default.test"), "{}", r.log);
    // A buy over HTTP/2 works like one over plain HTTP.
    let auth = format!("Authorization: Bearer {}", token("tls-buyer"));
    let r = curl(
        &certs,
        "a.test",
        port,
        "/flashgate/api/sales/tls-sale/buy",
        &[
            "--http2",
            "-X",
            "POST",
            "-H",
            &auth,
            "-H",
            "Idempotency-Key: tls-k1",
        ],
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.json()["status"], "queued");
}

/// An HTTP/2 connection over TLS to `port` with SNI `host`, trusting the
/// test root; the request sender and the common name of the certificate.
async fn h2_connection(
    certs: &Certs,
    host: &str,
    port: u16,
) -> (
    hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    String,
) {
    let (sender, cn, _conn) = h2_connect(certs, host, port).await;
    (sender, cn)
}

/// [`h2_connection`] with requests of body `B`, and the task driving the
/// connection (it ends when the connection closes).
async fn h2_connect<B>(
    certs: &Certs,
    host: &str,
    port: u16,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    String,
    tokio::task::JoinHandle<hyper::Result<()>>,
)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(certs.path("ca.pem")).unwrap();
    b.set_alpn_protos(b"\x02h2").unwrap();
    let ssl = b.build().configure().unwrap().into_ssl(host).unwrap();
    let mut stream = tokio_openssl::SslStream::new(ssl, tcp).unwrap();
    Pin::new(&mut stream).connect().await.unwrap();
    assert_eq!(stream.ssl().selected_alpn_protocol(), Some(&b"h2"[..]));
    let cn = common_name(&stream.ssl().peer_certificate().unwrap());
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    (sender, cn, tokio::spawn(conn))
}

fn common_name(cert: &X509) -> String {
    let entry = cert
        .subject_name()
        .entries_by_nid(openssl::nid::Nid::COMMONNAME)
        .next()
        .unwrap();
    entry.data().to_string().unwrap()
}

async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    url: &str,
) -> (u16, String) {
    let req = http::Request::get(url).body(Empty::new()).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("answer in time")
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The common name new handshakes for `host` get, polled until it is
/// `want` or 10 s pass; the last one seen.
async fn wait_for_cn(certs: &Certs, host: &str, port: u16, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, cn) = h2_connection(certs, host, port).await;
        if cn == want || Instant::now() > deadline {
            return cn;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the gateway's metric line starting with `series ` (0 when absent).
async fn metric(stack: &Stack, series: &str) -> i64 {
    let text = stack.gateway_metrics_text().await;
    let needle = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as i64)
}

async fn tls_reloads(stack: &Stack, result: &str) -> i64 {
    metric(
        stack,
        &format!("flashgate_tls_reloads_total{{result=\"{result}\"}}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_certificate_serves_new_handshakes_while_an_open_http2_connection_keeps_working(
) {
    let certs = Certs::new();
    let (stack, port) = tls_stack(&certs, "", "").await;
    stack.open_sale("reload-sale", 5, 1).await;
    let url = format!("https://a.test:{port}/flashgate/api/sales/reload-sale");

    let (mut open, cn) = h2_connection(&certs, "a.test", port).await;
    assert_eq!(cn, "a.test");
    // The test's certificates expire a day from now.
    let expiry = metric(&stack, "flashgate_tls_certificate_expiry_timestamp_seconds").await;
    let now = flashgate_common::now_ms() / 1000;
    assert!(
        (now + 23 * 3600..now + 25 * 3600).contains(&expiry),
        "expiry gauge {expiry}, now {now}"
    );
    assert_eq!(h2_get(&mut open, &url).await.0, 200);

    // Rotation: a new certificate for the same name (another CN, to tell them apart).
    certs
        .ca
        .leaf("a.test rotated", &["a.test"], &[])
        .write(&certs.path("a.pem"), &certs.path("a.key"));
    assert_eq!(
        wait_for_cn(&certs, "a.test", port, "a.test rotated").await,
        "a.test rotated",
        "new handshakes get the new certificate"
    );
    let (status, body) = h2_get(&mut open, &url).await;
    assert_eq!(
        status, 200,
        "the connection opened before the reload still serves: {body}"
    );
    assert!(tls_reloads(&stack, "ok").await >= 1);

    // A broken rotation (a key that is not the certificate's) keeps the
    // running certificate, and is logged and counted once. The rotation
    // above writes two files, so a check between them may already have
    // counted an error: only the rise from here is this rotation's.
    assert_eq!(
        metric(&stack, "flashgate_tls_reload_failing").await,
        0,
        "the rotation completed"
    );
    let errors_before = tls_reloads(&stack, "error").await;
    let other: Leaf = certs.ca.leaf("a.test broken", &["a.test"], &[]);
    write_replacing(&certs.path("a.pem"), &other.cert_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tls_reloads(&stack, "error").await == errors_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let errors = tls_reloads(&stack, "error").await;
    assert!(errors > errors_before, "the failed reload is counted");
    assert_eq!(
        metric(&stack, "flashgate_tls_reload_failing").await,
        1,
        "and flagged"
    );
    // Three more checks of the same files.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        tls_reloads(&stack, "error").await,
        errors,
        "and counted once, not at every check"
    );
    assert_eq!(
        metric(&stack, "flashgate_tls_reload_failing").await,
        1,
        "still flagged"
    );
    assert_eq!(
        h2_connection(&certs, "a.test", port).await.1,
        "a.test rotated",
        "the running certificate stays"
    );
    assert!(
        stack
            .log("flashgate")
            .contains("gateway.tls.certificates[0].key_file: the key in"),
        "the log names the key"
    );
    assert_eq!(h2_get(&mut open, &url).await.0, 200);

    // Fixing the key completes the rotation.
    write_replacing(&certs.path("a.key"), &other.key_pem);
    assert_eq!(
        wait_for_cn(&certs, "a.test", port, "a.test broken").await,
        "a.test broken"
    );
    assert_eq!(
        metric(&stack, "flashgate_tls_reload_failing").await,
        0,
        "no longer flagged"
    );
    assert_eq!(h2_get(&mut open, &url).await.0, 200);
}

/// A request body sent as the test feeds it, piece by piece.
struct Trickle(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_an_idle_connection_is_closed_and_a_trickled_buy_body_is_cut_off() {
    let certs = Certs::new();
    let (mut stack, port) = tls_stack(&certs, "", "").await;
    stack.open_sale("trickle-sale", 5, 1).await;
    stack.kill_gateway();
    stack.edit_config(|text| {
        assert_eq!(text.matches("threads = 2\n").count(), 1);
        text.replace(
            "threads = 2\n",
            "threads = 2\nkeepalive_seconds = 1\nbody_read_timeout_ms = 1000\n",
        )
    });
    stack.start_gateway();
    assert!(flashgate_tests::wait_port(
        ([127, 0, 0, 1], port).into(),
        Duration::from_secs(10)
    ));

    // A buy whose body comes a byte every 200 ms, each well within the
    // per-read timeout, and never ends: the gateway answers anyway.
    let (mut sender, _, _conn) = h2_connect::<Trickle>(&certs, "a.test", port).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let feeder = tokio::spawn(async move {
        while tx.send(Bytes::from_static(b" ")).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let req = http::Request::post(format!(
        "https://a.test:{port}/flashgate/api/sales/trickle-sale/buy"
    ))
    .header("authorization", format!("Bearer {}", token("trickler")))
    .header("idempotency-key", "trickle-k1")
    .body(Trickle(rx))
    .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(15), sender.send_request(req))
        .await
        .expect("an answer while the body still trickles")
        .unwrap();
    feeder.abort();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["code"], "bad_request", "{body}");
    assert_eq!(
        body["message"], "request body not received in time",
        "{body}"
    );
    let (_, sale) =
        flashgate_tests::get_json(&stack.http, &stack.url("/flashgate/api/sales/trickle-sale"))
            .await;
    assert_eq!(sale["remaining"], 5, "nothing was bought");

    // An HTTP/2 connection left idle after a request is closed by the gateway.
    let (mut idle, _, conn) = h2_connect::<Empty<Bytes>>(&certs, "a.test", port).await;
    assert_eq!(
        h2_get(
            &mut idle,
            &format!("https://a.test:{port}/flashgate/api/sales/trickle-sale")
        )
        .await
        .0,
        200
    );
    let closed = tokio::time::timeout(Duration::from_secs(15), conn).await;
    assert!(closed.is_ok(), "the idle HTTP/2 connection is still open");
}

/// A TLS handshake with a client willing to go down to TLS 1.0 but no
/// higher than `max`; the version agreed, or the error.
fn handshake_up_to(port: u16, max: SslVersion) -> Result<String, String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    // Debian's OpenSSL refuses TLS 1.1 itself at its default level: lower
    // it, so only the server can refuse.
    b.set_security_level(0);
    b.set_cipher_list("ALL:@SECLEVEL=0").unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1)).unwrap();
    b.set_max_proto_version(Some(max)).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    match b.build().connect("a.test", tcp) {
        Ok(s) => Ok(s.ssl().version_str().to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_1_is_refused_and_tls_1_2_accepted() {
    let certs = Certs::new();
    let (_stack, port) = tls_stack(&certs, "", "").await;
    let old = tokio::task::spawn_blocking(move || handshake_up_to(port, SslVersion::TLS1_1))
        .await
        .unwrap();
    let err = old.expect_err("a TLS 1.1 handshake must fail");
    assert!(
        err.contains("protocol version"),
        "the server refuses the version (alert protocol_version): {err}"
    );
    let v12 = tokio::task::spawn_blocking(move || handshake_up_to(port, SslVersion::TLS1_2))
        .await
        .unwrap();
    assert_eq!(v12.as_deref(), Ok("TLSv1.2"));
    let r = curl(
        &certs,
        "a.test",
        port,
        "/",
        &["--tlsv1.3", "-o", "/dev/null"],
    );
    assert!(r.log.contains("TLSv1.3"), "{}", r.log);
}

/// The key exchange group a handshake agreed on, by name.
fn agreed_group(ssl: &openssl::ssl::SslRef) -> String {
    let key = ssl.peer_tmp_key().expect("an ephemeral key exchange");
    match key.id() {
        openssl::pkey::Id::X25519 => "X25519".into(),
        openssl::pkey::Id::X448 => "X448".into(),
        openssl::pkey::Id::EC => match key.ec_key().unwrap().group().curve_name() {
            Some(openssl::nid::Nid::X9_62_PRIME256V1) => "P-256".into(),
            Some(openssl::nid::Nid::SECP384R1) => "P-384".into(),
            Some(openssl::nid::Nid::SECP521R1) => "P-521".into(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// A handshake at exactly `version` by a client offering the key exchange
/// groups `groups` (in its order of preference, which the server follows)
/// and, in TLS 1.2, only ECDHE suites, so no other key exchange can stand
/// in; the group agreed, or the error.
fn handshake_offering(port: u16, version: SslVersion, groups: &str) -> Result<String, String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_groups_list(groups).unwrap();
    b.set_min_proto_version(Some(version)).unwrap();
    b.set_max_proto_version(Some(version)).unwrap();
    if version == SslVersion::TLS1_2 {
        b.set_cipher_list("ECDHE").unwrap();
    }
    b.set_verify(SslVerifyMode::NONE);
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    b.build()
        .connect("a.test", tcp)
        .map(|s| agreed_group(s.ssl()))
        .map_err(|e| e.to_string())
}

/// Mozilla's intermediate profile: key exchange over X25519, P-256 or
/// P-384 only; X448, P-521 and the finite-field groups that OpenSSL
/// offers by default are refused. In TLS 1.3 a client offering only a
/// refused group fails its handshake. In TLS 1.2 the one list also names
/// the curves the certificate's signature may use, so the client offers
/// P-256 (the test certificates' curve) after the group tried: the server
/// takes the client's first group it accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_exchange_groups_are_those_of_mozillas_intermediate_profile() {
    let certs = Certs::new();
    let (_stack, port) = tls_stack(&certs, "", "").await;
    let offer = |version: SslVersion, groups: String| {
        tokio::task::spawn_blocking(move || handshake_offering(port, version, &groups))
    };
    for group in ["X25519", "P-256", "P-384"] {
        assert_eq!(
            offer(SslVersion::TLS1_3, group.into())
                .await
                .unwrap()
                .as_deref(),
            Ok(group),
            "TLS 1.3"
        );
        let groups = if group == "P-256" {
            group.to_owned()
        } else {
            format!("{group}:P-256")
        };
        assert_eq!(
            offer(SslVersion::TLS1_2, groups).await.unwrap().as_deref(),
            Ok(group),
            "TLS 1.2"
        );
    }
    for group in ["X448", "P-521", "ffdhe2048"] {
        let got = offer(SslVersion::TLS1_3, group.into()).await.unwrap();
        assert!(got.is_err(), "{group} over TLS 1.3 was accepted: {got:?}");
    }
    for group in ["X448", "P-521"] {
        let got = offer(SslVersion::TLS1_2, format!("{group}:P-256"))
            .await
            .unwrap();
        assert_eq!(
            got.as_deref(),
            Ok("P-256"),
            "{group} offered first over TLS 1.2"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redirect_http_pages_move_to_https_the_api_stays_and_the_shop_hears_https() {
    let certs = Certs::new();
    // Behind a load balancer the public HTTPS port (443, left out of URLs)
    // is not the listener's.
    let (stack, port) = tls_stack(&certs, "redirect_http = true\nredirect_port = 443", "").await;
    stack.open_sale("redir-sale", 5, 1).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    for path in [
        "/flashgate/sales/redir-sale",
        "/flashgate/static/sale.css",
        "/echo/page?q=1",
        "/",
    ] {
        let resp = http.get(stack.url(path)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 308, "GET {path}");
        let location = resp.headers()["location"].to_str().unwrap().to_owned();
        assert_eq!(location, format!("https://127.0.0.1{path}"), "GET {path}");
        let head = http.head(stack.url(path)).send().await.unwrap();
        assert_eq!(head.status().as_u16(), 308, "HEAD {path}");
    }
    // Names the certificates cover (SAN, wildcard, with the root dot) are
    // redirected to; a Host that is not a name, or one no certificate
    // covers, gets a JSON 400 and no Location built from it.
    for (host, want) in [
        ("a.test:8080", "https://a.test/s/x"),
        ("shop.b.test", "https://shop.b.test/s/x"),
        ("A.test.", "https://a.test/s/x"),
    ] {
        let resp = http
            .get(stack.url("/s/x"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 308, "Host {host}");
        assert_eq!(resp.headers()["location"], want, "Host {host}");
    }
    for host in ["evil.example/x", "evil.example", "b.b.b.test", "10.0.0.1"] {
        let resp = http
            .get(stack.url("/flashgate/sales/redir-sale"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "Host {host}");
        assert!(resp.headers().get("location").is_none(), "Host {host}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "bad_request", "Host {host}");
    }

    // The API keeps answering on plain HTTP, reads and buys alike; a POST to
    // the shop is not redirected either.
    let (status, sale) =
        flashgate_tests::get_json(&http, &stack.url("/flashgate/api/sales/redir-sale")).await;
    assert_eq!((status, sale["remaining"].as_i64()), (200, Some(5)));
    let (status, _) = stack
        .buy("redir-sale", "plain-buyer", Some("plain-k1"))
        .await;
    assert_eq!(status, 202);
    let resp = http
        .post(stack.url("/echo/form"))
        .body("x=1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let echoed: Value = resp.json().await.unwrap();
    assert_eq!(echoed["headers"]["x-forwarded-proto"], "http");

    // Over HTTPS the same pages are served, and the shop is told https
    // (whatever the client claimed).
    let r = curl(
        &certs,
        "a.test",
        port,
        "/echo/page",
        &["--http2", "-H", "X-Forwarded-Proto: http"],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["headers"]["x-forwarded-proto"], "https");
    let r = curl(
        &certs,
        "a.test",
        port,
        "/flashgate/sales/redir-sale",
        &["--http2"],
    );
    assert_eq!(r.status, 200);
    assert!(r.body.contains("<html"), "the sale page itself");
}

/// An HTTP/2-only server (no HTTP/1.1 at all) on loopback, answering every
/// request with its version, path and X-Forwarded-Proto as JSON.
async fn h2_only_shop() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let proto = req
                            .headers()
                            .get("x-forwarded-proto")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let (version, path) =
                            (format!("{:?}", req.version()), req.uri().path().to_owned());
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes().len())
                            .unwrap_or(0);
                        let json = serde_json::json!({ "version": version, "path": path, "proto": proto, "body_bytes": body });
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                            json.to_string(),
                        ))))
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shop_h2_speaks_http2_to_an_http2_only_shop_and_large_bodies_cross_https_whole() {
    let shop = h2_only_shop().await;
    let certs = Certs::new();
    let (stack, port) = tls_stack(
        &certs,
        "",
        &format!("[shop]\nupstreams = [\"{shop}\"]\nh2 = true\n"),
    )
    .await;

    // A plain HTTP/1.1 client: the gateway still speaks HTTP/2 upstream.
    for i in 0..5 {
        let resp = stack
            .http
            .post(stack.url(&format!("/catalog/{i}")))
            .body(vec![b'x'; 70_000])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["version"], "HTTP/2.0");
        assert_eq!(v["path"], format!("/catalog/{i}"));
        assert_eq!(v["body_bytes"], 70_000, "the body crosses whole");
        assert_eq!(v["proto"], "http");
    }
    // HTTP/2 on both sides.
    let r = curl(&certs, "a.test", port, "/catalog/h2", &["--http2"]);
    assert_eq!((r.status, r.version.as_str()), (200, "2"), "{}", r.body);
    assert_eq!(r.json()["version"], "HTTP/2.0");
    assert_eq!(r.json()["proto"], "https");
    // A body of several reads of the listener's read buffer (17 KiB) crosses
    // whole over HTTPS as well, by either protocol.
    let body = certs.path("body.bin");
    std::fs::write(&body, vec![b'y'; 70_000]).unwrap();
    let data = format!("@{}", body.display());
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let r = curl(
            &certs,
            "a.test",
            port,
            "/catalog/upload",
            &[flag, "--data-binary", &data],
        );
        assert_eq!((r.status, r.version.as_str()), (200, version), "{}", r.body);
        assert_eq!(
            r.json()["body_bytes"],
            70_000,
            "the body crosses whole over {flag}"
        );
    }
}

/// Runs `flashgate check` on a config of `[gateway.tls]` `body`.
fn check(dir: &Path, body: &str) -> (bool, String) {
    let config = dir.join("check.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nstatic_dir = \"{}/../static\"\n{body}",
            env!("CARGO_MANIFEST_DIR")
        ),
    )
    .unwrap();
    let out = Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&config)
        .arg("check")
        .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn bad_certificate_files_stop_the_start_naming_their_key() {
    let certs = Certs::new();
    let p = |n: &str| certs.path(n).display().to_string();
    let good = format!(
        "[gateway.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        p("default.pem"),
        p("default.key")
    );
    let (ok, out) = check(&certs.dir.0, &good);
    assert!(ok, "{out}");
    assert!(out.contains("gateway.tls: ok"), "{out}");

    let cases = [
        (
            format!(
                "{good}[[gateway.tls.certificates]]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
                p("a.pem"),
                p("b.key")
            ),
            "gateway.tls.certificates[0].key_file: the key in",
        ),
        (
            format!(
                "[gateway.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
                p("missing.pem"),
                p("default.key")
            ),
            "gateway.tls.cert_file: cannot read",
        ),
        (
            format!(
                "[gateway.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
                p("default.pem"),
                p("ca.pem")
            ),
            "gateway.tls.key_file:",
        ),
        (
            format!("[gateway.tls]\nkey_file = \"{}\"\n", p("default.key")),
            "gateway.tls.key_file: needs gateway.tls.cert_file",
        ),
        (
            "[gateway.tls]\nredirect_http = true\n".to_owned(),
            "gateway.tls.redirect_http: needs gateway.tls.cert_file",
        ),
    ];
    for (body, want) in cases {
        let (ok, out) = check(&certs.dir.0, &body);
        assert!(!ok && out.contains(want), "want `{want}`:\n{out}");
    }

    // The gateway itself refuses to start on such a file, with the same message.
    let config = certs.dir.0.join("serve.toml");
    let runtime = certs.dir.0.join("run");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\nruntime_dir = \"{}\"\nstatic_dir = \"{}/../static\"\n\
             [gateway.tls]\nlisten = \"127.0.0.1:{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            free_port(),
            free_port(),
            runtime.display(),
            env!("CARGO_MANIFEST_DIR"),
            free_port(),
            p("a.pem"),
            p("b.key")
        ),
    )
    .unwrap();
    let out = Command::new(bin("flashgate"))
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .env("FLASHGATE_JWT_SECRET", JWT_SECRET)
        .env("FLASHGATE_INTERNAL_TOKEN", flashgate_tests::INTERNAL_TOKEN)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("gateway.tls.key_file: the key in"),
        "{stderr}"
    );
}
