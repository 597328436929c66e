//! The shop's upstreams: round-robin over the healthy ones.
//!
//! `shop.upstreams` names origins (`host:port`, `http://host[:port]`,
//! `https://host[:port]`). Pingora's [`LoadBalancer`] holds the addresses
//! they resolve to; it runs as a background service (see `server`) that
//! resolves the names again each `shop.resolve_interval_ms` (`resolve`)
//! and checks every address each `shop.health_check_interval_ms`
//! (`health`). An upstream that fails a check gets no requests until it
//! passes one again. Connections to upstreams are kept alive and reused
//! from Pingora's connection pool.
//!
//! An `https://` origin is reached over TLS with the origin's name as SNI,
//! its certificate verified against that name and the system's roots, plus
//! those of `shop.ca_file` when set.
//!
//! With `shop.h2` the gateway speaks HTTP/2 to the shop: with prior
//! knowledge (h2c) to `http://` origins, by ALPN to `https://` ones, many
//! requests multiplexed on one connection; a WebSocket upgrade then cannot
//! be proxied (HTTP/2 has no `Upgrade`).
//!
//! Also here: what a proxied request and response must not carry across the
//! gateway (hop-by-hop headers, RFC 9110 §7.6.1), and the JSON answer when
//! the shop cannot be reached.

mod health;
mod resolve;

use std::sync::Arc;
use std::time::Duration;

use flashgate_common::config::{Origin, ShopConfig};
use openssl::x509::X509;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backends, LoadBalancer};
use pingora::upstreams::peer::HttpPeer;
use prometheus::IntCounter;
use serde_json::json;

use crate::edge::reply::Reply;
pub use health::default_host;
use health::ShopHealthCheck;
use resolve::{origin_of, OriginDiscovery};

/// Requests one HTTP/2 connection to the shop carries at once before
/// another is opened.
const H2_STREAMS_PER_CONNECTION: usize = 100;

/// Why the shop's upstreams cannot be set up (each names its key).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamsError {
    #[error("shop.upstreams: no upstream")]
    Empty,
    #[error(transparent)]
    CaFile(#[from] flashgate_common::ca_file::CaFileError),
}

/// The roots `https://` origins are verified against: `None` for the
/// system's (Pingora's connector loads them), else the system's and
/// `shop.ca_file`'s together (a peer's own list replaces the connector's).
#[derive(Clone, Default)]
pub struct Trust {
    pub extra_roots: Option<Arc<Box<[X509]>>>,
}

impl Trust {
    /// Reads `shop.ca_file`, when set.
    ///
    /// # Errors
    /// [`CaFileError`](flashgate_common::ca_file::CaFileError) naming `shop.ca_file`.
    pub fn load(config: &ShopConfig) -> Result<Self, UpstreamsError> {
        use flashgate_common::ca_file::{read_pem, system_roots, CaFileError};
        const KEY: &str = "shop.ca_file";
        let Some(path) = &config.ca_file else {
            return Ok(Self::default());
        };
        let pem = read_pem(KEY, path)?;
        let extra = X509::stack_from_pem(pem.as_bytes())
            .map_err(|e| CaFileError::not_pem(KEY, path, e.to_string()))?;
        if extra.is_empty() {
            return Err(CaFileError::no_certificate(KEY, path).into());
        }
        let mut roots = X509::stack_from_pem(system_roots()).unwrap_or_default();
        tracing::info!(
            certificates = extra.len(),
            "shop: trusting the CA certificates of shop.ca_file besides the system's"
        );
        roots.extend(extra);
        Ok(Self {
            extra_roots: Some(Arc::new(roots.into_boxed_slice())),
        })
    }
}

/// The shop's upstreams and how to reach them.
pub struct Upstreams {
    pub lb: Arc<LoadBalancer<RoundRobin>>,
    connect_timeout: Duration,
    read_timeout: Duration,
    /// `shop.h2`: HTTP/2 (h2c with prior knowledge, ALPN over TLS).
    h2: bool,
    trust: Trust,
}

impl Upstreams {
    /// A load balancer over `config.upstreams`, their names resolved once
    /// now (a name that does not resolve is logged and tried again each
    /// interval). It only resolves again and checks health once it runs
    /// as a background service.
    ///
    /// # Errors
    /// When the upstream list is empty or `shop.ca_file` cannot be used.
    pub fn new(config: &ShopConfig, resolve_failures: IntCounter) -> Result<Self, UpstreamsError> {
        if config.upstreams.is_empty() {
            return Err(UpstreamsError::Empty);
        }
        let trust = Trust::load(config)?;
        let discovery = OriginDiscovery::new(&config.upstreams, resolve_failures);
        let mut lb = LoadBalancer::<RoundRobin>::from_backends(Backends::new(Box::new(discovery)));
        let check_timeout = config.connect_timeout.min(Duration::from_secs(1));
        let check = match &config.health_check_path {
            Some(path) => ShopHealthCheck::http(
                &config.upstreams,
                path,
                &config.host_header,
                &trust,
                check_timeout,
            ),
            None => ShopHealthCheck::tcp(check_timeout),
        };
        lb.set_health_check(Box::new(check));
        lb.health_check_frequency = Some(config.health_check_interval);
        lb.update_frequency = Some(config.resolve_interval);
        lb.parallel_health_check = true;
        resolve_now(&lb);
        Ok(Self {
            lb: Arc::new(lb),
            connect_timeout: config.connect_timeout,
            read_timeout: config.read_timeout,
            h2: config.h2,
            trust,
        })
    }

