//! The stored response's headers after the shop confirms it with `304`
//! (RFC 9111 §4.3.4): every field the `304` carries replaces the stored
//! one. pingora-cache's merge takes only `Cache-Control`, `Expires`,
//! `ETag` and two more; the rest is done here.
//!
//! Kept from the stored copy: what describes its body (`Content-Length`,
//! `Content-Encoding`, `Content-Type`, `Content-Range`), `Vary` (the variant
//! was chosen by it), hop-by-hop fields, `Age` (counted by the cache) and
//! `Set-Cookie` (never stored).

use pingora::http::ResponseHeader;

/// Fields of a `304` that do not replace the stored ones.
const KEPT: [&str; 13] = [
    "content-length",
    "content-encoding",
    "content-type",
    "content-range",
    "transfer-encoding",
    "vary",
    "age",
    "set-cookie",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

/// `stored` (already merged by pingora-cache) updated with every field of
/// `not_modified` but [`KEPT`].
pub fn updated(stored: &ResponseHeader, not_modified: &ResponseHeader) -> ResponseHeader {
    let mut out = stored.clone();
    for name in not_modified.headers.keys() {
        let lower = name.as_str();
        if KEPT.contains(&lower) || lower.starts_with("proxy-") {
            continue;
        }
        let mut values = not_modified.headers.get_all(name).iter();
        if let Some(first) = values.next() {
            // Names from a parsed header and values from it are valid.
            let _ = out.insert_header(name.clone(), first.clone());
            for more in values {
                let _ = out.append_header(name.clone(), more.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(status: u16, fields: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(status, None).unwrap();
        for (k, v) in fields {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn a_304_replaces_every_stored_field_but_those_of_the_body() {
        let stored = header(
            200,
            &[
                ("test-header", "old"),
                ("content-foo", "old"),
                ("content-type", "text/html"),
                ("content-length", "10"),
                ("etag", "\"a\""),
            ],
        );
        let not_modified = header(
            304,
            &[
                ("test-header", "new"),
                ("content-foo", "new"),
                ("content-type", "text/plain"),
                ("content-length", "0"),
                ("set-cookie", "sid=1"),
            ],
        );
        let out = updated(&stored, &not_modified);
        let get = |n: &str| out.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(out.status.as_u16(), 200);
        assert_eq!(get("test-header").as_deref(), Some("new"));
        assert_eq!(get("content-foo").as_deref(), Some("new"));
        assert_eq!(get("content-type").as_deref(), Some("text/html"));
        assert_eq!(get("content-length").as_deref(), Some("10"));
        assert_eq!(get("etag").as_deref(), Some("\"a\""));
        assert_eq!(get("set-cookie"), None);
    }
}
