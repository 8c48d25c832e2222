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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use rusqlite::{Connection, ErrorCode, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

use super::map_err;
use crate::lifecycle::StateClass;
use crate::store::StoreError;
use crate::store::sql::state_list;

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

pub(super) enum Write {
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
    /// The task was moved aside.
    Quarantined,
    /// An outbox change was made.
    Outbox,
}

type Reply = oneshot::Sender<Result<Outcome, StoreError>>;

#[derive(Clone)]
pub(super) struct WriterHandle {
    tx: mpsc::Sender<(Write, Reply)>,
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

/// What the writer thread is given besides its connection and queue.
struct Parts {
    checkpoint: std::sync::mpsc::SyncSender<()>,
    ready: oneshot::Sender<Result<(), StoreError>>,
    recent: SharedRecent,
    identity: FileIdentity,
    metrics: Arc<std::sync::OnceLock<crate::metrics::WriterMetrics>>,
}

fn run(db: Connection, mut rx: mpsc::Receiver<(Write, Reply)>, parts: Parts) {
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

/// The database file as it was opened: its path and what it is (device and
/// inode), to notice it being removed or replaced while serving.
pub struct FileIdentity {
    path: std::path::PathBuf,
    dev: u64,
    ino: u64,
    /// Hard links to it when opened.
    pub links: u64,
}

impl FileIdentity {
    pub fn of(path: &std::path::Path) -> Result<Self, StoreError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot read {}: {e}", path.display())))?;
        Ok(FileIdentity {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            links: meta.nlink(),
        })
    }

    /// Fails when the path no longer names the opened file.
    fn check(&self) -> Result<(), StoreError> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => Ok(()),
            Ok(_) => Err(StoreError::Unavailable(format!(
                "the database file {} was replaced while the server ran; writes are refused \
                 so that none is acknowledged and lost (restart the server)",
                self.path.display()
            ))),
            Err(e) => Err(StoreError::Unavailable(format!(
                "the database file {} is gone ({e}); writes are refused so that none is \
                 acknowledged and lost (restart the server)",
                self.path.display()
            ))),
        }
    }
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
fn spawn_checkpointer(conn: Connection) -> Result<std::sync::mpsc::SyncSender<()>, StoreError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "sqlite checkpoint failed");
                }
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("sqlite checkpoint thread: {e}")))?;
    Ok(tx)
}

/// Runs the batch in one transaction; one result per write, in order.
fn commit_batch(
    db: &rusqlite::Connection,
    batch: &[(Write, Reply)],
    origins: &mut Origins,
) -> Vec<Result<Outcome, StoreError>> {
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
            Err(Failure::Refused(e)) => results.push(Err(map_err(e))),
            Err(Failure::Abort(e)) => {
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
enum Failure {
    /// A constraint refused this write's statement; SQLite undid only it.
    Refused(rusqlite::Error),
    /// Anything else: the batch is rolled back.
    Abort(rusqlite::Error),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::ConstraintViolation) => Failure::Refused(e),
            _ => Failure::Abort(e),
        }
    }
}

type OriginKey = (Vec<u8>, Vec<u8>);

/// Logged creating messages: tenant, then message id, to the task id.
/// Nested so a lookup borrows its keys instead of building a tuple of
/// owned copies on every create.
type Recent = HashMap<Vec<u8>, HashMap<Vec<u8>, Vec<u8>>>;

/// What memory says of a (tenant, message id).
pub enum OriginLookup {
    /// In the origin log: the task id.
    Logged(Vec<u8>),
    /// Its hash is among the merged origins': read `origins` to know.
    MaybeMerged,
    /// Created no task.
    Absent,
}

/// The creating messages in memory: the log's entries, and a 64-bit hash
/// of every pair merged into `origins` (read from the table at start, then
/// added by each merge), so that a lookup of a new message, the common
/// case, needs no query at all. About 16 bytes per merged task. A purge
/// leaves its hashes behind (a later lookup of one reads `origins` and
/// finds nothing, which is only a wasted read) until they are as many as
/// the live ones: then the set is read afresh from `origins`
/// ([`Origins::settle`]), so it never holds more than about twice the
/// tasks kept.
#[derive(Default)]
pub(super) struct OriginIndex {
    recent: Recent,
    merged: HashSet<u64, foldhash::fast::RandomState>,
    hasher: foldhash::fast::RandomState,
}

