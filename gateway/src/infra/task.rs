//! A long-running task (a watcher, a listener, the winner forwarder): it
//! runs until told to stop. The server runs each as one of Pingora's
//! background services, so the layers below the edge never name Pingora.

use async_trait::async_trait;

/// Turns `true` (or closes) when the gateway stops; the same channel as
/// Pingora's `ShutdownWatch`.
pub type Shutdown = tokio::sync::watch::Receiver<bool>;

/// A task that runs for the life of the gateway.
#[async_trait]
pub trait Task: Send + Sync + 'static {
    /// Runs until `shutdown` says stop.
    async fn run(&self, shutdown: Shutdown);
}
