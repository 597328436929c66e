-- The schema of the release that brought MySQL and MariaDB: the same
-- tables and guarantees as the SQLite and PostgreSQL flavours (a unique
-- reservation id, statuses changed only by conditional updates). Never
-- edit a migration once released: add a new one.
--
-- Ids are VARCHAR with a binary collation: ids compare byte for byte (as
-- in the other flavours; the server's default collation would take `A`
-- and `a` for one reservation), and sqlx reads TEXT columns of MySQL as
-- bytes, not strings.

CREATE TABLE IF NOT EXISTS sales (
    id VARCHAR(255) NOT NULL PRIMARY KEY,
    name VARCHAR(1024) NOT NULL,
    stock BIGINT NOT NULL,
    per_user_limit BIGINT NOT NULL,
    starts_at_ms BIGINT NOT NULL,
    ends_at_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    payment_timeout_seconds BIGINT NOT NULL DEFAULT 900,
    -- 1 while an operator has the sale paused; copied into Redis `meta`.
    paused BIGINT
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS orders (
    order_id VARCHAR(255) NOT NULL PRIMARY KEY,
    reservation_id VARCHAR(255) NOT NULL UNIQUE,
    sale_id VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL,
    idempotency_key VARCHAR(255) NOT NULL,
    reserved_at_ms BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    status VARCHAR(16) NOT NULL,
    -- When a cancelled order's item went back to the stock in Redis.
    released_at_ms BIGINT,
    INDEX orders_sale_user (sale_id, user_id),
    -- Serves the payment-timeout and stock-return loops.
    INDEX orders_status_reserved (status, reserved_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Operator settings that must survive Redis (the global switch).
CREATE TABLE IF NOT EXISTS settings (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    value VARCHAR(1024) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
