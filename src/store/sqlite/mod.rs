//! The SQLite [`TaskStore`]: the embedded default, durable with no server to
//! install.
//!
//! One row per task (schema in `migrations/sqlite/`, embedded in the binary
//! and applied at open). The database runs in WAL mode with
//! `synchronous=NORMAL`: a committed write survives the process being
//! killed (SIGKILL, crash); only an OS crash or power loss can lose the
//! last commits, which `synchronous=FULL` would prevent at the cost of an
//! fsync per commit. Writes go through one writer connection with group
//! commit ([`writer`]); reads use a pool of reader connections, which WAL
//! lets run beside the writer. Updates carry `WHERE version = ?` for
//! optimistic concurrency.
//!
//! One driver, rusqlite (on its bundled SQLite), for every connection: the
//! writer drives its connection synchronously on a thread of its own, and
//! reads run on tokio's blocking threads with connections from an r2d2
//! pool. Migrations are rusqlite_migration's (`PRAGMA user_version`); a
//! database migrated by earlier versions of this server, which recorded
//! its migrations in sqlx's `_sqlx_migrations` table, is adopted at its
//! version (`adopt_sqlx_history`).

pub mod writer;

use std::path::Path;
use std::time::Duration;

use crate::wkt::Timestamp;
use async_trait::async_trait;
use r2d2_sqlite::SqliteConnectionManager;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};
use rusqlite_migration::{M, Migrations};

use super::sql::{self, Sql, Sqlite, counted, state_list, unfinished_counts};
use super::{
    Delivery, EncodedTask, ListQuery, StoreError, StoredTask, TaskPage, TaskStore, codec,
    origin_key, time_key,
};
use crate::lifecycle::StateClass;
use crate::proto::TaskState;

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
];

/// How long a statement waits for another connection's write lock before
/// failing with UNAVAILABLE.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Page cache per connection, in KiB.
pub const CACHE_KIB: u32 = 64 * 1024;
/// Memory-mapped I/O window per connection, in bytes.
pub const MMAP_BYTES: u64 = 256 * 1024 * 1024;
/// WAL pages (about 4 KiB each) between automatic checkpoints.
pub const WAL_CHECKPOINT_PAGES: u32 = 20_000;
/// Reader connections: WAL lets readers run beside the one writer.
pub const MAX_READERS: u32 = 4;
/// How long a request waits for a free connection.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// Prepared statements each reader keeps: the few fixed reads and every
/// shape of the ListTasks query (four optional filters).
const READER_STATEMENT_CACHE: usize = 48;

/// The task created by a message among the merged origins, by key; read
/// only when the merged origins' hashes in memory hold the pair. Recent
/// ones are in the origin log, which the writer keeps in memory and shares
/// ([`writer::WriterHandle::origin`]): the log table has no index (which is
/// what makes appending to it cheap) and is never read here. A test checks
/// that it reads by key.
const FIND_BY_ORIGIN: &str = "SELECT record, version, changes_bytes, id FROM tasks \
     WHERE tenant = ?1 AND id = (SELECT task_id FROM origins WHERE tenant = ?1 AND message_id = ?2)";
const GET: &str =
    "SELECT record, version, changes_bytes, id FROM tasks WHERE tenant = ?1 AND id = ?2";
/// What a task keeps in `task_changes` (migration 0009), in order.
const CHANGES: &str = "SELECT whole, body FROM task_changes WHERE tenant = ?1 AND task_id = ?2 \
     ORDER BY version";
/// A user's lookup, by the owned tasks' index (migration 0005): the owner
/// is part of the key, so another principal's task is a miss in the index
/// and its row is never read; the empty name owns nothing (the index's
/// condition, repeated so that SQLite may use it).
const GET_OWNED: &str = "SELECT record, version, changes_bytes, id FROM tasks \
     INDEXED BY tasks_by_owner_id WHERE tenant = ?1 AND id = ?2 AND owner = ?3 AND owner <> x''";
