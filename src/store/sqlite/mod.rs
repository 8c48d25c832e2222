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

pub mod writer;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use prost_types::Timestamp;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Connection, QueryBuilder, Sqlite};

use super::{
    Cursor, EncodedTask, ListQuery, StoreError, StoredTask, TaskPage, TaskStore, codec, status_key,
    time_key,
};
use crate::lifecycle::history::task_view;
use crate::proto::TaskState;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

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

/// The task created by a message among the merged origins, by key; read
/// only when the merged origins' hashes in memory hold the pair. Recent
/// ones are in the origin log, which the writer keeps in memory and shares
/// ([`writer::WriterHandle::origin`]): the log table has no index (which is
/// what makes appending to it cheap) and is never read here. A test pins
/// the plan.
const FIND_BY_ORIGIN: &str = "SELECT record, version FROM tasks WHERE tenant = ?1 AND id = \
     (SELECT task_id FROM origins WHERE tenant = ?1 AND message_id = ?2)";

pub(super) const ACTIVE: [TaskState; 2] = [TaskState::Submitted, TaskState::Working];
pub(super) const TERMINAL: [TaskState; 4] = [
    TaskState::Completed,
    TaskState::Failed,
    TaskState::Canceled,
    TaskState::Rejected,
];

/// Tasks in a SQLite database file.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: writer::WriterHandle,
}

pub(super) fn map_err(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            StoreError::Unavailable(format!("sqlite: {e}"))
        }
        sqlx::Error::Database(db) if db.code().as_deref() == Some("5") => {
            // SQLITE_BUSY after BUSY_TIMEOUT: another writer holds the lock.
            StoreError::Unavailable(format!("sqlite busy: {db}"))
        }
        other => StoreError::Internal(format!("sqlite: {other}")),
    }
}

pub(super) fn state_list(states: &[TaskState]) -> String {
    states
        .iter()
        .map(|s| (*s as i32).to_string())
        .collect::<Vec<_>>()
        .join(",")
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
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            // A bigger page cache and memory-mapped reads for readers; the
            // WAL is checkpointed into the database every WAL_CHECKPOINT_PAGES
            // pages instead of SQLite's 1000, so the writer stops less often.
            .pragma("cache_size", format!("-{CACHE_KIB}"))
            .pragma("mmap_size", MMAP_BYTES.to_string())
            .pragma("wal_autocheckpoint", WAL_CHECKPOINT_PAGES.to_string());
        Self::connect(options, lock, identity).await
    }

    async fn connect(
        options: SqliteConnectOptions,
        lock: std::fs::File,
        identity: writer::FileIdentity,
    ) -> Result<Self, StoreError> {
        let mut write_conn = SqliteConnection::connect_with(&options)
            .await
            .map_err(map_err)?;
        MIGRATOR
            .run(&mut write_conn)
            .await
            .map_err(|e| StoreError::Internal(format!("sqlite migration failed: {e}")))?;
        let checkpoint_conn = SqliteConnection::connect_with(&options)
            .await
            .map_err(map_err)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_READERS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.read_only(true))
            .await
            .map_err(map_err)?;
        Ok(SqliteStore {
            pool,
            writer: writer::WriterHandle::spawn(write_conn, checkpoint_conn, lock, identity)
                .await?,
        })
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

    /// Closes the reader pool (the writer stops when the last handle goes).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Resolves once the writer has stopped (after every clone of this
    /// store is dropped) and released the database to another open.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.writer.stopped()
    }
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
        origin_message_id: task.origin_message_id.as_bytes().to_vec(),
        record: task.bytes.clone(),
    }
}

fn stored(record: Vec<u8>, version: i64) -> Result<StoredTask, StoreError> {
    Ok(StoredTask {
        record: codec::decode(&record)?,
        version: version as u64,
    })
}

/// Appends the WHERE clause shared by the page and the count.
fn push_filters(qb: &mut QueryBuilder<Sqlite>, tenant: &str, query: &ListQuery) {
    qb.push(" WHERE tenant = ")
        .push_bind(tenant.as_bytes().to_vec());
    if let Some(context) = &query.context_id {
        qb.push(" AND context_id = ")
            .push_bind(context.as_bytes().to_vec());
    }
    if let Some(state) = query.state {
        qb.push(" AND state = ").push_bind(state as i32);
    }
    if let Some(after) = &query.status_after {
        // status timestamp >= after (inclusive), on (seconds, nanos).
        let (s, n) = time_key(after);
        qb.push(" AND (status_seconds > ")
            .push_bind(s)
            .push(" OR (status_seconds = ")
            .push_bind(s)
            .push(" AND status_nanos >= ")
            .push_bind(n)
            .push("))");
    }
}

