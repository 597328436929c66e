//! The edge: everything that speaks HTTP or knows Pingora. The proxy's
//! phases ([`Gateway`]), routing, replies, the shop's upstreams and cache,
//! the static pages, TLS and the admin listener; the layers below answer
//! in values, which only the edge turns into responses.

mod admin;
mod admin_api;
mod proxy;
mod reply;
mod route;
mod shadowed;
mod shop_cache;
mod static_pages;
mod tls;
mod upstreams;
mod waiting_room;

pub use admin::AdminServer;
pub use proxy::Gateway;
pub use route::{Route, RouteError, Routes};
pub use shadowed::{probe_shop, Probe, ShopTarget};
pub use shop_cache::{PurgeApi, ShopCache};
pub use static_pages::{PagesWatcher, StaticPages};
pub use tls::{listener_settings, CertSet, CertWatcher, CoalescedApp};
pub use upstreams::Upstreams;
pub use waiting_room::{admin::RoomsApi, tick::RoomTicker, WaitingRooms};
