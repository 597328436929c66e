//! Product pages and assets served from memory.
//!
//! Every file under `static_dir` is read once at start and kept with its
//! content type and a strong ETag, so a page view costs no disk I/O and a
//! revalidation (`If-None-Match`) is answered 304 without a body.
//! `/sales/{id}` serves `sale.html` for any sale id (the page reads its sale
//! from the API); `/static/{path}` serves the file at that path.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::Path;

use bytes::Bytes;

use crate::reply::{Rejection, Reply};

/// One file held in memory.
#[derive(Debug, Clone)]
pub struct Asset {
    pub body: Bytes,
    pub content_type: &'static str,
    /// Quoted strong validator, derived from the content.
    pub etag: String,
}

/// The in-memory file set.
#[derive(Debug, Default)]
pub struct StaticPages {
    files: HashMap<String, Asset>,
}

/// The page served for `/sales/{id}`.
pub const SALE_PAGE: &str = "sale.html";

impl StaticPages {
    /// Loads every regular file under `dir` (recursively).
    ///
    /// # Errors
    /// When the directory or a file cannot be read.
    pub fn load(dir: &Path) -> std::io::Result<Self> {
        let mut files = HashMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d)? {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Ok(rel) = path.strip_prefix(dir) else { continue };
                let Some(rel) = rel.to_str() else { continue };
                let body = Bytes::from(std::fs::read(&path)?);
                let mut h = std::collections::hash_map::DefaultHasher::new();
                body.hash(&mut h);
                let etag = format!("\"{:016x}-{:x}\"", h.finish(), body.len());
                files.insert(rel.replace('\\', "/"), Asset { content_type: content_type(rel), etag, body });
            }
        }
        Ok(Self { files })
    }

    pub fn get(&self, rel: &str) -> Option<&Asset> {
        self.files.get(rel)
    }

    /// Answers a GET/HEAD for `rel`, honouring `If-None-Match`.
    pub fn serve(&self, rel: &str, if_none_match: Option<&[u8]>) -> Reply {
        // Paths with `..`, empty or hidden segments are never looked up, so
        // nothing outside the loaded set can be named.
        let safe = !rel.is_empty() && rel.split('/').all(|seg| !seg.is_empty() && !seg.starts_with('.'));
        let Some(asset) = safe.then(|| self.get(rel)).flatten() else {
            return Rejection::NotFound("no such file").into();
        };
        let cache_control = if rel.ends_with(".html") { "public, max-age=5" } else { "public, max-age=300" };
        let not_modified = if_none_match.is_some_and(|v| v.split(|b| *b == b',').any(|t| t.trim_ascii() == asset.etag.as_bytes()));
        let body = if not_modified { Bytes::new() } else { asset.body.clone() };
        Reply { status: if not_modified { 304 } else { 200 }, content_type: asset.content_type, headers: Vec::new(), body }
            .header("ETag", asset.etag.clone())
            .header("Cache-Control", cache_control)
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages() -> StaticPages {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fg-static-{}-{n}", std::process::id()));
        std::fs::create_dir_all(dir.join("css")).unwrap();
        std::fs::write(dir.join("sale.html"), "<html></html>").unwrap();
        std::fs::write(dir.join("css/app.css"), "body{}").unwrap();
        let p = StaticPages::load(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        p
    }

    #[test]
    fn files_are_served_with_type_and_etag_and_revalidate_to_304() {
        let p = pages();
        let r = p.serve("css/app.css", None);
        assert_eq!((r.status, r.content_type), (200, "text/css; charset=utf-8"));
        let etag = r.headers.iter().find(|(n, _)| *n == "ETag").unwrap().1.clone();
        let r = p.serve("css/app.css", Some(etag.as_bytes()));
        assert_eq!(r.status, 304);
        assert!(r.body.is_empty());
    }

    #[test]
    fn traversal_and_hidden_paths_are_not_found() {
        let p = pages();
        for path in ["../Cargo.toml", "css/../sale.html", ".env", "", "css//app.css"] {
            assert_eq!(p.serve(path, None).status, 404, "{path}");
        }
    }
}
