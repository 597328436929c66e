//! TLS to Redis (`rediss://`), through native-tls: on Linux the system's
//! OpenSSL, the library the gateway's own TLS and the backend's
//! `https://`/`amqps://` clients link too.
//!
//! The server's certificate is always verified (`#insecure` URLs are
//! refused by the config), in every mode, against [`Roots`]: the system's
//! roots, plus the CA certificates of `redis.ca_file` when it is set. The
//! redis crate's native-tls path *replaces* the roots with the ones it is
//! given, so the system's bundle is handed over beside the file's.
//!
//! The roots reach a connection through its `ConnectionInfo`: the address
//! of a `rediss://` node carries them ([`Roots::apply`]). How each mode gets
//! there, with the crate (1.8) on native-tls, where its own ways to pass
//! roots to a cluster (`ClusterClientBuilder::certs`) or a sentinel set
//! (`SentinelClientBuilder::set_client_to_redis_certificates`) exist only
//! with its rustls feature, a second TLS library the binaries do not take:
//!
//! - **standalone**: one client per URL, built with the roots.
//! - **cluster**: the crate builds each node's connection itself, from the
//!   address the cluster gives out, through the `Connect` type its
//!   connection is generic over (`ClusterClient::get_async_generic_connection`);
//!   [`super::cluster::NodeConnection`] applies the roots there. `Connect`
//!   has no receiver, so these roots are the process's ([`cluster_roots`]):
//!   set by its first cluster client, and a later one with another
//!   `redis.ca_file` is refused (a process runs one config).
//! - **sentinel**: the crate's `SentinelClient` keeps the roots of the
//!   sentinels' own URLs but reaches the primary they name with the
//!   system's roots only, so the lookup of the primary is ours
//!   ([`super::sentinel`]), each node's client built with the roots.
//!
//! Not taken: pointing OpenSSL's default paths at a bundle of the system's
//! roots and the file (`SSL_CERT_FILE`, set at start). It would change
//! what every other OpenSSL client of the process trusts (the event
//! destinations, which have their own `events.ca_file`), and it means
//! writing the environment of a running process (refused by the workspace's
//! clippy config).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use redis::{
    Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    TlsCertificates,
};

pub use crate::ca_file::CaFileError;
use crate::config::RedisConfig;

use crate::ca_file::PEM_BEGIN;
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
    let (pem, count) = file_roots(path)?;
    Roots::parse(path, pem)?;
    Ok(Some(count))
}

/// What a `rediss://` connection trusts: the system's roots, plus the CA
/// certificates of `redis.ca_file` when set. Cheap to clone.
#[derive(Clone, Default)]
pub(super) struct Roots {
    /// A TLS address that carries the parsed roots (the crate names their
    /// type nowhere public, so they are kept in the address they came in);
    /// `None`: the crate's default, the system's roots.
    carrier: Option<ConnectionAddr>,
}

impl Roots {
    /// The system's roots, plus those of `ca_file`.
    ///
    /// # Errors
    /// [`CaFileError`]: `ca_file` cannot be read or parsed.
    pub(super) fn load(ca_file: Option<&Path>) -> Result<Self, CaFileError> {
        match ca_file {
            None => Ok(Self::default()),
            Some(path) => Self::parse(path, file_roots(path)?.0),
        }
    }

    /// The roots of `pem` (the text of `path`) and the system's.
    fn parse(path: &Path, mut pem: Vec<u8>) -> Result<Self, CaFileError> {
        pem.push(b'\n');
        pem.extend_from_slice(crate::ca_file::system_roots());
        let certificates = TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        };
        // The crate parses the certificates into the address of a client.
        let client = Client::build_with_tls("rediss://127.0.0.1/", certificates)
            .map_err(|e| CaFileError::not_pem(KEY, path, e.to_string()))?;
        Ok(Self {
            carrier: Some(client.get_connection_info().addr().clone()),
        })
    }

    /// `info`, trusting these roots if it is a TLS address.
    pub(super) fn apply(&self, info: ConnectionInfo) -> ConnectionInfo {
        let Some(ConnectionAddr::TcpTls { tls_params, .. }) = &self.carrier else {
            return info;
        };
        let addr = match info.addr() {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => return info,
        };
        info.set_addr(addr)
    }

    /// A client for the node at `url`, trusting these roots.
    ///
    /// # Errors
    /// A bad URL.
    pub(super) fn client(&self, url: impl IntoConnectionInfo) -> RedisResult<Client> {
        Client::open(self.apply(url.into_connection_info()?))
    }
}

/// A client for the node at `url`; a `rediss://` one also trusts the
/// certificates of `ca_file`, when given.
///
/// # Errors
/// A bad URL, or a `ca_file` that cannot be read or parsed.
pub(super) fn client(url: &str, ca_file: Option<&Path>) -> RedisResult<Client> {
    Roots::load(ca_file)?.client(url)
}

