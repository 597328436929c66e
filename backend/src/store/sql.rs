//! The SQL text of the store's queries, kept apart so the dialect every
//! database must accept is visible in one place: `$N` placeholders,
//! `BIGINT`, and `ON CONFLICT ... DO NOTHING / DO UPDATE`. The schema is
//! in the migrations (see [`super::schema`]).
//!
//! MySQL speaks another dialect for two of these: placeholders are `?`, and
//! an upsert is `ON DUPLICATE KEY UPDATE`. [`dialect`] rewrites the text
//! written here for it, mechanically (`$N` in increasing order become `?`;
//! `DO NOTHING` becomes a no-op update of the conflict column, never
//! `INSERT IGNORE`, which would also swallow errors about the data), so
//! every query is still written once. The few queries MySQL cannot take at
//! all (`RETURNING`, `FOR SHARE`) have their own versions in the callers.

use std::borrow::Cow;

use super::Flavour;

/// `text` in the dialect of `flavour` (see the module doc).
pub fn dialect(flavour: Flavour, text: &str) -> Cow<'_, str> {
    match flavour {
        Flavour::Sqlite | Flavour::Postgres => Cow::Borrowed(text),
        Flavour::Mysql => Cow::Owned(placeholders(&upserts(text))),
    }
}

/// `ON CONFLICT (c) DO NOTHING` as `ON DUPLICATE KEY UPDATE c = c`, and
/// `ON CONFLICT (c) DO UPDATE SET a = excluded.a` as
/// `ON DUPLICATE KEY UPDATE a = VALUES(a)`.
fn upserts(text: &str) -> Cow<'_, str> {
    let Some((head, tail)) = text.split_once(" ON CONFLICT (") else {
        return Cow::Borrowed(text);
    };
    let Some((column, action)) = tail.split_once(") ") else {
        return Cow::Borrowed(text);
    };
    if let Some(rest) = action.strip_prefix("DO NOTHING") {
        return Cow::Owned(format!(
            "{head} ON DUPLICATE KEY UPDATE {column} = {column}{rest}"
        ));
    }
    let Some(sets) = action.strip_prefix("DO UPDATE SET ") else {
        return Cow::Borrowed(text);
    };
    let mut out = format!("{head} ON DUPLICATE KEY UPDATE ");
    let mut rest = sets;
    while let Some(at) = rest.find("excluded.") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "excluded.".len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        out.push_str(&format!("VALUES({})", &after[..end]));
        rest = &after[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Every `$N` as `?`. MySQL binds by position, so the text must use
/// `$1, $2, ...` in that order, each once (every query here does; a test
/// checks them all).
fn placeholders(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

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

/// [`insert_orders`] that returns the reservation id of each row it created
/// (SQLite; MySQL reads them back with [`orders_by_ids`], PostgreSQL has
/// [`INSERT_ORDERS_ARRAYS`]).
pub fn insert_orders_returning(rows: usize) -> String {
    insert_orders(rows) + " RETURNING reservation_id"
}

/// The text [`INSERT_ORDERS_ARRAYS`] and [`INSERT_NEW_ORDERS_ARRAYS`] share.
macro_rules! insert_orders_arrays {
    () => {
        "INSERT INTO orders (order_id, reservation_id, sale_id, user_id, idempotency_key, reserved_at_ms, created_at_ms, status) SELECT o, r, s, u, k, t, $7, 'created' FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[]) AS x(o, r, s, u, k, t)"
    };
}

/// PostgreSQL: [`insert_orders_returning`] whose rows come as one array
/// literal per column (`$1` order ids, `$2` reservation ids, `$3` sale
/// ids, `$4` user ids, `$5` Idempotency-Keys, `$6` reserved_at_ms; see
/// `OrderColumns` in `orders.rs`) and `created_at_ms` as `$7`. Its text
/// does not grow with the batch, so it is parsed and planned once per
/// connection, and the server reads seven parameters instead of seven per
/// row; an array literal costs the server less to read than JSON. Rows
/// are inserted in array order (`unnest` keeps it), which is the lock
/// order the caller chose.
pub const INSERT_ORDERS_ARRAYS: &str = concat!(
    insert_orders_arrays!(),
    " ON CONFLICT (reservation_id) DO NOTHING RETURNING reservation_id"
);

/// [`INSERT_ORDERS_ARRAYS`] as a plain insert: a row whose reservation has
/// its order already is a unique violation.
pub const INSERT_NEW_ORDERS_ARRAYS: &str = insert_orders_arrays!();

/// `SELECT` of the reservation ids of `n` order ids (`$1..$n`).
pub fn orders_by_ids(n: usize) -> String {
    let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    format!(
        "SELECT reservation_id FROM orders WHERE order_id IN ({})",
        params.join(", ")
    )
}

/// `SELECT` of the orders of `n` reservation ids (`$1..$n`).
pub fn orders_by_reservations(n: usize) -> String {
    let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    format!("SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE reservation_id IN ({})", params.join(", "))
}

pub const ORDER_BY_RESERVATION: &str = "SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE reservation_id = $1";

pub const COUNT_LIVE_ORDERS: &str =
    "SELECT COUNT(*) FROM orders WHERE sale_id = $1 AND status <> 'cancelled'";

pub const INSERT_SALE_IF_ABSENT: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms, paused, draw_window_ms, buckets, checkout_url) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $10) ON CONFLICT (id) DO NOTHING";

