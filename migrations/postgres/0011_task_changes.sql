-- Long-lived tasks (issue "long-lived tasks"): an update of a long task
-- appends what it changed instead of rewriting the task. A task is read as
-- its last whole record (`tasks.record`) and the changes of each write after
-- it, in version order; a whole write (a terminal one, or once the changes
-- outweigh the record) replaces the record and deletes them. An update that
-- leaves `record` as it is does not copy it: a large record is TOASTed, and
-- the new row version points at the same value. Rows written before this
-- migration are whole: no changes, nothing to move.
CREATE TABLE task_changes (
    tenant  BYTEA  NOT NULL,
    task_id BYTEA  NOT NULL,
    version BIGINT NOT NULL,
    changes BYTEA  NOT NULL,
    PRIMARY KEY (tenant, task_id, version)
);

-- The size of a task's changes: 0 when it has none (a read of the task then
-- reads nothing else), and with `octet_length(record)` what a ListTasks
-- page's byte budget counts.
ALTER TABLE tasks ADD COLUMN changes_bytes BIGINT NOT NULL DEFAULT 0;

-- A task set aside keeps its changes too, in order.
ALTER TABLE quarantine ADD COLUMN changes BYTEA[];
