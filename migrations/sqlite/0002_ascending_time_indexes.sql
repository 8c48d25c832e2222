-- The ListTasks indexes of 0001 stored time descending, so every new or
-- updated task went in at the left edge of its range: SQLite's append
-- fast path only serves the right edge, so each insert rebalanced pages
-- and left them half full, and a commit dirtied more pages. The same order
-- is read by scanning backwards: time ascending with id descending, read
-- in reverse, is newest first with ties by id ascending (spec §3.1.4).
DROP INDEX tasks_by_time;
DROP INDEX tasks_by_context;
DROP INDEX tasks_by_state;
CREATE INDEX tasks_by_time ON tasks (tenant, status_seconds, status_nanos, id DESC);
CREATE INDEX tasks_by_context ON tasks (tenant, context_id, status_seconds, status_nanos, id DESC);
CREATE INDEX tasks_by_state ON tasks (tenant, state, status_seconds, status_nanos, id DESC);
