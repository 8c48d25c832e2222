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
//! - Task writes are committed in batches by [`writer`]'s writer tasks
//!   (group commit), reads go straight to the pool.
//! - Schema migrations are embedded and applied at start under an
//!   advisory lock, so replicas starting together do not race.
//! - Driver: tokio-postgres with a deadpool pool. (sqlx's PostgreSQL driver
//!   cannot share a build with rusqlite: its optional SQLite driver's
//!   `links = "sqlite3"` conflicts with rusqlite's in Cargo's resolution.)

mod lease;
mod tls;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use crate::wkt::Timestamp;
use async_trait::async_trait;
use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::broadcast;
use tokio_postgres::types::ToSql;

use super::sql::{self, Postgres, counted, state_list, unfinished_counts};
use super::{
    CatchUp, Caught, Change, DELIVERY_ROLE, Delivery, EncodedTask, ListQuery, OriginClaim,
    StoreError, StoredTask, TaskPage, TaskStore, codec, origin_key, time_key,
};
use crate::lifecycle::StateClass;
use writer::{Kind, Writers};

/// Connections in the pool.
pub const POOL_SIZE: usize = 16;
/// The advisory lock migrations are applied under (an arbitrary number
/// of this project's).
const MIGRATION_LOCK: i64 = 0x0a2a_11fe_c7c1_e001;

/// The schema, in order; each applied once, recorded in
/// `a2a_schema_migrations`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_tasks.sql"),
    include_str!("../../../migrations/postgres/0002_replicas.sql"),
    include_str!("../../../migrations/postgres/0003_task_events.sql"),
    include_str!("../../../migrations/postgres/0004_job_holders.sql"),
    include_str!("../../../migrations/postgres/0005_task_watchers.sql"),
    include_str!("../../../migrations/postgres/0006_quarantine.sql"),
    include_str!("../../../migrations/postgres/0007_run_claims.sql"),
    include_str!("../../../migrations/postgres/0008_open_tasks_by_owner.sql"),
    include_str!("../../../migrations/postgres/0009_fencing.sql"),
    include_str!("../../../migrations/postgres/0010_owed_runs.sql"),
    include_str!("../../../migrations/postgres/0011_task_changes.sql"),
    include_str!("../../../migrations/postgres/0012_whole_version.sql"),
];

/// How long a request waits for a free pooled connection.
pub const POOL_WAIT: Duration = Duration::from_secs(10);
/// How long making (or checking) a pooled connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Any statement of the pool's connections is cancelled by the database
/// after this long: nothing waits on a stuck one for ever.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long each write's events are kept for other replicas' subscribers
/// ([`TaskStore::catch_up`]); one further behind gets a fresh snapshot.
pub const EVENT_LOG_RETAIN: Duration = Duration::from_secs(300);
/// How often one replica trims the event log.
const EVENT_LOG_TRIM_EVERY: Duration = Duration::from_secs(10);
/// Changes a follower of [`TaskStore::changes`] may fall behind before it
/// is told of a gap instead.
pub const CHANGE_BUFFER: usize = 4096;
/// First wait before listening again after the listening connection
/// broke; doubled up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(100);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// How long a replica's lease lasts unless renewed (`serve --lease`): a
/// replica that has not renewed it for this long is taken for dead, and
/// its active tasks are failed by a live one.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// Tasks in a PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    writers: Writers,
    /// This replica's id (random, per process, and new each time it was
    /// declared dead) and whether it holds its lease.
    standing: Arc<lease::Standing>,
    /// The epoch of each role this replica holds ([`TaskStore::hold`]).
    epochs: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
    changes: broadcast::Sender<Change>,
    /// Ends the lease's renewal, the event log's trimming and the
    /// listening when the last clone is dropped.
    _background: Arc<[AbortOnDrop; 3]>,
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn unavailable(e: impl std::error::Error) -> StoreError {
    // tokio-postgres says only "db error" at the top; the database's own
    // message is the source.
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    StoreError::Unavailable(text)
}

fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| StoreError::Internal("stored text is not UTF-8".into()))
}

/// A read of a task's changes after its record (migrations 0011, 0012),
/// in order, as one more column of a statement reading `tasks`: NULL (no
/// lookup) when it has none, so that the record and its changes are of one
/// snapshot. The changes kept at or before the record's version
/// (`whole_version`) are for followers ([`CATCH_UP`]), not read here.
const CHANGES: &str = "CASE WHEN tasks.changes_bytes > 0 THEN \
     (SELECT array_agg(c.changes ORDER BY c.version) FROM task_changes c \
     WHERE c.tenant = tasks.tenant AND c.task_id = tasks.id \
     AND c.version > tasks.whole_version) END";

