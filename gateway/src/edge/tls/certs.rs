//! The certificates of the HTTPS listener: a default one and any number
//! more, each chosen for the DNS names of its subjectAltName (a `*.` name
//! covers one label). Files are PEM: the chain leaf first, then its
//! intermediates; the key PEM (PKCS#8, or traditional RSA/EC).
//!
//! Loading checks what would otherwise only fail in a handshake: each file
//! is readable and parses, the key matches the leaf, the leaf is valid
//! now, each certificate of the chain is signed by the next, the leaf names
//! at least one DNS name (except the default). Every error names the config
//! key of the file (`gateway.tls.certificates[1].key_file: ...`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use flashgate_common::config::{TlsConfig, TlsFiles};
use openssl::asn1::{Asn1Time, Asn1TimeRef};
use openssl::error::ErrorStack;
use openssl::pkey::{PKey, Private};
use openssl::ssl::SslRef;
use openssl::x509::{GeneralNameRef, X509};
use pingora::tls::ext::{ssl_add_chain_cert, ssl_use_certificate, ssl_use_private_key};

/// Why a certificate could not be loaded; `key` is the config key of the file.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{key}: cannot read {path}: {source}")]
    Read {
        key: String,
        path: String,
        source: std::io::Error,
    },
    #[error("{key}: {path} is not a PEM certificate chain: {source}")]
    BadCert {
        key: String,
        path: String,
        source: ErrorStack,
    },
    #[error("{key}: {path} holds no certificate")]
    NoCert { key: String, path: String },
    #[error("{key}: {path} is not a PEM private key: {source}")]
    BadKey {
        key: String,
        path: String,
        source: ErrorStack,
    },
    #[error("{key}: the key in {key_path} does not match the certificate in {cert_path}")]
    KeyMismatch {
        key: String,
        key_path: String,
        cert_path: String,
    },
    #[error("{key}: the certificate in {path} names no DNS name in its subjectAltName, so no SNI can choose it")]
    NoNames { key: String, path: String },
    #[error("{key}: the certificate in {path} is not valid now (valid from {not_before} to {not_after}, Unix seconds)")]
    NotValidNow {
        key: String,
        path: String,
        not_before: i64,
        not_after: i64,
    },
    #[error("{key}: in {path}, certificate {index} of the chain is not signed by the next one (leaf first, then its issuers in order)")]
    BrokenChain {
        key: String,
        path: String,
        index: usize,
    },
}

/// How far in the future a new certificate's start may be: an issuer's
/// clock may run a little ahead of ours.
pub const NOT_BEFORE_SKEW_SECS: i64 = 300;

/// One certificate chain with its key, ready for a handshake.
pub struct Certified {
    /// Leaf first.
    chain: Vec<X509>,
    key: PKey<Private>,
    /// The SAN DNS names, lower case.
    pub names: Vec<String>,
    /// The SAN IP addresses.
    pub ips: Vec<std::net::IpAddr>,
    /// When the leaf expires, in Unix seconds.
    pub not_after_unix: i64,
}

