//! PostgreSQL's writers, with group commit.
//!
//! A transaction per task write cost a round trip for each of BEGIN, the
//! statement and COMMIT, and a WAL flush per write (measured: about 2,800
//! non-blocking sends/s against 38,000 on the memory store). Instead every
//! task write is queued for [`WRITERS`] writer tasks; each takes whatever
//! is queued (up to [`MAX_BATCH`]) and runs it as one transaction, its
//! statements pipelined on one connection, and answers each caller only
//! once the transaction is committed. Whatever its size, a batch is one
//! round trip and a handful of statements (see [`transaction`]): its
//! creates as one `INSERT ... SELECT FROM unnest(...)`, its updates as one
//! `UPDATE ... FROM unnest(...)`, and so on. New messages' claims share
//! the batches (a writer of their own, committing without waiting for the
//! disk, made more transactions and cost more CPU than the flush it
//! saved: measured 9,700 sends/s against 10,400).
//!
//! A write refused by its version or a taken claim does not fail the
//! batch: updates name the version they expect and claims are `INSERT ...
//! ON CONFLICT DO NOTHING`, so a refused one changes no row and the others
//! commit; why it was refused is looked up after the commit. Creates are
//! plain inserts: a taken key is all but unheard of for them (ids are
//! generated here, and a message's key is claimed before its run), and
//! the conflict check before each row of `ON CONFLICT` cost more than a
//! tenth of the database's CPU in the send workload. A batch the database
//! refuses (a taken key among them) is retried write by write, so one bad
//! write cannot fail the writes that were queued beside it; a lost
//! connection fails them all with UNAVAILABLE.
//!
//! Rows are locked in key order within a batch (the batch is sorted), so
//! two replicas' batches touching the same tasks wait for each other
//! instead of deadlocking; a deadlock or serialization failure that still
//! happens is retried.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::lease::{FENCED_SQLSTATE, Standing};
use super::{text, unavailable};
use crate::store::{EncodedTask, StoreError};

/// Writer tasks: while one waits for its commit, another fills the next
/// batch.
pub const WRITERS: usize = 2;
/// Task writes taken into one transaction at most.
pub const MAX_BATCH: usize = 256;
/// Writes that may wait for a writer before callers wait for room.
pub const WRITE_QUEUE: usize = 4096;
/// Times a batch is tried again after a deadlock or a serialization
/// failure.
const RETRIES: usize = 3;

/// The creates. A new task's first write logs no events: no replica
/// watches it yet, and one that loads it later reads it at version 1 or
/// after.
/// A create holds the task for its first run (`run_held`), which made it.
const INSERT: &str = "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, \
     status_nanos, owner, origin, version, record, runner, run_held) \
     SELECT tenant, id, context_id, state, s, n, owner, origin, 1, record, $10, true \
     FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::int4[], $5::int8[], $6::int4[], \
     $7::bytea[], $8::bytea[], $9::bytea[]) \
     AS u(tenant, id, context_id, state, s, n, owner, origin, record) \
     RETURNING tenant, id";
