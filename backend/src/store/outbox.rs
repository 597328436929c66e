//! The order events outbox (`order_events`, migration 0020): what the shop
//! hears about orders, written in the transaction of the change it
//! describes, so an order change and its event commit or vanish together.
//!
//! Each event has an id (`ev-` and 32 hex digits) fixed when it is written,
//! so every delivery of it, first or repeated, carries the same id and the
//! same bytes; and a `seq`, its place in its order's life (1 created, 2
//! paid or cancelled: an order is paid or cancelled once, by a conditional
//! update). The deliverer ([`crate::events`]) claims the due events whose
//! order has no event of lower `seq` left, with a lease (a conditional
//! `UPDATE`, so two backends never both hold one), sends them, deletes
//! them; a failure pushes the next attempt back, and after
//! `events.max_attempts` the event is `dead` (and so are the sends of the
//! later events of its order, which wait behind it) until an operator
//! retries it.

use flashgate_common::reservation::Reservation;
use serde::Serialize;
use sqlx::Row;

use super::{sql, Flavour, OrderRow, Store, StoreError};

/// What happened to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Created,
    Paid,
    /// Unpaid in time: cancelled, and its item goes back to the sale.
    Cancelled,
}

impl EventType {
    /// The event's `type` (and default AMQP routing key).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Created => "order.created",
            EventType::Paid => "order.paid",
            EventType::Cancelled => "order.cancelled",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "order.created" => Ok(EventType::Created),
            "order.paid" => Ok(EventType::Paid),
            "order.cancelled" => Ok(EventType::Cancelled),
            other => Err(StoreError::BadStatus(other.to_owned())),
        }
    }

    /// Its place in the order's life.
    pub fn seq(self) -> i64 {
        match self {
            EventType::Created => 1,
            EventType::Paid | EventType::Cancelled => 2,
        }
    }

    /// The order's status once this happened.
    fn status(self) -> &'static str {
        match self {
            EventType::Created => "created",
            EventType::Paid => "paid",
            EventType::Cancelled => "cancelled",
        }
    }
}

/// The JSON body of an event, as sent (see docs/EVENTS.md).
#[derive(Serialize)]
struct Body<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    seq: i64,
    occurred_at_ms: i64,
    order: BodyOrder<'a>,
    /// Whether the order's item went back to the sale's stock: true only
    /// for `order.cancelled`, which is written in the transaction that
    /// records the return ([`crate::store::Orders::mark_released`]).
    item_returned: bool,
}

#[derive(Serialize)]
struct BodyOrder<'a> {
    order_id: &'a str,
    reservation_id: &'a str,
    sale_id: &'a str,
    user_id: &'a str,
    status: &'static str,
}

/// An event about to be written.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event_id: String,
    pub order_id: String,
    pub kind: EventType,
    pub payload: String,
    pub at_ms: i64,
}

impl NewEvent {
    /// The event `kind` of `order`, at `at_ms`.
    pub fn new(kind: EventType, order: &OrderRow, at_ms: i64) -> Self {
        Self::build(
            kind,
            &order.order_id,
            &order.reservation_id,
            &order.sale_id,
            &order.user_id,
            at_ms,
        )
    }

    /// `order.created` of the order `order_id` made from `r`.
    pub fn created(r: &Reservation, order_id: &str, at_ms: i64) -> Self {
        Self::build(
            EventType::Created,
            order_id,
            &r.reservation_id,
            &r.sale_id,
            &r.user_id,
            at_ms,
        )
    }

    fn build(
        kind: EventType,
        order_id: &str,
        reservation_id: &str,
        sale_id: &str,
        user_id: &str,
        at_ms: i64,
    ) -> Self {
        let event_id = format!("ev-{}", uuid::Uuid::new_v4().simple());
        let body = Body {
            id: &event_id,
            kind: kind.as_str(),
            seq: kind.seq(),
            occurred_at_ms: at_ms,
            order: BodyOrder {
                order_id,
                reservation_id,
                sale_id,
                user_id,
                status: kind.status(),
            },
            item_returned: kind == EventType::Cancelled,
        };
        // Serialising plain strings and integers cannot fail.
        let payload = serde_json::to_string(&body).unwrap_or_default();
        Self {
            event_id,
            order_id: order_id.to_owned(),
            kind,
            payload,
            at_ms,
        }
    }
}

/// An event claimed for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub event_id: String,
    pub order_id: String,
    pub seq: i64,
    pub kind: EventType,
    /// The JSON body.
    pub payload: String,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Bit set of the destinations that already took it.
    pub sinks_done: u8,
    pub created_at_ms: i64,
}

/// A dead event, as the admin API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadEvent {
    pub event_id: String,
    pub order_id: String,
    pub seq: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
}

/// How far behind delivery is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Events waiting to be sent (dead ones excluded).
    pub pending: i64,
    pub dead: i64,
    /// When the oldest waiting event was written.
    pub oldest_pending_ms: Option<i64>,
}

