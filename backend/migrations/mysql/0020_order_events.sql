-- The order events outbox: each change of an order (created, paid,
-- cancelled) writes its event here in the same transaction as the change,
-- and the backend's deliverer sends it to the shop (webhook, AMQP), then
-- deletes it. `seq` orders the events of one order; an event is sent only
-- once none of lower `seq` is left for its order. `state` is `pending` or
-- `dead` (gave up after `events.max_attempts`; retried by an operator).
CREATE TABLE IF NOT EXISTS order_events (
    event_id VARCHAR(64) NOT NULL PRIMARY KEY,
    order_id VARCHAR(255) NOT NULL,
    seq BIGINT NOT NULL,
    event_type VARCHAR(32) NOT NULL,
    -- The JSON body, as sent and signed: a duplicate is the same bytes.
    payload VARCHAR(8000) NOT NULL,
    created_at_ms BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_attempt_at_ms BIGINT NOT NULL,
    -- The claim of the deliverer sending it, until `lease_until_ms`.
    lease_owner VARCHAR(64),
    lease_until_ms BIGINT NOT NULL DEFAULT 0,
    -- Bit set of the destinations that took it (1 webhook, 2 AMQP).
    sinks_done BIGINT NOT NULL DEFAULT 0,
    last_error VARCHAR(1024),
    UNIQUE KEY order_events_order_seq (order_id, seq),
    INDEX order_events_due (state, next_attempt_at_ms),
    INDEX order_events_lease (lease_owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
