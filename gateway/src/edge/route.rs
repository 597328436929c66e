//! Which handler a request belongs to, decided from method and path alone.
//!
//! The gateway owns `/api/sales…`, `/api/reservations/…`, the sale pages
//! `/sales/{id}` and the assets under `/static/`. Everything else belongs to
//! the shop and is proxied.

use flashgate_common::reservation::sale_of_reservation;
use flashgate_common::sale::valid_sale_id;
use http::Method;

use crate::infra::RouteKind;
use crate::rejection::Rejection;

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

/// Classifies a request. `path` excludes the query string.
pub fn classify<'a>(method: &Method, path: &'a str) -> Result<Route<'a>, RouteError> {
    let get = |route: Route<'a>| {
        if method == Method::GET || method == Method::HEAD {
            Ok(route)
        } else {
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        }
    };
    if path == "/api/sales" || path == "/api/sales/" {
        return get(Route::ListSales);
    }
    if let Some(rest) = path.strip_prefix("/api/sales/") {
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        if !valid_sale_id(id) {
            return Err(RouteError::BadId);
        }
        return match tail {
            "" => get(Route::SaleState(id)),
            "buy" if method == Method::POST => Ok(Route::Buy(id)),
            "buy" => Err(RouteError::MethodNotAllowed("POST")),
            "challenge" => get(Route::Challenge(id)),
            _ => Err(RouteError::NotFound),
        };
    }
    if let Some(rid) = path.strip_prefix("/api/reservations/") {
        if sale_of_reservation(rid).is_none() {
            return Err(RouteError::BadId);
        }
        return get(Route::Reservation(rid));
    }
    if let Some(id) = path.strip_prefix("/sales/") {
        let id = id.strip_suffix('/').unwrap_or(id);
        if !valid_sale_id(id) {
            return Err(RouteError::NotFound);
        }
        return get(Route::SalePage(id));
    }
    if let Some(asset) = path.strip_prefix("/static/") {
        return get(Route::Asset(asset));
    }
    Ok(Route::Shop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sale_api_paths_route_by_method() {
        assert_eq!(classify(&Method::GET, "/api/sales"), Ok(Route::ListSales));
        assert_eq!(
            classify(&Method::GET, "/api/sales/s1"),
            Ok(Route::SaleState("s1"))
        );
        assert_eq!(
            classify(&Method::POST, "/api/sales/s1/buy"),
            Ok(Route::Buy("s1"))
        );
        assert_eq!(
            classify(&Method::GET, "/api/sales/s1/buy"),
            Err(RouteError::MethodNotAllowed("POST"))
        );
        assert_eq!(
            classify(&Method::GET, "/api/sales/s1/challenge"),
            Ok(Route::Challenge("s1"))
        );
        assert_eq!(
            classify(&Method::POST, "/api/sales/s1/challenge"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(
            classify(&Method::DELETE, "/api/sales/s1"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(
            classify(&Method::GET, "/api/sales/s1/nope"),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn absurd_ids_are_bad_requests() {
        let long = format!("/api/sales/{}/buy", "x".repeat(300));
        assert_eq!(classify(&Method::POST, &long), Err(RouteError::BadId));
        assert_eq!(
            classify(&Method::POST, "/api/sales/a%20b/buy"),
            Err(RouteError::BadId)
        );
        assert_eq!(
            classify(&Method::GET, "/api/reservations/garbage"),
            Err(RouteError::BadId)
        );
    }

    #[test]
    fn everything_else_goes_to_the_shop() {
        assert_eq!(classify(&Method::GET, "/"), Ok(Route::Shop));
        assert_eq!(classify(&Method::POST, "/cart/add"), Ok(Route::Shop));
        assert_eq!(classify(&Method::GET, "/api/products/1"), Ok(Route::Shop));
    }
}
