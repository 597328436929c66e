//! Product pages and assets served from memory, CDN-style.
//!
//! Every regular file under `static_dir` is read at start and kept with its
//! content type, a strong ETag, its Last-Modified time and its
//! `Cache-Control`. Compressible files (text, JavaScript, JSON, SVG) are
//! compressed once, at load, with gzip and brotli; a request gets the best
//! encoding its `Accept-Encoding` allows, with `Vary: Accept-Encoding`, and
//! each encoding has its own ETag (they are different representations).
//! A page view costs no disk I/O and no compression, and a revalidation
//! (`If-None-Match`, else `If-Modified-Since`) is answered 304 without a body.
//!
//! `Cache-Control`: HTML pages get a short public `max-age`; assets named
//! `name.<hash>.ext` (8 to 64 hex digits between dots) get a long one with
//! `immutable`, since their name changes with their content; other assets
//! get a medium one. All three come from the `[pages]` config.
//!
//! Paths are percent-decoded and then refused when any segment is empty,
//! `.`, `..` or hidden, or holds `\` or NUL. Lookups only ever hit the
//! in-memory set, so nothing outside `static_dir` can be named; symlinks
//! are not followed at load.
//!
//! [`PagesWatcher`] checks the directory periodically and swaps in a new
//! set when any file was added, removed or changed.
//!
//! `{prefix}/sales/{id}` serves `sale.html` for any sale id (the page reads
//! its sale from the API); `{prefix}/static/{path}` serves the file at that
//! path. In HTML files `{{path_prefix}}` is replaced at load with
//! `gateway.path_prefix`, so a page names its assets and API wherever the
//! operator mounted them.
//!
//! Every answer a file can get (each encoding, `200` or `304`) has its
//! response head built once, at load: a page view clones that head and
//! adds only the request id, instead of formatting and inserting each
//! header again (the page path is the gateway's busiest).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use flashgate_common::config::PagesConfig;
use pingora::http::ResponseHeader;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tracing::{info, warn};

use crate::edge::reply::Rejection;

/// The page served for `/sales/{id}`.
pub const SALE_PAGE: &str = "sale.html";

/// Replaced in HTML files with `gateway.path_prefix`.
pub const PREFIX_PLACEHOLDER: &str = "{{path_prefix}}";

/// Files below this size are not compressed: the headers cost more.
const MIN_COMPRESS_BYTES: usize = 128;

/// How long responses may be cached, by kind of file.
#[derive(Debug, Clone)]
pub struct CachePolicy {
    pub page_max_age: Duration,
    pub asset_max_age: Duration,
    pub fingerprinted_max_age: Duration,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            page_max_age: Duration::from_secs(10),
            asset_max_age: Duration::from_secs(60),
            fingerprinted_max_age: Duration::from_secs(31_536_000),
        }
    }
}

impl From<&PagesConfig> for CachePolicy {
    fn from(c: &PagesConfig) -> Self {
        Self {
            page_max_age: c.page_max_age,
            asset_max_age: c.asset_max_age,
            fingerprinted_max_age: c.fingerprinted_max_age,
        }
    }
}

impl CachePolicy {
    fn cache_control(&self, rel: &str) -> String {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        if name.ends_with(".html") {
            format!("public, max-age={}", self.page_max_age.as_secs())
        } else if is_fingerprinted(name) {
            format!(
                "public, max-age={}, immutable",
                self.fingerprinted_max_age.as_secs()
            )
        } else {
            format!("public, max-age={}", self.asset_max_age.as_secs())
        }
    }
}

/// A content coding the gateway can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Brotli,
}

/// One representation of a file: its bytes, their strong validator and
/// the heads of its two answers.
#[derive(Debug, Clone)]
pub struct Variant {
    pub body: Bytes,
    /// Quoted strong ETag, derived from the content and the encoding.
    pub etag: String,
    /// The `200`: every header but `X-Request-Id` (added per request).
    ok: ResponseHeader,
    /// The `304`: the same validators and caching headers, no body, no
    /// `Content-Encoding` (it describes a body).
    not_modified: ResponseHeader,
}

