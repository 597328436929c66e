//! Delivery to an AMQP 0-9-1 exchange (RabbitMQ), through `lapin`: the
//! backend declares the exchange (durable, topic) and publishes each event
//! persistent (delivery mode 2) with its id as `message_id` and its type
//! as `type`, on a channel in confirm mode; an event counts as delivered
//! only once the broker acks it. A nack, a closed channel or a lost
//! connection is a failed attempt, and the connection is made again on
//! the next one.
//!
//! The exchange routes by the routing key of the event type
//! (`events.routing_key_*`); the shop binds its durable queue to it. Each
//! message is published `mandatory`: one that no queue is bound for comes
//! back (acked, but returned) and counts as a failed attempt, so the event
//! stays in the outbox until the shop binds its queue.
//!
//! An `amqps://` URL is reached over TLS (lapin's native-tls: the system's
//! OpenSSL), the broker's certificate verified against the system's roots
//! and `events.ca_file` (see [`super::tls`]) for the URL's host: its name,
//! or its IP address, which the certificate must then list.
//!
//! The TCP connect and the TLS handshake are bounded by the send timeout:
//! lapin runs them on a thread of its own per connection, which a broker
//! that accepts and then stays silent would otherwise hold (with its
//! socket) for good, one more per attempt.

use flashgate_common::config::AmqpConfig;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::{AMQPUriTcpExt, OwnedTLSConfig};
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::sync::Mutex;

use super::tls::{self, ExtraRoots};
use crate::store::outbox::{EventType, OutboxEvent};

/// Why an event did not reach the exchange.
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    #[error("amqp: {0}")]
    Lapin(lapin::Error),
    /// The TLS handshake with the broker failed: OpenSSL's reason.
    #[error("amqp TLS handshake failed: {0}")]
    Tls(String),
    #[error("amqp broker refused the message (nack)")]
    Nack,
    #[error("amqp broker did not confirm in time")]
    Timeout,
    /// The TCP connect and TLS handshake did not finish within the send
    /// timeout (a broker that accepts and never answers).
    #[error("amqp connection (TCP connect and TLS handshake) timed out")]
    ConnectTimeout,
    /// `events.amqp_url` does not parse (validated at start, so unlikely).
    #[error("amqp: events.amqp_url is not a valid AMQP URL")]
    BadUrl,
    #[error("amqp broker returned the message: no queue is bound for it ({code} {text})")]
    Unroutable { code: u16, text: String },
}

impl From<lapin::Error> for AmqpError {
    fn from(e: lapin::Error) -> Self {
        if let Some(reason) = tls::handshake_failure(&e) {
            return AmqpError::Tls(reason);
        }
        if let lapin::ErrorKind::IOError(io) = e.kind() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<ConnectTimedOut>())
            {
                return AmqpError::ConnectTimeout;
            }
        }
        AmqpError::Lapin(e)
    }
}

/// The marker error of a connect bounded by [`Amqp::channel`].
#[derive(Debug, thiserror::Error)]
#[error("connect timed out")]
struct ConnectTimedOut;

/// `url` as lapin's [`AMQPUri`], with an IP address kept as the host:
/// lapin's parser takes the host from the URL's domain only and puts
/// `localhost` in place of an IP address.
///
/// # Errors
/// The URL does not parse.
fn amqp_uri(url: &str) -> Result<AMQPUri, AmqpError> {
    let mut uri: AMQPUri = url.parse().map_err(|_| AmqpError::BadUrl)?;
    let parsed = reqwest::Url::parse(url).map_err(|_| AmqpError::BadUrl)?;
    let host = parsed.host_str().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        uri.authority.host = ip.to_string();
    }
    Ok(uri)
}

impl AmqpError {
    /// Whether the TLS handshake failed (often a configuration mistake:
    /// a private CA missing from `events.ca_file`).
    pub fn is_tls(&self) -> bool {
        matches!(self, AmqpError::Tls(_))
    }
}

/// A publisher to the configured exchange; connects on first use and
/// again after a failure.
pub struct Amqp {
    config: AmqpConfig,
    /// For `amqps://`: the extra roots (the system's are always trusted).
    tls: OwnedTLSConfig,
    link: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("exchange", &self.config.exchange)
            .finish_non_exhaustive()
    }
}

impl Amqp {
    /// A publisher trusting the system's roots and `extra_roots` (used
    /// only for an `amqps://` URL).
    pub fn new(config: AmqpConfig, extra_roots: Option<&ExtraRoots>) -> Self {
        let tls = OwnedTLSConfig {
            identity: None,
            cert_chain: extra_roots.map(|roots| roots.pem().to_owned()),
        };
        Self {
            config,
            tls,
            link: Mutex::new(None),
        }
    }

