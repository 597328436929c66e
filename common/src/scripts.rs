//! Every Lua script of Flashgate, compiled in: the one registry.
//!
//! Each script is a file in `lua/` and a [`Script`] here, and nowhere else:
//! the gateway and the backend run the `redis::Script`s of this registry
//! (a [`Script`] derefs to its `redis::Script`, its SHA-1 computed once per
//! process), and no other code builds one. A script that shares rules with
//! others is composed at compile time: the `lua/lib/` files it names, in
//! order, then its own file (the `script!` macro below, and each file's header).
//! [`ALL`] is what a process needs to know about all of them at once: the
//! cluster connection answers a `NOSCRIPT` with `EVAL` of the body (see
//! [`crate::redis_conn`]), and `flashgate check --connect` loads every
//! script on every master. A test fails on Lua written inline in Rust, a
//! `lua/` file included elsewhere, or a `redis::Script` built outside this
//! file.
//!
//! The helpers of `lua/lib/` (each a `local function fg_*`; a script
//! includes the files it calls, a file the files it calls before it):
//! - `replid.lua`: `fg_replid()`, this Redis's replication id
//!   (`master_replid`), the one parser of `INFO replication`, read at most
//!   once per call;
//! - `time.lua`: `fg_now_ms()`, Redis `TIME` in whole ms;
//! - `books.lua`: a reservation counted (`fg_count_reservation`, or for a
//!   buy `fg_take_slot` then `fg_count_item`), an item given back
//!   (`fg_give_back`), a return Redis never counted
//!   (`fg_record_uncounted_return`);
//! - `epoch.lua` (after `time.lua`): `fg_bump_epoch`, the sale's stock
//!   epoch moved on;
//! - `decide.lua` (after `replid.lua`, `time.lua`, `books.lua`): the buy
//!   rules (`fg_take`, `fg_final`, the draw's names);
//! - `deduct.lua` (after `decide.lua`): `fg_deduct`, one buy attempt decided;
//! - `room.lua` (after `time.lua`): a waiting room's admission step
//!   (`fg_room_admit`), its bucket, measured rate and mode.

use std::sync::OnceLock;

/// One script of the registry: its file in `lua/`, its body as it runs
/// (the `lua/lib/` files it is built on, then its own), and the
/// `redis::Script` of that body, which it derefs to.
pub struct Script {
    name: &'static str,
    body: &'static str,
    /// Its own cell (a static of the `script!` expansion), so that a
    /// [`Script`] holds no interior mutability and its name and body can be
    /// read in a `const`.
    built: &'static OnceLock<redis::Script>,
}

impl Script {
    const fn new(
        name: &'static str,
        body: &'static str,
        built: &'static OnceLock<redis::Script>,
    ) -> Self {
        Self { name, body, built }
    }

    /// The script's file in `lua/`, e.g. `deduct.lua`.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The script as it runs: its `lua/lib/` helpers, then its own file.
    pub const fn body(&self) -> &'static str {
        self.body
    }
}

impl std::ops::Deref for Script {
    type Target = redis::Script;

    /// The `redis::Script` of [`Script::body`], built on first use.
    fn deref(&self) -> &redis::Script {
        self.built.get_or_init(|| redis::Script::new(self.body))
    }
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script").field("name", &self.name).finish()
    }
}

/// `script!("file.lua")`, or `script!("file.lua"; "a.lua", "b.lua")` for a
/// script built on `lua/lib/a.lua` and `lua/lib/b.lua` (in that order,
/// before the script's own file).
macro_rules! script {
    ($file:literal $(; $($lib:literal),+)?) => {{
        static BUILT: OnceLock<redis::Script> = OnceLock::new();
        Script::new(
            $file,
            concat!(
                $($(include_str!(concat!("../../lua/lib/", $lib)),)+)?
                include_str!(concat!("../../lua/", $file))
            ),
            &BUILT,
        )
    }};
}

/// `lua/buyers_read.lua`, after the replication id (a fenced sale proves
/// nothing).
pub static BUYERS_READ: Script = script!("buyers_read.lua"; "replid.lua");

/// `lua/deduct_batch.lua` as it runs: the replication id, the time and the
/// books (`lua/lib/replid.lua`, `time.lua`, `books.lua`), the shared buy
/// rules (`lua/lib/decide.lua`), the deduct itself as a function
/// (`lua/lib/deduct.lua`), then the script's own body, which calls it once
/// per attempt of the call.
pub static DEDUCT_BATCH: Script =
    script!("deduct_batch.lua"; "replid.lua", "time.lua", "books.lua", "decide.lua", "deduct.lua");

/// `lua/draw_run.lua` as it runs, with the same shared rules as [`DEDUCT_BATCH`].
pub static DRAW_RUN: Script =
    script!("draw_run.lua"; "replid.lua", "time.lua", "books.lua", "decide.lua");

/// `lua/xfer_out.lua`, after the replication id and the time.
pub static XFER_OUT: Script = script!("xfer_out.lua"; "replid.lua", "time.lua");

