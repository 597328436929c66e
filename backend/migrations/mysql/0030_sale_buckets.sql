-- How many buckets (Redis hash tags) a sale's stock is split over, 1 to 64;
-- 1 keeps the sale in one slot, exactly as before. Copied into the sale's
-- Redis meta (`buckets`) when the sale is preheated.
ALTER TABLE sales ADD COLUMN buckets BIGINT NOT NULL DEFAULT 1;
