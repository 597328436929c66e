//! [`BuyService`], the buy layer's one interface: built once per gateway
//! from [`BuyDeps`] and a clock ([`BuyService::new`]), it admits a buy
//! ([`BuyService::answer_early`], [`BuyService::admit`],
//! [`BuyService::prove`]), decides it
//! ([`BuyService::buy`], see `decide`) and looks reservations up
//! ([`BuyService::reservation`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use flashgate_common::config::FairnessConfig;
use http::HeaderMap;

use super::checkout::{Checkout, Winner};
use super::deduct::DeductBatcher;
use super::draw::Draws;
use super::forward::{forwarder, ForwardWorker, Forwarder, OrderLookups};
use super::replica_wait::ReplicaWait;
use super::reservations::{lookup, ReservationView};
use super::{idempotency_key, Admitted, BuyOutcome, BuyRequest};
use crate::admission::token::POW_HEADER;
use crate::admission::RouteClass;
use crate::admission::{Admission, OwnOrigin};
use crate::admission::{BuyChallenge, ChallengeGate};
use crate::infra::Metrics;
use crate::infra::OrderClient;
use crate::infra::RedisClient;
use crate::infra::{SystemClock, WallClock};
use crate::rejection::Rejection;
use crate::sales::SaleCache;
use crate::sales::Switches;
use crate::sales::WindowCheck;
use flashgate_common::checkout::Values;

/// A buy's replay key (`Idempotency-Key`), a name parsed once.
const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// What a [`BuyService`] is built from: the parts it shares with the rest
/// of the gateway, and its settings.
pub struct BuyDeps {
    pub admission: Arc<Admission>,
    /// The proof of work a buy must carry, when configured (the edge offers
    /// its challenges).
    pub challenge: Arc<ChallengeGate>,
    pub redis: Arc<RedisClient>,
    /// Windows and sold-out flags, shared with the sale routes and the
    /// events listener.
    pub sales: Arc<SaleCache>,
    /// Global switch and backlog pauses, kept current by a watcher.
    pub switches: Arc<Switches>,
    /// The order backend: winners go to it; it is asked whether a sale
    /// missing from Redis exists, and for the orders of replayed wins.
    pub orders: Arc<OrderClient>,
    pub metrics: Arc<Metrics>,
    /// How long the script remembers an Idempotency-Key
    /// (`gateway.idempotency_ttl_seconds`).
    pub idempotency_ttl: Duration,
    /// The opening draws (`[fairness]`).
    pub fairness: FairnessConfig,
    /// `redis.wait_replicas`: replicas that must hold a win before it is
    /// answered (0: answered at once).
    pub wait_replicas: u32,
    /// `redis.wait_timeout_ms`: how long a win waits for them.
    pub wait_timeout: Duration,
    /// Mints winners' checkout hand-offs (`FLASHGATE_HANDOFF_SECRET`,
    /// `gateway.handoff_ttl_seconds`).
    pub checkout: Checkout,
}

/// Everything a buy is decided with; one per gateway.
pub struct BuyService<C: WallClock = SystemClock> {
    pub(super) admission: Arc<Admission>,
    /// The proof of work a buy must carry, when configured.
    pub(super) challenge: Arc<ChallengeGate>,
    pub(super) redis: Arc<RedisClient>,
    /// Every deduct of the buy path (live buys, bucketed refills, draw
    /// entries) goes through it: the concurrent ones of a sale share one
    /// script call.
    pub(super) deducts: Arc<DeductBatcher>,
    /// Windows and sold-out flags, shared with the sale routes and the
    /// events listener.
    pub(super) sales: Arc<SaleCache>,
    /// Global switch and backlog pauses, kept current by a watcher.
    pub(super) switches: Arc<Switches>,
    /// Asked whether a sale missing from Redis exists.
    pub(super) orders: Arc<OrderClient>,
    /// Orders of replayed wins and reservations, cached briefly.
    pub(super) order_lookups: Arc<OrderLookups>,
    /// Queues winners for the backend, off the request path.
    pub(super) forwarder: Forwarder,
    /// Holds wins until `redis.wait_replicas` replicas have them; `None`
    /// when that is 0.
    pub(super) replica_wait: Option<Arc<ReplicaWait>>,
    /// The opening draws (`[fairness]`).
    pub(super) draws: Arc<Draws>,
    pub(super) metrics: Arc<Metrics>,
    /// How long the script remembers an Idempotency-Key.
    pub(super) idempotency_ttl: Duration,
    /// Winners' checkout URLs and their hand-off tokens.
    pub(super) checkout: Checkout,
    /// Compared with sale windows.
    pub(super) clock: C,
}

