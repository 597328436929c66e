//! `flashgate check --connect`: which of the gateway's own paths the shop
//! serves too. Those requests never reach the shop once the gateway is in
//! front of it, so an operator should move `gateway.path_prefix` (or the
//! shop's page) before the cutover, not find out from a customer.

use std::time::Duration;

use crate::edge::route::Routes;

/// How long one probe waits for the shop's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the shop answered for one of the gateway's paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub path: String,
    pub status: u16,
}

impl Probe {
    /// The shop serves the path itself: any answer but 404 and 410 (a 405
    /// or a redirect still means the path is the shop's).
    pub fn shadowed(&self) -> bool {
        !matches!(self.status, 404 | 410)
    }
}

/// How the shop is asked: its first origin, as the gateway reaches it.
pub struct ShopTarget<'a> {
    /// `http://host:port` or `https://host:port`.
    pub base: String,
    /// `shop.host_header` when fixed.
    pub host: Option<&'a str>,
    /// `shop.ca_file`'s PEM, trusted besides the system's roots.
    pub ca_pem: Option<String>,
}

/// GETs each of the gateway's own paths from the shop, one per sale id in
/// `sale_ids` (or `example`).
///
/// # Errors
/// When the shop cannot be reached at all.
pub async fn probe_shop(
    routes: &Routes,
    shop: &ShopTarget<'_>,
    sale_ids: &[&str],
) -> anyhow::Result<Vec<Probe>> {
    let mut http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(PROBE_TIMEOUT);
    if let Some(pem) = &shop.ca_pem {
        for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())? {
            http = http.add_root_certificate(cert);
        }
    }
    let http = http.build()?;
    let shop_base = shop.base.as_str();
    let ids = if sale_ids.is_empty() {
        &["example"][..]
    } else {
        sale_ids
    };
    let mut paths: Vec<String> = ids.iter().flat_map(|id| routes.own_paths(id)).collect();
    paths.sort();
    paths.dedup();
    let mut probes = Vec::with_capacity(paths.len());
    for path in paths {
        let url = format!("{}{path}", shop_base.trim_end_matches('/'));
        let mut req = http.get(&url);
        if let Some(host) = shop.host {
            req = req.header(reqwest::header::HOST, host);
        }
        let status = req
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("shop at {shop_base}: GET {path}: {e}"))?
            .status()
            .as_u16();
        probes.push(Probe { path, status });
    }
    Ok(probes)
}
