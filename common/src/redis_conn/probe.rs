//! `flashgate check --connect`: does the deployment answer as `redis.mode`
//! says it should?
//!
//! - standalone: `PING` on `redis.url`, and it loads every script
//!   (`SCRIPT LOAD` of [`crate::scripts::ALL`]);
//! - cluster: `CLUSTER INFO` says `cluster_state:ok` on every seed node, and
//!   every master loads every script;
//! - sentinel: a sentinel knows `redis.master_name`, the address it gives
//!   answers `ROLE` as a master, and loads every script;
//! - with `redis.wait_replicas` set, in every mode: each master has at
//!   least that many connected replicas (`INFO replication`
//!   `connected_slaves`), else no win could ever be answered.
//!
//! In every mode each master must let a script read `INFO replication`:
//! the failover fence (`lua/deduct_batch.lua`) compares the replication id there
//! with the one a sale was synced on, so a Redis ACL user without `+info`
//! could sell nothing.
//!
//! Each problem names the key or the node it is about.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use super::{ClusterHandle, RedisHandle};
use crate::config::{RedisConfig, RedisTarget};

/// A deployment that does not answer as its mode expects; the message names
/// the key or node.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProbeError(String);

/// Connects per the mode and checks the deployment; answers what was found,
/// one line per node.
///
/// # Errors
/// The first problem found, naming its key or node.
pub async fn probe(config: &RedisConfig) -> Result<Vec<String>, ProbeError> {
    let timeout = config.timeout.max(Duration::from_secs(1));
    match &config.target {
        RedisTarget::Standalone { url } => {
            let mut conn = node(url, config.ca_file.as_deref(), timeout)
                .await
                .map_err(|e| ProbeError(format!("redis.url: {url}: {e}")))?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map_err(|e| ProbeError(format!("redis.url: {url}: PING: {e}")))?;
            load_every_script(&mut conn, &format!("redis.url: {url}")).await?;
            let replid = fence_reads(&mut conn, url).await?;
            let mut found = vec![format!(
                "{url}: answers PING, every script loaded, replication id {replid}"
            )];
            if config.wait_replicas > 0 {
                let info = redis::cmd("INFO")
                    .arg("replication")
                    .query_async::<String>(&mut conn)
                    .await;
                found.push(enough_replicas(url, info, config.wait_replicas)?);
            }
            Ok(found)
        }
        RedisTarget::Cluster { nodes } => cluster(nodes, config, timeout).await,
        RedisTarget::Sentinel {
            sentinels,
            master_name,
        } => sentinel(sentinels, master_name, config, timeout).await,
    }
}

/// Whether the master at `master` (its `INFO replication`) has the
/// `wanted` replicas a win waits for.
fn enough_replicas(
    master: &str,
    info: redis::RedisResult<String>,
    wanted: u32,
) -> Result<String, ProbeError> {
    let info = info.map_err(|e| ProbeError(format!("master {master}: INFO replication: {e}")))?;
    let connected = connected_replicas(&info);
    if connected < wanted {
        return Err(ProbeError(format!(
            "redis.wait_replicas: master {master} has {connected} connected replicas, fewer than the {wanted} every win waits for"
        )));
    }
    Ok(format!(
        "master {master}: {connected} connected replicas (redis.wait_replicas = {wanted})"
    ))
}

/// `connected_slaves` of an `INFO replication` answer (0 when absent).
fn connected_replicas(info: &str) -> u32 {
    info.lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A plain connection to one node (TLS for `rediss://`, trusting `ca_file`
/// too when given).
async fn node(
    url: &str,
    ca_file: Option<&std::path::Path>,
    timeout: Duration,
) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    super::tls::client(url, ca_file)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

async fn cluster(
    nodes: &[String],
    config: &RedisConfig,
    timeout: Duration,
) -> Result<Vec<String>, ProbeError> {
    let ca_file = config.ca_file.as_deref();
    let wait_replicas = config.wait_replicas;
    let mut found = Vec::new();
    for (i, url) in nodes.iter().enumerate() {
        let key = format!("redis.nodes[{i}]");
        let mut conn = node(url, ca_file, timeout)
            .await
            .map_err(|e| ProbeError(format!("{key}: {url}: {e}")))?;
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut conn)
            .await
            .map_err(|e| {
                ProbeError(format!(
                    "{key}: {url}: CLUSTER INFO: {e} (is it a cluster node?)"
                ))
            })?;
        let state = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("cluster_state:"))
            .unwrap_or("unknown");
        if state != "ok" {
            return Err(ProbeError(format!(
                "{key}: {url}: cluster_state:{state}, not ok"
            )));
        }
        found.push(format!("{url}: cluster_state:ok"));
    }
    let mut conn = RedisHandle::Cluster(
        ClusterHandle::connect(nodes, ca_file, timeout, timeout)
            .await
            .map_err(|e| ProbeError(format!("redis.nodes: no seed node answers: {e}")))?,
    );
    let mut masters = std::collections::BTreeSet::new();
    for script in crate::scripts::ALL {
        let name = script.name();
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(script.body());
        let replies = conn.each_master(&load).await.map_err(|e| {
            ProbeError(format!(
                "redis.nodes: SCRIPT LOAD {name} on every master: {e}"
            ))
        })?;
        for (master, reply) in replies {
            reply.map_err(|e| {
                ProbeError(format!("cluster master {master}: SCRIPT LOAD {name}: {e}"))
            })?;
            masters.insert(master);
        }
    }
    let replies = conn.each_master(&fence_script()).await.map_err(|e| {
        ProbeError(format!(
            "redis.nodes: the fence's read of INFO replication on every master: {e}"
        ))
    })?;
    for (master, reply) in replies {
        reply.map_err(|e| fence_error(&format!("cluster master {master}"), &e))?;
    }
    found.extend(
        masters
            .into_iter()
            .map(|m| format!("master {m}: every script loaded, scripts read INFO")),
    );
    if wait_replicas > 0 {
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let replies = conn.each_master(&info).await.map_err(|e| {
            ProbeError(format!(
                "redis.nodes: INFO replication on every master: {e}"
            ))
        })?;
        for (master, reply) in replies {
            let text = reply.and_then(|v| redis::from_redis_value::<String>(v).map_err(Into::into));
            found.push(enough_replicas(&master, text, wait_replicas)?);
        }
    }
    Ok(found)
}

