//! What the shop learns of the client: `X-Forwarded-For`,
//! `X-Forwarded-Proto`, `X-Forwarded-Host` and `X-Real-IP` (see
//! docs/OPERATIONS.md, "What the shop receives"). Every one is written by
//! the gateway, never passed through as the client sent it, since a shop
//! may log or trust them.
//!
//! `X-Forwarded-For` extends the chain that came with the request only when
//! the gateway believes that chain (the socket peer is one of
//! `limits.trusted_proxies` and `limits.client_ip_header` is
//! `x-forwarded-for`: the same rule that picks the client address);
//! otherwise it starts again at the peer, so a client cannot put addresses
//! of its choosing in front of its own. `X-Real-IP` is the client address
//! the gateway decided on (the one its limits and deny lists use). The
//! client's own `Forwarded` is removed: its `for=` would be unchecked; so
//! are the other headers frameworks read from a trusted proxy
//! ([`CLIENT_PROXY_HEADERS`]: scheme, port, prefix, host, client address,
//! URL and method overrides), which a client could otherwise set to make
//! the shop believe a scheme, host or address the gateway never saw.

use std::net::IpAddr;

use pingora::http::RequestHeader;

/// Headers a shop may trust from the proxy in front of it, which only the
/// gateway may set: removed from every request to the shop.
pub const CLIENT_PROXY_HEADERS: &[&str] = &[
    "forwarded",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-forwarded-server",
    "x-url-scheme",
    "front-end-https",
    "x-host",
    "x-original-url",
    "x-rewrite-url",
    "x-original-host",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "true-client-ip",
    "x-client-ip",
    "cf-connecting-ip",
    "x-cluster-client-ip",
];

/// What the gateway knows of the client of one request.
pub struct ClientView {
    /// The socket peer; `None` when it is not an IP socket.
    pub peer: Option<IpAddr>,
    /// The client address as the gateway determined it.
    pub client: IpAddr,
    /// The request's `X-Forwarded-For` is a believed chain to extend.
    pub chain_trusted: bool,
    /// The request came over TLS.
    pub tls: bool,
}

/// Replaces the forwarding headers of `upstream` (the request as the shop
/// will get it, `Host` still the client's).
///
/// # Errors
/// Only when Pingora refuses a header value (never for these).
pub fn apply(upstream: &mut RequestHeader, view: &ClientView) -> pingora::Result<()> {
    for name in CLIENT_PROXY_HEADERS {
        upstream.remove_header(*name);
    }
    let chain = view
        .chain_trusted
        .then(|| {
            let lines: Vec<&str> = upstream
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .collect();
            (!lines.is_empty()).then(|| lines.join(", "))
        })
        .flatten();
    upstream.remove_header("x-forwarded-for");
    if let Some(peer) = view.peer.map(|p| p.to_canonical()) {
        let xff = match chain {
            Some(prev) => format!("{prev}, {peer}"),
            None => peer.to_string(),
        };
        upstream.insert_header("X-Forwarded-For", xff)?;
    }
    upstream.insert_header("X-Forwarded-Proto", if view.tls { "https" } else { "http" })?;
    match upstream.headers.get(http::header::HOST).cloned() {
        Some(host) => upstream.insert_header("X-Forwarded-Host", host)?,
        None => {
            upstream.remove_header("x-forwarded-host");
        }
    }
    upstream.insert_header("X-Real-IP", view.client.to_canonical().to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("GET", b"/", None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn view(chain_trusted: bool) -> ClientView {
        ClientView {
            peer: Some("10.0.0.2".parse().unwrap()),
            client: "198.51.100.7".parse().unwrap(),
            chain_trusted,
            tls: true,
        }
    }

    fn get<'a>(r: &'a RequestHeader, name: &str) -> Option<&'a str> {
        r.headers.get(name).map(|v| v.to_str().unwrap())
    }

    #[test]
    fn a_trusted_proxys_chain_is_extended_and_the_rest_is_the_gateways() {
        let mut r = request(&[
            ("host", "shop.example"),
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "http"),
            ("x-real-ip", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4"),
        ]);
        apply(&mut r, &view(true)).unwrap();
        assert_eq!(
            get(&r, "x-forwarded-for"),
            Some("203.0.113.1, 198.51.100.7, 10.0.0.2")
        );
        assert_eq!(get(&r, "x-forwarded-proto"), Some("https"));
        assert_eq!(get(&r, "x-forwarded-host"), Some("shop.example"));
        assert_eq!(get(&r, "x-real-ip"), Some("198.51.100.7"));
        assert_eq!(get(&r, "forwarded"), None);
        assert_eq!(r.headers.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn an_untrusted_clients_chain_is_dropped_and_a_missing_host_names_none() {
        let mut r = request(&[
            ("x-forwarded-for", "192.0.2.1"),
            ("x-forwarded-host", "evil.example"),
        ]);
        apply(&mut r, &view(false)).unwrap();
        assert_eq!(get(&r, "x-forwarded-for"), Some("10.0.0.2"));
        assert_eq!(get(&r, "x-forwarded-host"), None);
    }

    #[test]
    fn headers_a_shop_trusts_from_its_proxy_never_pass_from_the_client() {
        let sent: Vec<(&str, &str)> = CLIENT_PROXY_HEADERS
            .iter()
            .map(|name| (*name, "spoofed"))
            .chain([("host", "shop.example"), ("cookie", "a=1")])
            .collect();
        let mut r = request(&sent);
        apply(&mut r, &view(true)).unwrap();
        for name in CLIENT_PROXY_HEADERS {
            assert_eq!(get(&r, name), None, "{name}");
        }
        assert_eq!(get(&r, "cookie"), Some("a=1"), "other headers pass");
    }
}
