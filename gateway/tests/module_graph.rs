//! No two modules of the gateway import each other: when two need each
//! other, the shared part belongs in a third, lower module. The graph is
//! read from the source: every `crate::<module>` path in a module's files
//! (its submodules included) is an edge; doc comments are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn modules() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap();
            let top = rel.components().next().unwrap().as_os_str().to_str().unwrap().trim_end_matches(".rs").to_owned();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let deps = graph.entry(top.clone()).or_default();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let name: String = line[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() && name != top {
                        deps.insert(name);
                    }
                }
            }
        }
    }
    graph
}

#[test]
fn no_two_gateway_modules_import_each_other() {
    let graph = modules();
    assert!(graph.contains_key("proxy") && graph.contains_key("buy"), "module graph not found: {graph:?}");
    let mut cycles = Vec::new();
    for (a, deps) in &graph {
        for b in deps {
            if a < b && graph.get(b).is_some_and(|d| d.contains(a)) {
                cycles.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(cycles.is_empty(), "modules importing each other: {cycles:?}");
}

#[test]
fn the_buy_rules_and_the_sale_cache_never_see_pingora() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for dir in ["buy", "sales"] {
        for entry in std::fs::read_dir(src.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("pingora"), "{} uses pingora", path.display());
            assert!(!text.contains("crate::reply"), "{} builds HTTP replies", path.display());
        }
    }
}
