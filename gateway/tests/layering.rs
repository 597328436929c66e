//! The buy rules and the sale cache are plain Rust: they never see Pingora
//! or build an HTTP reply, so they can be tested and changed without the
//! proxy. (Import cycles are checked for every crate in
//! `tests/tests/module_graph.rs`.)

use std::path::Path;

#[test]
fn the_buy_rules_and_the_sale_cache_never_see_pingora() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for dir in ["buy", "sales"] {
        for entry in std::fs::read_dir(src.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("pingora"), "{} uses pingora", path.display());
            assert!(
                !text.contains("crate::reply"),
                "{} builds HTTP replies",
                path.display()
            );
        }
    }
}
