//! A real open-source shop behind the gateway: django-oscar from PyPI
//! (`tests/shop/oscar.sh`, gunicorn, its assets served by the shop itself
//! under `/static/`, sessions and CSRF-protected forms), proxied by a
//! gateway with `[shop.cache]` on, driven by headless Chromium
//! (`tests/browser/shop.mjs`). Screenshots land in
//! `target/browser-artifacts/real-shop/`.
//!
//! The shop gives every page without a `Cache-Control` of its own
//! `max-age=60`, signed-in pages included (as a site-wide cache header
//! would): what keeps a customer's page to the customer is then the
//! gateway alone.

use std::path::Path;
use std::time::Duration;

use flashgate_tests::browser::run_script;
use flashgate_tests::oscar::{OscarOptions, OscarShop};
use flashgate_tests::{Stack, StackOptions};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oscar_shop_behind_the_gateway_keeps_its_assets_sign_in_and_basket_private() {
    let shop = tokio::task::spawn_blocking(|| {
        OscarShop::start(&OscarOptions {
            page_max_age_seconds: Some(60),
            ..OscarOptions::default()
        })
    })
    .await
    .unwrap();
    let stack = Stack::start(StackOptions {
        extra_toml: format!(
            "[shop]\nupstreams = [\"{}\"]\n\n[shop.cache]\nenabled = true\n",
            shop.addr
        ),
        ..StackOptions::default()
    })
    .await;

    let artifacts =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/browser-artifacts/real-shop");
    let stdout = run_script(
        "shop.mjs",
        &[
            ("GATEWAY_URL", format!("http://{}", stack.gateway_addr)),
            ("PRODUCT_PATH", shop.product_path.clone()),
            ("EMAIL", shop.email.clone()),
            ("PASSWORD", shop.password.clone()),
        ],
        &artifacts,
        Duration::from_secs(180),
        || format!("shop log:\n{}", shop.log()),
    )
    .await;
    let result: Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("shop.mjs: result "))
        .map(|json| serde_json::from_str(json).unwrap())
        .unwrap_or_else(|| panic!("shop.mjs printed no result:\n{stdout}"));

    // Every page, asset, form post and redirect went through the gateway.
    assert_eq!(result["failed"], Value::Array(vec![]), "failed requests");
    assert!(result["requests"].as_u64().unwrap() > 20, "{result}");
    // The shop's assets came through the cache: the second client's copy
    // of the stylesheet was the first one's.
    let css = &result["xcache"]["/static/oscar/css/styles.css"];
    assert!(
        css.as_array()
            .is_some_and(|seen| seen.iter().any(|x| x == "HIT")),
        "the stylesheet was never a cache hit: {css}"
    );

    // Any other client asking the signed-in pages' URLs, now and again,
    // gets the anonymous page.
    let signed_in: Vec<&str> = result["signedIn"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(signed_in.contains(&"/basket/"), "{result}");
    for path in &signed_in {
        for _ in 0..2 {
            let resp = stack.http.get(stack.url(path)).send().await.unwrap();
            let status = resp.status().as_u16();
            let x_cache = resp
                .headers()
                .get("x-cache")
                .map(|v| v.to_str().unwrap().to_owned());
            let body = resp.text().await.unwrap();
            assert!(
                !body.contains(&shop.email) && !body.contains("logout_link"),
                "{path} ({status}, X-Cache {x_cache:?}) showed another client the customer's page"
            );
            if *path == "/basket/" {
                assert!(
                    !body.contains("Flash sneaker"),
                    "another client saw the customer's basket"
                );
            }
        }
    }
}
