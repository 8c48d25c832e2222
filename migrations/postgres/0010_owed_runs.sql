-- The runs owed to the task's follow-up messages: one entry, the id of
-- the replica that committed the message, per follow-up whose run has not
-- started. The write that commits a follow-up appends it; that replica's
-- claim before the run starts (`claim_run`, fenced) removes one. A replica
-- declared dead starts no run, so an interrupted task owing a run to one
-- never gets it: the sweep for orphaned tasks fails it. Entries left on a
-- task that ended (its queue was dropped) are never read.
ALTER TABLE tasks ADD COLUMN owed BYTEA[] NOT NULL DEFAULT '{}';
-- The sweep reads only interrupted tasks (INPUT_REQUIRED, AUTH_REQUIRED)
-- owing a run.
CREATE INDEX tasks_owing_runs ON tasks (tenant, id) WHERE owed <> '{}' AND state IN (6, 8);
