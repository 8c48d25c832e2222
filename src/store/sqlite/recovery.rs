//! What recovery reads after a restart: the active tasks, and the records
//! that no longer decode, which are set aside in `quarantine`.

use super::reads::{Kept, read_changes, stored};
use super::{SqliteStore, map_err, writer};
use crate::lifecycle::StateClass;
use crate::store::sql::state_list;
use crate::store::{StoreError, StoredTask};

/// An active task's row: tenant, id, record, version, and the size of the
/// changes kept after the record.
type ActiveRow = (Vec<u8>, Vec<u8>, Vec<u8>, i64, i64);
/// ... and with those changes read.
type ActiveTask = (Vec<u8>, Vec<u8>, Vec<u8>, i64, Kept);

/// [`TaskStore::active_tasks`](crate::store::TaskStore::active_tasks).
pub(super) async fn active_tasks(
    store: &SqliteStore,
) -> Result<Vec<(String, StoredTask)>, StoreError> {
    let sql = format!(
        "SELECT tenant, id, record, version, changes_bytes FROM tasks WHERE state IN ({})",
        state_list(StateClass::Active)
    );
    let rows: Vec<ActiveTask> = store
        .read(move |conn| {
            // One snapshot: each record with its changes.
            let tx = conn.transaction().map_err(map_err)?;
            let rows: Vec<ActiveRow> = tx
                .prepare(&sql)
                .and_then(|mut s| {
                    s.query_map([], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(map_err)?;
            let rows = rows
                .into_iter()
                .map(|(tenant, id, record, version, changes_bytes)| {
                    let changes = if changes_bytes > 0 {
                        read_changes(&tx, &tenant, &id)?
                    } else {
                        Vec::new()
                    };
                    Ok((tenant, id, record, version, changes))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            tx.commit().map_err(map_err)?;
            Ok(rows)
        })
        .await?;
    // A record that no longer decodes must not keep the server from
    // starting: it is moved aside (logged with its key) and the rest
    // recovers.
    let mut active = Vec::with_capacity(rows.len());
    for (tenant, id, record, version, changes) in rows {
        let decoded = String::from_utf8(tenant.clone())
            .map_err(|_| StoreError::Internal("stored tenant is not UTF-8".into()))
            .and_then(|t| Ok((t, stored(record, version, changes)?)));
        match decoded {
            Ok(task) => active.push(task),
            Err(e) => quarantine(store, tenant, id, e.to_string()).await?,
        }
    }
    Ok(active)
}

/// Moves an undecodable record out of `tasks` into `quarantine`.
async fn quarantine(
    store: &SqliteStore,
    tenant: Vec<u8>,
    id: Vec<u8>,
    reason: String,
) -> Result<(), StoreError> {
    tracing::error!(
        tenant = %String::from_utf8_lossy(&tenant),
        task_id = %String::from_utf8_lossy(&id),
        %reason,
        "stored task does not decode: moved to the quarantine table"
    );
    match store
        .writer
        .write(writer::WriteRequest::Quarantine { tenant, id, reason })
        .await?
    {
        writer::WriteOutcome::Quarantined => Ok(()),
        _ => Err(StoreError::Internal(
            "sqlite writer answered out of turn".into(),
        )),
    }
}
