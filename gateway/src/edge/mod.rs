//! The edge: everything that speaks HTTP or knows Pingora. The proxy's
//! phases, routing, replies, the shop's upstreams and cache, the static
//! pages, TLS and the admin listener; the layers below answer in values.

pub mod admin;
pub mod proxy;
pub mod reply;
pub mod route;
pub mod shop_cache;
pub mod static_pages;
pub mod tls;
pub mod upstreams;
