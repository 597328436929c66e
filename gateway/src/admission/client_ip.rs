//! The client's IP address, for limits and deny lists.
//!
//! The socket peer is the client, unless the peer is one of the configured
//! `limits.trusted_proxies`: only then is the one header named by
//! `limits.client_ip_header` believed (`X-Forwarded-For` by default, or
//! `Forwarded`, RFC 7239), walking from the nearest hop outwards and
//! stopping at the first address that is not itself a trusted proxy.
//! Several lines of the header are one comma list, in order. An entry that
//! names no address (garbage, `unknown`, bytes that are not UTF-8, a
//! `Forwarded` element without `for=`) stops the walk: the client is then
//! the nearest hop to its right, or the peer, never anything to its left. A
//! client can therefore never choose its own limiter key by sending a
//! forged header straight to the gateway, nor through a proxy that appends
//! to one header and passes the other through unchanged.
//!
//! Every address is canonicalised first: an IPv4 client on a dual-stack
//! listener arrives as `::ffff:a.b.c.d` and is treated as `a.b.c.d`, so it
//! gets its own bucket and IPv4 CIDRs match it.

use std::net::IpAddr;

use flashgate_common::config::ClientIpHeader;
use http::HeaderMap;
use ipnet::IpNet;

/// Decides the client address of a request that arrived from `peer`.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
    header: ClientIpHeader,
) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops = match header {
        ClientIpHeader::XForwardedFor => x_forwarded_for(headers),
        ClientIpHeader::Forwarded => forwarded_for(headers),
    };
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

/// The entries of every line of header `name`, in order, as one comma
/// list (RFC 9110 section 5.3). Split on raw bytes: a line that is not
/// UTF-8 still yields its other entries, so a client's garbage cannot hide
/// the hops a trusted proxy appended after it.
fn entries<'a>(headers: &'a HeaderMap, name: &'static str) -> impl Iterator<Item = &'a [u8]> {
    headers
        .get_all(name)
        .into_iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
}

/// The addresses of `Forwarded: for=`, in header order. An element that
/// names no address (no `for=`, an obfuscated id, "unknown", bytes that are
/// not UTF-8) ends the list: nothing before it can be trusted either, so the
/// walk stops at the nearest hop to its right, or at the peer.
fn forwarded_for(headers: &HeaderMap) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for element in entries(headers, "forwarded") {
        let node = std::str::from_utf8(element).ok().and_then(|element| {
            let value = element.split(';').find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then_some(v)
            })?;
            parse_node(value.trim().trim_matches('"'))
        });
        match node {
            Some(ip) => out.push(ip),
            None => out.clear(),
        }
    }
    out
}

/// The addresses of `X-Forwarded-For`, in header order; as above.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for entry in entries(headers, "x-forwarded-for") {
        match std::str::from_utf8(entry)
            .ok()
            .and_then(|e| parse_node(e.trim()))
        {
            Some(ip) => out.push(ip),
            None => out.clear(),
        }
    }
    out
}

