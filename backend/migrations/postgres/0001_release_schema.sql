-- The schema of the last release that created its tables by hand, before
-- migrations. Every statement is idempotent, so this migration adopts a
-- database that release (or an older one) made: its tables are kept, and
-- the columns older releases lack are added. Never edit a migration once
-- released (sqlx refuses a database whose recorded checksum differs): add
-- a new one.
--
-- `ADD COLUMN IF NOT EXISTS` takes an exclusive lock on the table even
-- when the column exists; give up after 5 s rather than queue every read
-- of the old backends behind a long transaction (the backend retries).
SET LOCAL lock_timeout = '5s';

CREATE TABLE IF NOT EXISTS sales (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    stock BIGINT NOT NULL,
    per_user_limit BIGINT NOT NULL,
    starts_at_ms BIGINT NOT NULL,
    ends_at_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
ALTER TABLE sales ADD COLUMN IF NOT EXISTS payment_timeout_seconds BIGINT NOT NULL DEFAULT 900;
-- 1 while an operator has the sale paused; copied into Redis `meta`.
-- NULL on rows made before the column existed: never recorded, so the
-- backend takes the pause Redis has for such a sale; new rows start at 0.
ALTER TABLE sales ADD COLUMN IF NOT EXISTS paused BIGINT;

CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY,
    reservation_id TEXT NOT NULL UNIQUE,
    sale_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    reserved_at_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    status TEXT NOT NULL
);
-- When a cancelled order's item went back to the stock in Redis.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS released_at_ms BIGINT;

CREATE INDEX IF NOT EXISTS orders_sale_user ON orders (sale_id, user_id);

-- Serves the payment-timeout and stock-return loops.
CREATE INDEX IF NOT EXISTS orders_status_reserved ON orders (status, reserved_at_ms);

-- Operator settings that must survive Redis (the global switch).
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
