-- Long-lived tasks (issue "long-lived tasks"): an update of a long task
-- appends what it changed instead of rewriting the task. A task is read as
-- its last whole record and the changes of each write after it, in version
-- order. The whole record is in `tasks.record` for a task as created and
-- once it has ended; while it is active and long, a write the runtime makes
-- whole again goes here, as a row with `whole = 1`, so that the `tasks` row,
-- which every update rewrites, stays small (SQLite rewrites a row's every
-- column on update, its record's overflow pages included). A whole write
-- deletes the rows before it. Rows written before this migration are whole,
-- in `tasks.record`: nothing to move.
CREATE TABLE task_changes (
    tenant  BLOB    NOT NULL,
    task_id BLOB    NOT NULL,
    version INTEGER NOT NULL,
    -- 1: `body` is the whole record as of `version`; 0: the changes of the
    -- write that made `version` (`lifecycle::Changes`).
    whole   INTEGER NOT NULL,
    body    BLOB    NOT NULL,
    PRIMARY KEY (tenant, task_id, version)
) WITHOUT ROWID;

-- The bytes a task keeps in `task_changes`: 0 when none (a read of the task
-- then reads nothing else), and with `length(record)` what a ListTasks
-- page's byte budget counts.
ALTER TABLE tasks ADD COLUMN changes_bytes INTEGER NOT NULL DEFAULT 0;

-- A task set aside keeps its changes after its record, each
-- length-delimited, one after the other (NULL: none).
ALTER TABLE quarantine ADD COLUMN changes BLOB;