/// The outbox in commit order, from a point on (by the primary key).
/// The task's owner comes from its row (by primary key); "" once purged.
const OUTBOX: &str = "SELECT o.seq, o.tenant, o.task_id, o.config_id, o.event, o.attempts, \
     o.not_before, t.owner FROM push_outbox o \
     LEFT JOIN tasks t ON t.tenant = o.tenant AND t.id = o.task_id \
     WHERE o.seq > ?1 ORDER BY o.seq LIMIT ?2";
/// [`GET_OWNED`] without the record: answered from the index alone.
const OWNS: &str = "SELECT 1 FROM tasks INDEXED BY tasks_by_owner_id \
     WHERE tenant = ?1 AND id = ?2 AND owner = ?3 AND owner <> x''";

/// Tasks in a SQLite database file.
#[derive(Clone)]
pub struct SqliteStore {
    readers: r2d2::Pool<SqliteConnectionManager>,
    writer: writer::WriterHandle,
}

/// The one mapping of SQLite errors to store errors, for reads and writes:
/// what may pass (a busy lock, a full disk, I/O) is UNAVAILABLE, anything
/// else INTERNAL.
pub(super) fn map_err(e: rusqlite::Error) -> StoreError {
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
fn open_read_write(path: &Path) -> Result<Connection, StoreError> {
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
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    // WAL is a property of the database file: set once, by the first
    // connection, before anything else writes.
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .map_err(map_err)?;
    adopt_sqlx_history(conn).map_err(map_err)?;
    Migrations::from_slice(MIGRATIONS)
        .to_latest(conn)
        .map_err(|e| StoreError::Internal(format!("sqlite migration failed: {e}")))
}

impl SqliteStore {
    /// Opens (creating if needed, with its folder) the database at `path`
    /// and applies pending migrations.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        // The database is known by its file, not by the path spelling: the
        // canonical path names the lock and is what SQLite opens (so a
        // symlink or `a/../b` reaches the same lock and the same WAL), and
        // a file with several hard links, which would give each link a WAL
        // of its own, is refused.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        let path = std::fs::canonicalize(path).map_err(|e| {
            StoreError::Unavailable(format!("cannot resolve {}: {e}", path.display()))
        })?;
        let path = path.as_path();
        let identity = writer::FileIdentity::of(path)?;
        if identity.links > 1 {
            return Err(StoreError::Unavailable(format!(
                "{} has {} hard links: a database must be reached through one path \
                 (each link would get a WAL of its own)",
                path.display(),
                identity.links
            )));
        }
        let lock = lock_exclusively(path)?;
        let owned = path.to_owned();
        let (write_conn, checkpoint_conn, readers) = tokio::task::spawn_blocking(move || {
            let path = owned.as_path();
            let mut write_conn = open_read_write(path)?;
            migrate(&mut write_conn)?;
            let checkpoint_conn = open_read_write(path)?;
            Ok::<_, StoreError>((write_conn, checkpoint_conn, reader_pool(path)?))
        })
        .await
        .map_err(|e| StoreError::Internal(format!("sqlite open: {e}")))??;
        Ok(SqliteStore {
            readers,
            writer: writer::WriterHandle::spawn(write_conn, checkpoint_conn, lock, identity)
                .await?,
        })
    }

    /// Runs `read` on a reader connection, on a blocking thread (SQLite
    /// calls block).
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = readers
                .get()
                .map_err(|e| StoreError::Unavailable(format!("sqlite: no free reader: {e}")))?;
            read(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("sqlite read: {e}")))?
    }

    /// Moves an undecodable record out of `tasks` into `quarantine`.
    async fn quarantine(
        &self,
        tenant: Vec<u8>,
        id: Vec<u8>,
        reason: String,
    ) -> Result<(), StoreError> {
        tracing::error!(
            tenant = %String::from_utf8_lossy(&tenant),
            task_id = %String::from_utf8_lossy(&id),
            %reason,
            "stored task does not decode: moved to the quarantine table"
        );
        match self
            .writer
            .write(writer::Write::Quarantine { tenant, id, reason })
            .await?
        {
            writer::Outcome::Quarantined => Ok(()),
            _ => Err(StoreError::Internal(
                "sqlite writer answered out of turn".into(),
            )),
        }
    }

    /// Nothing to do: reader connections close with the last clone of the
    /// store, and the writer stops when the last handle goes
    /// ([`SqliteStore::stopped`]). Kept for callers that close explicitly.
    pub async fn close(&self) {}

    /// Resolves once the writer has stopped (after every clone of this
    /// store is dropped) and released the database to another open.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.writer.stopped()
    }
}

