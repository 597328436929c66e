-- The order events outbox: each change of an order (created, paid,
-- cancelled) writes its event here in the same transaction as the change,
-- and the backend's deliverer sends it to the shop (webhook, AMQP), then
-- deletes it. `seq` orders the events of one order; an event is sent only
-- once none of lower `seq` is left for its order. `state` is `pending` or
-- `dead` (gave up after `events.max_attempts`; retried by an operator).
CREATE TABLE IF NOT EXISTS order_events (
    event_id TEXT PRIMARY KEY,
    order_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    -- The JSON body, as sent and signed: a duplicate is the same bytes.
    payload TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    state TEXT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_attempt_at_ms BIGINT NOT NULL,
    -- The claim of the deliverer sending it, until `lease_until_ms`.
    lease_owner TEXT,
    lease_until_ms BIGINT NOT NULL DEFAULT 0,
    -- Bit set of the destinations that took it (1 webhook, 2 AMQP).
    sinks_done BIGINT NOT NULL DEFAULT 0,
    last_error TEXT,
    UNIQUE (order_id, seq)
);

CREATE INDEX IF NOT EXISTS order_events_due ON order_events (state, next_attempt_at_ms);
CREATE INDEX IF NOT EXISTS order_events_lease ON order_events (lease_owner);
