//! The buy rules, without Pingora: [`BuyService`] decides a
//! `POST /api/sales/{id}/buy` from plain inputs and returns a
//! [`BuyOutcome`]; the proxy only reads the request and writes the reply.
//!
//! ```text
//! admit   sold out and no Idempotency-Key? ─► 410, before any other work
//!         admission: IP deny/bucket, token, user deny list
//!         Idempotency-Key checked
//!         sold out and the user never won it (winners already read)?
//!           ─► 410 (no key of the user's can be owed another answer)
//!         admission: user bucket, global bucket
//!         proof of work (when configured and
//!         the sale is not flagged sold out; one SET NX)
//!         cluster bucket (Redis, when configured)
//!   (the proxy reads the body here)
//! buy     local decision from the sale cache: sold-out flag, switches,
//!         window (not started, ended, paused), unknown sale
//!           ├─ open ─────► deduct script (one EVALSHA, shared with the
//!           │              sale's concurrent buys: `deduct_batch`); in a sale's draw
//!           │              window it enters the draw instead and the buy
//!           │              is held until the draw decides it (`draw`;
//!           │              a sold out it decides is flagged as below)
//!           │              ─► a win is queued
//!           │              for the forwarder (and, with redis.wait_replicas,
//!           │              answered once a shared WAIT says replicas have
//!           │              it); a fresh sold out is flagged and announced
//!           │              to every gateway
//!           └─ refused ──► only a keyed retry that may have won reads its
//!                          remembered outcome (one round trip), else refused
//! ```

#[cfg(test)]
mod draw_tests;
mod outcome;
mod refill;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use flashgate_common::keys::home_id;
use flashgate_common::keys::SaleEvent;
use flashgate_common::reservation::{reservation_id, ForwardedWinner, Reservation};
use http::HeaderMap;
use tracing::{debug, warn};

pub use outcome::{idempotency_key, Admitted, BuyOutcome, BuyRequest, MAX_IDEMPOTENCY_KEY_LEN};

use crate::admission::Admission;
use crate::challenge::token::POW_HEADER;
use crate::challenge::{BuyChallenge, ChallengeGate};
use crate::clock::{SystemClock, WallClock};
use crate::deduct::{remembered, BuyAttempt, Decision, DeductOutcome};
use crate::deduct_batch::DeductBatcher;
use crate::draw::{Draws, Entrant, NotSettled};
use crate::forwarder::Forwarder;
use crate::limits::RouteClass;
use crate::metrics::Metrics;
use crate::order_cache::OrderLookups;
use crate::orders::OrderClient;
use crate::redis_client::{RedisClient, RedisError};
use crate::rejection::{unavailable, Rejection};
use crate::replica_wait::{NotConfirmed, ReplicaWait};
use crate::sales::{MissingSale, SaleCache, WindowCheck};
use crate::switches::Switches;

/// Everything a buy is decided with; one per gateway.
pub struct BuyService<C: WallClock = SystemClock> {
    pub admission: Arc<Admission>,
    /// The proof of work a buy must carry, when configured.
    pub challenge: Arc<ChallengeGate>,
    pub redis: Arc<RedisClient>,
    /// Every deduct of the buy path (live buys, bucketed refills, draw
    /// entries) goes through it: the concurrent ones of a sale share one
    /// script call.
    pub deducts: Arc<DeductBatcher>,
    /// Windows and sold-out flags, shared with the sale routes and the
    /// events listener.
    pub sales: Arc<SaleCache>,
    /// Global switch and backlog pauses, kept current by a watcher.
    pub switches: Arc<Switches>,
    /// Asked whether a sale missing from Redis exists.
    pub orders: Arc<OrderClient>,
    /// Orders of replayed wins, cached briefly.
    pub order_lookups: Arc<OrderLookups>,
    /// Queues winners for the backend, off the request path.
    pub forwarder: Forwarder,
    /// Holds wins until `redis.wait_replicas` replicas have them; `None`
    /// when that is 0.
    pub replica_wait: Option<Arc<ReplicaWait>>,
    /// The opening draws (`[fairness]`).
    pub draws: Arc<Draws>,
    pub metrics: Arc<Metrics>,
    /// How long the script remembers an Idempotency-Key.
    pub idempotency_ttl: Duration,
    /// Compared with sale windows.
    pub clock: C,
}

