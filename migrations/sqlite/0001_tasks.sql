-- Tasks, keyed by (tenant, id). The task itself is the encoded protobuf
-- record; the other columns are copies of what ListTasks filters and sorts
-- on (spec §3.1.4) and of what recovery and retention select.
-- Keys are BLOBs: SQLite compares them byte by byte (the order the store
-- contract requires) and they hold any string, NUL included.
CREATE TABLE tasks (
    tenant            BLOB    NOT NULL,
    id                BLOB    NOT NULL,
    context_id        BLOB    NOT NULL,
    state             INTEGER NOT NULL,
    status_seconds    INTEGER NOT NULL,
    status_nanos      INTEGER NOT NULL,
    -- id of the message that created the task: idempotent SendMessage.
    origin_message_id BLOB    NOT NULL,
    version           INTEGER NOT NULL,
    record            BLOB    NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;

-- ListTasks: newest status first, ties by id, per tenant; the same with a
-- context or state filter.
CREATE INDEX tasks_by_time ON tasks (tenant, status_seconds DESC, status_nanos DESC, id);
CREATE INDEX tasks_by_context ON tasks (tenant, context_id, status_seconds DESC, status_nanos DESC, id);
CREATE INDEX tasks_by_state ON tasks (tenant, state, status_seconds DESC, status_nanos DESC, id);
-- Recovery (active states) and retention (terminal states by age).
CREATE INDEX tasks_by_state_time ON tasks (state, status_seconds, status_nanos);
-- One task per creating message in a tenant.
CREATE UNIQUE INDEX tasks_by_origin ON tasks (tenant, origin_message_id) WHERE origin_message_id <> x'';
