//! The cluster mode: the redis crate's `ClusterConnection`, tuned for a buy
//! path, plus the two things it leaves to its user (see the parent module):
//! `NOSCRIPT` answered with `EVAL`, and pipelines that span slots. Its node
//! connections are [`NodeConnection`]s, which trust `redis.ca_file` too
//! (see [`super::tls`]).
//!
//! The crate retries a call on `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` or
//! a reconnected node (`RETRIES` times, 20 to 200 ms apart, each try cut
//! at `redis.timeout_ms` and the whole call at `OVERALL_TIMEOUTS` times
//! it), and re-sends a call whose connection dropped. That is safe for a
//! deduct: a buy with an Idempotency-Key replays its first outcome (the key
//! is recorded in the sale's slot), and a buy without one carries a nonce
//! of its call (`fg:{sale:ID}:call:USER:NONCE`, written only by a win), so
//! the call re-sent answers the win it made instead of taking a second
//! item or meeting the per-user limit.

use std::path::Path;
use std::time::Duration;

use futures_util::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::{ClusterConnection, Connect};
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    Arg, AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

use super::tls;

/// Retries of one call (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, a node
/// reconnected): enough to ride out a failover's slot-map refresh, few
/// enough that a buyer is answered within the gateway's bound.
const RETRIES: u32 = 4;
/// Shortest and longest wait between retries, in ms. The crate's default
/// starts at 1280 ms, far beyond a buy's time budget.
const MIN_RETRY_WAIT_MS: u64 = 20;
const MAX_RETRY_WAIT_MS: u64 = 200;
/// The overall bound of one call, retries included, in response timeouts.
const OVERALL_TIMEOUTS: u32 = 3;

/// A cluster connection: one driver task, one multiplexed connection per
/// node; clones share it.
#[derive(Clone)]
pub struct ClusterHandle {
    conn: ClusterConnection<NodeConnection>,
}

impl ClusterHandle {
    /// Connects through the first seed node that answers; `rediss://` nodes
    /// are verified against the system's roots and those of `ca_file`.
    ///
    /// # Errors
    /// A bad URL, a `ca_file` that cannot be used, or no seed node answers.
    pub async fn connect(
        nodes: &[String],
        ca_file: Option<&Path>,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<Self> {
        let client = build(
            builder(nodes, connection_timeout, response_timeout),
            ca_file,
        )?;
        let conn = connect(&client).await?;
        Ok(Self { conn })
    }

    pub(super) async fn on_master_of(&mut self, key: &str, cmd: &Cmd) -> RedisResult<Value> {
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
            key,
            SlotAddr::Master,
        )));
        self.conn
            .route_command(cmd.clone(), route)
            .await
            .and_then(Value::extract_error)
    }

    pub(super) async fn pipeline_on_master_of(
        &mut self,
        key: &str,
        pipe: &redis::Pipeline,
    ) -> RedisResult<Vec<Value>> {
        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
        self.conn
            .route_pipeline(pipe.clone(), 0, pipe.len(), route)
            .await
    }

    pub(super) async fn ping_masters(&mut self, ping: &Cmd) -> RedisResult<()> {
        let route = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::AllSucceeded),
        ));
        self.conn.route_command(ping.clone(), route).await.map(drop)
    }

    pub(super) async fn each_master(
        &mut self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        let route = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // Without a response policy the crate answers a map: node -> reply.
        let Value::Map(replies) = self.conn.route_command(cmd.clone(), route).await? else {
            return Err((
                ErrorKind::Client,
                "the cluster answered a fan-out without a node map",
            )
                .into());
        };
        Ok(replies
            .into_iter()
            .map(|(node, reply)| {
                let node = match node {
                    Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                    other => format!("{other:?}"),
                };
                let reply = match reply {
                    Value::ServerError(e) => Err(e.into()),
                    v => Ok(v),
                };
                (node, reply)
            })
            .collect())
    }
}

/// The client settings of a cluster connection.
pub(super) fn builder(
    nodes: &[String],
    connection_timeout: Duration,
    response_timeout: Duration,
) -> ClusterClientBuilder {
    ClusterClientBuilder::new(nodes.to_vec())
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS)
        .connection_timeout(connection_timeout)
        .response_timeout(response_timeout)
        .overall_response_timeout(Some(response_timeout * OVERALL_TIMEOUTS))
}

