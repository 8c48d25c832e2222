//! One batch as one transaction in one round trip: the statements, each
//! over arrays of the batch's rows, pipelined on one connection.

use std::collections::{HashMap, HashSet};

use super::super::feed::{CHANNEL, OUTBOX_CHANNEL, notification};
use super::{BatchFailure, Context, QueuedWrite, RowOutcome, WriteKind};
use crate::store::EncodedTask;

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

/// One bytea column of the tasks `writes` create, as an array parameter.
fn column<'a>(
    writes: &[(&'a QueuedWrite, &'a EncodedTask)],
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
pub(super) async fn transaction(
    cx: &Context,
    batch: &[QueuedWrite],
) -> Result<Vec<RowOutcome>, BatchFailure> {
    let client = cx
        .pool
        .get()
        .await
        .map_err(|e| BatchFailure::NoConnection(e.to_string()))?;
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

    let creates: Vec<(&QueuedWrite, &EncodedTask)> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            WriteKind::Create(t) => Some((w, t)),
            _ => None,
        })
        .collect();
    let updates: Vec<(&QueuedWrite, &EncodedTask, u64)> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            WriteKind::Update(t, expected) => Some((w, t, *expected)),
            _ => None,
        })
        .collect();
    let claims: Vec<(&QueuedWrite, &[u8])> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            WriteKind::Claim(origin) => Some((w, origin.as_slice())),
            _ => None,
        })
        .collect();
    let written: Vec<(&QueuedWrite, &EncodedTask, i64)> = batch
        .iter()
        .filter_map(|w| match &w.kind {
            WriteKind::Create(t) => Some((w, t, 1)),
            WriteKind::Update(t, expected) => Some((w, t, *expected as i64 + 1)),
            WriteKind::Claim(_) => None,
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
    let announced: Vec<&(&QueuedWrite, &EncodedTask, i64)> = written
        .iter()
        .filter(|(w, t, _)| !t.by_run || matches!(w.kind, WriteKind::Update(..)))
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
                WriteKind::Claim(origin) => {
                    Some(u64::from(claimed.contains(&(tenant, origin.clone()))))
                }
                WriteKind::Create(t) => created
                    .contains(&(tenant, t.id.as_bytes().to_vec()))
                    .then_some(1),
                WriteKind::Update(t, _) => updated
                    .get(&(tenant, t.id.as_bytes().to_vec()))
                    .map(|v| *v as u64),
            };
            version.map_or(RowOutcome::Refused, RowOutcome::Written)
        })
        .collect())
}
