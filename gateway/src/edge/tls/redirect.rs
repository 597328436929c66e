//! `gateway.tls.redirect_http`: page requests on the plain listener answer
//! `308 Permanent Redirect` to the same path on HTTPS. Pages are what a
//! browser navigates to: the sale pages, the assets, and the shop's pages,
//! fetched with GET or HEAD. The API (the gateway's `{prefix}/api/...`, and
//! the shop's `/api/...`) is never redirected: a script or device that
//! speaks plain HTTP keeps working, and a redirected POST would be re-sent
//! by some clients and dropped by others.

use http::Method;

use crate::edge::route::Route;

/// Whether a plain-HTTP request is redirected (with the option on).
pub fn applies(method: &Method, path: &str, route: &Route<'_>) -> bool {
    let page_method = method == Method::GET || method == Method::HEAD;
    let page_route = match route {
        Route::SalePage(_) | Route::Asset(_) => true,
        Route::Shop => !(path == "/api" || path.starts_with("/api/")),
        _ => false,
    };
    page_method && page_route
}

/// The HTTPS address of the same resource: `https://host[:port]/path?query`,
/// with the public HTTPS port (left out when it is 443). `None` when the
/// request names no usable host: missing, not a plain DNS name or IP
/// literal, or one no loaded certificate `covers` (a `Host` is never copied
/// into `Location` unchecked, and a browser is never sent to a name the
/// HTTPS listener would fail its handshake for). A name's root dot is
/// accepted and dropped, and the name is lower-cased.
pub fn location(
    host: Option<&str>,
    path_and_query: &str,
    https_port: u16,
    covers: impl Fn(&str) -> bool,
) -> Option<String> {
    let host = hostname(host?)?.to_ascii_lowercase();
    if !covers(&host) || !path_and_query.starts_with('/') {
        return None;
    }
    let port = if https_port == 443 {
        String::new()
    } else {
        format!(":{https_port}")
    };
    Some(format!("https://{host}{port}{path_and_query}"))
}

/// The host part of a `Host` value (`name`, `name:port`, `[v6]:port`),
/// if it is a DNS name or an IP literal.
fn hostname(value: &str) -> Option<&str> {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok());
        return (v6.parse::<std::net::Ipv6Addr>().is_ok() && port_ok)
            .then(|| &value[..v6.len() + 2]);
    }
    let host = match value.split_once(':') {
        Some((host, port)) => port.parse::<u16>().ok().map(|_| host)?,
        None => value,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    valid.then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_redirected_and_the_api_is_not() {
        let get = Method::GET;
        assert!(applies(
            &get,
            "/flashgate/sales/demo",
            &Route::SalePage("demo")
        ));
        assert!(applies(
            &Method::HEAD,
            "/flashgate/static/sale.css",
            &Route::Asset("sale.css")
        ));
        assert!(applies(&get, "/account", &Route::Shop));
        assert!(!applies(&Method::POST, "/account", &Route::Shop));
        assert!(!applies(
            &get,
            "/flashgate/api/sales/demo",
            &Route::SaleState("demo")
        ));
        assert!(!applies(
            &Method::POST,
            "/flashgate/api/sales/demo/buy",
            &Route::Buy("demo")
        ));
        assert!(!applies(&get, "/api/shop-thing", &Route::Shop));
        assert!(applies(&get, "/apiary", &Route::Shop));
    }

    fn any(_: &str) -> bool {
        true
    }

    #[test]
    fn location_keeps_host_path_and_query_and_uses_the_https_port() {
        assert_eq!(
            location(Some("shop.example:8080"), "/sales/a?x=1", 8443, any).as_deref(),
            Some("https://shop.example:8443/sales/a?x=1")
        );
        assert_eq!(
            location(Some("shop.example"), "/", 443, any).as_deref(),
            Some("https://shop.example/")
        );
        assert_eq!(
            location(Some("shop.example.:8080"), "/", 443, any).as_deref(),
            Some("https://shop.example/"),
            "root dot"
        );
        assert_eq!(
            location(Some("127.0.0.1:80"), "/s", 443, any).as_deref(),
            Some("https://127.0.0.1/s")
        );
        assert_eq!(
            location(Some("[::1]:8080"), "/s", 8443, any).as_deref(),
            Some("https://[::1]:8443/s")
        );
    }

    #[test]
    fn only_hosts_a_certificate_covers_get_a_location() {
        let covers = |h: &str| h == "shop.example";
        assert_eq!(
            location(Some("shop.example."), "/", 443, covers).as_deref(),
            Some("https://shop.example/")
        );
        assert_eq!(location(Some("other.example"), "/", 443, covers), None);
    }

    #[test]
    fn hosts_that_are_not_names_get_no_location() {
        for bad in [
            "",
            "evil.example/x",
            "a@evil.example",
            "evil.example:port",
            "ex ample",
            "a..b",
            "[::1",
            "[zz]:1",
            "x\r\nSet-Cookie: a=b",
            "a.b..",
            ".",
        ] {
            assert_eq!(location(Some(bad), "/", 443, any), None, "{bad:?}");
        }
        assert_eq!(location(None, "/", 443, any), None);
        assert_eq!(location(Some("ok.example"), "*", 443, any), None);
    }
}