/// The updates, and the events of those made, for any replica that follows
/// the task or will. Logged whether or not a replica watches the task
/// now: a replica starting to watch cannot make a writer whose statement
/// began before the watch see it, and the events of that write must still
/// be there when the replica catches up (the soak test met a replica
/// resynchronised from a snapshot for want of them).
/// A write committing follow-ups records the runs this replica owes them
/// (`owed`, migration `0010_owed_runs.sql`).
/// A whole write (`whole`) replaces the record (`whole_version`, migration
/// `0012_whole_version.sql`); a write of changes appends them
/// (`task_changes`, migration `0011_task_changes.sql`) and leaves the record
/// as it is (not copied: the new row version points at the same TOASTed
/// value). A whole write that logs its changes (`logged`: one of a running
/// task) appends them too and drops only the changes at or before the
/// previous whole write (`old`: every statement of the query sees the
/// rows as they were before it), so that a replica following the task
/// catches up by changes across it; any other drops them all.
const UPDATE: &str = "WITH u AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], \
     $4::int4[], $5::int8[], $6::int4[], $7::bytea[], $8::int8[], $9::bool[], $11::bytea[], \
     $12::int4[], $13::bool[], $14::bytea[]) \
     AS u(tenant, id, context_id, state, s, n, body, expected, by_run, events, owes, whole, \
     logged)), \
     old AS (SELECT t.tenant, t.id, t.whole_version FROM tasks t JOIN u \
     ON t.tenant = u.tenant AND t.id = u.id WHERE u.whole AND u.logged IS NOT NULL), \
     made AS (UPDATE tasks AS t SET context_id = u.context_id, state = u.state, \
     status_seconds = u.s, status_nanos = u.n, version = t.version + 1, \
     record = CASE WHEN u.whole THEN u.body ELSE t.record END, \
     whole_version = CASE WHEN u.whole THEN t.version + 1 ELSE t.whole_version END, \
     changes_bytes = CASE WHEN u.whole THEN 0 ELSE t.changes_bytes + octet_length(u.body) END, \
     runner = CASE WHEN u.by_run THEN $10 ELSE t.runner END, \
     owed = CASE WHEN u.owes > 0 THEN t.owed || array_fill($10::bytea, ARRAY[u.owes]) \
     ELSE t.owed END \
     FROM u WHERE t.tenant = u.tenant AND t.id = u.id AND t.version = u.expected \
     RETURNING t.tenant, t.id, t.version), \
     logged AS (INSERT INTO task_events (tenant, task_id, version, events) \
     SELECT made.tenant, made.id, made.version, u.events FROM made JOIN u USING (tenant, id) \
     ON CONFLICT (tenant, task_id, version) DO UPDATE SET events = EXCLUDED.events, at = now()), \
     kept AS (INSERT INTO task_changes (tenant, task_id, version, changes) \
     SELECT made.tenant, made.id, made.version, \
     CASE WHEN u.whole THEN u.logged ELSE u.body END FROM made JOIN u USING (tenant, id) \
     WHERE NOT u.whole OR u.logged IS NOT NULL), \
     dropped AS (DELETE FROM task_changes c USING made JOIN u USING (tenant, id) \
     LEFT JOIN old USING (tenant, id) \
     WHERE u.whole AND c.tenant = made.tenant AND c.task_id = made.id \
     AND (old.whole_version IS NULL OR c.version <= old.whole_version)) \
     SELECT tenant, id, version FROM made";
/// The first statement of every write transaction: refuses the whole
/// transaction if this replica was declared dead, and keeps it from being
/// declared dead until the commit (see `lease`).
const FENCE: &str = "SELECT a2a_fence($1)";
const CLAIM: &str = "INSERT INTO origin_claims (tenant, origin, replica) \
     SELECT tenant, origin, $3 FROM unnest($1::bytea[], $2::bytea[]) AS u(tenant, origin) \
     ON CONFLICT DO NOTHING RETURNING tenant, origin";
/// The advisory lock writers of push notifications hold to their commit.
const OUTBOX_LOCK: i64 = 0x0a2a_11fe_c7c1_e003;

/// The push notifications of the task writes this transaction made:
/// each entry names its task write (tenant, task_id, version), and is kept
/// if that task row is at that version and was written by this
/// transaction (its `xmin`). The task is looked up by key for each entry
/// (the `OFFSET 0` keeps the lookup a nested index probe, whatever the
/// table's size), in entry order.
const OUTBOX: &str = "INSERT INTO push_outbox (tenant, task_id, config_id, event) \
     SELECT u.tenant, u.task_id, u.config_id, u.event \
     FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bytea[], $5::bytea[]) \
     WITH ORDINALITY AS u(tenant, task_id, version, config_id, event, n) \
     CROSS JOIN LATERAL (SELECT t.version, t.xmin FROM tasks t \
     WHERE t.tenant = u.tenant AND t.id = u.task_id OFFSET 0) AS t \
     WHERE t.version = u.version \
     AND t.xmin = (pg_current_xact_id()::text::bigint % 4294967296)::text::xid \
     ORDER BY u.n";
/// One notification per write that some replica must hear of: a client's
/// or the server's (`always`), or a run's to a task a replica watches
/// (`task_watchers`). A transaction that notifies takes a lock at commit
/// that every other notifying one waits for, through its WAL flush: a
/// notification per write made the writers commit one at a time (measured:
/// half the sends per second).
const NOTIFY: &str = "SELECT pg_notify($1, n.p) \
     FROM unnest($2::text[], $3::bytea[], $4::bytea[], $5::bool[]) AS n(p, tenant, task_id, always) \
     WHERE n.always OR EXISTS (SELECT 1 FROM task_watchers w \
     WHERE w.tenant = n.tenant AND w.task_id = n.task_id)";