impl OriginIndex {
    fn hash(&self, tenant: &[u8], message_id: &[u8]) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.hasher.build_hasher();
        h.write_usize(tenant.len());
        h.write(tenant);
        h.write(message_id);
        h.finish()
    }

    fn may_be_merged(&self, tenant: &[u8], message_id: &[u8]) -> bool {
        self.merged.contains(&self.hash(tenant, message_id))
    }

    fn add_merged(&mut self, tenant: &[u8], message_id: &[u8]) {
        let h = self.hash(tenant, message_id);
        self.merged.insert(h);
    }
}

/// [`OriginIndex`] shared between the writer (which alone changes it) and
/// readers.
type SharedRecent = Arc<RwLock<OriginIndex>>;

// A panic while the lock is held cannot leave the index half-changed in a
// way a reader could misuse (each change is one insert or remove), so a
// poisoned lock is used as it is.
fn read(recent: &SharedRecent) -> std::sync::RwLockReadGuard<'_, OriginIndex> {
    recent.read().unwrap_or_else(|e| e.into_inner())
}

fn write(recent: &SharedRecent) -> std::sync::RwLockWriteGuard<'_, OriginIndex> {
    recent.write().unwrap_or_else(|e| e.into_inner())
}

/// The writer's view of the creating messages: `origin_log`'s entries in
/// memory (the log has no index, so lookups in it are these), and the size
/// of `origins`, which sets when the log is merged.
pub(super) struct Origins {
    recent: SharedRecent,
    /// Keys the current batch added to `recent`.
    added: Vec<OriginKey>,
    merged: usize,
    /// The log in memory may differ from the table (reading it back after
    /// a rollback failed): reload it before the next batch.
    stale: bool,
}