/// A task as [`TaskStore::catch_up`] reads it after version `$3`: its
/// version; its record only when the changes after `$3` are not all kept
/// (`base`, the version before the task's first kept change, is past
/// `$3`), else NULL, never read; and the changes after `$3`, or with the
/// record those after it (`whole_version`), in order. The changes kept
/// run without a gap from `base` to the task's version: a whole write of a
/// running task keeps its own and those since the whole write before it
/// (migration 0012), any other whole write none. One statement: one
/// snapshot.
const CATCH_UP: &str = "SELECT t.version, CASE WHEN b.base > $3 THEN t.record END, \
     CASE WHEN t.version > $3 THEN \
     (SELECT array_agg(c.changes ORDER BY c.version) FROM task_changes c \
     WHERE c.tenant = t.tenant AND c.task_id = t.id \
     AND c.version > CASE WHEN b.base > $3 THEN t.whole_version ELSE $3 END) END \
     FROM tasks t CROSS JOIN LATERAL (SELECT COALESCE((SELECT min(c.version) - 1 \
     FROM task_changes c WHERE c.tenant = t.tenant AND c.task_id = t.id), t.version) AS base) b \
     WHERE t.tenant = $1 AND t.id = $2";

fn stored(
    record: Vec<u8>,
    version: i64,
    changes: Option<Vec<Vec<u8>>>,
) -> Result<StoredTask, StoreError> {
    let changes = changes.unwrap_or_default();
    Ok(StoredTask {
        record: codec::decode_with_changes(&record, changes.iter().map(Vec::as_slice))?,
        version: version as u64,
    })
}

impl PostgresStore {
    /// Connects to `url` (`postgres://USER@HOST:PORT/DB`), brings the
    /// schema up to date and joins as a replica with the default lease.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::open_with_lease(url, DEFAULT_LEASE).await
    }

    /// [`PostgresStore::open`] with a lease of `lease`: this replica renews
    /// it every third of that, and is taken for dead by the others once it
    /// has not for `lease`.
    pub async fn open_with_lease(url: &str, lease: Duration) -> Result<Self, StoreError> {
        if lease.is_zero() {
            return Err(StoreError::Internal("the lease must be above zero".into()));
        }
        // Every connection of the store, TLS as the URL's sslmode says.
        let connector = tls::Connector::from_url(url)?;
        let manager = connector.manager(ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        });
        // A session left in a transaction (its process paused, its client
        // gone quiet) is ended after a lease: an open write transaction
        // keeps its replica from being declared dead (see `lease`).
        let settings = format!(
            "SET statement_timeout = {}; SET idle_in_transaction_session_timeout = {}",
            STATEMENT_TIMEOUT.as_millis(),
            lease.as_millis().max(1)
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let settings = settings.clone();
                Box::pin(async move {
                    client
                        .batch_execute(&settings)
                        .await
                        .map_err(deadpool_postgres::HookError::Backend)
                })
            }))
            .build()
            .map_err(|e| StoreError::Internal(e.to_string()))?;
        migrate(&pool).await?;
        let standing = lease::Standing::new(lease);
        lease::join(&**pool.get().await.map_err(unavailable)?, &standing).await?;
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let renewal = tokio::spawn(lease::keep(
            standing.clone(),
            renewal_connection(&connector, lease),
        ));
        let trimming = tokio::spawn(trim_event_log_while_open(pool.clone()));
        let listening = tokio::spawn(listen(connector, changes.clone()));
        Ok(PostgresStore {
            writers: Writers::start(pool.clone(), standing.clone()),
            pool,
            standing,
            epochs: Default::default(),
            changes,
            _background: Arc::new([
                AbortOnDrop(renewal),
                AbortOnDrop(trimming),
                AbortOnDrop(listening),
            ]),
        })
    }

    /// This replica's id, as the `replicas` table and the tasks' `runner`
    /// hold it.
    pub fn replica_id(&self) -> uuid::Uuid {
        uuid::Uuid::from_slice(&self.standing.id()).unwrap_or_default()
    }

    /// This replica's id and the epoch of the delivery role it holds;
    /// an error when it holds none.
    fn delivering(&self) -> Result<(Arc<[u8]>, i64), StoreError> {
        self.standing.check()?;
        let epochs = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        match epochs.get(DELIVERY_ROLE) {
            Some(&epoch) => Ok((self.standing.id(), epoch)),
            None => Err(StoreError::Unavailable(
                "this replica does not hold the push delivery role".into(),
            )),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(unavailable)
    }

    /// Recovery's rows (tenant, record, version, id) decoded; a record that
    /// no longer decodes must not keep the server from starting or
    /// recovering: it is moved to `quarantine` (logged with its key) and
    /// the rest goes on.
    async fn recoverable(
        &self,
        rows: Vec<tokio_postgres::Row>,
    ) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let mut tasks = Vec::with_capacity(rows.len());
        for r in rows {
            let (tenant, id): (Vec<u8>, Vec<u8>) = (r.get(0), r.get(3));
            let decoded =
                text(tenant.clone()).and_then(|t| Ok((t, stored(r.get(1), r.get(2), r.get(4))?)));
            match decoded {
                Ok(task) => tasks.push(task),
                Err(e) => self.quarantine(&tenant, &id, &e.to_string()).await?,
            }
        }
        Ok(tasks)
    }

    /// Moves an undecodable record out of `tasks` into `quarantine`.
    async fn quarantine(&self, tenant: &[u8], id: &[u8], reason: &str) -> Result<(), StoreError> {
        tracing::error!(
            tenant = %String::from_utf8_lossy(tenant),
            task_id = %String::from_utf8_lossy(id),
            %reason,
            "stored task does not decode: moved to the quarantine table"
        );
        let client = self.client().await?;
        client
            .execute(
                "WITH changes AS (DELETE FROM task_changes WHERE tenant = $1 AND task_id = $2 \
                 RETURNING version, changes), \
                 moved AS (DELETE FROM tasks WHERE tenant = $1 AND id = $2 \
                 RETURNING tenant, id, record, whole_version) \
                 INSERT INTO quarantine (tenant, id, record, changes, reason) \
                 SELECT tenant, id, record, \
                 (SELECT array_agg(changes ORDER BY version) FROM changes \
                 WHERE version > moved.whole_version), $3 FROM moved \
                 ON CONFLICT (tenant, id) DO UPDATE SET record = EXCLUDED.record, \
                 changes = EXCLUDED.changes, reason = EXCLUDED.reason, at = now()",
                &[&tenant, &id, &reason],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<StoredTask>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt(sql, params).await.map_err(unavailable)?;
        row.map(|r| stored(r.get(0), r.get(1), r.get(2)))
            .transpose()
    }
}

