//! The opening draw, gateway side (`[fairness]`; the record and the order
//! are in `flashgate_common::draw`).
//!
//! A buy the deduct script answers `entered` is held here: it sleeps until
//! the window closes, then asks for its outcome; while none is decided, it
//! runs `lua/draw_run.lua`, which decides the next chunk of entrants for
//! the whole sale. Every gateway holding entrants does the same, so the
//! draw goes on if any of them dies; on one gateway, one call per sale runs
//! at a time (the others read the outcomes it wrote). A buy after the
//! window that finds the draw undecided (`draw_pending`) runs it the same
//! way, then buys. A transient Redis error meanwhile (see
//! `RedisError::is_transient`) is retried with backoff, any other answered
//! at once; past the window plus `fairness.settle_ms` the buyer is
//! answered 503 (the last call's error if it failed, else
//! [`NotSettled::TimedOut`]); the entry is still decided, and a retry with
//! the same Idempotency-Key answers its outcome. A winner is forwarded like
//! any win (the same record, the same `ts`) and waits for replicas like
//! one; a `sold_out` the draw decides flags the sale and is announced like
//! a deduct's, unless the sale was cleared (a restock, a returned item)
//! since that entrant entered. Who may enter, and what a re-sent call or a
//! replay of a held key is answered: `lua/deduct.lua`; the chunks of
//! [`CHUNK`] entrants, decided by the rules of any buy:
//! `lua/draw_run.lua`, `lua/lib/decide.lua`.
//!
//! ```text
//! entered ─► sleep until closes ─► outcome? ─ yes ─► answer
//!                                     │ no
//!                                     ▼
//!                      draw_run (one per sale here) ─► open: sleep; paused,
//!                                     │               fenced: back off
//!                                     └── pending, done ──► outcome?
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashgate_common::config::FairnessConfig;
use flashgate_common::draw::Outcome;
use flashgate_common::keys::SaleKeys;
use flashgate_common::metrics::Registry;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts};
use tokio::time::Instant;
use tracing::debug;

use crate::buy::deduct::{Decision, DeductOutcome, MISSES_REMEMBERED_PER_USER};
use crate::infra::{RedisClient, RedisError};

/// Entrants one `lua/draw_run.lua` call decides: about a millisecond of
/// Redis time, so buys of other sales are not held up behind a draw.
pub const CHUNK: u32 = 500;

/// How long a draw found decided is taken as decided without asking
/// Redis again.
const DECIDED_MEMO: Duration = Duration::from_secs(60);

/// The longest pause between two tries while the sale is paused or fenced.
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// Settle-time buckets, seconds: a draw of a few hundred entrants settles
/// in milliseconds, of a hundred thousand in about a second.
const SETTLE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The draw's metrics (registered into the gateway's registry).
pub struct DrawMetrics {
    /// Buys entered into a draw on this gateway (re-sends joining an entry
    /// not counted).
    pub entrants: IntCounter,
    /// Entrants this gateway answered as winners.
    pub winners: IntCounter,
    /// From the window's close to an entrant's answer.
    pub settle: Histogram,
    /// `lua/draw_run.lua` calls by what they found (pending, done, open,
    /// paused, fenced, none).
    pub runs: IntCounterVec,
}

impl DrawMetrics {
    /// # Panics
    /// Only if a name is taken, a programming error caught by the tests.
    pub fn register(registry: &Registry) -> Self {
        let plain = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let entrants = plain("draw_entrants_total", "Buys entered into an opening draw.");
        let winners = plain("draw_winners_total", "Draw entrants answered as winners.");
        let settle = Histogram::with_opts(
            HistogramOpts::new(
                "draw_settle_seconds",
                "From a draw window's close to an entrant's answer.",
            )
            .buckets(SETTLE_BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        registry
            .register(Box::new(settle.clone()))
            .expect("unique metric");
        let runs = IntCounterVec::new(
            Opts::new("draw_runs_total", "Draw script calls by what they found."),
            &["result"],
        )
        .expect("valid counter");
        registry
            .register(Box::new(runs.clone()))
            .expect("unique metric");
        Self {
            entrants,
            winners,
            settle,
            runs,
        }
    }
}

/// Why a held buy got no outcome.
#[derive(Debug, thiserror::Error)]
pub enum NotSettled {
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// The window plus `fairness.settle_ms` passed (the sale paused or
    /// fenced meanwhile, or Redis was slow): the entry is still decided.
    #[error("the draw did not settle in time")]
    TimedOut,
    /// The draw's record is gone (the sale was removed, the record expired).
    #[error("the draw has no record of the entry")]
    Gone,
    /// Redis answered what the script never does.
    #[error("bad draw reply: {0}")]
    BadReply(String),
}

/// Who holds an entry: its user and, for the call that entered it, the
/// reservation id it offered (a re-send that joined offered another).
#[derive(Debug, Clone, Copy)]
pub struct Entrant<'a> {
    pub user: &'a str,
    pub rid: Option<&'a str>,
}

impl Entrant<'_> {
    /// Whether `o` is this entrant's outcome. A record without the
    /// entrant (written before records carried it) is taken as its own.
    fn owns(&self, o: &Outcome) -> bool {
        if o.user.is_empty() {
            return true;
        }
        o.user == self.user && self.rid.is_none_or(|rid| o.rid == rid)
    }
}

