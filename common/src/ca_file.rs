//! A `*.ca_file` key's CA certificates (`redis.ca_file`, `events.ca_file`):
//! read once at start, and every reason one cannot be used named by its key.

use std::path::{Path, PathBuf};

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