impl<C: WallClock> BuyService<C> {
    /// The buy service of one gateway, on `clock`, and the task that
    /// forwards its winners to the backend (run it for the gateway's life;
    /// dropped, winners' orders come from the stream alone).
    pub fn new(deps: BuyDeps, clock: C) -> (Self, ForwardWorker) {
        let BuyDeps {
            admission,
            challenge,
            redis,
            sales,
            switches,
            orders,
            metrics,
            idempotency_ttl,
            fairness,
            wait_replicas,
            wait_timeout,
            checkout,
        } = deps;
        let (forwarder, worker) = forwarder(orders.clone(), metrics.clone());
        let service = Self {
            admission,
            challenge,
            deducts: Arc::new(DeductBatcher::new(
                redis.clone(),
                metrics.deduct_batch_size.clone(),
            )),
            replica_wait: (wait_replicas > 0).then(|| {
                Arc::new(ReplicaWait::new(
                    redis.clone(),
                    metrics.clone(),
                    wait_replicas,
                    wait_timeout,
                ))
            }),
            draws: Arc::new(Draws::new(fairness, idempotency_ttl, &metrics.registry)),
            redis,
            sales,
            switches,
            order_lookups: Arc::new(OrderLookups::new(orders.clone())),
            orders,
            forwarder,
            metrics,
            idempotency_ttl,
            checkout,
            clock,
        };
        (service, worker)
    }

