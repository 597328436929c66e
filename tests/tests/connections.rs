//! Connection reuse on the buyer listener, over raw TCP: a connection is
//! kept open only when Pingora itself would keep it. A request framed
//! ambiguously (both Content-Length and Transfer-Encoding) or an HTTP/1.0
//! request without keep-alive gets its answer and then the connection is
//! closed, so nothing after it on the socket is ever read as a request.
//! And a shop's streamed answer reaches the buyer piece by piece: the
//! listener's write buffer holds only answers whose length is known.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shops_streamed_answer_reaches_the_buyer_before_the_shop_finishes_it() {
    use axum::body::Body;
    use bytes::Bytes;
    use futures_util::StreamExt;

    // The shop sends its first piece, then waits until the buyer has read
    // it: a gateway holding the piece in its write buffer would wait
    // forever, so the read below would time out.
    let (read_tx, read_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let read_rx = std::sync::Arc::new(tokio::sync::Mutex::new(read_rx));
    let shop = flashgate_tests::test_shop::TestShop::start(move |_req, _n| {
        let read_rx = read_rx.clone();
        async move {
            let first = futures_util::stream::once(async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"first piece;"))
            });
            let rest = futures_util::stream::once(async move {
                read_rx.lock().await.recv().await;
                Ok(Bytes::from_static(b"last piece"))
            });
            axum::response::Response::new(Body::from_stream(first.chain(rest)))
        }
    })
    .await;
    let stack = Stack::start(StackOptions {
        extra_toml: format!("[shop]\nupstreams = [\"{}\"]\n", shop.addr),
        ..StackOptions::default()
    })
    .await;
    let addr = stack.gateway_addr;
    tokio::task::spawn_blocking(move || {
        let mut conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(b"GET /streamed HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        let read_until = |conn: &mut TcpStream, seen: &mut Vec<u8>, wanted: &[u8]| {
            let mut buf = [0u8; 4096];
            while !seen.windows(wanted.len()).any(|w| w == wanted) {
                let n = conn.read(&mut buf).unwrap_or_else(|e| {
                    panic!(
                        "{:?} not received ({e}); got {:?}",
                        String::from_utf8_lossy(wanted),
                        String::from_utf8_lossy(seen)
                    )
                });
                assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(wanted));
                seen.extend_from_slice(&buf[..n]);
            }
        };
        let mut seen = Vec::new();
        read_until(&mut conn, &mut seen, b"first piece;");
        let head = String::from_utf8_lossy(&seen).to_lowercase();
        assert!(
            head.starts_with("http/1.1 200") && head.contains("transfer-encoding: chunked"),
            "{head}"
        );
        read_tx.send(()).unwrap();
        read_until(&mut conn, &mut seen, b"last piece");
        read_until(&mut conn, &mut seen, b"\r\n0\r\n\r\n");
    })
    .await
    .unwrap();
}