async fn sentinel(
    sentinels: &[String],
    master_name: &str,
    config: &RedisConfig,
    timeout: Duration,
) -> Result<Vec<String>, ProbeError> {
    let ca_file = config.ca_file.as_deref();
    let wait_replicas = config.wait_replicas;
    let mut found = Vec::new();
    let mut master = None;
    for (i, url) in sentinels.iter().enumerate() {
        let key = format!("redis.sentinels[{i}]");
        let mut conn = node(url, ca_file, timeout)
            .await
            .map_err(|e| ProbeError(format!("{key}: {url}: {e}")))?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master_name)
            .query_async(&mut conn)
            .await
            .map_err(|e| {
                ProbeError(format!(
                    "{key}: {url}: SENTINEL GET-MASTER-ADDR-BY-NAME: {e} (is it a sentinel?)"
                ))
            })?;
        let Some((host, port)) = addr else {
            return Err(ProbeError(format!(
                "redis.master_name: sentinel {url} does not know a master named `{master_name}`"
            )));
        };
        found.push(format!("sentinel {url}: `{master_name}` is {host}:{port}"));
        master.get_or_insert((host, port));
    }
    let Some((host, port)) = master else {
        return Err(ProbeError("redis.sentinels: no sentinel given".into()));
    };
    // The primary is reached as the sentinels are: TLS when they are.
    let scheme = if sentinels.iter().any(|s| s.starts_with("rediss://")) {
        "rediss"
    } else {
        "redis"
    };
    let url = format!("{scheme}://{host}:{port}/");
    let mut conn = node(&url, ca_file, timeout).await.map_err(|e| {
        ProbeError(format!(
            "redis.master_name: master `{master_name}` at {host}:{port}: {e}"
        ))
    })?;
    let role: Vec<Value> = redis::cmd("ROLE")
        .query_async(&mut conn)
        .await
        .map_err(|e| {
            ProbeError(format!(
                "redis.master_name: master `{master_name}` at {host}:{port}: ROLE: {e}"
            ))
        })?;
    let role = match role.first() {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        other => format!("{other:?}"),
    };
    if role != "master" {
        return Err(ProbeError(format!(
            "redis.master_name: `{master_name}` at {host}:{port} answers ROLE {role}, not master"
        )));
    }
    load_every_script(&mut conn, &format!("master {host}:{port}")).await?;
    let replid = fence_reads(&mut conn, &format!("master {host}:{port}")).await?;
    found.push(format!(
        "master {host}:{port}: ROLE master, every script loaded, replication id {replid}"
    ));
    if wait_replicas > 0 {
        let info = redis::cmd("INFO")
            .arg("replication")
            .query_async::<String>(&mut conn)
            .await;
        found.push(enough_replicas(
            &format!("{host}:{port}"),
            info,
            wait_replicas,
        )?);
    }
    Ok(found)
}

/// What the fence runs inside the deduct script, on its own
/// (`lua/fence_read.lua`).
fn fence_script() -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(crate::scripts::FENCE_READ.body()).arg(0);
    cmd
}

/// Loads every script of [`crate::scripts::ALL`] on the master `conn`
/// reaches (`node` names it in errors).
async fn load_every_script(conn: &mut MultiplexedConnection, node: &str) -> Result<(), ProbeError> {
    for script in crate::scripts::ALL {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.body())
            .query_async::<String>(conn)
            .await
            .map_err(|e| ProbeError(format!("{node}: SCRIPT LOAD {}: {e}", script.name())))?;
    }
    Ok(())
}

fn fence_error(node: &str, e: &redis::RedisError) -> ProbeError {
    ProbeError(format!("{node}: a script cannot read INFO replication ({e}); the failover fence needs it: grant the Redis user +info"))
}

/// Runs the fence's read of the replication id on `conn`; answers the id.
async fn fence_reads(conn: &mut MultiplexedConnection, node: &str) -> Result<String, ProbeError> {
    fence_script()
        .query_async::<String>(conn)
        .await
        .map_err(|e| fence_error(node, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_replicas_name_the_key_and_the_count() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=7001,state=online\r\n";
        assert_eq!(connected_replicas(info), 1);
        assert!(enough_replicas("m:1", Ok(info.into()), 1).is_ok());
        let err = enough_replicas("m:1", Ok(info.into()), 2)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "redis.wait_replicas: master m:1 has 1 connected replicas, fewer than the 2"
            ),
            "{err}"
        );
        assert_eq!(connected_replicas("role:master\r\n"), 0);
    }
}
