//! How each shop upstream is checked, every `shop.health_check_interval_ms`:
//! with `shop.health_check_path`, a `GET` of that path through Pingora's
//! [`HttpHealthCheck`] (over TLS with the origin's SNI for `https://`
//! origins; `Host` the fixed `shop.host_header`, else the origin's name),
//! healthy on any
//! 2xx or 3xx (Pingora's own check takes only 200, and a shop's health page
//! may well redirect); without it, a TCP connect ([`TcpHealthCheck`]).
//!
//! The HTTP checks are one per origin, since their SNI and `Host` differ;
//! a backend finds its check through the origin it carries.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashgate_common::config::{HostHeader, Origin};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck, TcpHealthCheck};
use pingora::lb::Backend;

use super::resolve::origin_of;
use super::Trust;

/// The check of every upstream.
pub enum ShopHealthCheck {
    Tcp(Box<TcpHealthCheck>),
    Http(HashMap<Arc<Origin>, HttpHealthCheck>),
}

impl ShopHealthCheck {
    /// A TCP connect within `timeout` to every upstream.
    pub fn tcp(timeout: Duration) -> Self {
        let mut check = TcpHealthCheck::new();
        check.peer_template.options.connection_timeout = Some(timeout);
        ShopHealthCheck::Tcp(check)
    }

    /// A `GET path` of every origin, each within `timeout`.
    pub fn http(
        origins: &[Origin],
        path: &str,
        host_header: &HostHeader,
        trust: &Trust,
        timeout: Duration,
    ) -> Self {
        let checks = origins
            .iter()
            .map(|origin| {
                let mut check = HttpHealthCheck::new(&origin.host, origin.tls());
                let mut req =
                    RequestHeader::build("GET", path.as_bytes(), None).expect("a validated path");
                let host = match host_header {
                    HostHeader::Fixed(name) => name.clone(),
                    HostHeader::Client => default_host(origin),
                };
                req.insert_header(http::header::HOST, host)
                    .expect("a validated host");
                req.insert_header(http::header::USER_AGENT, "flashgate-health-check")
                    .expect("a constant");
                check.req = req;
                check.peer_template.options.connection_timeout = Some(timeout);
                check.peer_template.options.read_timeout = Some(timeout);
                check.peer_template.options.ca = trust.extra_roots.clone();
                check.validator = Some(Box::new(healthy_status));
                (Arc::new(origin.clone()), check)
            })
            .collect();
        ShopHealthCheck::Http(checks)
    }
}

/// The `Host` naming `origin` (its port only when not the scheme's default).
pub fn default_host(origin: &Origin) -> String {
    if origin.port == origin.scheme.default_port() {
        match origin.ip() {
            Some(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
            _ => origin.host.clone(),
        }
    } else {
        origin.authority()
    }
}

/// 2xx and 3xx are healthy.
fn healthy_status(resp: &ResponseHeader) -> pingora::Result<()> {
    if resp.status.is_success() || resp.status.is_redirection() {
        Ok(())
    } else {
        pingora::Error::e_explain(
            pingora::ErrorType::CustomCode("unhealthy status", resp.status.as_u16()),
            "during the shop's HTTP health check",
        )
    }
}

#[async_trait]
impl HealthCheck for ShopHealthCheck {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        match self {
            ShopHealthCheck::Tcp(check) => check.check(target).await,
            ShopHealthCheck::Http(checks) => match origin_of(target).and_then(|o| checks.get(o)) {
                Some(check) => check.check(target).await,
                None => pingora::Error::e_explain(
                    pingora::ErrorType::InternalError,
                    "a shop upstream without its origin",
                ),
            },
        }
    }

    fn health_threshold(&self, success: bool) -> usize {
        match self {
            ShopHealthCheck::Tcp(check) => check.health_threshold(success),
            ShopHealthCheck::Http(_) => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_are_healthy_errors_are_not() {
        for (code, ok) in [
            (200, true),
            (204, true),
            (301, true),
            (308, true),
            (404, false),
            (503, false),
        ] {
            let resp = ResponseHeader::build(code, None).unwrap();
            assert_eq!(healthy_status(&resp).is_ok(), ok, "{code}");
        }
    }

    #[test]
    fn the_default_host_names_the_port_only_when_it_is_not_the_schemes() {
        let host = |s: &str| default_host(&Origin::parse(s).unwrap());
        assert_eq!(host("https://shop.example"), "shop.example");
        assert_eq!(host("https://shop.example:8443"), "shop.example:8443");
        assert_eq!(host("10.0.0.5:80"), "10.0.0.5");
        assert_eq!(host("http://[::1]"), "[::1]");
    }
}
