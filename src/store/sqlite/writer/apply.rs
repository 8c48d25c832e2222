//! Each write's statements inside the batch's transaction: creates,
//! updates (optimistic, by version), quarantine, purges and the outbox's
//! changes, a refused one told apart from one that must roll the batch
//! back.

use rusqlite::{ErrorCode, OptionalExtension, params};

use super::origins::Origins;
use super::{Row, StatementFailure, WriteOutcome, WriteRequest};
use crate::lifecycle::StateClass;
use crate::store::sql::state_list;

/// A new task's row.
const INSERT_TASK: &str = "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, \
     status_nanos, origin_message_id, owner, version, record) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)";
/// A task's row after a whole write.
const UPDATE_WHOLE: &str = "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, \
     status_nanos = ?, version = version + 1, record = ?, changes_bytes = ? \
     WHERE tenant = ? AND id = ? AND version = ?";
/// A task's row after a write of changes.
const UPDATE_CHANGES: &str = "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, \
     status_nanos = ?, version = version + 1, changes_bytes = changes_bytes + ? \
     WHERE tenant = ? AND id = ? AND version = ?";

/// One write inside the batch's transaction. A write refused for a taken
/// id, origin or version is an `Ok` outcome.
pub(super) fn apply(
    db: &rusqlite::Connection,
    write: &WriteRequest,
    origins: &mut Origins,
) -> Result<WriteOutcome, StatementFailure> {
    match write {
        WriteRequest::Create(row) => create(db, row, origins),
        WriteRequest::Update {
            row,
            expected_version,
        } => update(db, row, *expected_version),
        WriteRequest::Quarantine { tenant, id, reason } => quarantine(db, tenant, id, reason),
        WriteRequest::Purge { before } => purge(db, *before, origins),
        WriteRequest::FinishDelivery { seq } => {
            db.prepare_cached("DELETE FROM push_outbox WHERE seq = ?")?
                .execute([seq])?;
            Ok(WriteOutcome::Outbox)
        }
        WriteRequest::DeferDelivery {
            seq,
            attempts,
            not_before_ms,
        } => {
            db.prepare_cached("UPDATE push_outbox SET attempts = ?, not_before = ? WHERE seq = ?")?
                .execute([attempts, not_before_ms, seq])?;
            Ok(WriteOutcome::Outbox)
        }
    }
}

