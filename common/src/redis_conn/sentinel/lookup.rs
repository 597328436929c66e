//! Which node is the primary: asked of the sentinels as the Sentinel client
//! guidelines say, and as the redis crate's `SentinelClient` does. Each
//! sentinel, in the configured order (up to three at once), is asked for
//! its masters (`SENTINEL MASTERS`); the one named `redis.master_name`,
//! flagged master and neither `s_down` nor `o_down`, is the primary if it
//! answers `ROLE` as a master. A sentinel that does not know the name, or
//! whose master fails the check, does not end the search; when none yields
//! a primary, an error met on a named master (it can be acted on) is
//! returned before a "not found".
//!
//! Ours rather than the crate's: on native-tls the crate reaches the master
//! it checks and hands out with the system's roots only, whatever the
//! sentinels' URLs carry. Here every node's client trusts [`Roots`] (the
//! system's and `redis.ca_file`'s; see [`super::super::tls`]).

use std::collections::HashMap;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    RedisError, RedisResult, Role,
};

use super::super::tls::Roots;

/// Sentinels asked at once, so that one that does not answer does not hold
/// up a lookup by its connection timeout.
const AT_ONCE: usize = 3;

/// The sentinels of one master, with a connection to each kept between
/// lookups.
pub(in crate::redis_conn) struct Lookup {
    /// Each sentinel's address, trusting the roots.
    sentinels: Vec<ConnectionInfo>,
    /// A connection to each sentinel, once one answered.
    cached: Vec<Option<MultiplexedConnection>>,
    master_name: String,
    /// Whether the primary is reached over TLS: when the sentinels are (a
    /// sentinel names only an address).
    tls: bool,
    roots: Roots,
    /// The bounds of a sentinel's answer and of a master's `ROLE` check.
    config: AsyncConnectionConfig,
}

impl Lookup {
    /// Asks `sentinels` for `master_name`; `rediss://` ones and the primary
    /// they name are verified against `roots`.
    ///
    /// # Errors
    /// No sentinel, or a bad URL.
    pub(in crate::redis_conn) fn new(
        sentinels: &[String],
        master_name: &str,
        roots: Roots,
    ) -> RedisResult<Self> {
        if sentinels.is_empty() {
            return Err((ErrorKind::EmptySentinelList, "no sentinel given").into());
        }
        let infos = sentinels
            .iter()
            .map(|url| Ok(roots.apply(url.as_str().into_connection_info()?)))
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Self {
            tls: infos
                .iter()
                .any(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. })),
            cached: infos.iter().map(|_| None).collect(),
            sentinels: infos,
            master_name: master_name.to_owned(),
            roots,
            // The crate's defaults, which its lookup used: 1 s to connect,
            // 500 ms for an answer.
            config: AsyncConnectionConfig::new(),
        })
    }

    /// A client for the primary, checked to be one.
    ///
    /// # Errors
    /// No sentinel answers, none knows an up master of that name, or the
    /// master named cannot be reached or is not one.
    pub(in crate::redis_conn) async fn primary(&mut self) -> RedisResult<Client> {
        let Self {
            sentinels,
            cached,
            master_name,
            tls,
            roots,
            config,
        } = self;
        let (master_name, tls, roots, config) = (&*master_name, *tls, &*roots, &*config);
        // Collected first: the futures are lazy, `buffered` runs at most
        // `AT_ONCE` of them, and the lookup stays `Send`.
        let lookups: Vec<_> = sentinels
            .iter()
            .zip(cached.iter_mut())
            .map(|(sentinel, cached)| async move {
                let masters = ask(sentinel, cached, config).await?;
                Ok::<_, RedisError>(checked_master(masters, master_name, tls, roots, config).await)
            })
            .collect();
        let mut lookups = futures_util::stream::iter(lookups).buffered(AT_ONCE);
        let mut master_err = None;
        let mut last_err = None;
        while let Some(lookup) = lookups.next().await {
            match lookup {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) if e.kind() != ErrorKind::MasterNameNotFoundBySentinel => {
                    master_err = Some(e);
                }
                Ok(Err(e)) | Err(e) => last_err = Some(e),
            }
        }
        Err(master_err.or(last_err).unwrap_or_else(not_found))
    }
}