/// Applies the migrations not yet applied, under an advisory lock held
/// by this session for the duration; refuses a database migrated past
/// this release's last migration.
async fn migrate(pool: &Pool) -> Result<(), StoreError> {
    let mut client = pool.get().await.map_err(unavailable)?;
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
        if applied as usize > MIGRATIONS.len() {
            return Ok(Some(applied));
        }
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
        Ok::<_, tokio_postgres::Error>(None)
    }
    .await;
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let newer = result.map_err(|e| StoreError::Internal(format!("migrating the schema: {e}")))?;
    unlocked.map_err(unavailable)?;
    if let Some(applied) = newer {
        // A replica of an older release must not serve a database a newer
        // one migrated: it would not read what the newer one writes (a
        // long task's changes, migrations 0011 and 0012, would be missed
        // or replayed twice). See docs/replicas.md, "Upgrading".
        return Err(StoreError::Internal(format!(
            "the database's schema is at version {applied}, newer than this release's {}: \
             a replica of a newer release migrated it; run that release (docs/replicas.md, \
             \"Upgrading\")",
            MIGRATIONS.len()
        )));
    }
    Ok(())
}

/// The lease renewal's own connection ([`lease::keep`]), made with the
/// store's settings (TLS included); its statements time out with the
/// renewal's deadline.
fn renewal_connection(connector: &tls::Connector, lease: Duration) -> lease::Connect {
    let connector = connector.clone();
    let deadline = (lease / lease::RENEWAL_DEADLINE_PART).as_millis().max(1);
    Arc::new(move || {
        let connector = connector.clone();
        Box::pin(async move {
            let (client, connection) = connector.connect().await.map_err(unavailable)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "the lease renewal's connection closed");
                }
            });
            // A renewal need not wait for the disk: one lost with a crash of
            // the database only ends the lease sooner in the database than
            // here, and whatever this replica writes then is fenced there
            // (`a2a_fence`). Waiting for the WAL flush behind the writers'
            // commits made renewals late under load (the fault harness:
            // healthy replicas losing their lease).
            client
                .batch_execute(&format!(
                    "SET statement_timeout = {deadline}; SET synchronous_commit = off"
                ))
                .await
                .map_err(unavailable)?;
            Ok(client)
        })
    })
}

