//! Claims between replicas (spec §3.3.1 for messages): a new message's
//! idempotency key, so that one replica runs it, and a task's runs, so
//! that one replica at a time runs the task.

use super::writer::WriteKind;
use super::{PostgresStore, feed, lease, unavailable};
use crate::store::{OriginState, StoreError, TaskStore, origin_key};

/// [`Coordination::claim_origin`].
pub(super) async fn claim_origin(
    store: &PostgresStore,
    tenant: &str,
    owner: &str,
    message_id: &str,
) -> Result<OriginState, StoreError> {
    let key = origin_key(owner, message_id);
    if store
        .writers
        .write(tenant, WriteKind::Claim(key.clone()))
        .await?
        == 1
    {
        return Ok(OriginState::First);
    }
    // Taken: by the task the message created, by a replica answering
    // it now, or by a run that ended without its task stored: a dead
    // replica's, or this replica's own (the runtime claims in memory
    // first, so an own claim found here is a run that is over). That
    // run's agent may have acted on the message: the claim is taken
    // over as lost.
    if let Some(task) = store.find_by_origin(tenant, owner, message_id).await? {
        return Ok(OriginState::Task(Box::new(task)));
    }
    store.standing.check()?;
    let client = store.client().await?;
    // A holder whose lease ran out is declared dead first: only then
    // can its claim be taken over (and it can never write under it).
    lease::reap(&client).await?;
    let me = store.standing.id();
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
        1 => OriginState::Lost,
        // Still answered elsewhere, or its task was just created, or
        // the claim just released: asked again, each settles.
        _ => OriginState::Elsewhere,
    })
}

/// [`Coordination::release_origin`].
pub(super) async fn release_origin(
    store: &PostgresStore,
    tenant: &str,
    owner: &str,
    message_id: &str,
) -> Result<(), StoreError> {
    let key = origin_key(owner, message_id);
    let client = store.client().await?;
    let me = store.standing.id();
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

/// [`Coordination::claim_run`].
pub(super) async fn claim_run(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
) -> Result<Option<u64>, StoreError> {
    store.standing.check()?;
    let client = store.client().await?;
    lease::reap(&client).await?;
    let me = store.standing.id();
    let mine = store.standing.ids();
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

/// [`Coordination::take_runs`].
pub(super) async fn take_runs(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
) -> Result<bool, StoreError> {
    store.standing.check()?;
    let client = store.client().await?;
    lease::reap(&client).await?;
    let me = store.standing.id();
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

/// [`Coordination::release_run`].
pub(super) async fn release_run(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
) -> Result<(), StoreError> {
    let client = store.client().await?;
    let me = store.standing.id();
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
                &feed::CHANNEL,
                &feed::notification_prefix(tenant, task_id),
            ],
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}
