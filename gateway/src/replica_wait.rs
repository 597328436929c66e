//! Wins held until replicas have them (`redis.wait_replicas`): one Redis
//! `WAIT` answers many winners.
//!
//! `WAIT numreplicas timeout` blocks the client that sends it until that
//! many replicas acknowledged every write *that client* made, so it must go
//! on the connection the deducts went on: the shared handle of
//! [`RedisClient`]. Its routing, mode by mode:
//!
//! - standalone: the connection manager's one multiplexed socket;
//! - sentinel: the current primary connection;
//! - cluster: the redis crate routes a bare `WAIT` to *every* master and
//!   answers the smallest count; here it is routed by the sale's key to the
//!   master that holds the sale, over the same per-node connection its
//!   `EVALSHA` used. Only that master matters.
//!
//! In every mode the connection can be replaced between a deduct and its
//! `WAIT` (a reconnect, a sentinel lookup), and a `WAIT` on the new one
//! counts none of the old one's writes. [`RedisClient::generation`] changes
//! whenever that may have happened; a `WAIT` confirms a win only if it was
//! the same before the deduct and before and after the `WAIT`.
//!
//! Sharing: winners join the next round of their group (the one master in
//! standalone and sentinel mode, the sale in cluster mode). One task per
//! busy group sends a round's `WAIT` once, and all winners that joined
//! before it was sent (their deduct answers were in, so their writes are
//! counted) get its answer; winners that arrive while it is in flight join
//! the round after. So the number of `WAIT`s follows Redis round trips, not
//! buyers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashgate_common::config::RedisTarget;
use flashgate_common::keys::SaleKeys;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::redis_client::{RedisClient, RedisError};

/// What one `WAIT` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ack {
    /// Replicas that acknowledged the connection's writes in time.
    replicas: u32,
    /// The shared handle's generation just before and just after the call:
    /// equal when the `WAIT` ran on that generation's connection.
    generation: (u64, u64),
}

/// Why a win is not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum NotConfirmed {
    /// Fewer replicas than `redis.wait_replicas` acknowledged within
    /// `redis.wait_timeout_ms`, or the connection changed since the deduct.
    #[error("fewer replicas than required acknowledged the win in time")]
    TooFewReplicas,
    /// The `WAIT` itself failed.
    #[error(transparent)]
    Redis(#[from] RedisError),
}

/// A round's answer: `None` until its `WAIT` answered; an error is shared
/// (a round's answer goes to many winners).
type RoundResult = Option<Result<Ack, Arc<RedisError>>>;

/// The replica waits of one gateway.
pub struct ReplicaWait {
    redis: Arc<RedisClient>,
    metrics: Arc<Metrics>,
    replicas: u32,
    timeout: Duration,
    /// The next round of each group with a task sending `WAIT`s: winners
    /// waiting for a `WAIT` not sent yet (`None` while none are). A group
    /// without an entry has no task; the first winner starts one.
    rounds: Mutex<HashMap<String, Option<watch::Sender<RoundResult>>>>,
}

impl ReplicaWait {
    /// Waits for `replicas` (at least 1) for up to `timeout` per `WAIT`.
    pub fn new(redis: Arc<RedisClient>, metrics: Arc<Metrics>, replicas: u32, timeout: Duration) -> Self {
        Self { redis, metrics, replicas, timeout, rounds: Mutex::new(HashMap::new()) }
    }

    /// Returns once `redis.wait_replicas` replicas hold the win in
    /// `sale_id` whose deduct answered on the connection of `generation`
    /// (read with [`RedisClient::generation`] before the deduct was sent).
    ///
    /// # Errors
    /// [`NotConfirmed::TooFewReplicas`] when fewer acknowledged in time (or
    /// the connection changed meanwhile), [`NotConfirmed::Redis`] when the
    /// `WAIT` failed.
    pub async fn confirm(self: &Arc<Self>, sale_id: &str, generation: u64) -> Result<(), NotConfirmed> {
        let mut round = self.join(self.group_of(sale_id));
        let answer = match round.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone(),
            // The task ended without answering (the runtime is shutting down).
            Err(_) => return Err(NotConfirmed::TooFewReplicas),
        };
        match answer {
            Some(Ok(ack)) if ack.replicas >= self.replicas && ack.generation == (generation, generation) => Ok(()),
            Some(Ok(_)) | None => {
                self.metrics.replica_wait_timeouts.inc();
                Err(NotConfirmed::TooFewReplicas)
            }
            Some(Err(error)) => Err(NotConfirmed::Redis(copy_of(&error))),
        }
    }

    /// The `WAIT` group of a sale: its master's slot in a cluster (named by
    /// the sale, whose keys share one slot), the one master otherwise.
    fn group_of(&self, sale_id: &str) -> String {
        if matches!(self.redis.config().target, RedisTarget::Cluster { .. }) {
            sale_id.to_owned()
        } else {
            String::new()
        }
    }

    /// Joins the next round of `group`, starting the group's task if none runs.
    fn join(self: &Arc<Self>, group: String) -> watch::Receiver<RoundResult> {
        let mut rounds = self.rounds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = !rounds.contains_key(&group);
        let next = rounds.entry(group.clone()).or_default();
        let receiver = match next {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(None);
                *next = Some(sender);
                receiver
            }
        };
        drop(rounds);
        if start {
            tokio::spawn(self.clone().drive(group));
        }
        receiver
    }

    /// Sends one `WAIT` per round of `group` while winners keep joining;
    /// ends (and removes the group) when a round finds nobody waiting.
    async fn drive(self: Arc<Self>, group: String) {
        // Routes the WAIT to the master of the sale's slot (a cluster);
        // ignored by the other modes.
        let route = SaleKeys::new(&group).remaining;
        loop {
            let sender = {
                let mut rounds = self.rounds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match rounds.get_mut(&group).and_then(Option::take) {
                    Some(sender) => sender,
                    None => {
                        rounds.remove(&group);
                        return;
                    }
                }
            };
            let answer = self.wait_once(&route).await.map_err(Arc::new);
            sender.send_replace(Some(answer));
        }
    }

    /// One `WAIT` on the shared connection, on the master that holds `route`.
    async fn wait_once(&self, route: &str) -> Result<Ack, RedisError> {
        let before = self.redis.generation();
        let mut conn = self.redis.conn().await?;
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(self.timeout.as_millis() as u64);
        self.metrics.replica_waits.inc();
        let reply = self.redis.bounded(conn.on_master_of(route, &wait)).await??;
        let replicas = redis::from_redis_value::<u32>(reply).map_err(redis::RedisError::from)?;
        Ok(Ack { replicas, generation: (before, self.redis.generation()) })
    }
}

