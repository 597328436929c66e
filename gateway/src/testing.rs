//! Test support: a real `redis-server` on a free port, killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Child,
    pub url: String,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let server = Self { child, url: format!("redis://127.0.0.1:{port}/") };
        let client = redis::Client::open(server.url.as_str()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not answer PING");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }

    /// `calls` of one command from INFO commandstats (0 when never called).
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut self.conn().await).await.unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|rest| rest.split(',').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
