//! What every route of the admin listener shares: the admin token's check
//! and the JSON error answer (the routes themselves live with what they
//! operate: `shop_cache::purge_api`, `waiting_room::admin`).

use axum::http::StatusCode;
use axum::response::IntoResponse;

/// A JSON error answer, `{"code", "message"}`.
pub fn error(status: StatusCode, code: &str, message: &str) -> axum::response::Response {
    (
        status,
        axum::Json(serde_json::json!({ "code": code, "message": message })),
    )
        .into_response()
}

/// The `401` (with its `WWW-Authenticate` challenge) that refuses a call
/// without `Authorization: Bearer $FLASHGATE_ADMIN_TOKEN` (every call while
/// the variable is unset); `None` lets it through.
pub fn refused_without_token(
    admin_token: Option<&str>,
    headers: &axum::http::HeaderMap,
) -> Option<axum::response::Response> {
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if admin_token
        .is_some_and(|token| flashgate_common::secret::bearer_matches(authorization, token))
    {
        return None;
    }
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "send Authorization: Bearer <FLASHGATE_ADMIN_TOKEN>",
    );
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static(flashgate_common::secret::bearer_challenge(
            authorization,
        )),
    );
    Some(response)
}
