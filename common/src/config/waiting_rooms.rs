//! `[[shop.waiting_rooms]]`: the rooms that bound how many visitors are
//! inside the shop's own pages at once, validated into [`WaitingRoomConfig`]s.
//! The gateway runs them (`gateway/src/edge/waiting_room/`); the paths match
//! with the syntax of `[[shop.cache.rules]]`.

use std::path::PathBuf;
use std::time::Duration;

use super::cache_rules::{path_pattern, PathPattern};
use super::check::Check;
use super::file;

/// Most rooms: each shop request walks their paths.
pub const MAX_WAITING_ROOMS: usize = 32;
/// Most paths of one room.
const MAX_ROOM_PATHS: usize = 64;
/// Longest room name: it is part of a cookie name and of Redis keys.
const MAX_ROOM_NAME_BYTES: usize = 32;
/// Longest `session_seconds`: a day.
const MAX_SESSION_SECONDS: u64 = 86_400;
/// Longest `refresh_seconds`.
const MAX_REFRESH_SECONDS: u64 = 300;
/// Most visitors inside one room.
const MAX_ACTIVE_USERS: u32 = 10_000_000;

/// A validated room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingRoomConfig {
    /// `[a-z0-9_-]`, unique among the rooms.
    pub name: String,
    pub paths: Vec<PathPattern>,
    pub active_users: u32,
    /// `None`: only `active_users` bounds admission.
    pub new_users_per_minute: Option<u32>,
    pub session: Duration,
    pub queueing: Queueing,
    /// After `starts_at` (or the room's first visitor), how long arrivals
    /// still get a random place in [`Queueing::Random`].
    pub random_window: Duration,
    /// Unix ms: admission begins; visitors before it wait in a pre-queue.
    pub starts_at_ms: Option<i64>,
    /// Unix ms: from then on the room lets everyone through.
    pub ends_at_ms: Option<i64>,
    /// The mode the room starts in; the admin API's switch overrides it.
    pub mode: RoomMode,
    pub refresh: Duration,
    /// The operator's queue page, read when the gateway starts.
    pub template: Option<PathBuf>,
    /// A place only for a solved proof of work.
    pub challenge: bool,
}

impl WaitingRoomConfig {
    /// Whether the room guards `path` (without its query).
    pub fn guards(&self, path: &str) -> bool {
        self.paths.iter().any(|p| p.matches(path))
    }
}

/// `queueing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queueing {
    /// Places in order of arrival.
    Fifo,
    /// Arrivals in the opening window get a random place, as the opening
    /// draw does for buys; later ones queue behind them in order.
    Random,
}

/// `mode`: what the room does with visitors not yet inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomMode {
    /// Lets them in while there is room, queues the rest.
    Queue,
    /// Lets everyone through; the room costs nothing.
    Passthrough,
    /// Lets them in while there is room, turns the rest away (`503`).
    Reject,
}

impl RoomMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RoomMode::Queue => "queue",
            RoomMode::Passthrough => "passthrough",
            RoomMode::Reject => "reject",
        }
    }

    /// The mode named `name`, as the file and the admin API spell it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "queue" => Some(RoomMode::Queue),
            "passthrough" => Some(RoomMode::Passthrough),
            "reject" => Some(RoomMode::Reject),
            _ => None,
        }
    }
}

/// A room name: lower-case letters, digits, `-` and `_`.
pub fn valid_room_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ROOM_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Every room, each problem named `shop.waiting_rooms[i].key`.
pub(super) fn validate(check: &mut Check, rooms: Vec<file::WaitingRoom>) -> Vec<WaitingRoomConfig> {
    check.at_most("shop.waiting_rooms", rooms.len(), MAX_WAITING_ROOMS);
    let rooms: Vec<WaitingRoomConfig> = rooms
        .into_iter()
        .enumerate()
        .map(|(i, room)| validate_room(check, &format!("shop.waiting_rooms[{i}]"), room))
        .collect();
    for (i, room) in rooms.iter().enumerate() {
        if rooms[..i].iter().any(|r| r.name == room.name) {
            check.fail(
                format_args!("shop.waiting_rooms[{i}].name"),
                format_args!("`{}` names another room too: names must differ", room.name),
            );
        }
    }
    rooms
}

