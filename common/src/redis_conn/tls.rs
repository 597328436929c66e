//! TLS to Redis (`rediss://`), through native-tls: on Linux the system's
//! OpenSSL, the library the gateway's own TLS and the backend's
//! `https://`/`amqps://` clients link too.
//!
//! The server's certificate is always verified (`#insecure` URLs are
//! refused by the config): against the system's roots, plus, for a
//! standalone Redis, the CA certificates of `redis.ca_file`. The redis
//! crate's native-tls path *replaces* the roots with the ones it is given,
//! so the system's bundle is handed over beside the file's certificates.
//!
//! The cluster and sentinel clients of the crate take no roots of their
//! own on native-tls (`ClusterClientBuilder::certs` and the sentinel's
//! certificates exist only with its rustls feature, a second TLS library),
//! so there the system's trust store alone decides; the config refuses
//! `redis.ca_file` in those modes rather than ignore it.

use std::path::Path;
use std::sync::OnceLock;

use redis::{Client, RedisError, RedisResult, TlsCertificates};

pub use crate::ca_file::CaFileError;
use crate::config::{RedisConfig, RedisTarget};

const PEM_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const KEY: &str = "redis.ca_file";

impl From<CaFileError> for RedisError {
    fn from(e: CaFileError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e).into()
    }
}

/// Reads and parses `redis.ca_file` when it is set, so that a bad one stops
/// a process at start (and fails `flashgate check`) instead of every
/// connection later; answers how many certificates it holds.
///
/// # Errors
/// [`CaFileError`], naming `redis.ca_file`.
pub fn check_ca_file(config: &RedisConfig) -> Result<Option<usize>, CaFileError> {
    let Some(path) = &config.ca_file else {
        return Ok(None);
    };
    let url = match &config.target {
        RedisTarget::Standalone { url } => url.as_str(),
        _ => "rediss://127.0.0.1/",
    };
    let (pem, count) = file_roots(path)?;
    tls_client(url, path, pem).map_err(|e| match e {
        TlsClientError::CaFile(e) => e,
        TlsClientError::Redis(e) => CaFileError::not_pem(KEY, path, e.to_string()),
    })?;
    Ok(Some(count))
}

/// A client for the node at `url`; a `rediss://` one also trusts the
/// certificates of `ca_file`, when given.
///
/// # Errors
/// A bad URL, or a `ca_file` that cannot be read or parsed.
pub(super) fn client(url: &str, ca_file: Option<&Path>) -> RedisResult<Client> {
    match ca_file {
        Some(path) if url.starts_with("rediss://") => {
            let (pem, _) = file_roots(path)?;
            tls_client(url, path, pem).map_err(|e| match e {
                TlsClientError::CaFile(e) => e.into(),
                TlsClientError::Redis(e) => e,
            })
        }
        _ => Client::open(url),
    }
}

/// Why a TLS client could not be built: its roots, or its URL.
enum TlsClientError {
    CaFile(CaFileError),
    Redis(RedisError),
}

/// The client for `url` trusting `pem` (the file's certificates) and the
/// system's roots.
fn tls_client(url: &str, path: &Path, mut pem: Vec<u8>) -> Result<Client, TlsClientError> {
    pem.push(b'\n');
    pem.extend_from_slice(system_roots());
    Client::build_with_tls(
        url,
        TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
    .map_err(|e| {
        // The crate reports a certificate it cannot parse as an I/O error.
        if e.is_io_error() {
            TlsClientError::CaFile(CaFileError::not_pem(KEY, path, e.to_string()))
        } else {
            TlsClientError::Redis(e)
        }
    })
}

/// The PEM text of `path` and how many certificates it holds.
fn file_roots(path: &Path) -> Result<(Vec<u8>, usize), CaFileError> {
    let pem = crate::ca_file::read_pem(KEY, path)?;
    let count = pem.matches(PEM_BEGIN).count();
    if count == 0 {
        return Err(CaFileError::no_certificate(KEY, path));
    }
    Ok((pem.into_bytes(), count))
}

/// The system's CA certificates as PEM, where OpenSSL finds them
/// (`SSL_CERT_FILE`, else the distribution's bundle; else the PEM files of
/// the certificate directories); read once per process.
fn system_roots() -> &'static [u8] {
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
                "no system CA certificates found; a rediss:// server must chain to redis.ca_file"
            );
            pem.clear();
        }
        pem
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str, ca_file: &Path) -> RedisConfig {
        RedisConfig {
            ca_file: Some(ca_file.to_owned()),
            ..RedisConfig::standalone(url)
        }
    }

    #[test]
    fn an_unreadable_or_certificate_less_ca_file_is_refused_naming_its_key() {
        let dir = std::env::temp_dir().join(format!("fg-redis-ca-{:x}", rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let err = check_ca_file(&config("rediss://127.0.0.1:6380/", &missing))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "redis.ca_file: cannot read {}: ",
                missing.display()
            )),
            "{err}"
        );

        let key = dir.join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = check_ca_file(&config("rediss://127.0.0.1:6380/", &key))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "redis.ca_file: {} holds no PEM certificate ({PEM_BEGIN})",
                key.display()
            )
        );

        let garbled = dir.join("garbled.pem");
        std::fs::write(
            &garbled,
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = check_ca_file(&config("rediss://127.0.0.1:6380/", &garbled))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "redis.ca_file: {} is not a PEM file of certificates: ",
                garbled.display()
            )),
            "{err}"
        );
        // A connection built from the file fails the same way.
        let err = client("rediss://127.0.0.1:6380/", Some(&missing))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("redis.ca_file: cannot read"), "{err}");

        assert_eq!(
            check_ca_file(&RedisConfig::standalone("rediss://127.0.0.1:6380/")).unwrap(),
            None,
            "unset: nothing to read"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn rand_suffix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id())
    }
}
