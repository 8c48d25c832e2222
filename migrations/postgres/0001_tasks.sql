-- Tasks: the record (protobuf bytes, as every store keeps it) beside the
-- columns ListTasks filters and orders by. Ids are bytea: ordering is
-- bytewise, as in SQLite, so page cursors mean the same in both.
CREATE TABLE tasks (
    tenant          BYTEA   NOT NULL,
    id              BYTEA   NOT NULL,
    context_id      BYTEA   NOT NULL,
    state           INTEGER NOT NULL,
    status_seconds  BIGINT  NOT NULL,
    status_nanos    INTEGER NOT NULL,
    -- The principal that created the task; empty: none.
    owner           BYTEA   NOT NULL,
    -- The idempotency key (owner and creating message id); empty: none.
    origin          BYTEA   NOT NULL,
    version         BIGINT  NOT NULL,
    record          BYTEA   NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX tasks_by_time ON tasks (tenant, status_seconds DESC, status_nanos DESC, id);
CREATE INDEX tasks_by_context ON tasks (tenant, context_id, status_seconds DESC, status_nanos DESC, id);
CREATE INDEX tasks_by_state ON tasks (tenant, state, status_seconds DESC, status_nanos DESC, id);
CREATE INDEX tasks_by_state_time ON tasks (state, status_seconds, status_nanos);
CREATE INDEX tasks_by_owner ON tasks (tenant, owner, status_seconds DESC, status_nanos DESC, id)
    WHERE owner <> ''::bytea;
-- One task per (tenant, idempotency key): replicas creating the same
-- message's task race here, and a purged task frees its key.
CREATE UNIQUE INDEX tasks_by_origin ON tasks (tenant, origin) WHERE origin <> ''::bytea;

-- Push notifications due (a transactional outbox), in commit order.
CREATE TABLE push_outbox (
    seq         BIGSERIAL PRIMARY KEY,
    tenant      BYTEA   NOT NULL,
    task_id     BYTEA   NOT NULL,
    config_id   BYTEA   NOT NULL,
    event       BYTEA   NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    not_before  BIGINT  NOT NULL DEFAULT 0
);
