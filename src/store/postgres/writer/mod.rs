//! PostgreSQL's writers, with group commit.
//!
//! A transaction per task write cost a round trip for each of BEGIN, the
//! statement and COMMIT, and a WAL flush per write (measured: about 2,800
//! non-blocking sends/s against 38,000 on the memory store). Instead every
//! task write is queued for [`WRITERS`] writer tasks; each takes whatever
//! is queued (up to [`MAX_BATCH`]) and runs it as one transaction, its
//! statements pipelined on one connection, and answers each caller only
//! once the transaction is committed. Whatever its size, a batch is one
//! round trip and a handful of statements (see [`transaction`](fn@transaction)): its
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

mod outcome;
mod transaction;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::lease::{FENCED_SQLSTATE, Standing};
use super::unavailable;
use crate::store::{EncodedTask, StoreError};
use outcome::{read_back, why_refused};
use transaction::transaction;

/// Writer tasks: while one waits for its commit, others fill the next
/// batches. With two, a loaded send left a fifth of two cores idle (the
/// batches waiting on each other's round trips); four sent about a tenth
/// more (2026-12-04: 9,613 against 10,559 sends/s, means of six
/// alternating runs, 7 of 9 pairs in four's favour).
pub const WRITERS: usize = 4;
/// Task writes taken into one transaction at most.
pub const MAX_BATCH: usize = 256;
/// Writes that may wait for a writer before callers wait for room.
pub const WRITE_QUEUE: usize = 4096;
/// Times a batch is tried again after a deadlock or a serialization
/// failure.
const RETRIES: usize = 3;

/// One write: a task's create or update, or a new message's claim.
pub(super) struct QueuedWrite {
    pub tenant: String,
    pub kind: WriteKind,
    /// The new version of a task written; for a claim, 1 when claimed.
    pub reply: oneshot::Sender<Result<u64, StoreError>>,
}

pub(super) enum WriteKind {
    Create(EncodedTask),
    /// An update from the version it names.
    Update(EncodedTask, u64),
    /// Claims a new message's idempotency key (`origin_claims`).
    Claim(Vec<u8>),
}

impl QueuedWrite {
    /// The row the write locks: writes are sorted by it.
    fn key(&self) -> (u8, &str, &[u8]) {
        match &self.kind {
            WriteKind::Claim(origin) => (0, &self.tenant, origin),
            WriteKind::Create(t) | WriteKind::Update(t, _) => (1, &self.tenant, t.id.as_bytes()),
        }
    }
}

/// What a write did inside its transaction.
enum RowOutcome {
    /// Written: the new version.
    Written(u64),
    /// Refused by its key or version; why is asked after the commit.
    Refused,
}

/// The queue in front of the writers.
#[derive(Clone)]
pub(super) struct Writers {
    queue: mpsc::Sender<QueuedWrite>,
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
    pub(super) async fn write(&self, tenant: &str, kind: WriteKind) -> Result<u64, StoreError> {
        self.cx.standing.check()?;
        let (reply, answer) = oneshot::channel();
        let write = QueuedWrite {
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
async fn writer(cx: Arc<Context>, queue: Arc<Mutex<mpsc::Receiver<QueuedWrite>>>) {
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
fn rounds(batch: Vec<QueuedWrite>) -> Vec<Vec<QueuedWrite>> {
    // How many writes to the same row come before each one.
    let mut repeats = Vec::with_capacity(batch.len());
    for (i, write) in batch.iter().enumerate() {
        let repeat = match i.checked_sub(1) {
            Some(before) if batch[before].key() == write.key() => repeats[before] + 1,
            _ => 0,
        };
        repeats.push(repeat);
    }
    let mut rounds: Vec<Vec<QueuedWrite>> = vec![Vec::with_capacity(batch.len())];
    for (write, repeat) in batch.into_iter().zip(repeats) {
        if rounds.len() <= repeat {
            rounds.push(Vec::new());
        }
        rounds[repeat].push(write);
    }
    rounds
}

/// Commits `batch` and answers every write of it.
async fn commit(cx: &Context, batch: Vec<QueuedWrite>) {
    let mut attempt = 0;
    let outcome = loop {
        let tried = tokio::time::timeout(TRANSACTION_TIMEOUT, transaction(cx, &batch))
            .await
            .unwrap_or(Err(BatchFailure::TimedOut));
        match tried {
            Err(e) if e.retryable() && attempt < RETRIES => attempt += 1,
            outcome => break outcome,
        }
    };
    match outcome {
        Ok(done) => {
            for (write, done) in batch.into_iter().zip(done) {
                let result = match done {
                    RowOutcome::Written(version) => Ok(version),
                    RowOutcome::Refused => why_refused(&cx.pool, &write).await,
                };
                let _ = write.reply.send(result);
            }
        }
        // A create alone whose key is taken: why, as for a refused write.
        Err(e)
            if e.key_taken()
                && matches!(
                    &batch[..],
                    [QueuedWrite {
                        kind: WriteKind::Create(_),
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
enum BatchFailure {
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error("no PostgreSQL connection: {0}")]
    NoConnection(String),
    #[error("no answer from PostgreSQL within {TRANSACTION_TIMEOUT:?}")]
    TimedOut,
}

impl BatchFailure {
    /// A deadlock or serialization failure: the same batch may commit if
    /// tried again.
    fn retryable(&self) -> bool {
        use tokio_postgres::error::SqlState;
        let BatchFailure::Database(e) = self else {
            return false;
        };
        e.code().is_some_and(|c| {
            *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        })
    }

    /// A unique index refused a create.
    fn key_taken(&self) -> bool {
        use tokio_postgres::error::SqlState;
        matches!(self, BatchFailure::Database(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION))
    }

    /// The database answered with an error (rather than the connection
    /// failing): one of the writes may be what it refused.
    fn refused(&self) -> bool {
        matches!(self, BatchFailure::Database(e) if e.as_db_error().is_some()) && !self.fenced()
    }

    /// The transaction may or may not have committed: the connection
    /// failed (or went quiet) instead of answering.
    fn unknown(&self) -> bool {
        match self {
            BatchFailure::Database(e) => e.as_db_error().is_none(),
            BatchFailure::TimedOut => true,
            BatchFailure::NoConnection(_) => false,
        }
    }

    /// This replica was declared dead: every write of the batch is
    /// refused alike.
    fn fenced(&self) -> bool {
        matches!(self, BatchFailure::Database(e) if e.code().is_some_and(|c| c.code() == FENCED_SQLSTATE))
    }
}

/// How long a batch's transaction may take, answers included, before its
/// outcome is taken as unknown (and read back): past the database's own
/// statement timeout, for a connection that went quiet.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(35);
