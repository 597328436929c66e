//! Who may ask, checked before a request costs anything: deny lists, token
//! buckets (local, and the optional cluster-wide one in Redis), the
//! buyer's token (bearer or sign-in cookie, HS256 or against a JWKS), the
//! CSRF check of a buy signed in by cookie, the client address, the
//! proof-of-work challenge, and the live reload of limits and deny lists.
//! It exports [`Admission`] (with its hot-reloadable [`Edge`]), the
//! [`ChallengeGate`], the tokens ([`Verifier`], [`Jwks`], [`mint`]) and the
//! reload tasks.

mod auth;
mod challenge;
mod client_ip;
mod cluster_limit;
mod csrf;
mod gate;
mod limits;
mod reload;

pub use auth::{
    mint, valid_user_id, AuthError, Identity, Jwks, JwksError, JwksRefresher, Verifier, Via,
    MAX_MINT_TTL_SECONDS,
};
pub use challenge::{token, BuyChallenge, ChallengeGate, MAX_RESENDS};
pub use csrf::{CsrfCheck, OwnOrigin, CSRF_HEADER};
pub use gate::{Admission, Edge};
pub use limits::{Limited, Limiters, RouteClass, Scope};
pub use reload::{ConfigWatcher, Hangup, ReloadRequests};
