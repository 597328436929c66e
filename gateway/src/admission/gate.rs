//! Who may ask at all: deny lists, token buckets and the buyer's token,
//! checked before any Redis call, cheapest first.
//!
//! The limits and deny lists are the hot-reloadable [`Edge`], swapped whole
//! by the config watcher (`reload`). [`Admission`] reads one edge per
//! request and answers with a verified user id or a [`Rejection`]; it never
//! sees a Pingora session, only the peer address and the request headers.
//! A buy signed in by cookie must also pass [`Admission::csrf`].

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use flashgate_common::config::{ClientIpHeader, Config, DenyConfig, LimitsConfig};
use http::HeaderMap;

use crate::admission::auth::{Identity, Verifier, Via};
use crate::admission::client_ip::client_ip;
use crate::admission::cluster_limit::ClusterLimit;
use crate::admission::csrf::{CsrfCheck, OwnOrigin};
use crate::admission::limits::{Limiters, RouteClass};
use crate::infra::Metrics;
use crate::infra::RedisClient;
use crate::rejection::{unavailable, Rejection};

/// The hot-reloadable part of the gateway: limiters and deny lists.
pub struct Edge {
    pub limits: LimitsConfig,
    pub limiters: Arc<Limiters>,
    pub deny: DenyConfig,
    /// The cluster-wide bucket in Redis, when configured.
    pub cluster: Option<Arc<ClusterLimit>>,
}

impl Edge {
    pub fn new(config: &Config) -> Self {
        Self::with_limiters(config, Arc::new(Limiters::new(&config.limits)))
    }

    /// An edge for `config` that keeps existing (still matching) buckets.
    pub fn with_limiters(config: &Config, limiters: Arc<Limiters>) -> Self {
        Self {
            limits: config.limits.clone(),
            limiters,
            deny: config.deny.clone(),
            cluster: config
                .limits
                .cluster_global
                .map(|b| Arc::new(ClusterLimit::new(b))),
        }
    }

    /// The client address used for limits and deny lists.
    fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        client_ip(
            peer,
            headers,
            &self.limits.trusted_proxies,
            self.limits.client_ip_header,
        )
    }

    /// Whether the `X-Forwarded-For` that came with a request from `peer`
    /// is a chain the gateway believes: the peer is a trusted proxy and
    /// that header is the one it names the client in.
    fn forwarded_chain_trusted(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.limits.client_ip_header == ClientIpHeader::XForwardedFor
            && self
                .limits
                .trusted_proxies
                .iter()
                .any(|n| n.contains(&peer))
    }
}

/// The admission checks of every gateway route that needs them.
pub struct Admission {
    /// Shared with the watcher that reloads changed files.
    pub edge: Arc<ArcSwap<Edge>>,
    pub verifier: Verifier,
    /// Where a buy signed in by cookie must come from.
    pub csrf: CsrfCheck,
}

impl Admission {
    /// Deny list and per-IP and global buckets of sale-state reads.
    ///
    /// # Errors
    /// `Denied` or `RateLimited`.
    pub fn read(&self, peer: IpAddr, headers: &HeaderMap) -> Result<(), Rejection> {
        let edge = self.edge.load();
        let ip = edge.client_ip(peer, headers);
        if edge.deny.denies_ip(ip) {
            return Err(Rejection::Denied);
        }
        edge.limiters
            .check_ip(RouteClass::Read, ip)
            .map_err(Rejection::RateLimited)?;
        edge.limiters
            .check_user_then_global(RouteClass::Read, None)
            .map_err(Rejection::RateLimited)
    }

