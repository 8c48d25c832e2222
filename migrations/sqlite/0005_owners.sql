-- The principal that created each task (spec §13.1: results scoped to the
-- caller). Tasks already stored were created without authentication: ''.
ALTER TABLE tasks ADD COLUMN owner BLOB NOT NULL DEFAULT x'';
-- A user's ListTasks: its own tasks, newest first. Partial, so a server
-- without authentication (every owner '') keeps no such index and pays
-- nothing for it on writes; the owner-filtered queries repeat the
-- `owner <> x''` term so that SQLite may use it.
CREATE INDEX tasks_by_owner ON tasks (tenant, owner, status_seconds, status_nanos, id DESC)
    WHERE owner <> x'';
-- A user's GetTask and access checks: (tenant, id, owner) in one index, so
-- another principal's task is a miss here, as a missing task is, and its
-- row (record first, owner after it) is never read. Never updated: none of
-- its columns changes after the insert.
CREATE INDEX tasks_by_owner_id ON tasks (tenant, id, owner) WHERE owner <> x'';
-- `tasks.origin_message_id` and `origins.message_id` hold the idempotency
-- key (src/store/mod.rs `origin_key`): per owner, and for owner '' the
-- message id itself, so the keys already stored stay as they are.
