//! The subscription to sale events ([`crate::keys::EVENTS_CHANNEL`]), on a
//! connection of its own in every mode.
//!
//! - standalone: a pub/sub connection to `redis.url`;
//! - sentinel: a pub/sub connection to the primary the sentinels name
//!   (after a failover the connection drops and the listener subscribes
//!   again, to the new primary);
//! - cluster: a RESP3 cluster connection with a push channel. A plain
//!   `PUBLISH` reaches every node of a cluster, and the crate subscribes
//!   again by itself after a reconnect or a slot move, so the subscription
//!   follows failovers.
//!
//! Messages published while no subscription stands are lost: listeners keep
//! what they learn from events with a TTL of their own.

use futures_util::StreamExt;
use redis::aio::PubSubStream;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use super::cluster::NodeConnection;
use crate::config::{RedisConfig, RedisTarget};

/// A standing subscription to one channel.
pub struct EventSubscription {
    inner: Inner,
}

enum Inner {
    Node(PubSubStream),
    Cluster {
        /// Dropping it ends the subscription.
        _conn: ClusterConnection<NodeConnection>,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
    },
}

impl EventSubscription {
    /// Subscribes to `channel` on the configured deployment.
    ///
    /// # Errors
    /// The deployment does not answer, or refuses the subscription.
    pub async fn subscribe(config: &RedisConfig, channel: &str) -> RedisResult<Self> {
        let inner = match &config.target {
            RedisTarget::Standalone { url } => {
                let mut pubsub = super::tls::client(url, config.ca_file.as_deref())?
                    .get_async_pubsub()
                    .await?;
                pubsub.subscribe(channel).await?;
                Inner::Node(pubsub.into_on_message())
            }
            RedisTarget::Sentinel {
                sentinels,
                master_name,
            } => {
                let mut pubsub =
                    super::sentinel::primary(sentinels, master_name, config.ca_file.as_deref())
                        .await?
                        .get_async_pubsub()
                        .await?;
                pubsub.subscribe(channel).await?;
                Inner::Node(pubsub.into_on_message())
            }
            RedisTarget::Cluster { nodes } => {
                let (sender, pushes) = mpsc::unbounded_channel();
                let timeout = config.timeout.max(std::time::Duration::from_secs(1));
                let builder = super::cluster::builder(nodes, timeout, timeout)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(sender);
                let client = super::cluster::build(builder, config.ca_file.as_deref())?;
                let mut conn = super::cluster::connect(&client).await?;
                conn.subscribe(channel).await?;
                Inner::Cluster {
                    _conn: conn,
                    pushes,
                }
            }
        };
        Ok(Self { inner })
    }

    /// The next message's payload; `None` when the subscription has ended
    /// (subscribe again). A payload that is not text is skipped.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            match &mut self.inner {
                Inner::Node(stream) => {
                    let msg = stream.next().await?;
                    if let Ok(payload) = msg.get_payload::<String>() {
                        return Some(payload);
                    }
                }
                Inner::Cluster { pushes, .. } => {
                    let push = pushes.recv().await?;
                    if push.kind != PushKind::Message {
                        continue;
                    }
                    // [channel, payload]
                    if let Some(Value::BulkString(payload)) = push.data.into_iter().nth(1) {
                        if let Ok(payload) = String::from_utf8(payload) {
                            return Some(payload);
                        }
                    }
                }
            }
        }
    }
}
