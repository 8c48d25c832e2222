//! The single SQLite writer, with group commit.
//!
//! SQLite allows one writer at a time; several connections competing for
//! the write lock spend their time in the busy handler's sleeps (measured:
//! about 400 task creations/s). Instead every write goes to one task that
//! owns one connection: it takes whatever writes are queued (up to
//! [`MAX_BATCH`]), runs them in one `BEGIN IMMEDIATE ... COMMIT`, and only
//! then answers each caller. One commit then covers many writes, and a
//! caller is never told of a write before it is committed.
//!
//! Each call into sqlx's SQLite connection is a round trip to its worker
//! thread, and under load each hand-off waits for a CPU (measured here:
//! 150 µs to several ms per statement). So a whole batch is one call: one
//! multi-statement query `BEGIN IMMEDIATE; ...; COMMIT`, in which the batch
//! is cut into segments where no task appears twice (order within a segment
//! does not matter; segments run in arrival order), each segment's creates
//! are one multi-row `INSERT ... ON CONFLICT DO NOTHING RETURNING` and its
//! updates one `UPDATE ... FROM (VALUES ...) RETURNING`, guarded by the
//! expected versions. The returned rows say which writes took effect. A
//! write a statement skipped (a unique or version conflict) is then retried
//! alone, which tells why it fails; it fails by itself and the others
//! commit. If the transaction fails, every write of the batch gets the
//! error.

use std::collections::{HashMap, HashSet};

use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Executor, QueryBuilder, Sqlite};
use tokio::sync::{mpsc, oneshot};

use super::{TERMINAL, map_err, state_list};
use crate::store::StoreError;

/// Writes taken into one transaction at most.
pub const MAX_BATCH: usize = 256;
/// Writes that may wait for the writer before callers wait for room.
pub const WRITE_QUEUE: usize = 4096;

/// The columns of one task row, encoded by the caller (off the writer).
pub(super) struct Row {
    pub tenant: Vec<u8>,
    pub id: Vec<u8>,
    pub context_id: Vec<u8>,
    pub state: i32,
    pub status: (i64, i32),
    pub origin_message_id: Vec<u8>,
    pub record: Vec<u8>,
}

pub(super) enum Write {
    Create(Row),
    Update { row: Row, expected_version: i64 },
    Purge { before: (i64, i32) },
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
}

type Reply = oneshot::Sender<Result<Outcome, StoreError>>;

/// A RETURNING row: (tag, segment, tenant, id, version).
type Returned = (String, i64, Vec<u8>, Vec<u8>, i64);

#[derive(Clone)]
pub(super) struct WriterHandle {
    tx: mpsc::Sender<(Write, Reply)>,
}

impl WriterHandle {
    /// Starts the writer on a thread of its own: as a task among the
    /// server's, its batches would wait behind request handling whenever
    /// the runtime is busy, and every write waits on it.
    pub fn spawn(conn: SqliteConnection) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unavailable(format!("sqlite writer runtime: {e}")))?;
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || runtime.block_on(run(conn, rx)))
            .map_err(|e| StoreError::Unavailable(format!("sqlite writer thread: {e}")))?;
        Ok(WriterHandle { tx })
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

async fn run(mut conn: SqliteConnection, mut rx: mpsc::Receiver<(Write, Reply)>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let results = commit_batch(&mut conn, &batch).await;
        for ((_, reply), result) in batch.drain(..).zip(results) {
            let _ = reply.send(result);
        }
    }
    let _ = conn.close().await;
}

