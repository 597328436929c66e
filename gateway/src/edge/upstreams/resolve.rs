//! The addresses of the shop's origins: each name resolved when the
//! gateway starts and again every `shop.resolve_interval_ms` (Pingora's
//! load balancer asks this [`ServiceDiscovery`] on that schedule), so a
//! changed address set takes effect without a restart. A lookup that fails
//! or finds nothing keeps that origin's last good addresses (logged, and
//! counted in `flashgate_shop_resolve_failures_total`): a DNS hiccup must
//! not take a healthy shop away. An IP literal is its own address.
//!
//! Each [`Backend`] carries its [`Origin`] (`Backend.ext`), from which the
//! peer takes its scheme, SNI and certificate name. Pingora tells backends
//! apart by address only: two origins that resolve to one address are one
//! upstream, the first origin's.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use flashgate_common::config::Origin;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::Backend;
use prometheus::IntCounter;
use tracing::{info, warn};

/// Longest wait for one name's lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The origins and the addresses each last resolved to.
pub struct OriginDiscovery {
    origins: Vec<Arc<Origin>>,
    /// Per origin, the addresses of its last successful lookup (empty until one).
    last_good: Mutex<Vec<Vec<SocketAddr>>>,
    /// `flashgate_shop_resolve_failures_total`.
    failures: IntCounter,
}

impl OriginDiscovery {
    pub fn new(origins: &[Origin], failures: IntCounter) -> Self {
        Self {
            origins: origins.iter().cloned().map(Arc::new).collect(),
            last_good: Mutex::new(vec![Vec::new(); origins.len()]),
            failures,
        }
    }

    /// One lookup of every origin, merged into the last good sets.
    async fn refresh(&self) -> Vec<Vec<SocketAddr>> {
        let lookups = self.origins.iter().map(|origin| lookup(origin));
        let results = futures_util::future::join_all(lookups).await;
        let mut last_good = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        for ((origin, result), kept) in self.origins.iter().zip(results).zip(last_good.iter_mut()) {
            match result {
                Ok(mut addrs) => {
                    addrs.sort_unstable();
                    addrs.dedup();
                    if *kept != addrs {
                        info!(origin = %origin, addresses = ?addrs, "shop origin resolved");
                        *kept = addrs;
                    }
                }
                Err(error) => {
                    self.failures.inc();
                    warn!(origin = %origin, %error, kept = ?kept, "shop origin: lookup failed, keeping its last good addresses");
                }
            }
        }
        last_good.clone()
    }
}

/// The addresses of one origin; an error when there are none.
async fn lookup(origin: &Origin) -> Result<Vec<SocketAddr>, String> {
    if let Some(ip) = origin.ip() {
        return Ok(vec![SocketAddr::new(ip, origin.port)]);
    }
    let authority = origin.authority();
    match tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host(authority)).await {
        Err(_) => Err(format!("no answer within {LOOKUP_TIMEOUT:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(addrs)) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if addrs.is_empty() {
                Err("the name has no addresses".into())
            } else {
                Ok(addrs)
            }
        }
    }
}

#[async_trait]
impl ServiceDiscovery for OriginDiscovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let resolved = self.refresh().await;
        let mut backends = BTreeSet::new();
        for (origin, addrs) in self.origins.iter().zip(resolved) {
            for addr in addrs {
                let mut backend = Backend {
                    addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                    weight: 1,
                    ext: http::Extensions::new(),
                };
                backend.ext.insert(origin.clone());
                backends.insert(backend);
            }
        }
        Ok((backends, HashMap::new()))
    }
}

/// The origin a backend was resolved from.
pub fn origin_of(backend: &Backend) -> Option<&Arc<Origin>> {
    backend.ext.get::<Arc<Origin>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> IntCounter {
        IntCounter::new("failures", "test").unwrap()
    }

    #[tokio::test]
    async fn a_failed_lookup_keeps_the_last_good_addresses_and_is_counted() {
        let good = Origin::parse("127.0.0.1:8080").unwrap();
        let bad = Origin::parse("no-such-name.invalid:80").unwrap();
        let failures = counter();
        let d = OriginDiscovery::new(&[good, bad], failures.clone());
        // Pretend the bad name resolved once before.
        d.last_good.lock().unwrap()[1] = vec!["192.0.2.1:80".parse().unwrap()];
        let (backends, _) = d.discover().await.unwrap();
        let addrs: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
        assert_eq!(addrs, ["127.0.0.1:8080", "192.0.2.1:80"]);
        assert_eq!(failures.get(), 1);
        let origins: Vec<String> = backends
            .iter()
            .map(|b| origin_of(b).unwrap().host.clone())
            .collect();
        assert_eq!(origins, ["127.0.0.1", "no-such-name.invalid"]);
    }

    #[tokio::test]
    async fn a_name_resolves_to_its_addresses_with_the_origins_port() {
        let d = OriginDiscovery::new(
            &[Origin::parse("https://localhost:8443").unwrap()],
            counter(),
        );
        let (backends, _) = d.discover().await.unwrap();
        assert!(!backends.is_empty());
        for b in &backends {
            let addr = b.addr.as_inet().unwrap();
            assert!(addr.ip().is_loopback() && addr.port() == 8443, "{addr}");
        }
    }
}
