//! A shop origin as operators name it: `host:port`, `http://host[:port]`
//! or `https://host[:port]`, the host a DNS name or an IP literal (IPv6 in
//! brackets). Names stay names here: the gateway resolves them at start and
//! again while it runs, so a changed address set is followed without a
//! restart.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// How the gateway speaks to an origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    Http,
    /// TLS: SNI and certificate name from the origin's host.
    Https,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// One `shop.upstreams` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    pub scheme: Scheme,
    /// A lower-case DNS name or an IP literal (IPv6 without brackets).
    pub host: String,
    pub port: u16,
}

/// Why an entry is not an origin (the caller prefixes the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    #[error("`{0}`: only http:// and https:// origins are supported")]
    Scheme(String),
    #[error("`{0}` needs a port (host:port), or a scheme (http://host, https://host)")]
    NoPort(String),
    #[error("`{0}`: the port must be a number from 1 to 65535")]
    Port(String),
    #[error("`{0}`: an origin names a host and port only, no path, query or user")]
    Extra(String),
    #[error("`{0}`: `{1}` is not a DNS name or an IP address")]
    Host(String, String),
}

impl Origin {
    /// Parses one entry.
    ///
    /// # Errors
    /// [`OriginError`], quoting the entry.
    pub fn parse(entry: &str) -> Result<Self, OriginError> {
        let err_host = |h: &str| OriginError::Host(entry.to_owned(), h.to_owned());
        let (scheme, rest) = match entry.split_once("://") {
            Some((s, rest)) if s.eq_ignore_ascii_case("http") => (Some(Scheme::Http), rest),
            Some((s, rest)) if s.eq_ignore_ascii_case("https") => (Some(Scheme::Https), rest),
            Some(_) => return Err(OriginError::Scheme(entry.to_owned())),
            None => (None, entry),
        };
        // A trailing `/` is how many people write an origin; anything more is not one.
        let rest = if scheme.is_some() {
            rest.strip_suffix('/').unwrap_or(rest)
        } else {
            rest
        };
        if rest.contains(['/', '?', '#', '@']) || rest.chars().any(char::is_whitespace) {
            return Err(OriginError::Extra(entry.to_owned()));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (ip, after) = v6.split_once(']').ok_or_else(|| err_host(rest))?;
            let ip: Ipv6Addr = ip.parse().map_err(|_| err_host(ip))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| err_host(rest))?),
            };
            (ip.to_string(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, _)) if h.contains(':') => return Err(err_host(rest)),
                Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
                None => (rest.to_ascii_lowercase(), None),
            }
        };
        if !valid_host(&host) {
            return Err(err_host(&host));
        }
        let port = match (port, scheme) {
            (Some(p), _) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| OriginError::Port(entry.to_owned()))?,
            (None, Some(s)) => s.default_port(),
            (None, None) => return Err(OriginError::NoPort(entry.to_owned())),
        };
        Ok(Self {
            scheme: scheme.unwrap_or(Scheme::Http),
            host,
            port,
        })
    }

    pub fn tls(&self) -> bool {
        self.scheme == Scheme::Https
    }

    /// The host as an address, when it is an IP literal (nothing to resolve).
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    /// `host:port` as a resolver takes it (IPv6 in brackets).
    pub fn authority(&self) -> String {
        match self.ip() {
            Some(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.authority())
    }
}

/// An IPv4 or IPv6 literal, or a DNS name: labels of letters, digits, `-`
/// and `_` (seen in internal names), 1 to 63 bytes, 253 in all.
pub fn valid_host(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> (Scheme, String, u16) {
        let o = Origin::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (o.scheme, o.host, o.port)
    }

    #[test]
    fn entries_take_each_form_and_default_the_port_by_scheme() {
        use Scheme::*;
        assert_eq!(ok("127.0.0.1:8000"), (Http, "127.0.0.1".into(), 8000));
        assert_eq!(
            ok("shop.internal:8080"),
            (Http, "shop.internal".into(), 8080)
        );
        assert_eq!(ok("http://Shop.Example"), (Http, "shop.example".into(), 80));
        assert_eq!(
            ok("https://shop.example"),
            (Https, "shop.example".into(), 443)
        );
        assert_eq!(
            ok("https://shop.example:8443/"),
            (Https, "shop.example".into(), 8443)
        );
        assert_eq!(ok("[::1]:81"), (Http, "::1".into(), 81));
        assert_eq!(
            ok("https://[2001:db8::1]"),
            (Https, "2001:db8::1".into(), 443)
        );
        let o = Origin::parse("https://[2001:db8::1]:9443").unwrap();
        assert_eq!(o.authority(), "[2001:db8::1]:9443");
        assert_eq!(o.to_string(), "https://[2001:db8::1]:9443");
        assert!(o.tls() && o.ip().is_some());
    }

    #[test]
    fn what_is_not_an_origin_is_refused_with_the_reason() {
        for (s, want) in [
            ("shop.example", "needs a port"),
            ("ftp://shop.example", "only http:// and https://"),
            ("https://shop.example/cart", "no path"),
            ("http://user@shop.example", "no path"),
            ("shop.example:0", "port must be"),
            ("shop.example:http", "port must be"),
            ("https://sh op.example", "no path"),
            ("https://-bad.example", "not a DNS name"),
            ("::1:80", "not a DNS name"),
            ("https://", "not a DNS name"),
            ("[::1", "not a DNS name"),
        ] {
            let e = Origin::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