/// The outcome of a failed attempt.
#[derive(Debug, Clone)]
pub struct Failure<'a> {
    /// Failed attempts including this one.
    pub attempts: u32,
    /// Destinations that took the event so far (not sent again).
    pub sinks_done: u8,
    pub error: &'a str,
    /// When to try again; `None`: give up (dead).
    pub retry_at_ms: Option<i64>,
}

/// Parameters per row of [`insert_events`].
const EVENT_PARAMS: usize = 6;
/// Rows per insert statement (6 x 1000 parameters stays below every
/// database's limit).
const EVENTS_PER_INSERT: usize = 1000;
/// Longest `last_error` kept.
const MAX_ERROR_CHARS: usize = 500;

/// Claimable events: due, not leased, and first of their order.
const CANDIDATES: &str = "SELECT e.event_id FROM order_events e WHERE e.state = 'pending' AND e.next_attempt_at_ms <= $1 AND e.lease_until_ms <= $2 AND NOT EXISTS (SELECT 1 FROM order_events p WHERE p.order_id = e.order_id AND p.seq < e.seq) ORDER BY e.created_at_ms, e.event_id LIMIT $3";
const CLAIMED: &str = "SELECT event_id, order_id, seq, event_type, payload, attempts, sinks_done, created_at_ms FROM order_events WHERE lease_owner = $1 ORDER BY created_at_ms, event_id";
const DELIVERED: &str = "DELETE FROM order_events WHERE event_id = $1";
const FAILED: &str = "UPDATE order_events SET attempts = $1, sinks_done = $2, last_error = $3, next_attempt_at_ms = $4, state = $5, lease_owner = NULL, lease_until_ms = 0 WHERE event_id = $6 AND lease_owner = $7";
const DEAD: &str = "SELECT event_id, order_id, seq, event_type, attempts, last_error, created_at_ms FROM order_events WHERE state = 'dead' ORDER BY created_at_ms, event_id LIMIT $1";
const RETRY: &str = "UPDATE order_events SET state = 'pending', attempts = 0, next_attempt_at_ms = $1, lease_owner = NULL, lease_until_ms = 0 WHERE event_id = $2 AND state = 'dead'";
const PENDING_STATS: &str =
    "SELECT COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM order_events WHERE state = 'pending'";
const DEAD_COUNT: &str = "SELECT COUNT(*) FROM order_events WHERE state = 'dead'";
const OF_ORDER: &str = "SELECT event_id, order_id, seq, event_type, payload, attempts, sinks_done, created_at_ms FROM order_events WHERE order_id = $1 ORDER BY seq";

/// A multi-row insert of `rows` new events.
fn insert_events(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO order_events (event_id, order_id, seq, event_type, payload, created_at_ms, next_attempt_at_ms, state) VALUES ",
    );
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        let p = row * EVENT_PARAMS;
        // `next_attempt_at_ms` starts at `created_at_ms`: due at once.
        sql.push_str(&format!(
            "(${}, ${}, ${}, ${}, ${}, ${}, 0, 'pending')",
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 6
        ));
    }
    sql
}

/// A claim of the events `$4..` for lease owner `$1` until `$2`, if still
/// free at `$3`.
fn claim(n: usize) -> String {
    let params: Vec<String> = (4..4 + n).map(|i| format!("${i}")).collect();
    format!(
        "UPDATE order_events SET lease_owner = $1, lease_until_ms = $2 WHERE state = 'pending' AND lease_until_ms <= $3 AND event_id IN ({})",
        params.join(", ")
    )
}