    /// The answers a buy gets before its body is read, all from memory,
    /// cheapest first: a sale flagged sold out answers an unkeyed buy, a
    /// sale held not started an unkeyed buy, or a keyed one while the sale
    /// never sold (both say nothing about the buyer); then the IP's deny
    /// list and bucket. Nothing else is spent, nothing changes in Redis.
    ///
    /// # Errors
    /// The rejection to answer with.
    pub fn answer_early(
        &self,
        sale_id: &str,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<(), Rejection> {
        let keyed = headers.contains_key(&IDEMPOTENCY_KEY);
        // A sold-out sale is the commonest answer of a flash sale; without an
        // Idempotency-Key there is nothing to replay, and "sold out" says
        // nothing about the caller, so it is answered before any other work.
        if !keyed && self.local_sold_out(sale_id) {
            return Err(Rejection::SoldOut);
        }
        // So is "not started" when the sale cache holds the answer.
        if let Some(rejection) = self.held_not_started(sale_id, keyed) {
            return Err(rejection);
        }
        self.admission.check_ip(RouteClass::Buy, peer, headers)
    }

    /// Who asks, once [`BuyService::answer_early`] had no answer and the
    /// body was read and found valid: the token, the user's deny list, the
    /// CSRF check, the Idempotency-Key, and whether this user's answer is
    /// already known (a keyed buy of a sale flagged sold out, by a user
    /// who never reserved an item in it). It spends no bucket of the
    /// user's (see [`BuyService::prove`]) and changes nothing in Redis.
    ///
    /// # Errors
    /// The rejection to answer with.
    /// `own_origin` is the origin the request was sent to, for the CSRF
    /// check of a buy signed in by cookie.
    pub async fn admit(
        &self,
        sale_id: &str,
        headers: &HeaderMap,
        own_origin: OwnOrigin<'_>,
    ) -> Result<Admitted, Rejection> {
        let key = headers.get(&IDEMPOTENCY_KEY);
        let identity = self.admission.verified(headers).await?;
        self.admission.csrf(&identity, headers, own_origin)?;
        let user = identity.user;
        let idempotency_key = idempotency_key(key.map(|v| v.as_bytes()))?.to_owned();
        if self.local_sold_out_for(sale_id, &user, &idempotency_key)
            || self
                .sold_out_before_challenge(sale_id, &user, &idempotency_key)
                .await
        {
            return Err(Rejection::SoldOut);
        }
        Ok(Admitted {
            user,
            idempotency_key,
        })
    }

    /// What a buy spends before its deduct, once it was admitted (its body
    /// read first: a `400` spends no user or global bucket): the user's
    /// and the global bucket, the proof of work, when
    /// `[challenge]` asks for one (bound to the user; one `SET NX`), then
    /// the cluster bucket. A buy before the start is answered first, at no
    /// cost, when it is unkeyed or its sale never sold (the sale's window
    /// is read here when no earlier step read it).
    ///
    /// # Errors
    /// The rejection to answer with.
    pub async fn prove(
        &self,
        sale_id: &str,
        admitted: &Admitted,
        peer: IpAddr,
        headers: &HeaderMap,
    ) -> Result<(), Rejection> {
        if let Some(rejection) = self.not_started(sale_id, &admitted.idempotency_key).await {
            return Err(rejection);
        }
        self.admission.limit_user(RouteClass::Buy, &admitted.user)?;
        if self.challenge.is_on() {
            let buy = BuyChallenge {
                sale_id,
                user: &admitted.user,
                ip: self.admission.client_ip(peer, headers),
                idempotency_key: &admitted.idempotency_key,
                solution: headers.get(POW_HEADER).map(|v| v.as_bytes()),
            };
            // Boxed: its Redis calls nested in the caller's future exceed the
            // compiler's layout depth, and only buys under a challenge pay it.
            Box::pin(self.challenge.admit(&self.redis, buy, self.clock.now_ms())).await?;
        }
        self.admission.cluster(&self.redis, &self.metrics).await
    }

    /// "Not started" when the sale cache holds it (see
    /// [`SaleCache::held_not_started`]) and no switch pauses the sale: like
    /// "sold out" it says nothing about the buyer and costs Redis nothing,
    /// so it is answered before the token is checked or a bucket spent.
    fn held_not_started(&self, sale_id: &str, keyed: bool) -> Option<Rejection> {
        if self.paused(sale_id) {
            return None;
        }
        let wait_secs = self
            .sales
            .held_not_started(sale_id, self.clock.now_ms(), keyed)?;
        self.metrics.local_not_started.inc();
        Some(Rejection::NotStarted(wait_secs))
    }

    /// [`BuyService::held_not_started`] once what it needs is read: the
    /// sale's window and, for a keyed buy before the start of a one-bucket
    /// sale, whether it never sold. Nothing is read for a paused sale, nor
    /// whether a sold-out one never sold (`decide` answers both without
    /// Redis), nor on any doubt.
    async fn not_started(&self, sale_id: &str, idempotency_key: &str) -> Option<Rejection> {
        if self.paused(sale_id) {
            return None;
        }
        let keyed = !idempotency_key.is_empty();
        let window = self.sales.window(&self.redis, sale_id).await.ok()??;
        let not_started = matches!(
            window.check(self.clock.now_ms()),
            WindowCheck::NotStarted { .. }
        );
        if !not_started {
            return None;
        }
        if keyed && window.buckets == 1 && !self.sales.is_sold_out(sale_id) {
            self.sales.never_sold(&self.redis, sale_id).await;
        }
        self.held_not_started(sale_id, keyed)
    }

    /// Whether a switch pauses the sale (all sales, or its backlog).
    pub(super) fn paused(&self, sale_id: &str) -> bool {
        self.switches.all_paused() || self.switches.backlog_paused(sale_id)
    }

    /// Under `[challenge]`, whether a keyed buy of a one-bucket sale
    /// flagged sold out, by a user who never reserved an item, is answered
    /// "sold out" once the sale's buyers are read
    /// ([`SaleCache::read_buyers`]): when the flag came from elsewhere
    /// than this gateway's script (another gateway's announce, a read),
    /// no buyers are held, and without this the buy would be asked for a
    /// proof of work that could only buy the same answer. A buyer's keyed
    /// buy still pays it: the script decides it (it may replay a win).
    async fn sold_out_before_challenge(
        &self,
        sale_id: &str,
        user: &str,
        idempotency_key: &str,
    ) -> bool {
        if idempotency_key.is_empty() || !self.challenge.is_on() || !self.sales.is_sold_out(sale_id)
        {
            return false;
        }
        // Boxed: its Redis reads would grow every request's future.
        Box::pin(async {
            self.sales.buckets(&self.redis, sale_id).await == 1 && {
                self.sales.read_buyers(&self.redis, sale_id).await;
                self.local_sold_out_for(sale_id, user, idempotency_key)
            }
        })
        .await
    }

    /// Whether the sale is flagged sold out here (counted as a local
    /// decision when it is).
    fn local_sold_out(&self, sale_id: &str) -> bool {
        let flagged = self.sales.is_sold_out(sale_id);
        if flagged {
            self.metrics.local_sold_out.inc();
        }
        flagged
    }

    /// Whether `user`'s buy is answered "sold out" here: unkeyed, when the
    /// sale is flagged; keyed, when also `user` is not among its buyers
    /// (`SaleCache::sold_out_for_keyed`).
    fn local_sold_out_for(&self, sale_id: &str, user: &str, idempotency_key: &str) -> bool {
        if idempotency_key.is_empty() {
            return self.local_sold_out(sale_id);
        }
        let answered = self.sales.sold_out_for_keyed(sale_id, user);
        if answered {
            self.metrics.local_sold_out.inc();
        }
        answered
    }

    /// Decides an admitted buy: locally when the sale cache can, else with
    /// one script call.
    pub async fn buy(&self, req: BuyRequest<'_>) -> BuyOutcome {
        match self.decide(req).await {
            Ok(BuyOutcome::Won { reservation_id, .. }) => BuyOutcome::Won {
                checkout_url: self.checkout_url(&req, &reservation_id, "").await,
                reservation_id,
            },
            Ok(BuyOutcome::Replayed {
                reservation_id,
                order,
                ..
            }) => {
                use flashgate_common::reservation::ReservationStatus;
                let checkout_url = match &order {
                    // Nothing to pay for any more.
                    Some(o) if o.status == ReservationStatus::Cancelled => None,
                    Some(o) => self.checkout_url(&req, &reservation_id, &o.order_id).await,
                    None => self.checkout_url(&req, &reservation_id, "").await,
                };
                BuyOutcome::Replayed {
                    reservation_id,
                    order,
                    checkout_url,
                }
            }
            Ok(outcome) => outcome,
            Err(rejection) => BuyOutcome::Refused(rejection),
        }
    }

    /// The sale's checkout URL filled in for this winner, when the sale
    /// has one (from the snapshot the buy just read: no Redis call).
    async fn checkout_url(
        &self,
        req: &BuyRequest<'_>,
        reservation_id: &str,
        order_id: &str,
    ) -> Option<String> {
        let template = self.sales.checkout_url(&self.redis, req.sale_id).await?;
        let winner = Winner {
            values: Values {
                sale_id: req.sale_id,
                reservation_id,
                order_id,
                handoff: "",
            },
            user: req.user,
        };
        self.checkout.url(&template, winner, self.clock.now_ms())
    }

    /// `GET /flashgate/api/reservations/{id}` for `user`: the reservation's order
    /// once written, else queued.
    ///
    /// # Errors
    /// `BadRequest` for an id naming no sale, `NotFound` (someone else's
    /// reservation is reported exactly like a missing one), or
    /// `Unavailable` when Redis cannot be read.
    pub async fn reservation(&self, user: &str, rid: &str) -> Result<ReservationView, Rejection> {
        lookup(
            &self.redis,
            &self.sales,
            &self.order_lookups,
            &self.metrics,
            user,
            rid,
        )
        .await
    }
}
