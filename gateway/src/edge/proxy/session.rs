//! What the phases read from and write to a Pingora session: the request
//! id, the peer, the buy body, and the one writer of replies.

use std::net::IpAddr;

use http::header::HeaderName;
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use super::answers::{self, invalid, reply_head};
use super::ctx::RequestCtx;
use crate::edge::reply::Reply;
use crate::edge::static_pages::Page;
use crate::rejection::Rejection;

/// Every answer's id, for log correlation with the shop and the backend.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Largest buy request body accepted; a buy needs no more.
pub const MAX_BUY_BODY_BYTES: usize = 4096;
/// Most header bytes (names and values) accepted on any request; real
/// browsers send a few KiB. Pingora's own limit is far larger.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Whether the request's headers add up to more than we accept.
pub fn headers_too_large(req: &RequestHeader) -> bool {
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    header_bytes > MAX_HEADER_BYTES
}

/// The socket peer (0.0.0.0 when it is not an IP socket).
pub fn peer(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip())
}

/// Most answers of gateway routes (429, 410, 401, ...) are written before
/// the request body is read (a buy's token and user bucket are checked
/// after it, so that a bad body is refused without a signature check).
/// Pingora closes such a connection by default, which makes every
/// rejected client reconnect. A body small enough for a
/// buy is cheap to drain after the answer, so those connections stay open;
/// larger or chunked bodies keep the default and are closed.
pub fn keep_alive_after_early_answer(session: &mut Session) {
    let headers = &session.req_header().headers;
    let small = match headers.get(http::header::CONTENT_LENGTH) {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n <= MAX_BUY_BODY_BYTES),
        None => !headers.contains_key(http::header::TRANSFER_ENCODING),
    };
    if small {
        session.set_close_on_response_before_downstream_finish(false);
    }
}

/// Reads the buy body within `limit` in all: empty, or a JSON object of at
/// most [`MAX_BUY_BODY_BYTES`]. Nothing in it is needed today, but garbage
/// is refused rather than silently accepted.
///
/// The whole read is bounded, not only the wait for each piece: over
/// HTTP/2 pingora's per-read timeout does not apply, and even over
/// HTTP/1.1 a client sending a byte just before each read timeout would
/// otherwise hold its buy open for as long as it likes. It is read after
/// the IP's deny list and bucket and before the token is checked, so an
/// unsigned client can hold a buy for `gateway.body_read_timeout_ms` at
/// most, as many at once as its IP's bucket lets through.
pub async fn read_buy_body(
    session: &mut Session,
    limit: std::time::Duration,
) -> Result<(), Rejection> {
    match tokio::time::timeout(limit, read_bounded_body(session)).await {
        Ok(result) => result,
        Err(_) => {
            // Part of the body may still be on its way: never reuse this connection.
            session.set_keepalive(None);
            Err(Rejection::BadRequest("request body not received in time"))
        }
    }
}

async fn read_bounded_body(session: &mut Session) -> Result<(), Rejection> {
    let declared = session
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BUY_BODY_BYTES) {
        return Err(Rejection::PayloadTooLarge);
    }
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BUY_BODY_BYTES {
                    return Err(Rejection::PayloadTooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(_) => return Err(Rejection::BadRequest("unreadable request body")),
        }
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    // Checked, not kept: `IgnoredAny` builds nothing (nor checks the
    // UTF-8 of what it skips, hence `from_str`).
    let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let text = std::str::from_utf8(&body).unwrap_or("");
    match serde_json::from_str::<serde::de::IgnoredAny>(text) {
        Ok(_) if object => Ok(()),
        _ => Err(Rejection::BadRequest("body must be empty or a JSON object")),
    }
}

/// The client's `X-Request-Id` when it is short and printable, else a new one.
pub fn request_id(req: &RequestHeader) -> String {
    match req.headers.get(&X_REQUEST_ID).map(|v| v.as_bytes()) {
        Some(v) if (1..=64).contains(&v.len()) && v.iter().all(|b| b.is_ascii_graphic()) => {
            String::from_utf8_lossy(v).into_owned()
        }
        _ => {
            let mut id = String::with_capacity(32);
            flashgate_common::reservation::push_hex(&mut id, rand::random(), 32);
            id
        }
    }
}

/// Writes a reply: always with `Content-Length` (a response without it is
/// close-delimited and ends keepalive), without a body for HEAD and 304.
pub async fn write_reply(
    session: &mut Session,
    reply: Reply,
    ctx: &RequestCtx,
) -> pingora::Result<bool> {
    let (head, body) = reply_head(reply)?;
    let head = Box::new(head);
    write_page(session, Page { head, body }, ctx).await
}

/// Writes a rejection's answer, cloned from the one this thread keeps for
/// the same rejection where it can (`answers`).
pub async fn write_rejection(
    session: &mut Session,
    rejection: &Rejection,
    ctx: &RequestCtx,
) -> pingora::Result<bool> {
    match answers::kept_answer(rejection) {
        Some(page) => write_page(session, page?, ctx).await,
        None => write_reply(session, rejection.clone().into(), ctx).await,
    }
}

/// The `X-Request-Id` of an answer, marked never to be indexed: over
/// HTTP/2 a value new on every answer would otherwise enter the
/// connection's HPACK table each time and push out the headers that do
/// repeat (type, validators, caching), which then go out in full again.
fn request_id_value(id: &str) -> pingora::Result<http::HeaderValue> {
    let mut value = http::HeaderValue::from_str(id).map_err(invalid("request id"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// Writes an answer whose head is built (a static file's at load, a
/// reply's or a kept rejection's just now) plus the request id, without a
/// body for HEAD and 304.
pub async fn write_page(
    session: &mut Session,
    page: Page,
    ctx: &RequestCtx,
) -> pingora::Result<bool> {
    let Page { mut head, body } = page;
    head.append_header(X_REQUEST_ID, request_id_value(&ctx.request_id)?)?;
    let body_follows = session.req_header().method != http::Method::HEAD
        && head.status != http::StatusCode::NOT_MODIFIED
        && !body.is_empty();
    session.write_response_header(head, !body_follows).await?;
    if body_follows {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(true)
}
