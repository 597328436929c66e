//! Group commit of buy attempts: the concurrent deducts of one sale go to
//! Redis as ONE call of `lua/deduct_batch.lua` ([`deduct_many`]).
//!
//! An `EVALSHA` costs Redis far more than the few microseconds of deciding
//! one attempt, so under load most of Redis's time went into calls, not
//! buys. Here an attempt for a sale with no call in flight goes at once,
//! alone (no delay at low load); attempts arriving while
//! [`IN_FLIGHT_PER_SALE`] calls of that sale are in flight queue, and go
//! together, at most [`MAX_BATCH`] per call, as soon as one returns. The
//! script decides them in arrival order, each exactly as on its own.
//!
//! Attempts are grouped by the hash tag of their keys (the sale, or the
//! buyer's home bucket of a bucketed sale): all keys of one call must be
//! in one slot of a cluster. Every call goes through
//! [`RedisClient::call`] (timeout, circuit breaker) and the script's
//! `invoke` (a `NOSCRIPT` reloads it), on the one shared connection, so
//! standalone, Sentinel and cluster deployments work alike.
//!
//! Calls run in spawned tasks, never in a buyer's future: a client that
//! goes away drops its request future at any `.await`, and that must not
//! strand the other attempts of its batch or of the queue behind it.
//!
//! Waiting is bounded, so a slow Redis still answers 503 in bounded time
//! and a queued attempt is not decided long after the buyer's moment (an
//! operator's pause meanwhile): an attempt that waited in the queue longer
//! than the Redis call timeout is answered with that timeout, unsent; a
//! lane holds at most [`MAX_QUEUED`] waiting attempts (more are answered
//! [`RedisError::QueueFull`] at once); and a buyer waits at most twice the
//! call timeout in all.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use flashgate_common::keys::home_id;
use prometheus::Histogram;
use tokio::sync::oneshot;

use crate::buy::deduct::{deduct_many, BuyAttempt, Decision};
use crate::infra::BATCH_SIZE_BUCKETS;
use crate::infra::{RedisClient, RedisError};

#[cfg(test)]
mod tests;

/// Most attempts in one script call. The script holds Redis for all of
/// them (a few µs each), so a cap keeps one call well under a millisecond
/// and other sales' calls from waiting behind it.
pub const MAX_BATCH: usize = 64;
const _: () = assert!(
    BATCH_SIZE_BUCKETS[BATCH_SIZE_BUCKETS.len() - 1] as usize == MAX_BATCH,
    "the batch size histogram's last bucket is the largest batch"
);

/// Calls of one sale (one hash tag) in flight at once. More than one keeps
/// Redis busy while the gateway reads the previous reply; each more makes
/// the batches smaller. On the bench's "buy in stock" (2 cores) 1 and 2
/// sold alike; 2 had the lower p99 (about 16 attempts per call, against
/// about 29 with 1).
pub const IN_FLIGHT_PER_SALE: usize = 2;

/// Most attempts waiting in one lane: four full batches per call slot. At
/// a healthy Redis the queue never gets near it (each call takes
/// [`MAX_BATCH`]); it only fills when calls are slow, and then more
/// waiters would only time out in the queue.
pub const MAX_QUEUED: usize = IN_FLIGHT_PER_SALE * MAX_BATCH * 4;

/// Groups the concurrent deducts of each sale into batched script calls;
/// one per gateway.
pub struct DeductBatcher {
    redis: Arc<RedisClient>,
    /// Attempts per script call (`flashgate_deduct_batch_size`).
    sizes: Histogram,
    lanes: Mutex<HashMap<Lane, Queue>>,
}

/// The attempts that may share a call: the keys' hash tag. Bucketed or not
/// is part of it, so a sale whose id looks like a bucket's (`ID:bk`) never
/// shares a call with that bucket (their calls differ in the draw keys).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Lane {
    home: String,
    bucketed: bool,
}

/// One lane's attempts waiting for a call, and its calls in flight.
/// Attempts wait only while [`IN_FLIGHT_PER_SALE`] calls are in flight.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
    in_flight: usize,
}

