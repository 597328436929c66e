-- A sale's own opening draw window in ms (0 = no draw); NULL: the sale
-- follows `[fairness] window_ms`. Copied into the sale's Redis meta
-- (`draw_window_ms`) whenever the sale is written there.
ALTER TABLE sales ADD COLUMN draw_window_ms BIGINT;