/// `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]`, `[2001:db8::1]:4711` or
/// a bare IPv6, canonicalised (`::ffff:192.0.2.1` is `192.0.2.1`).
fn parse_node(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = if let Ok(ip) = s.parse() {
        ip
    } else if let Some(rest) = s.strip_prefix('[') {
        rest.split(']').next()?.parse().ok()?
    } else {
        s.rsplit_once(':').and_then(|(ip, _port)| ip.parse().ok())?
    };
    Some(ip.to_canonical())
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

    const XFF: ClientIpHeader = ClientIpHeader::XForwardedFor;
    const FORWARDED: ClientIpHeader = ClientIpHeader::Forwarded;

    #[test]
    fn an_untrusted_peer_cannot_spoof_its_address() {
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(
            client_ip("203.0.113.9".parse().unwrap(), &h, &nets(), XFF),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn a_trusted_proxy_is_believed_up_to_the_first_untrusted_hop() {
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.1.1")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn with_forwarded_configured_only_forwarded_is_read_and_ports_and_brackets_are_stripped() {
        let h = headers(&[
            ("forwarded", "for=\"[2001:db8::7]:4711\";proto=https"),
            ("x-forwarded-for", "9.9.9.9"),
        ]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), FORWARDED),
            "2001:db8::7".parse::<IpAddr>().unwrap()
        );
        let h = headers(&[("forwarded", "for=192.0.2.60:80")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), FORWARDED),
            "192.0.2.60".parse::<IpAddr>().unwrap()
        );
        let h = headers(&[("x-forwarded-for", "9.9.9.9")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), FORWARDED),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn a_clients_own_forwarded_header_is_ignored_by_default() {
        // The trusted proxy appended the real client to X-Forwarded-For and
        // passed the client's Forwarded through unchanged.
        let h = headers(&[
            ("forwarded", "for=1.2.3.4"),
            ("x-forwarded-for", "198.51.100.7"),
        ]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        let h = headers(&[("forwarded", "for=1.2.3.4")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn an_ipv4_mapped_peer_is_its_ipv4_address() {
        let mapped: IpAddr = "::ffff:203.0.113.9".parse().unwrap();
        assert_eq!(
            client_ip(mapped, &HeaderMap::new(), &nets(), XFF),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn an_ipv4_mapped_peer_matches_ipv4_trusted_proxies() {
        let h = headers(&[("x-forwarded-for", "198.51.100.7")]);
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        assert_eq!(
            client_ip(mapped, &h, &nets(), XFF),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn ipv4_mapped_forwarded_addresses_are_ipv4() {
        // The nearest hop is one of our proxies written in mapped form: it is
        // skipped like its IPv4 spelling, and the client comes out as IPv4.
        let h = headers(&[("x-forwarded-for", "::ffff:198.51.100.7, ::ffff:10.1.1.1")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
    }

    fn raw(pairs: &[(&'static str, &'static [u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn a_non_utf8_entry_does_not_hide_the_hops_a_trusted_proxy_appended() {
        // nginx appended the real client after the client's own garbage.
        let h = raw(&[("x-forwarded-for", b"1.2.3.4\x80, 203.0.113.5")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "203.0.113.5".parse::<IpAddr>().unwrap()
        );
        let h = raw(&[("forwarded", b"for=1.2.3.4\xff, for=203.0.113.5;proto=https")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), FORWARDED),
            "203.0.113.5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn an_unparseable_hop_stops_the_walk_at_the_nearest_hop_to_its_right() {
        // Nothing left of garbage is believed, whatever it says.
        let h = raw(&[("x-forwarded-for", b"198.51.100.7, 6.6.6.\xc3\xa9, 10.1.1.1")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
        let h = raw(&[("x-forwarded-for", b"198.51.100.7, \x80")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn several_header_lines_are_one_list_in_order_even_when_one_is_not_utf8() {
        // The middle line counts where it stands: nothing left of it is read.
        let h = raw(&[
            ("x-forwarded-for", b"198.51.100.7"),
            ("x-forwarded-for", b"7.7.7.7\x80"),
            ("x-forwarded-for", b"10.1.1.1"),
        ]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
        let h = raw(&[
            ("x-forwarded-for", b"6.6.6.6"),
            ("x-forwarded-for", b"7.7.7.7\x80, 203.0.113.5"),
            ("x-forwarded-for", b"10.1.1.1"),
        ]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "203.0.113.5".parse::<IpAddr>().unwrap()
        );
        let h = raw(&[
            ("x-forwarded-for", b"203.0.113.5"),
            ("x-forwarded-for", b"10.1.1.1"),
        ]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), XFF),
            "203.0.113.5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn a_forwarded_element_without_for_stops_the_walk() {
        // The trusted proxy added only proto and by: the client's own
        // `for=` to the left of it must not become the client.
        let h = headers(&[("forwarded", "for=1.2.3.4, proto=https;by=10.0.0.2")]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), FORWARDED),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
        let h = headers(&[
            ("forwarded", "for=1.2.3.4"),
            ("forwarded", "proto=https"),
            ("forwarded", "for=203.0.113.5"),
        ]);
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &h, &nets(), FORWARDED),
            "203.0.113.5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn a_trusted_peer_without_headers_is_the_client() {
        assert_eq!(
            client_ip("10.0.0.2".parse().unwrap(), &HeaderMap::new(), &nets(), XFF),
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
    }
}