/// One file held in memory, with its compressed forms.
#[derive(Debug, Clone)]
pub struct Asset {
    pub content_type: &'static str,
    pub cache_control: String,
    /// HTTP-date of the file's modification time.
    pub last_modified: String,
    /// Modification time truncated to seconds, for `If-Modified-Since`.
    modified_secs: u64,
    pub identity: Variant,
    pub gzip: Option<Variant>,
    pub brotli: Option<Variant>,
}

impl Asset {
    fn variant(&self, encoding: Encoding) -> &Variant {
        match encoding {
            Encoding::Gzip => self.gzip.as_ref().unwrap_or(&self.identity),
            Encoding::Brotli => self.brotli.as_ref().unwrap_or(&self.identity),
            Encoding::Identity => &self.identity,
        }
    }
}

/// A file's answer, ready to write: its head (cloned from the one built at
/// load) and its body (empty for a `304`).
#[derive(Debug)]
pub struct Page {
    pub head: Box<ResponseHeader>,
    pub body: Bytes,
}

impl Page {
    pub fn status(&self) -> u16 {
        self.head.status.as_u16()
    }
}

/// The request headers that decide a static response.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageRequest<'a> {
    pub if_none_match: Option<&'a [u8]>,
    pub if_modified_since: Option<&'a [u8]>,
    pub accept_encoding: Option<&'a [u8]>,
}

impl<'a> PageRequest<'a> {
    pub fn from_headers(headers: &'a http::HeaderMap) -> Self {
        Self {
            if_none_match: headers
                .get(http::header::IF_NONE_MATCH)
                .map(|v| v.as_bytes()),
            if_modified_since: headers
                .get(http::header::IF_MODIFIED_SINCE)
                .map(|v| v.as_bytes()),
            accept_encoding: headers
                .get(http::header::ACCEPT_ENCODING)
                .map(|v| v.as_bytes()),
        }
    }
}

/// A loaded file set and the directory listing it was loaded from.
#[derive(Debug, Default)]
struct FileSet {
    /// Keyed by the files found at load, so a fast hasher is safe here.
    files: HashMap<String, Asset, ahash::RandomState>,
    /// Hash of every file's path, size and modification time.
    signature: u64,
}

/// The in-memory file set, swapped whole on reload.
#[derive(Debug)]
pub struct StaticPages {
    dir: PathBuf,
    policy: CachePolicy,
    path_prefix: String,
    set: ArcSwap<FileSet>,
}

impl StaticPages {
    /// Loads every regular file under `dir` (recursively) with the default
    /// cache policy.
    ///
    /// # Errors
    /// When the directory or a file cannot be read.
    pub fn load(dir: &Path) -> std::io::Result<Self> {
        Self::load_with(
            dir,
            CachePolicy::default(),
            flashgate_common::config::DEFAULT_PATH_PREFIX,
        )
    }

    /// Loads every regular file under `dir` (recursively), HTML files with
    /// `path_prefix` in place of [`PREFIX_PLACEHOLDER`].
    ///
    /// # Errors
    /// When the directory or a file cannot be read.
    pub fn load_with(dir: &Path, policy: CachePolicy, path_prefix: &str) -> std::io::Result<Self> {
        let set = load_set(dir, &policy, path_prefix)?;
        Ok(Self {
            dir: dir.to_owned(),
            policy,
            path_prefix: path_prefix.to_owned(),
            set: ArcSwap::from_pointee(set),
        })
    }

    /// Reloads the directory if any file was added, removed or changed.
    /// Returns whether a new set was swapped in.
    ///
    /// # Errors
    /// When the directory cannot be read; the current set stays.
    pub fn reload_if_changed(&self) -> std::io::Result<bool> {
        let listing = list_files(&self.dir)?;
        if signature(&listing) == self.set.load().signature {
            return Ok(false);
        }
        self.set.store(Arc::new(load_set(
            &self.dir,
            &self.policy,
            &self.path_prefix,
        )?));
        Ok(true)
    }