/// MySQL: [`INSERT_SALE_IF_ABSENT`] without the upsert, whose affected-rows
/// count (sqlx asks for found rows) cannot tell a new row from an old one;
/// the caller takes a duplicate-key error for "already there".
pub const INSERT_SALE: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms, paused, draw_window_ms, buckets, checkout_url) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $10)";

/// Keeps `created_at_ms`, `paused` and `buckets` of an existing row (a
/// saved sale's bucket count never changes: gateways and backends must
/// agree on it).
pub const UPSERT_SALE: &str = "INSERT INTO sales (id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, created_at_ms, paused, draw_window_ms, buckets, checkout_url) VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $10) ON CONFLICT (id) DO UPDATE SET name = excluded.name, stock = excluded.stock, per_user_limit = excluded.per_user_limit, starts_at_ms = excluded.starts_at_ms, ends_at_ms = excluded.ends_at_ms, draw_window_ms = excluded.draw_window_ms, checkout_url = excluded.checkout_url";

pub const SALE_BY_ID: &str =
    "SELECT id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, draw_window_ms, buckets, checkout_url FROM sales WHERE id = $1";

pub const ALL_SALES: &str =
    "SELECT id, name, stock, per_user_limit, starts_at_ms, ends_at_ms, draw_window_ms, buckets, checkout_url FROM sales ORDER BY id";

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
pub const ADOPT_SETTING: &str =
    "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";

pub const SET_SETTING: &str = "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value";

pub const PAYMENT_TIMEOUT: &str = "SELECT payment_timeout_seconds FROM sales WHERE id = $1";

pub const ORDER_BY_ID: &str =
    "SELECT order_id, reservation_id, sale_id, user_id, status FROM orders WHERE order_id = $1";

/// Decides a payment once: only an order still `created` becomes `paid`.
pub const PAY_IF_CREATED: &str =
    "UPDATE orders SET status = 'paid' WHERE order_id = $1 AND status = 'created'";

/// Decides an expiry once: only an order still `created` is cancelled.
pub const CANCEL_IF_CREATED: &str =
    "UPDATE orders SET status = 'cancelled' WHERE order_id = $1 AND status = 'created'";

/// Unpaid orders past their sale's payment timeout at `$1` (`$2` is the
/// same time), oldest first. The second bound on `reserved_at_ms` (by the
/// shortest timeout of any sale) follows from the first and keeps the
/// search to a range of `orders_status_reserved`: without it the database
/// reads every unpaid order at each poll (every second), since the first
/// bound depends on the joined sale.
pub const EXPIRED_ORDERS: &str = "SELECT o.order_id, o.reservation_id, o.sale_id, o.user_id FROM orders o JOIN sales s ON s.id = o.sale_id WHERE o.status = 'created' AND o.reserved_at_ms + s.payment_timeout_seconds * 1000 < $1 AND o.reserved_at_ms < $2 - (SELECT MIN(payment_timeout_seconds) FROM sales) * 1000 ORDER BY o.reserved_at_ms LIMIT $3";

/// Cancelled orders whose item has not been given back to Redis yet, in
/// order id order after the cursor `$1`, so a pass pages through all of
/// them once however many it cannot return now.
pub const UNRELEASED_CANCELLED: &str = "SELECT order_id, reservation_id, sale_id, user_id FROM orders WHERE status = 'cancelled' AND released_at_ms IS NULL AND order_id > $1 ORDER BY order_id LIMIT $2";

/// Orders of a sale still waiting for something: a payment, or the return
/// of a cancelled order's item. A sale with any is not archived.
pub const UNSETTLED_ORDERS: &str =
    "SELECT COUNT(*) FROM orders WHERE sale_id = $1 AND (status = 'created' OR (status = 'cancelled' AND released_at_ms IS NULL))";

pub const MARK_RELEASED: &str =
    "UPDATE orders SET released_at_ms = $1 WHERE order_id = $2 AND released_at_ms IS NULL";

/// Every order of a sale, for restores and reconciliation.
pub const SALE_ORDERS: &str = "SELECT order_id, reservation_id, sale_id, user_id, status, released_at_ms FROM orders WHERE sale_id = $1";

/// Every order of a sale with its Idempotency-Key, for a re-sync.
pub const SALE_ORDERS_WITH_KEYS: &str =
    "SELECT order_id, reservation_id, sale_id, user_id, status, released_at_ms, idempotency_key, reserved_at_ms FROM orders WHERE sale_id = $1";

/// PostgreSQL: a transaction that holds sales, opened read committed and
/// with a 5 s wait for a held row, in one round trip (the simple-query
/// protocol takes several statements; `SET LOCAL` lasts until the end of
/// the transaction).
pub const BEGIN_HELD: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '5s'";

