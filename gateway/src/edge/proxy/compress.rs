//! `[shop.compression]`, and the `Accept-Encoding` the shop is asked with.
//!
//! One coding is chosen per request, here, and everything follows it: the
//! client's `Accept-Encoding` is replaced by it before the cache looks the
//! request up ([`normalize`]), so the cache keys a variant by the coding
//! its body is in, the shop is asked for that coding only, and pingora's
//! upstream compression (which takes the first coding listed, and ignores
//! q-values) can only pick it. The choice: the enabled coding the client
//! accepts with the highest q-value (explicitly or through `*`), brotli
//! before zstd before gzip among equals; identity (no header) when none.
//! With compression off but the cache on, the header becomes the sorted
//! set of codings the client accepts: clients that accept the same codings
//! share a variant, and the shop cannot answer with one outside the set.
//!
//! Compression runs on the shop's response before the edge cache stores
//! it ([`enable`]), so a cached page is compressed once per coding and its
//! hits cost none. Pingora adds `Vary: Accept-Encoding`, weakens the
//! `ETag` of what it compresses, leaves a response the shop encoded itself
//! as it is, and compresses only text types of 20 bytes or more. Not
//! compressed: answers to requests that carry credentials the shop sees
//! (a cookie no cache rule ignores, `Authorization`): a personal page with
//! a secret and reflected input is what BREACH reads.
//!
//! Pingora's brotli encoder ends a response with a flush, not with the
//! stream's last block, and a decoder then reports the body cut short
//! ([`finish_brotli`] closes it). A compressed response is marked for the
//! cache ([`MARK`]): a `304` from the shop later merges the shop's own
//! strong `ETag` into the stored copy, and the mark has it weakened again
//! on the way out ([`unmark`]).

use bytes::Bytes;
use flashgate_common::config::CompressionLevels;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::compression::Algorithm;
use pingora::proxy::Session;

/// The codings the gateway can compress to, in the order it prefers them
/// among codings the client weighs equally.
const CODINGS: [&str; 3] = ["br", "zstd", "gzip"];

/// Replaces the client's `Accept-Encoding` with the coding chosen for it
/// (compression on) or the sorted set it accepts (compression off).
pub fn normalize(req: &mut RequestHeader, levels: Option<CompressionLevels>) {
    let values: Vec<Vec<u8>> = req
        .headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect();
    let weighed = weigh(values.iter().map(Vec::as_slice));
    let value = match levels {
        Some(levels) => choose(&weighed, levels).map(str::to_owned),
        None => {
            let mut accepted: Vec<String> = weighed
                .into_iter()
                .filter(|(_, q)| *q > 0.0)
                .map(|(c, _)| c)
                .collect();
            accepted.sort_unstable();
            accepted.dedup();
            (!accepted.is_empty()).then(|| accepted.join(", "))
        }
    };
    req.remove_header(&http::header::ACCEPT_ENCODING);
    if let Some(value) = value {
        // Built from tokens of a header that parsed: always valid.
        let _ = req.insert_header(http::header::ACCEPT_ENCODING, value);
    }
}

/// Each coding a client's `Accept-Encoding` names, lowercased, with its
/// q-value (1 when absent or unreadable).
fn weigh<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<(String, f32)> {
    values
        .flat_map(|v| v.split(|b| *b == b','))
        .filter_map(|item| {
            let item = std::str::from_utf8(item).ok()?;
            let mut parts = item.split(';');
            let coding = parts.next()?.trim().to_ascii_lowercase();
            let q = parts
                .find_map(|p| {
                    let p = p.trim();
                    p.strip_prefix("q=").or_else(|| p.strip_prefix("Q="))
                })
                .and_then(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let token = !coding.is_empty()
                && coding
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.*+".contains(&b));
            token.then_some((coding, q))
        })
        .collect()
}

/// The enabled coding the client weighs highest (brotli, zstd, gzip among
/// equals); `None`: identity.
fn choose(weighed: &[(String, f32)], levels: CompressionLevels) -> Option<&'static str> {
    let star = weighed.iter().find(|(c, _)| c == "*").map(|(_, q)| *q);
    let q_of = |coding: &str| {
        weighed
            .iter()
            .find(|(c, _)| c == coding || (coding == "gzip" && c == "x-gzip"))
            .map(|(_, q)| *q)
            .or(star)
            .unwrap_or(0.0)
    };
    let level = |coding: &str| match coding {
        "br" => levels.brotli,
        "zstd" => levels.zstd,
        _ => levels.gzip,
    };
    let mut best: Option<(&'static str, f32)> = None;
    for coding in CODINGS {
        let q = q_of(coding);
        if level(coding) > 0 && q > 0.0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((coding, q));
        }
    }
    best.map(|(c, _)| c)
}