impl Queue {
    /// The next call's attempts, at most [`MAX_BATCH`]. Attempts that
    /// waited `max_wait` or longer are answered with that timeout and not
    /// sent: their buyer would get 503 later than the call timeout
    /// promises, and deciding them now could override what happened since
    /// (a pause). Their buyers retry, as after any timeout.
    fn next_batch(&mut self, max_wait: Duration) -> Vec<Waiter> {
        let mut batch = Vec::with_capacity(self.waiting.len().min(MAX_BATCH));
        while batch.len() < MAX_BATCH {
            let Some(waiter) = self.waiting.pop_front() else {
                break;
            };
            if waiter.enqueued.elapsed() >= max_wait {
                let _ = waiter.answer.send(Err(RedisError::Timeout(max_wait)));
            } else {
                batch.push(waiter);
            }
        }
        batch
    }
}

/// An attempt, when it was queued, and where its decision goes.
struct Waiter {
    attempt: OwnedAttempt,
    enqueued: Instant,
    answer: oneshot::Sender<Result<Decision, RedisError>>,
}

/// A [`BuyAttempt`] that outlives its request's future (it waits in a
/// queue, then is sent by a spawned task).
struct OwnedAttempt {
    sale_id: String,
    user_id: String,
    idempotency_key: String,
    reservation_id: String,
    call_nonce: String,
    idempotency_ttl_seconds: u64,
    draw_window_ms: u64,
    buckets: u32,
    dry_is_final: bool,
}

impl OwnedAttempt {
    fn of(a: &BuyAttempt<'_>) -> Self {
        Self {
            sale_id: a.sale_id.to_owned(),
            user_id: a.user_id.to_owned(),
            idempotency_key: a.idempotency_key.to_owned(),
            reservation_id: a.reservation_id.to_owned(),
            call_nonce: a.call_nonce.to_owned(),
            idempotency_ttl_seconds: a.idempotency_ttl_seconds,
            draw_window_ms: a.draw_window_ms,
            buckets: a.buckets,
            dry_is_final: a.dry_is_final,
        }
    }

    fn attempt(&self) -> BuyAttempt<'_> {
        BuyAttempt {
            sale_id: &self.sale_id,
            user_id: &self.user_id,
            idempotency_key: &self.idempotency_key,
            reservation_id: &self.reservation_id,
            call_nonce: &self.call_nonce,
            idempotency_ttl_seconds: self.idempotency_ttl_seconds,
            draw_window_ms: self.draw_window_ms,
            buckets: self.buckets,
            dry_is_final: self.dry_is_final,
        }
    }
}

