//! The SQLite [`TaskStore`]: the embedded default, durable with no server to
//! install.
//!
//! One row per task (schema in `migrations/sqlite/`, embedded in the binary
//! and applied at open). The database runs in WAL mode with
//! `synchronous=NORMAL`: a committed write survives the process being
//! killed (SIGKILL, crash); only an OS crash or power loss can lose the
//! last commits, which `synchronous=FULL` would prevent at the cost of an
//! fsync per write. Every write is one statement, so it is atomic; updates
//! carry `WHERE version = ?` for optimistic concurrency.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use prost_types::Timestamp;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite};

use super::{
    Cursor, ListQuery, StoreError, StoredTask, TaskPage, TaskStore, codec, origin_message_id,
    status_key, time_key,
};
use crate::lifecycle::TaskRecord;
use crate::lifecycle::history::task_view;
use crate::proto::TaskState;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a statement waits for another connection's write lock before
/// failing with UNAVAILABLE.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections in the pool: WAL lets readers run beside the one writer.
pub const MAX_CONNECTIONS: u32 = 8;
/// How long a request waits for a free connection.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

const ACTIVE: [TaskState; 2] = [TaskState::Submitted, TaskState::Working];
const TERMINAL: [TaskState; 4] = [
    TaskState::Completed,
    TaskState::Failed,
    TaskState::Canceled,
    TaskState::Rejected,
];

/// Tasks in a SQLite database file.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

fn map_err(e: sqlx::Error) -> StoreError {
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

fn state_list(states: &[TaskState]) -> String {
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
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        Self::connect(options).await
    }

    /// Opens a `sqlite:` URL (as accepted by sqlx).
    pub async fn open_url(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("bad sqlite url {url:?}: {e}")))?;
        Self::open(options.get_filename()).await
    }

    async fn connect(options: SqliteConnectOptions) -> Result<Self, StoreError> {
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(map_err)?;
        MIGRATOR
            .run(&pool)
            .await
            .map_err(|e| StoreError::Internal(format!("sqlite migration failed: {e}")))?;
        Ok(SqliteStore { pool })
    }

    /// Closes the pool, checkpointing the WAL.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn exists(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        let row: Option<(i64,)> =
            sqlx::query_as("SELECT version FROM tasks WHERE tenant = ? AND id = ?")
                .bind(tenant.as_bytes())
                .bind(id.as_bytes())
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        Ok(row.is_some())
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

#[async_trait]
impl TaskStore for SqliteStore {
    async fn create(&self, tenant: &str, record: &TaskRecord) -> Result<u64, StoreError> {
        let task = &record.task;
        let (seconds, nanos) = status_key(task);
        let result = sqlx::query(
            "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, status_nanos, \
             origin_message_id, version, record) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
        )
        .bind(tenant.as_bytes())
        .bind(task.id.as_bytes())
        .bind(task.context_id.as_bytes())
        .bind(record.state() as i32)
        .bind(seconds)
        .bind(nanos)
        .bind(origin_message_id(record).as_bytes())
        .bind(codec::encode(record))
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => Ok(1),
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                if self.exists(tenant, &task.id).await? {
                    return Err(StoreError::AlreadyExists(task.id.clone()));
                }
                match self
                    .find_by_origin(tenant, origin_message_id(record))
                    .await?
                {
                    Some(existing) => Err(StoreError::DuplicateMessage {
                        task_id: existing.record.task.id,
                    }),
                    None => Err(StoreError::Internal(format!("sqlite: {db}"))),
                }
            }
            Err(e) => Err(map_err(e)),
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
        let row: Option<(Vec<u8>, i64)> = sqlx::query_as(
            "SELECT record, version FROM tasks WHERE tenant = ? AND origin_message_id = ?",
        )
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
        row.map(|(r, v)| stored(r, v)).transpose()
    }

    async fn update(
        &self,
        tenant: &str,
        record: &TaskRecord,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        let task = &record.task;
        let (seconds, nanos) = status_key(task);
        let done = sqlx::query(
            "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, status_nanos = ?, \
             version = version + 1, record = ? WHERE tenant = ? AND id = ? AND version = ?",
        )
        .bind(task.context_id.as_bytes())
        .bind(record.state() as i32)
        .bind(seconds)
        .bind(nanos)
        .bind(codec::encode(record))
        .bind(tenant.as_bytes())
        .bind(task.id.as_bytes())
        .bind(expected_version as i64)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        if done.rows_affected() == 1 {
            return Ok(expected_version + 1);
        }
        let current: Option<(i64,)> =
            sqlx::query_as("SELECT version FROM tasks WHERE tenant = ? AND id = ?")
                .bind(tenant.as_bytes())
                .bind(task.id.as_bytes())
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        match current {
            None => Err(StoreError::NotFound(task.id.clone())),
            Some((actual,)) => Err(StoreError::Conflict {
                id: task.id.clone(),
                expected: expected_version,
                actual: actual as u64,
            }),
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

        let mut page = QueryBuilder::<Sqlite>::new("SELECT record FROM tasks");
        push_filters(&mut page, tenant, query);
        if let Some(c) = &query.cursor {
            // Strictly after the cursor in (time desc, id asc) order.
            let (s, n) = c.status;
            page.push(" AND (status_seconds < ")
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
            "SELECT tenant, record, version FROM tasks WHERE state IN ({})",
            state_list(&ACTIVE)
        );
        let rows: Vec<(Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
        rows.into_iter()
            .map(|(tenant, record, version)| {
                let tenant = String::from_utf8(tenant)
                    .map_err(|_| StoreError::Internal("stored tenant is not UTF-8".into()))?;
                Ok((tenant, stored(record, version)?))
            })
            .collect()
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        let (s, n) = time_key(before);
        // The state list is made of our own enum numbers, not client input.
        let sql = format!(
            "DELETE FROM tasks WHERE state IN ({}) AND \
             (status_seconds < ? OR (status_seconds = ? AND status_nanos < ?))",
            state_list(&TERMINAL)
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(s)
            .bind(s)
            .bind(n)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
