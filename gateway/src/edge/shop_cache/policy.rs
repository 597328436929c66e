//! The rules of the shop cache, on plain headers (no session): which
//! request may use it, its key, which response may be stored and for how
//! long, and which variant a request wants.

use http::{header, Method, StatusCode};
use pingora::cache::cache_control::CacheControl;
use pingora::cache::filters::resp_cacheable;
use pingora::cache::key::HashBinary;
use pingora::cache::{
    CacheKey, CacheMeta, CacheMetaDefaults, NoCacheReason, RespCacheable, VarianceBuilder,
};
use pingora::http::{RequestHeader, ResponseHeader};

use super::storage::KEY_SEPARATOR;
use super::CacheUse;

/// Why a credentialed request's response was not stored.
pub const CREDENTIALED: &str = "credentialed";
/// The response sets a cookie.
pub const SETS_COOKIE: &str = "set-cookie";
/// `Vary: *`: no request can be matched to it.
pub const VARY_ANY: &str = "vary-any";
/// A status not stored even with a lifetime (errors, redirects that
/// depend on the request, partial content).
pub const STATUS: &str = "status";
/// Most request headers a `Vary` may name before the response is not stored.
const MAX_VARY_HEADERS: usize = 8;

/// Longest request target (path and query) the cache keys; longer ones
/// bypass it, so one entry's key cannot take a large share of the memory.
pub const MAX_CACHED_TARGET_BYTES: usize = 8 * 1024;

/// Request headers that make common frameworks answer for another host,
/// path or method than the key names; never sent to the shop on a request
/// that uses the cache (`X-Forwarded-Host` is set again to the keyed host).
/// Headers a shop varies its answer on otherwise (`Accept`,
/// `Accept-Language`, ...) need a `Vary` from the shop.
pub const UNKEYED_REWRITE_HEADERS: [&str; 6] = [
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-original-url",
    "x-rewrite-url",
    "x-http-method-override",
];

/// Drops [`UNKEYED_REWRITE_HEADERS`] from the shop's request and names the
/// keyed host (lower case) in `X-Forwarded-Host`.
pub fn strip_unkeyed(upstream: &mut RequestHeader) -> pingora::Result<()> {
    for name in UNKEYED_REWRITE_HEADERS {
        upstream.remove_header(name);
    }
    if let Some(host) = upstream
        .headers
        .get(header::HOST)
        .map(|v| v.as_bytes().to_ascii_lowercase())
    {
        upstream.insert_header("X-Forwarded-Host", host)?;
    }
    Ok(())
}

/// How a request may use the cache: only `GET` and `HEAD` without a body
/// or protocol upgrade, with a `Host` and a UTF-8 origin-form target of at
/// most [`MAX_CACHED_TARGET_BYTES`] (the key is built from those bytes
/// exactly as the shop gets them); `Cookie` or `Authorization` make it
/// credentialed.
pub fn request_use(req: &RequestHeader) -> CacheUse {
    let h = &req.headers;
    let has_body = h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes().iter().any(|b| *b != b'0'));
    if !(req.method == Method::GET || req.method == Method::HEAD)
        || has_body
        || h.contains_key(header::UPGRADE)
    {
        return CacheUse::Off;
    }
    let target = req.raw_path();
    let keyable = target.first() == Some(&b'/')
        && target.len() <= MAX_CACHED_TARGET_BYTES
        && std::str::from_utf8(target).is_ok();
    let host = h.get(header::HOST).is_some_and(|v| !v.is_empty());
    if !keyable || !host {
        return CacheUse::Off;
    }
    if h.contains_key(header::COOKIE) || h.contains_key(header::AUTHORIZATION) {
        CacheUse::Credentialed
    } else {
        CacheUse::Shared
    }
}

/// The key: scheme, host (lower case) and the raw request target (path
/// with query, byte for byte as the shop gets it), separated so that no two
/// requests share a key by accident. The target is taken raw, not parsed:
/// the shop answers the raw target, and a parsed form can map two targets
/// to one key. The host is part of it: a client sending another `Host` must
/// not fill the cache of the real one; so is the scheme: a shop redirecting
/// `http` to `https` must not have that redirect answered to `https`
/// requests. Only called for requests [`request_use`] let in.
pub fn cache_key(req: &RequestHeader, tls: bool) -> CacheKey {
    let host = req
        .headers
        .get(header::HOST)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    let path = req.raw_path();
    let scheme: &[u8] = if tls { b"https://" } else { b"http://" };
    let mut primary = Vec::with_capacity(scheme.len() + host.len() + 1 + path.len());
    primary.extend_from_slice(scheme);
    primary.extend(
        host.iter()
            .map(u8::to_ascii_lowercase)
            .filter(|b| *b != KEY_SEPARATOR as u8),
    );
    primary.push(KEY_SEPARATOR as u8);
    primary.extend_from_slice(path);
    CacheKey::new(primary, "")
}