impl DeductBatcher {
    /// A batcher sending on `redis`, recording each call's size in `sizes`.
    pub fn new(redis: Arc<RedisClient>, sizes: Histogram) -> Self {
        Self {
            redis,
            sizes,
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Decides `attempt`, in a call of its own when its sale has a call
    /// slot free, else in the next batch of its sale.
    ///
    /// # Errors
    /// The error of the call that carried the attempt (every attempt of a
    /// batch gets it), or the attempt's own script error;
    /// [`RedisError::Timeout`] when it waited too long (in the queue, or
    /// twice the call timeout in all); [`RedisError::QueueFull`] when its
    /// sale already has [`MAX_QUEUED`] attempts waiting.
    pub async fn deduct(
        self: &Arc<Self>,
        attempt: &BuyAttempt<'_>,
    ) -> Result<Decision, RedisError> {
        let lane = Lane {
            home: home_id(attempt.sale_id, attempt.buckets, attempt.user_id),
            bucketed: attempt.buckets > 1,
        };
        let max_wait = self.max_wait();
        let (answer, decision) = oneshot::channel();
        let batch = {
            let mut lanes = self.lanes();
            let queue = lanes.entry(lane.clone()).or_default();
            if queue.waiting.len() >= MAX_QUEUED {
                return Err(RedisError::QueueFull);
            }
            queue.waiting.push_back(Waiter {
                attempt: OwnedAttempt::of(attempt),
                enqueued: Instant::now(),
                answer,
            });
            (queue.in_flight < IN_FLIGHT_PER_SALE).then(|| {
                queue.in_flight += 1;
                queue.next_batch(max_wait)
            })
        };
        if let Some(batch) = batch {
            // The slot is held from here: if the task never runs (the
            // runtime shutting down drops it unpolled), dropping it frees
            // the slot, as when the task ends early.
            let slot = CallSlot {
                batcher: Arc::clone(self),
                lane,
                held: true,
            };
            tokio::spawn(slot.run(batch));
        }
        // A backstop: the attempt waits at most `max_wait` in the queue and
        // its call at most `max_wait` more. Only a sender dropped unanswered
        // (see `CallSlot`) closes the channel.
        match tokio::time::timeout(2 * max_wait, decision).await {
            Ok(Ok(decision)) => decision,
            Ok(Err(_)) => Err(RedisError::Redis(redis::RedisError::from((
                redis::ErrorKind::Client,
                "deduct batch abandoned",
            )))),
            // Dropping the receiver: should its call still decide it, the
            // decision is dropped as a gone buyer's (see `send`).
            Err(_) => Err(RedisError::Timeout(2 * max_wait)),
        }
    }

    /// How long an attempt may wait in the queue: the Redis call timeout
    /// (`redis.timeout_ms`, with `wait_timeout_ms` when wins wait for
    /// replicas), the bound of the call it then goes in.
    fn max_wait(&self) -> Duration {
        self.redis.config().call_timeout()
    }

    /// One script call for `batch`; every waiter gets its decision.
    async fn send(&self, batch: Vec<Waiter>) {
        // A buyer gone before its attempt was sent never made it: skipped,
        // as a request future dropped before its call was.
        let batch: Vec<Waiter> = batch
            .into_iter()
            .filter(|w| !w.answer.is_closed())
            .collect();
        if batch.is_empty() {
            return;
        }
        self.sizes.observe(batch.len() as f64);
        let attempts: Vec<BuyAttempt<'_>> = batch.iter().map(|w| w.attempt.attempt()).collect();
        let decisions = deduct_many(&self.redis, &attempts).await;
        // A send fails only when the buyer went away meanwhile: the
        // decision is dropped. A win then is not forwarded by this gateway,
        // exactly as when a request future is dropped after its script call
        // returned: the reservation is durable in the sale's stream, and
        // the backend's stream consumer writes its order.
        match decisions {
            Ok(decisions) => {
                for (waiter, decision) in batch.into_iter().zip(decisions) {
                    let _ = waiter.answer.send(decision);
                }
            }
            // The call failed or timed out: every attempt in it did (503).
            Err(error) => {
                for waiter in batch {
                    let _ = waiter.answer.send(Err(error.clone()));
                }
            }
        }
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<Lane, Queue>> {
        // Nothing panics while holding the lock; a poisoned map is as good.
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A lane's call slot, taken before its task is spawned and freed if the
/// task ends without freeing it (a panic, the runtime shutting down, a
/// task dropped before it first ran): otherwise the lane would count a
/// call in flight for ever and its attempts would wait for nothing. The
/// last slot of a lane also answers the attempts still waiting (their
/// senders are dropped: an error, 503), so no buyer waits for a call that
/// never comes.
struct CallSlot {
    batcher: Arc<DeductBatcher>,
    lane: Lane,
    held: bool,
}

impl CallSlot {
    /// Sends `batch`, then the lane's next batch while attempts wait, then
    /// frees the slot.
    async fn run(mut self, mut batch: Vec<Waiter>) {
        let max_wait = self.batcher.max_wait();
        loop {
            self.batcher.send(batch).await;
            let mut lanes = self.batcher.lanes();
            let Some(queue) = lanes.get_mut(&self.lane) else {
                break;
            };
            if queue.waiting.is_empty() {
                queue.in_flight -= 1;
                if queue.in_flight == 0 {
                    lanes.remove(&self.lane);
                }
                self.held = false;
                return;
            }
            batch = queue.next_batch(max_wait);
        }
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let mut lanes = self.batcher.lanes();
        if let Some(queue) = lanes.get_mut(&self.lane) {
            queue.in_flight = queue.in_flight.saturating_sub(1);
            if queue.in_flight == 0 {
                lanes.remove(&self.lane);
            }
        }
    }
}
