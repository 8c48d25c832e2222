//! Tasks in PostgreSQL: the store several replicas share (issue "scale
//! out"). Work in progress: the store itself, passing the store
//! conformance suite; replicas' coordination comes next.
//!
//! - One row per task (`tasks`), the record as the stores' protobuf bytes
//!   beside the columns ListTasks filters and orders by; ids and tenants
//!   are `bytea`, so ordering is bytewise as in SQLite.
//! - Idempotency (tenant, origin) is a unique index over the tasks
//!   themselves (`origin`, [`super::origin_key`]): two replicas creating
//!   the same message's task race on the index, and a purged task frees
//!   its key with it.
//! - Versions are optimistic, as in SQLite: an update names the version it
//!   read.
//! - Schema migrations are embedded and applied at start under an
//!   advisory lock, so replicas starting together do not race.
//! - Driver: tokio-postgres with a deadpool pool. (sqlx's PostgreSQL driver
//!   cannot share a build with rusqlite: its optional SQLite driver's
//!   `links = "sqlite3"` conflicts with rusqlite's in Cargo's resolution.)

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use prost_types::Timestamp;
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

use super::sqlite::state_list;
use super::{
    Delivery, EncodedTask, ListQuery, StoreError, StoredTask, TaskPage, TaskStore, codec,
    origin_key, time_key,
};
use crate::lifecycle::StateClass;

/// Connections in the pool.
pub const POOL_SIZE: usize = 16;
/// The advisory lock migrations are applied under (an arbitrary number
/// of this project's).
const MIGRATION_LOCK: i64 = 0x0a2a_11fe_c7c1_e001;

/// The schema, in order; each applied once, recorded in
/// `a2a_schema_migrations`.
const MIGRATIONS: &[&str] = &[include_str!("../../migrations/postgres/0001_tasks.sql")];

/// The advisory lock a server holds on its database while several
/// replicas on one database are not yet supported.
const SERVER_LOCK: i64 = 0x0a2a_11fe_c7c1_e002;

/// Tasks in a PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    url: String,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| StoreError::Internal("stored text is not UTF-8".into()))
}

fn stored(record: Vec<u8>, version: i64) -> Result<StoredTask, StoreError> {
    Ok(StoredTask {
        record: codec::decode(&record)?,
        version: version as u64,
    })
}

impl PostgresStore {
    /// Connects to `url` (`postgres://USER@HOST:PORT/DB`) and brings the
    /// schema up to date.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Internal(format!("bad PostgreSQL URL: {e}")))?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        let store = PostgresStore {
            pool,
            url: url.to_owned(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Claims the database for this process alone, until it exits: a
    /// session-level advisory lock on a connection of its own. Until
    /// replicas share a database (leases, cross-replica events), a second
    /// server would fail the first one's running tasks as if it had
    /// restarted; it is refused instead, as SQLite's lock file refuses it.
    pub async fn claim_exclusive(&self) -> Result<(), StoreError> {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .map_err(unavailable)?;
        let driver = tokio::spawn(connection);
        let claimed: bool = match client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&SERVER_LOCK])
            .await
        {
            Ok(row) => row.get(0),
            Err(e) => {
                driver.abort();
                return Err(unavailable(e));
            }
        };
        if !claimed {
            driver.abort();
            return Err(StoreError::Unavailable(
                "the PostgreSQL database is in use by another server; one server per \
                 database until replicas are supported"
                    .into(),
            ));
        }
        // The lock lives as long as this session: its client is kept, and
        // its connection driven, for the rest of the process.
        tokio::spawn(async move {
            let _client = client;
            if let Ok(Err(e)) = driver.await {
                tracing::error!(error = %e, "the PostgreSQL connection holding the server's claim broke");
            }
        });
        Ok(())
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(unavailable)
    }

    /// Applies the migrations not yet applied, under an advisory lock held
    /// by this session for the duration.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(unavailable)?;
        let result = async {
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS a2a_schema_migrations \
                     (version INTEGER PRIMARY KEY)",
                )
                .await?;
            let row = client
                .query_one(
                    "SELECT COALESCE(MAX(version), 0) FROM a2a_schema_migrations",
                    &[],
                )
                .await?;
            let applied: i32 = row.get(0);
            for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
                let tx = client.transaction().await?;
                tx.batch_execute(sql).await?;
                tx.execute(
                    "INSERT INTO a2a_schema_migrations (version) VALUES ($1)",
                    &[&(i as i32 + 1)],
                )
                .await?;
                tx.commit().await?;
            }
            Ok::<_, tokio_postgres::Error>(())
        }
        .await;
        let unlocked = client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        result.map_err(|e| StoreError::Internal(format!("migrating the schema: {e}")))?;
        unlocked.map_err(unavailable)?;
        Ok(())
    }

    async fn add_to_outbox(
        tx: &tokio_postgres::Transaction<'_>,
        tenant: &str,
        task: &EncodedTask,
    ) -> Result<(), tokio_postgres::Error> {
        for entry in &task.outbox {
            tx.execute(
                "INSERT INTO push_outbox (tenant, task_id, config_id, event) \
                 VALUES ($1, $2, $3, $4)",
                &[
                    &tenant.as_bytes(),
                    &task.id.as_bytes(),
                    &entry.config_id.as_bytes(),
                    &entry.event,
                ],
            )
            .await?;
        }
        Ok(())
    }

    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<StoredTask>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt(sql, params).await.map_err(unavailable)?;
        row.map(|r| stored(r.get(0), r.get(1))).transpose()
    }
}