/// The readers: read-only connections (WAL lets them run beside the
/// writer), created up front so the first requests do not pay for opening.
fn reader_pool(path: &Path) -> Result<r2d2::Pool<SqliteConnectionManager>, StoreError> {
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
fn lock_exclusively(path: &Path) -> Result<std::fs::File, StoreError> {
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

fn row(tenant: &str, task: &EncodedTask) -> writer::Row {
    writer::Row {
        tenant: tenant.as_bytes().to_vec(),
        id: task.id.as_bytes().to_vec(),
        context_id: task.context_id.as_bytes().to_vec(),
        state: task.state as i32,
        status: task.status,
        owner: task.owner.as_bytes().to_vec(),
        origin: task.origin.clone(),
        outbox: task.outbox.clone(),
        body: task.body.clone(),
    }
}

fn stored(record: Vec<u8>, version: i64, kept: Kept) -> Result<StoredTask, StoreError> {
    let (record, changes) = parts(record, kept);
    Ok(StoredTask {
        record: codec::decode_with_changes(&record, changes.iter().map(Vec::as_slice))?,
        version: version as u64,
    })
}

/// The ListTasks page query ([`sql::page_query`]) in SQLite's dialect.
fn page_query(select: &str, tenant: &str, query: &ListQuery, limit: usize) -> Sql<Sqlite> {
    sql::page_query(select, tenant, query, limit)
}

/// A task by key (`sql` selects its record, version, changes' size and
/// id), or `None`. A task with changes after its whole record is read
/// again with them in one read transaction, so the two are of one commit;
/// one without costs the one statement.
fn read_task(
    conn: &mut Connection,
    sql: &str,
    key: &[&[u8]],
) -> Result<Option<StoredTask>, StoreError> {
    type Raw = (Vec<u8>, i64, i64, Vec<u8>);
    let read = |conn: &Connection, sql: &str, key: &[&[u8]]| -> Result<Option<Raw>, StoreError> {
        conn.prepare_cached(sql)
            .and_then(|mut statement| {
                statement
                    .query_row(rusqlite::params_from_iter(key), |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                    })
                    .optional()
            })
            .map_err(map_err)
    };
    let Some((record, version, changes_bytes, id)) = read(conn, sql, key)? else {
        return Ok(None);
    };
    if changes_bytes == 0 {
        return stored(record, version, Vec::new()).map(Some);
    }
    let tx = conn.transaction().map_err(map_err)?;
    let Some((record, version, _, _)) = read(&tx, GET, &[key[0], &id])? else {
        // Gone since the first look (purged).
        return Ok(None);
    };
    let changes = read_changes(&tx, key[0], &id)?;
    tx.commit().map_err(map_err)?;
    stored(record, version, changes).map(Some)
}

/// What a task keeps in `task_changes`, in order: (whole, body).
fn read_changes(conn: &Connection, tenant: &[u8], id: &[u8]) -> Result<Kept, StoreError> {
    conn.prepare_cached(CHANGES)
        .and_then(|mut s| {
            s.query_map([tenant, id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_err)
}

/// A task's rows in `task_changes`: (whole, body), in version order.
type Kept = Vec<(bool, Vec<u8>)>;

/// A task's whole record and the changes after it, from its `tasks.record`
/// and its `task_changes` rows: the last whole row, if any, is the record
/// (what came before it is no longer read).
fn parts(record: Vec<u8>, kept: Kept) -> (Vec<u8>, Vec<Vec<u8>>) {
    let last_whole = kept.iter().rposition(|(whole, _)| *whole);
    let mut kept = kept.into_iter();
    let record = match last_whole {
        Some(at) => kept.nth(at).map(|(_, body)| body).unwrap_or(record),
        None => record,
    };
    (record, kept.map(|(_, body)| body).collect())
}

impl SqliteStore {
    /// Outbox entries as `sql` (one of [`OUTBOX`], [`OUTBOX_HEADS`]) picks
    /// them.
    async fn read_outbox(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        self.read(move |conn| {
            let mut statement = conn.prepare_cached(OUTBOX).map_err(map_err)?;
            let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
            // SQLite integers are signed: a seq past i64::MAX is never
            // written, so "after" it reads nothing.
            let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
            let rows = statement
                .query_map([after, limit as i64], |r| {
                    Ok(Delivery {
                        seq: r.get::<_, i64>(0)? as u64,
                        tenant: text(r.get(1)?),
                        task_id: text(r.get(2)?),
                        owner: text(r.get::<_, Option<Vec<u8>>>(7)?.unwrap_or_default()),
                        config_id: text(r.get(3)?),
                        event: r.get(4)?,
                        attempts: r.get::<_, i64>(5)? as u32,
                        not_before_ms: r.get(6)?,
                    })
                })
                .map_err(map_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(map_err)
        })
        .await
    }
}

#[async_trait]
impl TaskStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn instrument(&self, writer: crate::metrics::WriterMetrics) {
        // Only the first server's: one store, one writer.
        let _ = self.writer.metrics.set(writer);
    }

    fn keeps_changes(&self) -> bool {
        true
    }

    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        task.body.whole()?;
        match self
            .writer
            .write(writer::Write::Create(row(tenant, task)))
            .await?
        {
            writer::Outcome::Created => Ok(1),
            writer::Outcome::IdTaken => Err(StoreError::AlreadyExists(task.id.clone())),
            writer::Outcome::OriginTaken(id) => Err(StoreError::DuplicateMessage {
                task_id: String::from_utf8_lossy(&id).into_owned(),
            }),
            _ => Err(StoreError::Internal(
                "sqlite writer answered out of turn".into(),
            )),
        }
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        if message_id.is_empty() {
            return Ok(None);
        }
        let origin = origin_key(owner, message_id);
        // Memory first: see `WriterHandle::origin`. A new message (the
        // common case: this runs for every one) is answered without a query.
        match self.writer.origin(tenant.as_bytes(), &origin) {
            writer::OriginLookup::Absent => return Ok(None),
            writer::OriginLookup::Logged(id) => {
                let id = String::from_utf8(id)
                    .map_err(|_| StoreError::Internal("stored task id is not UTF-8".into()))?;
                return self.get(tenant, &id).await;
            }
            writer::OriginLookup::MaybeMerged => {}
        }
        let key = [tenant.as_bytes().to_vec(), origin];
        self.read(move |conn| read_task(conn, FIND_BY_ORIGIN, &[&key[0], &key[1]]))
            .await
    }

    async fn get_owned(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        let key = [
            tenant.as_bytes().to_vec(),
            task_id.as_bytes().to_vec(),
            owner.as_bytes().to_vec(),
        ];
        // No quarantine lookup: whose a set-aside record is cannot be read,
        // so for a user it is as absent as any other task not its own.
        self.read(move |conn| read_task(conn, GET_OWNED, &[&key[0], &key[1], &key[2]]))
            .await
    }

    async fn owns(&self, tenant: &str, task_id: &str, owner: &str) -> Result<bool, StoreError> {
        let key = [
            tenant.as_bytes().to_vec(),
            task_id.as_bytes().to_vec(),
            owner.as_bytes().to_vec(),
        ];
        self.read(move |conn| {
            conn.prepare_cached(OWNS)
                .and_then(|mut s| s.exists(rusqlite::params_from_iter(&key)))
                .map_err(map_err)
        })
        .await
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        let key = [tenant.as_bytes().to_vec(), task_id.as_bytes().to_vec()];
        let task_id = task_id.to_owned();
        self.read(move |conn| {
            if let Some(task) = read_task(conn, GET, &[&key[0], &key[1]])? {
                return Ok(Some(task));
            }
            // Rare: a miss also looks among the records set aside.
            let reason: Option<String> = conn
                .prepare_cached("SELECT reason FROM quarantine WHERE tenant = ?1 AND id = ?2")
                .and_then(|mut s| s.query_row([&key[0], &key[1]], |r| r.get(0)).optional())
                .map_err(map_err)?;
            match reason {
                Some(reason) => Err(StoreError::Internal(format!(
                    "task {task_id:?} was set aside at start because its stored record \
                     does not decode ({reason}); it is kept in the quarantine table"
                ))),
                None => Ok(None),
            }
        })
        .await
    }

    async fn outbox(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        self.read_outbox(after_seq, limit).await
    }

    async fn finish_delivery(&self, seq: u64) -> Result<(), StoreError> {
        self.writer
            .write(writer::Write::FinishDelivery { seq: seq as i64 })
            .await
            .map(drop)
    }

    async fn defer_delivery(
        &self,
        seq: u64,
        attempts: u32,
        not_before_ms: i64,
    ) -> Result<(), StoreError> {
        let write = writer::Write::DeferDelivery {
            seq: seq as i64,
            attempts: attempts as i64,
            not_before_ms,
        };
        self.writer.write(write).await.map(drop)
    }

    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        let write = writer::Write::Update {
            row: row(tenant, task),
            expected_version: expected_version as i64,
        };
        match self.writer.write(write).await? {
            writer::Outcome::Updated(version) => Ok(version),
            writer::Outcome::Stale(None) => Err(StoreError::NotFound(task.id.clone())),
            writer::Outcome::Stale(Some(actual)) => Err(StoreError::Conflict {
                id: task.id.clone(),
                expected: expected_version,
                actual: actual as u64,
            }),
            _ => Err(StoreError::Internal(
                "sqlite writer answered out of turn".into(),
            )),
        }
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let page_size = query.effective_page_size();
        let count = sql::count_query::<Sqlite>(tenant, query);
        // The candidates' sizes first (`length` of a blob reads its
        // header, not its pages), then only the records that fit.
        let sizes = page_query(
            "SELECT length(record) + changes_bytes FROM tasks",
            tenant,
            query,
            page_size + 1,
        );
        let tenant = tenant.to_owned();
        let query_for_page = query.clone();
        let (total, rows, more) = self
            .read(move |conn| {
                // One read transaction: the count and the page see the same
                // snapshot.
                let tx = conn.transaction().map_err(map_err)?;
                let total: i64 = tx
                    .prepare_cached(&count.text)
                    .and_then(|mut s| {
                        s.query_row(rusqlite::params_from_iter(&count.values), |r| r.get(0))
                    })
                    .map_err(map_err)?;
                let sizes = tx
                    .prepare_cached(&sizes.text)
                    .and_then(|mut s| {
                        s.query_map(rusqlite::params_from_iter(&sizes.values), |r| {
                            r.get::<_, i64>(0)
                        })?
                        .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .map_err(map_err)?;
                let (take, more) =
                    crate::store::fitting(sizes.iter().map(|&n| n as usize), page_size);
                let page = page_query(
                    "SELECT record, changes_bytes, id FROM tasks",
                    &tenant,
                    &query_for_page,
                    take,
                );
                let rows = tx
                    .prepare_cached(&page.text)
                    .and_then(|mut s| {
                        s.query_map(rusqlite::params_from_iter(&page.values), |r| {
                            Ok((
                                r.get::<_, Vec<u8>>(0)?,
                                r.get::<_, i64>(1)?,
                                r.get::<_, Vec<u8>>(2)?,
                            ))
                        })?
                        .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .map_err(map_err)?;
                // The changes of those that have some, in the same
                // snapshot.
                let rows = rows
                    .into_iter()
                    .map(|(record, changes_bytes, id)| {
                        let kept = if changes_bytes > 0 {
                            read_changes(&tx, tenant.as_bytes(), &id)?
                        } else {
                            Vec::new()
                        };
                        Ok(parts(record, kept))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                tx.commit().map_err(map_err)?;
                Ok((total, rows, more))
            })
            .await?;

        TaskPage::from_parts(&rows, more, query, total as usize)
    }

    async fn count_unfinished(&self) -> Result<Vec<(TaskState, u64)>, StoreError> {
        let sql = unfinished_counts();
        let rows: Vec<(i32, i64)> = self
            .read(move |conn| {
                conn.prepare_cached(&sql)
                    .and_then(|mut s| {
                        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                            .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .map_err(map_err)
            })
            .await?;
        Ok(counted(rows))
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let sql = format!(
            "SELECT tenant, id, record, version, changes_bytes FROM tasks WHERE state IN ({})",
            state_list(StateClass::Active)
        );
        type Raw = (Vec<u8>, Vec<u8>, Vec<u8>, i64, Kept);
        let rows: Vec<Raw> = self
            .read(move |conn| {
                // One snapshot: each record with its changes.
                let tx = conn.transaction().map_err(map_err)?;
                let rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>, i64, i64)> = tx
                    .prepare(&sql)
                    .and_then(|mut s| {
                        s.query_map([], |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                        })?
                        .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .map_err(map_err)?;
                let rows = rows
                    .into_iter()
                    .map(|(tenant, id, record, version, changes_bytes)| {
                        let changes = if changes_bytes > 0 {
                            read_changes(&tx, &tenant, &id)?
                        } else {
                            Vec::new()
                        };
                        Ok((tenant, id, record, version, changes))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                tx.commit().map_err(map_err)?;
                Ok(rows)
            })
            .await?;
        // A record that no longer decodes must not keep the server from
        // starting: it is moved aside (logged with its key) and the rest
        // recovers.
        let mut active = Vec::with_capacity(rows.len());
        for (tenant, id, record, version, changes) in rows {
            let decoded = String::from_utf8(tenant.clone())
                .map_err(|_| StoreError::Internal("stored tenant is not UTF-8".into()))
                .and_then(|t| Ok((t, stored(record, version, changes)?)));
            match decoded {
                Ok(task) => active.push(task),
                Err(e) => self.quarantine(tenant, id, e.to_string()).await?,
            }
        }
        Ok(active)
    }

    async fn count_open_owned(&self, owner: &str, at_most: usize) -> Result<usize, StoreError> {
        // The empty name owns nothing.
        if owner.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM tasks INDEXED BY tasks_open_by_owner \
             WHERE owner = ?1 AND {} LIMIT ?2)",
            sql::OPEN_STATES_SQL
        );
        let owner = owner.as_bytes().to_vec();
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        self.read(move |conn| {
            conn.prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_row(rusqlite::params![owner, at_most], |r| r.get::<_, i64>(0))
                })
                .map(|n| n as usize)
                .map_err(map_err)
        })
        .await
    }

    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<crate::store::Waiting>, StoreError> {
        let (s, n) = time_key(before);
        let sql = format!(
            "SELECT tenant, id, owner, status_seconds, status_nanos FROM tasks \
             WHERE {} AND (status_seconds < ?1 OR (status_seconds = ?1 AND status_nanos < ?2)) \
             ORDER BY status_seconds, status_nanos LIMIT ?3",
            sql::WAITING_STATES_SQL
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn| {
            let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
            conn.prepare_cached(&sql)
                .and_then(|mut st| {
                    st.query_map(rusqlite::params![s, n, limit], |r| {
                        Ok(crate::store::Waiting {
                            tenant: text(r.get(0)?),
                            task_id: text(r.get(1)?),
                            owner: text(r.get(2)?),
                            since: (r.get(3)?, r.get(4)?),
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(map_err)
        })
        .await
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        let write = writer::Write::Purge {
            before: time_key(before),
        };
        match self.writer.write(write).await? {
            writer::Outcome::Purged(n) => Ok(n),
            _ => Err(StoreError::Internal(
                "sqlite writer answered out of turn".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Cursor;
    use rusqlite::types::Value;

    /// A write a constraint refuses inside a batch fails alone: the other
    /// writes of its batch commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_fails_alone() {
        let path = std::env::temp_dir()
            .join("a2a-lifecycle-unit")
            .join(format!("{}.db", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&path).await.unwrap();
        let side = Connection::open(&path).unwrap();
        side.execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON tasks WHEN NEW.tenant = x'626164' \
             BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END",
        )
        .unwrap();
        drop(side);
        let creates = (0..200).map(|i| {
            let store = store.clone();
            async move {
                let tenant = if i % 2 == 0 { "ok" } else { "bad" };
                let message = crate::proto::Message {
                    message_id: format!("m{i}"),
                    ..Default::default()
                };
                let record = crate::lifecycle::TaskRecord::submitted(
                    format!("t{i}"),
                    "c".into(),
                    message,
                    Timestamp::default(),
                );
                (tenant, store.create(tenant, &record).await)
            }
        });
        let results = futures_util::future::join_all(creates).await;
        for (tenant, result) in results {
            match tenant {
                "ok" => assert_eq!(result.unwrap(), 1),
                _ => assert!(
                    matches!(&result, Err(StoreError::Internal(m)) if m.contains("refused by trigger")),
                    "{result:?}"
                ),
            }
        }
        let page = store
            .list(
                "ok",
                &ListQuery {
                    owner: None,
                    context_id: None,
                    state: None,
                    status_after: None,
                    page_size: 0,
                    cursor: None,
                    history: Default::default(),
                    include_artifacts: false,
                },
            )
            .await
            .unwrap();
        assert_eq!(page.total_size, 100);
        let _ = std::fs::remove_file(&path);
    }

    /// The writer's in-memory index of creating messages does not keep
    /// purged tasks for ever: past as many stale hashes as live ones it is
    /// read afresh, so it holds about the tasks kept, not all ever made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn purged_tasks_leave_the_origin_index() {
        let path = std::env::temp_dir()
            .join("a2a-lifecycle-unit")
            .join(format!("{}.db", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&path).await.unwrap();
        let task = |i: usize| {
            let message = crate::proto::Message {
                message_id: format!("m{i}"),
                ..Default::default()
            };
            let mut record = crate::lifecycle::TaskRecord::submitted(
                format!("t{i}"),
                "c".into(),
                message,
                Timestamp {
                    seconds: 1_000,
                    nanos: 0,
                },
            );
            record.task.status.as_mut().unwrap().state = TaskState::Completed as i32;
            record
        };
        // Two merges' worth of creating messages (a merge takes at least
        // ORIGIN_LOG_MIN).
        let made = 3 * writer::ORIGIN_LOG_MIN;
        for chunk in (0..made).collect::<Vec<_>>().chunks(500) {
            let creates = chunk.iter().map(|&i| {
                let store = store.clone();
                async move { store.create("t", &task(i)).await.unwrap() }
            });
            futures_util::future::join_all(creates).await;
        }
        let before = store.writer.merged_hashes();
        assert!(before >= 2 * writer::ORIGIN_LOG_MIN, "{before} merged");
        let purged = store
            .purge_terminal_before(&Timestamp {
                seconds: 2_000,
                nanos: 0,
            })
            .await
            .unwrap();
        assert_eq!(purged, made as u64);
        // The batch after the purge's finds the index read afresh.
        store.create("t", &task(made)).await.unwrap();
        let after = store.writer.merged_hashes();
        assert!(
            after < writer::ORIGIN_LOG_MIN,
            "{after} hashes kept of {before}"
        );
        let _ = std::fs::remove_file(&path);
    }

    /// Every hot-path read uses an index: it neither scans a table nor
    /// sorts, and a ListTasks page after a cursor seeks to it instead of
    /// walking the newer tasks. Checked by what SQLite counts while running
    /// each statement (`sqlite3_stmt_status`), not by the text of its query
    /// plan, which changes between SQLite releases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hot_reads_use_indexes() {
        let path = std::env::temp_dir()
            .join("a2a-lifecycle-unit")
            .join(format!("{}.db", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&path).await.unwrap();
        // Enough tasks that a scan or a walk would show: 2,000 in tenant
        // "t" over two contexts, two states and two owners ("u" and none),
        // one second apart.
        const TASKS: i64 = 2000;
        let creates = (0..TASKS).map(|i| {
            let store = store.clone();
            async move {
                let message = crate::proto::Message {
                    message_id: format!("m{i}"),
                    ..Default::default()
                };
                let mut record = crate::lifecycle::TaskRecord::submitted(
                    format!("task-{i:05}"),
                    if i % 2 == 0 { "c" } else { "d" }.into(),
                    message,
                    Timestamp {
                        seconds: 1_700_000_000 + i,
                        nanos: 0,
                    },
                );
                if i % 3 == 0 {
                    record.task.status.as_mut().unwrap().state = TaskState::Working as i32;
                }
                if i % 5 != 0 {
                    record.owner = "u".into();
                }
                store.create("t", &record).await.unwrap();
            }
        });
        futures_util::future::join_all(creates).await;
        // The creating messages are still in the origin log (below a
        // merge); copy them into `origins`, which FIND_BY_ORIGIN reads, as
        // a merge would.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "INSERT INTO origins (tenant, message_id, task_id) \
             SELECT tenant, origin_message_id, id FROM tasks",
        )
        .unwrap();

        /// Runs `sql` to the end and returns (rows, full-scan steps,
        /// sorts, virtual machine steps).
        fn run(conn: &Connection, sql: &str, values: &[Value]) -> (usize, i32, i32, i32) {
            use rusqlite::StatementStatus;
            let mut statement = conn.prepare(sql).unwrap();
            let rows = statement
                .query_map(rusqlite::params_from_iter(values), |_| Ok(()))
                .unwrap()
                .count();
            (
                rows,
                statement.get_status(StatementStatus::FullscanStep),
                statement.get_status(StatementStatus::Sort),
                statement.get_status(StatementStatus::VmStep),
            )
        }

        for (sql, key) in [
            (GET, vec![b"t".to_vec(), b"task-01000".to_vec()]),
            (FIND_BY_ORIGIN, vec![b"t".to_vec(), b"m1000".to_vec()]),
            (
                GET_OWNED,
                vec![b"t".to_vec(), b"task-01001".to_vec(), b"u".to_vec()],
            ),
            (
                OWNS,
                vec![b"t".to_vec(), b"task-01001".to_vec(), b"u".to_vec()],
            ),
        ] {
            let values: Vec<Value> = key.into_iter().map(Value::Blob).collect();
            let (rows, full_scan, sorts, _) = run(&conn, sql, &values);
            assert_eq!(rows, 1, "{sql}");
            assert_eq!((full_scan, sorts), (0, 0), "{sql}: scanned or sorted");
        }

        // Every ListTasks page reads its index in order; one after a
        // cursor near the oldest task does about the work of one page,
        // not of the 1,900 newer tasks before it.
        let cursor = Cursor {
            status: (1_700_000_000 + 100, 0),
            task_id: "task-00100".into(),
        };
        for (owner, context, state) in filter_combinations() {
            {
                for cursor in [None, Some(cursor.clone())] {
                    let query = ListQuery {
                        owner: owner.map(String::from),
                        context_id: context.map(String::from),
                        state,
                        status_after: None,
                        page_size: 10,
                        cursor: cursor.clone(),
                        history: Default::default(),
                        include_artifacts: false,
                    };
                    let page = page_query("SELECT record FROM tasks", "t", &query, 11);
                    let (rows, full_scan, sorts, steps) = run(&conn, &page.text, &page.values);
                    let case = format!(
                        "owner {owner:?}, context {context:?}, state {state:?}, cursor {cursor:?}"
                    );
                    assert_eq!(rows, 11, "{case}");
                    assert_eq!((full_scan, sorts), (0, 0), "{case}: scanned or sorted");
                    // A walk over the skipped tasks costs several steps
                    // each; a seek, a few hundred for the page.
                    assert!(steps < 1000, "{case}: {steps} steps");
                }
            }
        }
        // A user's listing reads the partial owner index (migration 0005):
        // its term must be in the query for SQLite to take it.
        let mine = ListQuery {
            owner: Some("u".into()),
            ..ListQuery::default()
        };
        let page = page_query("SELECT record FROM tasks", "t", &mine, 11);
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", page.text))
            .unwrap()
            .query_map(rusqlite::params_from_iter(&page.values), |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter().any(|step| step.contains("tasks_by_owner")),
            "{plan:?}"
        );
        drop(conn);
        let _ = std::fs::remove_file(&path);
    }

    /// Every combination of the owner, context and state filters.
    fn filter_combinations() -> Vec<(
        Option<&'static str>,
        Option<&'static str>,
        Option<TaskState>,
    )> {
        let mut all = Vec::new();
        for owner in [None, Some("u")] {
            for context in [None, Some("c")] {
                for state in [None, Some(TaskState::Working)] {
                    all.push((owner, context, state));
                }
            }
        }
        all
    }
}
