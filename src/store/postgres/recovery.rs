//! What recovery reads: the active tasks after a restart, the tasks of
//! replicas declared dead, and the records that no longer decode, set
//! aside in `quarantine`.

use super::reads::{CHANGES, stored};
use super::{PostgresStore, lease, text, unavailable};
use crate::lifecycle::StateClass;
use crate::store::sql::state_list;
use crate::store::{StoreError, StoredTask};

/// [`TaskStore::active_tasks`](crate::store::TaskStore::active_tasks).
pub(super) async fn active_tasks(
    store: &PostgresStore,
) -> Result<Vec<(String, StoredTask)>, StoreError> {
    let sql = format!(
        "SELECT tenant, record, version, id, {CHANGES} FROM tasks WHERE state IN ({})",
        state_list(StateClass::Active)
    );
    let client = store.client().await?;
    let rows = client.query(&sql, &[]).await.map_err(unavailable)?;
    recoverable(store, rows).await
}

/// [`Coordination::orphaned_tasks`](crate::store::Coordination::orphaned_tasks).
pub(super) async fn orphaned_tasks(
    store: &PostgresStore,
) -> Result<Vec<(String, StoredTask)>, StoreError> {
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
    let client = store.client().await?;
    lease::reap(&client).await?;
    let me = store.standing.id();
    let mine = store.standing.ids();
    let rows = client
        .query(&sql, &[&&*me, &mine])
        .await
        .map_err(unavailable)?;
    recoverable(store, rows).await
}

/// Recovery's rows (tenant, record, version, id) decoded; a record that
/// no longer decodes must not keep the server from starting or
/// recovering: it is moved to `quarantine` (logged with its key) and
/// the rest goes on.
async fn recoverable(
    store: &PostgresStore,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Vec<(String, StoredTask)>, StoreError> {
    let mut tasks = Vec::with_capacity(rows.len());
    for r in rows {
        let (tenant, id): (Vec<u8>, Vec<u8>) = (r.get(0), r.get(3));
        let decoded =
            text(tenant.clone()).and_then(|t| Ok((t, stored(r.get(1), r.get(2), r.get(4))?)));
        match decoded {
            Ok(task) => tasks.push(task),
            Err(e) => quarantine(store, &tenant, &id, &e.to_string()).await?,
        }
    }
    Ok(tasks)
}

/// Moves an undecodable record out of `tasks` into `quarantine`.
async fn quarantine(
    store: &PostgresStore,
    tenant: &[u8],
    id: &[u8],
    reason: &str,
) -> Result<(), StoreError> {
    tracing::error!(
        tenant = %String::from_utf8_lossy(tenant),
        task_id = %String::from_utf8_lossy(id),
        %reason,
        "stored task does not decode: moved to the quarantine table"
    );
    let client = store.client().await?;
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
