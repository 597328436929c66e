//! The SQL text of the store, kept apart so the dialect both databases must
//! accept is visible in one place: `$N` placeholders, `BIGINT`, and
//! `ON CONFLICT ... DO NOTHING / DO UPDATE`.

pub const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS sales (id TEXT PRIMARY KEY, name TEXT NOT NULL, stock BIGINT NOT NULL, per_user_limit BIGINT NOT NULL, starts_at_ms BIGINT NOT NULL, ends_at_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, reservation_id TEXT NOT NULL UNIQUE, sale_id TEXT NOT NULL, user_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, reserved_at_ms BIGINT NOT NULL, created_at_ms BIGINT NOT NULL, status TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS orders_sale_user ON orders (sale_id, user_id)",
];

/// PostgreSQL only: serialises schema creation between processes.
pub const LOCK_SCHEMA: &str = "SELECT pg_advisory_lock(7220411)";
pub const UNLOCK_SCHEMA: &str = "SELECT pg_advisory_unlock(7220411)";

/// Columns bound per order row by [`insert_orders`].
const ORDER_PARAMS: usize = 7;

/// A multi-row insert of `rows` orders (7 parameters each, status fixed to
/// `created`) that skips reservations already holding an order.
pub fn insert_orders(rows: usize) -> String {
    let mut sql = String::with_capacity(160 + rows * 48);
    sql.push_str(
        "INSERT INTO orders (order_id, reservation_id, sale_id, user_id, idempotency_key, reserved_at_ms, created_at_ms, status) VALUES ",
    );
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for col in 0..ORDER_PARAMS {
            sql.push_str(&format!("${}, ", row * ORDER_PARAMS + col + 1));
        }
        sql.push_str("'created')");
    }
    sql.push_str(" ON CONFLICT (reservation_id) DO NOTHING");
    sql
}

pub const ORDER_BY_RESERVATION: &str =
    "SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE reservation_id = $1";

pub const SET_ORDER_STATUS: &str = "UPDATE orders SET status = $1 WHERE reservation_id = $2";

pub const COUNT_LIVE_ORDERS: &str = "SELECT COUNT(*) FROM orders WHERE sale_id = $1 AND status <> 'cancelled'";

pub const INSERT_SALE_IF_ABSENT: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING";

/// Keeps `created_at_ms` of an existing row.
pub const UPSERT_SALE: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO UPDATE SET name = excluded.name, stock = excluded.stock, per_user_limit = excluded.per_user_limit, starts_at_ms = excluded.starts_at_ms, ends_at_ms = excluded.ends_at_ms";

pub const SALE_BY_ID: &str =
    "SELECT id, name, stock, per_user_limit, starts_at_ms, ends_at_ms FROM sales WHERE id = $1";

pub const ALL_SALES: &str = "SELECT id, name, stock, per_user_limit, starts_at_ms, ends_at_ms FROM sales ORDER BY id";

#[cfg(test)]
mod tests {
    #[test]
    fn insert_statement_numbers_every_parameter_once() {
        let sql = super::insert_orders(2);
        assert!(sql.contains("($1, $2, $3, $4, $5, $6, $7, 'created'), ($8, "), "{sql}");
        assert!(sql.contains("$14, 'created')"), "{sql}");
        assert!(!sql.contains("$15"));
    }
}
