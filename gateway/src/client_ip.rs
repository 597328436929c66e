//! The client's IP address, for limits and deny lists.
//!
//! The socket peer is the client, unless the peer is one of the configured
//! `limits.trusted_proxies`: only then are `Forwarded` (RFC 7239) or
//! `X-Forwarded-For` believed, walking from the nearest hop outwards and
//! stopping at the first address that is not itself a trusted proxy. A
//! client can therefore never choose its own limiter key by sending a
//! forged header straight to the gateway.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// Decides the client address of a request that arrived from `peer`.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops = forwarded_for(headers);
    // Nearest hop last: walk back past our own proxies.
    let mut client = peer;
    for ip in hops.into_iter().rev() {
        client = ip;
        if !is_trusted(&ip) {
            break;
        }
    }
    client
}

/// The addresses of `Forwarded: for=` if present, else of `X-Forwarded-For`,
/// in header order. Unparseable entries (obfuscated ids, "unknown") end the
/// list, since nothing before them can be trusted either.
fn forwarded_for(headers: &HeaderMap) -> Vec<IpAddr> {
    let forwarded: Vec<&str> = headers.get_all("forwarded").iter().filter_map(|v| v.to_str().ok()).collect();
    let mut out = Vec::new();
    if !forwarded.is_empty() {
        for element in forwarded.iter().flat_map(|v| v.split(',')) {
            let Some(value) = element.split(';').find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                k.eq_ignore_ascii_case("for").then_some(v)
            }) else {
                continue;
            };
            match parse_node(value.trim_matches('"')) {
                Some(ip) => out.push(ip),
                None => out.clear(),
            }
        }
        return out;
    }
    for v in headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()) {
        for part in v.split(',') {
            match parse_node(part.trim()) {
                Some(ip) => out.push(ip),
                None => out.clear(),
            }
        }
    }
    out
}

/// `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]`, `[2001:db8::1]:4711` or a bare IPv6.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    s.rsplit_once(':').and_then(|(ip, _port)| ip.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn nets() -> Vec<IpNet> {
        vec!["10.0.0.0/8".parse().unwrap()]
    }

    #[test]
    fn an_untrusted_peer_cannot_spoof_its_address() {
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(client_ip("203.0.113.9".parse().unwrap(), &h, &nets()), "203.0.113.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_trusted_proxy_is_believed_up_to_the_first_untrusted_hop() {
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.1.1")]);
        assert_eq!(client_ip("10.0.0.2".parse().unwrap(), &h, &nets()), "198.51.100.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn forwarded_header_wins_and_ports_and_brackets_are_stripped() {
        let h = headers(&[("forwarded", "for=\"[2001:db8::7]:4711\";proto=https"), ("x-forwarded-for", "9.9.9.9")]);
        assert_eq!(client_ip("10.0.0.2".parse().unwrap(), &h, &nets()), "2001:db8::7".parse::<IpAddr>().unwrap());
        let h = headers(&[("forwarded", "for=192.0.2.60:80")]);
        assert_eq!(client_ip("10.0.0.2".parse().unwrap(), &h, &nets()), "192.0.2.60".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_trusted_peer_without_headers_is_the_client() {
        assert_eq!(client_ip("10.0.0.2".parse().unwrap(), &HeaderMap::new(), &nets()), "10.0.0.2".parse::<IpAddr>().unwrap());
    }
}
