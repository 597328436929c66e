//! A certificate authority of the test's own: a root, intermediates and
//! leaf certificates for any DNS names or IPs, made with OpenSSL (the
//! library the gateway links) and written as PEM files.
//!
//! Keys are EC P-256 (made in microseconds). Certificates are valid from an
//! hour ago for a day, with serials from a counter so two leaves for the
//! same name differ.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use openssl::asn1::{Asn1Integer, Asn1Time};
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::{hash, MessageDigest};
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509Builder, X509Name, X509};

static SERIAL: AtomicU32 = AtomicU32::new(1);

fn new_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn name(cn: &str) -> X509Name {
    let mut n = X509Name::builder().unwrap();
    n.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
    n.build()
}

/// A certificate builder with serial, subject, validity and public key set.
fn builder(cn: &str, key: &PKey<Private>) -> X509Builder {
    let mut b = X509Builder::new().unwrap();
    b.set_version(2).unwrap();
    let serial = BigNum::from_u32(SERIAL.fetch_add(1, Ordering::Relaxed)).unwrap();
    b.set_serial_number(&Asn1Integer::from_bn(&serial).unwrap())
        .unwrap();
    b.set_subject_name(&name(cn)).unwrap();
    let now = flashgate_common::now_ms() / 1000;
    b.set_not_before(&Asn1Time::from_unix(now - 3600).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(now + 86_400).unwrap())
        .unwrap();
    b.set_pubkey(key).unwrap();
    b
}

/// A root or intermediate CA.
pub struct TestCa {
    cert: X509,
    key: PKey<Private>,
    /// The intermediates between this CA and the root, this one first
    /// (empty for the root): a leaf's full chain is the leaf, then these.
    chain: Vec<X509>,
}

impl TestCa {
    /// A self-signed root.
    pub fn root(cn: &str) -> Self {
        let key = new_key();
        let mut b = builder(cn, &key);
        b.set_issuer_name(&name(cn)).unwrap();
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()
                .unwrap(),
        )
        .unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        Self {
            cert: b.build(),
            key,
            chain: Vec::new(),
        }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, cn: &str) -> Self {
        let key = new_key();
        let mut b = builder(cn, &key);
        b.set_issuer_name(self.cert.subject_name()).unwrap();
        b.append_extension(
            BasicConstraints::new()
                .critical()
                .ca()
                .pathlen(0)
                .build()
                .unwrap(),
        )
        .unwrap();
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()
                .unwrap(),
        )
        .unwrap();
        b.sign(&self.key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        let mut chain = vec![cert.clone()];
        chain.extend(self.chain.iter().cloned());
        Self { cert, key, chain }
    }

    /// This CA's certificate as PEM (what clients trust, for a root).
    pub fn pem(&self) -> Vec<u8> {
        self.cert.to_pem().unwrap()
    }

    /// A server certificate with common name `cn` for `dns` names and `ips`.
    pub fn leaf(&self, cn: &str, dns: &[&str], ips: &[&str]) -> Leaf {
        self.leaf_for(cn, dns, ips, false)
    }

    /// As [`TestCa::leaf`], also good as a client certificate: a Redis
    /// Cluster node shows its one certificate on both ends of a cluster-bus
    /// link, and the accepting node verifies it as a client's.
    pub fn peer_leaf(&self, cn: &str, dns: &[&str], ips: &[&str]) -> Leaf {
        self.leaf_for(cn, dns, ips, true)
    }

    fn leaf_for(&self, cn: &str, dns: &[&str], ips: &[&str], client_too: bool) -> Leaf {
        let key = new_key();
        let mut b = builder(cn, &key);
        b.set_issuer_name(self.cert.subject_name()).unwrap();
        b.append_extension(BasicConstraints::new().critical().build().unwrap())
            .unwrap();
        b.append_extension(
            KeyUsage::new()
                .critical()
                .digital_signature()
                .build()
                .unwrap(),
        )
        .unwrap();
        let mut usage = ExtendedKeyUsage::new();
        usage.server_auth();
        if client_too {
            usage.client_auth();
        }
        b.append_extension(usage.build().unwrap()).unwrap();
        let mut san = SubjectAlternativeName::new();
        for d in dns {
            san.dns(d);
        }
        for ip in ips {
            san.ip(ip);
        }
        b.append_extension(
            san.build(&b.x509v3_context(Some(&self.cert), None))
                .unwrap(),
        )
        .unwrap();
        b.sign(&self.key, MessageDigest::sha256()).unwrap();
        let cert = b.build();
        let spki = cert.public_key().unwrap().public_key_to_der().unwrap();
        let mut cert_pem = cert.to_pem().unwrap();
        for c in &self.chain {
            cert_pem.extend(c.to_pem().unwrap());
        }
        Leaf {
            cert_pem,
            key_pem: key.private_key_to_pem_pkcs8().unwrap(),
            spki_sha256: base64_std(&hash(MessageDigest::sha256(), &spki).unwrap()),
        }
    }
}

/// A leaf certificate: its full chain and key as PEM.
pub struct Leaf {
    /// The leaf, then its intermediates.
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// Base64 SHA-256 of its public key (Chromium's
    /// `--ignore-certificate-errors-spki-list`).
    pub spki_sha256: String,
}

impl Leaf {
    /// Writes the chain and the key (each replaced whole: written aside,
    /// then renamed, as certificate tools do).
    pub fn write(&self, cert_file: &Path, key_file: &Path) {
        write_replacing(cert_file, &self.cert_pem);
        write_replacing(key_file, &self.key_pem);
    }
}

/// Writes `bytes` to `path` through a rename, so a reader sees the old
/// file or the new one, never half of one.
pub fn write_replacing(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn base64_std(bytes: &[u8]) -> String {
    openssl::base64::encode_block(bytes)
}