const NOTIFY_OUTBOX: &str = "SELECT pg_notify($1, '')";
/// The channel replicas hear committed task writes on.
pub(super) const CHANNEL: &str = "a2a_tasks";
/// The channel the replica delivering push notifications hears of new
/// outbox entries on.
pub(super) const OUTBOX_CHANNEL: &str = "a2a_outbox";

/// One write: a task's create or update, or a new message's claim.
pub(super) struct Write {
    pub tenant: String,
    pub kind: Kind,
    /// The new version of a task written; for a claim, 1 when claimed.
    pub reply: oneshot::Sender<Result<u64, StoreError>>,
}

pub(super) enum Kind {
    Create(EncodedTask),
    /// An update from the version it names.
    Update(EncodedTask, u64),
    /// Claims a new message's idempotency key (`origin_claims`).
    Claim(Vec<u8>),
}

impl Write {
    /// The row the write locks: writes are sorted by it.
    fn key(&self) -> (u8, &str, &[u8]) {
        match &self.kind {
            Kind::Claim(origin) => (0, &self.tenant, origin),
            Kind::Create(t) | Kind::Update(t, _) => (1, &self.tenant, t.id.as_bytes()),
        }
    }
}

/// What a write did inside its transaction.
enum Done {
    /// Written: the new version.
    Written(u64),
    /// Refused by its key or version; why is asked after the commit.
    Refused,
}

/// The queue in front of the writers.
#[derive(Clone)]
pub(super) struct Writers {
    queue: mpsc::Sender<Write>,
    cx: Arc<Context>,
}

/// What the writers need besides their queue.
struct Context {
    pool: Pool,
    /// This replica's id (the runner of the tasks its runs write, the
    /// holder of the claims it makes) and whether it holds its lease.
    standing: Arc<Standing>,
    /// Where the writers record their batches, once the server says.
    metrics: std::sync::OnceLock<crate::metrics::WriterMetrics>,
}

impl Writers {
    pub(super) fn start(pool: Pool, standing: Arc<Standing>) -> Self {
        let (queue, rx) = mpsc::channel(WRITE_QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let cx = Arc::new(Context {
            pool,
            standing,
            metrics: std::sync::OnceLock::new(),
        });
        for _ in 0..WRITERS {
            tokio::spawn(writer(cx.clone(), rx.clone()));
        }
        Writers { queue, cx }
    }

    /// Only the first server's: one store, one set of writers.
    pub(super) fn instrument(&self, metrics: crate::metrics::WriterMetrics) {
        let _ = self.cx.metrics.set(metrics);
    }

    /// Queues a write and waits for its commit; refused at once while
    /// this replica does not hold its lease (it fences itself).
    pub(super) async fn write(&self, tenant: &str, kind: Kind) -> Result<u64, StoreError> {
        self.cx.standing.check()?;
        let (reply, answer) = oneshot::channel();
        let write = Write {
            tenant: tenant.to_owned(),
            kind,
            reply,
        };
        self.queue
            .send(write)
            .await
            .map_err(|_| StoreError::Unavailable("the PostgreSQL writers stopped".into()))?;
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Internal("a PostgreSQL write was lost".into())))
    }
}

/// One writer: takes a batch from the shared queue, commits it, answers.
async fn writer(cx: Arc<Context>, queue: Arc<Mutex<mpsc::Receiver<Write>>>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        {
            let mut rx = queue.lock().await;
            if rx.recv_many(&mut batch, MAX_BATCH).await == 0 {
                return;
            }
            if let Some(metrics) = cx.metrics.get() {
                metrics.batch(batch.len(), rx.len());
            }
        }
        // Key order: see the module docs. The sort is stable: writes to
        // one row stay in arrival order.
        batch.sort_by(|a, b| a.key().cmp(&b.key()));
        for round in rounds(std::mem::take(&mut batch)) {
            commit(&cx, round).await;
        }
    }
}

