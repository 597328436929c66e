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
//! A `WAIT` on a connection that made no write returns at once, and the
//! connection can be replaced between a deduct and its `WAIT` (a
//! reconnect, a sentinel lookup, the cluster client re-sending a call on a
//! new connection by itself). So each round is one pipeline on one
//! connection: a write first (`lua/wait_mark.lua`), then the `WAIT`.
//! Replication is one ordered stream per master, so replicas that
//! acknowledge the mark have every write that master made before it, on
//! any connection: this gateway's wins, another gateway's, a re-sent
//! call's. The mark answers the master's replication id, and a win is
//! confirmed only if it was made on that same master (a failover in
//! between gives the new master a new id): the win's deduct, or the read
//! of its remembered key, answered that id too.
//!
//! Sharing: winners join the next round of their group (the one master in
//! standalone and sentinel mode, the sale in cluster mode). One task per
//! busy group sends a round's `WAIT` once, and all winners that joined
//! before it was sent (their deduct answers were in, so their writes are
//! counted) get its answer; winners that arrive while it is in flight join
//! the round after. So the number of `WAIT`s follows Redis round trips, not
//! buyers.
//!
//! Too few replicas within `redis.wait_timeout_ms` (or another master
//! since the win) answers `503 unavailable` with `Retry-After`. The
//! reservation stands and is forwarded as usual; a retry with the same
//! Idempotency-Key replays the win and waits the same way. A bucket's
//! transfer waits too: the take on the donor is confirmed on the donor's
//! master (one round per donor bucket) before its items are given.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashgate_common::config::RedisTarget;
use flashgate_common::keys::{SaleKeys, WAIT_MARK_KEY};
use tokio::sync::watch;

use crate::infra::Metrics;
use crate::infra::{RedisClient, RedisError};

/// What one round found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ack {
    /// Replicas that acknowledged the mark (and so every earlier write of
    /// its master) in time.
    replicas: u32,
    /// The replication id of the master the mark ran on.
    node: String,
}

/// Why a win is not confirmed.
#[derive(Debug, thiserror::Error)]
pub enum NotConfirmed {
    /// Fewer replicas than `redis.wait_replicas` acknowledged within
    /// `redis.wait_timeout_ms`, or the master changed since the win.
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
    pub fn new(
        redis: Arc<RedisClient>,
        metrics: Arc<Metrics>,
        replicas: u32,
        timeout: Duration,
    ) -> Self {
        Self {
            redis,
            metrics,
            replicas,
            timeout,
            rounds: Mutex::new(HashMap::new()),
        }
    }

    /// Returns once `redis.wait_replicas` replicas hold the win in
    /// `sale_id` that the Redis of replication id `node` answered (its
    /// deduct, or the read of its remembered key; `None` confirms nothing).
    ///
    /// # Errors
    /// [`NotConfirmed::TooFewReplicas`] when fewer acknowledged in time (or
    /// the master changed since the win), [`NotConfirmed::Redis`] when the
    /// round failed.
    pub async fn confirm(
        self: &Arc<Self>,
        sale_id: &str,
        node: Option<&str>,
    ) -> Result<(), NotConfirmed> {
        let mut round = self.join(self.group_of(sale_id));
        // Bounded on its own too: a round's task that died (a panic, the
        // runtime stopping) must not hold a winner for ever.
        let limit = self.timeout + self.redis.config().call_timeout();
        let answer = match tokio::time::timeout(limit, round.wait_for(Option::is_some)).await {
            Ok(Ok(answer)) => answer.clone(),
            Ok(Err(_)) | Err(_) => None,
        };
        match answer {
            Some(Ok(ack)) if ack.replicas >= self.replicas && node == Some(ack.node.as_str()) => {
                Ok(())
            }
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
        let mut rounds = self
            .rounds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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

    /// Sends one round per turn of `group` while winners keep joining;
    /// ends (and removes the group) when a turn finds nobody waiting.
    async fn drive(self: Arc<Self>, group: String) {
        // The mark, in the sale's slot on a cluster (which routes the round
        // to the master that holds the sale); one key otherwise.
        let mark = if group.is_empty() {
            WAIT_MARK_KEY.to_owned()
        } else {
            SaleKeys::new(&group).wait_mark
        };
        loop {
            let sender = {
                let mut rounds = self
                    .rounds
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match rounds.get_mut(&group).and_then(Option::take) {
                    Some(sender) => sender,
                    None => {
                        rounds.remove(&group);
                        return;
                    }
                }
            };
            let answer = self.round(&mark).await.map_err(Arc::new);
            sender.send_replace(Some(answer));
        }
    }

    /// One round: the mark, then `WAIT`, in one pipeline on one connection
    /// to the master that holds `mark`.
    async fn round(&self, mark: &str) -> Result<Ack, RedisError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL").arg(WAIT_MARK).arg(1).arg(mark);
        pipe.cmd("WAIT")
            .arg(self.replicas)
            .arg(self.timeout.as_millis() as u64);
        self.metrics.replica_waits.inc();
        let replies = self
            .redis
            .call(|mut conn| async move { conn.pipeline_on_master_of(mark, &pipe).await })
            .await?;
        let [node, replicas] = <[redis::Value; 2]>::try_from(replies).map_err(|_| {
            redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "a replica wait round answers two replies",
            ))
        })?;
        let node = redis::from_redis_value::<String>(node.extract_error()?)
            .map_err(redis::RedisError::from)?;
        let replicas = redis::from_redis_value::<u32>(replicas.extract_error()?)
            .map_err(redis::RedisError::from)?;
        Ok(Ack { replicas, node })
    }
}

