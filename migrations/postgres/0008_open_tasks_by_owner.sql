-- Per-principal quotas (`max_open_tasks` in the auth file) count a
-- principal's tasks that have not ended, in every tenant: this index
-- holds only those (SUBMITTED, WORKING, INPUT_REQUIRED, AUTH_REQUIRED),
-- so the count reads at most the quota's worth of entries.
CREATE INDEX tasks_open_by_owner ON tasks (owner) WHERE state IN (1, 2, 6, 8);