impl Certified {
    /// Parses and checks one chain and its key at `now` (Unix seconds):
    /// the leaf valid now (its start up to [`NOT_BEFORE_SKEW_SECS`] ahead),
    /// each certificate signed by the next, the key the leaf's. Errors name
    /// `files`' keys.
    fn from_pem(
        files: &TlsFiles,
        cert_pem: &[u8],
        key_pem: &[u8],
        now: i64,
    ) -> Result<Self, CertError> {
        let cert_key = format!("{}.cert_file", files.key_path);
        let key_key = format!("{}.key_file", files.key_path);
        let cert_path = files.cert_file.display().to_string();
        let key_path = files.key_file.display().to_string();
        let chain = X509::stack_from_pem(cert_pem).map_err(|source| CertError::BadCert {
            key: cert_key.clone(),
            path: cert_path.clone(),
            source,
        })?;
        let Some(leaf) = chain.first() else {
            return Err(CertError::NoCert {
                key: cert_key,
                path: cert_path,
            });
        };
        let (not_before, not_after) = (
            unix_seconds(leaf.not_before()).unwrap_or(i64::MAX),
            unix_seconds(leaf.not_after()).unwrap_or(0),
        );
        if not_before > now + NOT_BEFORE_SKEW_SECS || not_after <= now {
            return Err(CertError::NotValidNow {
                key: cert_key,
                path: cert_path,
                not_before,
                not_after,
            });
        }
        for (index, pair) in chain.windows(2).enumerate() {
            let signed = pair[1]
                .public_key()
                .and_then(|issuer| pair[0].verify(&issuer))
                .unwrap_or(false);
            if !signed {
                return Err(CertError::BrokenChain {
                    key: cert_key,
                    path: cert_path,
                    index,
                });
            }
        }
        let key = PKey::private_key_from_pem(key_pem).map_err(|source| CertError::BadKey {
            key: key_key.clone(),
            path: key_path.clone(),
            source,
        })?;
        let matches = leaf.public_key().is_ok_and(|public| public.public_eq(&key));
        if !matches {
            return Err(CertError::KeyMismatch {
                key: key_key,
                key_path,
                cert_path,
            });
        }
        let sans = leaf.subject_alt_names();
        let sans: Vec<&GeneralNameRef> = sans.iter().flatten().collect();
        let names = sans
            .iter()
            .filter_map(|n| n.dnsname())
            .map(|n| n.trim_end_matches('.').to_ascii_lowercase())
            .collect();
        let ips = sans
            .iter()
            .filter_map(|n| ip_from_san(n.ipaddress()?))
            .collect();
        Ok(Self {
            chain,
            key,
            names,
            ips,
            not_after_unix: not_after,
        })
    }

    /// Puts this chain and key on the handshake.
    ///
    /// # Errors
    /// When OpenSSL refuses them.
    pub fn apply(&self, ssl: &mut SslRef) -> Result<(), ErrorStack> {
        let mut chain = self.chain.iter();
        if let Some(leaf) = chain.next() {
            ssl_use_certificate(ssl, leaf)?;
        }
        ssl_use_private_key(ssl, &self.key)?;
        for intermediate in chain {
            ssl_add_chain_cert(ssl, intermediate)?;
        }
        Ok(())
    }
}

/// A SAN iPAddress entry (4 or 16 bytes).
fn ip_from_san(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}

/// An ASN.1 time in Unix seconds.
fn unix_seconds(t: &Asn1TimeRef) -> Option<i64> {
    let diff = Asn1Time::from_unix(0).ok()?.diff(t).ok()?;
    Some(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}

/// The bytes of every file of `config`, default first.
///
/// # Errors
/// The first file that cannot be read, named by its key.
pub fn read_all(config: &TlsConfig) -> Result<FileBytes, CertError> {
    std::iter::once(&config.default)
        .chain(&config.certificates)
        .map(read_pair)
        .collect()
}

/// Both files of a pair, as bytes.
fn read_pair(files: &TlsFiles) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |field: &str, path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            key: format!("{}.{field}", files.key_path),
            path: path.display().to_string(),
            source,
        })
    };
    Ok((
        read("cert_file", &files.cert_file)?,
        read("key_file", &files.key_file)?,
    ))
}

/// The bytes of every file of a set, in config order (default first):
/// what a set was loaded from, and what the files hold now.
pub type FileBytes = Vec<(Vec<u8>, Vec<u8>)>;

/// Every certificate of the listener, and the name each is chosen for.
pub struct CertSet {
    default: Arc<Certified>,
    by_name: HashMap<String, Arc<Certified>>,
    /// What the set was loaded from: a reload is due when the files differ
    /// (content, not mtime: a rewrite within the same second must count).
    pub(crate) loaded_from: FileBytes,
}