/// Declares dead the replicas whose lease ran out (`a2a_reap`), before
/// anything they held is taken over.
async fn reap(client: &tokio_postgres::Client) -> Result<(), StoreError> {
    client
        .execute(lease::REAP, &[])
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// A read-only transaction whose reads all see one snapshot.
async fn snapshot(
    client: &mut deadpool_postgres::Client,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(unavailable)
}

/// For as long as the store lives, one replica per
/// [`EVENT_LOG_TRIM_EVERY`] trims the event log and forgets what dead
/// replicas watched (apart from the lease's renewal: a slow trim must
/// never make a renewal late).
async fn trim_event_log_while_open(pool: Pool) {
    let mut ticks = tokio::time::interval(EVENT_LOG_TRIM_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(e) = trim_event_log(&pool).await {
            tracing::warn!(error = %e, "could not trim the event log");
        }
    }
}

async fn trim_event_log(pool: &Pool) -> Result<(), StoreError> {
    let client = pool.get().await.map_err(unavailable)?;
    if !take_turn(&client, "event-log", EVENT_LOG_TRIM_EVERY).await? {
        return Ok(());
    }
    client
        .execute(
            "DELETE FROM task_events WHERE at < now() - make_interval(secs => $1)",
            &[&EVENT_LOG_RETAIN.as_secs_f64()],
        )
        .await
        .map_err(unavailable)?;
    // What replicas whose lease ran out were watching.
    client
        .execute(
            "DELETE FROM task_watchers w USING replicas r \
             WHERE w.replica = r.id AND r.dead",
            &[],
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// [`TaskStore::take_turn`] on `client`.
async fn take_turn(
    client: &tokio_postgres::Client,
    job: &str,
    every: Duration,
) -> Result<bool, StoreError> {
    let row = client
        .query_opt(
            "INSERT INTO a2a_jobs (name, last_run) VALUES ($1, now()) \
             ON CONFLICT (name) DO UPDATE SET last_run = now() \
             WHERE a2a_jobs.last_run <= now() - make_interval(secs => $2) RETURNING 1",
            &[&job, &every.as_secs_f64()],
        )
        .await
        .map_err(unavailable)?;
    Ok(row.is_some())
}

/// Listens for every replica's committed task writes ([`writer::CHANNEL`])
/// and passes them on as [`Change`]s, on a connection of its own; after
/// that connection broke and was made again, a [`Change::Gap`] first.
async fn listen(connector: tls::Connector, changes: broadcast::Sender<Change>) {
    use futures_util::StreamExt;
    let mut delay = LISTEN_RETRY_FIRST;
    let mut broken = false;
    loop {
        match connector.connect().await {
            Ok((client, mut connection)) => {
                let (tx, mut payloads) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let payload = if n.channel() == writer::OUTBOX_CHANNEL {
                                    None
                                } else {
                                    Some(n.payload().to_owned())
                                };
                                if tx.send(payload).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "the PostgreSQL listening connection broke");
                                return;
                            }
                        }
                    }
                });
                match client
                    .batch_execute(&format!("LISTEN {}", writer::CHANNEL))
                    .await
                {
                    Ok(()) => {
                        delay = LISTEN_RETRY_FIRST;
                        if broken {
                            let _ = changes.send(Change::Gap);
                        }
                        while let Some(payload) = payloads.recv().await {
                            let Some(payload) = payload else {
                                let _ = changes.send(Change::Outbox);
                                continue;
                            };
                            for (tenant, task_id, version) in writer::parse_notification(&payload) {
                                let _ = changes.send(Change::Task {
                                    tenant,
                                    task_id,
                                    version,
                                });
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not listen for task changes"),
                }
                driver.abort();
            }
            Err(e) => tracing::warn!(error = %e, "could not connect to listen for task changes"),
        }
        broken = true;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(LISTEN_RETRY_MAX);
    }
}

