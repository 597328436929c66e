//! Connection reuse on the buyer listener, over raw TCP: a connection is
//! kept open only when Pingora itself would keep it. A request framed
//! ambiguously (both Content-Length and Transfer-Encoding) or an HTTP/1.0
//! request without keep-alive gets its answer and then the connection is
//! closed, so nothing after it on the socket is ever read as a request.
//! And a shop's answer reaches the buyer as the shop sends it: a chunked
//! one piece by piece, one of known length at most one write buffer
//! (16 KiB) behind.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use flashgate_tests::{token, Stack, StackOptions};

/// Reads one response (headers and a Content-Length body); returns its
/// status line.
fn read_response(conn: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            conn.read(&mut byte).unwrap(),
            1,
            "connection closed inside a response head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no Content-Length: {head}"));
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).unwrap();
    head.lines().next().unwrap().to_owned()
}

/// Sends `request` on a fresh connection, reads the answer, and tells
/// whether the gateway then closed the connection (within 5 s).
fn answered_then_closed(addr: SocketAddr, request: &str) -> (String, bool) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let status = read_response(&mut conn);
    let mut rest = [0u8; 64];
    let closed = match conn.read(&mut rest) {
        Ok(0) => true,
        Ok(n) => panic!(
            "unexpected bytes after the response: {:?}",
            String::from_utf8_lossy(&rest[..n])
        ),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            false
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Err(e) => panic!("read failed: {e}"),
    };
    (status, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_connections_pingora_would_reuse_are_kept_alive() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("conn", 5, 1).await;
    let addr = stack.gateway_addr;
    tokio::task::spawn_blocking(move || {
        // Both framings on one request, answered by the gateway (a buy
        // reads its body, so its connection could otherwise be reused).
        let (status, closed) = answered_then_closed(
            addr,
            &format!(
                "POST /flashgate/api/sales/conn/buy HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                token("tcp")
            ),
        );
        assert!(status.starts_with("HTTP/1.1 202"), "{status}");
        assert!(closed, "a request with Content-Length and Transfer-Encoding left its connection open");

        // The same on a path proxied to the shop.
        let (status, closed) = answered_then_closed(
            addr,
            "POST /echo/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        );
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        assert!(closed, "a proxied request with Content-Length and Transfer-Encoding left its connection open");

        // HTTP/1.0 without keep-alive.
        let (status, closed) = answered_then_closed(addr, "GET /flashgate/api/sales/conn HTTP/1.0\r\nHost: a\r\n\r\n");
        assert!(status.contains(" 200"), "{status}");
        assert!(closed, "an HTTP/1.0 request without keep-alive left its connection open");

        // A plain HTTP/1.1 connection carries one request after another.
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for _ in 0..3 {
            conn.write_all(b"GET /flashgate/api/sales/conn HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            let status = read_response(&mut conn);
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        }
    })
    .await
    .unwrap();
}

/// The shop of `a_shops_answer_reaches_the_buyer_before_the_shop_finishes_it`:
/// `/chunked` sends a first piece of 12 bytes, `/sized` (with its
/// `Content-Length`) one of 20,000; either sends its last piece only once
/// the test says the buyer has read the first.
async fn shop_waiting_for_the_buyer(
    read_rx: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> flashgate_tests::test_shop::TestShop {
    use axum::body::Body;
    use bytes::Bytes;
    use futures_util::StreamExt;

    let read_rx = std::sync::Arc::new(tokio::sync::Mutex::new(read_rx));
    flashgate_tests::test_shop::TestShop::start(move |req, _n| {
        let read_rx = read_rx.clone();
        async move {
            let (first, last, length) = match req.uri().path() {
                "/sized" => (vec![b'a'; 20_000], vec![b'z'; 20_000], Some(40_000)),
                _ => (b"first piece;".to_vec(), b"last piece".to_vec(), None),
            };
            let first =
                futures_util::stream::once(async { Ok::<_, std::io::Error>(Bytes::from(first)) });
            let last = futures_util::stream::once(async move {
                read_rx.lock().await.recv().await;
                Ok(Bytes::from(last))
            });
            let mut answer = axum::response::Response::new(Body::from_stream(first.chain(last)));
            if let Some(length) = length {
                answer
                    .headers_mut()
                    .insert(http::header::CONTENT_LENGTH, length.into());
            }
            answer
        }
    })
    .await
}

/// Reads from `conn` into `seen` until `done(body)` holds, `body` what
/// follows the head; panics on a timeout or a close, naming `what`.
fn read_until(conn: &mut TcpStream, seen: &mut Vec<u8>, what: &str, done: impl Fn(&[u8]) -> bool) {
    let mut buf = [0u8; 8192];
    loop {
        let body = seen
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(&[][..], |at| &seen[at + 4..]);
        if done(body) {
            return;
        }
        let n = conn
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{what} not received ({e}); got {} bytes", seen.len()));
        assert!(n > 0, "closed before {what}");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// How many of `body`'s bytes are `byte`.
fn count(body: &[u8], byte: u8) -> usize {
    body.iter().filter(|b| **b == byte).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shops_answer_reaches_the_buyer_before_the_shop_finishes_it() {
    // A gateway holding the first piece in its write buffer would wait for
    // the last one, which the shop sends only once the buyer read the
    // first: the read would time out.
    let (read_tx, read_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let shop = shop_waiting_for_the_buyer(read_rx).await;
    let stack = Stack::start(StackOptions {
        extra_toml: format!("[shop]\nupstreams = [\"{}\"]\n", shop.addr),
        ..StackOptions::default()
    })
    .await;
    let addr = stack.gateway_addr;
    tokio::task::spawn_blocking(move || {
        // Asks for `path` and reads until `done` holds of the body;
        // returns the connection, what it read, and the head in lower case.
        let first_piece = |path: &str, what: &str, done: &dyn Fn(&[u8]) -> bool| {
            let mut conn = TcpStream::connect(addr).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
                .unwrap();
            let mut seen = Vec::new();
            read_until(&mut conn, &mut seen, what, done);
            let head = String::from_utf8_lossy(&seen).to_lowercase();
            (conn, seen, head)
        };
        // Chunked: each piece at once.
        let (mut conn, mut seen, head) = first_piece("/chunked", "the first piece", &|body| {
            count(body, b';') == 1
        });
        assert!(
            head.starts_with("http/1.1 200") && head.contains("transfer-encoding: chunked"),
            "{head}"
        );
        read_tx.send(()).unwrap();
        read_until(&mut conn, &mut seen, "the last piece and the end", |body| {
            body.ends_with(b"last piece\r\n0\r\n\r\n")
        });

        // Known length: 20,000 bytes, more than the write buffer, go on
        // without the rest; then the rest, to the byte.
        let (mut conn, mut seen, head) = first_piece("/sized", "the first 20,000 bytes", &|body| {
            count(body, b'a') == 20_000
        });
        assert!(head.contains("content-length: 40000"), "{head}");
        read_tx.send(()).unwrap();
        read_until(&mut conn, &mut seen, "the last 20,000 bytes", |body| {
            body.len() == 40_000 && count(body, b'z') == 20_000
        });
    })
    .await
    .unwrap();
}