impl<C: WallClock> BuyService<C> {
    /// Everything before the request body is read, cheapest first.
    ///
    /// # Errors
    /// The rejection to answer with.
    pub async fn admit(&self, sale_id: &str, peer: IpAddr, headers: &HeaderMap) -> Result<Admitted, Rejection> {
        let key = headers.get("idempotency-key");
        // A sold-out sale is the commonest answer of a flash sale; without an
        // Idempotency-Key there is nothing to replay, and "sold out" says
        // nothing about the caller, so it is answered before any other work.
        if key.is_none() && self.sales.is_sold_out(sale_id) {
            self.metrics.local_sold_out.inc();
            return Err(Rejection::SoldOut);
        }
        let user = self.admission.identify(RouteClass::Buy, peer, headers)?;
        let idempotency_key = idempotency_key(key.map(|v| v.as_bytes()))?.to_owned();
        // Keyed, but by a user who never won this sold-out sale: no key of
        // theirs can be owed another answer, so neither their bucket, nor
        // the global one, nor the body is spent on them (`decide` answers
        // the same from the same flag, and reads the winners this needs).
        if self.sales.surely_never_won(sale_id, &user).await {
            self.metrics.local_sold_out.inc();
            return Err(Rejection::SoldOut);
        }
        self.admission.limit_user(RouteClass::Buy, &user)?;
        let unchallenged = self.check_challenge(sale_id, &user, &idempotency_key, peer, headers).await?;
        self.admission.cluster(&self.redis, &self.metrics).await?;
        Ok(Admitted { user, idempotency_key, unchallenged })
    }

    /// The proof of work, when `[challenge]` asks for one: after the token
    /// (the challenge is bound to the user), before anything that costs
    /// Redis but its one `SET NX`. A sale flagged sold out asks none: the
    /// buy cannot win, and its answer must cost no Redis call; answers
    /// `true` then (the proof was due but not asked).
    async fn check_challenge(&self, sale_id: &str, user: &str, key: &str, peer: IpAddr, headers: &HeaderMap) -> Result<bool, Rejection> {
        if !self.challenge.is_on() {
            return Ok(false);
        }
        if self.sales.is_sold_out(sale_id) {
            return Ok(true);
        }
        let buy = BuyChallenge {
            sale_id,
            user,
            ip: self.admission.client_ip(peer, headers),
            idempotency_key: key,
            solution: headers.get(POW_HEADER).map(|v| v.as_bytes()),
        };
        // Boxed: its Redis calls nested in `admit`'s future exceed the
        // compiler's layout depth, and only buys under a challenge pay it.
        Box::pin(self.challenge.admit(&self.redis, buy, self.clock.now_ms())).await.map(|()| false)
    }

    /// Decides an admitted buy: locally when the sale cache can, else with
    /// one script call.
    pub async fn buy(&self, req: BuyRequest<'_>) -> BuyOutcome {
        self.decide(req).await.unwrap_or_else(BuyOutcome::Refused)
    }

