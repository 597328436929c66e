//! PostgreSQL's own cost of the drain's rows: the least the database
//! server spends to store an order. The same rows as the backend writes
//! (the `orders` table with its indexes, the drain's field shapes) go in by
//! `COPY ... FROM STDIN`, one statement (and transaction) per batch of
//! the backend's batch size, and every PostgreSQL server process's CPU
//! over the copy is divided by the rows. Measured right after the drain,
//! on the same table, so both see the same indexes at the same size.

use std::time::Instant;

use flashgate_common::reservation::reservation_id;
use serde::Serialize;

use crate::sys::{snap, CpuUse, Watched, DATABASE};

/// The sale id the floor's rows carry (deleted after).
const SALE: &str = "copy-floor";

/// What the COPY floor measured.
#[derive(Debug, Clone, Serialize)]
pub struct CopyFloor {
    pub rows: usize,
    pub batch: usize,
    pub secs: f64,
    /// CPU seconds of every PostgreSQL server process over the copy.
    pub database_cpu_s: f64,
}

impl CopyFloor {
    /// Database CPU µs per row.
    pub fn us_per_row(&self) -> f64 {
        self.database_cpu_s * 1e6 / self.rows.max(1) as f64
    }
}

/// One batch of rows in COPY's text format.
fn batch_text(n: usize, now_ms: i64) -> Vec<u8> {
    let mut out = String::with_capacity(n * 160);
    for _ in 0..n {
        let rid = reservation_id(SALE, rand::random());
        let user = uuid::Uuid::new_v4();
        let order = uuid::Uuid::new_v4().simple();
        // order_id, reservation_id, sale_id, user_id, idempotency_key
        // (empty, as the drain's), reserved_at_ms, created_at_ms, status.
        out.push_str(&format!(
            "o-{order}\t{rid}\t{SALE}\t{user}\t\t{now_ms}\t{now_ms}\tcreated\n"
        ));
    }
    out.into_bytes()
}

/// Copies `rows` order rows into `orders` in batches of `batch`.
///
/// # Errors
/// When PostgreSQL refuses the copy.
pub async fn measure(pg: &sqlx::PgPool, rows: usize, batch: usize) -> anyhow::Result<CopyFloor> {
    let now = flashgate_common::now_ms();
    let batches: Vec<Vec<u8>> = (0..rows)
        .step_by(batch.max(1))
        .map(|start| batch_text(batch.min(rows - start), now))
        .collect();
    let mut conn = pg.acquire().await?;
    let watched = [Watched::command(DATABASE, "postgres")];
    let a = snap(&watched);
    let t = Instant::now();
    for b in &batches {
        let mut copy = conn
            .copy_in_raw(
                "COPY orders (order_id, reservation_id, sale_id, user_id, idempotency_key, \
                 reserved_at_ms, created_at_ms, status) FROM STDIN",
            )
            .await?;
        copy.send(b.as_slice()).await?;
        copy.finish().await?;
    }
    let secs = t.elapsed().as_secs_f64();
    let b = snap(&watched);
    let cpu = CpuUse::between(&a, &b);
    sqlx::query("DELETE FROM orders WHERE sale_id = $1")
        .bind(SALE)
        .execute(&mut *conn)
        .await?;
    Ok(CopyFloor {
        rows,
        batch,
        secs,
        database_cpu_s: cpu.get(DATABASE).unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_has_one_line_of_eight_columns_per_row() {
        let text = String::from_utf8(batch_text(3, 42)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        for l in lines {
            let cols: Vec<&str> = l.split('\t').collect();
            assert_eq!(cols.len(), 8);
            assert_eq!(cols[2], SALE);
            assert_eq!(cols[4], "");
            assert_eq!(cols[7], "created");
        }
    }
}
