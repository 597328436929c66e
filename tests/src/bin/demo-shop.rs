//! A tiny stand-in for the shop behind Flashgate, for `make run` and the
//! tests: a home page, and `/echo/...` which answers with what it received
//! (method, path, query, headers, body) so proxying can be checked.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{Html, IntoResponse};
use axum::routing::{any, get};
use axum::{Json, Router};

async fn home() -> Html<&'static str> {
    Html("<!doctype html><title>Demo shop</title><h1>Demo shop</h1><p>Everything that is not the sale is served here. <a href=\"/sales/demo\">Go to the flash sale</a>.</p>")
}

async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let headers: BTreeMap<String, String> =
        headers.iter().map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    Json(serde_json::json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8000".into());
    let app = Router::new().route("/", get(home)).route("/echo", any(echo)).route("/echo/{*rest}", any(echo));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("demo shop on http://{addr}");
    axum::serve(listener, app).await?;
    Ok(())
}