    /// The identity bytes of a file, if loaded.
    pub fn get(&self, rel: &str) -> Option<Asset> {
        self.set.load().files.get(rel).cloned()
    }

    /// Answers a GET/HEAD for the request path `rel` (still percent-encoded).
    ///
    /// # Errors
    /// `NotFound` when no file of that name is loaded (or the path may not
    /// name one).
    pub fn serve(&self, rel: &str, req: &PageRequest<'_>) -> Result<Page, Rejection> {
        let set = self.set.load();
        let Some(asset) = safe_path(rel).and_then(|p| set.files.get(p.as_ref())) else {
            return Err(Rejection::NotFound("no such file"));
        };
        let encoding = negotiate(
            req.accept_encoding,
            asset.gzip.is_some(),
            asset.brotli.is_some(),
        );
        let variant = asset.variant(encoding);
        let not_modified = match (req.if_none_match, req.if_modified_since) {
            (Some(inm), _) => etag_matches(inm, &variant.etag),
            (None, Some(ims)) => std::str::from_utf8(ims)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .is_some_and(|since| asset.modified_secs <= since.as_secs()),
            (None, None) => false,
        };
        Ok(if not_modified {
            Page {
                head: Box::new(variant.not_modified.clone()),
                body: Bytes::new(),
            }
        } else {
            Page {
                head: Box::new(variant.ok.clone()),
                body: variant.body.clone(),
            }
        })
    }
}

/// The `200` and `304` heads of one variant, in the order the headers were
/// always written: type and length, validators, caching, negotiation.
fn variant_heads(
    asset: &AssetHeaders<'_>,
    body: &Bytes,
    etag: &str,
    encoding: Encoding,
) -> std::io::Result<(ResponseHeader, ResponseHeader)> {
    let head = |status: u16, len: usize| -> pingora::Result<ResponseHeader> {
        // Without the map of names as written (see `answers::reply_head`; ETag,
        // Last-Modified and Vary then go out in lower case over HTTP/1.1):
        // a head is cloned for every answer, and that map would double the
        // clone.
        let mut h = ResponseHeader::build_no_case(status, Some(9))?;
        h.append_header("Content-Type", asset.content_type)?;
        h.append_header("Content-Length", len.to_string())?;
        h.append_header("ETag", etag)?;
        h.append_header("Last-Modified", asset.last_modified)?;
        h.append_header("Cache-Control", asset.cache_control)?;
        if asset.negotiated {
            h.append_header("Vary", "Accept-Encoding")?;
        }
        if status == 200 {
            match encoding {
                Encoding::Gzip => h.append_header("Content-Encoding", "gzip")?,
                Encoding::Brotli => h.append_header("Content-Encoding", "br")?,
                Encoding::Identity => false,
            };
        }
        Ok(h)
    };
    // A 304 carries the length of the 200 it stands for (RFC 9110 §8.6: a
    // cache copying it onto the stored page must not see 0); Pingora sends
    // no body with it either way.
    let built = head(200, body.len()).and_then(|ok| Ok((ok, head(304, body.len())?)));
    built.map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a header of this file cannot be sent: {e}"),
        )
    })
}

/// What every variant's head of one file shares.
struct AssetHeaders<'a> {
    content_type: &'static str,
    last_modified: &'a str,
    cache_control: &'a str,
    negotiated: bool,
}

/// Reloads the pages when files under the directory change: checked every
/// `interval`, and at once on SIGHUP.
pub struct PagesWatcher {
    pub pages: Arc<StaticPages>,
    /// How often the files are compared; zero: only on SIGHUP.
    pub interval: Duration,
    /// SIGHUP: compare the files now.
    pub requests: crate::admission::ReloadRequests,
}

