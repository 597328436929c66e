//! `pingora_floor`: the least a Pingora server does to answer a page, for
//! comparison with Flashgate's page path (bench/README.md).
//!
//! One HTTP/1.1 service on Pingora's proxy framework (the one the gateway
//! runs on), with the gateway's allocator, answering every GET and HEAD
//! from `request_filter` with one file's bytes and the headers Flashgate
//! sends with its sale page: `Content-Type`, `Content-Length`, `ETag`,
//! `Last-Modified`, `Cache-Control`, `Vary` and a random 32-hex-digit
//! `X-Request-Id`, made as the gateway makes it. The
//! head is built once, without the map of names as written (as the
//! gateway's heads), and cloned per request; nothing else is done (no
//! routing, no metrics, no conditional requests).
//!
//! With `--no-work-stealing` and `--listeners N` it is the same floor under
//! Pingora's own server options: a runtime per thread and N SO_REUSEPORT
//! listeners on the one address. With `--tls-cert` and `--tls-key` it
//! listens with TLS instead (Pingora's `TlsSettings::intermediate`, HTTP/2
//! offered by ALPN, as the gateway's HTTPS listener): the floor of the
//! page over HTTPS. With `--status` other than 200 it answers every
//! request (any method, its body read first) with that
//! status, the file as the body, `--content-type` and the `--header`s
//! given (no validators or caching headers): the floor of a rejection.
//!
//!     pingora_floor --listen 127.0.0.1:8090 --page static/sale.html --threads 2

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use clap::Parser;
use pingora::http::ResponseHeader;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "pingora_floor",
    about = "Answers every GET with one file, as Flashgate's page path would"
)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: String,
    /// The file every GET is answered with.
    #[arg(long)]
    page: PathBuf,
    /// Pingora worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// The page's `Cache-Control` (Flashgate's `pages.page_max_age_seconds` default).
    #[arg(long, default_value = "public, max-age=10")]
    cache_control: String,
    /// Pingora's `work_stealing = false`: each thread a runtime of its own
    /// that keeps the connections it accepted.
    #[arg(long)]
    no_work_stealing: bool,
    /// Listening sockets on `--listen`, each with SO_REUSEPORT (the kernel
    /// spreads new connections over them), e.g. one per thread; 1: one
    /// plain listener, as the gateway has.
    #[arg(long, default_value_t = 1)]
    listeners: usize,
    /// The status of every answer; not 200: a rejection (see the module doc).
    #[arg(long, default_value_t = 200)]
    status: u16,
    #[arg(long, default_value = "text/html; charset=utf-8")]
    content_type: String,
    /// `Name: value`, added to every answer (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// PEM certificate chain: listen with TLS (with `--tls-key`).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<String>,
}

struct Floor {
    head: ResponseHeader,
    body: Bytes,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> pingora::Result<bool> {
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(60));
        }
        if self.head.status != http::StatusCode::OK {
            // A rejection answers buys: their bodies are read first, as the
            // gateway reads a buy's, so the connection is kept.
            while session.read_request_body().await?.is_some() {}
        }
        let mut head = Box::new(self.head.clone());
        head.append_header("X-Request-Id", format!("{:032x}", rand::random::<u128>()))?;
        let body_follows = session.req_header().method != http::Method::HEAD;
        session.write_response_header(head, !body_follows).await?;
        if body_follows {
            session
                .write_response_body(Some(self.body.clone()), true)
                .await?;
        }
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora::Result<Box<HttpPeer>> {
        pingora::Error::e_explain(
            pingora::ErrorType::ConnectNoRoute,
            "every request is answered in request_filter",
        )
    }
}

/// `n` spellings of one IPv4 `addr:port` (dotted, decimal, hex, octal,
/// `a.b`, `a.b.c`, as `inet_aton` reads them). Pingora keys its listening
/// sockets by the address text and reuses the socket of a text it has
/// bound already, so N SO_REUSEPORT sockets on one address need N texts.
fn listen_aliases(addr: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let sock: std::net::SocketAddrV4 = addr
        .parse()
        .map_err(|e| anyhow::anyhow!("--listeners needs an IPv4 --listen: {e}"))?;
    let ip = u32::from(*sock.ip());
    let [a, b, _, _] = sock.ip().octets();
    let port = sock.port();
    let forms = [
        sock.ip().to_string(),
        ip.to_string(),
        format!("{ip:#x}"),
        format!("0{ip:o}"),
        format!("{a}.{}", ip & 0x00ff_ffff),
        format!("{a}.{b}.{}", ip & 0xffff),
    ];
    anyhow::ensure!(
        n <= forms.len(),
        "--listeners: at most {} on one address",
        forms.len()
    );
    Ok(forms
        .into_iter()
        .take(n)
        .map(|f| format!("{f}:{port}"))
        .collect())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let body = Bytes::from(std::fs::read(&args.page)?);
    let modified = std::fs::metadata(&args.page)?
        .modified()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hash);
    let mut head = ResponseHeader::build_no_case(args.status, Some(6 + args.headers.len()))?;
    head.append_header("Content-Type", args.content_type.as_str())?;
    head.append_header("Content-Length", body.len().to_string())?;
    if args.status == 200 {
        head.append_header(
            "ETag",
            format!("\"{:016x}-{:x}\"", hash.finish(), body.len()),
        )?;
        head.append_header("Last-Modified", httpdate::fmt_http_date(modified))?;
        head.append_header("Cache-Control", args.cache_control.as_str())?;
        // Flashgate sends it with every compressible page (this one is).
        head.append_header("Vary", "Accept-Encoding")?;
    }
    for header in &args.headers {
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("--header {header:?}: expected `Name: value`"))?;
        head.append_header(name.trim().to_owned(), value.trim())?;
    }

    // SIGTERM stops it at once (the bench stops its processes so).
    let conf = ServerConf {
        threads: args.threads,
        work_stealing: !args.no_work_stealing,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service =
        pingora::proxy::http_proxy_service(&server.configuration, Floor { head, body });
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let mut settings = pingora::listeners::tls::TlsSettings::intermediate(cert, key)?;
        settings.enable_h2();
        service.add_tls_with_settings(&args.listen, None, settings);
    } else if args.listeners > 1 {
        for addr in listen_aliases(&args.listen, args.listeners)? {
            let mut options = pingora::listeners::TcpSocketOptions::default();
            options.so_reuseport = Some(true);
            service.add_tcp_with_settings(&addr, options);
        }
    } else {
        service.add_tcp(&args.listen);
    }
    server.add_service(service);
    server.run_forever()
}