fn validate_room(check: &mut Check, at: &str, f: file::WaitingRoom) -> WaitingRoomConfig {
    check
        .that(
            valid_room_name(&f.name),
            format!("{at}.name"),
            format!(
                "must be 1 to {MAX_ROOM_NAME_BYTES} of a-z, 0-9, `-` and `_`, got `{}`",
                f.name
            ),
        )
        .note("it names the room's cookie and Redis keys");
    check.that(
        !f.paths.is_empty(),
        format!("{at}.paths"),
        "must name at least one shop path (a prefix such as `/checkout/`, or a glob)",
    );
    check.at_most(format!("{at}.paths"), f.paths.len(), MAX_ROOM_PATHS);
    let paths = f
        .paths
        .iter()
        .enumerate()
        .map(|(j, p)| path_pattern(check, format!("{at}.paths[{j}]"), p))
        .collect();
    check.between(
        format!("{at}.active_users"),
        f.active_users,
        1,
        MAX_ACTIVE_USERS,
    );
    check
        .at_most(
            format!("{at}.new_users_per_minute"),
            f.new_users_per_minute,
            MAX_ACTIVE_USERS,
        )
        .note("0 = no bound but active_users");
    check.between(
        format!("{at}.session_seconds"),
        f.session_seconds,
        1,
        MAX_SESSION_SECONDS,
    );
    check.between(
        format!("{at}.refresh_seconds"),
        f.refresh_seconds,
        1,
        MAX_REFRESH_SECONDS,
    );
    check.at_most(
        format!("{at}.random_window_seconds"),
        f.random_window_seconds,
        MAX_SESSION_SECONDS,
    );
    let queueing = match f.queueing.as_str() {
        "fifo" => Queueing::Fifo,
        "random" => Queueing::Random,
        other => {
            check.fail(
                format!("{at}.queueing"),
                format_args!("must be \"fifo\" or \"random\", got `{other}`"),
            );
            Queueing::Fifo
        }
    };
    let mode = RoomMode::parse(&f.mode).unwrap_or_else(|| {
        check.fail(
            format!("{at}.mode"),
            format_args!(
                "must be \"queue\", \"passthrough\" or \"reject\", got `{}`",
                f.mode
            ),
        );
        RoomMode::Queue
    });
    let mut time = |key: &str, value: Option<&str>| {
        value.and_then(|v| match crate::parse_rfc3339(&format!("{at}.{key}"), v) {
            Ok(ms) => Some(ms),
            Err(e) => {
                check.problem(e);
                None
            }
        })
    };
    let starts_at_ms = time("starts_at", f.starts_at.as_deref());
    let ends_at_ms = time("ends_at", f.ends_at.as_deref());
    if let (Some(start), Some(end)) = (starts_at_ms, ends_at_ms) {
        check.that(
            start < end,
            format!("{at}.ends_at"),
            "must be after starts_at",
        );
    }
    let template = f.template.map(|path| {
        check.that(
            !path.trim().is_empty(),
            format!("{at}.template"),
            "must name an HTML file",
        );
        PathBuf::from(path)
    });
    WaitingRoomConfig {
        name: f.name,
        paths,
        active_users: f.active_users,
        new_users_per_minute: (f.new_users_per_minute > 0).then_some(f.new_users_per_minute),
        session: Duration::from_secs(f.session_seconds),
        queueing,
        random_window: Duration::from_secs(f.random_window_seconds),
        starts_at_ms,
        ends_at_ms,
        mode,
        refresh: Duration::from_secs(f.refresh_seconds),
        template,
        challenge: f.challenge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(name: &str) -> file::WaitingRoom {
        file::WaitingRoom {
            name: name.into(),
            paths: vec!["/checkout/".into()],
            active_users: 50,
            ..Default::default()
        }
    }

    fn problems(rooms: Vec<file::WaitingRoom>) -> String {
        let mut check = Check::default();
        validate(&mut check, rooms);
        check.finish().err().unwrap_or_default().join("\n")
    }

    #[test]
    fn a_room_with_paths_and_a_bound_is_valid() {
        assert_eq!(problems(vec![room("checkout")]), "");
    }

    #[test]
    fn each_bad_key_is_named() {
        let bad = file::WaitingRoom {
            name: "Check Out".into(),
            paths: vec!["checkout".into()],
            active_users: 0,
            session_seconds: 0,
            queueing: "lottery".into(),
            mode: "open".into(),
            starts_at: Some("2026-12-04T10:00:00Z".into()),
            ends_at: Some("2026-12-04T09:00:00Z".into()),
            ..Default::default()
        };
        let out = problems(vec![bad]);
        for key in [
            "shop.waiting_rooms[0].name",
            "shop.waiting_rooms[0].paths[0]",
            "shop.waiting_rooms[0].active_users",
            "shop.waiting_rooms[0].session_seconds",
            "shop.waiting_rooms[0].queueing",
            "shop.waiting_rooms[0].mode",
            "shop.waiting_rooms[0].ends_at",
        ] {
            assert!(out.contains(key), "{key} not named in:\n{out}");
        }
    }

    #[test]
    fn two_rooms_cannot_share_a_name() {
        let out = problems(vec![room("a"), room("a")]);
        assert!(out.contains("shop.waiting_rooms[1].name"), "{out}");
    }

    #[test]
    fn a_room_guards_its_prefixes_and_globs_only() {
        let mut f = room("r");
        f.paths = vec!["/basket/".into(), "/products/*/buy".into()];
        let mut check = Check::default();
        let rooms = validate(&mut check, vec![f]);
        let r = &rooms[0];
        assert!(r.guards("/basket/add"));
        assert!(r.guards("/products/42/buy"));
        assert!(!r.guards("/products/42/reviews"));
        assert!(!r.guards("/"));
    }
}