/// The ListTasks page query after `select`: one page plus one row (to know
/// whether another page follows), newest status first, ties by id.
fn page_query(
    select: &str,
    tenant: &str,
    query: &ListQuery,
    page_size: usize,
) -> QueryBuilder<Sqlite> {
    let mut page = QueryBuilder::<Sqlite>::new(select);
    push_filters(&mut page, tenant, query);
    if let Some(c) = &query.cursor {
        // Strictly after the cursor in (time desc, id asc) order. The
        // redundant `status_seconds <=` bound lets the index seek to the
        // cursor instead of walking every newer task.
        let (s, n) = c.status;
        page.push(" AND status_seconds <= ")
            .push_bind(s)
            .push(" AND (status_seconds < ")
            .push_bind(s)
            .push(" OR (status_seconds = ")
            .push_bind(s)
            .push(" AND (status_nanos < ")
            .push_bind(n)
            .push(" OR (status_nanos = ")
            .push_bind(n)
            .push(" AND id > ")
            .push_bind(c.task_id.as_bytes().to_vec())
            .push("))))");
    }
    page.push(" ORDER BY status_seconds DESC, status_nanos DESC, id ASC LIMIT ")
        .push_bind(page_size as i64 + 1);
    page
}

#[async_trait]
impl TaskStore for SqliteStore {
    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
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
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        if message_id.is_empty() {
            return Ok(None);
        }
        // Memory first: see `WriterHandle::origin`. A new message (the
        // common case: this runs for every one) is answered without a query.
        match self.writer.origin(tenant.as_bytes(), message_id.as_bytes()) {
            writer::OriginLookup::Absent => return Ok(None),
            writer::OriginLookup::Logged(id) => {
                let id = String::from_utf8(id)
                    .map_err(|_| StoreError::Internal("stored task id is not UTF-8".into()))?;
                return self.get(tenant, &id).await;
            }
            writer::OriginLookup::MaybeMerged => {}
        }
        let row: Option<(Vec<u8>, i64)> = sqlx::query_as(FIND_BY_ORIGIN)
            .bind(tenant.as_bytes())
            .bind(message_id.as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)?;
        row.map(|(r, v)| stored(r, v)).transpose()
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        let row: Option<(Vec<u8>, i64)> =
            sqlx::query_as("SELECT record, version FROM tasks WHERE tenant = ? AND id = ?")
                .bind(tenant.as_bytes())
                .bind(task_id.as_bytes())
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        match row {
            Some((r, v)) => stored(r, v).map(Some),
            // Rare: a miss also looks among the records set aside.
            None => {
                let reason: Option<(String,)> =
                    sqlx::query_as("SELECT reason FROM quarantine WHERE tenant = ? AND id = ?")
                        .bind(tenant.as_bytes())
                        .bind(task_id.as_bytes())
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(map_err)?;
                match reason {
                    Some((reason,)) => Err(StoreError::Internal(format!(
                        "task {task_id:?} was set aside at start because its stored record \
                         does not decode ({reason}); it is kept in the quarantine table"
                    ))),
                    None => Ok(None),
                }
            }
        }
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
        // One read transaction: the count and the page see the same snapshot.
        let mut tx = self.pool.begin().await.map_err(map_err)?;

        let mut count = QueryBuilder::<Sqlite>::new("SELECT COUNT(*) FROM tasks");
        push_filters(&mut count, tenant, query);
        let (total,): (i64,) = count
            .build_query_as()
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;

        let mut page = page_query("SELECT record FROM tasks", tenant, query, page_size);
        let rows: Vec<(Vec<u8>,)> = page
            .build_query_as()
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;