#[async_trait]
impl BackgroundService for PagesWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut requests = self.requests.clone();
        loop {
            let timer = async {
                if self.interval.is_zero() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(self.interval).await;
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = timer => {}
                _ = requests.next() => {}
            }
            let pages = self.pages.clone();
            // Reading and compressing files is blocking work.
            match tokio::task::spawn_blocking(move || pages.reload_if_changed()).await {
                Ok(Ok(true)) => info!(dir = %self.pages.dir.display(), "static files reloaded"),
                Ok(Ok(false)) => {}
                Ok(Err(error)) => {
                    warn!(%error, dir = %self.pages.dir.display(), "static reload failed; serving the previous files")
                }
                Err(error) => warn!(%error, "static reload task failed"),
            }
        }
    }
}

/// The decoded, checked relative path, or `None` when it must not be served.
fn safe_path(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    let path = if raw.contains('%') {
        std::borrow::Cow::Owned(percent_decode(raw)?)
    } else {
        std::borrow::Cow::Borrowed(raw)
    };
    let ok = !path.is_empty()
        && !path.contains(['\\', '\0'])
        && path
            .split('/')
            .all(|seg| !seg.is_empty() && !seg.starts_with('.'));
    ok.then_some(path)
}

/// Decodes `%XX` escapes; `None` for a malformed escape or non-UTF-8 result.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Picks the encoding: brotli, then gzip, when the client accepts it with a
/// non-zero q-value (explicitly or through `*`); identity otherwise.
pub fn negotiate(accept_encoding: Option<&[u8]>, has_gzip: bool, has_brotli: bool) -> Encoding {
    let Some(header) = accept_encoding else {
        return Encoding::Identity;
    };
    let (mut gzip, mut br, mut star) = (None, None, None);
    for item in header.split(|b| *b == b',') {
        let mut parts = item.split(|b| *b == b';');
        let coding = parts.next().unwrap_or_default().trim_ascii();
        let q = parts
            .find_map(|p| {
                p.trim_ascii()
                    .strip_prefix(b"q=")
                    .or_else(|| p.trim_ascii().strip_prefix(b"Q="))
            })
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let accepted = q > 0.0;
        if coding.eq_ignore_ascii_case(b"br") {
            br = Some(accepted);
        } else if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip") {
            gzip = Some(accepted);
        } else if coding == b"*" {
            star = Some(accepted);
        }
    }
    if has_brotli && br.or(star).unwrap_or(false) {
        Encoding::Brotli
    } else if has_gzip && gzip.or(star).unwrap_or(false) {
        Encoding::Gzip
    } else {
        Encoding::Identity
    }
}

/// `If-None-Match` uses the weak comparison: `W/"x"` matches `"x"`.
fn etag_matches(if_none_match: &[u8], etag: &str) -> bool {
    if_none_match.split(|b| *b == b',').any(|t| {
        let t = t.trim_ascii();
        t == b"*" || t.strip_prefix(b"W/").unwrap_or(t) == etag.as_bytes()
    })
}

/// `name.<8 to 64 hex digits>.ext`.
fn is_fingerprinted(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() >= 3
        && parts[1..parts.len() - 1]
            .iter()
            .any(|p| (8..=64).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Every regular file under `dir` with its relative path and metadata,
/// skipping hidden names and symlinks.
fn list_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, std::fs::Metadata)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            if entry
                .file_name()
                .to_str()
                .is_none_or(|n| n.starts_with('.'))
            {
                continue;
            }
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                stack.push(path);
                continue;
            }
            if !meta.is_file() {
                continue;
            }
            let Some(rel) = path.strip_prefix(dir).ok().and_then(|r| r.to_str()) else {
                continue;
            };
            out.push((rel.replace('\\', "/"), path, meta));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn signature(listing: &[(String, PathBuf, std::fs::Metadata)]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (rel, _, meta) in listing {
        rel.hash(&mut h);
        meta.len().hash(&mut h);
        meta.modified().ok().hash(&mut h);
    }
    h.finish()
}

