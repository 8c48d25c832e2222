-- Delivery reads the outbox once, in seq order (the primary key), and
-- keeps each queue's order itself, so the per-queue index of 0006 is only
-- a cost on every insert.
DROP INDEX IF EXISTS push_outbox_by_queue;
