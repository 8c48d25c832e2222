-- A role one replica holds at a time (push delivery), renewed by it like
-- a lease: `holder` is the replica, `last_run` its last renewal.
ALTER TABLE a2a_jobs ADD COLUMN holder BYTEA NOT NULL DEFAULT ''::bytea;
