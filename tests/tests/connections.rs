//! Connection reuse on the buyer listener, over raw TCP: a connection is
//! kept open only when Pingora itself would keep it. A request framed
//! ambiguously (both Content-Length and Transfer-Encoding) or an HTTP/1.0
//! request without keep-alive gets its answer and then the connection is
//! closed, so nothing after it on the socket is ever read as a request.

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
