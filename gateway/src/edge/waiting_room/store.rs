//! The room's calls to Redis: a visitor's visit (`lua/room_visit.lua`) and
//! each gateway's tick (`lua/room_tick.lua`), typed at this boundary.

use flashgate_common::config::{Queueing, RoomMode, WaitingRoomConfig};
use flashgate_common::keys::RoomKeys;
use flashgate_common::redis_conn::RedisHandle;
use flashgate_common::scripts::{ROOM_TICK, ROOM_VISIT};
use rand::Rng;

use crate::infra::{RedisClient, RedisError};

/// Random places are scores below this; arrival tickets above it.
const RANDOM_SPAN: u64 = 1 << 40;
/// Most renewals sent in one tick call.
pub const MAX_RENEWALS_PER_CALL: usize = 1000;

/// What the room said to a visitor's visit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Let in until this Unix ms.
    In { until_ms: i64 },
    /// Waiting at `place` (1 = next) with the place's `score`.
    Queued { place: u64, score: u64 },
    /// `reject`: no space, no place.
    Full,
    /// `passthrough`.
    Pass,
}

/// The room's shared state, as one tick read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shared {
    pub mode: RoomMode,
    pub inside: u64,
    pub waiting: u64,
    /// Visitors let in per second, measured (an exponentially weighted rate).
    pub rate_per_second: f64,
    /// Visitors let in since the room's state was created.
    pub admitted: u64,
    /// Redis's clock (Unix ms) when it answered.
    pub now_ms: i64,
    /// Renewals that came after their visitor's session had ended.
    pub late: u64,
}

/// Shortest hold of a called visitor on their seat.
const MIN_GRACE_MS: u64 = 30_000;

/// A called visitor's hold on their seat: three refreshes of the queue
/// page, and at least half a minute (a hidden tab's timers run once a
/// minute at worst; its page reloads when shown again). A visitor let in
/// on arrival holds it as long, until their cookie comes back.
pub fn grace_ms(room: &WaitingRoomConfig) -> u64 {
    (3 * room.refresh.as_millis() as u64).max(MIN_GRACE_MS)
}

fn mode_of(name: &str, fallback: RoomMode) -> RoomMode {
    RoomMode::parse(name).unwrap_or(fallback)
}

/// One visit: `held` is the score of the place the visitor's cookie holds.
///
/// # Errors
/// Redis failed or timed out, or answered out of shape.
pub async fn visit(
    redis: &RedisClient,
    room: &WaitingRoomConfig,
    keys: &RoomKeys,
    visitor: &str,
    held: Option<u64>,
) -> Result<(Answer, RoomMode, i64), RedisError> {
    let random_score: u64 = rand::rng().random_range(0..RANDOM_SPAN);
    let window_ms = match room.queueing {
        Queueing::Fifo => -1,
        Queueing::Random => room.random_window.as_millis() as i64,
    };
    let mut invocation = ROOM_VISIT.prepare_invoke();
    invocation
        .key(&keys.queue)
        .key(&keys.inside)
        .key(&keys.state)
        .key(&keys.called)
        .arg(visitor)
        .arg(held.map(|s| s.to_string()).unwrap_or_default())
        .arg(random_score)
        .arg(room.active_users)
        .arg(room.new_users_per_minute.unwrap_or(0))
        .arg(room.session.as_millis() as u64)
        .arg(grace_ms(room))
        .arg(room.mode.as_str())
        .arg(room.starts_at_ms.unwrap_or(0))
        .arg(window_ms);
    let (state, n, score, mode, now_ms): (String, i64, u64, String, i64) = redis
        .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
        .await?;
    let answer = match state.as_str() {
        "in" => Answer::In { until_ms: n },
        "queued" => Answer::Queued {
            place: n.max(1) as u64,
            score,
        },
        "full" => Answer::Full,
        "pass" => Answer::Pass,
        _ => {
            return Err(RedisError::from(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "room_visit.lua answered a state it does not have",
            ))))
        }
    };
    Ok((answer, mode_of(&mode, room.mode), now_ms))
}

/// One tick: the renewed sessions sent, the admission step run, the
/// room's state read.
///
/// # Errors
/// The call's.
pub async fn tick(
    conn: &mut RedisHandle,
    room: &WaitingRoomConfig,
    keys: &RoomKeys,
    renewals: &[(String, i64)],
) -> Result<Shared, redis::RedisError> {
    let mut invocation = ROOM_TICK.prepare_invoke();
    invocation
        .key(&keys.queue)
        .key(&keys.inside)
        .key(&keys.state)
        .key(&keys.called)
        .arg(room.active_users)
        .arg(room.new_users_per_minute.unwrap_or(0))
        .arg(grace_ms(room))
        .arg(room.mode.as_str())
        .arg(room.starts_at_ms.unwrap_or(0));
    for (visitor, until_ms) in renewals {
        invocation.arg(visitor).arg(*until_ms);
    }
    let (mode, inside, waiting, rate, admitted, now_ms, late): (
        String,
        u64,
        u64,
        String,
        u64,
        i64,
        u64,
    ) = invocation.invoke_async(conn).await?;
    Ok(Shared {
        mode: mode_of(&mode, room.mode),
        inside,
        waiting,
        rate_per_second: rate.parse().unwrap_or(0.0),
        admitted,
        now_ms,
        late,
    })
}

/// The admin switch: `mode` for every gateway, kept in the room's state.
///
/// # Errors
/// The call's.
pub async fn switch_mode(
    conn: &mut RedisHandle,
    keys: &RoomKeys,
    mode: RoomMode,
) -> Result<(), redis::RedisError> {
    redis::cmd("HSET")
        .arg(&keys.state)
        .arg("mode")
        .arg(mode.as_str())
        .query_async::<()>(conn)
        .await
}