/// Statuses stored when the shop gives them a lifetime (RFC 9110 §15.1's
/// heuristically cacheable ones, without 206, 405, 414, 501).
fn storable_status(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 410
    )
}

/// The request header names the response's `Vary` lists, lower case;
/// `None` for `Vary: *` or an unreasonably long list.
fn vary_names(resp: &ResponseHeader) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for value in resp.headers.get_all(header::VARY) {
        for name in value
            .to_str()
            .ok()?
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            if name == "*" {
                return None;
            }
            let name = name.to_ascii_lowercase();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    (names.len() <= MAX_VARY_HEADERS).then_some(names)
}

/// Whether the shop's response may be stored, with its lifetime.
pub fn response_cacheable(
    using: CacheUse,
    resp: &ResponseHeader,
    defaults: &CacheMetaDefaults,
) -> RespCacheable {
    if resp.status.is_server_error() {
        // Like a failed fetch: the lock passes to one waiter, which fetches
        // again, instead of releasing the whole crowd to a failing shop.
        return RespCacheable::Uncacheable(NoCacheReason::UpstreamError);
    }
    if !storable_status(resp.status) {
        return RespCacheable::Uncacheable(NoCacheReason::Custom(STATUS));
    }
    if resp.headers.contains_key(header::SET_COOKIE) {
        return RespCacheable::Uncacheable(NoCacheReason::Custom(SETS_COOKIE));
    }
    if vary_names(resp).is_none() {
        return RespCacheable::Uncacheable(NoCacheReason::Custom(VARY_ANY));
    }
    let credentialed = using == CacheUse::Credentialed;
    // A credentialed request's answer is stored only when the shop marked
    // it shareable; see [`shared_with_credentials`].
    if credentialed && !shared_with_credentials(resp) {
        return RespCacheable::Uncacheable(NoCacheReason::Custom(CREDENTIALED));
    }
    let cc = CacheControl::from_resp_headers(resp);
    resp_cacheable(cc.as_ref(), resp.clone(), credentialed, defaults)
}

/// Whether a response may be stored from, or answer, a request with
/// `Cookie` or `Authorization`: only if the shop marked it `public` or gave
/// it an `s-maxage`. Not `must-revalidate`, which RFC 9111 §3.5 also lists
/// (and pingora's `allow_caching_authorized_req` accepts): shops send
/// `max-age=…, must-revalidate` on personal pages, meaning "revalidate
/// when stale", not "share".
pub fn shared_with_credentials(resp: &ResponseHeader) -> bool {
    CacheControl::from_resp_headers(resp).is_some_and(|cc| cc.public() || cc.has_key("s-maxage"))
}

