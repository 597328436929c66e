//! The gateway's client of the order backend: forwards winners and asks for
//! a reservation's order. Only winners ever reach the backend, so this path
//! carries at most `stock` forwards per sale. A failure here never loses an
//! order: the reservation is already in the sale's stream, which the
//! backend consumes on its own. Every call carries the gateways' bearer
//! token (`FLASHGATE_INTERNAL_TOKEN`).

use std::time::Duration;

use flashgate_common::reservation::{ForwardedWinner, OrderView};

/// Why the backend gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("backend answered {0}")]
    Status(u16),
    #[error("the backend token is not a valid header value")]
    BadToken,
}

impl BackendError {
    /// The failure's metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendError::Http(e) if e.is_timeout() => "timeout",
            BackendError::Http(e) if e.is_connect() => "connect",
            BackendError::Http(_) => "http",
            BackendError::Status(_) | BackendError::BadToken => "status",
        }
    }
}

pub struct OrderClient {
    http: reqwest::Client,
    base: String,
}

impl OrderClient {
    /// A client that presents `token` (`FLASHGATE_INTERNAL_TOKEN`) as its
    /// bearer token on every call: the backend answers nothing without it.
    ///
    /// # Errors
    /// When the HTTP client cannot be built (a token that is not a valid
    /// header value included).
    pub fn new(base_url: &str, timeout: Duration, token: &str) -> Result<Self, BackendError> {
        let mut auth = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| BackendError::BadToken)?;
        auth.set_sensitive(true);
        let headers =
            reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, auth)]);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            http,
            base: base_url.to_owned(),
        })
    }

    /// Hands a batch of winners over in one request; the backend writes
    /// them in one transaction. Answers how many orders it created.
    ///
    /// # Errors
    /// When the backend is unreachable, slow, or refuses.
    pub async fn create_orders(&self, winners: &[ForwardedWinner]) -> Result<u64, BackendError> {
        let resp = self
            .http
            .post(format!("{}/internal/orders/batch", self.base))
            .json(winners)
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(BackendError::Status(resp.status().as_u16()));
        }
        let body: serde_json::Value = resp.json().await?;
        Ok(body["created"].as_u64().unwrap_or(0))
    }

    /// Whether the backend process answers at all (`GET /live`).
    ///
    /// # Errors
    /// When the backend is unreachable, slow, or not alive.
    pub async fn live(&self) -> Result<(), BackendError> {
        let resp = self.http.get(format!("{}/live", self.base)).send().await?;
        match resp.status().as_u16() {
            200 => Ok(()),
            s => Err(BackendError::Status(s)),
        }
    }

    /// Whether the backend's database knows sale `sale_id` (asked when the
    /// sale is missing from Redis: it then is being restored).
    ///
    /// # Errors
    /// When the backend is unreachable, slow, or answers neither 200 nor 404.
    pub async fn sale_exists(&self, sale_id: &str) -> Result<bool, BackendError> {
        let resp = self
            .http
            .get(format!("{}/internal/sales/{sale_id}", self.base))
            .send()
            .await?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            s => Err(BackendError::Status(s)),
        }
    }

    /// The order of a reservation, `None` while it is still queued.
    ///
    /// # Errors
    /// When the backend is unreachable or slow.
    pub async fn order(&self, reservation_id: &str) -> Result<Option<OrderView>, BackendError> {
        let resp = self
            .http
            .get(format!(
                "{}/internal/reservations/{reservation_id}",
                self.base
            ))
            .send()
            .await?;
        match resp.status().as_u16() {
            404 => Ok(None),
            s if (200..300).contains(&s) => Ok(Some(resp.json().await?)),
            s => Err(BackendError::Status(s)),
        }
    }
}
