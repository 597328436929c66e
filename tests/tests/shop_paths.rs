//! The gateway's own paths live under `gateway.path_prefix`: the shop keeps
//! every other path, its own `/static/`, `/api/` and `/sales/` included, and
//! `flashgate check --connect` names the gateway paths the shop serves too.

use std::process::Command;
use std::time::Duration;

use flashgate_testkit::{bin, wait_port, RedisServer, TempDir};
use flashgate_tests::{free_port, Stack, StackOptions};
use serde_json::Value;

async fn get(stack: &Stack, path: &str) -> (u16, String) {
    let r = stack.http.get(stack.url(path)).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn served_by_shop(body: &str) -> bool {
    serde_json::from_str::<Value>(body).is_ok_and(|v| v["served_by"] == "demo-shop")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shops_own_static_api_and_sales_paths_reach_the_shop() {
    let stack = Stack::start(StackOptions::default()).await;
    stack
        .put_sale("demo", 10, 1, Duration::ZERO, Duration::from_secs(600))
        .await;

    let (status, css) = get(&stack, "/static/css/styles.css").await;
    assert_eq!(status, 200);
    assert!(
        css.contains("the demo shop's own /static/css/styles.css"),
        "{css}"
    );
    for path in ["/api/sales/demo", "/sales/demo", "/api/reservations/x.y"] {
        let (status, body) = get(&stack, path).await;
        assert!(
            status == 404 && served_by_shop(&body),
            "{path}: {status} {body}"
        );
    }

    // The gateway's own, under the prefix.
    let (status, page) = get(&stack, "/flashgate/sales/demo").await;
    assert_eq!(status, 200);
    assert!(page.contains("/flashgate/static/sale.js"), "{page}");
    let (status, js) = get(&stack, "/flashgate/static/sale.js").await;
    assert!(status == 200 && js.contains("fg-prefix"), "{status}");
    let (status, state) = get(&stack, "/flashgate/api/sales/demo").await;
    assert_eq!(status, 200, "{state}");
    // An unknown path under the prefix is the gateway's 404, never the shop's.
    let (status, body) = get(&stack, "/flashgate/nothing-here").await;
    assert!(status == 404 && !served_by_shop(&body), "{status} {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_prefix_and_a_sale_page_mount_move_the_gateways_paths() {
    let stack = Stack::start(StackOptions {
        gateway_extra: "path_prefix = \"/edge/fg\"\nsale_page_path = \"/drops/{id}\"\n".into(),
        ..StackOptions::default()
    })
    .await;
    stack
        .put_sale("demo", 10, 1, Duration::ZERO, Duration::from_secs(600))
        .await;
    let (status, page) = get(&stack, "/drops/demo").await;
    assert_eq!(status, 200);
    assert!(
        page.contains(r#"<meta name="fg-prefix" content="/edge/fg">"#)
            && page.contains("/edge/fg/static/sale.css"),
        "{page}"
    );
    let (status, _) = get(&stack, "/edge/fg/sales/demo").await;
    assert_eq!(status, 200);
    let (status, state) = get(&stack, "/edge/fg/api/sales/demo").await;
    assert_eq!(status, 200, "{state}");
    let (status, _) = get(&stack, "/edge/fg/static/sale.js").await;
    assert_eq!(status, 200);
    let token = flashgate_tests::client::token("mover");
    let r = stack
        .http
        .post(stack.url("/edge/fg/api/sales/demo/buy"))
        .bearer_auth(&token)
        .header("Idempotency-Key", "mover-1")
        .body("{}")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert!(
        status == 202 || status == 201,
        "a buy at the moved path: {status}"
    );
    // The default prefix is now the shop's.
    for path in ["/flashgate/sales/demo", "/flashgate/api/sales/demo"] {
        let (status, body) = get(&stack, path).await;
        assert!(
            status == 404 && served_by_shop(&body),
            "{path}: {status} {body}"
        );
    }
}

#[test]
fn check_connect_names_each_gateway_path_the_shop_also_serves() {
    let redis = RedisServer::private();
    let dir = TempDir::new("shop-paths");
    // A shop that serves everything: every gateway path is shadowed.
    let shop_port = free_port();
    let mut shop = std::process::Command::new(bin("demo-shop"))
        .arg(format!("127.0.0.1:{shop_port}"))
        .spawn()
        .unwrap();
    wait_port(
        format!("127.0.0.1:{shop_port}").parse().unwrap(),
        std::time::Duration::from_secs(10),
    );
    let check = |prefix: &str| {
        let path = dir
            .0
            .join(format!("check{}.toml", prefix.replace('/', "-")));
        std::fs::write(
            &path,
            format!(
                "[gateway]\npath_prefix = \"{prefix}\"\nsale_page_path = \"/echo/{{id}}\"\n\
                 [shop]\nupstreams = [\"127.0.0.1:{shop_port}\"]\n\
                 [redis]\nurl = \"redis://127.0.0.1:{}/\"\ntimeout_ms = 2000\n",
                redis.port
            ),
        )
        .unwrap();
        let out = Command::new(bin("flashgate"))
            .arg("--config")
            .arg(&path)
            .args(["check", "--connect"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // The demo shop serves everything under its /static/ and /echo/: a
    // prefix inside the first hides all the gateway's paths from it, and the
    // sale page mounted under the second hides one.
    let out = check("/static");
    assert!(
        out.contains("warning: the shop also serves /static/static/sale.js (200)")
            && out.contains("warning: the shop also serves /echo/example (200)")
            && out.contains("5 of the gateway's 5 paths also served by the shop"),
        "{out}"
    );
    let out = check("/flashgate");
    assert!(
        !out.contains("/flashgate/") && out.contains("1 of the gateway's 5 paths"),
        "{out}"
    );
    let _ = shop.kill();
    let _ = shop.wait();
}
