-- The open-tasks index (0008) again, its condition written without an IN
-- list of more than two constants. A partial index's condition is
-- evaluated for every row a statement writes (for an update, before and
-- after), and SQLite evaluates `state IN (1, 2, 6, 8)` by first building a
-- temporary B-tree of the list, each time the statement runs: about a
-- fifth of the writer's work for a new task. A list of two is compared in
-- place, and so is a range.
--
-- Not four equalities ORed: SQLite takes a query's `state = 2` as implying
-- `state = 1 OR state = 2 OR ...`, and ListTasks filtered by owner and
-- state would then read this index and sort, instead of reading its own
-- index in order. The same states (SUBMITTED, WORKING, INPUT_REQUIRED,
-- AUTH_REQUIRED); a query must repeat this condition exactly for SQLite
-- to use the index (`store::sql::OPEN_STATES_SQLITE`).
DROP INDEX tasks_open_by_owner;
CREATE INDEX tasks_open_by_owner ON tasks (owner)
    WHERE (state BETWEEN 1 AND 2 OR state IN (6, 8));