/// Each winner's own copy of a round's error, of the same kind (the metrics
/// count errors by kind).
fn copy_of(error: &RedisError) -> RedisError {
    match error {
        RedisError::Timeout(limit) => RedisError::Timeout(*limit),
        RedisError::CircuitOpen => RedisError::CircuitOpen,
        RedisError::Redis(e) => RedisError::Redis(redis::RedisError::from((e.kind(), "replica WAIT failed", e.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::Breaker;
    use crate::testing::RedisServer;

    /// Waits for `replicas`, each `WAIT` up to `wait_ms`.
    fn waits(redis: &RedisServer, replicas: u32, wait_ms: u64) -> Arc<ReplicaWait> {
        let wait_timeout = Duration::from_millis(wait_ms);
        let config = flashgate_common::config::RedisConfig {
            wait_replicas: replicas,
            wait_timeout,
            timeout: Duration::from_millis(500),
            ..flashgate_common::config::RedisConfig::standalone(redis.url())
        };
        let client = Arc::new(RedisClient::new(config, Breaker::new(5, Duration::from_secs(1))));
        Arc::new(ReplicaWait::new(client, Arc::new(Metrics::register()), replicas, wait_timeout))
    }

    #[tokio::test]
    async fn a_live_replica_confirms_a_win_unless_the_connection_may_have_changed_since_its_deduct() {
        let redis = RedisServer::private();
        let _replica = redis.start_replica();
        // Long enough for a replica on a loaded machine; a live one answers at once.
        let waits = waits(&redis, 1, 5000);
        let mut conn = waits.redis.conn().await.unwrap();
        let _: () = redis::cmd("SET").arg("k").arg("v").query_async(&mut conn).await.unwrap();
        let before = waits.redis.generation();
        waits.confirm("s", before).await.unwrap();
        // A failed call: the connection may have been replaced since.
        let failed = waits.redis.bounded(async { Err::<(), _>(redis::RedisError::from((redis::ErrorKind::Io, "cut"))) }).await;
        assert!(matches!(failed, Ok(Err(_))));
        assert_ne!(waits.redis.generation(), before);
        assert!(matches!(waits.confirm("s", before).await, Err(NotConfirmed::TooFewReplicas)), "a deduct before the fault");
        waits.confirm("s", waits.redis.generation()).await.unwrap();
        assert_eq!(waits.metrics.replica_wait_timeouts.get(), 1);
    }

    #[tokio::test]
    async fn without_replicas_a_win_is_not_confirmed_and_the_timeout_is_counted() {
        let redis = RedisServer::private();
        let waits = waits(&redis, 1, 100);
        let err = waits.confirm("s", 0).await.unwrap_err();
        assert!(matches!(err, NotConfirmed::TooFewReplicas), "{err:?}");
        assert_eq!((waits.metrics.replica_wait_timeouts.get(), waits.metrics.replica_waits.get()), (1, 1));
    }

    #[tokio::test]
    async fn winners_waiting_together_share_wait_calls() {
        let redis = RedisServer::private();
        let waits = waits(&redis, 1, 100);
        let winners = 20;
        let all = (0..winners).map(|_| {
            let waits = waits.clone();
            async move { waits.confirm("s", 0).await }
        });
        let answers = futures_util::future::join_all(all).await;
        assert!(answers.iter().all(|a| matches!(a, Err(NotConfirmed::TooFewReplicas))));
        let sent = waits.metrics.replica_waits.get();
        println!("{winners} winners, {sent} WAIT calls");
        // The first round covers the first winner; every later one joins
        // the round after it at the latest.
        assert!(sent <= 2, "{sent} WAITs for {winners} winners");
        assert_eq!(redis.command_calls("wait").await, sent);
        assert!(waits.rounds.lock().unwrap().is_empty(), "the group's task ended");
    }
}
