//! The schema: migrations embedded in the binary, applied at open
//! (rusqlite_migration's `PRAGMA user_version`), a database migrated by
//! earlier versions with sqlx adopted at its version.

use rusqlite::Connection;
use rusqlite_migration::{M, Migrations};

use super::map_err;
use crate::store::StoreError;

/// The schema, in order; a migration's version is its place in this list
/// (1-based), the number in its file name.
const MIGRATIONS: &[M<'static>] = &[
    M::up(include_str!("../../../migrations/sqlite/0001_tasks.sql")),
    M::up(include_str!(
        "../../../migrations/sqlite/0002_ascending_time_indexes.sql"
    )),
    M::up(include_str!(
        "../../../migrations/sqlite/0003_origin_log.sql"
    )),
    M::up(include_str!(
        "../../../migrations/sqlite/0004_quarantine.sql"
    )),
    M::up(include_str!("../../../migrations/sqlite/0005_owners.sql")),
    M::up(include_str!(
        "../../../migrations/sqlite/0006_push_outbox.sql"
    )),
    M::up(include_str!(
        "../../../migrations/sqlite/0007_outbox_read_in_order.sql"
    )),
    M::up(include_str!(
        "../../../migrations/sqlite/0008_open_tasks_by_owner.sql"
    )),
    M::up(include_str!(
        "../../../migrations/sqlite/0009_task_changes.sql"
    )),
    M::up(include_str!(
        "../../../migrations/sqlite/0010_open_tasks_without_in_list.sql"
    )),
];

/// Makes a database created by earlier versions of this server, which
/// applied its migrations with sqlx and recorded them in
/// `_sqlx_migrations`, known to rusqlite_migration at the same version:
/// the file names (and so the versions) are the same.
fn adopt_sqlx_history(conn: &Connection) -> rusqlite::Result<()> {
    let user_version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let recorded: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' \
         AND name = '_sqlx_migrations')",
        [],
        |r| r.get(0),
    )?;
    if user_version != 0 || !recorded {
        return Ok(());
    }
    let version: Option<i64> = conn.query_row(
        "SELECT MAX(version) FROM _sqlx_migrations WHERE success",
        [],
        |r| r.get(0),
    )?;
    if let Some(version) = version {
        tracing::info!(version, "adopting the migrations recorded by sqlx");
        conn.pragma_update(None, "user_version", version)?;
    }
    Ok(())
}

/// Applies the migrations this database lacks.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    // WAL is a property of the database file: set once, by the first
    // connection, before anything else writes.
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .map_err(map_err)?;
    adopt_sqlx_history(conn).map_err(map_err)?;
    Migrations::from_slice(MIGRATIONS)
        .to_latest(conn)
        .map_err(|e| StoreError::Internal(format!("sqlite migration failed: {e}")))
}