/// Writes `events` inside `tx`, in the transaction of the change they
/// describe.
///
/// # Errors
/// A failed statement; the transaction is then unusable.
pub async fn write(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    flavour: Flavour,
    events: &[NewEvent],
) -> Result<(), StoreError> {
    for chunk in events.chunks(EVENTS_PER_INSERT) {
        let statement = insert_events(chunk.len());
        // `next_attempt_at_ms` is 0 in the text: due at once.
        let statement = sql::dialect(flavour, &statement);
        let mut query = sqlx::query(&statement);
        for e in chunk {
            query = query
                .bind(e.event_id.as_str())
                .bind(e.order_id.as_str())
                .bind(e.kind.seq())
                .bind(e.kind.as_str())
                .bind(e.payload.as_str())
                .bind(e.at_ms);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

fn outbox_event(row: &sqlx::any::AnyRow) -> Result<OutboxEvent, StoreError> {
    let kind: String = row.try_get("event_type")?;
    Ok(OutboxEvent {
        event_id: row.try_get("event_id")?,
        order_id: row.try_get("order_id")?,
        seq: row.try_get("seq")?,
        kind: EventType::parse(&kind)?,
        payload: row.try_get("payload")?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(u32::MAX),
        sinks_done: u8::try_from(row.try_get::<i64, _>("sinks_done")?).unwrap_or(0),
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

/// Cuts `error` to [`MAX_ERROR_CHARS`] characters.
fn clip(error: &str) -> &str {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((at, _)) => &error[..at],
        None => error,
    }
}

/// The order events outbox of a [`Store`] ([`Store::outbox`]).
#[derive(Clone, Copy, Debug)]
pub struct Outbox<'a> {
    pub(super) store: &'a Store,
}

impl Outbox<'_> {
    /// Claims up to `limit` due events for `owner` (unique per call: the
    /// claimed rows are read back by it) until `now_ms + lease_ms`: only
    /// the first event left of each order, in the order they were written.
    ///
    /// # Errors
    /// A failed query.
    pub async fn claim(
        &self,
        owner: &str,
        now_ms: i64,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<OutboxEvent>, StoreError> {
        let ids: Vec<String> = sqlx::query(&self.store.sql(CANDIDATES))
            .bind(now_ms)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.store.pool)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let statement = claim(ids.len());
        let statement = self.store.sql(&statement);
        let mut query = sqlx::query(&statement)
            .bind(owner)
            .bind(now_ms + lease_ms)
            .bind(now_ms);
        for id in &ids {
            query = query.bind(id.as_str());
        }
        query.execute(&self.store.pool).await?;
        let rows = sqlx::query(&self.store.sql(CLAIMED))
            .bind(owner)
            .fetch_all(&self.store.pool)
            .await?;
        rows.iter().map(outbox_event).collect()
    }

    /// Removes a delivered event: the next one of its order becomes due.
    ///
    /// # Errors
    /// A failed query.
    pub async fn delivered(&self, event_id: &str) -> Result<(), StoreError> {
        sqlx::query(&self.store.sql(DELIVERED))
            .bind(event_id)
            .execute(&self.store.pool)
            .await?;
        Ok(())
    }

    /// Records a failed attempt of the event `owner` holds, and ends the
    /// lease; answers false when the lease had passed to another owner
    /// (whose outcome counts instead).
    ///
    /// # Errors
    /// A failed query.
    pub async fn failed(
        &self,
        event_id: &str,
        owner: &str,
        failure: &Failure<'_>,
    ) -> Result<bool, StoreError> {
        let (state, next) = match failure.retry_at_ms {
            Some(at) => ("pending", at),
            None => ("dead", 0),
        };
        let done = sqlx::query(&self.store.sql(FAILED))
            .bind(i64::from(failure.attempts))
            .bind(i64::from(failure.sinks_done))
            .bind(clip(failure.error))
            .bind(next)
            .bind(state)
            .bind(event_id)
            .bind(owner)
            .execute(&self.store.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Up to `limit` dead events, oldest first.
    ///
    /// # Errors
    /// A failed query.
    pub async fn dead(&self, limit: i64) -> Result<Vec<DeadEvent>, StoreError> {
        let rows = sqlx::query(&self.store.sql(DEAD))
            .bind(limit)
            .fetch_all(&self.store.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadEvent {
                    event_id: r.try_get("event_id")?,
                    order_id: r.try_get("order_id")?,
                    seq: r.try_get("seq")?,
                    event_type: r.try_get("event_type")?,
                    attempts: r.try_get("attempts")?,
                    last_error: r.try_get("last_error")?,
                    created_at_ms: r.try_get("created_at_ms")?,
                })
            })
            .collect()
    }

    /// Makes dead event `event_id` due again at `now_ms` with a fresh count
    /// of attempts; answers false when no dead event has that id.
    ///
    /// # Errors
    /// A failed query.
    pub async fn retry_dead(&self, event_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.store.sql(RETRY))
            .bind(now_ms)
            .bind(event_id)
            .execute(&self.store.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Counts of waiting and dead events.
    ///
    /// # Errors
    /// A failed query.
    pub async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(&self.store.sql(PENDING_STATS))
            .fetch_one(&self.store.pool)
            .await?;
        let dead = sqlx::query(&self.store.sql(DEAD_COUNT))
            .fetch_one(&self.store.pool)
            .await?;
        Ok(OutboxStats {
            pending: row.try_get("n")?,
            oldest_pending_ms: row.try_get("oldest")?,
            dead: dead.try_get(0)?,
        })
    }

    /// The events of `order_id` still in the outbox, by `seq`.
    ///
    /// # Errors
    /// A failed query.
    pub async fn of_order(&self, order_id: &str) -> Result<Vec<OutboxEvent>, StoreError> {
        let rows = sqlx::query(&self.store.sql(OF_ORDER))
            .bind(order_id)
            .fetch_all(&self.store.pool)
            .await?;
        rows.iter().map(outbox_event).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outbox_query_numbers_its_placeholders_in_binding_order() {
        for text in [
            CANDIDATES,
            CLAIMED,
            DELIVERED,
            FAILED,
            DEAD,
            RETRY,
            PENDING_STATS,
            DEAD_COUNT,
            OF_ORDER,
        ] {
            sql::assert_placeholders_in_order(text);
        }
        sql::assert_placeholders_in_order(&insert_events(3));
        sql::assert_placeholders_in_order(&claim(3));
    }
}
