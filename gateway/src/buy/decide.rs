//! How [`BuyService`] decides a buy, step by step, from admission to the
//! outcome; the proxy only reads the request and writes the reply.
//!
//! ```text
//! answer_early  sold out and no Idempotency-Key? ─► 410, before any other work
//!         not started, as held (unkeyed, or the sale never sold)? ─► 403
//!         admission: IP deny list, IP bucket
//!   (the proxy reads the body here: a bad one is a 400 that spent no
//!   user or global bucket and no Redis state, and checked no signature)
//! admit   token, user deny list, Idempotency-Key checked
//!         sold out, keyed, and the user never reserved an item? ─► 410
//! prove   not started, unkeyed or the sale never sold? ─► 403
//!         admission: user bucket, global bucket
//!         proof of work (when configured; one SET NX)
//!         cluster bucket (Redis, when configured)
//! buy     local decision from the sale cache: switches, sold-out flag,
//!         window (not started, ended, paused), unknown sale
//!           ├─ open, or refused for good (sold out, ended) with an
//!           │  Idempotency-Key of a user who reserved an item or whose
//!           │  sale's buyers are not known here (Redis decides and
//!           │  remembers a key's answer: a winner's retry replays)
//!           │  ─────────► deduct script (one EVALSHA, shared with the
//!           │              sale's concurrent buys: `deduct::batch`); in a sale's draw
//!           │              window it enters the draw instead and the buy
//!           │              is held until the draw decides it (`draw`;
//!           │              a sold out it decides is flagged as below)
//!           │              ─► a win is queued
//!           │              for the forwarder (and, with redis.wait_replicas,
//!           │              answered once a shared WAIT says replicas have
//!           │              it); a fresh sold out is flagged and announced
//!           │              to every gateway, unless stale (its stock epoch)
//!           └─ refused ──► unkeyed: refused; keyed (paused, not started,
//!                          restoring): its remembered outcome if any (one
//!                          round trip), else refused; not started and the
//!                          sale never sold (read once a second): refused
//! ```

use std::time::Duration;

use flashgate_common::keys::home_id;
use flashgate_common::keys::SaleEvent;
use flashgate_common::reservation::{push_hex, reservation_id, ForwardedWinner, Reservation};
use tracing::{debug, warn};

use super::deduct::{remembered, BuyAttempt, Decision, DeductOutcome};
use super::draw::{Entrant, NotSettled};
use super::replica_wait::NotConfirmed;
use super::{BuyOutcome, BuyRequest, BuyService};
use crate::infra::RedisError;
use crate::infra::WallClock;
use crate::rejection::{unavailable, Rejection};
use crate::sales::{Clears, MissingSale, WindowCheck};

impl<C: WallClock> BuyService<C> {
    pub(super) async fn decide(&self, req: BuyRequest<'_>) -> Result<BuyOutcome, Rejection> {
        let BuyRequest {
            sale_id,
            user,
            idempotency_key,
            request_id,
        } = req;
        let local = self.local_rejection(sale_id).await?;
        // Taken before the script runs: a snapshot read after this may
        // already count this buy's win (see `SaleCache::took_one`).
        let sent_at = std::time::Instant::now();
        let local = match local {
            Some(rejection) if idempotency_key.is_empty() => {
                if rejection == Rejection::SoldOut {
                    self.metrics.local_sold_out.inc();
                }
                return Err(rejection);
            }
            // Keyed, by a user who never reserved an item: no win to replay.
            Some(Rejection::SoldOut) if self.sales.sold_out_for_keyed(sale_id, user) => {
                self.metrics.local_sold_out.inc();
                return Err(Rejection::SoldOut);
            }
            local => local,
        };
        // Known without Redis once the sale was read (see `SaleCache::buckets`).
        let buckets = self.sales.buckets(&self.redis, sale_id).await;
        let decision = match local {
            // Open, or refused for good (sold out, ended) with a key: the
            // script decides, and remembers the key's answer. A local flag
            // may be stale (items came back, a "changed" event missed): its
            // 410 must be neither final for a key that never asked Redis nor
            // wrong for a key that won elsewhere.
            None | Some(Rejection::SoldOut | Rejection::Ended) => {
                self.deduct_or_draw(sale_id, buckets, user, idempotency_key)
                    .await?
            }
            // Before the start of a sale that never sold (one bucket): no
            // key of it holds a win to replay.
            Some(rejection @ Rejection::NotStarted(_))
                if buckets == 1 && self.sales.never_sold(&self.redis, sale_id).await =>
            {
                return Err(rejection);
            }
            // Not final (paused, not started, restoring): only a retry of a
            // key Redis remembers is answered otherwise, with that outcome.
            Some(rejection) => {
                match remembered(&self.redis, sale_id, buckets, user, idempotency_key)
                    .await
                    .map_err(|e| self.unavailable(&e))?
                {
                    Some(decision) => decision,
                    None => return Err(rejection),
                }
            }
        };
        debug!(sale = sale_id, user, outcome = ?decision.outcome, replayed = decision.replayed, "deduct");
        match decision.outcome {
            // A win just now: forwarded with the script's time, the same
            // `ts` as the stream record, whichever path writes the order.
            DeductOutcome::Won {
                reservation_id,
                reserved_at_ms: Some(reserved_at_ms),
            } => {
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
                    self.metrics
                        .forward_failures
                        .with_label_values(&["queue_full"])
                        .inc();
                }
                // The reservation stands either way (it is in the master and
                // forwarded); only the answer waits for the replicas.
                self.replicated(&home_id(sale_id, buckets, user), decision.node.as_deref())
                    .await?;
                Ok(BuyOutcome::Won {
                    reservation_id,
                    checkout_url: None,
                })
            }
            // A winner retrying with their key: the order's own state once
            // it exists. Nothing is forwarded again: the win's own forward
            // or, failing that, the stream writes the order.
            DeductOutcome::Won {
                reservation_id,
                reserved_at_ms: None,
            } => {
                self.replicated(&home_id(sale_id, buckets, user), decision.node.as_deref())
                    .await?;
                let order = self.order_lookups.order(&reservation_id).await;
                Ok(BuyOutcome::Replayed {
                    reservation_id,
                    order,
                    checkout_url: None,
                })
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
            DeductOutcome::Entered { .. } | DeductOutcome::DrawPending => {
                Err(Rejection::Unavailable)
            }
        }
    }

