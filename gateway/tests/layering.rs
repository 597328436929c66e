//! The layers of `gateway/src` (see the layout in `lib.rs`) hold: `edge/`
//! alone speaks HTTP and knows Pingora; below it `buy/` stands on
//! `admission/` and `sales/`, which stand on `infra/`. A layer imports only
//! the layers below it (never the edge), and each layer's `mod.rs` is its
//! one door: every submodule is private. (Import cycles between modules
//! are checked for every crate in `tests/tests/module_graph.rs`.)
//!
//! Beside the layers, `cli/` holds the operator commands: no layer, it
//! uses none of them, only HTTP to the admin APIs.

use std::path::{Path, PathBuf};

/// Each layer below the edge, and the layers it may import.
const LAYERS: [(&str, &[&str]); 4] = [
    ("infra", &[]),
    ("admission", &["infra"]),
    ("sales", &["infra"]),
    ("buy", &["admission", "sales", "infra"]),
];

/// Every folder of `src`, a layer each.
const FOLDERS: [&str; 5] = ["edge", "buy", "admission", "sales", "infra"];

/// The top-level folders that are no layer: the operator CLI, a client of
/// the admin APIs.
const TOOLS: [&str; 1] = ["cli"];

/// The top-level files that are no layer: the crate root, the binary and
/// the wiring, which know every layer (the server runs Pingora's).
const WIRING: [&str; 3] = ["lib.rs", "main.rs", "server.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

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

/// The code of a file, comments left out.
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules `code` names through `crate::`, grouped imports
/// (`crate::{a::X, b}`) included.
fn crate_modules(code: &str) -> Vec<String> {
    let ident = |s: &str| {
        s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `flashgate_crate::` and the like
        }
        let rest = &code[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // The names at the group's first level.
        let mut depth = 0;
        let mut start = true;
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => start = true,
                c if start && !c.is_whitespace() => {
                    out.push(ident(&group[j..]));
                    start = false;
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn the_import_reader_sees_plain_and_grouped_paths() {
    assert_eq!(
        crate_modules("use crate::buy::X;\nlet a = crate::infra::Y::new();"),
        ["buy", "infra"]
    );
    assert_eq!(
        crate_modules("use crate::{edge::Reply, sales::{A, B}, infra};"),
        ["edge", "sales", "infra"]
    );
    assert!(crate_modules("use flashgate_crate::edge;").is_empty());
}

#[test]
fn only_the_edge_mentions_pingora_or_builds_replies() {
    let src = src();
    let mut files: Vec<PathBuf> = FOLDERS
        .iter()
        .filter(|f| **f != "edge")
        .flat_map(|f| sources(&src.join(f)))
        .collect();
    // The top-level shared value types.
    files.extend(
        sources(&src).into_iter().filter(|p| {
            p.parent() == Some(src.as_path()) && !WIRING.iter().any(|w| p.ends_with(w))
        }),
    );
    assert!(files.len() > 40, "too few sources read: {files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("pingora"), "{} uses pingora", path.display());
        assert!(
            !crate_modules(&code(&path)).iter().any(|m| m == "edge"),
            "{} imports the edge (its replies, its routes)",
            path.display()
        );
    }
}

#[test]
fn a_layer_imports_only_the_layers_below_it() {
    let src = src();
    for (layer, below) in LAYERS {
        let files = sources(&src.join(layer));
        assert!(files.len() > 2, "no sources read under {layer}");
        for path in files {
            for module in crate_modules(&code(&path)) {
                let is_layer = FOLDERS.contains(&module.as_str());
                assert!(
                    !is_layer || module == layer || below.contains(&module.as_str()),
                    "{} ({layer}) imports {module}; {layer} may import only {below:?}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn each_layer_is_one_door_its_submodules_are_private() {
    let src = src();
    for layer in FOLDERS {
        let text = code(&src.join(layer).join("mod.rs"));
        let declared: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.ends_with(';') && l.split_whitespace().any(|w| w == "mod"))
            .collect();
        assert!(declared.len() > 2, "{layer}/mod.rs declares {declared:?}");
        for line in declared {
            assert!(
                line.starts_with("mod "),
                "{layer}/mod.rs: `{line}`: a layer's submodules are private, \
                 what it exports is re-exported by its mod.rs"
            );
        }
    }
}

#[test]
fn the_top_level_is_the_wiring_the_shared_values_and_the_layers() {
    let src = src();
    let mut entries: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert!(
        entries.len() <= 10,
        "{} entries: {entries:?}",
        entries.len()
    );
    for folder in FOLDERS {
        assert!(entries.iter().any(|e| e == folder), "no {folder}/");
    }
    for entry in &entries {
        assert!(
            FOLDERS.contains(&entry.as_str())
                || TOOLS.contains(&entry.as_str())
                || entry.ends_with(".rs"),
            "{entry} is neither a layer, a tool nor a top-level module"
        );
    }
}

#[test]
fn the_cli_uses_no_layer_only_http_to_the_admin_apis() {
    let src = src();
    for tool in TOOLS {
        let files = sources(&src.join(tool));
        assert!(files.len() > 2, "no sources read under {tool}");
        let mut http = false;
        for path in files {
            let code = code(&path);
            for module in crate_modules(&code) {
                assert_eq!(
                    module,
                    tool,
                    "{} ({tool}) imports {module}: the CLI only calls the admin APIs",
                    path.display()
                );
            }
            for word in ["pingora", "redis", "super::super"] {
                assert!(
                    !code.contains(word),
                    "{} ({tool}) uses {word}",
                    path.display()
                );
            }
            http |= code.contains("reqwest::");
        }
        assert!(http, "{tool} calls no API over HTTP");
    }
}