fn load_set(dir: &Path, policy: &CachePolicy, path_prefix: &str) -> std::io::Result<FileSet> {
    let listing = list_files(dir)?;
    let mut files = HashMap::with_capacity_and_hasher(listing.len(), ahash::RandomState::new());
    for (rel, path, meta) in &listing {
        let mut body = std::fs::read(path)?;
        if rel.ends_with(".html") {
            body = with_prefix(body, path_prefix);
        }
        let body = Bytes::from(body);
        let content_type = content_type(rel);
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let modified_secs = modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let hash = content_hash(&body);
        let compress = compressible(content_type) && body.len() >= MIN_COMPRESS_BYTES;
        let smaller = |c: Vec<u8>| (c.len() < body.len()).then(|| Bytes::from(c));
        let gzip = compress.then(|| gzip(&body)).and_then(smaller);
        let brotli = compress.then(|| brotli(&body)).and_then(smaller);
        let cache_control = policy.cache_control(rel);
        let last_modified = httpdate::fmt_http_date(modified);
        let shared = AssetHeaders {
            content_type,
            last_modified: &last_modified,
            cache_control: &cache_control,
            negotiated: gzip.is_some() || brotli.is_some(),
        };
        let variant = |body: Bytes, etag: String, encoding: Encoding| -> std::io::Result<Variant> {
            let (ok, not_modified) = variant_heads(&shared, &body, &etag, encoding)?;
            Ok(Variant {
                body,
                etag,
                ok,
                not_modified,
            })
        };
        let asset = Asset {
            content_type,
            gzip: gzip
                .map(|body| variant(body, format!("\"{hash}-gz\""), Encoding::Gzip))
                .transpose()?,
            brotli: brotli
                .map(|body| variant(body, format!("\"{hash}-br\""), Encoding::Brotli))
                .transpose()?,
            identity: variant(body, format!("\"{hash}\""), Encoding::Identity)?,
            cache_control,
            last_modified,
            modified_secs,
        };
        files.insert(rel.clone(), asset);
    }
    Ok(FileSet {
        files,
        signature: signature(&listing),
    })
}

/// `body` with every [`PREFIX_PLACEHOLDER`] replaced by `prefix`; a file that
/// is not UTF-8 is left as it is.
fn with_prefix(body: Vec<u8>, prefix: &str) -> Vec<u8> {
    match String::from_utf8(body) {
        Ok(text) if text.contains(PREFIX_PLACEHOLDER) => {
            text.replace(PREFIX_PLACEHOLDER, prefix).into_bytes()
        }
        Ok(text) => text.into_bytes(),
        Err(e) => e.into_bytes(),
    }
}

/// A content hash with the length, as hex: `<hash>-<len>`.
fn content_hash(body: &[u8]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    format!("{:016x}-{:x}", h.finish(), body.len())
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 2),
        flate2::Compression::best(),
    );
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

fn brotli(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() / 2);
    let params = brotli::enc::BrotliEncoderParams {
        quality: 11,
        lgwin: 22,
        ..Default::default()
    };
    // Reading from a slice and writing into a Vec cannot fail.
    let _ = brotli::BrotliCompress(&mut &body[..], &mut out, &params);
    out
}

