//! Tasks in PostgreSQL: the store several replicas share (issue "scale
//! out"), with their coordination: leases and fencing, claims on new
//! messages and on a task's runs, the feed of each other's writes, and the
//! roles and turns of jobs (docs/replicas.md).
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
//! - Task writes are committed in batches by `writer`'s writer tasks
//!   (group commit), reads go straight to the pool.
//! - Schema migrations are embedded and applied at start under an
//!   advisory lock, so replicas starting together do not race.
//! - Driver: tokio-postgres with a deadpool pool. (sqlx's PostgreSQL driver
//!   cannot share a build with rusqlite: its optional SQLite driver's
//!   `links = "sqlite3"` conflicts with rusqlite's in Cargo's resolution.)

mod claims;
mod feed;
mod jobs;
mod lease;
mod outbox;
mod reads;
mod recovery;
mod schema;
mod store;
mod tls;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::broadcast;

use super::{StoreError, WriteNotice};
use writer::Writers;

/// Connections in the pool.
pub const POOL_SIZE: usize = 16;

/// How long a request waits for a free pooled connection.
pub const POOL_WAIT: Duration = Duration::from_secs(10);
/// How long making (or checking) a pooled connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Any statement of the pool's connections is cancelled by the database
/// after this long: nothing waits on a stuck one for ever.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long each write's events are kept for other replicas' subscribers
/// ([`Coordination::catch_up`](super::Coordination::catch_up)); one further behind gets a fresh snapshot.
pub const EVENT_LOG_RETAIN: Duration = Duration::from_secs(300);
/// Changes a follower of [`Coordination::changes`](super::Coordination::changes)
/// may fall behind before it is told of a gap instead.
pub const CHANGE_BUFFER: usize = 4096;

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
    /// The epoch of each role this replica holds
    /// ([`Coordination::hold`](crate::store::Coordination::hold)).
    epochs: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
    changes: broadcast::Sender<WriteNotice>,
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
    // message is the source. Each layer (the pool's, the driver's)
    // repeats its cause's text in its own: each is said once, and the
    // layers' words that name no cause are left out.
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    for noise in ["Error occurred while creating a new object: ", "db error: "] {
        text = text.replace(noise, "");
    }
    StoreError::Unavailable(text)
}

fn text(bytes: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(bytes).map_err(|_| StoreError::Internal("stored text is not UTF-8".into()))
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
        schema::migrate(&pool).await?;
        let standing = lease::Standing::new(lease);
        lease::join(&**pool.get().await.map_err(unavailable)?, &standing).await?;
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let renewal = tokio::spawn(lease::keep(
            standing.clone(),
            lease::renewal_connection(&connector, lease),
        ));
        let trimming = tokio::spawn(jobs::trim_event_log_while_open(pool.clone()));
        let listening = tokio::spawn(feed::listen(connector, changes.clone()));
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

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(unavailable)
    }
}
