//! Where each admin API is, and the token it takes.
//!
//! An address comes from its flag (`--backend-admin`, `--gateway-admin`:
//! `http://host:port` or `host:port`) or else from the config file's listen
//! address (`backend.admin_listen`, `gateway.admin_listen`; a wildcard
//! address is reached on loopback). The config file is read only when a
//! flag is missing, and only for those two keys: an operator's shell has
//! the admin token, not the secrets the servers check at start. The token
//! is the one the servers read, `FLASHGATE_ADMIN_TOKEN`, from the
//! environment.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use flashgate_common::config::{file, ENV_ADMIN_TOKEN};

use super::error::CliError;
use super::AdminArgs;

/// One admin API: its base URL (no trailing `/`) and its bearer token.
#[derive(Debug, Clone)]
pub struct Target {
    pub base: String,
    pub token: String,
}

/// The flags, and the config file to fall back on.
pub struct Targets {
    backend: Option<String>,
    gateway: Option<String>,
    config: PathBuf,
}

impl Targets {
    pub fn new(args: &AdminArgs, config: &Path) -> Self {
        Self {
            backend: args.backend_admin.clone(),
            gateway: args.gateway_admin.clone(),
            config: config.to_owned(),
        }
    }

    /// The backend's admin API.
    pub fn backend(&self) -> Result<Target, CliError> {
        let token = token()?;
        let base = match &self.backend {
            Some(url) => base_url("--backend-admin", url)?,
            None => {
                let file = self.config()?;
                listen_url(self.listen("backend.admin_listen", &file.backend.admin_listen)?)
            }
        };
        Ok(Target { base, token })
    }

    /// The gateway's admin listener.
    pub fn gateway(&self) -> Result<Target, CliError> {
        let token = token()?;
        let base = match &self.gateway {
            Some(url) => base_url("--gateway-admin", url)?,
            None => {
                let file = self.config()?;
                listen_url(self.listen("gateway.admin_listen", &file.gateway.admin_listen)?)
            }
        };
        Ok(Target { base, token })
    }

    /// The config file's shape (its keys, unchecked values).
    fn config(&self) -> Result<file::File, CliError> {
        let fail = |error: String| CliError::Config {
            path: self.config.clone(),
            error,
        };
        let text = std::fs::read_to_string(&self.config).map_err(|e| fail(e.to_string()))?;
        toml::from_str(&text).map_err(|e| fail(e.to_string().trim_end().to_owned()))
    }

    /// A listen address of the config file, `key` naming it.
    fn listen(&self, key: &str, value: &str) -> Result<SocketAddr, CliError> {
        value.parse().map_err(|_| CliError::Config {
            path: self.config.clone(),
            error: format!("{key}: `{value}` is not an ip:port address"),
        })
    }
}

/// `FLASHGATE_ADMIN_TOKEN`, which must be set and not empty.
fn token() -> Result<String, CliError> {
    match std::env::var(ENV_ADMIN_TOKEN) {
        Ok(t) if !t.is_empty() => Ok(t),
        _ => Err(CliError::NoToken {
            var: ENV_ADMIN_TOKEN,
        }),
    }
}

/// The URL that reaches a listener bound to `addr`.
fn listen_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The base URL a flag names: `http://host:port` or `host:port`, with no
/// path, query or other scheme (the admin listeners speak plain HTTP).
fn base_url(flag: &'static str, value: &str) -> Result<String, CliError> {
    let bad = |why: &'static str| CliError::BadUrl {
        flag,
        value: value.to_owned(),
        why,
    };
    let rest = match value.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => return Err(bad("the admin APIs speak http://")),
        None => value,
    };
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    if host_port.is_empty() {
        return Err(bad("no host"));
    }
    if host_port.contains(['/', '?', '#', '@']) || host_port.contains(char::is_whitespace) {
        return Err(bad("give only host:port, no path"));
    }
    Ok(format!("http://{host_port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_names_a_host_and_port_over_http() {
        let ok = |v| base_url("--backend-admin", v).unwrap();
        assert_eq!(ok("127.0.0.1:9091"), "http://127.0.0.1:9091");
        assert_eq!(ok("http://backend:9091/"), "http://backend:9091");
        assert_eq!(ok("[::1]:9091"), "http://[::1]:9091");
        for bad in ["https://x:1", "http://x:1/admin", "", "http://", "x y:1"] {
            let err = base_url("--backend-admin", bad).unwrap_err().to_string();
            assert!(err.contains("--backend-admin"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_wildcard_listener_is_reached_on_loopback() {
        assert_eq!(
            listen_url("0.0.0.0:9092".parse().unwrap()),
            "http://127.0.0.1:9092"
        );
        assert_eq!(
            listen_url("[::]:9092".parse().unwrap()),
            "http://[::1]:9092"
        );
        assert_eq!(
            listen_url("10.0.0.5:9091".parse().unwrap()),
            "http://10.0.0.5:9091"
        );
    }
}
