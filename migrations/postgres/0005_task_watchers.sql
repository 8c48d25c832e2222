-- Replicas following a task they do not run (a subscriber, a waiting
-- request): a run's writes to a task are announced (NOTIFY) only when
-- some replica watches it, so that the writes nobody follows elsewhere
-- skip the commit-time lock every notifying transaction takes. A client's
-- write (a message, a cancel) is always announced: the replica running the
-- task must hear of it.
CREATE TABLE task_watchers (
    tenant   BYTEA NOT NULL,
    task_id  BYTEA NOT NULL,
    replica  BYTEA NOT NULL,
    PRIMARY KEY (tenant, task_id, replica)
);
CREATE INDEX task_watchers_by_replica ON task_watchers (replica);