    async fn decide(&self, req: BuyRequest<'_>) -> Result<BuyOutcome, Rejection> {
        let BuyRequest { sale_id, user, idempotency_key, request_id, unchallenged } = req;
        let local = match self.local_rejection(sale_id).await? {
            // No proof of work was asked: sold out is all it may learn.
            None if unchallenged => Some(Rejection::SoldOut),
            local => local,
        };
        // Taken before the script runs: a snapshot read after this may
        // already count this buy's win (see `SaleCache::took_one`).
        let sent_at = std::time::Instant::now();
        let local = match local {
            Some(rejection) if idempotency_key.is_empty() => return Err(rejection),
            local => local,
        };
        // Known without Redis once the sale was read (see `SaleCache::buckets`).
        let buckets = self.sales.buckets(&self.redis, sale_id).await;
        let decision = match local {
            None => self.deduct_or_draw(sale_id, buckets, user, idempotency_key).await?,
            // Turned away locally; only a retry of a remembered key still
            // deserves its first outcome, so only that asks Redis: one
            // round trip, whoever holds the sale's items now. A win whose
            // order was cancelled (its item returned and sold again) is no
            // longer among the buyers, yet its key must still answer
            // `order_cancelled`, not `sold_out`. In a sold-out sale only a
            // user who ever won can have such a key; anyone else's retry is
            // answered here.
            Some(Rejection::SoldOut) if !self.sales.ever_won(&self.redis, sale_id, buckets, user).await => return Err(Rejection::SoldOut),
            Some(rejection) => {
                match remembered(&self.redis, sale_id, buckets, user, idempotency_key).await.map_err(|e| self.unavailable(&e))? {
                    Some(decision) => decision,
                    // An ever-won user's key Redis does not remember may name a
                    // draw entry still undecided when the draw's sold out
                    // flagged the sale: only a past winner's entry can then be
                    // decided other than `sold_out` (`limit_reached`), so the
                    // deduct answers it (joining the entry, or its own answer:
                    // it enforces the limit atomically). Without the proof of
                    // work (not asked of a flagged sale) it may not reach the
                    // deduct: the flag answers, as before.
                    None if unchallenged || !matches!(rejection, Rejection::SoldOut) => return Err(rejection),
                    None => self.deduct_or_draw(sale_id, buckets, user, idempotency_key).await?,
                }
            }
        };
        debug!(sale = sale_id, user, outcome = ?decision.outcome, replayed = decision.replayed, "deduct");
        match decision.outcome {
            // A win just now: forwarded with the script's time, the same
            // `ts` as the stream record, whichever path writes the order.
            DeductOutcome::Won { reservation_id, reserved_at_ms: Some(reserved_at_ms) } => {
                self.sales.took_one(sale_id, sent_at).await;
                let winner = ForwardedWinner {
                    reservation: Reservation {
                        reservation_id: reservation_id.clone(),
                        sale_id: sale_id.to_owned(),
                        user_id: user.to_owned(),
                        idempotency_key: idempotency_key.to_owned(),
                        reserved_at_ms,
                    },
                    request_id: request_id.to_owned(),
                };
                // The reservation is already durable in the stream: a full
                // queue leaves the order to the stream consumer.
                if !self.forwarder.forward(winner) {
                    self.metrics.forward_failures.with_label_values(&["queue_full"]).inc();
                }
                // The reservation stands either way (it is in the master and
                // forwarded); only the answer waits for the replicas.
                self.replicated(&home_id(sale_id, buckets, user), decision.node.as_deref()).await?;
                Ok(BuyOutcome::Won { reservation_id })
            }
            // A winner retrying with their key: the order's own state once
            // it exists. Nothing is forwarded again: the win's own forward
            // or, failing that, the stream writes the order.
            DeductOutcome::Won { reservation_id, reserved_at_ms: None } => {
                self.replicated(&home_id(sale_id, buckets, user), decision.node.as_deref()).await?;
                let order = self.order_lookups.order(&reservation_id).await;
                Ok(BuyOutcome::Replayed { reservation_id, order })
            }
            DeductOutcome::SoldOut => Err(Rejection::SoldOut),
            DeductOutcome::LimitReached => Err(Rejection::LimitReached),
            DeductOutcome::Ended => Err(Rejection::Ended),
            DeductOutcome::NotStarted { starts_at_ms } => {
                let wait_ms = (starts_at_ms - self.clock.now_ms()).max(0) as u64;
                Err(Rejection::NotStarted(wait_ms.div_ceil(1000)))
            }
            DeductOutcome::Paused => Err(Rejection::Paused),
            DeductOutcome::NotFound => Err(self.missing(sale_id).await),
            // Not remembered under the key and not cached: the sale sells
            // again as soon as the backend has re-synced it.
            DeductOutcome::Fenced => {
                self.metrics.fenced_buys.inc();
                Err(Rejection::Unavailable)
            }
            // `deduct_or_draw` answers neither.
            DeductOutcome::Entered { .. } | DeductOutcome::DrawPending => Err(Rejection::Unavailable),
        }
    }

