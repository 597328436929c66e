//! The operator CLI: `flashgate sale|cache|events ...` call the admin APIs
//! over HTTP, as an operator's `curl` would, and print what they answer.
//!
//! It uses no layer of the gateway (a test in `gateway/tests/layering.rs`
//! holds it to that): only the config file, for the default addresses, and
//! HTTP to the two admin listeners.
//!
//! | command | API |
//! |---|---|
//! | `sale list` | `GET /admin/sales` (backend) |
//! | `sale show ID` | `GET /admin/sales/{id}` |
//! | `sale put ID FILE` | `PUT /admin/sales/{id}` (FILE: TOML or JSON, [`sale_input`]) |
//! | `sale pause ID`, `sale resume ID` | `POST /admin/sales/{id}/pause`, `/resume` |
//! | `sale reconcile ID` | `POST /admin/sales/{id}/reconcile` |
//! | `events dead` | `GET /admin/events/dead` |
//! | `events retry EVENT_ID` | `POST /admin/events/{event_id}/retry` |
//! | `cache purge --url P` / `--prefix P` / `--tag T [--tag U]` | `POST /cache/purge` (gateway admin) |
//! | `room list` | `GET /waiting-rooms` (gateway admin) |
//! | `room show NAME` | `GET /waiting-rooms/{name}` |
//! | `room mode NAME queue\|passthrough\|reject` | `POST /waiting-rooms/{name}/mode` |
//!
//! Layout: [`target`] where each API is and its token; [`client`] one call
//! and its typed failure; [`render`] the tables; [`sale_input`] the sale file.

mod client;
mod error;
mod render;
mod sale_input;
mod target;

use std::path::Path;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use client::{AdminClient, Answer};
pub use error::CliError;
use target::Targets;