/// What one `lua/draw_run.lua` call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    None,
    Open { ms: u64 },
    Paused,
    Fenced,
    Pending,
    Done,
}

/// The draws of one gateway.
pub struct Draws {
    script: redis::Script,
    /// `fairness.window_ms`: the window of a sale without its own.
    pub window_ms: u64,
    settle: Duration,
    idempotency_ttl_seconds: u64,
    /// One draw call per sale at a time from this gateway: its other held
    /// buys wait their turn, and once a call found the draw decided
    /// (`Some(when)`) they call no more.
    running: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Instant>>>>>,
    pub metrics: DrawMetrics,
}

impl Draws {
    pub fn new(config: FairnessConfig, idempotency_ttl: Duration, registry: &Registry) -> Self {
        Self {
            script: flashgate_common::scripts::DRAW_RUN.clone(),
            window_ms: config.window_ms,
            settle: config.settle,
            idempotency_ttl_seconds: idempotency_ttl.as_secs(),
            running: Mutex::new(HashMap::new()),
            metrics: DrawMetrics::register(registry),
        }
    }

    /// Holds entry `entry` of `sale_id`'s draw (closing `closes_in` from
    /// now) until it is decided, and answers its outcome, `replayed` as
    /// given (a re-send that joined an entry replays it).
    ///
    /// The outcome found must be `user`'s and, for the call that entered
    /// (`rid` given), carry its reservation id: entry numbers are reused
    /// after a failover that lost entries, and another entrant's outcome
    /// is answered as [`NotSettled::Gone`] (503; a keyed retry buys anew).
    ///
    /// # Errors
    /// See [`NotSettled`].
    pub async fn outcome(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        entry: u64,
        closes_in: Duration,
        replayed: bool,
        entrant: Entrant<'_>,
    ) -> Result<Decision, NotSettled> {
        let closes = Instant::now() + closes_in;
        let deadline = closes + self.settle;
        tokio::time::sleep_until(closes).await;
        let keys = SaleKeys::new(sale_id);
        let mut backoff = Duration::from_millis(2);
        let mut finished = false;
        // Every pass reads first: past the deadline, a failed read answers
        // its own error, a read that succeeded leaves only the timeout, so
        // no earlier error is kept to answer.
        loop {
            let read = match self.read(redis, &keys, entry).await {
                Ok(read) => read,
                Err(e) => {
                    retry_after(e, deadline, &mut backoff, &mut None).await?;
                    continue;
                }
            };
            if let Some(outcome) = read {
                if !entrant.owns(&outcome) {
                    return Err(NotSettled::Gone);
                }
                self.metrics.settle.observe(closes.elapsed().as_secs_f64());
                let code = outcome.outcome.clone();
                let decision =
                    Decision::drawn(outcome, replayed).ok_or(NotSettled::BadReply(code))?;
                if !replayed && matches!(decision.outcome, DeductOutcome::Won { .. }) {
                    self.metrics.winners.inc();
                }
                return Ok(decision);
            }
            // Decided, yet no outcome for the entry: its record is gone.
            if finished {
                return Err(NotSettled::Gone);
            }
            if Instant::now() >= deadline {
                return Err(NotSettled::TimedOut);
            }
            match self.run(redis, sale_id, &keys).await {
                Ok(Run::Pending) => backoff = Duration::from_millis(2),
                Ok(Run::Done | Run::None) => finished = true,
                Ok(Run::Open { ms }) => tokio::time::sleep(Duration::from_millis(ms.max(1))).await,
                Ok(Run::Paused | Run::Fenced) => back_off(deadline, &mut backoff).await,
                Err(e) => retry_after(e, deadline, &mut backoff, &mut None).await?,
            }
        }
    }

