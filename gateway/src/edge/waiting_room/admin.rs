//! The rooms on the admin listener, behind the admin token:
//!
//! - `GET /waiting-rooms`: every room (`{"rooms": [...]}`);
//! - `GET /waiting-rooms/{name}`: one room: `mode` (the one in force) and
//!   `configured_mode`, `inside`, `active_users`, `waiting`,
//!   `admission_rate_per_minute` (measured), `estimated_wait_seconds` (of
//!   the last place; `null` until measured), `admitted` (since the room's
//!   state was made), `starts_at`, `ends_at`;
//! - `POST /waiting-rooms/{name}/mode` with `{"mode": "queue" |
//!   "passthrough" | "reject"}`: switches every gateway's room (kept in
//!   Redis; the others follow within a tick). Answers the room.
//!
//! The figures are this gateway's last tick (at most a second old).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use flashgate_common::config::{RedisConfig, RoomMode};
use flashgate_common::redis_conn::RedisHandle;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{store, Room, WaitingRooms};
use crate::edge::admin_api::{error, refused_without_token};

/// What the rooms' routes need.
#[derive(Clone)]
pub struct RoomsApi {
    /// `None` without rooms.
    pub rooms: Option<Arc<WaitingRooms>>,
    pub admin_token: Option<Arc<str>>,
    pub redis: RedisConfig,
}

pub fn router(api: RoomsApi) -> Router {
    Router::new()
        .route("/waiting-rooms", get(list))
        .route("/waiting-rooms/{name}", get(show))
        .route("/waiting-rooms/{name}/mode", post(switch))
        .with_state(api)
}

/// One room as the API shows it.
pub fn view(room: &Room) -> Value {
    let shared = room.shared();
    let c = &room.config;
    json!({
        "name": c.name,
        "mode": shared.mode.as_str(),
        "configured_mode": c.mode.as_str(),
        "inside": shared.inside,
        "active_users": c.active_users,
        "waiting": shared.waiting,
        "admission_rate_per_minute": (shared.rate_per_second * 60.0 * 10.0).round() / 10.0,
        "estimated_wait_seconds": room.wait_seconds(shared.waiting),
        "admitted": shared.admitted,
        "starts_at": c.starts_at_ms.map(flashgate_common::rfc3339),
        "ends_at": c.ends_at_ms.map(flashgate_common::rfc3339),
    })
}

/// The rooms, or the answer that refuses the call.
fn rooms(api: &RoomsApi, headers: &HeaderMap) -> Result<Arc<WaitingRooms>, Box<Response>> {
    if let Some(refused) = refused_without_token(api.admin_token.as_deref(), headers) {
        return Err(Box::new(refused));
    }
    api.rooms.clone().ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "no_rooms",
            "no waiting room is configured ([[shop.waiting_rooms]])",
        ))
    })
}

fn unknown(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown_room",
        &format!("no waiting room is named `{name}`"),
    )
}

async fn list(State(api): State<RoomsApi>, headers: HeaderMap) -> Response {
    match rooms(&api, &headers) {
        Ok(rooms) => Json(json!({ "rooms": rooms.rooms.iter().map(view).collect::<Vec<_>>() }))
            .into_response(),
        Err(refused) => *refused,
    }
}

async fn show(
    State(api): State<RoomsApi>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let rooms = match rooms(&api, &headers) {
        Ok(rooms) => rooms,
        Err(refused) => return *refused,
    };
    match rooms.by_name(&name) {
        Some(room) => Json(view(room)).into_response(),
        None => unknown(&name),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModeBody {
    mode: String,
}

async fn switch(
    State(api): State<RoomsApi>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let rooms = match rooms(&api, &headers) {
        Ok(rooms) => rooms,
        Err(refused) => return *refused,
    };
    let Some(room) = rooms.by_name(&name) else {
        return unknown(&name);
    };
    let mode = match serde_json::from_slice::<ModeBody>(&body)
        .ok()
        .and_then(|b| RoomMode::parse(&b.mode))
    {
        Some(mode) => mode,
        None => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "body must be {\"mode\": \"queue\"}, {\"mode\": \"passthrough\"} or {\"mode\": \"reject\"}",
            )
        }
    };
    let switched = async {
        let mut conn =
            RedisHandle::dedicated(&api.redis, api.redis.timeout, api.redis.timeout).await?;
        store::switch_mode(&mut conn, &room.keys, mode).await
    };
    match tokio::time::timeout(api.redis.timeout * 4, switched).await {
        Ok(Ok(())) => {
            room.seen_mode(mode);
            tracing::info!(
                room = name,
                mode = mode.as_str(),
                "waiting room mode switched"
            );
            Json(view(room)).into_response()
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, room = name, "waiting room mode not switched");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "redis did not take the switch: nothing changed",
            )
        }
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "redis did not answer in time: the switch may or may not have been taken",
        ),
    }
}
