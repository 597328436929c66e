//! The SQL text of the store's queries, kept apart so the dialect both
//! databases must accept is visible in one place: `$N` placeholders,
//! `BIGINT`, and `ON CONFLICT ... DO NOTHING / DO UPDATE`. The schema is
//! in the migrations (see [`super::schema`]).

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

/// [`insert_orders`] that returns the reservation id of each row it created.
pub fn insert_orders_returning(rows: usize) -> String {
    insert_orders(rows) + " RETURNING reservation_id"
}

/// `SELECT` of the orders of `n` reservation ids (`$1..$n`).
pub fn orders_by_reservations(n: usize) -> String {
    let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    format!("SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE reservation_id IN ({})", params.join(", "))
}

pub const ORDER_BY_RESERVATION: &str = "SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE reservation_id = $1";

pub const COUNT_LIVE_ORDERS: &str = "SELECT COUNT(*) FROM orders WHERE sale_id = $1 AND status <> 'cancelled'";

pub const INSERT_SALE_IF_ABSENT: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms, paused, draw_window_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8) ON CONFLICT (id) DO NOTHING";

/// Keeps `created_at_ms` and `paused` of an existing row.
pub const UPSERT_SALE: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms, paused, draw_window_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8) ON CONFLICT (id) DO UPDATE SET name = excluded.name, stock = excluded.stock, per_user_limit = excluded.per_user_limit, starts_at_ms = excluded.starts_at_ms, ends_at_ms = excluded.ends_at_ms, draw_window_ms = excluded.draw_window_ms";

pub const SALE_BY_ID: &str = "SELECT id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, draw_window_ms FROM sales WHERE id = $1";

pub const ALL_SALES: &str = "SELECT id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, draw_window_ms FROM sales ORDER BY id";

pub const SET_PAYMENT_TIMEOUT: &str = "UPDATE sales SET payment_timeout_seconds = $1 WHERE id = $2";

pub const SET_SALE_PAUSED: &str = "UPDATE sales SET paused = $1 WHERE id = $2";

pub const SALE_PAUSED: &str = "SELECT paused FROM sales WHERE id = $1";

/// Every sale's recorded pause (NULL: never recorded).
pub const SALE_PAUSES: &str = "SELECT id, paused FROM sales ORDER BY id";

/// Records a pause found in Redis, only on a row that never recorded one.
pub const ADOPT_SALE_PAUSED: &str = "UPDATE sales SET paused = $1 WHERE id = $2 AND paused IS NULL";

/// Name of the global switch in `settings`; its value is `paused` or `open`.
pub const SWITCH_SETTING: &str = "switch";

pub const SETTING: &str = "SELECT value FROM settings WHERE name = $1";

/// Records a setting only if it was never recorded.
pub const ADOPT_SETTING: &str = "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";

pub const SET_SETTING: &str = "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value";

pub const PAYMENT_TIMEOUT: &str = "SELECT payment_timeout_seconds FROM sales WHERE id = $1";

pub const ORDER_BY_ID: &str = "SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE order_id = $1";

/// Decides a payment once: only an order still `created` becomes `paid`.
pub const PAY_IF_CREATED: &str = "UPDATE orders SET status = 'paid' WHERE order_id = $1 AND status = 'created'";

/// Decides an expiry once: only an order still `created` is cancelled.
pub const CANCEL_IF_CREATED: &str = "UPDATE orders SET status = 'cancelled' WHERE order_id = $1 AND status = 'created'";

/// Unpaid orders past their sale's payment timeout at `$1`, oldest first.
pub const EXPIRED_ORDERS: &str = "SELECT o.order_id, o.reservation_id, o.sale_id, o.user_id FROM orders o JOIN sales s ON s.id = o.sale_id WHERE o.status = 'created' AND o.reserved_at_ms + s.payment_timeout_seconds * 1000 < $1 ORDER BY o.reserved_at_ms LIMIT $2";

/// Cancelled orders whose item has not been given back to Redis yet, in
/// order id order after the cursor `$1`, so a pass pages through all of
/// them once however many it cannot return now.
pub const UNRELEASED_CANCELLED: &str = "SELECT order_id, reservation_id, sale_id, user_id FROM orders WHERE status = 'cancelled' AND released_at_ms IS NULL AND order_id > $1 ORDER BY order_id LIMIT $2";

/// Orders of a sale still waiting for something: a payment, or the return
/// of a cancelled order's item. A sale with any is not archived.
pub const UNSETTLED_ORDERS: &str =
    "SELECT COUNT(*) FROM orders WHERE sale_id = $1 AND (status = 'created' OR (status = 'cancelled' AND released_at_ms IS NULL))";

pub const MARK_RELEASED: &str = "UPDATE orders SET released_at_ms = $1 WHERE order_id = $2";

/// Every order of a sale, for restores and reconciliation.
pub const SALE_ORDERS: &str = "SELECT order_id, reservation_id, sale_id, user_id, status, released_at_ms FROM orders WHERE sale_id = $1";

/// Every order of a sale with its Idempotency-Key, for a re-sync.
pub const SALE_ORDERS_WITH_KEYS: &str =
    "SELECT order_id, reservation_id, sale_id, user_id, status, released_at_ms, idempotency_key, reserved_at_ms FROM orders WHERE sale_id = $1";

/// PostgreSQL: the first statement of a hold's transaction.
pub const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// PostgreSQL: how long a hold waits for a row before the statement fails.
pub const HOLD_TIMEOUT: &str = "SET LOCAL lock_timeout = '5s'";

/// PostgreSQL: holds a sale's row against a re-sync while orders are written.
pub const HOLD_SALE_SHARED: &str = "SELECT id FROM sales WHERE id = $1 FOR SHARE";

/// PostgreSQL: holds a sale's row against order writes while it is re-synced.
pub const HOLD_SALE_EXCLUSIVE: &str = "SELECT id FROM sales WHERE id = $1 FOR UPDATE";

/// SQLite: a write that changes nothing, to take the database's one write
/// lock at the start of a transaction (SQLite's `BEGIN` defers it).
pub const TAKE_WRITE_LOCK: &str = "UPDATE sales SET id = id WHERE id = $1";

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