/// The client of `builder`, whose node connections trust `ca_file` too.
///
/// # Errors
/// A bad URL, or a `ca_file` that cannot be used.
pub(super) fn build(
    builder: ClusterClientBuilder,
    ca_file: Option<&Path>,
) -> RedisResult<ClusterClient> {
    tls::fix_cluster_roots(ca_file)?;
    builder.build()
}

/// A connection of `client` (built by [`build`]) to the cluster.
///
/// # Errors
/// No seed node answers.
pub(super) async fn connect(
    client: &ClusterClient,
) -> RedisResult<ClusterConnection<NodeConnection>> {
    client
        .get_async_generic_connection::<NodeConnection>()
        .await
}

/// A connection to one cluster node: the crate's multiplexed connection,
/// made with the roots of the process's cluster clients
/// ([`tls::cluster_roots`]) in its address. The crate gives a node's
/// connection no roots of its own on native-tls.
#[derive(Clone)]
pub(super) struct NodeConnection(MultiplexedConnection);

impl Connect for NodeConnection {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        async move {
            let client = tls::cluster_roots().client(info)?;
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok(Self(conn))
        }
        .boxed()
    }
}

impl ConnectionLike for NodeConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// The first argument of `cmd` (its name), if it is `name`.
fn is_command(cmd: &Cmd, name: &[u8]) -> bool {
    matches!(cmd.args_iter().next(), Some(Arg::Simple(first)) if first.eq_ignore_ascii_case(name))
}

/// `EVAL <body>` with the arguments of an `EVALSHA` (numkeys, keys, args),
/// when its script is one of ours.
fn eval_of(evalsha: &Cmd) -> Option<Cmd> {
    let mut args = evalsha.args_iter().skip(1);
    let Some(Arg::Simple(sha)) = args.next() else {
        return None;
    };
    let body = crate::scripts::by_hash(sha)?.body();
    let mut eval = redis::cmd("EVAL");
    eval.arg(body);
    for arg in args {
        if let Arg::Simple(a) = arg {
            eval.arg(a);
        }
    }
    Some(eval)
}

impl ConnectionLike for ClusterHandle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !is_command(cmd, b"EVALSHA") {
            return self.conn.req_packed_command(cmd);
        }
        async move {
            let reply = self.conn.req_packed_command(cmd).await;
            // A refusal comes back as an error or as an error value.
            let no_script = match &reply {
                Err(e) => e.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
                Ok(Value::ServerError(e)) => e.kind() == Some(ServerErrorKind::NoScript),
                Ok(_) => false,
            };
            // Routed by the same first key, so it lands on the master that
            // lacked the script, which caches it for the next EVALSHA.
            match eval_of(cmd) {
                Some(eval) if no_script => self.conn.req_packed_command(&eval).await,
                _ => reply,
            }
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        async move {
            match self.conn.req_packed_commands(pipeline, offset, count).await {
                // The crate refuses a pipeline on several slots before sending
                // anything. Plain commands are then sent one by one, side by
                // side and in order (the driver still pipelines those bound
                // for one node); a transaction stays refused.
                Err(e)
                    if e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot)
                        && !pipeline.is_transaction() =>
                {
                    let calls = pipeline.cmd_iter().map(|cmd| {
                        let mut conn = self.conn.clone();
                        async move { conn.req_packed_command(cmd).await }
                    });
                    let replies = futures_util::future::try_join_all(calls).await?;
                    Ok(replies.into_iter().skip(offset).take(count).collect())
                }
                other => other,
            }
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evalsha_of_our_script_becomes_an_eval_with_the_same_keys_and_arguments() {
        let script = crate::scripts::ALL[1];
        let body = script.body();
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(2)
            .arg("fg:{sale:1}:meta")
            .arg("fg:{sale:1}:remaining")
            .arg("u1")
            .arg(3);
        let eval = eval_of(&evalsha).unwrap();
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                Arg::Simple(a) => a.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let expected: Vec<Vec<u8>> = [
            b"EVAL".as_slice(),
            body.as_bytes(),
            b"2",
            b"fg:{sale:1}:meta",
            b"fg:{sale:1}:remaining",
            b"u1",
            b"3",
        ]
        .iter()
        .map(|a| a.to_vec())
        .collect();
        assert_eq!(args, expected);
        let mut unknown = redis::cmd("EVALSHA");
        unknown.arg("0123").arg(0);
        assert!(
            eval_of(&unknown).is_none(),
            "a script we do not ship is not guessed"
        );
    }
}