/// `lua/preheat_bucket.lua`, after the replication id.
pub static PREHEAT_BUCKET: Script = script!("preheat_bucket.lua"; "replid.lua");

/// `lua/bucket_stock.lua`, after the replication id.
pub static BUCKET_STOCK: Script = script!("bucket_stock.lua"; "replid.lua");

/// `lua/adopt.lua`, after the books (it counts a reservation).
pub static ADOPT: Script = script!("adopt.lua"; "books.lua");

/// `lua/bucket_meta.lua`.
pub static BUCKET_META: Script = script!("bucket_meta.lua");

/// `lua/bucket_state.lua`, after the replication id.
pub static BUCKET_STATE: Script = script!("bucket_state.lua"; "replid.lua");

/// `lua/fence.lua`, after the replication id.
pub static FENCE: Script = script!("fence.lua"; "replid.lua");

/// `lua/fence_read.lua`, after the replication id it answers.
pub static FENCE_READ: Script = script!("fence_read.lua"; "replid.lua");

/// `lua/room_visit.lua`, after the time and the room's admission step
/// (`lua/lib/room.lua`).
pub static ROOM_VISIT: Script = script!("room_visit.lua"; "time.lua", "room.lua");

/// `lua/room_tick.lua`, after the same.
pub static ROOM_TICK: Script = script!("room_tick.lua"; "time.lua", "room.lua");

/// `lua/gcra.lua`.
pub static GCRA: Script = script!("gcra.lua");

/// `lua/pause.lua`.
pub static PAUSE: Script = script!("pause.lua");

/// `lua/pause_swap.lua`.
pub static PAUSE_SWAP: Script = script!("pause_swap.lua");

/// `lua/pow_use.lua`.
pub static POW_USE: Script = script!("pow_use.lua");

/// `lua/preheat.lua`, after the time and the stock epoch (`lua/lib/epoch.lua`).
pub static PREHEAT: Script = script!("preheat.lua"; "time.lua", "epoch.lua");

/// `lua/release.lua`, after the books (it gives an item back), the time and
/// the stock epoch.
pub static RELEASE: Script = script!("release.lua"; "books.lua", "time.lua", "epoch.lua");

/// `lua/remembered.lua`, after the replication id.
pub static REMEMBERED: Script = script!("remembered.lua"; "replid.lua");

/// `lua/restore_lock_free.lua`.
pub static RESTORE_LOCK_FREE: Script = script!("restore_lock_free.lua");

/// `lua/restore_lock_renew.lua`.
pub static RESTORE_LOCK_RENEW: Script = script!("restore_lock_renew.lua");

/// `lua/resync.lua`, after the replication id, the books (it counts
/// reservations and gives items back), the time and the stock epoch.
pub static RESYNC: Script =
    script!("resync.lua"; "replid.lua", "books.lua", "time.lua", "epoch.lua");

/// `lua/resync_transfers.lua`, after the replication id and the time.
pub static RESYNC_TRANSFERS: Script = script!("resync_transfers.lua"; "replid.lua", "time.lua");

/// `lua/switch_swap.lua`.
pub static SWITCH_SWAP: Script = script!("switch_swap.lua");

/// `lua/trim.lua`.
pub static TRIM: Script = script!("trim.lua");

/// `lua/update_sale.lua`, after the replication id, the time and the stock
/// epoch.
pub static UPDATE_SALE: Script = script!("update_sale.lua"; "replid.lua", "time.lua", "epoch.lua");

/// `lua/wait_mark.lua`, after the replication id it answers.
pub static WAIT_MARK: Script = script!("wait_mark.lua"; "replid.lua");

/// `lua/xfer_ack.lua`.
pub static XFER_ACK: Script = script!("xfer_ack.lua");

/// `lua/xfer_in.lua`.
pub static XFER_IN: Script = script!("xfer_in.lua");

/// Every script of `lua/`, by file name: the one list. No Lua is written
/// anywhere else, and no `redis::Script` built anywhere else (a test scans
/// the workspace).
pub static ALL: &[&Script] = &[
    &ADOPT,
    &BUCKET_META,
    &BUCKET_STATE,
    &BUCKET_STOCK,
    &BUYERS_READ,
    &DEDUCT_BATCH,
    &DRAW_RUN,
    &FENCE,
    &FENCE_READ,
    &GCRA,
    &PAUSE,
    &PAUSE_SWAP,
    &POW_USE,
    &PREHEAT,
    &PREHEAT_BUCKET,
    &RELEASE,
    &REMEMBERED,
    &RESTORE_LOCK_FREE,
    &RESTORE_LOCK_RENEW,
    &RESYNC,
    &RESYNC_TRANSFERS,
    &ROOM_TICK,
    &ROOM_VISIT,
    &SWITCH_SWAP,
    &TRIM,
    &UPDATE_SALE,
    &WAIT_MARK,
    &XFER_ACK,
    &XFER_IN,
    &XFER_OUT,
];