    /// Runs `sale_id`'s draw to its end, for a buy after the window that
    /// found it undecided; bounded by `fairness.settle_ms`.
    ///
    /// # Errors
    /// See [`NotSettled`].
    pub async fn settle(&self, redis: &RedisClient, sale_id: &str) -> Result<(), NotSettled> {
        let deadline = Instant::now() + self.settle;
        let keys = SaleKeys::new(sale_id);
        let mut backoff = Duration::from_millis(2);
        // The error of the last call, if it failed: answered at the deadline.
        let mut last = None;
        loop {
            let run = self.run(redis, sale_id, &keys).await;
            if run.is_ok() {
                last = None;
            }
            match run {
                Ok(Run::Done | Run::None) => return Ok(()),
                Ok(Run::Pending) => backoff = Duration::from_millis(2),
                Ok(Run::Open { ms }) => tokio::time::sleep(Duration::from_millis(ms.max(1))).await,
                Ok(Run::Paused | Run::Fenced) => back_off(deadline, &mut backoff).await,
                Err(e) => retry_after(e, deadline, &mut backoff, &mut last).await?,
            }
            if Instant::now() >= deadline {
                return Err(last.unwrap_or(NotSettled::TimedOut));
            }
        }
    }

    /// One `lua/draw_run.lua` call, one per sale at a time from this
    /// gateway; none once a call here found the draw decided (a minute ago
    /// at most: a sale's draw is decided once).
    async fn run(
        &self,
        redis: &RedisClient,
        sale_id: &str,
        keys: &SaleKeys,
    ) -> Result<Run, NotSettled> {
        let lock = {
            let mut running = self
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            running.entry(sale_id.to_owned()).or_default().clone()
        };
        let mut decided = lock.lock().await;
        if decided.is_some_and(|at| at.elapsed() < DECIDED_MEMO) {
            return Ok(Run::Done);
        }
        let seed = format!("{:032x}", rand::random::<u128>());
        let invocation = draw_run_call(
            &self.script,
            keys,
            sale_id,
            &seed,
            CHUNK,
            self.idempotency_ttl_seconds,
        );
        let reply: Vec<String> = redis
            .call(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        let run = match reply.as_slice() {
            [state, _] if state == "pending" => Run::Pending,
            [state, _] if state == "done" => Run::Done,
            [state, _] if state == "none" || state == "not_found" => Run::None,
            [state, _] if state == "paused" => Run::Paused,
            [state, _] if state == "fenced" => Run::Fenced,
            [state, ms] if state == "open" => Run::Open {
                ms: ms
                    .parse()
                    .map_err(|_| NotSettled::BadReply(reply.join("|")))?,
            },
            _ => return Err(NotSettled::BadReply(reply.join("|"))),
        };
        self.metrics
            .runs
            .with_label_values(&[reply[0].as_str()])
            .inc();
        if run == Run::Done {
            *decided = Some(Instant::now());
        }
        Ok(run)
    }

    /// The decided outcome of `entry`, if any.
    async fn read(
        &self,
        redis: &RedisClient,
        keys: &SaleKeys,
        entry: u64,
    ) -> Result<Option<Outcome>, NotSettled> {
        let value: Option<String> = redis
            .call(|mut conn| async move {
                redis::AsyncCommands::hget(&mut conn, &keys.draw.outcomes, entry).await
            })
            .await?;
        value
            .map(|v| serde_json::from_str(&v).map_err(|e| NotSettled::BadReply(e.to_string())))
            .transpose()
    }
}

/// Sleeps the next step of `backoff` (doubling it up to [`MAX_BACKOFF`]),
/// never past `deadline`.
async fn back_off(deadline: Instant, backoff: &mut Duration) {
    tokio::time::sleep((*backoff).min(deadline.saturating_duration_since(Instant::now()))).await;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
}

/// A Redis error while an entrant is held: the entry is still decided by
/// whoever reaches Redis, so a blip (a timeout under load, a reconnect, the
/// breaker open for its cooldown) must not cost the buyer its answer. It
/// is retried after the backoff until `deadline` (the window's close plus
/// `fairness.settle_ms`), and only then answered. Any other error (a
/// script error, `WRONGTYPE`, a bad reply: see [`RedisError::is_transient`])
/// would come back the same, so it is answered at once. A retried error
/// is kept in `last`: the caller answers it if the deadline passes before
/// a call succeeds.
async fn retry_after(
    error: NotSettled,
    deadline: Instant,
    backoff: &mut Duration,
    last: &mut Option<NotSettled>,
) -> Result<(), NotSettled> {
    if !is_transient(&error) || Instant::now() >= deadline {
        return Err(error);
    }
    debug!(%error, "draw: Redis failed while an entrant is held; retrying");
    back_off(deadline, backoff).await;
    *last = Some(error);
    Ok(())
}

/// Whether a held entrant's error may go away if the call is sent again.
fn is_transient(error: &NotSettled) -> bool {
    matches!(error, NotSettled::Redis(e) if e.is_transient())
}

/// One `lua/draw_run.lua` call on `sale_id`'s keys: decides up to `chunk`
/// entrants, fixing `seed` if it is the first call after the window.
pub(crate) fn draw_run_call<'a>(
    script: &'a redis::Script,
    keys: &SaleKeys,
    sale_id: &str,
    seed: &str,
    chunk: u32,
    idempotency_ttl_seconds: u64,
) -> redis::ScriptInvocation<'a> {
    let d = &keys.draw;
    let mut invocation = script.prepare_invoke();
    invocation
        .key(&keys.meta)
        .key(&keys.remaining)
        .key(&keys.buyers)
        .key(&keys.stream)
        .key(&keys.reservations)
        .key(&keys.synced)
        .key(&d.state)
        .key(&d.entries)
        .key(&d.outcomes)
        .key(&d.perm)
        .key(&d.order)
        .key(&d.index)
        .arg(seed)
        .arg(chunk)
        .arg(idempotency_ttl_seconds)
        .arg(sale_id)
        .arg(MISSES_REMEMBERED_PER_USER)
        .arg(&d.prefix);
    invocation
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(o: &str, d: &str) -> Outcome {
        Outcome {
            outcome: o.into(),
            detail: d.into(),
            ts: 1700,
            node: Some("ab".into()),
            user: "u".into(),
            rid: "s.1".into(),
        }
    }

    #[test]
    fn another_entrants_outcome_is_not_taken() {
        let o = outcome("won", "s.1");
        assert!(Entrant {
            user: "u",
            rid: Some("s.1")
        }
        .owns(&o));
        assert!(
            Entrant {
                user: "u",
                rid: None
            }
            .owns(&o),
            "a re-send that joined knows only the user"
        );
        assert!(
            !Entrant {
                user: "u",
                rid: Some("s.2")
            }
            .owns(&o),
            "entry number reused after a failover"
        );
        assert!(!Entrant {
            user: "v",
            rid: None
        }
        .owns(&o));
    }

    #[test]
    fn only_errors_that_may_pass_are_retried_while_held() {
        let server = |kind, text: &'static str| {
            NotSettled::Redis(RedisError::Redis(redis::RedisError::from((kind, text))))
        };
        let code = |code: &str| {
            NotSettled::Redis(RedisError::Redis(redis::make_extension_error(
                code.to_owned(),
                Some("try later".to_owned()),
            )))
        };
        let io = NotSettled::Redis(RedisError::Redis(
            std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
        ));
        assert!(is_transient(&NotSettled::Redis(RedisError::Timeout(
            Duration::from_millis(300)
        ))));
        assert!(is_transient(&NotSettled::Redis(RedisError::CircuitOpen)));
        assert!(is_transient(&io));
        assert!(is_transient(&code("BUSY")), "a script still running");
        for kind in [
            redis::ServerErrorKind::BusyLoading,
            redis::ServerErrorKind::TryAgain,
            redis::ServerErrorKind::MasterDown,
            redis::ServerErrorKind::ReadOnly,
            redis::ServerErrorKind::ClusterDown,
        ] {
            assert!(
                is_transient(&server(redis::ErrorKind::Server(kind), "later")),
                "{kind:?}"
            );
        }
        assert!(!is_transient(&server(
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "WRONGTYPE"
        )));
        assert!(!is_transient(&code("WRONGTYPE")));
        assert!(!is_transient(&server(
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR user_script:1: bad"
        )));
        assert!(!is_transient(&NotSettled::BadReply("x".into())));
        assert!(!is_transient(&NotSettled::TimedOut));
    }
}
