//! No import cycles in any crate of the workspace: when two modules need
//! each other, the shared part belongs in a third, lower module.
//!
//! The graph is read from the source. Every `.rs` file is a module
//! (`gateway/src/buy/service.rs` is `buy::service`); every `crate::` path
//! (grouped imports included) and `super::` path in it is an edge to the
//! deepest module that path names. A module using its own parent or
//! children is not an edge (that is how a module is built from files);
//! comments are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 6] = ["common", "gateway", "backend", "bench", "testkit", "tests"];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module path of a source file relative to `src/`: `a/b.rs` and
/// `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the root, "".
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_owned());
    }
    if parts.first().is_some_and(|p| p == "bin") {
        parts.clear();
    }
    parts.join("::")
}

fn source_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The paths an item list after `crate::` names: `a::b`, or for
/// `{a::{b, c}, d}` every leaf: `a::b`, `a::c`, `d`.
fn paths_after(text: &str) -> Vec<String> {
    fn ident(s: &str) -> usize {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    }
    fn walk(s: &str, prefix: &str, out: &mut Vec<String>) -> usize {
        // Parses `ident(::ident)*(::{ ... })?` from s; returns bytes consumed.
        let mut i = 0;
        let mut path = prefix.to_owned();
        loop {
            let rest = &s[i..];
            if let Some(group) = rest.strip_prefix('{') {
                let mut j = 0;
                loop {
                    let inner = &group[j..];
                    let skip = inner.len() - inner.trim_start().len();
                    j += skip;
                    if group[j..].starts_with('}') || j >= group.len() {
                        return i + 1 + j + 1;
                    }
                    j += walk(&group[j..], &path, out);
                    let inner = &group[j..];
                    j += inner.len() - inner.trim_start_matches([',', ' ', '\n', '\t']).len();
                    if group[j..].starts_with('}') || j >= group.len() {
                        return i + 1 + j + 1;
                    }
                }
            }
            let n = ident(rest);
            if n == 0 {
                // `self`, `*` or the end of the item.
                let n = rest.find([',', '}', ';']).unwrap_or(rest.len());
                if !path.is_empty() {
                    out.push(path);
                }
                return i + n;
            }
            if !path.is_empty() {
                path.push_str("::");
            }
            path.push_str(&rest[..n]);
            i += n;
            if s[i..].starts_with("::") {
                i += 2;
            } else {
                let rest = &s[i..];
                let n = rest.find([',', '}', ';']).unwrap_or(rest.len());
                out.push(path);
                return i + n;
            }
        }
    }
    let mut out = Vec::new();
    walk(text, "", &mut out);
    out
}

/// The deepest module of `modules` that `path` names.
fn resolve(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn related(a: &str, b: &str) -> bool {
    let inside =
        |outer: &str, inner: &str| outer.is_empty() || inner.starts_with(&format!("{outer}::"));
    a == b || inside(a, b) || inside(b, a)
}

fn graph_of(krate: &str) -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    let files = source_files(&src);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).unwrap()))
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let me = module_of(file.strip_prefix(&src).unwrap());
        let text: String = std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let deps = graph.entry(me.clone()).or_default();
        let parent = me
            .rsplit_once("::")
            .map(|(p, _)| p.to_owned())
            .unwrap_or_default();
        for (anchor, base) in [("crate::", String::new()), ("super::", parent)] {
            for (i, _) in text.match_indices(anchor) {
                if anchor == "crate::"
                    && text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                {
                    continue; // `flashgate_crate::` and the like
                }
                for path in paths_after(&text[i + anchor.len()..]) {
                    let full = if base.is_empty() {
                        path
                    } else {
                        format!("{base}::{path}")
                    };
                    if let Some(target) = resolve(&full, &modules) {
                        if !related(&me, &target) {
                            deps.insert(target);
                        }
                    }
                }
            }
        }
    }
    graph
}

/// Every cycle of the graph, as the set of modules in it (Tarjan's
/// strongly connected components of more than one module).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        on_stack: BTreeSet::new(),
        found: vec![],
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn the_graph_reader_sees_grouped_and_nested_imports() {
    assert_eq!(paths_after("a::b::C;"), ["a::b::C"]);
    assert_eq!(paths_after("{a::{b, c::D}, e};"), ["a::b", "a::c::D", "e"]);
    assert_eq!(
        paths_after("{\n    a::X,\n    b::{self, Y},\n};"),
        ["a::X", "b::self", "b::Y"]
    );
    assert_eq!(module_of(Path::new("buy/mod.rs")), "buy");
    assert_eq!(
        module_of(Path::new("stream/consumer.rs")),
        "stream::consumer"
    );
    assert_eq!(module_of(Path::new("lib.rs")), "");
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .iter()
        .map(|(from, to)| ((*from).to_owned(), BTreeSet::from([(*to).to_owned()])))
        .collect();
    assert_eq!(
        cycles(&graph),
        [["a", "b", "c"]],
        "a three-module cycle is found, the module leaning on it is not in it"
    );
}

#[test]
fn no_crate_has_an_import_cycle() {
    let mut found = Vec::new();
    for krate in CRATES {
        let graph = graph_of(krate);
        assert!(graph.len() > 2, "no modules read for {krate}: {graph:?}");
        found.extend(
            cycles(&graph)
                .into_iter()
                .map(|c| format!("{krate}: {}", c.join(" -> "))),
        );
    }
    assert!(
        found.is_empty(),
        "modules that import each other (directly or around a cycle): {found:#?}"
    );
}
