//! The database's connections: the settings each takes, the writer's and
//! the readers', and the lock file that makes one process the database's
//! only user.

use std::path::Path;

use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, OpenFlags};

use super::{
    ACQUIRE_TIMEOUT, BUSY_TIMEOUT, CACHE_KIB, MAX_READERS, MMAP_BYTES, WAL_CHECKPOINT_PAGES,
    map_err,
};
use crate::store::StoreError;

/// Prepared statements each reader keeps: the few fixed reads and every
/// shape of the ListTasks query (four optional filters).
const READER_STATEMENT_CACHE: usize = 48;

/// The settings every connection to the database takes. WAL and
/// `synchronous=NORMAL` are the durability promise above; a big page
/// cache and memory-mapped reads serve the readers, and the WAL is
/// checkpointed into the database every [`WAL_CHECKPOINT_PAGES`] pages
/// instead of SQLite's 1000, so the writer stops less often.
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch(&format!(
        "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -{CACHE_KIB}; \
         PRAGMA mmap_size = {MMAP_BYTES}; PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES};"
    ))
}

/// A read-write connection (the writer's, the checkpointer's).
pub(super) fn open_read_write(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(map_err)?;
    configure(&conn).map_err(map_err)?;
    Ok(conn)
}

/// The readers: read-only connections (WAL lets them run beside the
/// writer), created up front so the first requests do not pay for opening.
pub(super) fn reader_pool(path: &Path) -> Result<r2d2::Pool<SqliteConnectionManager>, StoreError> {
    let manager = SqliteConnectionManager::file(path)
        .with_flags(OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .with_init(|conn| {
            conn.set_prepared_statement_cache_capacity(READER_STATEMENT_CACHE);
            configure(conn)
        });
    r2d2::Pool::builder()
        .max_size(MAX_READERS)
        .connection_timeout(ACQUIRE_TIMEOUT)
        // A local file does not drop connections: no test query per
        // checkout.
        .test_on_check_out(false)
        .build(manager)
        .map_err(|e| StoreError::Unavailable(format!("sqlite readers: {e}")))
}

/// Takes the lock file beside the database (`<path>.lock`) for as long as
/// the writer runs. One process owns a database: its writer enforces
/// idempotency from memory, and its restart recovery fails every task left
/// active, which would be wrong for another live server's tasks.
pub(super) fn lock_exclusively(path: &Path) -> Result<std::fs::File, StoreError> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = std::path::PathBuf::from(lock_path);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| {
            StoreError::Unavailable(format!("cannot open {}: {e}", lock_path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Unavailable(format!(
            "{} is in use by another server (it holds {})",
            path.display(),
            lock_path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Unavailable(format!(
            "cannot lock {}: {e}",
            lock_path.display()
        ))),
    }
}