    /// The deduct, through the sale's opening draw when there is one: an
    /// entrant is held until the draw decides it; a buy after the window
    /// that finds the draw undecided runs it, then buys (twice at most: a
    /// draw stays decided).
    pub(super) async fn deduct_or_draw(
        &self,
        sale_id: &str,
        buckets: u32,
        user: &str,
        idempotency_key: &str,
    ) -> Result<Decision, Rejection> {
        if buckets > 1 {
            // No draw for a bucketed sale (validation refuses one).
            let rid = reservation_id(sale_id, rand::random());
            return self
                .deduct_in_buckets(sale_id, buckets, user, idempotency_key, &rid)
                .await;
        }
        for _ in 0..2 {
            let rid = reservation_id(sale_id, rand::random());
            // Before the entry exists: its sold out, decided later and read
            // later still, flags the sale only if stock did not come back
            // (a restock, a returned item) in between.
            let clears = self.sales.clears(sale_id);
            let decision = self
                .deduct(sale_id, 1, user, idempotency_key, &rid, false)
                .await?;
            match decision.outcome {
                DeductOutcome::Entered {
                    entry,
                    closes_in_ms,
                } => {
                    if !decision.replayed {
                        self.draws.metrics.entrants.inc();
                    }
                    let entrant = Entrant {
                        user,
                        rid: (!decision.replayed).then_some(rid.as_str()),
                    };
                    let held = self.draws.outcome(
                        &self.redis,
                        sale_id,
                        entry,
                        Duration::from_millis(closes_in_ms),
                        decision.replayed,
                        entrant,
                    );
                    let decided = Box::pin(held).await.map_err(|e| self.not_settled(&e))?;
                    self.draw_found_sold_out(sale_id, &decided, clears).await;
                    return Ok(decided);
                }
                DeductOutcome::DrawPending => Box::pin(self.draws.settle(&self.redis, sale_id))
                    .await
                    .map_err(|e| self.not_settled(&e))?,
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
    pub(super) async fn draw_found_sold_out(
        &self,
        sale_id: &str,
        decided: &Decision,
        clears: Clears,
    ) {
        if decided.found_sold_out() {
            // The draw's outcome carries no epoch: the newest known here,
            // with `clears`, tells a stale one.
            self.flag_sold_out(sale_id, None, clears).await;
        }
    }

    pub(super) fn not_settled(&self, error: &NotSettled) -> Rejection {
        match error {
            NotSettled::Redis(e) => self.unavailable(e),
            other => {
                debug!(%other, "draw not settled");
                Rejection::Unavailable
            }
        }
    }

    /// A decision this gateway can make without Redis: global switch and
    /// backlog pause (first: only the gateway enforces them, so a keyed buy
    /// that goes on to the deduct must never pass them), sold out
    /// (flagged), unknown sale, paused, not started, ended (from the cached
    /// window).
    pub(super) async fn local_rejection(
        &self,
        sale_id: &str,
    ) -> Result<Option<Rejection>, Rejection> {
        if self.paused(sale_id) {
            self.metrics
                .local_decisions
                .with_label_values(&["paused"])
                .inc();
            return Ok(Some(Rejection::Paused));
        }
        if self.sales.is_sold_out(sale_id) {
            return Ok(Some(Rejection::SoldOut));
        }
        let window = self
            .sales
            .window(&self.redis, sale_id)
            .await
            .map_err(|e| self.unavailable(&e))?;
        let rejection = match window.map(|w| w.check(self.clock.now_ms())) {
            None => Some(self.missing(sale_id).await),
            Some(WindowCheck::Open) => None,
            Some(WindowCheck::Ended) => Some(Rejection::Ended),
            Some(WindowCheck::Paused) => Some(Rejection::Paused),
            Some(WindowCheck::NotStarted { wait_secs }) => Some(Rejection::NotStarted(wait_secs)),
        };
        if let Some(r) = &rejection {
            self.metrics
                .local_decisions
                .with_label_values(&[r.code()])
                .inc();
        }
        Ok(rejection)
    }

    /// The answer to a buy for a sale Redis does not have: `unavailable`
    /// while the backend's database knows it (it is being restored) or
    /// cannot be asked, `not_found` only when the backend says it does not
    /// exist.
    pub(super) async fn missing(&self, sale_id: &str) -> Rejection {
        match self.sales.missing(&self.orders, sale_id).await {
            MissingSale::Restoring | MissingSale::NoAnswer => Rejection::Unavailable,
            MissingSale::Unknown => Rejection::NotFound("no such sale"),
        }
    }

    /// Runs the deduct script (batched with the sale's concurrent deducts);
    /// a sold-out answer found just now is flagged here and announced to
    /// every other gateway. A replayed one is not: it tells what an earlier
    /// attempt got, not whether stock is left. `dry_is_final`: a bucket's
    /// `sold_out` is remembered under the key (every bucket was confirmed
    /// dry; see `refill`).
    pub(super) async fn deduct(
        &self,
        sale_id: &str,
        buckets: u32,
        user: &str,
        idempotency_key: &str,
        rid: &str,
        dry_is_final: bool,
    ) -> Result<Decision, Rejection> {
        let mut nonce = String::with_capacity(16);
        push_hex(&mut nonce, u128::from(rand::random::<u64>()), 16);
        let attempt = BuyAttempt {
            sale_id,
            user_id: user,
            idempotency_key,
            reservation_id: rid,
            call_nonce: &nonce,
            idempotency_ttl_seconds: self.idempotency_ttl.as_secs(),
            draw_window_ms: self.draws.window_ms,
            buckets,
            dry_is_final,
        };
        // Before the call: a clear while it is in flight makes its sold out
        // stale, even before this gateway has read the new stock epoch.
        let clears = self.sales.clears(sale_id);
        let sent_at = std::time::Instant::now();
        let timer = self.metrics.script_duration.start_timer();
        let decision = self
            .deducts
            .deduct(&attempt)
            .await
            .map_err(|e| self.unavailable(&e))?;
        timer.observe_duration();
        if buckets > 1 {
            // Flagged per bucket by the caller (`refill`).
            return Ok(decision);
        }
        if decision.found_sold_out() {
            self.flag_sold_out(sale_id, Some(decision.epoch), clears)
                .await;
            self.sales
                .keep_buyers(&self.redis, sale_id, clears, decision.epoch, sent_at)
                .await;
        }
        Ok(decision)
    }

    /// A sale found out of stock just now (by a deduct at stock `epoch`, or
    /// by the draw), for a call sent at `clears`: flagged here, so later
    /// unkeyed buys are answered without Redis, and announced once to every
    /// other gateway with its epoch. A stale one (stock came back since it
    /// was decided) flags nothing.
    pub(super) async fn flag_sold_out(&self, sale_id: &str, epoch: Option<u64>, clears: Clears) {
        let Some(epoch) = self.sales.found_sold_out(sale_id, epoch, clears).await else {
            return;
        };
        if let Err(error) = self
            .redis
            .publish(&SaleEvent::SoldOut {
                sale: sale_id.to_owned(),
                epoch,
            })
            .await
        {
            warn!(%error, sale = sale_id, "could not announce sold out");
        }
    }

    /// With `redis.wait_replicas` set: returns once that many replicas hold
    /// every write of the Redis of replication id `node` up to now (the win
    /// it answered among them), sharing one round with the other winners
    /// of the moment.
    pub(super) async fn replicated(
        &self,
        sale_id: &str,
        node: Option<&str>,
    ) -> Result<(), Rejection> {
        let Some(waits) = &self.replica_wait else {
            return Ok(());
        };
        waits.confirm(sale_id, node).await.map_err(|e| match e {
            NotConfirmed::TooFewReplicas => Rejection::NotReplicated,
            NotConfirmed::Redis(e) => self.unavailable(&e),
        })
    }

    pub(super) fn unavailable(&self, error: &RedisError) -> Rejection {
        unavailable(&self.metrics, error)
    }
}
