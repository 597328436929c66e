//! Invalidation by unsafe methods (RFC 9111 §4.4): a `POST`, `PUT`,
//! `DELETE` (any method but `GET`, `HEAD`, `OPTIONS`, `TRACE`) the shop
//! answers with a 2xx or 3xx makes the stored copies of its URL, and of
//! the `Location` and `Content-Location` it names on the same host, invalid.
//!
//! Invalid copies are not removed (a removal scans the store, and a shop's
//! `POST`s are frequent during a sale): the time of each invalidated path
//! is kept, and a stored copy older than it is revalidated with the shop
//! before it is used again, stale windows notwithstanding
//! (RFC 9111 §4.4 allows exactly that). Paths match as purges do: the raw
//! target, every host. At most [`MAX_PATHS`] are kept; past that all are
//! forgotten and every copy stored before that moment is treated as
//! invalid, once.
//!
//! Each gateway invalidates its own cache: the unsafe request passes
//! through one of them. A shop whose writes must reach every gateway
//! purges (docs/OPERATIONS.md).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use http::{header, Method};
use pingora::http::{RequestHeader, ResponseHeader};

/// Invalidated paths kept before they are all folded into one moment.
pub const MAX_PATHS: usize = 10_000;

/// The paths invalidated, and when.
pub struct Invalidations {
    inner: Mutex<Inner>,
}

struct Inner {
    by_path: HashMap<String, SystemTime>,
    /// Every copy stored before this is invalid.
    floor: SystemTime,
}

impl Default for Invalidations {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                by_path: HashMap::new(),
                floor: SystemTime::UNIX_EPOCH,
            }),
        }
    }
}

impl Invalidations {
    /// Marks `paths` invalid as of `now`.
    pub fn record(&self, paths: Vec<String>, now: SystemTime) {
        if paths.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for path in paths {
            if inner.by_path.len() >= MAX_PATHS && !inner.by_path.contains_key(&path) {
                inner.by_path.clear();
                inner.floor = now;
            }
            inner.by_path.insert(path, now);
        }
    }

    /// Whether a copy of `path` stored at `stored` must be revalidated.
    pub fn is_invalid(&self, path: &str, stored: SystemTime) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        stored < inner.floor || inner.by_path.get(path).is_some_and(|at| stored <= *at)
    }
}

/// The raw target of a request, as stored entries name it.
pub fn path_of(req: &RequestHeader) -> String {
    String::from_utf8_lossy(req.raw_path()).into_owned()
}

/// The paths a response to `req` invalidates; empty for safe methods and
/// for statuses other than 2xx and 3xx.
pub fn targets(req: &RequestHeader, resp: &ResponseHeader) -> Vec<String> {
    let safe = matches!(
        req.method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    let status = resp.status.as_u16();
    if safe || !(200..400).contains(&status) {
        return Vec::new();
    }
    let host = req
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let mut paths = vec![path_of(req)];
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let named = resp
            .headers
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| same_host_target(v, host));
        if let Some(path) = named {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
    }
    paths
}

/// The target of `reference` if it names `host` (or no host): an absolute
/// path, or an `http(s)` URL on that host.
fn same_host_target(reference: &str, host: &str) -> Option<String> {
    let reference = reference.trim();
    if reference.starts_with('/') && !reference.starts_with("//") {
        return Some(reference.to_owned());
    }
    let rest = reference
        .strip_prefix("http://")
        .or_else(|| reference.strip_prefix("https://"))?;
    let (authority, target) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    if !authority.eq_ignore_ascii_case(host) {
        return None;
    }
    Some(if target.starts_with('?') {
        format!("/{target}")
    } else {
        target.to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(method: &str, path: &str) -> RequestHeader {
        let mut r = RequestHeader::build(method, path.as_bytes(), None).unwrap();
        r.insert_header("host", "shop.example").unwrap();
        r
    }

    fn resp(status: u16, headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(status, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn successful_unsafe_methods_invalidate_the_url_and_same_host_locations() {
        let headers = [
            ("location", "http://SHOP.example/cart?x=1"),
            ("content-location", "https://other.example/elsewhere"),
        ];
        assert_eq!(
            targets(&req("POST", "/cart/add"), &resp(303, &headers)),
            ["/cart/add", "/cart?x=1"]
        );
        assert_eq!(
            targets(
                &req("M-SEARCH", "/a"),
                &resp(200, &[("content-location", "/b")])
            ),
            ["/a", "/b"]
        );
        assert!(targets(&req("GET", "/a"), &resp(200, &[])).is_empty());
        assert!(targets(&req("DELETE", "/a"), &resp(404, &[])).is_empty());
        assert!(targets(&req("PUT", "/a"), &resp(500, &[])).is_empty());
    }

    #[test]
    fn copies_stored_before_an_invalidation_are_invalid() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let s = Duration::from_secs;
        let inv = Invalidations::default();
        inv.record(vec!["/a".into()], t0);
        assert!(inv.is_invalid("/a", t0 - s(1)));
        assert!(!inv.is_invalid("/a", t0 + s(1)));
        assert!(!inv.is_invalid("/b", t0 - s(1)));
    }

    #[test]
    fn past_the_bound_every_older_copy_is_invalid_once() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let s = Duration::from_secs;
        let inv = Invalidations::default();
        inv.record((0..MAX_PATHS).map(|i| format!("/{i}")).collect(), t0);
        inv.record(vec!["/new".into()], t0 + s(10));
        assert!(inv.is_invalid("/other", t0 + s(5)));
        assert!(!inv.is_invalid("/other", t0 + s(11)));
    }
}