impl Origins {
    fn load(db: &rusqlite::Connection, recent: SharedRecent) -> rusqlite::Result<Self> {
        let merged: i64 = db.query_row("SELECT COUNT(*) FROM origins", [], |r| r.get(0))?;
        {
            let mut index = write(&recent);
            let mut stmt = db.prepare("SELECT tenant, message_id FROM origins")?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let tenant: Vec<u8> = row.get(0)?;
                let message_id: Vec<u8> = row.get(1)?;
                index.add_merged(&tenant, &message_id);
            }
        }
        let mut origins = Origins {
            recent,
            added: Vec::new(),
            merged: merged as usize,
            stale: true,
        };
        origins.reload(db)?;
        Ok(origins)
    }

    fn reload(&mut self, db: &rusqlite::Connection) -> rusqlite::Result<()> {
        let mut stmt = db.prepare("SELECT tenant, message_id, task_id FROM origin_log")?;
        let mut rows = stmt.query([])?;
        let mut recent = Recent::new();
        while let Some(row) = rows.next()? {
            recent
                .entry(row.get(0)?)
                .or_default()
                .insert(row.get(1)?, row.get(2)?);
        }
        write(&self.recent).recent = recent;
        self.stale = false;
        Ok(())
    }

    /// Reads the merged hashes afresh from `origins`, dropping the purged
    /// tasks' ones. Built beside the set and swapped in: lookups go on
    /// meanwhile, and nothing else changes the set (merges run on this
    /// thread).
    fn rebuild_merged(&mut self, db: &rusqlite::Connection) -> rusqlite::Result<()> {
        let hasher = read(&self.recent).hasher.clone();
        let mut fresh = OriginIndex {
            hasher,
            ..Default::default()
        };
        let mut stmt = db.prepare("SELECT tenant, message_id FROM origins")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let tenant: Vec<u8> = row.get(0)?;
            let message_id: Vec<u8> = row.get(1)?;
            fresh.add_merged(&tenant, &message_id);
        }
        self.merged = fresh.merged.len();
        write(&self.recent).merged = fresh.merged;
        Ok(())
    }

    /// After a rollback: forgets what the batch added, then reads the log
    /// back (a purge in the batch may have removed entries, now restored).
    fn rolled_back(&mut self, db: &rusqlite::Connection) {
        {
            let mut index = write(&self.recent);
            for (tenant, message_id) in self.added.drain(..) {
                if let Some(messages) = index.recent.get_mut(&tenant) {
                    messages.remove(&message_id);
                }
            }
        }
        if let Err(e) = self.reload(db) {
            tracing::warn!(error = %e, "sqlite origin log could not be read back");
            self.stale = true;
        }
    }

    /// The task created by `message_id` in `tenant`, if any.
    fn find(
        &self,
        db: &rusqlite::Connection,
        tenant: &[u8],
        message_id: &[u8],
    ) -> rusqlite::Result<Option<Vec<u8>>> {
        match read(&self.recent)
            .recent
            .get(tenant)
            .and_then(|m| m.get(message_id))
        {
            Some(id) => return Ok(Some(id.clone())),
            None if !read(&self.recent).may_be_merged(tenant, message_id) => return Ok(None),
            None => {}
        }
        db.prepare_cached("SELECT task_id FROM origins WHERE tenant = ? AND message_id = ?")?
            .query_row(params![tenant, message_id], |r| r.get(0))
            .optional()
    }

    /// Records a new creating message (inside the batch's transaction).
    fn append(&mut self, db: &rusqlite::Connection, row: &Row) -> rusqlite::Result<()> {
        db.prepare_cached("INSERT INTO origin_log (tenant, message_id, task_id) VALUES (?, ?, ?)")?
            .execute(params![row.tenant, row.origin, row.id])?;
        write(&self.recent)
            .recent
            .entry(row.tenant.clone())
            .or_default()
            .insert(row.origin.clone(), row.id.clone());
        self.added.push((row.tenant.clone(), row.origin.clone()));
        Ok(())
    }

    /// The log's size that triggers a merge.
    fn merge_at(&self) -> usize {
        (self.merged / 4).clamp(ORIGIN_LOG_MIN, ORIGIN_LOG_MAX)
    }

    /// Between batches: reloads the log if it is stale, and merges it into
    /// `origins` once it is large enough, in one transaction of its own.
    fn settle(&mut self, db: &rusqlite::Connection) -> rusqlite::Result<()> {
        if self.stale {
            self.reload(db)?;
        }
        let hashes = read(&self.recent).merged.len();
        if hashes > 2 * self.merged + ORIGIN_LOG_MIN {
            self.rebuild_merged(db)?;
        }
        let logged: usize = read(&self.recent).recent.values().map(HashMap::len).sum();
        if logged < self.merge_at() {
            return Ok(());
        }
        let run = |sql: &str| db.prepare_cached(sql).and_then(|mut s| s.execute([]));
        run("BEGIN IMMEDIATE")?;
        let merged = (|| {
            // Sorted, so the inserts walk `origins` from one end to the
            // other and each of its pages is written once. OR IGNORE: the
            // log never repeats a pair the table holds, and should it, the
            // first task stays the message's task.
            let n = db
                .prepare_cached(
                    "INSERT OR IGNORE INTO origins (tenant, message_id, task_id) \
                     SELECT tenant, message_id, task_id FROM origin_log \
                     ORDER BY tenant, message_id",
                )?
                .execute([])?;
            run("DELETE FROM origin_log")?;
            run("COMMIT")?;
            Ok(n)
        })();
        match merged {
            Ok(n) => {
                self.merged += n;
                let mut index = write(&self.recent);
                let recent = std::mem::take(&mut index.recent);
                for (tenant, messages) in &recent {
                    for message_id in messages.keys() {
                        index.add_merged(tenant, message_id);
                    }
                }
                Ok(())
            }
            Err(e) => {
                let _ = run("ROLLBACK");
                Err(e)
            }
        }
    }
}

