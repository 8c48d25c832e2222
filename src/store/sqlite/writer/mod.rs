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
//! The writer drives its connection synchronously, on its own thread:
//! each write is a cached prepared statement, with no hand-off to another
//! thread per statement (an async driver's worker thread would add one per
//! call, and on a loaded machine each hand-off waits for a CPU).
//!
//! Inside the transaction each write is one statement, in arrival order. A
//! write refused by a constraint (id or creating message taken, or any
//! other) or by its expected version fails by itself: SQLite undoes only
//! that statement, and the others commit. Any other error (disk full, I/O)
//! rolls the whole batch back and every write of it gets the error.
//!
//! The writer also owns idempotency (one task per creating message in a
//! tenant). New (tenant, message id) pairs are appended to `origin_log`
//! and kept in memory (`Origins`); once the log holds a quarter as many
//! entries as the merged `origins` table (within [`ORIGIN_LOG_MIN`] and
//! [`ORIGIN_LOG_MAX`]) it is merged into that table in one sorted pass.
//! A unique index on random message ids cost a page write per new task;
//! a sorted merge writes each page of `origins` about once per merge, for
//! many entries. Uniqueness needs the writer to be the only one: the
//! store holds an exclusive lock on the database while open.

mod apply;
mod file;
mod origins;

use std::sync::Arc;

use rusqlite::{Connection, ErrorCode};
use tokio::sync::{mpsc, oneshot};

use super::map_err;
use crate::store::StoreError;
use apply::apply;
pub use file::FileIdentity;
use file::spawn_checkpointer;
pub use origins::OriginLookup;
use origins::{Origins, SharedRecent, read};

/// Writes taken into one transaction at most.
pub const MAX_BATCH: usize = 256;
/// Writes that may wait for the writer before callers wait for room.
pub const WRITE_QUEUE: usize = 4096;
/// The writer connection's page cache, in KiB (readers keep
/// [`super::CACHE_KIB`]).
pub const WRITER_CACHE_KIB: i64 = 2048;
/// Writes between requests for a background checkpoint.
pub const CHECKPOINT_EVERY_WRITES: usize = 1000;
/// Entries `origin_log` holds before a merge, at least...
pub const ORIGIN_LOG_MIN: usize = 4096;
/// ... and at most (each costs the writer about 150 bytes of memory).
/// Between the two the log is merged at a quarter of the merged table's
/// size, so a merge rewrites about every page of `origins` for a quarter
/// of its entries: a bounded number of page writes per new task however
/// large the table, until it is four times this.
pub const ORIGIN_LOG_MAX: usize = 65_536;

/// The columns of one task row, encoded by the caller (off the writer).
pub(super) struct Row {
    pub tenant: Vec<u8>,
    pub id: Vec<u8>,
    pub context_id: Vec<u8>,
    pub state: i32,
    pub status: (i64, i32),
    pub owner: Vec<u8>,
    /// The idempotency key (`store::origin_key`), in the
    /// `origin_message_id` column; empty for none.
    pub origin: Vec<u8>,
    /// Push notifications to add to `push_outbox` with this row.
    pub outbox: Vec<crate::store::OutboxEntry>,
    /// The whole record, or this write's changes (`task_changes`).
    pub body: crate::store::Body,
}

pub(super) enum WriteRequest {
    Create(Row),
    Update {
        row: Row,
        expected_version: i64,
    },
    Purge {
        before: (i64, i32),
    },
    /// Moves a task whose record does not decode into `quarantine`.
    Quarantine {
        tenant: Vec<u8>,
        id: Vec<u8>,
        reason: String,
    },
    /// Removes a push notification from the outbox.
    FinishDelivery {
        seq: i64,
    },
    /// Records a failed attempt at one.
    DeferDelivery {
        seq: i64,
        attempts: i64,
        not_before_ms: i64,
    },
}