/// The roots of every cluster node connection of this process
/// ([`super::cluster::NodeConnection`]), fixed by its first cluster client
/// with the `redis.ca_file` it was given (none included).
static CLUSTER_ROOTS: OnceLock<(Option<PathBuf>, Roots)> = OnceLock::new();

/// Fixes the roots of this process's cluster node connections to those of
/// `ca_file`, or checks that they already are.
///
/// # Errors
/// `ca_file` cannot be read or parsed, or the process's cluster
/// connections already trust another file.
pub(super) fn fix_cluster_roots(ca_file: Option<&Path>) -> RedisResult<()> {
    let fixed = match CLUSTER_ROOTS.get() {
        Some(fixed) => fixed,
        None => {
            let roots = Roots::load(ca_file)?;
            CLUSTER_ROOTS.get_or_init(|| (ca_file.map(Path::to_owned), roots))
        }
    };
    same_ca_file(fixed.0.as_deref(), ca_file)
}

/// The roots [`fix_cluster_roots`] fixed; the system's alone before.
pub(super) fn cluster_roots() -> &'static Roots {
    static SYSTEM: Roots = Roots { carrier: None };
    CLUSTER_ROOTS.get().map_or(&SYSTEM, |(_, roots)| roots)
}

/// Whether a cluster client given `now` may share the node connections'
/// roots, fixed with `fixed`.
fn same_ca_file(fixed: Option<&Path>, now: Option<&Path>) -> RedisResult<()> {
    if fixed == now {
        return Ok(());
    }
    let name = |p: Option<&Path>| p.map_or("none".to_owned(), |p| p.display().to_string());
    Err(RedisError::from((
        ErrorKind::InvalidClientConfig,
        "redis.ca_file: a process's cluster connections trust one CA file",
        format!("already {}, now asked for {}", name(fixed), name(now)),
    )))
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

    /// A self-signed CA certificate (its key thrown away).
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBmDCCAT+gAwIBAgIUPr+toYGqzEwzm3X7KXXyp9PIl+MwCgYIKoZIzj0EAwIw
ITEfMB0GA1UEAwwWZmxhc2hnYXRlIHVuaXQgdGVzdCBDQTAgFw0yNjEyMDMyMjQw
NTVaGA8yMTI2MTEwOTIyNDA1NVowITEfMB0GA1UEAwwWZmxhc2hnYXRlIHVuaXQg
dGVzdCBDQTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABKmYcVghM7sfjXvL0tj4
3i90PxY2RxlmNZp9eGWfHAqO4up9C/Vb1QnhOcn6jGGCdjOELeJbsRUtwHh0aPig
/FWjUzBRMB0GA1UdDgQWBBRV7c5crSaavyIX0JGFQpC+mBzjAzAfBgNVHSMEGDAW
gBRV7c5crSaavyIX0JGFQpC+mBzjAzAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49
BAMCA0cAMEQCICL/6kGwzOaL6axH0xFv8g+eESr7SDf4LngQcCWwscdZAiBR/q5W
sg67QVD0SA3QF9hs5Qlhdm4qfiP4CC+Pt+hXWA==
-----END CERTIFICATE-----
";

    #[test]
    fn the_roots_of_a_ca_file_ride_in_tls_addresses_only() {
        let dir = std::env::temp_dir().join(format!("fg-redis-roots-{:x}", rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, TEST_CA).unwrap();
        let roots = Roots::load(Some(&ca)).unwrap();
        let carries = |info: &ConnectionInfo| {
            matches!(
                info.addr(),
                ConnectionAddr::TcpTls {
                    tls_params: Some(_),
                    ..
                }
            )
        };

        let tls = roots.apply("rediss://10.0.0.1:7000/".into_connection_info().unwrap());
        assert!(carries(&tls), "a rediss:// node trusts the file");
        assert!(
            matches!(tls.addr(), ConnectionAddr::TcpTls { host, port: 7000, insecure: false, .. } if host == "10.0.0.1"),
            "the address itself is kept: {:?}",
            tls.addr()
        );
        let plain = roots.apply("redis://10.0.0.1:7000/".into_connection_info().unwrap());
        assert!(matches!(plain.addr(), ConnectionAddr::Tcp(..)));
        let system_only =
            Roots::default().apply("rediss://10.0.0.1:7000/".into_connection_info().unwrap());
        assert!(!carries(&system_only), "no file: the crate's default roots");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn cluster_connections_of_one_process_share_one_ca_file() {
        let a = Path::new("/etc/a.pem");
        assert!(same_ca_file(Some(a), Some(a)).is_ok());
        assert!(same_ca_file(None, None).is_ok());
        let err = same_ca_file(Some(a), None).unwrap_err().to_string();
        assert!(
            err.contains("redis.ca_file: a process's cluster connections trust one CA file")
                && err.contains("already /etc/a.pem, now asked for none"),
            "{err}"
        );
        assert!(same_ca_file(None, Some(a)).is_err());
    }

    fn rand_suffix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id())
    }
}