    /// Everything a signed-in user's request (a reservation lookup, a
    /// challenge) must pass before Redis, cheapest first: the IP's deny list
    /// and bucket, the token, the user's deny list and bucket, the global
    /// bucket, those of `class`. Returns the verified user id.
    ///
    /// # Errors
    /// `Denied`, `RateLimited` or `Unauthorized`.
    pub async fn user(
        &self,
        class: RouteClass,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<String, Rejection> {
        let identity = self.identify(class, peer, headers).await?;
        self.limit_user(class, &identity.user)?;
        Ok(identity.user)
    }

    /// The first half of [`Admission::user`]: the IP's deny list and
    /// bucket, the token and the user's deny list. A buy runs its two
    /// halves apart, [`Admission::check_ip`] before its body is read and
    /// [`Admission::verified`] after, and answers the verified user locally
    /// where it can (a sold-out sale) before [`Admission::limit_user`]
    /// spends a bucket on it.
    ///
    /// Answers at once, without waiting, unless the token names a JWKS
    /// `kid` not seen yet (then the set is fetched again, see
    /// `auth::jwks`).
    ///
    /// # Errors
    /// `Denied`, `RateLimited` or `Unauthorized`.
    pub async fn identify(
        &self,
        class: RouteClass,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<Identity, Rejection> {
        self.check_ip(class, peer, headers)?;
        self.verified(headers).await
    }

    /// The first half of [`Admission::identify`]: the IP's deny list and
    /// its bucket of `class`.
    ///
    /// # Errors
    /// `Denied` or `RateLimited`.
    pub fn check_ip(
        &self,
        class: RouteClass,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<(), Rejection> {
        let edge = self.edge.load();
        let ip = edge.client_ip(peer, headers);
        if edge.deny.denies_ip(ip) {
            return Err(Rejection::Denied);
        }
        edge.limiters
            .check_ip(class, ip)
            .map_err(Rejection::RateLimited)
    }

    /// The second half of [`Admission::identify`]: the token, then the
    /// user's deny list.
    ///
    /// # Errors
    /// `Unauthorized` or `Denied`.
    pub async fn verified(&self, headers: &HeaderMap) -> Result<Identity, Rejection> {
        let identity = self
            .verifier
            .identify(headers)
            .await
            .map_err(Rejection::Unauthorized)?;
        if self.edge.load().deny.users.contains(&identity.user) {
            return Err(Rejection::Denied);
        }
        Ok(identity)
    }

    /// The CSRF check of a state-changing request (a buy): a token from
    /// the sign-in cookie must come with proof of a same-origin request
    /// (`admission::csrf`); a bearer token needs none.
    ///
    /// # Errors
    /// `CsrfRejected`.
    pub fn csrf(
        &self,
        identity: &Identity,
        headers: &HeaderMap,
        own_origin: OwnOrigin<'_>,
    ) -> Result<(), Rejection> {
        match identity.via {
            Via::Bearer => Ok(()),
            Via::Cookie if self.csrf.passes(headers, own_origin) => Ok(()),
            Via::Cookie => Err(Rejection::CsrfRejected),
        }
    }

    /// The second half of [`Admission::user`]: the verified user's bucket,
    /// then the global one.
    ///
    /// # Errors
    /// `RateLimited`.
    pub fn limit_user(&self, class: RouteClass, user: &str) -> Result<(), Rejection> {
        self.edge
            .load()
            .limiters
            .check_user_then_global(class, Some(user))
            .map_err(Rejection::RateLimited)
    }

    /// The client address the limits and deny lists see (the peer, or a
    /// trusted proxy's header).
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        self.edge.load().client_ip(peer, headers)
    }

    /// The client address, and whether the request's `X-Forwarded-For` is
    /// a chain to extend (see `edge::proxy::forwarded`).
    pub fn forwarding(&self, peer: IpAddr, headers: &HeaderMap) -> (IpAddr, bool) {
        let edge = self.edge.load();
        (
            edge.client_ip(peer, headers),
            edge.forwarded_chain_trusted(peer),
        )
    }

    /// The cluster-wide bucket in Redis, when configured: one round trip.
    ///
    /// # Errors
    /// `RateLimited`, or `Unavailable` when Redis cannot be asked.
    pub async fn cluster(&self, redis: &RedisClient, metrics: &Metrics) -> Result<(), Rejection> {
        let cluster = self.edge.load().cluster.clone();
        match cluster {
            Some(limit) => limit
                .check(redis)
                .await
                .map_err(|e| unavailable(metrics, &e))?
                .map_err(Rejection::RateLimited),
            None => Ok(()),
        }
    }
}