fn compressible(content_type: &str) -> bool {
    content_type.starts_with("text/")
        || content_type.starts_with("application/json")
        || content_type.starts_with("image/svg")
        || content_type.starts_with("application/manifest")
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "webmanifest" => "application/manifest+json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "avif" => "image/avif",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir() -> Dir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fg-static-{}-{n}", std::process::id()));
        std::fs::create_dir_all(dir.join("css")).unwrap();
        std::fs::write(dir.join("sale.html"), "<html></html>").unwrap();
        std::fs::write(dir.join("css/app.css"), "body{}").unwrap();
        std::fs::write(
            dir.join("app.0123abcd.js"),
            "console.log('hello, flash sale');\n".repeat(20),
        )
        .unwrap();
        std::fs::write(dir.join(".env"), "SECRET=1").unwrap();
        Dir(dir)
    }

    #[test]
    fn html_names_its_assets_under_the_configured_prefix() {
        let d = dir();
        std::fs::write(
            d.0.join("sale.html"),
            r#"<link href="{{path_prefix}}/static/sale.css"><meta content="{{path_prefix}}">"#,
        )
        .unwrap();
        std::fs::write(d.0.join("css/raw.css"), "/* {{path_prefix}} */").unwrap();
        let p = StaticPages::load_with(&d.0, CachePolicy::default(), "/edge").unwrap();
        let html = p.get("sale.html").unwrap().identity.body;
        assert_eq!(
            &html[..],
            br#"<link href="/edge/static/sale.css"><meta content="/edge">"#
        );
        let css = p.get("css/raw.css").unwrap().identity.body;
        assert_eq!(&css[..], b"/* {{path_prefix}} */", "only HTML is rewritten");
    }

    fn header<'a>(r: &'a Page, name: &str) -> Option<&'a str> {
        r.head.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn serve(p: &StaticPages, rel: &str, req: &PageRequest<'_>) -> Page {
        p.serve(rel, req).unwrap()
    }

    fn status(p: &StaticPages, rel: &str, req: &PageRequest<'_>) -> u16 {
        p.serve(rel, req).map_or_else(
            |r| crate::edge::reply::Reply::from(r).status,
            |page| page.status(),
        )
    }

    #[test]
    fn files_are_served_with_type_and_etag_and_revalidate_to_304() {
        let d = dir();
        let p = StaticPages::load(&d.0).unwrap();
        let r = serve(&p, "css/app.css", &PageRequest::default());
        assert_eq!(
            (r.status(), header(&r, "Content-Type")),
            (200, Some("text/css; charset=utf-8"))
        );
        assert_eq!(header(&r, "Content-Length"), Some("6"));
        let etag = header(&r, "ETag").unwrap().to_owned();
        let lm = header(&r, "Last-Modified").unwrap().to_owned();
        let r = serve(
            &p,
            "css/app.css",
            &PageRequest {
                if_none_match: Some(etag.as_bytes()),
                ..Default::default()
            },
        );
        assert_eq!(r.status(), 304);
        assert!(r.body.is_empty());
        assert_eq!(
            (header(&r, "ETag"), header(&r, "Last-Modified")),
            (Some(etag.as_str()), Some(lm.as_str())),
            "a 304 keeps the validators"
        );
        let weak = format!("\"nope\", W/{etag}");
        assert_eq!(
            status(
                &p,
                "css/app.css",
                &PageRequest {
                    if_none_match: Some(weak.as_bytes()),
                    ..Default::default()
                }
            ),
            304
        );
        assert_eq!(
            status(
                &p,
                "css/app.css",
                &PageRequest {
                    if_none_match: Some(b"\"other\""),
                    ..Default::default()
                }
            ),
            200
        );
        assert_eq!(
            status(
                &p,
                "css/app.css",
                &PageRequest {
                    if_modified_since: Some(lm.as_bytes()),
                    ..Default::default()
                }
            ),
            304
        );
        let old = b"Thu, 01 Jan 2004 00:00:00 GMT";
        assert_eq!(
            status(
                &p,
                "css/app.css",
                &PageRequest {
                    if_modified_since: Some(old),
                    ..Default::default()
                }
            ),
            200
        );
    }

    #[test]
    fn compressible_files_are_negotiated_with_distinct_etags() {
        let d = dir();
        let p = StaticPages::load(&d.0).unwrap();
        let plain = serve(&p, "app.0123abcd.js", &PageRequest::default());
        let gz = serve(
            &p,
            "app.0123abcd.js",
            &PageRequest {
                accept_encoding: Some(b"gzip, deflate"),
                ..Default::default()
            },
        );
        let br = serve(
            &p,
            "app.0123abcd.js",
            &PageRequest {
                accept_encoding: Some(b"gzip, deflate, br"),
                ..Default::default()
            },
        );
        assert_eq!(header(&plain, "Content-Encoding"), None);
        assert_eq!(header(&gz, "Content-Encoding"), Some("gzip"));
        assert_eq!(header(&br, "Content-Encoding"), Some("br"));
        for r in [&plain, &gz, &br] {
            assert_eq!(header(r, "Vary"), Some("Accept-Encoding"));
            assert_eq!(
                header(r, "Content-Length"),
                Some(r.body.len().to_string().as_str()),
                "each variant's own length"
            );
        }
        let etag = header(&gz, "ETag").unwrap().to_owned();
        let revalidated = serve(
            &p,
            "app.0123abcd.js",
            &PageRequest {
                if_none_match: Some(etag.as_bytes()),
                accept_encoding: Some(b"gzip"),
                ..Default::default()
            },
        );
        assert_eq!(
            (
                revalidated.status(),
                header(&revalidated, "Content-Encoding")
            ),
            (304, None),
            "a 304 has no body to encode"
        );
        assert_eq!(header(&revalidated, "Vary"), Some("Accept-Encoding"));
        let etags: std::collections::HashSet<_> = [&plain, &gz, &br]
            .iter()
            .map(|r| header(r, "ETag").unwrap())
            .collect();
        assert_eq!(etags.len(), 3);
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(&gz.body[..])
            .read_to_end(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, plain.body);
        let mut unbrotli = Vec::new();
        brotli::Decompressor::new(&br.body[..], 4096)
            .read_to_end(&mut unbrotli)
            .unwrap();
        assert_eq!(unbrotli, plain.body);
    }

    #[test]
    fn accept_encoding_honours_q_values_and_wildcards() {
        assert_eq!(negotiate(None, true, true), Encoding::Identity);
        assert_eq!(negotiate(Some(b"br;q=0, gzip"), true, true), Encoding::Gzip);
        assert_eq!(negotiate(Some(b"*"), true, true), Encoding::Brotli);
        assert_eq!(negotiate(Some(b"*, br;q=0"), true, true), Encoding::Gzip);
        assert_eq!(
            negotiate(Some(b"gzip;q=0, br;q=0"), true, true),
            Encoding::Identity
        );
        assert_eq!(negotiate(Some(b"BR"), true, false), Encoding::Identity);
        assert_eq!(negotiate(Some(b"identity"), true, true), Encoding::Identity);
    }

    #[test]
    fn cache_control_is_short_for_pages_and_immutable_for_fingerprinted_assets() {
        let d = dir();
        let p = StaticPages::load(&d.0).unwrap();
        let cc = |rel| {
            header(&serve(&p, rel, &PageRequest::default()), "Cache-Control")
                .unwrap()
                .to_owned()
        };
        assert_eq!(cc("sale.html"), "public, max-age=10");
        assert_eq!(cc("css/app.css"), "public, max-age=60");
        assert_eq!(cc("app.0123abcd.js"), "public, max-age=31536000, immutable");
    }

    #[test]
    fn traversal_and_hidden_paths_are_not_found() {
        let d = dir();
        let p = StaticPages::load(&d.0).unwrap();
        for path in [
            "../Cargo.toml",
            "css/../sale.html",
            ".env",
            "",
            "css//app.css",
            "%2e%2e/Cargo.toml",
            "css/%2E%2E/sale.html",
            "..%2fCargo.toml",
            "css%5capp.css",
            "sale.html%00",
            "%zz",
        ] {
            assert_eq!(status(&p, path, &PageRequest::default()), 404, "{path}");
        }
        assert_eq!(status(&p, "css%2fapp.css", &PageRequest::default()), 200);
    }

    #[test]
    fn changed_files_are_reloaded() {
        let d = dir();
        let p = StaticPages::load(&d.0).unwrap();
        assert!(!p.reload_if_changed().unwrap());
        std::fs::write(d.0.join("new.txt"), "fresh").unwrap();
        assert!(p.reload_if_changed().unwrap());
        assert_eq!(
            &serve(&p, "new.txt", &PageRequest::default()).body[..],
            b"fresh"
        );
    }
}
