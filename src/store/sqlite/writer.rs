//! The single SQLite writer, with group commit.
//!
//! SQLite allows one writer at a time; several connections competing for
//! the write lock spend their time in the busy handler's sleeps (measured:
//! about 400 task creations/s). Instead every write goes to one thread that
//! owns one connection: it takes whatever writes are queued (up to
//! [`MAX_BATCH`]), runs them in one `BEGIN IMMEDIATE ... COMMIT`, and only
//! then answers each caller. One commit then covers many writes, and a
//! caller is never told of a write before it is committed.
//!
//! The connection is opened, configured and migrated by sqlx like the
//! readers, but the writer then takes its raw handle for good
//! (`lock_handle`) and drives it synchronously through rusqlite, on the
//! same bundled SQLite. Through sqlx every call is a hand-off to the
//! connection's worker thread, and on a loaded machine each hand-off waits
//! for a CPU; a batch then paid for several thread switches plus parsing
//! one large generated statement. Here each write is a cached prepared
//! statement run on the writer's own thread.
//!
//! Inside the transaction each write is one statement, in arrival order. A
//! write refused by a constraint (id or creating message taken, or any
//! other) or by its expected version fails by itself: SQLite undoes only
//! that statement, and the others commit. Any other error (disk full, I/O)
//! rolls the whole batch back and every write of it gets the error.

use rusqlite::{ErrorCode, OptionalExtension, params};
use sqlx::sqlite::SqliteConnection;
use tokio::sync::{mpsc, oneshot};

use super::{TERMINAL, state_list};
use crate::store::StoreError;

/// Writes taken into one transaction at most.
pub const MAX_BATCH: usize = 256;
/// Writes that may wait for the writer before callers wait for room.
pub const WRITE_QUEUE: usize = 4096;
/// The writer connection's page cache, in KiB (readers keep
/// [`super::CACHE_KIB`]).
pub const WRITER_CACHE_KIB: i64 = 2048;
/// Writes between requests for a background checkpoint.
pub const CHECKPOINT_EVERY_WRITES: usize = 1000;

/// The columns of one task row, encoded by the caller (off the writer).
pub(super) struct Row {
    pub tenant: Vec<u8>,
    pub id: Vec<u8>,
    pub context_id: Vec<u8>,
    pub state: i32,
    pub status: (i64, i32),
    pub origin_message_id: Vec<u8>,
    pub record: std::sync::Arc<[u8]>,
}

pub(super) enum Write {
    Create(Row),
    Update { row: Row, expected_version: i64 },
    Purge { before: (i64, i32) },
}

/// What a write did, as the store reports it.
pub(super) enum Outcome {
    Created,
    /// The id is taken.
    IdTaken,
    /// The creating message already created the task with this id.
    OriginTaken(Vec<u8>),
    Updated(u64),
    /// Version mismatch; the current version, or `None` if the task is gone.
    Stale(Option<i64>),
    Purged(u64),
}

type Reply = oneshot::Sender<Result<Outcome, StoreError>>;

#[derive(Clone)]
pub(super) struct WriterHandle {
    tx: mpsc::Sender<(Write, Reply)>,
}

impl WriterHandle {
    /// Starts the writer on a thread of its own, which owns `conn` until
    /// the last handle is dropped. As a task among the server's, its
    /// batches would wait behind request handling whenever the runtime is
    /// busy, and every write waits on it.
    pub async fn spawn(
        conn: SqliteConnection,
        checkpoint_conn: SqliteConnection,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let checkpoint = spawn_checkpointer(checkpoint_conn);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("sqlite writer runtime: {e}")))?;
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || run(runtime, conn, rx, checkpoint, ready_tx))
            .map_err(|e| StoreError::Unavailable(format!("sqlite writer thread: {e}")))?;
        ready_rx
            .await
            .map_err(|_| StoreError::Unavailable("sqlite writer did not start".into()))??;
        Ok(WriterHandle { tx })
    }

    pub async fn write(&self, write: Write) -> Result<Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((write, reply))
            .await
            .map_err(|_| StoreError::Unavailable("sqlite writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("sqlite writer stopped mid-write".into()))?
    }
}

fn run(
    runtime: tokio::runtime::Runtime,
    mut conn: SqliteConnection,
    mut rx: mpsc::Receiver<(Write, Reply)>,
    checkpoint: mpsc::Sender<()>,
    ready: oneshot::Sender<Result<(), StoreError>>,
) {
    {
        let mut locked = match runtime.block_on(conn.lock_handle()) {
            Ok(locked) => locked,
            Err(e) => {
                let _ = ready.send(Err(StoreError::Unavailable(format!("sqlite writer: {e}"))));
                return;
            }
        };
        // SAFETY: `locked` keeps sqlx's worker thread off this handle until
        // it is dropped, after `db`; `from_handle` never closes the handle,
        // and dropping `db` finalizes the statements it prepared.
        let db = match unsafe { rusqlite::Connection::from_handle(locked.as_raw_handle().as_ptr()) }
        {
            Ok(db) => db,
            Err(e) => {
                let _ = ready.send(Err(map_err(e)));
                return;
            }
        };
        db.set_prepared_statement_cache_capacity(16);
        // Every COMMIT walks the page cache's whole hash table
        // (pcache1Truncate, from pager_end_transaction); with the readers'
        // large cache that walk cost the writer a fifth of its time
        // (measured with perf). The writer touches few pages per batch.
        if let Err(e) = db.pragma_update(None, "cache_size", -WRITER_CACHE_KIB) {
            let _ = ready.send(Err(map_err(e)));
            return;
        }
        let _ = ready.send(Ok(()));
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut since_checkpoint = 0;
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let results = commit_batch(&db, &batch);
            since_checkpoint += batch.len();
            // A full channel means a checkpoint is already due.
            if since_checkpoint >= CHECKPOINT_EVERY_WRITES && checkpoint.try_send(()).is_ok() {
                since_checkpoint = 0;
            }
            for ((_, reply), result) in batch.drain(..).zip(results) {
                let _ = reply.send(result);
            }
        }
        drop(db);
    }
    let _ = runtime.block_on(sqlx::Connection::close(conn));
}