/// A query and its parameters, numbered as they are bound.
struct Sql {
    text: String,
    values: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Sql {
    fn new(text: &str) -> Self {
        Sql {
            text: text.to_owned(),
            values: Vec::new(),
        }
    }
    fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }
    fn bind<T: ToSql + Sync + Send + 'static>(&mut self, value: T) -> &mut Self {
        self.values.push(Box::new(value));
        self.text.push_str(&format!("${}", self.values.len()));
        self
    }
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

fn push_filters(sql: &mut Sql, tenant: &str, query: &ListQuery) {
    sql.push(" WHERE tenant = ")
        .bind(tenant.as_bytes().to_vec());
    if let Some(owner) = &query.owner {
        // An empty owner filter lists nothing: the unowned tasks are no
        // user's.
        sql.push(" AND owner = ")
            .bind(owner.as_bytes().to_vec())
            .push(" AND owner <> ''::bytea");
    }
    if let Some(context) = &query.context_id {
        sql.push(" AND context_id = ")
            .bind(context.as_bytes().to_vec());
    }
    if let Some(state) = query.state {
        sql.push(" AND state = ").bind(state as i32);
    }
    if let Some(after) = &query.status_after {
        let (s, n) = time_key(after);
        sql.push(" AND (status_seconds, status_nanos) >= (")
            .bind(s)
            .push(", ")
            .bind(n)
            .push(")");
    }
}

