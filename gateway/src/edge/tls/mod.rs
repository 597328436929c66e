//! TLS at the edge: the HTTPS listener's settings, its certificates chosen
//! by SNI, their reload, and the redirect of plain page requests to HTTPS.
//!
//! Layout:
//! - [`certs`]: the certificate set (default + one per SAN name), loaded
//!   and checked from PEM files, and picked per handshake.
//! - [`watcher`]: re-reads the files when they change and swaps the set in
//!   without touching open connections; a bad file keeps the old set.
//! - [`records`]: each gathered write of an HTTPS connection reaches
//!   OpenSSL as one buffer (a page as one TLS record, not two).
//! - [`redirect`]: which plain-HTTP requests answer 308 to HTTPS, and where
//!   (only to a `Host` the loaded set covers: `Gateway::certs` shares the
//!   watcher's set).
//!
//! One proxy service serves both listeners, so every phase runs the same
//! over HTTPS; `early_request_filter` notes whether the request came over
//! TLS (`RequestCtx::tls`), which sets `X-Forwarded-Proto` towards the shop
//! and decides the redirect. The service's `h2_idle_timeout` is
//! `gateway.keepalive_seconds` and a buy body is read within
//! `gateway.body_read_timeout_ms` in all, so both bounds hold over HTTP/2
//! as over HTTP/1.1.
//!
//! Pingora's `openssl` feature (Debian's libssl, see `.cargo/config.toml`)
//! terminates TLS. The listener starts from Mozilla's intermediate profile
//! (TLS 1.2 and 1.3, AEAD ciphers only, ECDHE key exchange and, for TLS 1.2
//! with RSA certificates, DHE over ffdhe2048), with TLS 1.2 also set as
//! the floor explicitly, and offers HTTP/2 then HTTP/1.1 by ALPN. The
//! key exchange groups are set too ([`GROUPS`]): the profile names them,
//! but OpenSSL's defaults, which it would otherwise keep, add X448, P-521
//! and the finite-field groups of TLS 1.3.

pub mod certs;
pub mod records;
pub mod redirect;
pub mod watcher;

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::tls::ssl::{NameType, SslVersion};
use tracing::warn;

pub use certs::CertSet;
pub use records::CoalescedApp;
pub use watcher::CertWatcher;

/// Picks each handshake's certificate from the current set. The set is
/// read once per handshake from an [`ArcSwap`], so a reload applies to the
/// next handshake and never to a connection already open.
pub struct CertResolver {
    pub certs: Arc<ArcSwap<CertSet>>,
}

#[async_trait]
impl TlsAccept for CertResolver {
    async fn certificate_callback(&self, ssl: &mut TlsRef) {
        let set = self.certs.load();
        let chosen = set.select(ssl.servername(NameType::HOST_NAME));
        if let Err(error) = chosen.apply(ssl) {
            // The handshake then fails for want of a certificate.
            warn!(%error, "could not use the TLS certificate");
        }
    }
}

/// The key exchange groups of Mozilla's intermediate profile, in its
/// order of preference (ECDHE in TLS 1.2, key shares in TLS 1.3).
pub const GROUPS: &str = "X25519:P-256:P-384";

/// The HTTPS listener's settings: certificates from `certs`, TLS 1.2 at
/// least, the key exchange over `GROUPS` only, HTTP/2 preferred by ALPN
/// with HTTP/1.1 still served.
///
/// # Errors
/// When OpenSSL refuses the settings (not expected with a working libssl).
pub fn listener_settings(certs: Arc<ArcSwap<CertSet>>) -> pingora::Result<TlsSettings> {
    let mut settings = TlsSettings::with_callbacks(Box::new(CertResolver { certs }))?;
    settings
        .set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(|e| {
            pingora::Error::because(
                pingora::ErrorType::InternalError,
                "cannot set the minimum TLS version",
                e,
            )
        })?;
    settings.set_groups_list(GROUPS).map_err(|e| {
        pingora::Error::because(
            pingora::ErrorType::InternalError,
            "cannot set the key exchange groups",
            e,
        )
    })?;
    settings.enable_h2();
    Ok(settings)
}