async fn commit_batch(
    conn: &mut SqliteConnection,
    batch: &[(Write, Reply)],
) -> Vec<Result<Outcome, StoreError>> {
    let writes: Vec<&Write> = batch.iter().map(|(w, _)| w).collect();
    let segments = segments(&writes);
    let mut qb = QueryBuilder::<Sqlite>::new("BEGIN IMMEDIATE; ");
    for (n, segment) in segments.iter().enumerate() {
        push_segment(&mut qb, n as i64, &writes, segment);
    }
    qb.push("COMMIT;");
    let rows: Result<Vec<Returned>, _> = qb
        .build_query_as()
        .persistent(false)
        .fetch_all(&mut *conn)
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            let e = map_err(e);
            let _ = conn.execute("ROLLBACK").await;
            return batch.iter().map(|_| Err(e.clone())).collect();
        }
    };
    // (tag, segment, tenant, id) -> version, from the RETURNING rows.
    let mut done: HashMap<(String, i64, Vec<u8>, Vec<u8>), i64> = HashMap::new();
    let mut purged: HashMap<i64, u64> = HashMap::new();
    for (tag, seg, tenant, id, version) in rows {
        if tag == "p" {
            *purged.entry(seg).or_default() += 1;
        } else {
            done.insert((tag, seg, tenant, id), version);
        }
    }
    let mut results = Vec::with_capacity(writes.len());
    let mut segment_of = vec![0_i64; writes.len()];
    for (n, segment) in segments.iter().enumerate() {
        for &i in segment {
            segment_of[i] = n as i64;
        }
    }
    for (i, write) in writes.iter().enumerate() {
        let seg = segment_of[i];
        let result = match write {
            Write::Create(row) => {
                match done.get(&("c".to_string(), seg, row.tenant.clone(), row.id.clone())) {
                    Some(_) => Ok(Outcome::Created),
                    None => apply(conn, write).await,
                }
            }
            Write::Update { row, .. } => {
                match done.get(&("u".to_string(), seg, row.tenant.clone(), row.id.clone())) {
                    Some(version) => Ok(Outcome::Updated(*version as u64)),
                    None => apply(conn, write).await,
                }
            }
            Write::Purge { .. } => Ok(Outcome::Purged(purged.get(&seg).copied().unwrap_or(0))),
        };
        results.push(result);
    }
    results
}