    /// The deduct, through the sale's opening draw when there is one: an
    /// entrant is held until the draw decides it; a buy after the window
    /// that finds the draw undecided runs it, then buys (twice at most: a
    /// draw stays decided).
    async fn deduct_or_draw(&self, sale_id: &str, buckets: u32, user: &str, idempotency_key: &str) -> Result<Decision, Rejection> {
        if buckets > 1 {
            // No draw for a bucketed sale (validation refuses one).
            let rid = reservation_id(sale_id, rand::random());
            return self.deduct_in_buckets(sale_id, buckets, user, idempotency_key, &rid).await;
        }
        for _ in 0..2 {
            let rid = reservation_id(sale_id, rand::random());
            // Before the entry exists: its sold out, decided later and read
            // later still, flags the sale only if stock did not come back
            // (a restock, a returned item) in between.
            let clears = self.sales.clears(sale_id);
            let decision = self.deduct(sale_id, 1, user, idempotency_key, &rid).await?;
            match decision.outcome {
                DeductOutcome::Entered { entry, closes_in_ms } => {
                    if !decision.replayed {
                        self.draws.metrics.entrants.inc();
                    }
                    let entrant = Entrant { user, rid: (!decision.replayed).then_some(rid.as_str()) };
                    let held =
                        self.draws.outcome(&self.redis, sale_id, entry, Duration::from_millis(closes_in_ms), decision.replayed, entrant);
                    let decided = Box::pin(held).await.map_err(|e| self.not_settled(&e))?;
                    self.draw_found_sold_out(sale_id, &decided, clears).await;
                    return Ok(decided);
                }
                DeductOutcome::DrawPending => Box::pin(self.draws.settle(&self.redis, sale_id)).await.map_err(|e| self.not_settled(&e))?,
                _ => return Ok(decision),
            }
        }
        Err(Rejection::Unavailable)
    }

    /// A held entrant's outcome: a fresh sold out (a joined entry's
    /// replayed one tells nothing new) flags the sale as a deduct's does,
    /// unless the sale was cleared since the entrant entered (`clears`
    /// taken then). The draw decided it up to `fairness.settle_ms` before
    /// it was read, and an operator's restock or a returned item clears
    /// the flag meanwhile: flagging it again would turn every gateway's
    /// buyers away while Redis has stock.
    async fn draw_found_sold_out(&self, sale_id: &str, decided: &Decision, clears: u64) {
        if !decided.found_sold_out() {
            return;
        }
        if self.sales.clears(sale_id) != clears {
            debug!(sale = sale_id, "draw sold out decided before the sale was cleared; not flagged");
            return;
        }
        self.flag_sold_out(sale_id).await;
    }

    fn not_settled(&self, error: &NotSettled) -> Rejection {
        match error {
            NotSettled::Redis(e) => self.unavailable(e),
            other => {
                debug!(%other, "draw not settled");
                Rejection::Unavailable
            }
        }
    }

