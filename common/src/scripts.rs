//! Every Lua script of Flashgate, compiled in.
//!
//! The gateway and the backend each run their own scripts (and keep their
//! own `redis::Script` of each); this list is what a process needs to know
//! about all of them at once: the cluster connection answers a `NOSCRIPT`
//! with `EVAL` of the body (see [`crate::redis_conn`]), and
//! `flashgate check --connect` loads every script on every master.

/// `lua/deduct.lua` as it runs: the shared buy rules (`lua/lib/decide.lua`),
/// the deduct itself as a function (`lua/lib/deduct.lua`), then the
/// script's own body, which calls it once.
pub const DEDUCT: &str =
    concat!(include_str!("../../lua/lib/decide.lua"), include_str!("../../lua/lib/deduct.lua"), include_str!("../../lua/deduct.lua"));

/// `lua/deduct_batch.lua` as it runs: the same function as [`DEDUCT`],
/// called once per attempt of the batch.
pub const DEDUCT_BATCH: &str =
    concat!(include_str!("../../lua/lib/decide.lua"), include_str!("../../lua/lib/deduct.lua"), include_str!("../../lua/deduct_batch.lua"));

/// `lua/draw_run.lua` as it runs, with the same shared rules as [`DEDUCT`].
pub const DRAW_RUN: &str = concat!(include_str!("../../lua/lib/decide.lua"), include_str!("../../lua/draw_run.lua"));

/// `lua/xfer_out.lua` as it runs, with the shared helpers of [`DEDUCT`].
pub const XFER_OUT: &str = concat!(include_str!("../../lua/lib/decide.lua"), include_str!("../../lua/xfer_out.lua"));

/// `lua/preheat_bucket.lua` as it runs, with the shared helpers of [`DEDUCT`].
pub const PREHEAT_BUCKET: &str = concat!(include_str!("../../lua/lib/decide.lua"), include_str!("../../lua/preheat_bucket.lua"));

/// `lua/bucket_stock.lua` as it runs, with the shared helpers of [`DEDUCT`].
pub const BUCKET_STOCK: &str = concat!(include_str!("../../lua/lib/decide.lua"), include_str!("../../lua/bucket_stock.lua"));

/// `(file name, body)` of every script in `lua/` (a script built on
/// `lua/lib/` as it runs).
pub const ALL: &[(&str, &str)] = &[
    ("adopt.lua", include_str!("../../lua/adopt.lua")),
    ("bucket_meta.lua", include_str!("../../lua/bucket_meta.lua")),
    ("bucket_state.lua", include_str!("../../lua/bucket_state.lua")),
    ("bucket_stock.lua", BUCKET_STOCK),
    ("deduct.lua", DEDUCT),
    ("deduct_batch.lua", DEDUCT_BATCH),
    ("draw_run.lua", DRAW_RUN),
    ("fence.lua", include_str!("../../lua/fence.lua")),
    ("gcra.lua", include_str!("../../lua/gcra.lua")),
    ("pow_use.lua", include_str!("../../lua/pow_use.lua")),
    ("preheat.lua", include_str!("../../lua/preheat.lua")),
    ("preheat_bucket.lua", PREHEAT_BUCKET),
    ("release.lua", include_str!("../../lua/release.lua")),
    ("remembered.lua", include_str!("../../lua/remembered.lua")),
    ("resync.lua", include_str!("../../lua/resync.lua")),
    ("resync_transfers.lua", include_str!("../../lua/resync_transfers.lua")),
    ("trim.lua", include_str!("../../lua/trim.lua")),
    ("update_sale.lua", include_str!("../../lua/update_sale.lua")),
    ("wait_mark.lua", include_str!("../../lua/wait_mark.lua")),
    ("xfer_ack.lua", include_str!("../../lua/xfer_ack.lua")),
    ("xfer_in.lua", include_str!("../../lua/xfer_in.lua")),
    ("xfer_out.lua", XFER_OUT),
];

/// The body of the script whose SHA-1 is `sha` (as `EVALSHA` names it).
pub fn body_of(sha: &[u8]) -> Option<&'static str> {
    static BY_SHA: std::sync::LazyLock<Vec<(String, &'static str)>> =
        std::sync::LazyLock::new(|| ALL.iter().map(|(_, body)| (redis::Script::new(body).get_hash().to_owned(), *body)).collect());
    BY_SHA.iter().find(|(hash, _)| hash.as_bytes().eq_ignore_ascii_case(sha)).map(|(_, body)| *body)
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
}
