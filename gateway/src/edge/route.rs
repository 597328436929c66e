//! Which handler a request belongs to, decided from method and path alone.
//!
//! The gateway's own paths live under one prefix (`gateway.path_prefix`,
//! `/flashgate` by default): the sale API `{prefix}/api/sales…`, reservations
//! `{prefix}/api/reservations/…`, the sale pages `{prefix}/sales/{id}` and
//! the assets `{prefix}/static/…`; an unknown path under the prefix is a 404
//! of ours. `gateway.sale_page_path` may mount the sale page at one more
//! path outside the prefix (`/drops/{id}`). Everything else belongs to the
//! shop and is proxied, so a shop keeps its own `/static/` and `/api/`.

use flashgate_common::reservation::sale_of_reservation;
use flashgate_common::sale::valid_sale_id;
use http::Method;

use crate::infra::RouteKind;
use crate::rejection::Rejection;

/// The placeholder a sale id stands in for in [`Routes::own_paths`].
pub const SALE_ID_PLACEHOLDER: &str = "{id}";

/// A request the gateway answers itself, or [`Route::Shop`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    ListSales,
    SaleState(&'a str),
    Buy(&'a str),
    /// `GET /api/sales/{id}/challenge`: a proof-of-work challenge ahead of a buy.
    Challenge(&'a str),
    Reservation(&'a str),
    SalePage(&'a str),
    Asset(&'a str),
    /// Not ours: reverse-proxied to the shop.
    Shop,
}

impl Route<'_> {
    /// The route's kind, its metric label.
    pub fn kind(&self) -> RouteKind {
        match self {
            Route::ListSales => RouteKind::ListSales,
            Route::SaleState(_) => RouteKind::SaleState,
            Route::Buy(_) => RouteKind::Buy,
            Route::Challenge(_) => RouteKind::Challenge,
            Route::Reservation(_) => RouteKind::Reservation,
            Route::SalePage(_) => RouteKind::Page,
            Route::Asset(_) => RouteKind::Asset,
            Route::Shop => RouteKind::Shop,
        }
    }
}

/// A request to a gateway path that cannot be served as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// The path exists, the method does not; carries the `Allow` value.
    MethodNotAllowed(&'static str),
    /// A sale or reservation id that can never exist.
    BadId,
    /// A path under a gateway prefix that names nothing.
    NotFound,
}

impl From<RouteError> for Rejection {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::MethodNotAllowed(allow) => Rejection::MethodNotAllowed(allow),
            RouteError::BadId => Rejection::BadRequest("malformed id"),
            RouteError::NotFound => Rejection::NotFound("no such resource"),
        }
    }
}

/// Where the gateway's own paths are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    /// `/flashgate`: no trailing slash.
    prefix: String,
    /// The extra sale page mount before its `{id}`, e.g. `/drops/`.
    sale_page: Option<String>,
}

impl Routes {
    /// `prefix` as `gateway.path_prefix`; `sale_page_path` as
    /// `gateway.sale_page_path` (`/drops/{id}`), both validated by the config.
    pub fn new(prefix: &str, sale_page_path: Option<&str>) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
            sale_page: sale_page_path
                .map(|p| p.strip_suffix(SALE_ID_PLACEHOLDER).unwrap_or(p).to_owned()),
        }
    }

    /// The routes `gateway.path_prefix` and `gateway.sale_page_path` name.
    pub fn from_config(gateway: &flashgate_common::config::GatewayConfig) -> Self {
        Self::new(&gateway.path_prefix, gateway.sale_page_path.as_deref())
    }

    /// The prefix, e.g. `/flashgate`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// One path of each kind the gateway answers itself, with `sale_id` for
    /// the sale: what `check --connect` asks the shop about.
    pub fn own_paths(&self, sale_id: &str) -> Vec<String> {
        let p = &self.prefix;
        let mut paths = vec![
            format!("{p}/api/sales"),
            format!("{p}/api/sales/{sale_id}"),
            format!("{p}/sales/{sale_id}"),
            format!("{p}/static/sale.js"),
        ];
        if let Some(base) = &self.sale_page {
            paths.push(format!("{base}{sale_id}"));
        }
        paths
    }

    /// Classifies a request. `path` excludes the query string.
    pub fn classify<'a>(&self, method: &Method, path: &'a str) -> Result<Route<'a>, RouteError> {
        if let Some(rest) = path.strip_prefix(self.prefix.as_str()) {
            if rest.is_empty() || rest.starts_with('/') {
                return classify_own(method, rest);
            }
        }
        if let Some(id) = self.sale_page.as_deref().and_then(|b| path.strip_prefix(b)) {
            let id = id.strip_suffix('/').unwrap_or(id);
            if !id.contains('/') {
                if !valid_sale_id(id) {
                    return Err(RouteError::NotFound);
                }
                return get(method, Route::SalePage(id));
            }
        }
        Ok(Route::Shop)
    }
}

fn get<'a>(method: &Method, route: Route<'a>) -> Result<Route<'a>, RouteError> {
    if method == Method::GET || method == Method::HEAD {
        Ok(route)
    } else {
        Err(RouteError::MethodNotAllowed("GET, HEAD"))
    }
}