/// Cuts the batch (indices, in order) into segments in which no task
/// appears twice; a purge is a segment of its own.
fn segments(writes: &[&Write]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut keys: HashSet<(&[u8], &[u8])> = HashSet::new();
    for (i, w) in writes.iter().enumerate() {
        let key = match w {
            Write::Create(row) | Write::Update { row, .. } => Some((&row.tenant[..], &row.id[..])),
            Write::Purge { .. } => None,
        };
        if (key.is_none() || key.is_some_and(|k| keys.contains(&k))) && !current.is_empty() {
            out.push(std::mem::take(&mut current));
            keys.clear();
        }
        match key {
            None => out.push(vec![i]),
            Some(k) => {
                keys.insert(k);
                current.push(i);
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Appends one segment's statements; every RETURNING row is
/// (tag, segment, tenant, id, version).
fn push_segment(qb: &mut QueryBuilder<Sqlite>, seg: i64, writes: &[&Write], segment: &[usize]) {
    if let [i] = segment
        && let Write::Purge { before } = writes[*i]
    {
        // The state list is made of the enum's own numbers, not input.
        qb.push(format!(
            "DELETE FROM tasks WHERE state IN ({}) AND (status_seconds < ",
            state_list(&TERMINAL)
        ))
        .push_bind(before.0)
        .push(" OR (status_seconds = ")
        .push_bind(before.0)
        .push(" AND status_nanos < ")
        .push_bind(before.1)
        .push(")) RETURNING 'p', ")
        .push_bind(seg)
        .push(", tenant, id, 0; ");
        return;
    }
    let creates: Vec<&Row> = segment
        .iter()
        .filter_map(|&i| match writes[i] {
            Write::Create(row) => Some(row),
            _ => None,
        })
        .collect();
    let updates: Vec<(&Row, i64)> = segment
        .iter()
        .filter_map(|&i| match writes[i] {
            Write::Update {
                row,
                expected_version,
            } => Some((row, *expected_version)),
            _ => None,
        })
        .collect();
    if !creates.is_empty() {
        qb.push(
            "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, status_nanos, \
             origin_message_id, version, record) ",
        );
        qb.push_values(creates, |mut b, row| {
            b.push_bind(row.tenant.clone())
                .push_bind(row.id.clone())
                .push_bind(row.context_id.clone())
                .push_bind(row.state)
                .push_bind(row.status.0)
                .push_bind(row.status.1)
                .push_bind(row.origin_message_id.clone())
                .push_bind(1_i64)
                .push_bind(row.record.clone());
        });
        qb.push(" ON CONFLICT DO NOTHING RETURNING 'c', ")
            .push_bind(seg)
            .push(", tenant, id, version; ");
    }
    if !updates.is_empty() {
        qb.push(
            "UPDATE tasks SET context_id = v.column3, state = v.column4, \
             status_seconds = v.column5, status_nanos = v.column6, record = v.column7, \
             version = tasks.version + 1 FROM (",
        );
        qb.push_values(updates, |mut b, (row, expected)| {
            b.push_bind(row.tenant.clone())
                .push_bind(row.id.clone())
                .push_bind(row.context_id.clone())
                .push_bind(row.state)
                .push_bind(row.status.0)
                .push_bind(row.status.1)
                .push_bind(row.record.clone())
                .push_bind(expected);
        });
        qb.push(
            ") AS v WHERE tasks.tenant = v.column1 AND tasks.id = v.column2 \
             AND tasks.version = v.column8 RETURNING 'u', ",
        )
        .push_bind(seg)
        .push(", tasks.tenant, tasks.id, tasks.version; ");
    }
}

/// One write on its own, in its own transaction: how a write the batch
/// skipped learns why (or, if things changed meanwhile, succeeds).
async fn apply(conn: &mut SqliteConnection, write: &Write) -> Result<Outcome, StoreError> {
    match write {
        Write::Create(row) => {
            let done = sqlx::query(
                "INSERT INTO tasks (tenant, id, context_id, state, status_seconds, status_nanos, \
                 origin_message_id, version, record) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
            )
            .bind(&row.tenant)
            .bind(&row.id)
            .bind(&row.context_id)
            .bind(row.state)
            .bind(row.status.0)
            .bind(row.status.1)
            .bind(&row.origin_message_id)
            .bind(&row.record)
            .execute(&mut *conn)
            .await;
            match done {
                Ok(_) => Ok(Outcome::Created),
                Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                    let taken: Option<(i64,)> =
                        sqlx::query_as("SELECT 1 FROM tasks WHERE tenant = ? AND id = ?")
                            .bind(&row.tenant)
                            .bind(&row.id)
                            .fetch_optional(&mut *conn)
                            .await
                            .map_err(map_err)?;
                    if taken.is_some() {
                        return Ok(Outcome::IdTaken);
                    }
                    let origin: Option<(Vec<u8>,)> = sqlx::query_as(
                        "SELECT id FROM tasks WHERE tenant = ? AND origin_message_id = ? AND origin_message_id <> x''",
                    )
                    .bind(&row.tenant)
                    .bind(&row.origin_message_id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(map_err)?;
                    match origin {
                        Some((id,)) => Ok(Outcome::OriginTaken(id)),
                        None => Err(StoreError::Internal(format!("sqlite: {db}"))),
                    }
                }
                Err(e) => Err(map_err(e)),
            }
        }
        Write::Update {
            row,
            expected_version,
        } => {
            let done = sqlx::query(
                "UPDATE tasks SET context_id = ?, state = ?, status_seconds = ?, status_nanos = ?, \
                 version = version + 1, record = ? WHERE tenant = ? AND id = ? AND version = ?",
            )
            .bind(&row.context_id)
            .bind(row.state)
            .bind(row.status.0)
            .bind(row.status.1)
            .bind(&row.record)
            .bind(&row.tenant)
            .bind(&row.id)
            .bind(expected_version)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
            if done.rows_affected() == 1 {
                return Ok(Outcome::Updated(*expected_version as u64 + 1));
            }
            let current: Option<(i64,)> =
                sqlx::query_as("SELECT version FROM tasks WHERE tenant = ? AND id = ?")
                    .bind(&row.tenant)
                    .bind(&row.id)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(map_err)?;
            Ok(Outcome::Stale(current.map(|(v,)| v)))
        }
        // A purge always completes in its batch statement; nothing to retry.
        Write::Purge { .. } => Err(StoreError::Internal(
            "a purge is never retried alone".into(),
        )),
    }
}
