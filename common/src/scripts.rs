//! Every Lua script of Flashgate, compiled in: the one list.
//!
//! Each script is a file in `lua/` and a constant here, and nowhere else:
//! the gateway and the backend build their `redis::Script`s from these
//! constants (and keep their own of each). [`ALL`] is what a process needs
//! to know about all of them at once: the cluster connection answers a
//! `NOSCRIPT` with `EVAL` of the body (see [`crate::redis_conn`]), and
//! `flashgate check --connect` loads every script on every master. A test
//! fails on Lua written inline in Rust, or a `lua/` file included
//! elsewhere.

/// `lua/deduct_batch.lua` as it runs: the shared buy rules
/// (`lua/lib/decide.lua`), the deduct itself as a function
/// (`lua/lib/deduct.lua`), then the script's own body, which calls it once
/// per attempt of the call.
pub const DEDUCT_BATCH: &str = concat!(
    include_str!("../../lua/lib/decide.lua"),
    include_str!("../../lua/lib/deduct.lua"),
    include_str!("../../lua/deduct_batch.lua")
);

/// `lua/draw_run.lua` as it runs, with the same shared rules as [`DEDUCT_BATCH`].
pub const DRAW_RUN: &str = concat!(
    include_str!("../../lua/lib/decide.lua"),
    include_str!("../../lua/draw_run.lua")
);

/// `lua/xfer_out.lua` as it runs, with the shared helpers of [`DEDUCT_BATCH`].
pub const XFER_OUT: &str = concat!(
    include_str!("../../lua/lib/decide.lua"),
    include_str!("../../lua/xfer_out.lua")
);

/// `lua/preheat_bucket.lua` as it runs, with the shared helpers of [`DEDUCT_BATCH`].
pub const PREHEAT_BUCKET: &str = concat!(
    include_str!("../../lua/lib/decide.lua"),
    include_str!("../../lua/preheat_bucket.lua")
);

/// `lua/bucket_stock.lua` as it runs, with the shared helpers of [`DEDUCT_BATCH`].
pub const BUCKET_STOCK: &str = concat!(
    include_str!("../../lua/lib/decide.lua"),
    include_str!("../../lua/bucket_stock.lua")
);

/// `lua/adopt.lua`.
pub const ADOPT: &str = include_str!("../../lua/adopt.lua");

/// `lua/bucket_meta.lua`.
pub const BUCKET_META: &str = include_str!("../../lua/bucket_meta.lua");

/// `lua/bucket_state.lua`.
pub const BUCKET_STATE: &str = include_str!("../../lua/bucket_state.lua");

/// `lua/fence.lua`.
pub const FENCE: &str = include_str!("../../lua/fence.lua");

/// `lua/fence_read.lua`.
pub const FENCE_READ: &str = include_str!("../../lua/fence_read.lua");

/// `lua/gcra.lua`.
pub const GCRA: &str = include_str!("../../lua/gcra.lua");

/// `lua/pause.lua`.
pub const PAUSE: &str = include_str!("../../lua/pause.lua");

/// `lua/pause_swap.lua`.
pub const PAUSE_SWAP: &str = include_str!("../../lua/pause_swap.lua");

/// `lua/pow_use.lua`.
pub const POW_USE: &str = include_str!("../../lua/pow_use.lua");

/// `lua/preheat.lua` as it runs, after the stock epoch (`lua/lib/epoch.lua`).
pub const PREHEAT: &str = concat!(
    include_str!("../../lua/lib/epoch.lua"),
    include_str!("../../lua/preheat.lua")
);

/// `lua/release.lua` as it runs, after the stock epoch (`lua/lib/epoch.lua`).
pub const RELEASE: &str = concat!(
    include_str!("../../lua/lib/epoch.lua"),
    include_str!("../../lua/release.lua")
);

/// `lua/remembered.lua`.
pub const REMEMBERED: &str = include_str!("../../lua/remembered.lua");

/// `lua/restore_lock_free.lua`.
pub const RESTORE_LOCK_FREE: &str = include_str!("../../lua/restore_lock_free.lua");

/// `lua/restore_lock_renew.lua`.
pub const RESTORE_LOCK_RENEW: &str = include_str!("../../lua/restore_lock_renew.lua");