/// Splits a sorted batch into transactions in which no row is written
/// twice, in order: the first write to each row, then the second, and so
/// on. One statement over an array that names a row twice writes it once
/// (an insert skips the second, an update applies one of them), and each
/// write's outcome is read back by its key, so a second write to the same
/// row must come in a later transaction. This runtime never queues two
/// writes to one task at once; a store caller may.
fn rounds(batch: Vec<Write>) -> Vec<Vec<Write>> {
    // How many writes to the same row come before each one.
    let mut repeats = Vec::with_capacity(batch.len());
    for (i, write) in batch.iter().enumerate() {
        let repeat = match i.checked_sub(1) {
            Some(before) if batch[before].key() == write.key() => repeats[before] + 1,
            _ => 0,
        };
        repeats.push(repeat);
    }
    let mut rounds: Vec<Vec<Write>> = vec![Vec::with_capacity(batch.len())];
    for (write, repeat) in batch.into_iter().zip(repeats) {
        if rounds.len() <= repeat {
            rounds.push(Vec::new());
        }
        rounds[repeat].push(write);
    }
    rounds
}

/// Commits `batch` and answers every write of it.
async fn commit(cx: &Context, batch: Vec<Write>) {
    let mut attempt = 0;
    let outcome = loop {
        let tried = tokio::time::timeout(TRANSACTION_TIMEOUT, transaction(cx, &batch))
            .await
            .unwrap_or(Err(Failure::TimedOut));
        match tried {
            Err(e) if e.retryable() && attempt < RETRIES => attempt += 1,
            outcome => break outcome,
        }
    };
    match outcome {
        Ok(done) => {
            for (write, done) in batch.into_iter().zip(done) {
                let result = match done {
                    Done::Written(version) => Ok(version),
                    Done::Refused => why_refused(&cx.pool, &write).await,
                };
                let _ = write.reply.send(result);
            }
        }
        // A create alone whose key is taken: why, as for a refused write.
        Err(e)
            if e.key_taken()
                && matches!(
                    &batch[..],
                    [Write {
                        kind: Kind::Create(_),
                        ..
                    }]
                ) =>
        {
            let write = batch.into_iter().next().expect("one write");
            let result = why_refused(&cx.pool, &write).await;
            let _ = write.reply.send(result);
        }
        // The connection failed with the transaction sent: it may have
        // committed (a lost acknowledgement). Each write is read back, never
        // guessed.
        Err(e) if e.unknown() => {
            tracing::warn!(error = %e, writes = batch.len(), "PostgreSQL write batch's outcome unknown; reading it back");
            for write in batch {
                let result = read_back(cx, &write, &e).await;
                let _ = write.reply.send(result);
            }
        }
        Err(e) if batch.len() > 1 && e.refused() => {
            // The database refused something in the batch: find which,
            // one write at a time.
            for write in batch {
                Box::pin(commit(cx, vec![write])).await;
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, writes = batch.len(), "PostgreSQL write batch failed");
            for write in batch {
                let _ = write.reply.send(Err(unavailable(&e)));
            }
        }
    }
}

/// Why a batch's transaction did not commit.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error("no PostgreSQL connection: {0}")]
    NoConnection(String),
    #[error("no answer from PostgreSQL within {TRANSACTION_TIMEOUT:?}")]
    TimedOut,
}

impl Failure {
    /// A deadlock or serialization failure: the same batch may commit if
    /// tried again.
    fn retryable(&self) -> bool {
        use tokio_postgres::error::SqlState;
        let Failure::Database(e) = self else {
            return false;
        };
        e.code().is_some_and(|c| {
            *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        })
    }

    /// A unique index refused a create.
    fn key_taken(&self) -> bool {
        use tokio_postgres::error::SqlState;
        matches!(self, Failure::Database(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION))
    }

    /// The database answered with an error (rather than the connection
    /// failing): one of the writes may be what it refused.
    fn refused(&self) -> bool {
        matches!(self, Failure::Database(e) if e.as_db_error().is_some()) && !self.fenced()
    }

    /// The transaction may or may not have committed: the connection
    /// failed (or went quiet) instead of answering.
    fn unknown(&self) -> bool {
        match self {
            Failure::Database(e) => e.as_db_error().is_none(),
            Failure::TimedOut => true,
            Failure::NoConnection(_) => false,
        }
    }

    /// This replica was declared dead: every write of the batch is
    /// refused alike.
    fn fenced(&self) -> bool {
        matches!(self, Failure::Database(e) if e.code().is_some_and(|c| c.code() == FENCED_SQLSTATE))
    }
}