        let more = rows.len() > page_size;
        let mut records = rows
            .into_iter()
            .take(page_size)
            .map(|(r,)| codec::decode(&r))
            .collect::<Result<Vec<_>, _>>()?;
        let next = match (more, records.last()) {
            (true, Some(last)) => Some(Cursor {
                status: status_key(&last.task),
                task_id: last.task.id.clone(),
            }),
            _ => None,
        };
        Ok(TaskPage {
            tasks: records
                .iter_mut()
                .map(|r| task_view(&r.task, query.history, query.include_artifacts))
                .collect(),
            next,
            total_size: total as usize,
        })
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let sql = format!(
            "SELECT tenant, id, record, version FROM tasks WHERE state IN ({})",
            state_list(&ACTIVE)
        );
        let rows: Vec<(Vec<u8>, Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
        // A record that no longer decodes must not keep the server from
        // starting: it is moved aside (logged with its key) and the rest
        // recovers.
        let mut active = Vec::with_capacity(rows.len());
        for (tenant, id, record, version) in rows {
            let decoded = String::from_utf8(tenant.clone())
                .map_err(|_| StoreError::Internal("stored tenant is not UTF-8".into()))
                .and_then(|t| Ok((t, stored(record, version)?)));
            match decoded {
                Ok(task) => active.push(task),
                Err(e) => self.quarantine(tenant, id, e.to_string()).await?,
            }
        }
        Ok(active)
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

    /// A write a constraint refuses inside a batch fails alone: the other
    /// writes of its batch commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_write_fails_alone() {
        let path = std::env::temp_dir()
            .join("a2a-lifecycle-unit")
            .join(format!("{}.db", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&path).await.unwrap();
        let mut side = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&path))
            .await
            .unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse BEFORE INSERT ON tasks WHEN NEW.tenant = x'626164' \
             BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END",
        )
        .execute(&mut side)
        .await
        .unwrap();
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

    /// Every hot-path lookup must use an index, not scan the table.
    #[tokio::test]
    async fn lookups_use_indexes() {
        let path = std::env::temp_dir()
            .join("a2a-lifecycle-unit")
            .join(format!("{}.db", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&path).await.unwrap();
        for (sql, index) in [
            (FIND_BY_ORIGIN, "PRIMARY KEY"),
            (
                "SELECT record, version FROM tasks WHERE tenant = ? AND id = ?",
                "PRIMARY KEY",
            ),
        ] {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind(b"t".to_vec())
                    .bind(b"m".to_vec())
                    .fetch_all(&store.pool)
                    .await
                    .unwrap();
            let detail: Vec<_> = plan.iter().map(|r| r.3.as_str()).collect();
            // Every table is read by key: no scan at all.
            assert!(
                detail.iter().any(|d| d.contains(index))
                    && !detail.iter().any(|d| d.starts_with("SCAN")),
                "{sql}: {detail:?}"
            );
        }
        // Every ListTasks page reads its index in order: no sort, no
        // scan, and a cursor seeks instead of walking the newer tasks.
        let cursor = Cursor {
            status: (1_700_000_000, 5),
            task_id: "t".into(),
        };
        for (context, state, cursor, index) in [
            (None, None, None, "tasks_by_time (tenant=?)"),
            (
                None,
                None,
                Some(cursor.clone()),
                "tasks_by_time (tenant=? AND status_seconds<?)",
            ),
            (
                Some("c"),
                None,
                None,
                "tasks_by_context (tenant=? AND context_id=?)",
            ),
            (
                Some("c"),
                None,
                Some(cursor.clone()),
                "tasks_by_context (tenant=? AND context_id=? AND status_seconds<?)",
            ),
            (
                None,
                Some(TaskState::Working),
                None,
                "tasks_by_state (tenant=? AND state=?)",
            ),
            (
                None,
                Some(TaskState::Working),
                Some(cursor),
                "tasks_by_state (tenant=? AND state=? AND status_seconds<?)",
            ),
        ] {
            let query = ListQuery {
                context_id: context.map(String::from),
                state,
                status_after: None,
                page_size: 10,
                cursor,
                history: Default::default(),
                include_artifacts: false,
            };
            let plan: Vec<(i64, i64, i64, String)> = page_query(
                "EXPLAIN QUERY PLAN SELECT record FROM tasks",
                "t",
                &query,
                10,
            )
            .build_query_as()
            .fetch_all(&store.pool)
            .await
            .unwrap();
            let detail: Vec<_> = plan.iter().map(|r| r.3.as_str()).collect();
            assert_eq!(
                detail,
                [format!("SEARCH tasks USING INDEX {index}")],
                "context {context:?}, state {state:?}"
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}
