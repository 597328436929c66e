//! Delivery to the shop's webhook: one signed `POST` per event (see
//! [`super::sign`]); any 2xx answer is a delivery, anything else (another
//! status, a timeout, a refused connection) a failed attempt. Redirects are
//! not followed: the signed body goes only to the configured URL.

use flashgate_common::config::WebhookConfig;

use super::sign::{signature, EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::store::outbox::OutboxEvent;

/// Why an event did not reach the webhook.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook answered {0}")]
    Status(u16),
    /// Built with [`reqwest::Error::without_url`]: the URL may carry
    /// credentials, and this text is logged and stored in the outbox.
    #[error("webhook request failed: {0}")]
    Http(reqwest::Error),
}

impl From<reqwest::Error> for WebhookError {
    fn from(e: reqwest::Error) -> Self {
        WebhookError::Http(e.without_url())
    }
}

/// A client for the shop's webhook.
#[derive(Debug, Clone)]
pub struct Webhook {
    client: reqwest::Client,
    url: String,
    secret: String,
    timeout: std::time::Duration,
}

impl Webhook {
    /// # Errors
    /// The HTTP client cannot be built (no TLS backend).
    pub fn new(config: &WebhookConfig) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().timeout(config.timeout).redirect(reqwest::redirect::Policy::none()).build()?;
        Ok(Self { client, url: config.url.clone(), secret: config.secret.clone(), timeout: config.timeout })
    }

    /// The longest one send takes.
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }

    /// Sends `event`, signed now.
    ///
    /// # Errors
    /// [`WebhookError`]: the shop did not take it.
    pub async fn send(&self, event: &OutboxEvent) -> Result<(), WebhookError> {
        let timestamp = flashgate_common::now_ms() / 1000;
        let response = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(EVENT_ID_HEADER, &event.event_id)
            .header(EVENT_TYPE_HEADER, event.kind.as_str())
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signature(self.secret.as_bytes(), timestamp, event.payload.as_bytes()))
            .body(event.payload.clone())
            .send()
            .await?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(WebhookError::Status(status.as_u16()))
        }
    }
}