    /// How many upstreams there are, healthy or not.
    pub fn len(&self) -> usize {
        self.lb.backends().get_backend().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next healthy upstream as a peer, and the origin it belongs to;
    /// `None` when none is healthy.
    pub fn peer(&self) -> Option<(HttpPeer, Arc<Origin>)> {
        let backend = self.lb.select(b"", 256)?;
        let origin = origin_of(&backend)?.clone();
        // SNI and the certificate's name are the origin's name (validation
        // refuses an https:// origin given as an IP address).
        let sni = if origin.tls() {
            origin.host.clone()
        } else {
            String::new()
        };
        let mut peer = HttpPeer::new(backend.addr, origin.tls(), sni);
        peer.options.connection_timeout = Some(self.connect_timeout);
        peer.options.read_timeout = Some(self.read_timeout);
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        peer.options.ca.clone_from(&self.trust.extra_roots);
        if self.h2 {
            // HTTP/2 only: over plain TCP Pingora then speaks h2c with
            // prior knowledge, over TLS it asks for h2 by ALPN; many
            // requests share one connection.
            peer.options.alpn = pingora::protocols::ALPN::H2;
            peer.options.max_h2_streams = H2_STREAMS_PER_CONNECTION;
        }
        Some((peer, origin))
    }
}

/// The first resolution, before anything listens: on a runtime of its own,
/// in a thread of its own (the caller may be inside another runtime).
fn resolve_now(lb: &LoadBalancer<RoundRobin>) {
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(rt) => {
                    if let Err(error) = rt.block_on(lb.update()) {
                        tracing::warn!(%error, "shop: the first resolution of shop.upstreams failed");
                    }
                    // A lookup past its timeout may still hold a blocking
                    // thread: leave it behind rather than wait for it.
                    rt.shutdown_background();
                }
                Err(error) => tracing::warn!(%error, "shop: no runtime to resolve shop.upstreams"),
            }
        });
    });
}

/// Hop-by-hop headers: they describe one connection and are never forwarded.
/// `Transfer-Encoding` is not listed: Pingora frames bodies itself and
/// rewrites it per connection.
pub const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
];

/// The headers to remove before forwarding: the hop-by-hop ones and those
/// named in `Connection`. An `Upgrade` (WebSocket) handshake keeps
/// `Connection` and `Upgrade`, which Pingora needs to switch protocols.
/// Allocates only when there is something to remove.
pub fn hop_by_hop(headers: &http::HeaderMap) -> Vec<http::HeaderName> {
    let connection_tokens = || {
        headers
            .get_all(http::header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
    };
    let upgrade = headers.contains_key(http::header::UPGRADE)
        && connection_tokens().any(|t| t.eq_ignore_ascii_case(b"upgrade"));
    let mut out = Vec::new();
    for name in connection_tokens().filter_map(|t| http::HeaderName::from_bytes(t).ok()) {
        let framing =
            name == http::header::TRANSFER_ENCODING || name == http::header::CONTENT_LENGTH;
        let kept = framing || (upgrade && name == http::header::UPGRADE);
        if !kept && headers.contains_key(&name) && !out.contains(&name) {
            out.push(name);
        }
    }
    for name in HOP_BY_HOP {
        if headers.contains_key(name)
            && !(upgrade && name == "connection")
            && !out.iter().any(|n| n == name)
        {
            out.push(http::HeaderName::from_static(name));
        }
    }
    if !upgrade
        && headers.contains_key(http::header::UPGRADE)
        && !out.contains(&http::header::UPGRADE)
    {
        out.push(http::header::UPGRADE);
    }
    out
}

/// Why a request to the shop failed, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShopFailure {
    /// No healthy upstream, refused or reset connection, bad response: 502.
    BadGateway,
    /// The shop did not connect or answer in time: 504.
    Timeout,
}

impl ShopFailure {
    pub fn classify(error: &pingora::Error) -> Self {
        use pingora::ErrorType::*;
        match error.etype() {
            ConnectTimedout | ReadTimedout | WriteTimedout => ShopFailure::Timeout,
            _ => ShopFailure::BadGateway,
        }
    }

    pub fn reply(self) -> Reply {
        match self {
            ShopFailure::BadGateway => {
                Reply::json(502, &json!({"code": "bad_gateway", "message": "the shop is unavailable, try again shortly"}))
                    .header(http::header::RETRY_AFTER, "1")
            }
            ShopFailure::Timeout => Reply::json(504, &json!({"code": "gateway_timeout", "message": "the shop did not answer in time"})),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut h = http::HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("proxy-authorization", "Basic x"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("x-kept", "yes"),
            ("content-length", "3"),
        ] {
            h.insert(k, v.parse().unwrap());
        }
        for name in hop_by_hop(&h) {
            h.remove(name);
        }
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-kept", "content-length"]);
    }

    #[test]
    fn a_websocket_upgrade_keeps_connection_and_upgrade() {
        let mut h = http::HeaderMap::new();
        h.insert("connection", "Upgrade".parse().unwrap());
        h.insert("upgrade", "websocket".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        for name in hop_by_hop(&h) {
            h.remove(name);
        }
        assert!(
            h.contains_key("connection")
                && h.contains_key("upgrade")
                && !h.contains_key("keep-alive")
        );
    }

    #[test]
    fn shop_failures_are_json_502_or_504() {
        let r = ShopFailure::BadGateway.reply();
        assert_eq!(r.status, 502);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["code"], "bad_gateway");
        assert_eq!(ShopFailure::Timeout.reply().status, 504);
        let e = pingora::Error::new(pingora::ErrorType::ConnectTimedout);
        assert_eq!(ShopFailure::classify(&e), ShopFailure::Timeout);
        let e = pingora::Error::new(pingora::ErrorType::ConnectRefused);
        assert_eq!(ShopFailure::classify(&e), ShopFailure::BadGateway);
    }
}
