//! TLS to the event destinations (`https://` webhook, `amqps://` broker),
//! through native-tls, which on Linux is the system's OpenSSL (the library
//! the gateway links too).
//!
//! A destination's certificate is verified against the system's roots plus
//! the CA certificates of `events.ca_file`, read once at start: a file
//! that cannot be read or holds no PEM certificate stops the backend,
//! named by its key. There is no way to skip the verification: a shop with
//! a self-signed or private-CA certificate puts that CA in `ca_file`.
//!
//! A failed handshake (a certificate that does not verify, a name it does
//! not cover, no common protocol) is a failed attempt like any other:
//! retried with backoff, dead after `events.max_attempts`.
//! [`handshake_failure`] tells it apart so that it is logged as what it
//! is, usually a configuration mistake, not a shop that is down.

use std::error::Error;
use std::path::Path;

pub use flashgate_common::ca_file::CaFileError;

const KEY: &str = "events.ca_file";

/// The CA certificates of `events.ca_file`, trusted besides the system's
/// roots.
#[derive(Clone)]
pub struct ExtraRoots {
    /// For reqwest (the webhook).
    certificates: Vec<reqwest::Certificate>,
    /// The file's text, for lapin (which parses it as reqwest does, with
    /// the same PEM reader and native-tls).
    pem: String,
}

impl std::fmt::Debug for ExtraRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraRoots")
            .field("certificates", &self.certificates.len())
            .finish()
    }
}

impl ExtraRoots {
    /// Reads `path` (one or more PEM `CERTIFICATE` blocks; anything else in
    /// the file is ignored).
    ///
    /// # Errors
    /// [`CaFileError`], naming `events.ca_file`.
    pub fn load(path: &Path) -> Result<Self, CaFileError> {
        let pem = flashgate_common::ca_file::read_pem(KEY, path)?;
        let certificates = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| CaFileError::not_pem(KEY, path, chain(&e)))?;
        if certificates.is_empty() {
            return Err(CaFileError::no_certificate(KEY, path));
        }
        Ok(Self { certificates, pem })
    }

    /// How many certificates the file holds.
    pub fn len(&self) -> usize {
        self.certificates.len()
    }

    /// Whether the file holds none (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    /// The certificates, for reqwest's client builder.
    pub fn certificates(&self) -> impl Iterator<Item = reqwest::Certificate> + '_ {
        self.certificates.iter().cloned()
    }

    /// The PEM text, for lapin's TLS configuration.
    pub fn pem(&self) -> &str {
        &self.pem
    }
}

/// Loads `events.ca_file` when it is set.
///
/// # Errors
/// [`CaFileError`].
pub fn extra_roots(ca_file: Option<&Path>) -> Result<Option<ExtraRoots>, CaFileError> {
    ca_file.map(ExtraRoots::load).transpose()
}

/// The TLS error in `error`'s chain, if a handshake failed: what OpenSSL
/// said, with the certificate verification result when there is one
/// (`... certificate verify failed ... (unable to get local issuer
/// certificate)`).
pub fn handshake_failure(error: &(dyn Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<native_tls::Error>() {
            return Some(tls.to_string());
        }
        // `io::Error::source` skips the error it wraps; look inside it.
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(tls) = inner.downcast_ref::<native_tls::Error>() {
                return Some(tls.to_string());
            }
        }
        next = e.source();
    }
    None
}

/// `error` and its sources, `: `-joined, leaving out a source whose text
/// the line already holds (wrappers that repeat their cause).
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A self-signed CA certificate (EC P-256), made once with
    /// `openssl req -x509`; only its parsing matters here.
    const CA_PEM: &str = include_str!("testdata/ca.pem");

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fg-ca-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_pem_file_of_ca_certificates_loads_every_certificate() {
        let dir = dir();
        let path = dir.join("ca.pem");
        std::fs::write(&path, format!("a comment before\n{CA_PEM}\n{CA_PEM}")).unwrap();
        let roots = ExtraRoots::load(&path).unwrap();
        assert_eq!(roots.len(), 2);
        assert!(roots.pem().contains("-----BEGIN CERTIFICATE-----"));
        assert_eq!(
            extra_roots(None).unwrap().map(|r| r.len()),
            None,
            "unset: the system's roots only"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_unreadable_or_non_pem_ca_file_is_refused_naming_its_key() {
        let dir = dir();
        let missing = dir.join("missing.pem");
        let err = ExtraRoots::load(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "events.ca_file: cannot read {}: ",
                missing.display()
            )),
            "{err}"
        );

        let empty = dir.join("key.pem");
        std::fs::write(
            &empty,
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = ExtraRoots::load(&empty).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "events.ca_file: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                empty.display()
            )
        );

        let der = dir.join("ca.der");
        std::fs::write(&der, [0x30, 0x82, 0xff, 0x00, 0xff, 0xfe]).unwrap();
        let err = ExtraRoots::load(&der).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "events.ca_file: {} is not a PEM file of certificates",
                der.display()
            )),
            "{err}"
        );

        let garbled = dir.join("garbled.pem");
        std::fs::write(
            &garbled,
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = ExtraRoots::load(&garbled).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "events.ca_file: {} is not a PEM file of certificates: ",
                garbled.display()
            )),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