/// `lua/resync.lua` as it runs, after the stock epoch (`lua/lib/epoch.lua`).
pub const RESYNC: &str = concat!(
    include_str!("../../lua/lib/epoch.lua"),
    include_str!("../../lua/resync.lua")
);

/// `lua/resync_transfers.lua`.
pub const RESYNC_TRANSFERS: &str = include_str!("../../lua/resync_transfers.lua");

/// `lua/switch_swap.lua`.
pub const SWITCH_SWAP: &str = include_str!("../../lua/switch_swap.lua");

/// `lua/trim.lua`.
pub const TRIM: &str = include_str!("../../lua/trim.lua");

/// `lua/update_sale.lua` as it runs, after the stock epoch (`lua/lib/epoch.lua`).
pub const UPDATE_SALE: &str = concat!(
    include_str!("../../lua/lib/epoch.lua"),
    include_str!("../../lua/update_sale.lua")
);

/// `lua/wait_mark.lua`.
pub const WAIT_MARK: &str = include_str!("../../lua/wait_mark.lua");

/// `lua/xfer_ack.lua`.
pub const XFER_ACK: &str = include_str!("../../lua/xfer_ack.lua");

/// `lua/xfer_in.lua`.
pub const XFER_IN: &str = include_str!("../../lua/xfer_in.lua");

/// `(file name, body)` of every script in `lua/` (a script built on
/// `lua/lib/` as it runs): the one list. No Lua is written anywhere else
/// (a test scans the workspace).
pub const ALL: &[(&str, &str)] = &[
    ("adopt.lua", ADOPT),
    ("bucket_meta.lua", BUCKET_META),
    ("bucket_state.lua", BUCKET_STATE),
    ("bucket_stock.lua", BUCKET_STOCK),
    ("deduct_batch.lua", DEDUCT_BATCH),
    ("draw_run.lua", DRAW_RUN),
    ("fence.lua", FENCE),
    ("fence_read.lua", FENCE_READ),
    ("gcra.lua", GCRA),
    ("pause.lua", PAUSE),
    ("pause_swap.lua", PAUSE_SWAP),
    ("pow_use.lua", POW_USE),
    ("preheat.lua", PREHEAT),
    ("preheat_bucket.lua", PREHEAT_BUCKET),
    ("release.lua", RELEASE),
    ("remembered.lua", REMEMBERED),
    ("restore_lock_free.lua", RESTORE_LOCK_FREE),
    ("restore_lock_renew.lua", RESTORE_LOCK_RENEW),
    ("resync.lua", RESYNC),
    ("resync_transfers.lua", RESYNC_TRANSFERS),
    ("switch_swap.lua", SWITCH_SWAP),
    ("trim.lua", TRIM),
    ("update_sale.lua", UPDATE_SALE),
    ("wait_mark.lua", WAIT_MARK),
    ("xfer_ack.lua", XFER_ACK),
    ("xfer_in.lua", XFER_IN),
    ("xfer_out.lua", XFER_OUT),
];

/// The body of the script whose SHA-1 is `sha` (as `EVALSHA` names it).
pub fn body_of(sha: &[u8]) -> Option<&'static str> {
    static BY_SHA: std::sync::LazyLock<Vec<(String, &'static str)>> =
        std::sync::LazyLock::new(|| {
            ALL.iter()
                .map(|(_, body)| (redis::Script::new(body).get_hash().to_owned(), *body))
                .collect()
        });
    BY_SHA
        .iter()
        .find(|(hash, _)| hash.as_bytes().eq_ignore_ascii_case(sha))
        .map(|(_, body)| *body)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_in_lua_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".lua"))
            .collect();
        files.sort();
        let listed: Vec<String> = super::ALL.iter().map(|(n, _)| (*n).to_owned()).collect();
        assert_eq!(files, listed);
        for (_, body) in super::ALL {
            let sha = redis::Script::new(body).get_hash().to_owned();
            assert_eq!(super::body_of(sha.as_bytes()), Some(*body));
            assert_eq!(super::body_of(sha.to_uppercase().as_bytes()), Some(*body));
        }
        assert_eq!(super::body_of(b"0000"), None);
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
                if inline || included {
                    strays.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(
            strays.is_empty(),
            "Lua outside lua/ and common/src/scripts.rs (add the file to lua/ and to `ALL`):\n{}",
            strays.join("\n")
        );
    }
}
