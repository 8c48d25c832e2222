-- Idempotent sends need the task created by each (tenant, message id).
-- As a unique index on tasks, every new task inserted into it at a random
-- place (message ids are random), and each such insert dirtied a page of
-- its own that the commit then wrote to the WAL and a checkpoint copied
-- back: measured, the largest part of a task creation's cost.
--
-- Instead new pairs are appended to `origin_log` (a rowid table: every
-- insert lands on its last page) and merged into `origins` in sorted bulk,
-- where one page write carries many entries. The single writer enforces
-- uniqueness: it checks both tables before a create (src/store/sqlite/
-- writer.rs), keeping the log's entries in memory.
CREATE TABLE origins (
    tenant     BLOB NOT NULL,
    message_id BLOB NOT NULL,
    task_id    BLOB NOT NULL,
    PRIMARY KEY (tenant, message_id)
) WITHOUT ROWID;

CREATE TABLE origin_log (
    tenant     BLOB NOT NULL,
    message_id BLOB NOT NULL,
    task_id    BLOB NOT NULL
);

INSERT INTO origins (tenant, message_id, task_id)
    SELECT tenant, origin_message_id, id FROM tasks WHERE origin_message_id <> x'';

DROP INDEX tasks_by_origin;
