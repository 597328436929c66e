//! A buyer's side of the wire: signed tokens, one buy, a burst of buys.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::JWT_SECRET;

/// `POST /flashgate/api/sales/{sale}/buy` with a bearer token; returns status and JSON body.
///
/// # Panics
/// When no answer comes (use [`try_buy`] where the gateway may die).
pub async fn buy(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    token: &str,
    idempotency_key: Option<&str>,
) -> (u16, Value) {
    send_buy(http, gateway, sale, token, idempotency_key)
        .await
        .unwrap_or_else(|e| panic!("buy at {gateway}: {e}"))
}

/// A buy that never panics: status 0 when no answer came (connection
/// refused or cut, as when the gateway dies mid-request).
pub async fn try_buy(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    token: &str,
) -> (u16, Value) {
    send_buy(http, gateway, sale, token, None)
        .await
        .unwrap_or((0, Value::Null))
}

async fn send_buy(
    http: &reqwest::Client,
    gateway: SocketAddr,
    sale: &str,
    token: &str,
    idempotency_key: Option<&str>,
) -> reqwest::Result<(u16, Value)> {
    let mut req = http
        .post(format!("http://{gateway}/flashgate/api/sales/{sale}/buy"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10));
    if let Some(k) = idempotency_key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

/// A buyer token signed with [`JWT_SECRET`], valid for an hour.
pub fn token(user: &str) -> String {
    token_with(user, JWT_SECRET, 3600)
}

/// A buyer token with any secret and lifetime (negative = already expired).
pub fn token_with(user: &str, secret: &str, ttl_seconds: i64) -> String {
    let exp = flashgate_common::now_ms() / 1000 + ttl_seconds;
    let claims = serde_json::json!({ "sub": user, "exp": exp });
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// A random, non-sequential user id.
pub fn random_user() -> String {
    format!("u-{:016x}", rand::random::<u64>())
}

/// One buy attempt of a load: who, with which Idempotency-Key.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub user: String,
    pub idempotency_key: Option<String>,
}

impl Attempt {
    /// One attempt by `user`, without an Idempotency-Key.
    pub fn by(user: &str) -> Self {
        Self {
            user: user.to_owned(),
            idempotency_key: None,
        }
    }
}

/// What one attempt got back.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub attempt: Attempt,
    /// 0 when no answer came (the gateway died or cut the connection).
    pub status: u16,
    pub body: Value,
    /// When the request was sent (its turn under the concurrency bound
    /// came) and when its answer arrived: a test can order answers against
    /// each other (say, no `sold_out` before the last win was asked).
    pub sent: Instant,
    pub answered: Instant,
}

impl Outcome {
    /// A winner: 201 confirmed or 202 queued.
    pub fn won(&self) -> bool {
        self.status == 201 || self.status == 202
    }

    pub fn reservation_id(&self) -> Option<&str> {
        self.body["reservation_id"].as_str()
    }
}

/// Sends every attempt at `gateway`, at most `concurrency` in flight, and
/// returns the outcomes in the order given. Never panics on a lost
/// connection: an attempt nobody answered has status 0, so a burst
/// survives a gateway that dies in the middle of it.
pub async fn buy_all(
    gateway: SocketAddr,
    sale: &str,
    attempts: Vec<Attempt>,
    concurrency: usize,
) -> Vec<Outcome> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(attempts.len());
    for attempt in attempts {
        let (http, sem, sale) = (http.clone(), sem.clone(), sale.to_owned());
        let tok = token(&attempt.user);
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let sent = Instant::now();
            let (status, body) = send_buy(
                &http,
                gateway,
                &sale,
                &tok,
                attempt.idempotency_key.as_deref(),
            )
            .await
            .unwrap_or((0, Value::Null));
            Outcome {
                attempt,
                status,
                body,
                sent,
                answered: Instant::now(),
            }
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// `GET url`; status and JSON body (`Null` when not JSON). Status 0 when
/// nothing answered.
pub async fn get_json(http: &reqwest::Client, url: &str) -> (u16, Value) {
    match http.get(url).timeout(Duration::from_secs(5)).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Polls `url` until it answers 200 (or `limit` passes); the last answer.
pub async fn wait_ready(http: &reqwest::Client, url: &str, limit: Duration) -> (u16, Value) {
    let deadline = Instant::now() + limit;
    loop {
        let got = get_json(http, url).await;
        if got.0 == 200 || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A response header's value, empty when absent.
pub fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}
