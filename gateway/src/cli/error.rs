//! Why an operator command failed: each error names what failed (the
//! variable, the file, the flag, or the call with its URL and status).

use std::path::PathBuf;

use reqwest::{Method, StatusCode};

/// Why an operator command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{var} is not set: the admin APIs take it as their bearer token")]
    NoToken { var: &'static str },
    #[error("{}: {error}", path.display())]
    Config { path: PathBuf, error: String },
    #[error("{flag} {value:?}: {why} (e.g. http://127.0.0.1:9091)")]
    BadUrl {
        flag: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("sale file {}: {message}", path.display())]
    SaleFile { path: PathBuf, message: String },
    #[error("{0}")]
    Usage(&'static str),
    #[error("cannot start the HTTP client")]
    Runtime(#[source] std::io::Error),
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("{method} {url}: cannot reach the API")]
    Unreachable {
        method: Method,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{method} {url}: {status} ({code}): {message}")]
    Refused {
        method: Method,
        url: String,
        status: StatusCode,
        /// The API's error code (`"code"` of its JSON body), `-` when the
        /// body had none.
        code: String,
        message: String,
    },
    #[error("{method} {url}: {status}, but the answer is not JSON")]
    NotJson {
        method: Method,
        url: String,
        status: StatusCode,
    },
}