/// One write inside the batch's transaction. A write refused for a taken
/// id, origin or version is an `Ok` outcome.
fn apply(
    db: &rusqlite::Connection,
    write: &Write,
    origins: &mut Origins,
) -> Result<Outcome, Failure> {
    match write {
        Write::Create(row) => create(db, row, origins),
        Write::Update {
            row,
            expected_version,
        } => update(db, row, *expected_version),
        Write::Quarantine { tenant, id, reason } => quarantine(db, tenant, id, reason),
        Write::Purge { before } => purge(db, *before, origins),
        Write::FinishDelivery { seq } => {
            db.prepare_cached("DELETE FROM push_outbox WHERE seq = ?")?
                .execute([seq])?;
            Ok(Outcome::Outbox)
        }
        Write::DeferDelivery {
            seq,
            attempts,
            not_before_ms,
        } => {
            db.prepare_cached("UPDATE push_outbox SET attempts = ?, not_before = ? WHERE seq = ?")?
                .execute([attempts, not_before_ms, seq])?;
            Ok(Outcome::Outbox)
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
fn create(db: &rusqlite::Connection, row: &Row, origins: &mut Origins) -> Result<Outcome, Failure> {
    // Whole: `SqliteStore::create_encoded` refuses a create of changes.
    let record = row.body.bytes();
    let has_origin = !row.origin.is_empty();
    if has_origin && let Some(existing) = origins.find(db, &row.tenant, &row.origin)? {
        // A taken id is reported first, as the insert would.
        return Ok(if id_taken(db, row)? {
            Outcome::IdTaken
        } else {
            Outcome::OriginTaken(existing)
        });
    }
    let inserted = db
        .prepare_cached(
            "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, \
             status_nanos, origin_message_id, owner, version, record) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
        )?
        .execute(params![
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
                Ok(Outcome::IdTaken)
            } else {
                Err(Failure::Refused(e))
            };
        }
        Err(e) => return Err(Failure::Abort(e)),
    }
    if has_origin {
        // The task row is in; without its log entry the batch must not
        // commit, whatever refused it.
        origins.append(db, row).map_err(Failure::Abort)?;
    }
    add_to_outbox(db, row).map_err(Failure::Abort)?;
    Ok(Outcome::Created)
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
fn update(db: &rusqlite::Connection, row: &Row, expected_version: i64) -> Result<Outcome, Failure> {
    use crate::store::Body;
    let ended = crate::lifecycle::state_from_i32(row.state).is_ok_and(|s| s.is_terminal());
    let (record, kept, whole): (&[u8], i64, bool) = match &row.body {
        Body::Whole(record) if ended => (record, 0, true),
        Body::Whole(record) => (&[], record.len() as i64, true),
        Body::Changes(changes) => (&[], changes.len() as i64, false),
    };
    let changed = if whole {
        db.prepare_cached(
            "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, \
             status_nanos = ?, version = version + 1, record = ?, changes_bytes = ? \
             WHERE tenant = ? AND id = ? AND version = ?",
        )?
        .execute(params![
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
        db.prepare_cached(
            "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, \
             status_nanos = ?, version = version + 1, changes_bytes = changes_bytes + ? \
             WHERE tenant = ? AND id = ? AND version = ?",
        )?
        .execute(params![
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
        kept.map_err(Failure::Abort)?;
        add_to_outbox(db, row).map_err(Failure::Abort)?;
        return Ok(Outcome::Updated(version as u64));
    }
    let current: Option<i64> = db
        .prepare_cached("SELECT version FROM tasks WHERE tenant = ? AND id = ?")?
        .query_row(params![row.tenant, row.id], |r| r.get(0))
        .optional()?;
    Ok(Outcome::Stale(current))
}

/// Moves a task's record into `quarantine`, with why.
fn quarantine(
    db: &rusqlite::Connection,
    tenant: &[u8],
    id: &[u8],
    reason: &str,
) -> Result<Outcome, Failure> {
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
    Ok(Outcome::Quarantined)
}

/// Deletes the terminal tasks whose status is older than `before`, with
/// their creating messages (which may then create a task again).
fn purge(
    db: &rusqlite::Connection,
    before: (i64, i32),
    origins: &mut Origins,
) -> Result<Outcome, Failure> {
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
        origins.reload(db).map_err(Failure::Abort)?;
    }
    Ok(Outcome::Purged(n as u64))
}
