//! A shop for the edge-cache tests: an axum server on loopback that counts
//! the requests it gets per path and query, and answers each with the
//! test's own function (given the request and its count for that path).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::response::Response;

pub struct TestShop {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    pub addr: SocketAddr,
}

impl TestShop {
    /// Serves `answer(request, n)`, `n` the request's number for its path
    /// and query (from 1).
    pub async fn start<F, Fut>(answer: F) -> Self
    where
        F: Fn(Request, usize) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counted = counts.clone();
        let app = axum::Router::new().fallback(move |req: Request| {
            let (counts, answer) = (counted.clone(), answer.clone());
            async move {
                let key = req.uri().path_and_query().map_or("/", |p| p.as_str());
                let n = {
                    let mut counts = counts.lock().unwrap();
                    let n = counts.entry(key.to_owned()).or_insert(0);
                    *n += 1;
                    *n
                };
                answer(req, n).await
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { counts, addr }
    }

    /// Requests the shop got for `path` (with its query).
    pub fn count(&self, path: &str) -> usize {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Requests the shop got in all.
    pub fn total(&self) -> usize {
        self.counts.lock().unwrap().values().sum()
    }
}