/// Compression on for this request's response from the shop, unless the
/// shop sees credentials on it (`upstream`, as sent). A ranged request is
/// sent whole: a compressed part would carry the uncompressed range.
pub fn enable(session: &mut Session, upstream: &mut RequestHeader, levels: CompressionLevels) {
    let credentialed = upstream.headers.contains_key(http::header::COOKIE)
        || upstream.headers.contains_key(http::header::AUTHORIZATION);
    if credentialed {
        return;
    }
    upstream.remove_header(&http::header::RANGE);
    upstream.remove_header(&http::header::IF_RANGE);
    let ctx = &mut session.upstream_compression;
    ctx.adjust_algorithm_level(Algorithm::Gzip, levels.gzip);
    ctx.adjust_algorithm_level(Algorithm::Brotli, levels.brotli);
    ctx.adjust_algorithm_level(Algorithm::Zstd, levels.zstd);
}

/// Marks a response compressed here, as it is stored.
pub const MARK: &str = "x-flashgate-compressed";

/// The coding pingora is compressing this response to, if any.
fn compressing(session: &Session) -> Option<&'static str> {
    session
        .upstream_compression
        .get_info()
        .map(|(algorithm, ..)| algorithm)
        .filter(|a| !a.starts_with("de-"))
}

/// Marks the shop's response when pingora compresses it (called once its
/// header went through the compression).
pub fn mark(session: &Session, resp: &mut ResponseHeader) {
    if compressing(session).is_some() {
        // A fixed token: never fails.
        let _ = resp.insert_header(MARK, "1");
    }
}

/// On the way to the client: the mark removed, and the `ETag` of a
/// compressed copy weak (a shop's `304` may have merged its strong one).
pub fn unmark(resp: &mut ResponseHeader) {
    if resp.remove_header(MARK).is_none() {
        return;
    }
    let Some(etag) = resp.headers.get(http::header::ETAG) else {
        return;
    };
    if !etag.as_bytes().starts_with(b"W/") {
        let weak = [b"W/".as_slice(), etag.as_bytes()].concat();
        // The stored value with two visible bytes before it: valid.
        let _ = resp.insert_header(http::header::ETAG, weak);
    }
}

/// The last brotli meta-block, empty, as one byte: the encoder's flush left
/// the stream byte-aligned, and its bits are ISLAST = 1, ISLASTEMPTY = 1.
const BROTLI_LAST_BLOCK: u8 = 0x03;

/// Ends a brotli body at the end of the shop's response: appends the last
/// block once (`closed` remembers it: pingora may report the end twice).
pub fn finish_brotli(session: &Session, body: &mut Option<Bytes>, end: bool, closed: &mut bool) {
    if !end || *closed || compressing(session) != Some("brotli") {
        return;
    }
    *closed = true;
    let mut bytes = body.take().map(Vec::from).unwrap_or_default();
    bytes.push(BROTLI_LAST_BLOCK);
    *body = Some(Bytes::from(bytes));
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: CompressionLevels = CompressionLevels {
        gzip: 6,
        brotli: 5,
        zstd: 3,
    };

    fn normalized(values: &[&str], levels: Option<CompressionLevels>) -> Option<String> {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        for v in values {
            req.append_header("accept-encoding", *v).unwrap();
        }
        normalize(&mut req, levels);
        req.headers
            .get("accept-encoding")
            .map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn the_coding_is_chosen_by_q_value_then_the_gateways_preference() {
        let pick = |v: &[&str]| normalized(v, Some(ALL));
        assert_eq!(pick(&["gzip, deflate, br, zstd"]).as_deref(), Some("br"));
        assert_eq!(pick(&["gzip, deflate"]).as_deref(), Some("gzip"));
        assert_eq!(pick(&["zstd;q=0, gzip, br;q=0.5"]).as_deref(), Some("gzip"));
        assert_eq!(pick(&["br;q=0", "gzip;q=0"]), None);
        assert_eq!(pick(&["*"]).as_deref(), Some("br"));
        assert_eq!(pick(&["*;q=0.1, gzip"]).as_deref(), Some("gzip"));
        assert_eq!(pick(&["identity"]), None);
        assert_eq!(pick(&[]), None);
        let no_brotli = CompressionLevels { brotli: 0, ..ALL };
        assert_eq!(
            normalized(&["br, gzip"], Some(no_brotli)).as_deref(),
            Some("gzip")
        );
    }

    #[test]
    fn without_compression_clients_accepting_the_same_codings_share_one_value() {
        let set = |v: &[&str]| normalized(v, None);
        assert_eq!(
            set(&["gzip, deflate, br, zstd"]).as_deref(),
            Some("br, deflate, gzip, zstd")
        );
        assert_eq!(set(&["br;q=0.9, GZIP", "gzip"]), set(&["gzip, br"]));
        assert_eq!(set(&["zstd;q=0, gzip"]).as_deref(), Some("gzip"));
        assert_eq!(set(&["gzip;q=0"]), None);
    }

    #[test]
    fn a_compressed_copys_etag_leaves_weak() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("etag", "\"abc\"").unwrap();
        unmark(&mut resp);
        assert_eq!(resp.headers["etag"], "\"abc\"", "not marked: untouched");
        resp.insert_header(MARK, "1").unwrap();
        unmark(&mut resp);
        assert_eq!(resp.headers["etag"], "W/\"abc\"");
        assert!(resp.headers.get(MARK).is_none());
    }
}