/// What a write did, as the store reports it.
pub(super) enum WriteOutcome {
    Created,
    /// The id is taken.
    IdTaken,
    /// The creating message already created the task with this id.
    OriginTaken(Vec<u8>),
    Updated(u64),
    /// Version mismatch; the current version, or `None` if the task is gone.
    Stale(Option<i64>),
    Purged(u64),
    /// The task was moved aside.
    Quarantined,
    /// An outbox change was made.
    Outbox,
}

type WriteReply = oneshot::Sender<Result<WriteOutcome, StoreError>>;

#[derive(Clone)]
pub(super) struct WriterHandle {
    tx: mpsc::Sender<(WriteRequest, WriteReply)>,
    /// The origin log in memory and the hashes of the merged origins,
    /// shared with readers: `find_by_origin` looks here first, reads
    /// `origins` by key only on a hash hit, and never reads the log table
    /// (it has no index).
    recent: SharedRecent,
    /// Turns true once the writer has stopped and released the database.
    stopped: tokio::sync::watch::Receiver<bool>,
    /// Where the writer records its batches, once the server says.
    pub metrics: Arc<std::sync::OnceLock<crate::metrics::WriterMetrics>>,
}

impl WriterHandle {
    /// Starts the writer on a thread of its own, which owns `conn` until
    /// the last handle is dropped. As a task among the server's, its
    /// batches would wait behind request handling whenever the runtime is
    /// busy, and every write waits on it.
    /// `lock` (the database's lock file) is held until the writer stops.
    pub async fn spawn(
        conn: Connection,
        checkpoint_conn: Connection,
        lock: std::fs::File,
        identity: FileIdentity,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let checkpoint = spawn_checkpointer(checkpoint_conn)?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stopped_tx, stopped) = tokio::sync::watch::channel(false);
        let recent = SharedRecent::default();
        let shared_recent = recent.clone();
        let metrics = Arc::new(std::sync::OnceLock::new());
        let writer_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                // Woken by a write, it waits for the worker queueing the
                // next ones instead of preempting it: group commit on a
                // busy core.
                crate::os::no_wakeup_preemption();
                let parts = Parts {
                    checkpoint,
                    ready: ready_tx,
                    recent: shared_recent,
                    identity,
                    metrics: writer_metrics,
                };
                run(conn, rx, parts);
                drop(lock);
                stopped_tx.send_replace(true);
            })
            .map_err(|e| StoreError::Unavailable(format!("sqlite writer thread: {e}")))?;
        ready_rx
            .await
            .map_err(|_| StoreError::Unavailable("sqlite writer did not start".into()))??;
        Ok(WriterHandle {
            tx,
            stopped,
            recent,
            metrics,
        })
    }

    /// Where (tenant, message id) stands, in memory. A merge commits its
    /// entries to `origins` before it moves them here from the log to the
    /// merged hashes (under one lock), so a lookup never misses one in
    /// between.
    pub fn origin(&self, tenant: &[u8], message_id: &[u8]) -> OriginLookup {
        let index = read(&self.recent);
        match index.recent.get(tenant).and_then(|m| m.get(message_id)) {
            Some(id) => OriginLookup::Logged(id.clone()),
            None if index.may_be_merged(tenant, message_id) => OriginLookup::MaybeMerged,
            None => OriginLookup::Absent,
        }
    }

    /// How many merged hashes the index holds.
    #[cfg(test)]
    pub fn merged_hashes(&self) -> usize {
        read(&self.recent).merged.len()
    }

    /// Resolves once the writer has stopped (every handle dropped) and the
    /// database may be opened again.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopped = self.stopped.clone();
        async move {
            // Err: the sender is gone, which happens only after it said so.
            let _ = stopped.wait_for(|s| *s).await;
        }
    }

    pub async fn write(&self, write: WriteRequest) -> Result<WriteOutcome, StoreError> {
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

/// What the writer thread is given besides its connection and queue.
struct Parts {
    checkpoint: std::sync::mpsc::SyncSender<()>,
    ready: oneshot::Sender<Result<(), StoreError>>,
    recent: SharedRecent,
    identity: FileIdentity,
    metrics: Arc<std::sync::OnceLock<crate::metrics::WriterMetrics>>,
}

fn run(db: Connection, mut rx: mpsc::Receiver<(WriteRequest, WriteReply)>, parts: Parts) {
    let Parts {
        checkpoint,
        ready,
        recent,
        identity,
        metrics,
    } = parts;
    db.set_prepared_statement_cache_capacity(16);
    // Every COMMIT walks the page cache's whole hash table
    // (pcache1Truncate, from pager_end_transaction); with the readers'
    // large cache that walk cost the writer a fifth of its time
    // (measured with perf). The writer touches few pages per batch.
    if let Err(e) = db.pragma_update(None, "cache_size", -WRITER_CACHE_KIB) {
        let _ = ready.send(Err(map_err(e)));
        return;
    }
    let mut origins = match Origins::load(&db, recent) {
        Ok(origins) => origins,
        Err(e) => {
            let _ = ready.send(Err(map_err(e)));
            return;
        }
    };
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
        if let Some(metrics) = metrics.get() {
            metrics.batch(batch.len(), rx.len());
        }
        // A database file removed or replaced under the server would
        // take every write acknowledged from now on with it at the
        // next start: refuse them instead (one stat per batch).
        let results = match identity.check() {
            Ok(()) => commit_batch(&db, &batch, &mut origins),
            Err(e) => {
                tracing::error!(error = %e, "sqlite writes refused");
                batch.iter().map(|_| Err(e.clone())).collect()
            }
        };
        since_checkpoint += batch.len();
        // A full channel means a checkpoint is already due.
        if since_checkpoint >= CHECKPOINT_EVERY_WRITES && checkpoint.try_send(()).is_ok() {
            since_checkpoint = 0;
        }
        for ((_, reply), result) in batch.drain(..).zip(results) {
            let _ = reply.send(result);
        }
        // After the answers: the merge delays only the writes behind it.
        if let Err(e) = origins.settle(&db) {
            tracing::warn!(error = %e, "sqlite origin log maintenance failed");
        }
    }
    // Closing the connection finalizes its statements; the checkpointer
    // stops when `checkpoint` is dropped with this frame.
    if let Err((_, e)) = db.close() {
        tracing::warn!(error = %e, "sqlite writer connection did not close cleanly");
    }
}

