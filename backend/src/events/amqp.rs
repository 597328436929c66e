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
//! and `events.ca_file` (see [`super::tls`]) for the URL's host name.

use flashgate_common::config::AmqpConfig;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
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
    #[error("amqp broker returned the message: no queue is bound for it ({code} {text})")]
    Unroutable { code: u16, text: String },
}

impl From<lapin::Error> for AmqpError {
    fn from(e: lapin::Error) -> Self {
        match tls::handshake_failure(&e) {
            Some(reason) => AmqpError::Tls(reason),
            None => AmqpError::Lapin(e),
        }
    }
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
        f.debug_struct("Amqp").field("exchange", &self.config.exchange).finish_non_exhaustive()
    }
}

impl Amqp {
    /// A publisher trusting the system's roots and `extra_roots` (used
    /// only for an `amqps://` URL).
    pub fn new(config: AmqpConfig, extra_roots: Option<&ExtraRoots>) -> Self {
        let tls = OwnedTLSConfig { identity: None, cert_chain: extra_roots.map(|roots| roots.pem().to_owned()) };
        Self { config, tls, link: Mutex::new(None) }
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
    pub(super) async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut link = self.link.lock().await;
        if let Some((conn, channel)) = link.as_ref() {
            if conn.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        if let Some((conn, _)) = link.take() {
            self.close_apart(conn, "reconnecting");
        }
        let conn = Connection::connect_with_config(
            &self.config.url,
            ConnectionProperties::default(),
            self.tls.clone(),
            lapin::runtime::default_runtime()?,
        )
        .await?;
        let channel = conn.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        channel
            .exchange_declare(
                self.config.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() },
                FieldTable::default(),
            )
            .await?;
        *link = Some((conn, channel.clone()));
        Ok(channel)
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
                BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                event.payload.as_bytes(),
                properties,
            )
            .await?;
        match confirm.await? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => {
                Err(AmqpError::Unroutable { code: returned.reply_code, text: returned.reply_text.as_str().to_owned() })
            }
            Confirmation::Nack(_) | Confirmation::NotRequested => Err(AmqpError::Nack),
        }
    }
}
