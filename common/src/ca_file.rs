//! A `*.ca_file` key's CA certificates (`redis.ca_file`, `events.ca_file`):
//! read once at start, and every reason one cannot be used named by its key.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How every PEM certificate begins.
pub const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----";

/// Why a `ca_file` cannot be used (each message starts with the key).
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error("{key}: cannot read {path}: {source}")]
    Read {
        key: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{key}: {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate { key: &'static str, path: PathBuf },
    #[error("{key}: {path} is not a PEM file of certificates: {detail}")]
    NotPem {
        key: &'static str,
        path: PathBuf,
        detail: String,
    },
}

impl CaFileError {
    /// The file holds something that does not parse as certificates.
    pub fn not_pem(key: &'static str, path: &Path, detail: impl Into<String>) -> Self {
        Self::NotPem {
            key,
            path: path.to_owned(),
            detail: detail.into(),
        }
    }

    /// The file holds no certificate.
    pub fn no_certificate(key: &'static str, path: &Path) -> Self {
        Self::NoCertificate {
            key,
            path: path.to_owned(),
        }
    }
}

/// The text of the `ca_file` of `key` at `path`.
///
/// # Errors
/// [`CaFileError::Read`], or [`CaFileError::NotPem`] when it is not text.
pub fn read_pem(key: &'static str, path: &Path) -> Result<String, CaFileError> {
    let bytes = std::fs::read(path).map_err(|source| CaFileError::Read {
        key,
        path: path.to_owned(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|_| CaFileError::not_pem(key, path, "not text"))
}

/// The system's CA certificates as PEM, where OpenSSL finds them
/// (`SSL_CERT_FILE`, else the distribution's bundle; else the PEM files of
/// the certificate directories); read once per process. A `ca_file` adds
/// to these: it never replaces them.
pub fn system_roots() -> &'static [u8] {
    static ROOTS: OnceLock<Vec<u8>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let probe = openssl_probe::probe();
        let mut pem = Vec::new();
        if let Some(bundle) = probe.cert_file.and_then(|f| std::fs::read(f).ok()) {
            pem = bundle;
        } else {
            for dir in probe.cert_dir {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    let name = name.to_string_lossy();
                    if name.ends_with(".pem") || name.ends_with(".crt") {
                        if let Ok(bytes) = std::fs::read(entry.path()) {
                            pem.extend_from_slice(&bytes);
                            pem.push(b'\n');
                        }
                    }
                }
            }
        }
        if !std::str::from_utf8(&pem).is_ok_and(|t| t.contains(PEM_BEGIN)) {
            tracing::warn!(
                "no system CA certificates found; a TLS server must chain to a configured ca_file"
            );
            pem.clear();
        }
        pem
    })
}