/// The write before each round's `WAIT` (`lua/wait_mark.lua`), sent with
/// `EVAL`: it is short, and a master that never saw it (promoted, or
/// resharded) needs no reload.
const WAIT_MARK: &str = flashgate_common::scripts::WAIT_MARK.body();

/// Each winner's own copy of a round's error, of the same kind (the metrics
/// count errors by kind).
fn copy_of(error: &RedisError) -> RedisError {
    match error {
        RedisError::Timeout(limit) => RedisError::Timeout(*limit),
        RedisError::CircuitOpen => RedisError::CircuitOpen,
        RedisError::QueueFull => RedisError::QueueFull,
        RedisError::Redis(e) => RedisError::Redis(redis::RedisError::from((
            e.kind(),
            "replica WAIT failed",
            e.to_string(),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::Breaker;
    use crate::infra::RedisServer;

    /// Waits for `replicas`, each `WAIT` up to `wait_ms`.
    fn waits(redis: &RedisServer, replicas: u32, wait_ms: u64) -> Arc<ReplicaWait> {
        let wait_timeout = Duration::from_millis(wait_ms);
        let config = flashgate_common::config::RedisConfig {
            wait_replicas: replicas,
            wait_timeout,
            timeout: Duration::from_millis(500),
            ..flashgate_common::config::RedisConfig::standalone(redis.url())
        };
        let client = Arc::new(RedisClient::new(
            config,
            Breaker::new(5, Duration::from_secs(1)),
        ));
        Arc::new(ReplicaWait::new(
            client,
            Arc::new(Metrics::register()),
            replicas,
            wait_timeout,
        ))
    }

    #[tokio::test]
    async fn a_live_replica_confirms_a_win_made_on_the_same_master_only() {
        let redis = RedisServer::private();
        let _replica = redis.start_replica();
        // Long enough for a replica on a loaded machine; a live one answers at once.
        let waits = waits(&redis, 1, 5000);
        // A win written on another connection than the round's: the mark
        // before the WAIT covers it all the same.
        let mut other = redis.conn().await;
        let _: () = redis::cmd("SET")
            .arg("win")
            .arg("v")
            .query_async(&mut other)
            .await
            .unwrap();
        let node = crate::infra::master_replid(&mut other).await;
        waits.confirm("s", Some(&node)).await.unwrap();
        // A win another master answered (the id before a failover), or one
        // without an id: not confirmed.
        assert!(matches!(
            waits.confirm("s", Some("0123abcd")).await,
            Err(NotConfirmed::TooFewReplicas)
        ));
        assert!(matches!(
            waits.confirm("s", None).await,
            Err(NotConfirmed::TooFewReplicas)
        ));
        assert_eq!(waits.metrics.replica_wait_timeouts.get(), 2);
        assert_eq!(
            redis.command_calls("wait").await,
            waits.metrics.replica_waits.get()
        );
    }

    #[tokio::test]
    async fn without_replicas_a_win_is_not_confirmed_and_the_timeout_is_counted() {
        let redis = RedisServer::private();
        let waits = waits(&redis, 1, 100);
        let node = crate::infra::master_replid(&mut redis.conn().await).await;
        let err = waits.confirm("s", Some(&node)).await.unwrap_err();
        assert!(matches!(err, NotConfirmed::TooFewReplicas), "{err:?}");
        assert_eq!(
            (
                waits.metrics.replica_wait_timeouts.get(),
                waits.metrics.replica_waits.get()
            ),
            (1, 1)
        );
    }

    #[tokio::test]
    async fn winners_waiting_together_share_wait_calls() {
        let redis = RedisServer::private();
        let waits = waits(&redis, 1, 100);
        let winners = 20;
        let all = (0..winners).map(|_| {
            let waits = waits.clone();
            async move { waits.confirm("s", Some("ab")).await }
        });
        let answers = futures_util::future::join_all(all).await;
        assert!(answers
            .iter()
            .all(|a| matches!(a, Err(NotConfirmed::TooFewReplicas))));
        let sent = waits.metrics.replica_waits.get();
        println!("{winners} winners, {sent} WAIT calls");
        // The first round covers the first winner; every later one joins
        // the round after it at the latest.
        assert!(sent <= 2, "{sent} WAITs for {winners} winners");
        assert_eq!(redis.command_calls("wait").await, sent);
        assert!(
            waits.rounds.lock().unwrap().is_empty(),
            "the group's task ended"
        );
    }
}
