//! One call to an admin API, and every way the CLI fails, each naming what
//! failed: the method and URL, the status and the API's error code.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::error::CliError;
use super::target::Target;

/// How long one call may take: reconciling a large sale reads its orders.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A successful answer: its status and JSON body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

/// A client of one admin API.
pub struct AdminClient {
    http: reqwest::Client,
    target: Target,
}

impl AdminClient {
    /// # Errors
    /// The HTTP client cannot be built (no TLS is used: only when the
    /// system refuses its resources).
    pub fn new(target: Target) -> Result<Self, CliError> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(CliError::Client)?;
        Ok(Self { http, target })
    }

    pub async fn get(&self, path: &str) -> Result<Answer, CliError> {
        self.call(Method::GET, path, None).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Answer, CliError> {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Answer, CliError> {
        self.call(Method::POST, path, body).await
    }

    /// `method path` with the bearer token; a 2xx answer's JSON, or the
    /// error naming the URL, the status and the API's code and message.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, CliError> {
        let url = format!("{}{path}", self.target.base);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.target.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let unreachable = |source: reqwest::Error| CliError::Unreachable {
            method: method.clone(),
            url: url.clone(),
            source: source.without_url(),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(unreachable)?;
        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
        if !status.is_success() {
            let field = |name: &str| {
                parsed
                    .as_ref()
                    .and_then(|v| v[name].as_str())
                    .map(str::to_owned)
            };
            return Err(CliError::Refused {
                method,
                url,
                status,
                code: field("code").unwrap_or_else(|| "-".to_owned()),
                message: field("message").unwrap_or_else(|| body_start(&bytes)),
            });
        }
        match parsed {
            Some(body) => Ok(Answer { status, body }),
            None => Err(CliError::NotJson {
                method,
                url,
                status,
            }),
        }
    }
}

/// The start of a body that is not the API's JSON error (a proxy's page).
fn body_start(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim()
        .chars()
        .take(200)
        .collect()
}
