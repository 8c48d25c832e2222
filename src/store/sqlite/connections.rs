//! The database's connections: the settings each takes, the writer's and
//! the readers', and the lock file that makes one process the database's
//! only user.

use std::path::Path;

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// A read waiting for a reader: runs on the connection it is given.
type ReadJob = Box<dyn FnOnce(&mut Connection) + Send>;

/// The readers: [`MAX_READERS`] read-only connections (WAL lets them run
/// beside the writer), each on a thread of its own, opened up front so the
/// first requests do not pay for opening. A read is a job on their shared
/// queue: however many wait, they wait as tasks, and the process has
/// exactly these threads for reading. (Reads once waited for a pooled
/// connection each on a tokio blocking thread: 256 at once made 230
/// threads, each a stack and an allocator heap, 160 MB.)
#[derive(Clone)]
pub(super) struct Readers {
    jobs: Sender<(Instant, ReadJob)>,
}

impl Readers {
    pub(super) fn open(path: &Path) -> Result<Readers, StoreError> {
        let (jobs, queue) = std::sync::mpsc::channel::<(Instant, ReadJob)>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..MAX_READERS {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(map_err)?;
            conn.set_prepared_statement_cache_capacity(READER_STATEMENT_CACHE);
            configure(&conn).map_err(map_err)?;
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("sqlite-reader-{n}"))
                .spawn(move || read_jobs(conn, &queue))
                .map_err(|e| StoreError::Unavailable(format!("sqlite reader thread: {e}")))?;
        }
        Ok(Readers { jobs })
    }

    /// Runs `read` on the next free reader. A read not begun within
    /// [`ACQUIRE_TIMEOUT`] is UNAVAILABLE; one whose caller has gone is
    /// not begun.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            if !answer.is_closed() {
                let _ = answer.send(read(conn));
            }
        });
        let queued = Instant::now();
        self.jobs
            .send((queued, job))
            .map_err(|_| StoreError::Unavailable("sqlite: the readers have stopped".into()))?;
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(format!(
                "sqlite: no free reader within {ACQUIRE_TIMEOUT:?}"
            )))
        })
    }
}

/// A reader's thread: takes the queue's next job, until every [`Readers`]
/// handle is gone. A job that waited past [`ACQUIRE_TIMEOUT`] is dropped
/// unrun (its caller hears UNAVAILABLE), so a backlog drains instead of
/// running reads nobody waits for any more.
fn read_jobs(mut conn: Connection, queue: &Mutex<Receiver<(Instant, ReadJob)>>) {
    loop {
        let next = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok((queued, job)) = next else {
            return;
        };
        if queued.elapsed() <= ACQUIRE_TIMEOUT {
            // A read that panics fails its caller (its answer is dropped),
            // not the reader.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
            if ran.is_err() {
                tracing::error!("a sqlite read panicked");
            }
        }
    }
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
