//! Malformed requests against the running gateway and backend: each gets a
//! 4xx JSON `{code, message}` answer and changes nothing (stock and stream
//! unchanged, no order).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use flashgate_tests::{token, token_with, Stack, StackOptions, ADMIN_TOKEN, JWT_SECRET};
use serde_json::Value;

/// Sends raw bytes and returns the status and the body of the answer.
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| out[i + 4..].to_vec())
        .unwrap_or_default();
    (status, body)
}

fn request(method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (k, v) in headers {
        r.extend_from_slice(k.as_bytes());
        r.extend_from_slice(b": ");
        r.extend_from_slice(v);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    r.extend_from_slice(body);
    r
}

fn assert_json_4xx(case: &str, (status, body): (u16, Vec<u8>)) {
    assert!(
        (400..500).contains(&status),
        "{case}: status {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let v: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("{case}: not JSON: {}", String::from_utf8_lossy(&body)));
    assert!(
        v["code"].is_string() && v["message"].is_string(),
        "{case}: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_json_and_change_nothing() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("bad", 5, 1).await;
    let good = format!("Bearer {}", token("alice"));
    let good = good.as_bytes();
    let forged = format!("Bearer {}", token_with("alice", "not-the-secret", 60));
    // {"alg":"none"} with a valid-looking payload and no signature.
    let none =
        b"Bearer eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.";
    let (hs256_header, _) = token("alice")
        .split_once('.')
        .map(|(h, r)| (h.to_owned(), r.to_owned()))
        .unwrap();
    let swapped = format!("Bearer {hs256_header}.eyJzdWIiOiJib2IiLCJleHAiOjk5OTk5OTk5OTl9.AAAA");
    let long_key = "k".repeat(65);
    let big_body = vec![b'{'; 64 * 1024];
    let absurd = format!("/flashgate/api/sales/{}/buy", "9".repeat(5000));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "bad JSON",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", good)],
                b"{\"a\":",
            ),
        ),
        (
            "JSON that is not an object",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", good)],
                b"\"x\"",
            ),
        ),
        (
            "invalid UTF-8 body",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", good)],
                b"{\"a\":\"\xff\xfe\"}",
            ),
        ),
        (
            "oversized body",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", good)],
                &big_body,
            ),
        ),
        (
            "overlong Idempotency-Key",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[
                    ("Authorization", good),
                    ("Idempotency-Key", long_key.as_bytes()),
                ],
                b"",
            ),
        ),
        (
            "non-ASCII Idempotency-Key",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[
                    ("Authorization", good),
                    ("Idempotency-Key", "clé".as_bytes()),
                ],
                b"",
            ),
        ),
        (
            "invalid UTF-8 Idempotency-Key",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", good), ("Idempotency-Key", b"k\xff")],
                b"",
            ),
        ),
        (
            "invalid UTF-8 token",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", b"Bearer \xff\xfe")],
                b"",
            ),
        ),
        (
            "forged token",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", forged.as_bytes())],
                b"",
            ),
        ),
        (
            "alg none token",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", none)],
                b"",
            ),
        ),
        (
            "payload swapped under a real header",
            request(
                "POST",
                "/flashgate/api/sales/bad/buy",
                &[("Authorization", swapped.as_bytes())],
                b"",
            ),
        ),
        (
            "absurd sale id",
            request("POST", &absurd, &[("Authorization", good)], b""),
        ),
        (
            "sale id with odd bytes",
            request(
                "POST",
                "/flashgate/api/sales/%00%ff/buy",
                &[("Authorization", good)],
                b"",
            ),
        ),
        (
            "malformed reservation id",
            request(
                "GET",
                "/flashgate/api/reservations/..%2f..",
                &[("Authorization", good)],
                b"",
            ),
        ),
        (
            "unknown sale",
            request(
                "POST",
                "/flashgate/api/sales/nosuchsale/buy",
                &[("Authorization", good)],
                b"",
            ),
        ),
    ];
    for (case, req) in &cases {
        assert_json_4xx(case, raw(stack.gateway_addr, req));
    }

    // The backend's APIs.
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let gw = format!("Bearer {}", flashgate_tests::INTERNAL_TOKEN);
    let gw = gw.as_bytes();
    let shop = format!("Bearer {}", flashgate_tests::SHOP_TOKEN);
    let shop = shop.as_bytes();
    let backend_cases: Vec<(&str, SocketAddr, Vec<u8>)> = vec![
        ("order: no token", stack.backend_addr, request("POST", "/internal/orders/batch", &[], b"[]")),
        ("order: bad JSON", stack.backend_addr, request("POST", "/internal/orders/batch", &[("Authorization", gw), ("Content-Type", b"application/json")], b"{nope")),
        ("order: invalid UTF-8", stack.backend_addr, request("POST", "/internal/orders/batch", &[("Authorization", gw)], b"[{\"reservation_id\":\"\xff\"}]")),
        ("pay: no token", stack.backend_addr, request("POST", "/internal/orders/o-00000000000000000000000000000000/pay", &[], b"")),
        ("pay: malformed order id", stack.backend_addr, request("POST", "/internal/orders/../pay", &[("Authorization", shop)], b"")),
        ("pay: bad order id", stack.backend_addr, request("POST", "/internal/orders/o-zz/pay", &[("Authorization", shop)], b"")),
        ("pay: unknown order", stack.backend_addr, request("POST", "/internal/orders/o-00000000000000000000000000000000/pay", &[("Authorization", shop)], b"")),
        ("cancel: no token", stack.backend_addr, request("POST", "/internal/orders/o-00000000000000000000000000000000/cancel", &[], b"")),
        ("cancel: gateway token", stack.backend_addr, request("POST", "/internal/orders/o-00000000000000000000000000000000/cancel", &[("Authorization", gw)], b"")),
        ("cancel: bad order id", stack.backend_addr, request("POST", "/internal/orders/o-zz/cancel", &[("Authorization", shop)], b"")),
        ("admin: bad checkout_url", stack.admin_addr, request("PUT", "/admin/sales/bad", &[("Authorization", admin.as_bytes())], br#"{"name":"x","stock":5,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2999-01-01T00:00:00Z","checkout_url":"javascript:alert(1)"}"#)),
        ("sale lookup: absurd id", stack.backend_addr, request("GET", &format!("/internal/sales/{}", "x".repeat(300)), &[("Authorization", gw)], b"")),
        ("admin: no token", stack.admin_addr, request("GET", "/admin/sales/bad", &[], b"")),
        ("admin: bad payment timeout", stack.admin_addr, request("PUT", "/admin/sales/bad", &[("Authorization", admin.as_bytes())], br#"{"name":"x","stock":5,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2999-01-01T00:00:00Z","payment_timeout_seconds":0}"#)),
        ("admin: unknown field", stack.admin_addr, request("PUT", "/admin/sales/bad", &[("Authorization", admin.as_bytes())], br#"{"name":"x","stock":5,"starts_at":"2020-01-01T00:00:00Z","ends_at":"2999-01-01T00:00:00Z","stok":1}"#)),
        ("admin: bad dead-letter id", stack.admin_addr, request("POST", "/admin/sales/bad/dead-letters/1-2-3/retry", &[("Authorization", admin.as_bytes())], b"")),
    ];
    for (case, addr, req) in &backend_cases {
        assert_json_4xx(case, raw(*addr, req));
    }

    assert_eq!(
        stack.remaining("bad").await,
        5,
        "a rejected request changed the stock"
    );
    assert_eq!(
        stack.stream_len("bad").await,
        0,
        "a rejected request reached the stream"
    );
    assert_eq!(stack.db_orders("bad").await.0, 0);
    let _ = JWT_SECRET;
}

/// Headers far beyond what any buyer sends (128 KiB) are refused before
/// the buy runs (Pingora's own header limit is larger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_4xx_json_and_change_nothing() {
    let stack = Stack::start(StackOptions::default()).await;
    stack.open_sale("hdr", 5, 1).await;
    let good = format!("Bearer {}", token("alice"));
    let huge = vec![b'a'; 128 * 1024];
    let req = request(
        "POST",
        "/flashgate/api/sales/hdr/buy",
        &[("Authorization", good.as_bytes()), ("X-Huge", &huge)],
        b"",
    );
    assert_json_4xx("oversized header", raw(stack.gateway_addr, &req));
    assert_eq!(stack.remaining("hdr").await, 5);
}
