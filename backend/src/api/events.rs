//! Admin routes of the order events outbox: the events given up after
//! `events.max_attempts`, and putting one back in line.
//!
//! - `GET /admin/events/dead[?limit=N]`: dead events, oldest first (N from
//!   1 to 1000, default 100), with their last error.
//! - `POST /admin/events/{event_id}/retry`: the dead event is due again
//!   with a fresh count of attempts (202); the later events of its order,
//!   which waited behind it, follow once it is delivered.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::AppState;

/// Dead events listed when the query does not say.
const DEFAULT_LIMIT: i64 = 100;
/// Most dead events listed at once.
const MAX_LIMIT: i64 = 1000;

/// `ev-` and 32 lowercase hex digits, as the outbox makes them.
fn valid_event_id(id: &str) -> bool {
    id.strip_prefix("ev-").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn limit(query: Option<&str>) -> Result<i64, ApiError> {
    let mut limit = DEFAULT_LIMIT;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("limit", v)) => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("limit: must be between 1 and {MAX_LIMIT}"))
                    })?;
            }
            _ => return Err(ApiError::bad_request("only `limit` is taken")),
        }
    }
    Ok(limit)
}

/// `GET /admin/events/dead`.
pub async fn dead(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let limit = limit(query.as_deref())?;
    let events = state.store.outbox().dead(limit).await?;
    Ok(Json(serde_json::json!({"dead_events": events})).into_response())
}

/// `POST /admin/events/{event_id}/retry`.
pub async fn retry(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id?;
    if !valid_event_id(&id) {
        return Err(ApiError::bad_request(
            "event_id: must be `ev-` and 32 lowercase hex digits",
        ));
    }
    if !state
        .store
        .outbox()
        .retry_dead(&id, flashgate_common::now_ms())
        .await?
    {
        return Err(ApiError::not_found("no such dead event"));
    }
    tracing::info!(event = %id, "dead order event put back in line by an operator");
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({"event_id": id, "state": "pending"})),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_ids_and_limits_are_checked() {
        assert!(super::valid_event_id("ev-0123456789abcdef0123456789abcdef"));
        for bad in [
            "",
            "ev-",
            "ev-0123456789ABCDEF0123456789abcdef",
            "xx-0123456789abcdef0123456789abcdef",
            "ev-0123456789abcdef0123456789abcde'",
        ] {
            assert!(!super::valid_event_id(bad), "{bad}");
        }
        assert_eq!(super::limit(None).unwrap(), 100);
        assert_eq!(super::limit(Some("limit=5")).unwrap(), 5);
        for bad in ["limit=0", "limit=1001", "limit=x", "other=1"] {
            assert_eq!(
                super::limit(Some(bad)).unwrap_err().status,
                axum::http::StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }
}