#[async_trait]
impl TaskStore for PostgresStore {
    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let inserted = tx
            .execute(
                "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, \
                 status_nanos, owner, origin, version, record) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9) ON CONFLICT DO NOTHING",
                &[
                    &tenant.as_bytes(),
                    &task.id.as_bytes(),
                    &task.context_id.as_bytes(),
                    &(task.state as i32),
                    &task.status.0,
                    &task.status.1,
                    &task.owner.as_bytes(),
                    &task.origin,
                    &task.bytes.as_ref(),
                ],
            )
            .await
            .map_err(unavailable)?;
        if inserted == 0 {
            // Which key was taken: the id, or the creating message's.
            let same_id = tx
                .query_opt(
                    "SELECT 1 FROM tasks WHERE tenant = $1 AND id = $2",
                    &[&tenant.as_bytes(), &task.id.as_bytes()],
                )
                .await
                .map_err(unavailable)?;
            if same_id.is_some() {
                return Err(StoreError::AlreadyExists(task.id.clone()));
            }
            let by_origin = tx
                .query_opt(
                    "SELECT id FROM tasks WHERE tenant = $1 AND origin = $2 \
                     AND origin <> ''::bytea",
                    &[&tenant.as_bytes(), &task.origin],
                )
                .await
                .map_err(unavailable)?;
            return match by_origin {
                Some(row) => Err(StoreError::DuplicateMessage {
                    task_id: text(row.get(0))?,
                }),
                // Gone again between the insert and the look: a retry
                // settles it.
                None => Err(StoreError::Unavailable(
                    "a conflicting task came and went; try again".into(),
                )),
            };
        }
        Self::add_to_outbox(&tx, tenant, task)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(1)
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        let key = origin_key(owner, message_id);
        self.one(
            "SELECT record, version FROM tasks WHERE tenant = $1 AND origin = $2 \
             AND origin <> ''::bytea",
            &[&tenant.as_bytes(), &key],
        )
        .await
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        self.one(
            "SELECT record, version FROM tasks WHERE tenant = $1 AND id = $2",
            &[&tenant.as_bytes(), &task_id.as_bytes()],
        )
        .await
    }

    async fn get_owned(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.one(
            "SELECT record, version FROM tasks WHERE tenant = $1 AND id = $2 \
             AND owner = $3 AND owner <> ''::bytea",
            &[&tenant.as_bytes(), &task_id.as_bytes(), &owner.as_bytes()],
        )
        .await
    }

    async fn owns(&self, tenant: &str, task_id: &str, owner: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT 1 FROM tasks WHERE tenant = $1 AND id = $2 \
                 AND owner = $3 AND owner <> ''::bytea",
                &[&tenant.as_bytes(), &task_id.as_bytes(), &owner.as_bytes()],
            )
            .await
            .map_err(unavailable)?;
        Ok(row.is_some())
    }

    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(unavailable)?;
        let row = tx
            .query_opt(
                "UPDATE tasks SET context_id = $3, state = $4, status_seconds = $5, \
                 status_nanos = $6, version = version + 1, record = $7 \
                 WHERE tenant = $1 AND id = $2 AND version = $8 RETURNING version",
                &[
                    &tenant.as_bytes(),
                    &task.id.as_bytes(),
                    &task.context_id.as_bytes(),
                    &(task.state as i32),
                    &task.status.0,
                    &task.status.1,
                    &task.bytes.as_ref(),
                    &(expected_version as i64),
                ],
            )
            .await
            .map_err(unavailable)?;
        let Some(row) = row else {
            let actual = tx
                .query_opt(
                    "SELECT version FROM tasks WHERE tenant = $1 AND id = $2",
                    &[&tenant.as_bytes(), &task.id.as_bytes()],
                )
                .await
                .map_err(unavailable)?;
            return Err(match actual {
                None => StoreError::NotFound(task.id.clone()),
                Some(r) => StoreError::Conflict {
                    id: task.id.clone(),
                    expected: expected_version,
                    actual: r.get::<_, i64>(0) as u64,
                },
            });
        };
        let version: i64 = row.get(0);
        Self::add_to_outbox(&tx, tenant, task)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(version as u64)
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let page_size = query.effective_page_size();
        let mut count = Sql::new("SELECT COUNT(*) FROM tasks");
        push_filters(&mut count, tenant, query);
        let mut page = Sql::new("SELECT record FROM tasks");
        push_filters(&mut page, tenant, query);
        if let Some(c) = &query.cursor {
            // Strictly after the cursor in (time desc, id asc) order.
            let (s, n) = c.status;
            page.push(" AND ((status_seconds, status_nanos) < (")
                .bind(s)
                .push(", ")
                .bind(n)
                .push(") OR (status_seconds = ")
                .bind(s)
                .push(" AND status_nanos = ")
                .bind(n)
                .push(" AND id > ")
                .bind(c.task_id.as_bytes().to_vec())
                .push("))");
        }
        page.push(" ORDER BY status_seconds DESC, status_nanos DESC, id ASC LIMIT ")
            .bind(page_size as i64 + 1);
        let mut client = self.client().await?;
        // One snapshot for the count and the page.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(unavailable)?;
        let total: i64 = tx
            .query_one(&count.text, &count.params())
            .await
            .map_err(unavailable)?
            .get(0);
        let rows = tx
            .query(&page.text, &page.params())
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        let rows: Vec<&[u8]> = rows.iter().map(|r| r.get(0)).collect();
        TaskPage::from_rows(&rows, page_size, query, total as usize)
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let sql = format!(
            "SELECT tenant, record, version FROM tasks WHERE state IN ({})",
            state_list(StateClass::Active)
        );
        let client = self.client().await?;
        let rows = client.query(&sql, &[]).await.map_err(unavailable)?;
        rows.into_iter()
            .map(|r| Ok((text(r.get(0))?, stored(r.get(1), r.get(2))?)))
            .collect()
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        let (s, n) = time_key(before);
        let sql = format!(
            "DELETE FROM tasks WHERE state IN ({}) \
             AND (status_seconds, status_nanos) < ($1, $2)",
            state_list(StateClass::Terminal)
        );
        let client = self.client().await?;
        client.execute(&sql, &[&s, &n]).await.map_err(unavailable)
    }

    async fn outbox(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        let client = self.client().await?;
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, tenant, task_id, config_id, event, attempts, not_before \
                 FROM push_outbox WHERE seq > $1 ORDER BY seq LIMIT $2",
                &[&after, &(limit as i64)],
            )
            .await
            .map_err(unavailable)?;
        rows.into_iter()
            .map(|r| {
                Ok(Delivery {
                    seq: r.get::<_, i64>(0) as u64,
                    tenant: text(r.get(1))?,
                    task_id: text(r.get(2))?,
                    config_id: text(r.get(3))?,
                    event: r.get(4),
                    attempts: r.get::<_, i32>(5) as u32,
                    not_before_ms: r.get(6),
                })
            })
            .collect()
    }

    async fn finish_delivery(&self, seq: u64) -> Result<(), StoreError> {
        let Ok(seq) = i64::try_from(seq) else {
            return Ok(());
        };
        let client = self.client().await?;
        client
            .execute("DELETE FROM push_outbox WHERE seq = $1", &[&seq])
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn defer_delivery(
        &self,
        seq: u64,
        attempts: u32,
        not_before_ms: i64,
    ) -> Result<(), StoreError> {
        let Ok(seq) = i64::try_from(seq) else {
            return Ok(());
        };
        let client = self.client().await?;
        client
            .execute(
                "UPDATE push_outbox SET attempts = $2, not_before = $3 WHERE seq = $1",
                &[&seq, &(attempts as i32), &not_before_ms],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
