//! `[shop.compression]`: text the shop sends uncompressed is compressed
//! for clients that accept it, by pingora's upstream compression.
//!
//! It runs on the shop's response before the edge cache stores it, so a
//! cached page is compressed once per encoding and its hits cost no
//! compression (the cache keys `Accept-Encoding` by the set of codings a
//! client accepts: `shop_cache::policy`). Pingora adds `Vary:
//! Accept-Encoding`, weakens a strong `ETag` of what it compresses, leaves
//! a response the shop encoded itself as it is (decoding it for a client
//! that does not accept that encoding), and compresses only text types of
//! 20 bytes or more. It picks the first coding the client lists that it
//! knows (gzip, br, zstd).
//!
//! Pingora's brotli encoder ends a response with a flush, not with the
//! stream's last block, and a decoder then reports the body cut short
//! ([`finish_brotli`] closes it).

use bytes::Bytes;
use flashgate_common::config::CompressionLevels;
use pingora::protocols::http::compression::Algorithm;
use pingora::proxy::Session;

/// Compression on for this request's response from the shop.
pub fn enable(session: &mut Session, levels: CompressionLevels) {
    let ctx = &mut session.upstream_compression;
    ctx.adjust_algorithm_level(Algorithm::Gzip, levels.gzip);
    ctx.adjust_algorithm_level(Algorithm::Brotli, levels.brotli);
    ctx.adjust_algorithm_level(Algorithm::Zstd, levels.zstd);
}

/// The last brotli meta-block, empty, as one byte: the encoder's flush left
/// the stream byte-aligned, and its bits are ISLAST = 1, ISLASTEMPTY = 1.
const BROTLI_LAST_BLOCK: u8 = 0x03;

/// Ends a brotli body at the end of the shop's response: appends the last
/// block once (`closed` remembers it: pingora may report the end twice).
pub fn finish_brotli(session: &Session, body: &mut Option<Bytes>, end: bool, closed: &mut bool) {
    let brotli = session
        .upstream_compression
        .get_info()
        .is_some_and(|(algorithm, ..)| algorithm == "brotli");
    if !end || !brotli || *closed {
        return;
    }
    *closed = true;
    let mut bytes = body.take().map(Vec::from).unwrap_or_default();
    bytes.push(BROTLI_LAST_BLOCK);
    *body = Some(Bytes::from(bytes));
}