/// The variant a request wants of a stored response: the values of the
/// request headers its `Vary` names (`None` when it names none).
pub fn variance(meta: &CacheMeta, req: &RequestHeader) -> Option<HashBinary> {
    let names = vary_names(meta.response_header())?;
    if names.is_empty() {
        return None;
    }
    let mut variance = VarianceBuilder::new();
    for name in names {
        // `Accept-Encoding` arrives normalized (`edge/proxy/compress.rs`).
        let value: Vec<u8> = req
            .headers
            .get_all(name.as_str())
            .iter()
            .flat_map(|v| v.as_bytes().iter().copied().chain([b',']))
            .collect();
        variance.add_owned_name_value(name, value);
    }
    variance.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build(method, b"/products/1?color=red", None).unwrap();
        r.insert_header("host", "Shop.Example").unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn resp(status: u16, headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(status, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn defaults() -> CacheMetaDefaults {
        CacheMetaDefaults::new(|_| None, 0, 60)
    }

    fn stored(using: CacheUse, headers: &[(&str, &str)]) -> bool {
        response_cacheable(using, &resp(200, headers), &defaults()).is_cacheable()
    }

    #[test]
    fn only_plain_gets_and_heads_use_the_cache() {
        assert_eq!(request_use(&req("GET", &[])), CacheUse::Shared);
        assert_eq!(request_use(&req("HEAD", &[])), CacheUse::Shared);
        assert_eq!(request_use(&req("POST", &[])), CacheUse::Off);
        assert_eq!(
            request_use(&req("GET", &[("content-length", "3")])),
            CacheUse::Off
        );
        assert_eq!(
            request_use(&req("GET", &[("content-length", "0")])),
            CacheUse::Shared
        );
        assert_eq!(
            request_use(&req("GET", &[("upgrade", "websocket")])),
            CacheUse::Off
        );
        assert_eq!(
            request_use(&req("GET", &[("cookie", "sid=1")])),
            CacheUse::Credentialed
        );
        assert_eq!(
            request_use(&req("GET", &[("authorization", "Bearer x")])),
            CacheUse::Credentialed
        );
        let mut no_host = RequestHeader::build("GET", b"/products/1", None).unwrap();
        assert_eq!(request_use(&no_host), CacheUse::Off, "no Host");
        no_host.insert_header("host", "").unwrap();
        assert_eq!(request_use(&no_host), CacheUse::Off, "empty Host");
        let mut long = RequestHeader::build(
            "GET",
            format!("/{}", "a".repeat(MAX_CACHED_TARGET_BYTES)).as_bytes(),
            None,
        )
        .unwrap();
        long.insert_header("host", "shop.example").unwrap();
        assert_eq!(request_use(&long), CacheUse::Off, "target too long");
    }

    #[test]
    fn the_key_is_the_scheme_the_lower_case_host_and_the_path_with_query() {
        let key = cache_key(&req("GET", &[]), false);
        assert_eq!(
            key.primary_key_str(),
            Some("http://shop.example\n/products/1?color=red")
        );
        assert_eq!(
            cache_key(&req("GET", &[]), true).primary_key_str(),
            Some("https://shop.example\n/products/1?color=red")
        );
        let mut other = req("GET", &[]);
        other.insert_header("host", "evil.example").unwrap();
        assert_ne!(cache_key(&other, false).primary_key(), key.primary_key());
    }

    #[test]
    fn lifetimes_and_directives_decide_what_is_stored() {
        assert!(stored(CacheUse::Shared, &[("cache-control", "max-age=60")]));
        assert!(stored(
            CacheUse::Shared,
            &[("cache-control", "s-maxage=60, max-age=0")]
        ));
        assert!(!stored(CacheUse::Shared, &[]), "no lifetime, no heuristic");
        assert!(!stored(
            CacheUse::Shared,
            &[("cache-control", "private, max-age=60")]
        ));
        assert!(!stored(
            CacheUse::Shared,
            &[("cache-control", "no-store, max-age=60")]
        ));
        assert!(!stored(
            CacheUse::Shared,
            &[("cache-control", "max-age=60"), ("set-cookie", "sid=1")]
        ));
        assert!(!stored(
            CacheUse::Shared,
            &[
                ("cache-control", "max-age=60"),
                ("vary", "Accept-Encoding, *")
            ]
        ));
        assert!(stored(
            CacheUse::Shared,
            &[("cache-control", "max-age=60"), ("vary", "Accept-Encoding")]
        ));
        let error = response_cacheable(
            CacheUse::Shared,
            &resp(500, &[("cache-control", "max-age=60")]),
            &defaults(),
        );
        assert!(!error.is_cacheable());
    }

    #[test]
    fn credentialed_answers_are_stored_only_when_public() {
        assert!(!stored(
            CacheUse::Credentialed,
            &[("cache-control", "max-age=60")]
        ));
        assert!(stored(
            CacheUse::Credentialed,
            &[("cache-control", "public, max-age=60")]
        ));
        assert!(stored(
            CacheUse::Credentialed,
            &[("cache-control", "s-maxage=60")]
        ));
        match response_cacheable(
            CacheUse::Credentialed,
            &resp(200, &[("cache-control", "max-age=60")]),
            &defaults(),
        ) {
            RespCacheable::Uncacheable(NoCacheReason::Custom(reason)) => {
                assert_eq!(reason, CREDENTIALED)
            }
            other => panic!("{other:?}"),
        }
        assert!(shared_with_credentials(&resp(
            200,
            &[("cache-control", "public, max-age=5")]
        )));
        assert!(!shared_with_credentials(&resp(
            200,
            &[("cache-control", "max-age=5")]
        )));
        assert!(!shared_with_credentials(&resp(
            200,
            &[("cache-control", "max-age=60, must-revalidate")]
        )));
        assert!(!stored(
            CacheUse::Credentialed,
            &[("cache-control", "max-age=60, must-revalidate")]
        ));
    }

    #[test]
    fn vary_picks_the_variant_by_the_named_request_headers() {
        let now = std::time::SystemTime::now();
        let meta = CacheMeta::new(now, now, 0, 0, resp(200, &[("vary", "accept-encoding")]));
        let gzip = variance(&meta, &req("GET", &[("accept-encoding", "gzip")]));
        let br = variance(&meta, &req("GET", &[("accept-encoding", "br")]));
        assert!(gzip.is_some() && br.is_some() && gzip != br);
        assert_eq!(
            gzip,
            variance(&meta, &req("GET", &[("accept-encoding", "gzip")]))
        );
        let plain = CacheMeta::new(now, now, 0, 0, resp(200, &[]));
        assert_eq!(
            variance(&plain, &req("GET", &[("accept-encoding", "gzip")])),
            None
        );
    }
}