#[async_trait]
impl TaskStore for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn instrument(&self, writer: crate::metrics::WriterMetrics) {
        self.writers.instrument(writer);
    }

    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        task.body.whole()?;
        self.writers.write(tenant, Kind::Create(task.clone())).await
    }

    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        let key = origin_key(owner, message_id);
        self.one(
            &format!(
                "SELECT record, version, {CHANGES} FROM tasks WHERE tenant = $1 AND origin = $2 \
                 AND origin <> ''::bytea"
            ),
            &[&tenant.as_bytes(), &key],
        )
        .await
    }

    async fn claim_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<OriginClaim, StoreError> {
        let key = origin_key(owner, message_id);
        if self.writers.write(tenant, Kind::Claim(key.clone())).await? == 1 {
            return Ok(OriginClaim::First);
        }
        // Taken: by the task the message created, by a replica answering
        // it now, or by a run that ended without its task stored: a dead
        // replica's, or this replica's own (the runtime claims in memory
        // first, so an own claim found here is a run that is over). That
        // run's agent may have acted on the message: the claim is taken
        // over as lost.
        if let Some(task) = self.find_by_origin(tenant, owner, message_id).await? {
            return Ok(OriginClaim::Task(Box::new(task)));
        }
        self.standing.check()?;
        let client = self.client().await?;
        // A holder whose lease ran out is declared dead first: only then
        // can its claim be taken over (and it can never write under it).
        reap(&client).await?;
        let me = self.standing.id();
        let taken_over = client
            .execute(
                "UPDATE origin_claims SET replica = $3 FROM (SELECT a2a_fence($3)) f \
                 WHERE tenant = $1 AND origin = $2 \
                 AND (replica = $3 OR replica NOT IN (SELECT id FROM replicas WHERE NOT dead)) \
                 AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.tenant = $1 AND t.origin = $2)",
                &[&tenant.as_bytes(), &key, &&*me],
            )
            .await
            .map_err(unavailable)?;
        Ok(match taken_over {
            1 => OriginClaim::Lost,
            // Still answered elsewhere, or its task was just created, or
            // the claim just released: asked again, each settles.
            _ => OriginClaim::Elsewhere,
        })
    }

    async fn release_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<(), StoreError> {
        let key = origin_key(owner, message_id);
        let client = self.client().await?;
        let me = self.standing.id();
        client
            .execute(
                "DELETE FROM origin_claims WHERE tenant = $1 AND origin = $2 AND replica = $3 \
                 AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.tenant = $1 AND t.origin = $2)",
                &[&tenant.as_bytes(), &key, &&*me],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn claim_run(&self, tenant: &str, task_id: &str) -> Result<Option<u64>, StoreError> {
        self.standing.check()?;
        let client = self.client().await?;
        reap(&client).await?;
        let me = self.standing.id();
        let mine = self.standing.ids();
        // Free, already this replica's, or held by a replica declared dead
        // (its run is over: it is failed or about to be, and it can write
        // nothing more). The run about to start settles one of the runs
        // this process owes the task (`owed`), under its current id or
        // one it had before it rejoined: the follow-up may have been
        // committed under that one, and its run stayed queued here.
        let row = client
            .query_opt(
                "UPDATE tasks SET runner = $3, run_held = true, \
                 owed = COALESCE((SELECT owed[:p.i - 1] || owed[p.i + 1:] FROM \
                 (SELECT min(s) AS i FROM generate_subscripts(owed, 1) s WHERE owed[s] = ANY($4)) p \
                 WHERE p.i IS NOT NULL), owed) \
                 FROM (SELECT a2a_fence($3)) f \
                 WHERE tenant = $1 AND id = $2 AND (NOT run_held OR runner = $3 \
                 OR runner NOT IN (SELECT id FROM replicas WHERE NOT dead)) \
                 RETURNING version",
                &[&tenant.as_bytes(), &task_id.as_bytes(), &&*me, &mine],
            )
            .await
            .map_err(unavailable)?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    async fn take_runs(&self, tenant: &str, task_id: &str) -> Result<bool, StoreError> {
        self.standing.check()?;
        let client = self.client().await?;
        reap(&client).await?;
        let me = self.standing.id();
        let taken = client
            .execute(
                "UPDATE tasks SET runner = $3, run_held = true FROM (SELECT a2a_fence($3)) f \
                 WHERE tenant = $1 AND id = $2 AND (NOT run_held OR runner = $3 \
                 OR runner NOT IN (SELECT id FROM replicas WHERE NOT dead))",
                &[&tenant.as_bytes(), &task_id.as_bytes(), &&*me],
            )
            .await
            .map_err(unavailable)?;
        Ok(taken == 1)
    }

    async fn release_run(&self, tenant: &str, task_id: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        let me = self.standing.id();
        // Announced like a write at the task's version: a replica whose
        // queued run waits for the claim tries again at once.
        client
            .query_opt(
                "WITH released AS (UPDATE tasks SET run_held = false \
                 WHERE tenant = $1 AND id = $2 AND runner = $3 AND run_held RETURNING version) \
                 SELECT pg_notify($4, $5 || released.version::text) FROM released",
                &[
                    &tenant.as_bytes(),
                    &task_id.as_bytes(),
                    &&*me,
                    &writer::CHANNEL,
                    &writer::notification_prefix(tenant, task_id),
                ],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        let key: [&(dyn ToSql + Sync); 2] = [&tenant.as_bytes(), &task_id.as_bytes()];
        if let Some(task) = self
            .one(
                &format!(
                    "SELECT record, version, {CHANGES} FROM tasks WHERE tenant = $1 AND id = $2"
                ),
                &key,
            )
            .await?
        {
            return Ok(Some(task));
        }
        // Rare: a miss also looks among the records set aside.
        let client = self.client().await?;
        let reason = client
            .query_opt(
                "SELECT reason FROM quarantine WHERE tenant = $1 AND id = $2",
                &key,
            )
            .await
            .map_err(unavailable)?;
        match reason {
            Some(row) => Err(StoreError::Internal(format!(
                "task {task_id:?} was set aside because its stored record does not decode \
                 ({}); it is kept in the quarantine table",
                row.get::<_, String>(0)
            ))),
            None => Ok(None),
        }
    }

    async fn get_owned(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.one(
            &format!(
                "SELECT record, version, {CHANGES} FROM tasks WHERE tenant = $1 AND id = $2 \
                 AND owner = $3 AND owner <> ''::bytea"
            ),
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
        self.writers
            .write(tenant, Kind::Update(task.clone(), expected_version))
            .await
    }

    fn keeps_changes(&self) -> bool {
        true
    }

    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let page_size = query.effective_page_size();
        let count = sql::count_query::<Postgres>(tenant, query);
        let mut client = self.client().await?;
        // One snapshot for the count and the page.
        let tx = snapshot(&mut client).await?;
        let total: i64 = tx
            .query_one(&count.text, &count.params())
            .await
            .map_err(unavailable)?
            .get(0);
        // The candidates' sizes first (`octet_length` of a stored value
        // reads its header, not its TOAST), then only the records that
        // fit.
        let sizes = sql::page_query::<Postgres>(
            "SELECT octet_length(record) + changes_bytes FROM tasks",
            tenant,
            query,
            page_size + 1,
        );
        let sizes: Vec<i64> = tx
            .query(&sizes.text, &sizes.params())
            .await
            .map_err(unavailable)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let (take, more) = crate::store::fitting(sizes.iter().map(|&n| n as usize), page_size);
        let page = sql::page_query::<Postgres>(
            &format!("SELECT record, {CHANGES} FROM tasks"),
            tenant,
            query,
            take,
        );
        let rows = tx
            .query(&page.text, &page.params())
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        let rows: Vec<(Vec<u8>, Vec<Vec<u8>>)> = rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    r.get::<_, Option<Vec<Vec<u8>>>>(1).unwrap_or_default(),
                )
            })
            .collect();
        TaskPage::from_parts(&rows, more, query, total as usize)
    }

    async fn count_unfinished(&self) -> Result<Vec<(crate::proto::TaskState, u64)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(&unfinished_counts(), &[])
            .await
            .map_err(unavailable)?;
        Ok(counted(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
    }

    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        let sql = format!(
            "SELECT tenant, record, version, id, {CHANGES} FROM tasks WHERE state IN ({})",
            state_list(StateClass::Active)
        );
        let client = self.client().await?;
        let rows = client.query(&sql, &[]).await.map_err(unavailable)?;
        self.recoverable(rows).await
    }

    async fn orphaned_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        // The tasks of replicas declared dead: those whose lease ran out
        // are declared so first. Active ones ran there; interrupted ones
        // owe a follow-up a run that was to start there (unless that
        // replica is this process under an id it had before it rejoined:
        // the run is still queued here).
        let sql = format!(
            "SELECT tenant, record, version, id, {CHANGES} FROM tasks WHERE state IN ({}) \
             AND runner <> $1 AND runner NOT IN (SELECT id FROM replicas WHERE NOT dead) \
             UNION ALL SELECT tenant, record, version, id, {CHANGES} FROM tasks \
             WHERE owed <> '{{}}' AND state IN ({}) AND EXISTS (SELECT 1 FROM unnest(owed) o(r) \
             WHERE r <> ALL($2) AND r NOT IN (SELECT id FROM replicas WHERE NOT dead))",
            state_list(StateClass::Active),
            state_list(StateClass::Interrupted)
        );
        let client = self.client().await?;
        reap(&client).await?;
        let me = self.standing.id();
        let mine = self.standing.ids();
        let rows = client
            .query(&sql, &[&&*me, &mine])
            .await
            .map_err(unavailable)?;
        self.recoverable(rows).await
    }

    fn lease(&self) -> Option<Duration> {
        Some(self.standing.lease())
    }

    fn held_for(&self) -> Duration {
        self.standing.held_for()
    }

    fn lease_losses(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.standing.losses())
    }

    async fn take_turn(&self, job: &str, every: Duration) -> Result<bool, StoreError> {
        let client = self.client().await?;
        take_turn(&client, job, every).await
    }

    async fn hold(&self, role: &str) -> Result<bool, StoreError> {
        self.standing.check()?;
        let client = self.client().await?;
        let me = self.standing.id();
        // Fenced like a write; the epoch goes up each time the role
        // changes hands, and what is done under the role names it.
        let row = client
            .query_opt(
                "INSERT INTO a2a_jobs (name, last_run, holder, epoch) \
                 SELECT $1, now(), $2, 1 FROM (SELECT a2a_fence($2)) f \
                 ON CONFLICT (name) DO UPDATE SET last_run = now(), holder = $2, \
                 epoch = CASE WHEN a2a_jobs.holder = $2 THEN a2a_jobs.epoch \
                 ELSE a2a_jobs.epoch + 1 END \
                 WHERE a2a_jobs.holder = $2 \
                 OR a2a_jobs.last_run < now() - make_interval(secs => $3) RETURNING epoch",
                &[&role, &&*me, &self.standing.lease().as_secs_f64()],
            )
            .await
            .map_err(unavailable)?;
        let mut epochs = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        match row {
            Some(row) => {
                epochs.insert(role.to_owned(), row.get(0));
                Ok(true)
            }
            None => {
                epochs.remove(role);
                Ok(false)
            }
        }
    }

    async fn watch(&self, tenant: &str, task_id: &str, on: bool) -> Result<(), StoreError> {
        let client = self.client().await?;
        let sql = if on {
            "INSERT INTO task_watchers (tenant, task_id, replica) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM task_watchers WHERE tenant = $1 AND task_id = $2 AND replica = $3"
        };
        client
            .execute(
                sql,
                &[
                    &tenant.as_bytes(),
                    &task_id.as_bytes(),
                    &&*self.standing.id(),
                ],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    fn changes(&self) -> Option<broadcast::Receiver<Change>> {
        Some(self.changes.subscribe())
    }

    async fn catch_up(
        &self,
        tenant: &str,
        task_id: &str,
        after: u64,
    ) -> Result<Option<CatchUp>, StoreError> {
        let mut client = self.client().await?;
        // One snapshot for the task and its events.
        let tx = snapshot(&mut client).await?;
        let (tenant, id) = (tenant.as_bytes(), task_id.as_bytes());
        let after_version = i64::try_from(after).unwrap_or(i64::MAX);
        let Some(row) = tx
            .query_opt(CATCH_UP, &[&tenant, &id, &after_version])
            .await
            .map_err(unavailable)?
        else {
            return Ok(None);
        };
        let version = row.get::<_, i64>(0) as u64;
        let record: Option<Vec<u8>> = row.get(1);
        let changes: Vec<Vec<u8>> = row.get::<_, Option<_>>(2).unwrap_or_default();
        let rows = if version > after {
            tx.query(
                "SELECT version, events FROM task_events WHERE tenant = $1 AND task_id = $2 \
                 AND version > $3 AND version <= $4 ORDER BY version",
                &[&tenant, &id, &after_version, &(version as i64)],
            )
            .await
            .map_err(unavailable)?
        } else {
            Vec::new()
        };
        tx.commit().await.map_err(unavailable)?;
        let task = match record {
            Some(record) => Caught::Whole(Box::new(codec::decode_with_changes(
                &record,
                changes.iter().map(Vec::as_slice),
            )?)),
            None => Caught::Changes(
                changes
                    .iter()
                    .map(|bytes| codec::decode_changes(bytes))
                    .collect::<Result<_, _>>()?,
            ),
        };
        let mut complete = true;
        let mut expected = after + 1;
        let mut events = Vec::new();
        for row in rows {
            let version = row.get::<_, i64>(0) as u64;
            complete &= version == expected;
            expected = version + 1;
            events.extend(codec::split_events(row.get(1))?);
        }
        complete &= expected > version;
        Ok(Some(CatchUp {
            version,
            task,
            events,
            complete,
        }))
    }

    async fn count_open_owned(&self, owner: &str, at_most: usize) -> Result<usize, StoreError> {
        // The empty name owns nothing.
        if owner.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE owner = $1 AND {} LIMIT $2) open",
            sql::OPEN_STATES_SQL
        );
        let client = self.client().await?;
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        let row = client
            .query_one(&sql, &[&owner.as_bytes(), &at_most])
            .await
            .map_err(unavailable)?;
        Ok(row.get::<_, i64>(0) as usize)
    }

    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<crate::store::Waiting>, StoreError> {
        let (s, n) = time_key(before);
        let sql = format!(
            "SELECT tenant, id, owner, status_seconds, status_nanos FROM tasks \
             WHERE {} AND (status_seconds, status_nanos) < ($1, $2) \
             ORDER BY status_seconds, status_nanos LIMIT $3",
            sql::WAITING_STATES_SQL
        );
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(&sql, &[&s, &n, &limit])
            .await
            .map_err(unavailable)?;
        rows.into_iter()
            .map(|r| {
                Ok(crate::store::Waiting {
                    tenant: text(r.get(0))?,
                    task_id: text(r.get(1))?,
                    owner: text(r.get(2))?,
                    since: (r.get(3), r.get(4)),
                })
            })
            .collect()
    }

    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        let (s, n) = time_key(before);
        // A purged task's idempotency claim goes with it; so do the claims
        // of replicas dead since before the cutoff whose runs created no
        // task. Not sooner: such a claim says that a run may have acted on
        // its message, and a retry taking it over records the task as lost
        // instead of running the agent again; forgotten at once (a sweep
        // between the replica's death and the retry), the retry would run
        // it a second time. Kept as long as a terminal task, it ends as one
        // would.
        let sql = format!(
            "WITH gone AS (DELETE FROM tasks WHERE state IN ({}) \
             AND (status_seconds, status_nanos) < ($1, $2) RETURNING tenant, id, origin), \
             claims AS (DELETE FROM origin_claims c USING gone \
             WHERE c.tenant = gone.tenant AND c.origin = gone.origin AND gone.origin <> ''::bytea), \
             changes AS (DELETE FROM task_changes c USING gone \
             WHERE c.tenant = gone.tenant AND c.task_id = gone.id), \
             events AS (DELETE FROM task_events e USING gone \
             WHERE e.tenant = gone.tenant AND e.task_id = gone.id) \
             SELECT COUNT(*) FROM gone",
            state_list(StateClass::Terminal)
        );
        let client = self.client().await?;
        let row = client
            .query_one(&sql, &[&s, &n])
            .await
            .map_err(unavailable)?;
        client
            .execute(
                "DELETE FROM origin_claims c USING replicas r WHERE c.replica = r.id \
                 AND r.dead AND r.lease_until < to_timestamp($1::int8::float8) \
                 AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.tenant = c.tenant AND t.origin = c.origin)",
                &[&s],
            )
            .await
            .map_err(unavailable)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn outbox(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        let client = self.client().await?;
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let rows = client
            .query(
                // The task's owner from its row (by primary key); "" once
                // purged.
                "SELECT o.seq, o.tenant, o.task_id, o.config_id, o.event, o.attempts, \
                 o.not_before, t.owner FROM push_outbox o \
                 LEFT JOIN tasks t ON t.tenant = o.tenant AND t.id = o.task_id \
                 WHERE o.seq > $1 ORDER BY o.seq LIMIT $2",
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
                    owner: text(r.get::<_, Option<Vec<u8>>>(7).unwrap_or_default())?,
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
        let (me, epoch) = self.delivering()?;
        let client = self.client().await?;
        // Only under the delivery role as read (its epoch): after it
        // changed hands the entry is the next holder's to deliver.
        client
            .execute(
                "DELETE FROM push_outbox o USING (SELECT a2a_fence($2)) f, a2a_jobs j \
                 WHERE o.seq = $1 AND j.name = $3 AND j.holder = $2 AND j.epoch = $4",
                &[&seq, &&*me, &DELIVERY_ROLE, &epoch],
            )
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
        let (me, epoch) = self.delivering()?;
        let client = self.client().await?;
        client
            .execute(
                "UPDATE push_outbox o SET attempts = $2, not_before = $3 \
                 FROM (SELECT a2a_fence($4)) f, a2a_jobs j \
                 WHERE o.seq = $1 AND j.name = $5 AND j.holder = $4 AND j.epoch = $6",
                &[
                    &seq,
                    &(attempts as i32),
                    &not_before_ms,
                    &&*me,
                    &DELIVERY_ROLE,
                    &epoch,
                ],
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
