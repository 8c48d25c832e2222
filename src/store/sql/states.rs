//! The task states as SQL: the lifecycle core's classes of states as lists
//! of their numbers, and the conditions the SQL backends' indexes repeat.

use crate::lifecycle::{StateClass, classify};
use crate::proto::TaskState;

/// PostgreSQL's condition for a task that has not ended: the same terms
/// as its `tasks_open_by_owner` index's (migration 0008), which a query
/// must repeat for the index to serve it.
pub(crate) const OPEN_STATES_SQL: &str = "state IN (1, 2, 6, 8)";
/// SQLite's, the same states without an `IN` list of more than two
/// constants (SQLite migration 0010): SQLite evaluates such a list by
/// building a temporary B-tree of it, and a partial index's condition is
/// evaluated for every row written. Not four equalities ORed either: a
/// ListTasks query's `state = ?` would imply them, and SQLite would read
/// this index and sort instead of reading the list's index in order.
pub(crate) const OPEN_STATES_SQLITE: &str = "(state BETWEEN 1 AND 2 OR state IN (6, 8))";
/// ... and for a task waiting for input.
pub(crate) const WAITING_STATES_SQL: &str = "state IN (6, 8)";

/// The states of `class` as an SQL list of their numbers, for
/// `state IN (...)`: the lifecycle core says which states are active or
/// terminal, and the stores ask it rather than keep lists of their own.
pub(crate) fn state_list(class: StateClass) -> String {
    TaskState::REAL
        .iter()
        .filter(|s| classify(**s) == Ok(class))
        .map(|s| (*s as i32).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Counts the tasks of each state that has not ended (by the
/// `tasks_by_state_time` index, which both SQL backends have).
pub(crate) fn unfinished_counts() -> String {
    format!(
        "SELECT state, COUNT(*) FROM tasks WHERE state IN ({},{}) GROUP BY state",
        state_list(StateClass::Active),
        state_list(StateClass::Interrupted)
    )
}

/// [`unfinished_counts`]' rows as states and counts (a number that is no
/// state, which no write stores, is left out).
pub(crate) fn counted(rows: Vec<(i32, i64)>) -> Vec<(TaskState, u64)> {
    rows.into_iter()
        .filter_map(|(state, n)| Some((TaskState::try_from(state).ok()?, n.max(0) as u64)))
        .collect()
}
