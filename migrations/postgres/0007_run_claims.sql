-- Whether the task's runner holds it for a run. Follow-up messages sent to
-- different replicas are each committed there, and each replica queues a
-- run; a queued run starts only on the replica that claims the task
-- (sets `run_held` with itself as `runner`), so two runs of one task never
-- overlap. A create holds it for the first run; a run that ends with the
-- task interrupted releases it (a terminal task runs nothing more). A
-- holder whose lease has expired holds nothing.
ALTER TABLE tasks ADD COLUMN run_held BOOLEAN NOT NULL DEFAULT false;
