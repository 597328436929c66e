//! The CSRF check of a buy signed in by cookie.
//!
//! A browser sends the shop's sign-in cookie with every request to the
//! site, a form on another site posting to the buy URL included, so a buy
//! whose token came from the cookie must show it was sent by the shop's
//! own pages. It passes with either:
//! - `X-Flashgate-CSRF: 1`: a header a cross-site form cannot send, and a
//!   cross-site script only after a CORS preflight, which the gateway
//!   never grants (the sale page's script sends it); or
//! - the browser's own word: `Sec-Fetch-Site: same-origin` and/or an
//!   `Origin` naming the sale page's origin (`auth.public_origin`, else
//!   the origin the request was sent to: scheme by listener and `Host`, so
//!   a plain-HTTP page cannot post to the HTTPS site). When both are sent
//!   both must agree; a buy with neither is refused.
//!
//! A buy with a bearer token needs none of this: a cross-site page cannot
//! make a browser send an `Authorization` header.

use http::HeaderMap;

/// The header that vouches for a same-site request.
pub const CSRF_HEADER: &str = "x-flashgate-csrf";

/// The origin a cookie-signed buy must come from.
#[derive(Debug, Clone, Default)]
pub struct CsrfCheck {
    /// `auth.public_origin`, lower case; `None`: the request's host.
    public_origin: Option<Box<str>>,
}

impl CsrfCheck {
    pub fn new(public_origin: Option<&str>) -> Self {
        Self {
            public_origin: public_origin.map(|o| o.to_ascii_lowercase().into()),
        }
    }

    /// Whether a request sent to `own_origin` (`https://` or `http://` by
    /// listener, then its `Host` or HTTP/2 `:authority`) with `headers`
    /// comes from the sale page's origin.
    pub fn passes(&self, headers: &HeaderMap, own_origin: OwnOrigin<'_>) -> bool {
        if headers
            .get(CSRF_HEADER)
            .is_some_and(|v| v.as_bytes() == b"1")
        {
            return true;
        }
        let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
        let origin = headers.get(http::header::ORIGIN).map(|v| v.as_bytes());
        if site.is_none() && origin.is_none() {
            return false;
        }
        site.is_none_or(|s| s == b"same-origin")
            && origin.is_none_or(|o| self.same_origin(o, own_origin))
    }

    fn same_origin(&self, origin: &[u8], own_origin: OwnOrigin<'_>) -> bool {
        match &self.public_origin {
            Some(expected) => origin.eq_ignore_ascii_case(expected.as_bytes()),
            None => own_origin.is(origin),
        }
    }
}

/// The origin a request was sent to: its listener's scheme and its `Host`
/// (or HTTP/2 `:authority`). Compared in place with an `Origin` header,
/// never formatted: every buy carries one, few are signed in by cookie.
#[derive(Debug, Clone, Copy)]
pub struct OwnOrigin<'a> {
    /// Sent to the HTTPS listener.
    pub tls: bool,
    pub host: Option<&'a str>,
}

impl OwnOrigin<'_> {
    /// Whether `origin` is `scheme://host`, ASCII case ignored.
    fn is(&self, origin: &[u8]) -> bool {
        let Some(host) = self.host else {
            return false;
        };
        let scheme: &[u8] = if self.tls { b"https://" } else { b"http://" };
        origin.len() == scheme.len() + host.len()
            && origin[..scheme.len()].eq_ignore_ascii_case(scheme)
            && origin[scheme.len()..].eq_ignore_ascii_case(host.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn without_a_public_origin_the_origin_must_be_the_one_the_request_was_sent_to() {
        let c = CsrfCheck::default();
        let host = OwnOrigin {
            tls: true,
            host: Some("shop.example"),
        };
        assert!(c.passes(&headers(&[("origin", "https://shop.example")]), host));
        assert!(c.passes(&headers(&[("origin", "https://SHOP.example")]), host));
        assert!(!c.passes(&headers(&[("origin", "https://evil.example")]), host));
        assert!(!c.passes(&headers(&[("origin", "https://shop.example.evil")]), host));
        assert!(!c.passes(&headers(&[("origin", "null")]), host));
        let unknown = OwnOrigin {
            tls: true,
            host: None,
        };
        assert!(!c.passes(&headers(&[("origin", "https://shop.example")]), unknown));
        assert!(
            !c.passes(&headers(&[("origin", "http://shop.example")]), host),
            "a plain-HTTP page posting to the HTTPS listener"
        );
        assert!(!c.passes(&headers(&[]), host), "no evidence at all");
    }

    #[test]
    fn sec_fetch_site_must_say_same_origin_and_agree_with_the_origin() {
        let c = CsrfCheck::new(Some("https://Shop.example"));
        let host = OwnOrigin {
            tls: true,
            host: Some("gateway.internal"),
        };
        assert!(c.passes(&headers(&[("sec-fetch-site", "same-origin")]), host));
        assert!(!c.passes(&headers(&[("sec-fetch-site", "cross-site")]), host));
        assert!(!c.passes(&headers(&[("sec-fetch-site", "same-site")]), host));
        assert!(c.passes(
            &headers(&[
                ("sec-fetch-site", "same-origin"),
                ("origin", "https://shop.example")
            ]),
            host
        ));
        assert!(!c.passes(
            &headers(&[
                ("sec-fetch-site", "same-origin"),
                ("origin", "https://gateway.internal")
            ]),
            host
        ));
        assert!(!c.passes(
            &headers(&[
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://shop.example")
            ]),
            host
        ));
    }

    #[test]
    fn the_header_a_form_cannot_send_is_enough_but_only_with_its_value() {
        let c = CsrfCheck::new(Some("https://shop.example"));
        let unknown = OwnOrigin {
            tls: true,
            host: None,
        };
        assert!(c.passes(
            &headers(&[("x-flashgate-csrf", "1"), ("sec-fetch-site", "cross-site")]),
            unknown
        ));
        assert!(!c.passes(&headers(&[("x-flashgate-csrf", "yes")]), unknown));
    }
}