/// A path under the prefix, the prefix removed (`""` or `/…`).
fn classify_own<'a>(method: &Method, path: &'a str) -> Result<Route<'a>, RouteError> {
    if path == "/api/sales" || path == "/api/sales/" {
        return get(method, Route::ListSales);
    }
    if let Some(rest) = path.strip_prefix("/api/sales/") {
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        if !valid_sale_id(id) {
            return Err(RouteError::BadId);
        }
        return match tail {
            "" => get(method, Route::SaleState(id)),
            "buy" if method == Method::POST => Ok(Route::Buy(id)),
            "buy" => Err(RouteError::MethodNotAllowed("POST")),
            "challenge" => get(method, Route::Challenge(id)),
            _ => Err(RouteError::NotFound),
        };
    }
    if let Some(rid) = path.strip_prefix("/api/reservations/") {
        if sale_of_reservation(rid).is_none() {
            return Err(RouteError::BadId);
        }
        return get(method, Route::Reservation(rid));
    }
    if let Some(id) = path.strip_prefix("/sales/") {
        let id = id.strip_suffix('/').unwrap_or(id);
        if !valid_sale_id(id) {
            return Err(RouteError::NotFound);
        }
        return get(method, Route::SalePage(id));
    }
    if let Some(asset) = path.strip_prefix("/static/") {
        return get(method, Route::Asset(asset));
    }
    Err(RouteError::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        Routes::new("/flashgate", None)
    }

    fn classify<'a>(method: &Method, path: &'a str) -> Result<Route<'a>, RouteError> {
        routes().classify(method, path)
    }

    #[test]
    fn sale_api_paths_route_by_method() {
        assert_eq!(
            classify(&Method::GET, "/flashgate/api/sales"),
            Ok(Route::ListSales)
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/api/sales/s1"),
            Ok(Route::SaleState("s1"))
        );
        assert_eq!(
            classify(&Method::POST, "/flashgate/api/sales/s1/buy"),
            Ok(Route::Buy("s1"))
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/api/sales/s1/buy"),
            Err(RouteError::MethodNotAllowed("POST"))
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/api/sales/s1/challenge"),
            Ok(Route::Challenge("s1"))
        );
        assert_eq!(
            classify(&Method::POST, "/flashgate/api/sales/s1/challenge"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(
            classify(&Method::DELETE, "/flashgate/api/sales/s1"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/api/sales/s1/nope"),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn absurd_ids_are_bad_requests() {
        let long = format!("/flashgate/api/sales/{}/buy", "x".repeat(300));
        assert_eq!(classify(&Method::POST, &long), Err(RouteError::BadId));
        assert_eq!(
            classify(&Method::POST, "/flashgate/api/sales/a%20b/buy"),
            Err(RouteError::BadId)
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/api/reservations/garbage"),
            Err(RouteError::BadId)
        );
    }

    #[test]
    fn pages_and_assets_live_under_the_prefix_and_unknown_paths_there_are_ours() {
        assert_eq!(
            classify(&Method::GET, "/flashgate/sales/demo"),
            Ok(Route::SalePage("demo"))
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/static/sale.js"),
            Ok(Route::Asset("sale.js"))
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate"),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            classify(&Method::GET, "/flashgate/admin"),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn everything_else_goes_to_the_shop_including_its_static_and_api() {
        for path in [
            "/",
            "/static/css/styles.css",
            "/api/sales/s1",
            "/api/products/1",
            "/sales/demo",
            "/flashgates",
            "/flashgate-old/x",
        ] {
            assert_eq!(classify(&Method::GET, path), Ok(Route::Shop), "{path}");
        }
        assert_eq!(classify(&Method::POST, "/cart/add"), Ok(Route::Shop));
    }

    #[test]
    fn a_sale_page_mount_serves_the_page_for_one_segment_only() {
        let routes = Routes::new("/fg", Some("/drops/{id}"));
        assert_eq!(
            routes.classify(&Method::GET, "/drops/summer"),
            Ok(Route::SalePage("summer"))
        );
        assert_eq!(
            routes.classify(&Method::GET, "/drops/summer/"),
            Ok(Route::SalePage("summer"))
        );
        assert_eq!(
            routes.classify(&Method::POST, "/drops/summer"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(routes.classify(&Method::GET, "/drops/a/b"), Ok(Route::Shop));
        assert_eq!(routes.classify(&Method::GET, "/drops"), Ok(Route::Shop));
        assert_eq!(
            routes.classify(&Method::GET, "/fg/sales/summer"),
            Ok(Route::SalePage("summer"))
        );
        assert_eq!(
            routes.classify(&Method::GET, "/flashgate/sales/summer"),
            Ok(Route::Shop)
        );
        assert_eq!(
            routes.own_paths("summer"),
            [
                "/fg/api/sales",
                "/fg/api/sales/summer",
                "/fg/sales/summer",
                "/fg/static/sale.js",
                "/drops/summer"
            ]
        );
    }
}