    /// A decision this gateway can make without Redis: sold out (flagged),
    /// unknown sale, paused, not started, ended (from the cached window).
    async fn local_rejection(&self, sale_id: &str) -> Result<Option<Rejection>, Rejection> {
        if self.sales.is_sold_out(sale_id) {
            self.metrics.local_sold_out.inc();
            return Ok(Some(Rejection::SoldOut));
        }
        if self.switches.all_paused() || self.switches.backlog_paused(sale_id) {
            self.metrics.local_decisions.with_label_values(&["paused"]).inc();
            return Ok(Some(Rejection::Paused));
        }
        let window = self.sales.window(&self.redis, sale_id).await.map_err(|e| self.unavailable(&e))?;
        let rejection = match window.map(|w| w.check(self.clock.now_ms())) {
            None => Some(self.missing(sale_id).await),
            Some(WindowCheck::Open) => None,
            Some(WindowCheck::Ended) => Some(Rejection::Ended),
            Some(WindowCheck::Paused) => Some(Rejection::Paused),
            Some(WindowCheck::NotStarted { wait_secs }) => Some(Rejection::NotStarted(wait_secs)),
        };
        if let Some(r) = &rejection {
            self.metrics.local_decisions.with_label_values(&[r.code()]).inc();
        }
        Ok(rejection)
    }

    /// The answer to a buy for a sale Redis does not have: `unavailable`
    /// while the backend's database knows it (it is being restored) or
    /// cannot be asked, `not_found` only when the backend says it does not
    /// exist.
    async fn missing(&self, sale_id: &str) -> Rejection {
        match self.sales.missing(&self.orders, sale_id).await {
            MissingSale::Restoring | MissingSale::NoAnswer => Rejection::Unavailable,
            MissingSale::Unknown => Rejection::NotFound("no such sale"),
        }
    }

    /// Runs the deduct script (batched with the sale's concurrent deducts);
    /// a sold-out answer found just now is flagged
    /// here and announced to every other gateway. A replayed one is not:
    /// it tells what an earlier attempt got, not whether stock is left.
    async fn deduct(&self, sale_id: &str, buckets: u32, user: &str, idempotency_key: &str, rid: &str) -> Result<Decision, Rejection> {
        let nonce = format!("{:016x}", rand::random::<u64>());
        let attempt = BuyAttempt {
            sale_id,
            user_id: user,
            idempotency_key,
            reservation_id: rid,
            call_nonce: &nonce,
            idempotency_ttl_seconds: self.idempotency_ttl.as_secs(),
            draw_window_ms: self.draws.window_ms,
            buckets,
        };
        let timer = self.metrics.script_duration.start_timer();
        let decision = self.deducts.deduct(&attempt).await.map_err(|e| self.unavailable(&e))?;
        timer.observe_duration();
        if buckets > 1 {
            // Flagged per bucket by the caller (`refill`).
            return Ok(decision);
        }
        if decision.found_sold_out() {
            self.flag_sold_out(sale_id).await;
        }
        Ok(decision)
    }

    /// A sale found out of stock just now (by a deduct or by the draw):
    /// flagged here, so later buys are answered without Redis, and
    /// announced once to every other gateway.
    async fn flag_sold_out(&self, sale_id: &str) {
        if self.sales.is_sold_out(sale_id) {
            return;
        }
        self.sales.found_sold_out(sale_id).await;
        if let Ok(mut conn) = self.redis.conn().await {
            if let Err(error) = crate::events::publish(&mut conn, &SaleEvent::SoldOut(sale_id.to_owned())).await {
                warn!(%error, sale = sale_id, "could not announce sold out");
            }
        }
    }

    /// With `redis.wait_replicas` set: returns once that many replicas hold
    /// every write of the Redis of replication id `node` up to now (the win
    /// it answered among them), sharing one round with the other winners
    /// of the moment.
    async fn replicated(&self, sale_id: &str, node: Option<&str>) -> Result<(), Rejection> {
        let Some(waits) = &self.replica_wait else { return Ok(()) };
        waits.confirm(sale_id, node).await.map_err(|e| match e {
            NotConfirmed::TooFewReplicas => Rejection::NotReplicated,
            NotConfirmed::Redis(e) => self.unavailable(&e),
        })
    }

    fn unavailable(&self, error: &RedisError) -> Rejection {
        unavailable(&self.metrics, error)
    }
}
