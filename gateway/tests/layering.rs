//! The buy rules and the sale cache are plain Rust: they never see Pingora
//! or build an HTTP reply, so they can be tested and changed without the
//! proxy. (Import cycles are checked for every crate in
//! `tests/tests/module_graph.rs`.)

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, at any depth.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn the_buy_rules_and_the_sale_cache_never_see_pingora() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for dir in ["buy", "sales"] {
        let files = sources(&src.join(dir));
        assert!(files.len() > 2, "no sources read under {dir}");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("pingora"), "{} uses pingora", path.display());
            assert!(
                !text.contains("crate::edge::reply"),
                "{} builds HTTP replies",
                path.display()
            );
        }
    }
}