/// Whether the row's (tenant, id) is taken.
fn id_taken(db: &rusqlite::Connection, row: &Row) -> rusqlite::Result<bool> {
    Ok(db
        .prepare_cached("SELECT 1 FROM tasks WHERE tenant = ? AND id = ?")?
        .query_row(params![row.tenant, row.id], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Inserts a new task, unless its id is taken or its creating message
/// already created one; logs the creating message with it.
fn create(
    db: &rusqlite::Connection,
    row: &Row,
    origins: &mut Origins,
) -> Result<WriteOutcome, StatementFailure> {
    // Whole: `SqliteStore::create_encoded` refuses a create of changes.
    let record = row.body.bytes();
    let has_origin = !row.origin.is_empty();
    if has_origin && let Some(existing) = origins.find(db, &row.tenant, &row.origin)? {
        // A taken id is reported first, as the insert would.
        return Ok(if id_taken(db, row)? {
            WriteOutcome::IdTaken
        } else {
            WriteOutcome::OriginTaken(existing)
        });
    }
    let inserted = db.prepare_cached(INSERT_TASK)?.execute(params![
        row.tenant,
        row.id,
        row.context_id,
        row.state,
        row.status.0,
        row.status.1,
        row.origin,
        row.owner,
        &record[..],
    ]);
    match inserted {
        Ok(_) => {}
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
            // SQLite undid only this statement: the id is taken, or
            // another constraint (a trigger) refused the row.
            return if id_taken(db, row)? {
                Ok(WriteOutcome::IdTaken)
            } else {
                Err(StatementFailure::Refused(e))
            };
        }
        Err(e) => return Err(StatementFailure::Abort(e)),
    }
    if has_origin {
        // The task row is in; without its log entry the batch must not
        // commit, whatever refused it.
        origins.append(db, row).map_err(StatementFailure::Abort)?;
    }
    add_to_outbox(db, row).map_err(StatementFailure::Abort)?;
    Ok(WriteOutcome::Created)
}

/// The row's push notifications, into the outbox in the same transaction.
fn add_to_outbox(db: &rusqlite::Connection, row: &Row) -> rusqlite::Result<()> {
    for entry in &row.outbox {
        db.prepare_cached(
            "INSERT INTO push_outbox (tenant, task_id, config_id, event) VALUES (?, ?, ?, ?)",
        )?
        .execute(params![
            row.tenant,
            row.id,
            entry.config_id.as_bytes(),
            entry.event
        ])?;
    }
    Ok(())
}

/// Changes a task made from `expected_version` (optimistic concurrency),
/// as migration 0009 lays it out: a write of changes appends them to
/// `task_changes`; a whole write drops what was there and puts the record
/// in `tasks.record` once the task has ended, else in `task_changes` (the
/// `tasks` row, rewritten by every update, stays small while the task
/// runs).
fn update(
    db: &rusqlite::Connection,
    row: &Row,
    expected_version: i64,
) -> Result<WriteOutcome, StatementFailure> {
    use crate::store::Body;
    let ended = crate::lifecycle::state_from_i32(row.state).is_ok_and(|s| s.is_terminal());
    let (record, kept, whole): (&[u8], i64, bool) = match &row.body {
        Body::Whole(record) if ended => (record, 0, true),
        Body::Whole(record) => (&[], record.len() as i64, true),
        Body::Changes(changes) => (&[], changes.len() as i64, false),
    };
    let changed = if whole {
        db.prepare_cached(UPDATE_WHOLE)?.execute(params![
            row.context_id,
            row.state,
            row.status.0,
            row.status.1,
            record,
            kept,
            row.tenant,
            row.id,
            expected_version,
        ])?
    } else {
        db.prepare_cached(UPDATE_CHANGES)?.execute(params![
            row.context_id,
            row.state,
            row.status.0,
            row.status.1,
            kept,
            row.tenant,
            row.id,
            expected_version,
        ])?
    };
    if changed == 1 {
        // The row is changed; without its changes and outbox entries the
        // batch must not commit, whatever refused them.
        let version = expected_version + 1;
        let keep = |whole: bool, body: &[u8]| -> rusqlite::Result<usize> {
            db.prepare_cached(
                "INSERT INTO task_changes (tenant, task_id, version, whole, body) \
                 VALUES (?, ?, ?, ?, ?)",
            )?
            .execute(params![row.tenant, row.id, version, whole, body])
        };
        let kept = match &row.body {
            Body::Whole(record) => db
                .prepare_cached("DELETE FROM task_changes WHERE tenant = ? AND task_id = ?")
                .and_then(|mut s| s.execute(params![row.tenant, row.id]))
                .and_then(|_| if ended { Ok(0) } else { keep(true, record) }),
            Body::Changes(changes) => keep(false, changes),
        };
        kept.map_err(StatementFailure::Abort)?;
        add_to_outbox(db, row).map_err(StatementFailure::Abort)?;
        return Ok(WriteOutcome::Updated(version as u64));
    }
    let current: Option<i64> = db
        .prepare_cached("SELECT version FROM tasks WHERE tenant = ? AND id = ?")?
        .query_row(params![row.tenant, row.id], |r| r.get(0))
        .optional()?;
    Ok(WriteOutcome::Stale(current))
}

/// Moves a task's record into `quarantine`, with why.
fn quarantine(
    db: &rusqlite::Connection,
    tenant: &[u8],
    id: &[u8],
    reason: &str,
) -> Result<WriteOutcome, StatementFailure> {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    // Its last whole record and the changes after it go with it, each
    // change length-delimited, in order.
    let mut record: Option<Vec<u8>> = None;
    let mut changes: Option<Vec<u8>> = None;
    {
        let mut statement = db.prepare_cached(
            "SELECT whole, body FROM task_changes WHERE tenant = ? AND task_id = ? \
             ORDER BY version",
        )?;
        let mut rows = statement.query(params![tenant, id])?;
        while let Some(r) = rows.next()? {
            let (whole, body): (bool, Vec<u8>) = (r.get(0)?, r.get(1)?);
            if whole {
                record = Some(body);
                changes = None;
                continue;
            }
            let all = changes.get_or_insert_with(Vec::new);
            prost::encoding::encode_varint(body.len() as u64, all);
            all.extend_from_slice(&body);
        }
    }
    db.prepare_cached(
        "INSERT OR REPLACE INTO quarantine (tenant, id, record, changes, reason, at) \
         SELECT tenant, id, COALESCE(?, record), ?, ?, ? FROM tasks WHERE tenant = ? AND id = ?",
    )?
    .execute(params![record, changes, reason, at, tenant, id])?;
    db.prepare_cached("DELETE FROM task_changes WHERE tenant = ? AND task_id = ?")?
        .execute(params![tenant, id])?;
    db.prepare_cached("DELETE FROM tasks WHERE tenant = ? AND id = ?")?
        .execute(params![tenant, id])?;
    Ok(WriteOutcome::Quarantined)
}

/// Deletes the terminal tasks whose status is older than `before`, with
/// their creating messages (which may then create a task again).
fn purge(
    db: &rusqlite::Connection,
    before: (i64, i32),
    origins: &mut Origins,
) -> Result<WriteOutcome, StatementFailure> {
    // The state list is made of the enum's own numbers, not input.
    let purged = format!(
        "state IN ({}) AND (status_seconds < ?1 \
         OR (status_seconds = ?1 AND status_nanos < ?2))",
        state_list(StateClass::Terminal)
    );
    let mut deleted = [0; 2];
    for (table, deleted) in ["origins", "origin_log"].into_iter().zip(&mut deleted) {
        *deleted = db
            .prepare_cached(&format!(
                "DELETE FROM {table} WHERE (tenant, message_id) IN \
                 (SELECT tenant, origin_message_id FROM tasks WHERE {purged} \
                 AND origin_message_id <> x'')"
            ))?
            .execute(params![before.0, before.1])?;
    }
    // Terminal writes are whole: a purged task has no changes, unless an
    // older writer left some.
    db.prepare_cached(&format!(
        "DELETE FROM task_changes WHERE (tenant, task_id) IN \
         (SELECT tenant, id FROM tasks WHERE {purged} AND changes_bytes > 0)"
    ))?
    .execute(params![before.0, before.1])?;
    let n = db
        .prepare_cached(&format!("DELETE FROM tasks WHERE {purged}"))?
        .execute(params![before.0, before.1])?;
    origins.merged = origins.merged.saturating_sub(deleted[0]);
    if deleted[1] > 0 {
        // Within the transaction, so a create later in this batch sees the
        // freed messages; a rollback reads the log back.
        origins.reload(db).map_err(StatementFailure::Abort)?;
    }
    Ok(WriteOutcome::Purged(n as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The opcodes SQLite compiles `sql` to, on a database of the current
    /// schema.
    fn opcodes(sql: &str) -> Vec<String> {
        let mut db = rusqlite::Connection::open_in_memory().unwrap();
        crate::store::sqlite::schema::migrate(&mut db).unwrap();
        let mut explain = db.prepare(&format!("EXPLAIN {sql}")).unwrap();
        // EXPLAIN runs nothing: its parameters may stay NULL.
        let unbound = vec![rusqlite::types::Null; explain.parameter_count()];
        explain
            .query_map(rusqlite::params_from_iter(unbound), |r| {
                r.get::<_, String>(1)
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// A task's row is written without a temporary table: a partial
    /// index's condition is evaluated for every row written (for an
    /// update, for the row before and after), and SQLite evaluates
    /// `x IN (a, b, c, ...)` of more than two constants by building an
    /// ephemeral B-tree of them first, each time the statement runs
    /// (callgrind: about 19,000 instructions of the writer's per new
    /// task, a fifth of its whole write).
    #[test]
    fn a_tasks_writes_build_no_temporary_table() {
        for sql in [INSERT_TASK, UPDATE_WHOLE, UPDATE_CHANGES] {
            let ops = opcodes(sql);
            assert!(ops.iter().any(|op| op == "IdxInsert"), "{sql}: {ops:?}");
            assert!(
                !ops.iter().any(|op| op == "OpenEphemeral"),
                "{sql} builds a temporary table: {ops:?}"
            );
        }
    }
}