/// One bytea column of the tasks `writes` create, as an array parameter.
fn column<'a>(
    writes: &[(&'a Write, &'a EncodedTask)],
    field: fn(&'a EncodedTask) -> &'a [u8],
) -> Vec<&'a [u8]> {
    writes.iter().map(|(_, t)| field(t)).collect()
}

/// A task's key as the writes' statements return it.
type Key = (Vec<u8>, Vec<u8>);

/// One transaction for the whole batch, in one round trip: BEGIN, one
/// statement each for the claims, the creates and the updates (over arrays
/// of the rows: a statement per row cost about as much again in the
/// database and in this process), the writes' events and push
/// notifications, the notifications to the other replicas, and COMMIT,
/// all pipelined on one connection (tokio-postgres sends what is polled
/// together without waiting for answers).
///
/// The events and push notifications are inserted only for the task rows
/// this transaction wrote (their `xmin`), so a refused write leaves none.
/// COMMIT is sent before the statements' answers are read: if one failed,
/// PostgreSQL has aborted the transaction and answers the COMMIT with a
/// rollback, and the failure is reported from the statement's own answer,
/// so nothing is acknowledged that did not commit.
async fn transaction(cx: &Context, batch: &[Write]) -> Result<Vec<Done>, Failure> {
    let client = cx
        .pool
        .get()
        .await
        .map_err(|e| Failure::NoConnection(e.to_string()))?;
    let insert = client.prepare_cached(INSERT).await?;
    let update = client.prepare_cached(UPDATE).await?;
    let claim = client.prepare_cached(CLAIM).await?;
    let outbox = client.prepare_cached(OUTBOX).await?;
    let notify = client.prepare_cached(NOTIFY).await?;
    let notify_outbox = client.prepare_cached(NOTIFY_OUTBOX).await?;
    let lock = client
        .prepare_cached("SELECT pg_advisory_xact_lock($1)")
        .await?;
    let fence = client.prepare_cached(FENCE).await?;
    let tx: &tokio_postgres::Client = &client;
    // One id for the whole transaction, checked by its first statement.
    let replica = cx.standing.id();
    let replica: &[u8] = &replica;

    let creates: Vec<(&Write, &EncodedTask)> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            Kind::Create(t) => Some((w, t)),
            _ => None,
        })
        .collect();
    let updates: Vec<(&Write, &EncodedTask, u64)> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            Kind::Update(t, expected) => Some((w, t, *expected)),
            _ => None,
        })
        .collect();
    let claims: Vec<(&Write, &[u8])> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            Kind::Claim(origin) => Some((w, origin.as_slice())),
            _ => None,
        })
        .collect();
    let written: Vec<(&Write, &EncodedTask, i64)> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            Kind::Create(t) => Some((w, t, 1)),
            Kind::Update(t, expected) => Some((w, t, *expected as i64 + 1)),
            Kind::Claim(_) => None,
        })
        .collect();
    // Push notifications, in write order.
    let mut push: [Vec<&[u8]>; 4] = Default::default();
    let mut push_versions: Vec<i64> = Vec::new();
    for (w, t, v) in &written {
        for e in &t.outbox {
            push[0].push(w.tenant.as_bytes());
            push[1].push(t.id.as_bytes());
            push[2].push(e.config_id.as_bytes());
            push[3].push(e.event.as_slice());
            push_versions.push(*v);
        }
    }
    // What the other replicas may need to hear of: a run's create is
    // announced to nobody (no replica can watch a task before it exists),
    // so the send workload's batches (claims and creates) notify nothing
    // and skip the statement.
    let announced: Vec<&(&Write, &EncodedTask, i64)> = written
        .iter()
        .filter(|(w, t, _)| !t.by_run || matches!(w.kind, Kind::Update(..)))
        .collect();
    let payloads: Vec<String> = announced
        .iter()
        .map(|(w, t, v)| notification(&w.tenant, &t.id, *v as u64))
        .collect();
    let tenants: Vec<&[u8]> = announced
        .iter()
        .map(|(w, ..)| w.tenant.as_bytes())
        .collect();
    let ids: Vec<&[u8]> = announced.iter().map(|(_, t, _)| t.id.as_bytes()).collect();
    let always: Vec<bool> = announced.iter().map(|(_, t, _)| !t.by_run).collect();

    let begin = tx.batch_execute("BEGIN");
    let fence_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&replica];
    let fenced = tx.execute(&fence, &fence_params);
    let claimed = async {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        tx.query(
            &claim,
            &[
                &claims
                    .iter()
                    .map(|(w, _)| w.tenant.as_bytes())
                    .collect::<Vec<_>>(),
                &claims.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
                &replica,
            ],
        )
        .await
    };
    let created = async {
        if creates.is_empty() {
            return Ok(Vec::new());
        }
        tx.query(
            &insert,
            &[
                &creates
                    .iter()
                    .map(|(w, _)| w.tenant.as_bytes())
                    .collect::<Vec<_>>(),
                &column(&creates, |t| t.id.as_bytes()),
                &column(&creates, |t| t.context_id.as_bytes()),
                &creates
                    .iter()
                    .map(|(_, t)| t.state as i32)
                    .collect::<Vec<_>>(),
                &creates.iter().map(|(_, t)| t.status.0).collect::<Vec<_>>(),
                &creates.iter().map(|(_, t)| t.status.1).collect::<Vec<_>>(),
                &column(&creates, |t| t.owner.as_bytes()),
                &column(&creates, |t| &t.origin),
                &column(&creates, |t| t.body.bytes()),
                &replica,
            ],
        )
        .await
    };
    // The updates and the push notifications are planned for each batch,
    // with its arrays' sizes and the tables' as they are now: a generic
    // plan cached while the tables were small scans them whole once they
    // are not. The claims and creates before them look nothing up but
    // their keys, and keep their cached plans (planning every statement
    // of every batch was an eighth of the database's CPU in the send
    // workload).
    let planned = async {
        if updates.is_empty() && push_versions.is_empty() {
            return Ok(());
        }
        tx.batch_execute("SET LOCAL plan_cache_mode = force_custom_plan")
            .await
    };
    let updated = async {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        tx.query(
            &update,
            &[
                &updates
                    .iter()
                    .map(|(w, ..)| w.tenant.as_bytes())
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.id.as_bytes())
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.context_id.as_bytes())
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.state as i32)
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.status.0)
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.status.1)
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.body.bytes().as_ref())
                    .collect::<Vec<_>>(),
                &updates.iter().map(|(.., e)| *e as i64).collect::<Vec<_>>(),
                &updates.iter().map(|(_, t, _)| t.by_run).collect::<Vec<_>>(),
                &replica,
                &updates
                    .iter()
                    .map(|(_, t, _)| t.events.as_slice())
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| t.owes_runs as i32)
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| matches!(t.body, crate::store::Body::Whole(_)))
                    .collect::<Vec<_>>(),
                &updates
                    .iter()
                    .map(|(_, t, _)| match &t.body {
                        crate::store::Body::Whole(_) => t.logged.as_deref(),
                        crate::store::Body::Changes(_) => None,
                    })
                    .collect::<Vec<_>>(),
            ],
        )
        .await
    };
    // Outbox rows take their `seq` in commit order (delivery reads the
    // outbox from where its last read ended, and must not pass a row a
    // transaction still to commit holds): writers of push notifications,
    // on every replica, take turns from here to their commit. Every row
    // this transaction locks is locked by then, so the turns cannot
    // deadlock with them.
    let locked = async {
        if push_versions.is_empty() {
            return Ok(0);
        }
        tx.execute(&lock, &[&OUTBOX_LOCK]).await
    };
    let pushed = async {
        if push_versions.is_empty() {
            return Ok(0);
        }
        tx.execute(
            &outbox,
            &[&push[0], &push[1], &push_versions, &push[2], &push[3]],
        )
        .await
    };
    let notified = async {
        if announced.is_empty() {
            return Ok(0);
        }
        tx.execute(&notify, &[&CHANNEL, &payloads, &tenants, &ids, &always])
            .await
    };
    let outbox_notified = async {
        if push_versions.is_empty() {
            return Ok(0);
        }
        tx.execute(&notify_outbox, &[&OUTBOX_CHANNEL]).await
    };
    let commit = tx.batch_execute("COMMIT");
    // Polled in this order, so sent in this order: each future sends its
    // statement at its first poll, before it waits for anything.
    let (
        begun,
        fenced,
        claimed,
        created,
        planned,
        updated,
        locked,
        pushed,
        notified,
        outbox_notified,
        committed,
    ) = tokio::join!(
        begin,
        fenced,
        claimed,
        created,
        planned,
        updated,
        locked,
        pushed,
        notified,
        outbox_notified,
        commit
    );
    // The first failure is the one to report (a later statement of an
    // aborted transaction only says it was aborted).
    begun?;
    fenced?;
    let (claimed, created) = (claimed?, created?);
    planned?;
    let updated = updated?;
    locked?;
    pushed?;
    notified?;
    outbox_notified?;
    committed?;

    let keys = |rows: Vec<tokio_postgres::Row>| -> HashSet<Key> {
        rows.into_iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    let (claimed, created) = (keys(claimed), keys(created));
    let updated: HashMap<Key, i64> = updated
        .into_iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    Ok(batch
        .iter()
        .map(|w| {
            let tenant = w.tenant.as_bytes().to_vec();
            let version = match &w.kind {
                Kind::Claim(origin) => Some(u64::from(claimed.contains(&(tenant, origin.clone())))),
                Kind::Create(t) => created
                    .contains(&(tenant, t.id.as_bytes().to_vec()))
                    .then_some(1),
                Kind::Update(t, _) => updated
                    .get(&(tenant, t.id.as_bytes().to_vec()))
                    .map(|v| *v as u64),
            };
            version.map_or(Done::Refused, Done::Written)
        })
        .collect())
}