/// `SENTINEL MASTERS` of one sentinel, on its kept connection; a connection
/// that failed is replaced once.
async fn ask(
    sentinel: &ConnectionInfo,
    cached: &mut Option<MultiplexedConnection>,
    config: &AsyncConnectionConfig,
) -> RedisResult<Vec<HashMap<String, String>>> {
    let mut masters = redis::cmd("SENTINEL");
    masters.arg("MASTERS");
    if let Some(conn) = cached {
        match masters.query_async(conn).await {
            Err(e) if e.is_io_error() || e.is_unrecoverable_error() => *cached = None,
            answer => return answer,
        }
    }
    let mut conn = Client::open(sentinel.clone())?
        .get_multiplexed_async_connection_with_config(config)
        .await?;
    let answer = masters.query_async(&mut conn).await?;
    *cached = Some(conn);
    Ok(answer)
}

/// The client of the master named `master_name` in a sentinel's `masters`,
/// if it is up and answers `ROLE` as a master.
async fn checked_master(
    masters: Vec<HashMap<String, String>>,
    master_name: &str,
    tls: bool,
    roots: &Roots,
    config: &AsyncConnectionConfig,
) -> RedisResult<Client> {
    for (host, port) in masters.iter().filter_map(|m| up_master(m, master_name)) {
        let addr = if tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        let client = roots.client(addr)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        let role: Role = redis::cmd("ROLE").query_async(&mut conn).await?;
        if matches!(role, Role::Primary { .. }) {
            return Ok(client);
        }
    }
    Err(not_found())
}

/// The address of `master` if it is `name`, flagged master and not down.
fn up_master(master: &HashMap<String, String>, name: &str) -> Option<(String, u16)> {
    let flags = master.get("flags")?;
    let up = master.get("name").is_some_and(|n| n == name)
        && flags.contains("master")
        && !flags.contains("s_down")
        && !flags.contains("o_down");
    if !up {
        return None;
    }
    Some((master.get("ip")?.clone(), master.get("port")?.parse().ok()?))
}

fn not_found() -> RedisError {
    (
        ErrorKind::MasterNameNotFoundBySentinel,
        "no sentinel names an up master of that name",
    )
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(name: &str, flags: &str) -> HashMap<String, String> {
        [
            ("name", name),
            ("ip", "10.0.0.1"),
            ("port", "6380"),
            ("flags", flags),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    #[test]
    fn only_an_up_master_of_the_name_is_a_candidate() {
        let at = Some(("10.0.0.1".to_owned(), 6380));
        assert_eq!(up_master(&master("m", "master"), "m"), at);
        assert_eq!(up_master(&master("m", "master,disconnected"), "m"), at);
        assert_eq!(up_master(&master("other", "master"), "m"), None);
        assert_eq!(up_master(&master("m", "master,s_down"), "m"), None);
        assert_eq!(up_master(&master("m", "master,s_down,o_down"), "m"), None);
        assert_eq!(up_master(&master("m", "slave"), "m"), None);
        let mut no_port = master("m", "master");
        no_port.insert("port".into(), "x".into());
        assert_eq!(up_master(&no_port, "m"), None);
    }

    #[test]
    fn the_sentinels_scheme_decides_tls_to_the_primary() {
        let tls = Lookup::new(&["rediss://10.0.0.1:26379".into()], "m", Roots::default());
        assert!(tls.unwrap().tls);
        let plain = Lookup::new(&["redis://10.0.0.1:26379".into()], "m", Roots::default());
        assert!(!plain.unwrap().tls);
        let none = Lookup::new(&[], "m", Roots::default()).err().unwrap();
        assert_eq!(none.kind(), ErrorKind::EmptySentinelList);
    }
}
