//! Each gateway's tick, once a second per room, over a connection of its
//! own: the sessions it renewed go to Redis, the head of the queue is
//! called in (so a called visitor finds their turn on their next refresh
//! even while nobody else visits), and the room's state is read for the
//! pages' estimates, the metrics and the admin API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flashgate_common::config::RedisConfig;
use flashgate_common::redis_conn::RedisHandle;

use super::store::{self, MAX_RENEWALS_PER_CALL};
use super::{Room, WaitingRooms};
use crate::infra::{Shutdown, Task};

/// Time between ticks.
pub const TICK: Duration = Duration::from_secs(1);

pub struct RoomTicker {
    pub rooms: Arc<WaitingRooms>,
    pub redis: RedisConfig,
}

impl RoomTicker {
    async fn tick(&self, conn: &mut RedisHandle, room: &Room) -> Result<(), redis::RedisError> {
        let renewals: Vec<(String, i64)> =
            std::mem::take(&mut *room.renewals.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        let mut chunks = renewals.chunks(MAX_RENEWALS_PER_CALL).peekable();
        let mut late = 0;
        // One call even without renewals; one per chunk with them.
        let local_ms = flashgate_common::now_ms();
        let shared = loop {
            let chunk = chunks.next().unwrap_or(&[]);
            match store::tick(conn, &room.config, &room.keys, chunk).await {
                Ok(read) => {
                    late += read.late;
                    if chunks.peek().is_none() {
                        break read;
                    }
                }
                Err(error) => {
                    // Renewals not sent wait for the next tick (a newer one
                    // for the same visitor wins).
                    let mut pending = room.renewals.lock().unwrap_or_else(|p| p.into_inner());
                    for (visitor, until) in chunk.iter().chain(chunks.flatten()) {
                        let entry = pending.entry(visitor.clone()).or_insert(*until);
                        *entry = (*entry).max(*until);
                    }
                    return Err(error);
                }
            }
        };
        self.rooms.saw_redis_clock(shared.now_ms, local_ms);
        room.shared.store(shared.into());
        *room.last_tick.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let name = room.config.name.as_str();
        let m = &self.rooms.metrics;
        m.late_renewals.with_label_values(&[name]).inc_by(late);
        m.inside
            .with_label_values(&[name])
            .set(shared.inside as f64);
        m.waiting
            .with_label_values(&[name])
            .set(shared.waiting as f64);
        m.admission_rate
            .with_label_values(&[name])
            .set(shared.rate_per_second * 60.0);
        m.estimated_wait
            .with_label_values(&[name])
            .set(room.wait_seconds(shared.waiting).map_or(-1.0, |s| s as f64));
        Ok(())
    }
}

#[async_trait]
impl Task for RoomTicker {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut conn = None;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            if conn.is_none() {
                conn = RedisHandle::dedicated(&self.redis, self.redis.timeout, self.redis.timeout)
                    .await
                    .ok();
            }
            let Some(c) = conn.as_mut() else { continue };
            for room in &self.rooms.rooms {
                if let Err(error) = self.tick(c, room).await {
                    tracing::debug!(%error, room = room.config.name, "waiting room tick failed");
                    conn = None;
                    break;
                }
            }
        }
    }
}