/// Where the admin APIs are and how to print their answers; given after
/// `sale`, `cache` or `events` (or after their subcommand).
#[derive(Args, Debug, Clone, Default)]
pub struct AdminArgs {
    /// The backend's admin API, e.g. http://127.0.0.1:9091 (default: the
    /// config file's `backend.admin_listen`).
    #[arg(long, global = true, value_name = "URL")]
    pub backend_admin: Option<String>,
    /// The gateway's admin listener, e.g. http://127.0.0.1:9092 (default:
    /// the config file's `gateway.admin_listen`).
    #[arg(long, global = true, value_name = "URL")]
    pub gateway_admin: Option<String>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `flashgate sale ...`: the backend's sales.
#[derive(Subcommand, Debug, Clone)]
pub enum SaleCommand {
    /// Every sale, one line each.
    List,
    /// One sale: its definition and live counters.
    Show {
        /// The sale's id.
        id: String,
    },
    /// Create or change a sale from a TOML or JSON file with the keys of a
    /// `[[sales]]` entry (`id` optional).
    Put {
        /// The sale's id.
        id: String,
        /// The sale file, `.toml` or `.json` (`-`: stdin).
        file: std::path::PathBuf,
    },
    /// Stop buying of the sale on every gateway.
    Pause {
        /// The sale's id.
        id: String,
    },
    /// Let buying of a paused sale go on.
    Resume {
        /// The sale's id.
        id: String,
    },
    /// Reconcile the sale now and print the report.
    Reconcile {
        /// The sale's id.
        id: String,
    },
}

/// `flashgate cache ...`: the gateway's cache of shop pages.
#[derive(Subcommand, Debug, Clone)]
pub enum CacheCommand {
    /// Remove cached shop responses of one URL, under a path prefix, or
    /// tagged by the shop (Surrogate-Key), on every gateway.
    #[command(group(clap::ArgGroup::new("target").required(true).multiple(false)))]
    Purge {
        /// A path and query, e.g. /products/1?color=red.
        #[arg(long, group = "target")]
        url: Option<String>,
        /// Every path starting with it, e.g. /products/.
        #[arg(long, group = "target")]
        prefix: Option<String>,
        /// Every response the shop tagged with it, e.g. product-42; repeat
        /// for several tags (at most 64).
        #[arg(long = "tag", value_name = "TAG", group = "target")]
        tags: Vec<String>,
    },
}

/// `flashgate room ...`: the waiting rooms in front of the shop's pages.
#[derive(Subcommand, Debug, Clone)]
pub enum RoomCommand {
    /// Every room: mode, inside, waiting, admission rate, estimated wait.
    List,
    /// One room.
    Show {
        /// The room's name.
        name: String,
    },
    /// Switch a room's mode on every gateway.
    Mode {
        /// The room's name.
        name: String,
        /// `queue`, `passthrough` or `reject`.
        mode: String,
    },
}

/// `flashgate events ...`: the order events given up on.
#[derive(Subcommand, Debug, Clone)]
pub enum EventsCommand {
    /// The dead order events, oldest first.
    Dead {
        /// At most this many (1 to 1000; the API's default is 100).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Put a dead event back in line to be sent again.
    Retry {
        /// The event's id, `ev-` and 32 hex digits (see `events dead`).
        event_id: String,
    },
}

/// The operator commands, beside `serve`, `check` and `token`.
#[derive(Subcommand, Debug, Clone)]
pub enum Operator {
    /// Sales, on the backend's admin API (token: FLASHGATE_ADMIN_TOKEN).
    Sale {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: SaleCommand,
    },
    /// The cache of shop pages, on the gateway's admin listener (token:
    /// FLASHGATE_ADMIN_TOKEN).
    Cache {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: CacheCommand,
    },
    /// Waiting rooms, on the gateway's admin listener (token:
    /// FLASHGATE_ADMIN_TOKEN).
    Room {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: RoomCommand,
    },
    /// Order events given up on, on the backend's admin API (token:
    /// FLASHGATE_ADMIN_TOKEN).
    Events {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        command: EventsCommand,
    },
}

/// Runs `operator`, with the config file at `config` for the addresses no
/// flag gives, printing the answer on stdout.
///
/// # Errors
/// The config or the sale file cannot be read, the token is not set, an
/// API cannot be reached or answers an error: each names what failed (the
/// URL, the status and the API's error code).
pub fn run(operator: Operator, config: &Path) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    let out = runtime.block_on(async {
        match operator {
            Operator::Sale { admin, command } => {
                let api = AdminClient::new(Targets::new(&admin, config).backend()?)?;
                sale(&api, command, admin.json).await
            }
            Operator::Cache { admin, command } => {
                let api = AdminClient::new(Targets::new(&admin, config).gateway()?)?;
                cache(&api, command, admin.json).await
            }
            Operator::Room { admin, command } => {
                let api = AdminClient::new(Targets::new(&admin, config).gateway()?)?;
                room(&api, command, admin.json).await
            }
            Operator::Events { admin, command } => {
                let api = AdminClient::new(Targets::new(&admin, config).backend()?)?;
                events(&api, command, admin.json).await
            }
        }
    })?;
    print!("{out}");
    Ok(())
}

/// The answer as pretty JSON, with a final newline.
fn as_json(answer: &Answer) -> String {
    let mut text = serde_json::to_string_pretty(&answer.body).unwrap_or_default();
    text.push('\n');
    text
}

async fn sale(api: &AdminClient, command: SaleCommand, json: bool) -> Result<String, CliError> {
    let answer = match &command {
        SaleCommand::List => api.get("/admin/sales").await?,
        SaleCommand::Show { id } => api.get(&format!("/admin/sales/{}", segment(id))).await?,
        SaleCommand::Put { id, file } => {
            let body = sale_input::read(file, id, flashgate_common::now_ms())?;
            api.put(&format!("/admin/sales/{}", segment(id)), &body)
                .await?
        }
        SaleCommand::Pause { id } => {
            api.post(&format!("/admin/sales/{}/pause", segment(id)), None)
                .await?
        }
        SaleCommand::Resume { id } => {
            api.post(&format!("/admin/sales/{}/resume", segment(id)), None)
                .await?
        }
        SaleCommand::Reconcile { id } => {
            api.post(&format!("/admin/sales/{}/reconcile", segment(id)), None)
                .await?
        }
    };
    if json {
        return Ok(as_json(&answer));
    }
    Ok(match command {
        SaleCommand::List => render::sales(&answer.body),
        SaleCommand::Show { .. } => render::sale(&answer.body),
        SaleCommand::Put { id, .. } => {
            let done = if answer.status == 201 {
                "created"
            } else {
                "changed"
            };
            format!("sale {id} {done}\n{}", render::sale(&answer.body))
        }
        SaleCommand::Pause { id } => format!("sale {id} paused: buys get 503 on every gateway\n"),
        SaleCommand::Resume { id } => format!("sale {id} resumed: buys are taken again\n"),
        SaleCommand::Reconcile { .. } => render::reconcile(&answer.body),
    })
}

async fn cache(api: &AdminClient, command: CacheCommand, json: bool) -> Result<String, CliError> {
    let CacheCommand::Purge { url, prefix, tags } = command;
    let body = match (url, prefix, tags.as_slice()) {
        (Some(url), None, []) => json!({ "url": url }),
        (None, Some(prefix), []) => json!({ "prefix": prefix }),
        (None, None, [tag]) => json!({ "tag": tag }),
        (None, None, [_, ..]) => json!({ "tags": tags }),
        // clap lets at most one kind through.
        _ => return Err(CliError::Usage("give one of --url, --prefix and --tag")),
    };
    let answer = api.post("/cache/purge", Some(&body)).await?;
    if json {
        return Ok(as_json(&answer));
    }
    Ok(render::purge(&body, &answer.body))
}

async fn room(api: &AdminClient, command: RoomCommand, json: bool) -> Result<String, CliError> {
    let answer = match &command {
        RoomCommand::List => api.get("/waiting-rooms").await?,
        RoomCommand::Show { name } => {
            api.get(&format!("/waiting-rooms/{}", segment(name)))
                .await?
        }
        RoomCommand::Mode { name, mode } => {
            let body = json!({ "mode": mode });
            api.post(
                &format!("/waiting-rooms/{}/mode", segment(name)),
                Some(&body),
            )
            .await?
        }
    };
    if json {
        return Ok(as_json(&answer));
    }
    Ok(match command {
        RoomCommand::List => render::rooms(&answer.body),
        RoomCommand::Show { .. } => render::room(&answer.body),
        RoomCommand::Mode { name, mode } => {
            format!(
                "room {name}: mode {mode} on every gateway within a second\n{}",
                render::room(&answer.body)
            )
        }
    })
}

async fn events(api: &AdminClient, command: EventsCommand, json: bool) -> Result<String, CliError> {
    match command {
        EventsCommand::Dead { limit } => {
            let path = match limit {
                Some(n) => format!("/admin/events/dead?limit={n}"),
                None => "/admin/events/dead".to_owned(),
            };
            let answer = api.get(&path).await?;
            Ok(if json {
                as_json(&answer)
            } else {
                render::dead_events(&answer.body)
            })
        }
        EventsCommand::Retry { event_id } => {
            let path = format!("/admin/events/{}/retry", segment(&event_id));
            let answer = api.post(&path, None).await?;
            Ok(if json {
                as_json(&answer)
            } else {
                let state = answer.body["state"].as_str().unwrap_or("pending");
                format!("event {event_id}: {state}; the outbox sends it again\n")
            })
        }
    }
}

/// `s` as one path segment: anything outside the ids' alphabet is
/// percent-encoded, so a bad id reaches the API (which names the problem)
/// instead of another route.
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A cell of a table: strings as they are, `null` as `-`.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_path_segment_cannot_leave_its_route() {
        assert_eq!(super::segment("demo-1_a"), "demo-1_a");
        assert_eq!(super::segment("../x?y"), "%2E%2E%2Fx%3Fy");
        assert_eq!(super::segment("a b"), "a%20b");
    }
}
