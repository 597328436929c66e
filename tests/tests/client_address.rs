//! The client address the gateway keys limits and deny lists on, against
//! the real stack: only the configured header is believed behind a trusted
//! proxy, a client's own `Forwarded` never reaches the shop (nor its own
//! `X-Forwarded-For` unless a trusted proxy sent it), and IPv4
//! clients on a dual-stack listener are IPv4 clients.

use std::net::IpAddr;
use std::time::Duration;

use flashgate_tests::{wait_port, Stack, StackOptions};

async fn stack_with(extra: &str) -> Stack {
    let stack = Stack::start(StackOptions {
        extra_toml: extra.into(),
        ..StackOptions::default()
    })
    .await;
    stack.open_sale("addr", 1_000_000, 1_000_000).await;
    stack
}

/// `GET /flashgate/api/sales/addr` as a trusted proxy would send it: the client it
/// appended to `X-Forwarded-For`, and the client's own `Forwarded` passed
/// through unchanged.
async fn read_via_proxy(stack: &Stack, xff: &str, forwarded: &str) -> u16 {
    let resp = stack
        .http
        .get(stack.url("/flashgate/api/sales/addr"))
        .header("X-Forwarded-For", xff)
        .header("Forwarded", forwarded)
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_header_behind_a_trusted_proxy_neither_picks_the_limiter_key_nor_escapes_the_deny_list(
) {
    let stack = stack_with(
        "[limits]\ntrusted_proxies = [\"127.0.0.1/32\"]\n[limits.read]\nip = { per_second = 1, burst = 1 }\n\
         [deny]\nips = [\"198.51.100.66\"]\n",
    )
    .await;
    // A denied client naming someone else in Forwarded is still denied.
    assert_eq!(
        read_via_proxy(&stack, "198.51.100.66", "for=1.2.3.4").await,
        403
    );
    // One client, a new Forwarded each time: still one bucket.
    assert_eq!(
        read_via_proxy(&stack, "198.51.100.7", "for=1.2.3.5").await,
        200
    );
    assert_eq!(
        read_via_proxy(&stack, "198.51.100.7", "for=1.2.3.6").await,
        429
    );
    // Another client behind the same proxy has a bucket of its own.
    assert_eq!(
        read_via_proxy(&stack, "198.51.100.8", "for=1.2.3.5").await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_forwarded_configured_only_forwarded_names_the_client() {
    let stack = stack_with(
        "[limits]\ntrusted_proxies = [\"127.0.0.1/32\"]\nclient_ip_header = \"forwarded\"\n\
         [deny]\nips = [\"198.51.100.66\"]\n",
    )
    .await;
    assert_eq!(
        read_via_proxy(&stack, "203.0.113.1", "for=198.51.100.66").await,
        403
    );
    assert_eq!(
        read_via_proxy(&stack, "198.51.100.66", "for=203.0.113.1").await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_never_receives_a_clients_forwarded_header() {
    let stack = Stack::start(StackOptions::default()).await;
    let echo = stack
        .shop_echo(
            "/echo/who",
            &[
                ("Forwarded", "for=1.2.3.4;proto=https"),
                ("X-Forwarded-For", "192.0.2.1"),
            ],
        )
        .await;
    let headers = &echo["headers"];
    assert!(
        headers.get("forwarded").is_none(),
        "the shop got the client's Forwarded: {headers}"
    );
    // Sent straight to the gateway, not by a trusted proxy: the client's own
    // chain is dropped, and the shop hears of the peer only.
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{headers}");
    assert_eq!(headers["x-real-ip"], "127.0.0.1", "{headers}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_shop_gets_its_chain_extended_and_the_client_as_x_real_ip() {
    let stack = Stack::start(StackOptions {
        extra_toml: "[limits]\ntrusted_proxies = [\"127.0.0.1/32\"]\n".into(),
        ..StackOptions::default()
    })
    .await;
    let echo = stack
        .shop_echo("/echo/who", &[("X-Forwarded-For", "198.51.100.7")])
        .await;
    let headers = &echo["headers"];
    assert_eq!(
        headers["x-forwarded-for"], "198.51.100.7, 127.0.0.1",
        "{headers}"
    );
    assert_eq!(headers["x-real-ip"], "198.51.100.7", "{headers}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_clients_on_a_dual_stack_listener_match_ipv4_deny_lists_and_get_their_own_bucket() {
    let mut stack = stack_with(
        "[limits.read]\nip = { per_second = 1, burst = 1 }\n[deny]\nips = [\"127.0.0.3\"]\n",
    )
    .await;
    // Listen on [::] instead: IPv4 clients then arrive as ::ffff:a.b.c.d.
    stack.kill_gateway();
    let port = stack.gateway_addr.port();
    stack.edit_config(|t| {
        t.replacen(
            &format!("listen = \"{}\"", stack.gateway_addr),
            &format!("listen = \"[::]:{port}\""),
            1,
        )
    });
    stack.start_gateway();
    assert!(wait_port(stack.gateway_addr, Duration::from_secs(10)));
    let from = |last: u8| {
        reqwest::Client::builder()
            .local_address(IpAddr::from([127, 0, 0, last]))
            .build()
            .unwrap()
    };
    let read = |client: reqwest::Client| {
        let url = stack.url("/flashgate/api/sales/addr");
        async move { client.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(read(from(1)).await, 200);
    assert_eq!(
        read(from(2)).await,
        200,
        "each IPv4 client has its own bucket, not one /64 for all"
    );
    assert_eq!(read(from(1)).await, 429, "and the bucket still limits");
    assert_eq!(
        read(from(3)).await,
        403,
        "an IPv4 deny entry matches a client on the dual-stack listener"
    );
}