impl CertSet {
    /// Loads the default certificate and every `gateway.tls.certificates`
    /// entry. A name claimed by two entries goes to the first.
    ///
    /// # Errors
    /// The first file that cannot be used, named by its key.
    pub fn load(config: &TlsConfig) -> Result<Self, CertError> {
        Self::from_bytes(config, read_all(config)?)
    }

    /// Builds the set from the files' bytes, read beforehand. Every leaf
    /// must be valid now and every chain in order, at start as at a reload:
    /// a rotation to an expired, premature or misordered file keeps the
    /// running set.
    ///
    /// # Errors
    /// The first file that cannot be used, named by its key.
    pub fn from_bytes(config: &TlsConfig, bytes: FileBytes) -> Result<Self, CertError> {
        let mut all = std::iter::once(&config.default)
            .chain(&config.certificates)
            .zip(&bytes);
        let Some((files, (cert, key))) = all.next() else {
            return Err(CertError::NoCert {
                key: "gateway.tls.cert_file".into(),
                path: config.default.cert_file.display().to_string(),
            });
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .try_into()
            .unwrap_or(i64::MAX);
        let default = Arc::new(Certified::from_pem(files, cert, key, now)?);
        let mut by_name = HashMap::new();
        for (files, (cert, key)) in all {
            let certified = Arc::new(Certified::from_pem(files, cert, key, now)?);
            if certified.names.is_empty() {
                return Err(CertError::NoNames {
                    key: format!("{}.cert_file", files.key_path),
                    path: files.cert_file.display().to_string(),
                });
            }
            for name in &certified.names {
                by_name
                    .entry(name.clone())
                    .or_insert_with(|| certified.clone());
            }
        }
        Ok(Self {
            default,
            by_name,
            loaded_from: bytes,
        })
    }

    /// The certificate for an SNI name: an exact SAN match, else a
    /// wildcard covering its first label, else the default.
    pub fn select(&self, server_name: Option<&str>) -> &Certified {
        let Some(name) = server_name else {
            return &self.default;
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(c) = self.by_name.get(&name) {
            return c;
        }
        if let Some((_, parent)) = name.split_once('.') {
            if let Some(c) = self.by_name.get(&format!("*.{parent}")) {
                return c;
            }
        }
        &self.default
    }

    /// Whether some certificate of the set is valid for `host` (a DNS name
    /// or an IP literal, as a `Host` header names it, without port or
    /// brackets): a SAN name, a `*.` SAN name covering its first label, or
    /// a SAN IP address. A redirect only ever names such a host, so the
    /// gateway never sends a browser to a name it cannot serve.
    pub fn covers(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let all = || std::iter::once(&self.default).chain(self.by_name.values());
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
        {
            return all().any(|c| c.ips.contains(&ip));
        }
        let wildcard = host
            .split_once('.')
            .map(|(_, parent)| format!("*.{parent}"));
        if self.by_name.contains_key(&host)
            || wildcard
                .as_ref()
                .is_some_and(|w| self.by_name.contains_key(w))
        {
            return true;
        }
        self.default
            .names
            .iter()
            .any(|n| *n == host || wildcard.as_ref() == Some(n))
    }

    /// When the first certificate of the set expires, in Unix seconds
    /// (`flashgate_tls_certificate_expiry_timestamp_seconds`).
    pub fn earliest_expiry_unix(&self) -> i64 {
        self.by_name
            .values()
            .map(|c| c.not_after_unix)
            .chain([self.default.not_after_unix])
            .min()
            .unwrap_or(0)
    }

    /// The DNS names of the default certificate (for the log).
    pub fn default_names(&self) -> &[String] {
        &self.default.names
    }

    /// The names other certificates are chosen for (for the log).
    pub fn sni_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::x509::extension::SubjectAlternativeName;
    use openssl::x509::{X509Builder, X509Name};

    use super::*;

    /// A self-signed certificate for `names` (CN = the first) and its key, as PEM.
    fn self_signed(names: &[&str]) -> (Vec<u8>, Vec<u8>) {
        let (cert, key) = signed(names, (-60, 86_400), None);
        (
            cert.to_pem().unwrap(),
            key.private_key_to_pem_pkcs8().unwrap(),
        )
    }

    /// A certificate for `names` valid from/to `validity` seconds around
    /// now, signed by `issuer` (else by itself), and its key.
    fn signed(
        names: &[&str],
        validity: (i64, i64),
        issuer: Option<(&X509, &PKey<Private>)>,
    ) -> (X509, PKey<Private>) {
        let key = PKey::from_ec_key(
            EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap(),
        )
        .unwrap();
        let mut name = X509Name::builder().unwrap();
        name.append_entry_by_nid(Nid::COMMONNAME, names.first().copied().unwrap_or("none"))
            .unwrap();
        let name = name.build();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut b = X509Builder::new().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(issuer.map_or(&*name, |(c, _)| c.subject_name()))
            .unwrap();
        b.set_not_before(&Asn1Time::from_unix(now + validity.0).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::from_unix(now + validity.1).unwrap())
            .unwrap();
        b.set_pubkey(&key).unwrap();
        if !names.is_empty() {
            let mut san = SubjectAlternativeName::new();
            for n in names {
                san.dns(n);
            }
            b.append_extension(san.build(&b.x509v3_context(None, None)).unwrap())
                .unwrap();
        }
        b.sign(issuer.map_or(&key, |(_, k)| k), MessageDigest::sha256())
            .unwrap();
        (b.build(), key)
    }

    fn pem(chain: &[&X509], key: &PKey<Private>) -> (Vec<u8>, Vec<u8>) {
        (
            chain.iter().flat_map(|c| c.to_pem().unwrap()).collect(),
            key.private_key_to_pem_pkcs8().unwrap(),
        )
    }

    #[test]
    fn a_leaf_outside_its_validity_window_is_refused_by_its_key() {
        let load = |validity| {
            let (cert, key) = signed(&["a.test"], validity, None);
            CertSet::from_bytes(
                &config(1),
                vec![self_signed(&["d.test"]), pem(&[&cert], &key)],
            )
        };
        let expired = load((-7200, -60)).err().unwrap().to_string();
        assert!(
            expired.starts_with("gateway.tls.certificates[0].cert_file: the certificate in")
                && expired.contains("not valid now"),
            "{expired}"
        );
        let premature = load((3600, 7200)).err().unwrap().to_string();
        assert!(premature.contains("not valid now"), "{premature}");
        assert!(
            load((60, 7200)).is_ok(),
            "a start a minute ahead is clock skew"
        );
    }

    #[test]
    fn a_chain_out_of_order_or_with_a_foreign_intermediate_is_refused() {
        let (root, root_key) = signed(&["Root"], (-60, 86_400), None);
        let (inter, inter_key) = signed(&["Inter"], (-60, 86_400), Some((&root, &root_key)));
        let (leaf, leaf_key) = signed(&["a.test"], (-60, 86_400), Some((&inter, &inter_key)));
        let (other, _) = signed(&["Other"], (-60, 86_400), Some((&root, &root_key)));
        let load = |chain: &[&X509]| CertSet::from_bytes(&config(0), vec![pem(chain, &leaf_key)]);
        assert!(load(&[&leaf, &inter]).is_ok());
        assert!(load(&[&leaf, &inter, &root]).is_ok());
        let err = load(&[&leaf, &other]).err().unwrap().to_string();
        assert!(
            err.starts_with("gateway.tls.cert_file: in")
                && err.contains("certificate 0 of the chain is not signed by the next"),
            "{err}"
        );
        let err = load(&[&leaf, &root, &inter]).err().unwrap().to_string();
        assert!(err.contains("certificate 0 of the chain"), "{err}");
        let err = load(&[&leaf, &inter, &other]).err().unwrap().to_string();
        assert!(err.contains("certificate 1 of the chain"), "{err}");
    }

    fn files(key_path: &str) -> TlsFiles {
        TlsFiles {
            key_path: key_path.into(),
            cert_file: PathBuf::from("c.pem"),
            key_file: PathBuf::from("k.pem"),
        }
    }

    fn config(extra: usize) -> TlsConfig {
        TlsConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            default: files("gateway.tls"),
            certificates: (0..extra)
                .map(|i| files(&format!("gateway.tls.certificates[{i}]")))
                .collect(),
            redirect_http: false,
            redirect_port: 443,
            reload_interval: Duration::from_secs(1),
        }
    }

    fn cn(c: &Certified) -> String {
        let entry = c.chain[0]
            .subject_name()
            .entries_by_nid(Nid::COMMONNAME)
            .next()
            .unwrap();
        entry.data().to_string().unwrap()
    }

    #[test]
    fn sni_picks_the_exact_name_then_a_wildcard_then_the_default() {
        let set = CertSet::from_bytes(
            &config(3),
            vec![
                self_signed(&["default.test"]),
                self_signed(&["shop.test", "www.shop.test"]),
                self_signed(&["*.shop.test"]),
                self_signed(&["shop.test"]),
            ],
        )
        .unwrap();
        assert_eq!(cn(set.select(Some("shop.test"))), "shop.test");
        assert_eq!(
            cn(set.select(Some("WWW.Shop.Test."))),
            "shop.test",
            "names compare without case or the root dot"
        );
        assert_eq!(cn(set.select(Some("eu.shop.test"))), "*.shop.test");
        assert_eq!(
            cn(set.select(Some("a.eu.shop.test"))),
            "default.test",
            "a wildcard covers one label"
        );
        assert_eq!(cn(set.select(Some("other.test"))), "default.test");
        assert_eq!(cn(set.select(None)), "default.test");
        assert_eq!(
            set.sni_names(),
            ["*.shop.test", "shop.test", "www.shop.test"],
            "a name claimed twice goes to the first"
        );
    }

    #[test]
    fn covers_the_san_names_wildcards_and_addresses_of_every_certificate() {
        let set = CertSet::from_bytes(
            &config(2),
            vec![
                self_signed(&["default.test", "*.d.test"]),
                self_signed(&["shop.test"]),
                self_signed(&["*.b.test"]),
            ],
        )
        .unwrap();
        for host in [
            "default.test",
            "x.d.test",
            "shop.test",
            "SHOP.test.",
            "eu.b.test",
        ] {
            assert!(set.covers(host), "{host}");
        }
        for host in [
            "other.test",
            "d.test",
            "a.x.d.test",
            "b.test",
            "127.0.0.1",
            "shop.test..",
            "",
        ] {
            assert!(!set.covers(host), "{host}");
        }
    }

    #[test]
    fn a_key_of_another_certificate_or_a_certificate_without_names_is_refused_by_its_key() {
        let (a_cert, _) = self_signed(&["a.test"]);
        let (_, b_key) = self_signed(&["b.test"]);
        let err = CertSet::from_bytes(&config(1), vec![self_signed(&["d.test"]), (a_cert, b_key)])
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .starts_with("gateway.tls.certificates[0].key_file: the key in"),
            "{err}"
        );
        let err = CertSet::from_bytes(&config(1), vec![self_signed(&["d.test"]), self_signed(&[])])
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .starts_with("gateway.tls.certificates[0].cert_file:"),
            "{err}"
        );
        let err = CertSet::from_bytes(&config(0), vec![(b"junk".to_vec(), b"junk".to_vec())])
            .err()
            .unwrap();
        assert!(
            err.to_string().starts_with("gateway.tls.cert_file:"),
            "{err}"
        );
        assert!(
            CertSet::from_bytes(&config(0), vec![self_signed(&[])]).is_ok(),
            "the default needs no name"
        );
    }
}