/// Runs the batch in one transaction; one result per write, in order.
fn commit_batch(
    db: &rusqlite::Connection,
    batch: &[(WriteRequest, WriteReply)],
    origins: &mut Origins,
) -> Vec<Result<WriteOutcome, StoreError>> {
    let all_fail = |e: StoreError, origins: &mut Origins| {
        origins.rolled_back(db);
        batch.iter().map(|_| Err(e.clone())).collect()
    };
    origins.added.clear();
    // Prepared once and cached, like the writes: no parse per batch.
    let run = |sql: &str| db.prepare_cached(sql).and_then(|mut s| s.execute([]));
    if let Err(e) = run("BEGIN IMMEDIATE") {
        return all_fail(map_err(e), origins);
    }
    let mut results = Vec::with_capacity(batch.len());
    for (write, _) in batch {
        match apply(db, write, origins) {
            Ok(outcome) => results.push(Ok(outcome)),
            // A constraint (a CHECK, a trigger) refused this statement:
            // SQLite undid only it, so only this write fails.
            Err(StatementFailure::Refused(e)) => results.push(Err(map_err(e))),
            Err(StatementFailure::Abort(e)) => {
                let _ = run("ROLLBACK");
                return all_fail(map_err(e), origins);
            }
        }
    }
    if let Err(e) = run("COMMIT") {
        let _ = run("ROLLBACK");
        return all_fail(map_err(e), origins);
    }
    results
}

/// Why a write did not apply.
enum StatementFailure {
    /// A constraint refused this write's statement; SQLite undid only it.
    Refused(rusqlite::Error),
    /// Anything else: the batch is rolled back.
    Abort(rusqlite::Error),
}

impl From<rusqlite::Error> for StatementFailure {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::ConstraintViolation) => StatementFailure::Refused(e),
            _ => StatementFailure::Abort(e),
        }
    }
}