    /// The longest one send takes (the close of a failed connection is
    /// not waited for).
    pub fn timeout(&self) -> std::time::Duration {
        self.config.timeout
    }

    fn routing_key(&self, kind: EventType) -> &str {
        match kind {
            EventType::Created => &self.config.routing_key_created,
            EventType::Paid => &self.config.routing_key_paid,
            EventType::Cancelled => &self.config.routing_key_cancelled,
        }
    }

    /// A channel in confirm mode on a live connection, made if needed.
    pub(super) async fn channel(&self) -> Result<Channel, AmqpError> {
        let mut link = self.link.lock().await;
        if let Some((conn, channel)) = link.as_ref() {
            if conn.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        if let Some((conn, _)) = link.take() {
            self.close_apart(conn, "reconnecting");
        }
        let conn = self.connect().await?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channel
            .exchange_declare(
                self.config.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        *link = Some((conn, channel.clone()));
        Ok(channel)
    }

    /// A connection to the broker. The TCP connect and TLS handshake run
    /// on lapin's thread for the connection, bounded by three quarters of
    /// the send timeout (so that it, not the whole send, is what times out
    /// and is reported), with tokio's timer (lapin's default runtime is
    /// the backend's tokio runtime, which that thread enters): the thread
    /// and its socket end with a broker that never answers.
    async fn connect(&self) -> Result<Connection, AmqpError> {
        let uri = amqp_uri(&self.config.url)?;
        let (tls, timeout) = (self.tls.clone(), self.config.timeout * 3 / 4);
        let runtime = lapin::runtime::default_runtime()?;
        let connect = async move |uri: AMQPUri, runtime| match tokio::time::timeout(
            timeout,
            uri.connect_with_config_async(tls.as_ref(), &runtime),
        )
        .await
        {
            Ok(stream) => Ok(stream?),
            Err(_) => {
                Err(std::io::Error::new(std::io::ErrorKind::TimedOut, ConnectTimedOut).into())
            }
        };
        Ok(Connection::connector(uri, runtime, connect, ConnectionProperties::default()).await?)
    }

    /// Publishes `event` and waits for the broker's confirm.
    ///
    /// # Errors
    /// [`AmqpError`]: the broker did not take it.
    pub async fn send(&self, event: &OutboxEvent) -> Result<(), AmqpError> {
        let result = match tokio::time::timeout(self.config.timeout, self.publish(event)).await {
            Ok(result) => result,
            Err(_) => Err(AmqpError::Timeout),
        };
        if result.is_err() {
            // The next attempt starts from a fresh connection.
            let old = self.link.lock().await.take();
            if let Some((conn, _)) = old {
                self.close_apart(conn, "publish failed");
            }
        }
        result
    }

    /// Closes `conn` on a task of its own, bounded by the send timeout: a
    /// broker that never answers the close must not hold the link (and so
    /// every delivery) waiting.
    fn close_apart(&self, conn: Connection, reason: &'static str) {
        let timeout = self.config.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, conn.close(200, reason.into())).await;
        });
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), AmqpError> {
        let channel = self.channel().await?;
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(event.event_id.as_str().into())
            .with_type(event.kind.as_str().into())
            .with_timestamp(u64::try_from(event.created_at_ms / 1000).unwrap_or(0));
        let confirm = channel
            .basic_publish(
                self.config.exchange.as_str().into(),
                self.routing_key(event.kind).into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                event.payload.as_bytes(),
                properties,
            )
            .await?;
        match confirm.await? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(AmqpError::Unroutable {
                code: returned.reply_code,
                text: returned.reply_text.as_str().to_owned(),
            }),
            Confirmation::Nack(_) | Confirmation::NotRequested => Err(AmqpError::Nack),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_address_in_the_url_is_the_host_connected_to() {
        let host = |url: &str| amqp_uri(url).unwrap().authority.host;
        assert_eq!(host("amqps://guest:guest@127.0.0.1:5671/%2f"), "127.0.0.1");
        assert_eq!(host("amqp://[::1]:5672/%2f"), "::1");
        assert_eq!(
            host("amqps://fg:pw@rabbit.example:5671/%2f"),
            "rabbit.example"
        );
        let uri = amqp_uri("amqps://fg:p%40ss@10.0.0.7/vh").unwrap();
        assert_eq!(
            (
                uri.authority.port,
                uri.authority.userinfo.password.as_str(),
                uri.vhost.as_str()
            ),
            (5671, "p@ss", "vh")
        );
        assert!(matches!(amqp_uri("rabbit:5672"), Err(AmqpError::BadUrl)));
    }
}
