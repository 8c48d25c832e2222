-- Replicas sharing this database, each with a lease it renews. A replica
-- whose lease has expired is taken for dead: its active tasks are failed
-- by a live one.
CREATE TABLE replicas (
    id           BYTEA       PRIMARY KEY,
    lease_until  TIMESTAMPTZ NOT NULL,
    started      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The replica whose agent last wrote the task: while the task is active,
-- the replica running it.
ALTER TABLE tasks ADD COLUMN runner BYTEA NOT NULL DEFAULT ''::bytea;
CREATE INDEX tasks_by_runner ON tasks (runner) WHERE state IN (1, 2);

-- New messages being answered, by idempotency key: the replica that
-- claimed one runs it, the others wait for its task. Kept while the task
-- exists; released when the message created no task.
CREATE TABLE origin_claims (
    tenant   BYTEA NOT NULL,
    origin   BYTEA NOT NULL,
    replica  BYTEA NOT NULL,
    PRIMARY KEY (tenant, origin)
);

-- Periodic jobs, run by one replica per interval.
CREATE TABLE a2a_jobs (
    name      TEXT        PRIMARY KEY,
    last_run  TIMESTAMPTZ NOT NULL
);
CREATE INDEX origin_claims_by_replica ON origin_claims (replica);