/// Checkpoints the WAL into the database on its own connection whenever
/// the writer asks, until the writer stops.
///
/// A checkpoint run by the writer itself (SQLite's automatic one, at
/// [`super::WAL_CHECKPOINT_PAGES`]) stalls every caller of the batch behind
/// it while it copies pages. A PASSIVE checkpoint on another connection
/// runs beside the writer, and once it has caught up SQLite restarts the
/// WAL from its start at the next write, so the automatic checkpoint
/// stays a backstop that rarely fires.
fn spawn_checkpointer(mut conn: SqliteConnection) -> mpsc::Sender<()> {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&mut conn)
                .await
            {
                tracing::warn!(error = %e, "sqlite checkpoint failed");
            }
        }
        let _ = sqlx::Connection::close(conn).await;
    });
    tx
}

fn map_err(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        // After BUSY_TIMEOUT: another process holds the write lock.
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(format!("sqlite busy: {e}"))
        }
        Some(ErrorCode::DiskFull | ErrorCode::SystemIoFailure | ErrorCode::CannotOpen) => {
            StoreError::Unavailable(format!("sqlite: {e}"))
        }
        _ => StoreError::Internal(format!("sqlite: {e}")),
    }
}

/// Runs the batch in one transaction; one result per write, in order.
fn commit_batch(
    db: &rusqlite::Connection,
    batch: &[(Write, Reply)],
) -> Vec<Result<Outcome, StoreError>> {
    let all_fail = |e: StoreError| batch.iter().map(|_| Err(e.clone())).collect();
    // Prepared once and cached, like the writes: no parse per batch.
    let run = |sql: &str| db.prepare_cached(sql).and_then(|mut s| s.execute([]));
    if let Err(e) = run("BEGIN IMMEDIATE") {
        return all_fail(map_err(e));
    }
    let mut results = Vec::with_capacity(batch.len());
    for (write, _) in batch {
        match apply(db, write) {
            Ok(outcome) => results.push(Ok(outcome)),
            // A constraint (a CHECK, a trigger) refused this statement:
            // SQLite undid only it, so only this write fails.
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                results.push(Err(map_err(e)));
            }
            Err(e) => {
                let _ = run("ROLLBACK");
                return all_fail(map_err(e));
            }
        }
    }
    if let Err(e) = run("COMMIT") {
        let _ = run("ROLLBACK");
        return all_fail(map_err(e));
    }
    results
}

/// One write inside the batch's transaction. `Err` is a failure that
/// aborts the batch; a refused write is an `Ok` outcome.
fn apply(db: &rusqlite::Connection, write: &Write) -> rusqlite::Result<Outcome> {
    match write {
        Write::Create(row) => {
            let inserted = db
                .prepare_cached(
                    "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, \
                     status_nanos, origin_message_id, version, record) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                )?
                .execute(params![
                    row.tenant,
                    row.id,
                    row.context_id,
                    row.state,
                    row.status.0,
                    row.status.1,
                    row.origin_message_id,
                    &row.record[..],
                ]);
            match inserted {
                Ok(_) => Ok(Outcome::Created),
                Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                    // SQLite undid only this statement; find which key is taken.
                    let taken = db
                        .prepare_cached("SELECT 1 FROM tasks WHERE tenant = ? AND id = ?")?
                        .query_row(params![row.tenant, row.id], |_| Ok(()))
                        .optional()?;
                    if taken.is_some() {
                        return Ok(Outcome::IdTaken);
                    }
                    let origin: Option<Vec<u8>> = db
                        .prepare_cached(
                            "SELECT id FROM tasks WHERE tenant = ? AND origin_message_id = ? \
                             AND origin_message_id <> x''",
                        )?
                        .query_row(params![row.tenant, row.origin_message_id], |r| r.get(0))
                        .optional()?;
                    match origin {
                        Some(id) => Ok(Outcome::OriginTaken(id)),
                        None => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        }
        Write::Update {
            row,
            expected_version,
        } => {
            let changed = db
                .prepare_cached(
                    "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, \
                     status_nanos = ?, version = version + 1, record = ? \
                     WHERE tenant = ? AND id = ? AND version = ?",
                )?
                .execute(params![
                    row.context_id,
                    row.state,
                    row.status.0,
                    row.status.1,
                    &row.record[..],
                    row.tenant,
                    row.id,
                    expected_version,
                ])?;
            if changed == 1 {
                return Ok(Outcome::Updated(*expected_version as u64 + 1));
            }
            let current: Option<i64> = db
                .prepare_cached("SELECT version FROM tasks WHERE tenant = ? AND id = ?")?
                .query_row(params![row.tenant, row.id], |r| r.get(0))
                .optional()?;
            Ok(Outcome::Stale(current))
        }
        Write::Purge { before } => {
            // The state list is made of the enum's own numbers, not input.
            let sql = format!(
                "DELETE FROM tasks WHERE state IN ({}) AND (status_seconds < ?1 \
                 OR (status_seconds = ?1 AND status_nanos < ?2))",
                state_list(&TERMINAL)
            );
            let purged = db
                .prepare_cached(&sql)?
                .execute(params![before.0, before.1])?;
            Ok(Outcome::Purged(purged as u64))
        }
    }
}