/// PostgreSQL: holds a sale's row against a re-sync while orders are written.
pub const HOLD_SALE_SHARED: &str = "SELECT id FROM sales WHERE id = $1 FOR SHARE";

/// PostgreSQL: holds a sale's row against order writes while it is re-synced.
pub const HOLD_SALE_EXCLUSIVE: &str = "SELECT id FROM sales WHERE id = $1 FOR UPDATE";

/// MySQL: holds a sale's row against a re-sync while orders are written
/// (MariaDB 10.11 has no `FOR SHARE`).
pub const HOLD_SALE_SHARED_MYSQL: &str = "SELECT id FROM sales WHERE id = $1 LOCK IN SHARE MODE";

/// MySQL, on every new connection: read committed like PostgreSQL (so a
/// re-sync that waited for a write reads it, and inserts take no gap
/// locks), and a wait for a row lock gives up after 5 s.
/// (Two statements: MySQL 8 and MariaDB name the isolation variable
/// differently, and `SET TRANSACTION` cannot be combined with others.)
pub const MYSQL_SESSION: &[&str] = &[
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET SESSION innodb_lock_wait_timeout = 5",
];

/// SQLite: a write that changes nothing, to take the database's one write
/// lock at the start of a transaction (SQLite's `BEGIN` defers it).
pub const TAKE_WRITE_LOCK: &str = "UPDATE sales SET id = id WHERE id = $1";

/// Panics unless `text` numbers its placeholders `$1, $2, ...` in order,
/// each once: MySQL binds by position.
#[cfg(test)]
pub(super) fn assert_placeholders_in_order(text: &str) {
    let mut expected = 1;
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let digits: String = rest[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert_eq!(
            digits,
            expected.to_string(),
            "MySQL binds by position: {text}"
        );
        expected += 1;
        rest = &rest[at + 1 + digits.len()..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fixed query, for the dialect checks.
    const ALL: &[&str] = &[
        ORDER_BY_RESERVATION,
        COUNT_LIVE_ORDERS,
        INSERT_SALE_IF_ABSENT,
        INSERT_SALE,
        UPSERT_SALE,
        SALE_BY_ID,
        ALL_SALES,
        SET_PAYMENT_TIMEOUT,
        SET_SALE_PAUSED,
        SALE_PAUSED,
        SALE_PAUSES,
        ADOPT_SALE_PAUSED,
        SETTING,
        ADOPT_SETTING,
        SET_SETTING,
        PAYMENT_TIMEOUT,
        ORDER_BY_ID,
        PAY_IF_CREATED,
        CANCEL_IF_CREATED,
        EXPIRED_ORDERS,
        UNRELEASED_CANCELLED,
        UNSETTLED_ORDERS,
        MARK_RELEASED,
        SALE_ORDERS,
        SALE_ORDERS_WITH_KEYS,
        HOLD_SALE_SHARED_MYSQL,
        HOLD_SALE_EXCLUSIVE,
    ];

    #[test]
    fn every_query_numbers_its_placeholders_in_binding_order() {
        for text in ALL {
            assert_placeholders_in_order(text);
        }
    }

    #[test]
    fn mysql_gets_question_marks_and_duplicate_key_updates() {
        assert_eq!(
            dialect(Flavour::Mysql, SET_PAYMENT_TIMEOUT),
            "UPDATE sales SET payment_timeout_seconds = ? WHERE id = ?"
        );
        assert_eq!(
            dialect(Flavour::Mysql, ADOPT_SETTING),
            "INSERT INTO settings (name, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE name = name"
        );
        assert_eq!(
            dialect(Flavour::Mysql, SET_SETTING),
            "INSERT INTO settings (name, value) VALUES (?, ?) ON DUPLICATE KEY UPDATE value = VALUES(value)"
        );
        let upsert = dialect(Flavour::Mysql, UPSERT_SALE);
        assert!(upsert.ends_with("ON DUPLICATE KEY UPDATE name = VALUES(name), stock = VALUES(stock), per_user_limit = VALUES(per_user_limit), starts_at_ms = VALUES(starts_at_ms), ends_at_ms = VALUES(ends_at_ms), draw_window_ms = VALUES(draw_window_ms), checkout_url = VALUES(checkout_url)"), "{upsert}");
        let insert = dialect(Flavour::Mysql, &insert_orders(2)).into_owned();
        assert!(insert.ends_with("(?, ?, ?, ?, ?, ?, ?, 'created') ON DUPLICATE KEY UPDATE reservation_id = reservation_id"), "{insert}");
        assert!(
            !insert.contains('$') && !insert.contains("IGNORE"),
            "{insert}"
        );
        assert_eq!(dialect(Flavour::Postgres, SET_SETTING), SET_SETTING);
    }

    #[test]
    fn insert_statement_numbers_every_parameter_once() {
        let sql = super::insert_orders(2);
        assert!(
            sql.contains("($1, $2, $3, $4, $5, $6, $7, 'created'), ($8, "),
            "{sql}"
        );
        assert!(sql.contains("$14, 'created')"), "{sql}");
        assert!(!sql.contains("$15"));
    }
}