/// The payload of the notification announcing a write (tenant, task id,
/// new version): `{len}:{tenant}{len}:{id}{version}` (lengths in bytes of
/// the escaped text, so any text parses back). Ids and tenants are at
/// most `service::validate::MAX_ID_BYTES` (256) bytes, so a payload stays
/// far below PostgreSQL's 8000-byte limit.
pub(super) fn notification(tenant: &str, id: &str, version: u64) -> String {
    format!("{}{version}", notification_prefix(tenant, id))
}

/// A notification's payload up to its version.
pub(super) fn notification_prefix(tenant: &str, id: &str) -> String {
    let (tenant, id) = (escape(tenant), escape(id));
    format!("{}:{tenant}{}:{id}", tenant.len(), id.len())
}

/// A payload is text without NUL: `%` and NUL are written `%25`, `%00`.
fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(['%', '\0']) {
        text.replace('%', "%25").replace('\0', "%00").into()
    } else {
        text.into()
    }
}

fn unescape(text: &str) -> String {
    text.replace("%00", "\0").replace("%25", "%")
}

/// The writes a notification's payload announces ([`notification`], one
/// per line); what does not parse is skipped.
pub(super) fn parse_notification(payload: &str) -> Vec<(String, String, u64)> {
    fn field<'a>(rest: &mut &'a str) -> Option<&'a str> {
        let (len, tail) = rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let value = tail.get(..len)?;
        *rest = &tail[len..];
        Some(value)
    }
    payload
        .lines()
        .filter_map(|mut line| {
            let tenant = field(&mut line)?;
            let id = field(&mut line)?;
            Some((unescape(tenant), unescape(id), line.parse().ok()?))
        })
        .collect()
}

