//! Delivery to the shop's webhook: one `POST` per event, signed as Standard
//! Webhooks specifies (see [`super::sign`]); any 2xx answer is a delivery, anything else (another
//! status, a timeout, a refused connection) a failed attempt. Redirects are
//! not followed: the signed body goes only to the configured URL.
//!
//! An `https://` URL is reached over TLS 1.2 or later, the shop's
//! certificate verified against the system's roots and `events.ca_file`
//! (see [`super::tls`]); a certificate that does not verify fails the
//! attempt before anything is sent.

use flashgate_common::config::WebhookConfig;

use super::sign::{
    signature, EVENT_ID_HEADER, EVENT_TYPE_HEADER, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use super::tls::{self, ExtraRoots};
use crate::store::outbox::OutboxEvent;

/// Why an event did not reach the webhook. The texts are logged and
/// stored in the outbox (`last_error`): they never carry the URL, which
/// may hold credentials.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook answered {0}")]
    Status(u16),
    /// The TLS handshake failed: OpenSSL's reason, e.g. `certificate
    /// verify failed (unable to get local issuer certificate)`.
    #[error("webhook TLS handshake failed: {0}")]
    Tls(String),
    /// Any other failure, with its causes (connection refused, timeout).
    #[error("webhook request failed: {0}")]
    Http(String),
}

impl WebhookError {
    /// Whether the TLS handshake failed (often a configuration mistake:
    /// a private CA missing from `events.ca_file`).
    pub fn is_tls(&self) -> bool {
        matches!(self, WebhookError::Tls(_))
    }
}

impl From<reqwest::Error> for WebhookError {
    fn from(e: reqwest::Error) -> Self {
        let e = e.without_url();
        match tls::handshake_failure(&e) {
            Some(reason) => WebhookError::Tls(reason),
            None => WebhookError::Http(tls::chain(&e)),
        }
    }
}

/// A client for the shop's webhook.
#[derive(Clone)]
pub struct Webhook {
    client: reqwest::Client,
    url: String,
    /// The HMAC key (decoded from `FLASHGATE_WEBHOOK_SECRET`).
    key: Vec<u8>,
    timeout: std::time::Duration,
}

/// The secret left out, and the URL without its userinfo and query (it
/// may carry credentials or a token).
impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &redacted_url(&self.url))
            .field("secret", &"<redacted>")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// `url` with its userinfo and query replaced by `<redacted>` (and its
/// fragment dropped), for logs.
pub(super) fn redacted_url(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        return "<unparsable URL>".to_owned();
    };
    let had_userinfo = !parsed.username().is_empty() || parsed.password().is_some();
    let had_query = parsed.query().is_some();
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    parsed.set_query(None);
    parsed.set_fragment(None);
    let mut text = parsed.to_string();
    if had_userinfo {
        text = text.replacen("://", "://<redacted>@", 1);
    }
    if had_query {
        text.push_str("?<redacted>");
    }
    text
}

impl Webhook {
    /// A client trusting the system's roots and `extra_roots`.
    ///
    /// # Errors
    /// The HTTP client cannot be built (OpenSSL refuses its setup).
    pub fn new(
        config: &WebhookConfig,
        extra_roots: Option<&ExtraRoots>,
    ) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .min_tls_version(reqwest::tls::Version::TLS_1_2);
        for certificate in extra_roots.into_iter().flat_map(ExtraRoots::certificates) {
            builder = builder.add_root_certificate(certificate);
        }
        let client = builder.build()?;
        Ok(Self {
            client,
            url: config.url.clone(),
            key: config.key.clone(),
            timeout: config.timeout,
        })
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
            .header(ID_HEADER, &event.event_id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(
                SIGNATURE_HEADER,
                signature(
                    &self.key,
                    &event.event_id,
                    timestamp,
                    event.payload.as_bytes(),
                ),
            )
            .header(EVENT_ID_HEADER, &event.event_id)
            .header(EVENT_TYPE_HEADER, event.kind.as_str())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_secret_and_the_urls_credentials() {
        let config = WebhookConfig {
            url: "https://u:pw@shop.test:8443/hook?token=s3cret#frag".to_owned(),
            key: b"0123456789abcdef0123456789abcdef".to_vec(),
            timeout: std::time::Duration::from_secs(2),
        };
        let webhook = Webhook::new(&config, None).unwrap();
        let text = format!("{webhook:?}");
        for secret in ["0123456789abcdef", "pw", "s3cret", "u:"] {
            assert!(!text.contains(secret), "`{secret}` in {text}");
        }
        assert!(
            text.contains("https://<redacted>@shop.test:8443/hook?<redacted>"),
            "{text}"
        );
        assert_eq!(
            redacted_url("http://127.0.0.1:9/hook"),
            "http://127.0.0.1:9/hook"
        );
    }
}
