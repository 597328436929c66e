//! A tiny stand-in for the shop behind Flashgate, for `make run` and the
//! tests: a home page, its own stylesheets under `/static/` (as Django and
//! Rails shops serve theirs: the gateway's assets live under its prefix),
//! and `/echo/...` which answers with what it received (method, path,
//! query, headers, body) so proxying can be checked.
//!
//! **Demo sign-in** (`make run` only: on when `FLASHGATE_DEMO_SIGNIN=1` and
//! `FLASHGATE_JWT_SECRET` is set, else `/demo/sign-in` is a 404):
//! `GET /demo/sign-in?next=/flashgate/sales/demo` signs in a new demo shopper
//! (`demo-shopper-<random>`), hands the sale page that shopper's buyer
//! token the way a real shop would (the `fg_token` cookie, see
//! docs/PAGES.md) and redirects to `next`. Every visit is a new shopper, so
//! each can win or lose once. The home page links to it only when it is on.
//!
//! Demo tokens carry only `sub` and `exp`: a gateway configured with
//! `auth.audience` or `auth.issuer` refuses them (the local stack sets
//! neither). Anyone who can reach the shop through the gateway can sign in,
//! so `make run` warns when the gateway listens beyond loopback.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use serde::Deserialize;

/// How long a demo shopper's token (and its cookie) lasts.
const DEMO_TOKEN_SECONDS: i64 = 3600;

/// Set to `1` to turn the demo sign-in on.
const ENV_DEMO_SIGNIN: &str = "FLASHGATE_DEMO_SIGNIN";

async fn home(State(demo): State<Arc<DemoSignIn>>) -> Html<&'static str> {
    if demo.jwt_secret.is_some() {
        Html("<!doctype html><title>Demo shop</title><h1>Demo shop</h1><p>Everything that is not the sale is served here. <a href=\"/demo/sign-in?next=/flashgate/sales/demo\">Sign in as a demo shopper and go to the flash sale</a>.</p>")
    } else {
        Html("<!doctype html><title>Demo shop</title><h1>Demo shop</h1><p>Everything that is not the sale is served here. <a href=\"/flashgate/sales/demo\">The flash sale</a>.</p>")
    }
}

/// `/static/{path}`: the shop's own assets (a stylesheet naming its path).
async fn shop_asset(uri: Uri) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        format!("/* the demo shop's own {} */\n", uri.path()),
    )
}

/// Any other path: the shop's own 404, which says it is the shop's.
async fn not_found(uri: Uri) -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "code": "not_found",
            "message": format!("the demo shop has no page at {}", uri.path()),
            "served_by": "demo-shop",
        })),
    )
}

async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let headers: BTreeMap<String, String> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    Json(serde_json::json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}

/// The secret demo tokens are signed with, when the demo sign-in is on.
struct DemoSignIn {
    jwt_secret: Option<String>,
}

#[derive(Deserialize)]
struct SignInQuery {
    next: Option<String>,
}

/// Signs in a new demo shopper: the `fg_token` cookie for the sale pages,
/// then `303` to `next` (a local path only: never another site).
async fn sign_in(
    State(demo): State<Arc<DemoSignIn>>,
    Query(q): Query<SignInQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(secret) = demo.jwt_secret.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"code": "not_found", "message": "the demo sign-in is off"})),
        )
            .into_response();
    };
    let shopper = format!("demo-shopper-{:08x}", rand::random::<u32>());
    let exp = flashgate_common::now_ms() / 1000 + DEMO_TOKEN_SECONDS;
    let claims = serde_json::json!({ "sub": shopper, "exp": exp });
    let token = match jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    ) {
        Ok(t) => t,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let next = q
        .next
        .filter(|n| {
            n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\')
        })
        .unwrap_or_else(|| "/flashgate/sales/demo".into());
    // `Secure` when the buyer came over HTTPS (the gateway says so); over
    // plain http://127.0.0.1 a Secure cookie would not be stored.
    let https = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v == "https");
    let cookie = format!(
        "fg_token={token}; Path=/flashgate; SameSite=Strict; Max-Age={DEMO_TOKEN_SECONDS}{}",
        if https { "; Secure" } else { "" }
    );
    println!("demo sign-in: {shopper}");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, next),
            (header::CACHE_CONTROL, "no-store".into()),
        ],
    )
        .into_response()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8000".into());
    let on = std::env::var(ENV_DEMO_SIGNIN).is_ok_and(|v| v == "1");
    let jwt_secret = on
        .then(|| std::env::var("FLASHGATE_JWT_SECRET").ok())
        .flatten();
    let app = Router::new()
        .route("/", get(home))
        .route("/static/{*path}", get(shop_asset))
        .route("/echo", any(echo))
        .route("/echo/{*rest}", any(echo))
        .route("/demo/sign-in", get(sign_in))
        .fallback(not_found)
        .with_state(Arc::new(DemoSignIn { jwt_secret }));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "demo shop on http://{addr} (demo sign-in {})",
        if on { "on" } else { "off" }
    );
    axum::serve(listener, app).await?;
    Ok(())
}