/// The script whose SHA-1 is `sha` (as `EVALSHA` names it, in either case).
pub fn by_hash(sha: &[u8]) -> Option<&'static Script> {
    ALL.iter()
        .copied()
        .find(|script| script.get_hash().as_bytes().eq_ignore_ascii_case(sha))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_in_lua_is_listed_once_and_found_by_its_hash() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".lua"))
            .collect();
        files.sort();
        let listed: Vec<&str> = super::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(files, listed);
        for script in super::ALL {
            assert!(script.body().ends_with(
                &std::fs::read_to_string(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../lua")
                        .join(script.name())
                )
                .unwrap()
            ));
            let sha = script.get_hash().to_owned();
            let found = super::by_hash(sha.as_bytes()).unwrap();
            assert!(std::ptr::eq(found, *script), "{}", script.name());
            let found = super::by_hash(sha.to_uppercase().as_bytes()).unwrap();
            assert!(std::ptr::eq(found, *script), "{}", script.name());
        }
        assert!(super::by_hash(b"0000").is_none());
    }

    /// The Lua `text` without its comments (`--` to the end of a line).
    fn code(text: &str) -> String {
        text.lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The names of the `fg_*` functions `text` defines (`local function`).
    fn defined(text: &str) -> Vec<&str> {
        text.split("local function ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .filter(|name| name.starts_with("fg_"))
            .collect()
    }

    #[test]
    fn every_helper_a_script_calls_is_composed_before_it_and_every_lib_file_is_used() {
        let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lua/lib");
        let libs: Vec<(String, String)> = std::fs::read_dir(&lib)
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(path).unwrap())
            })
            .collect();
        for script in super::ALL {
            let body = code(script.body());
            let body = body.as_str();
            // Every call of a helper comes after its definition.
            for (at, _) in body.match_indices("fg_") {
                let name: String = body[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !body[at + name.len()..].starts_with('(') || body[..at].ends_with("function ") {
                    continue;
                }
                let definition = format!("local function {name}(");
                assert!(
                    body[..at].contains(&definition),
                    "{}: calls {name} before (or without) its lib file",
                    script.name()
                );
            }
            // Every lib file composed in is called by what follows it.
            for (file, text) in &libs {
                let text = code(text);
                let Some(start) = body.find(text.as_str()) else {
                    continue;
                };
                let after = &body[start + text.len()..];
                // Called, or passed (`pcall(fg_deduct, ...)`).
                let used = |f: &&str| {
                    after.match_indices(*f).any(|(at, _)| {
                        !after[at + f.len()..]
                            .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                    })
                };
                assert!(
                    defined(&text).iter().any(used),
                    "{}: includes lua/lib/{file} but calls none of its helpers",
                    script.name()
                );
            }
        }
    }

    #[test]
    fn the_replication_id_and_the_time_are_read_by_their_lib_helpers_only() {
        for script in super::ALL {
            let body = script.body();
            assert!(
                body.matches("master_replid:(").count() <= 1 && body.matches("'INFO'").count() <= 1,
                "{}: reads INFO outside fg_replid",
                script.name()
            );
            if body.contains("'INFO'") {
                assert!(
                    body.contains("local function fg_replid()"),
                    "{}",
                    script.name()
                );
            }
            // lua/gcra.lua keeps its own read: fractions of a millisecond.
            if script.name() != "gcra.lua" {
                assert!(
                    body.matches("'TIME'").count() <= 1,
                    "{}: reads TIME outside fg_now_ms",
                    script.name()
                );
                if body.contains("'TIME'") {
                    assert!(
                        body.contains("local function fg_now_ms()"),
                        "{}",
                        script.name()
                    );
                }
            }
        }
    }

    /// The `.rs` files of the workspace, outside `target/` and this file.
    fn workspace_sources() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let this = root.join("common/src/scripts.rs").canonicalize().unwrap();
        let mut dirs = vec![root];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir()
                    && !name.starts_with('.')
                    && !["target", "node_modules", "data"].contains(&name.as_str())
                {
                    dirs.push(path);
                } else if name.ends_with(".rs") && path.canonicalize().unwrap() != this {
                    files.push(path);
                }
            }
        }
        files
    }

    #[test]
    fn every_script_in_the_workspace_comes_from_the_one_list() {
        let sources = workspace_sources();
        assert!(sources.len() > 100, "found only {} sources", sources.len());
        let mut strays = Vec::new();
        for path in &sources {
            let text = std::fs::read_to_string(path).unwrap();
            for (n, line) in text.lines().enumerate() {
                // Inline Lua (every script calls Redis), or a script file
                // compiled in past this list.
                let inline = line.contains(concat!("redis.", "call("))
                    || line.contains(concat!("redis.", "pcall("));
                let included = line.contains("include_str!") && line.contains(".lua\")");
                // A script built past the registry (its own SHA, its own
                // body): every `redis::Script` is one of `ALL`.
                let built = line.contains(concat!("Script", "::new("));
                if inline || included || built {
                    strays.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(
            strays.is_empty(),
            "Lua or a redis::Script outside lua/ and common/src/scripts.rs (add the file to lua/ and to `ALL`, use the registry's Script):\n{}",
            strays.join("\n")
        );
    }
}