/// How long a batch's transaction may take, answers included, before its
/// outcome is taken as unknown (and read back): past the database's own
/// statement timeout, for a connection that went quiet.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(35);
/// Read-backs of a write whose outcome is unknown, and the wait before the
/// first (doubled each time).
const READ_BACKS: u32 = 4;
const READ_BACK_FIRST_WAIT: Duration = Duration::from_millis(200);

/// Whether `write`, sent in a transaction whose answer was lost (`lost`),
/// committed: read back until the database answers (at most
/// [`READ_BACKS`] times). Committed when the row holds what the write
/// wrote (a task at the version it made with its record, a claim held by
/// this replica); not committed when the row is as it was before. Either
/// way, the answer is what a write answered with that outcome.
async fn read_back(cx: &Context, write: &Write, lost: &Failure) -> Result<u64, StoreError> {
    let mut wait = READ_BACK_FIRST_WAIT;
    let mut last = String::new();
    for _ in 0..READ_BACKS {
        tokio::time::sleep(wait).await;
        wait *= 2;
        match read_back_once(cx, write).await {
            Ok(Some(answer)) => return answer,
            Ok(None) => {
                return Err(StoreError::Unavailable(format!(
                    "the write did not commit: {lost}"
                )));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(StoreError::Unavailable(format!(
        "whether the write committed is unknown: {lost}; reading it back failed: {last}"
    )))
}

/// One read-back: `Some(answer)` when the write committed (or another
/// write's outcome decides the answer), `None` when it did not commit.
async fn read_back_once(
    cx: &Context,
    write: &Write,
) -> Result<Option<Result<u64, StoreError>>, StoreError> {
    let client = tokio::time::timeout(READ_BACK_FIRST_WAIT * 10, cx.pool.get())
        .await
        .map_err(|_| StoreError::Unavailable("no PostgreSQL connection".into()))?
        .map_err(unavailable)?;
    let tenant = write.tenant.as_bytes();
    match &write.kind {
        Kind::Claim(origin) => {
            let row = client
                .query_opt(
                    "SELECT replica FROM origin_claims WHERE tenant = $1 AND origin = $2",
                    &[&tenant, origin],
                )
                .await
                .map_err(unavailable)?;
            let me = cx.standing.id();
            Ok(row.map(|r| Ok(u64::from(r.get::<_, Vec<u8>>(0) == *me))))
        }
        Kind::Create(task) | Kind::Update(task, _) => {
            let expected = match &write.kind {
                Kind::Update(_, expected) => *expected,
                _ => 0,
            };
            // What the write would have left: the record, or its changes at
            // the version it made.
            let row = client
                .query_opt(
                    "SELECT version, CASE WHEN $3 THEN record ELSE \
                     (SELECT changes FROM task_changes c WHERE c.tenant = $1 AND c.task_id = $2 \
                     AND c.version = $4) END FROM tasks WHERE tenant = $1 AND id = $2",
                    &[
                        &tenant,
                        &task.id.as_bytes(),
                        &matches!(task.body, crate::store::Body::Whole(_)),
                        &(expected as i64 + 1),
                    ],
                )
                .await
                .map_err(unavailable)?;
            Ok(match row {
                None if expected == 0 => None,
                None => Some(Err(StoreError::NotFound(task.id.clone()))),
                Some(r) => {
                    let version = r.get::<_, i64>(0) as u64;
                    let stored: Option<&[u8]> = r.get(1);
                    if version == expected + 1 && stored == Some(&**task.body.bytes()) {
                        Some(Ok(version))
                    } else if version == expected {
                        None
                    } else {
                        // Written since by someone: as a refused write.
                        Some(Err(if expected == 0 {
                            StoreError::AlreadyExists(task.id.clone())
                        } else {
                            StoreError::Conflict {
                                id: task.id.clone(),
                                expected,
                                actual: version,
                            }
                        }))
                    }
                }
            })
        }
    }
}

/// Why the database refused a write that changed no row.
async fn why_refused(pool: &Pool, write: &Write) -> Result<u64, StoreError> {
    let (task, expected) = match &write.kind {
        // Taken: the caller looks at who holds it.
        Kind::Claim(_) => return Ok(0),
        Kind::Create(task) => (task, None),
        Kind::Update(task, expected) => (task, Some(*expected)),
    };
    let client = pool.get().await.map_err(unavailable)?;
    let (tenant, id) = (write.tenant.as_bytes(), task.id.as_bytes());
    let Some(expected) = expected else {
        // Which key was taken: the id, or the creating message's.
        let same_id = client
            .query_opt(
                "SELECT 1 FROM tasks WHERE tenant = $1 AND id = $2",
                &[&tenant, &id],
            )
            .await
            .map_err(unavailable)?;
        if same_id.is_some() {
            return Err(StoreError::AlreadyExists(task.id.clone()));
        }
        let by_origin = client
            .query_opt(
                "SELECT id FROM tasks WHERE tenant = $1 AND origin = $2 AND origin <> ''::bytea",
                &[&tenant, &task.origin],
            )
            .await
            .map_err(unavailable)?;
        return match by_origin {
            Some(row) => Err(StoreError::DuplicateMessage {
                task_id: text(row.get(0))?,
            }),
            // Gone again between the insert and the look: a retry settles
            // it.
            None => Err(StoreError::Unavailable(
                "a conflicting task came and went; try again".into(),
            )),
        };
    };
    let actual = client
        .query_opt(
            "SELECT version FROM tasks WHERE tenant = $1 AND id = $2",
            &[&tenant, &id],
        )
        .await
        .map_err(unavailable)?;
    Err(match actual {
        None => StoreError::NotFound(task.id.clone()),
        Some(r) => StoreError::Conflict {
            id: task.id.clone(),
            expected,
            actual: r.get::<_, i64>(0) as u64,
        },
    })
}
