-- Where a sale's winners pay: a URL template with `{sale_id}`,
-- `{reservation_id}`, `{order_id}` and `{handoff}` (docs/CHECKOUT.md);
-- NULL: no checkout hand-off. Copied into the sale's Redis meta
-- (`checkout_url`) whenever the sale is written there.
ALTER TABLE sales ADD COLUMN checkout_url TEXT;
