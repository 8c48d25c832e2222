//! Task writes: each handed to the writer as a row, and its outcome told
//! as the store's answer.

use super::{SqliteStore, writer};
use crate::store::{EncodedTask, StoreError, time_key};
use crate::wkt::Timestamp;

fn row(tenant: &str, task: &EncodedTask) -> writer::Row {
    writer::Row {
        tenant: tenant.as_bytes().to_vec(),
        id: task.id.as_bytes().to_vec(),
        context_id: task.context_id.as_bytes().to_vec(),
        state: task.state as i32,
        status: task.status,
        owner: task.owner.as_bytes().to_vec(),
        origin: task.origin.clone(),
        outbox: task.outbox.clone(),
        body: task.body.clone(),
    }
}

/// [`TaskStore::create_encoded`](crate::store::TaskStore::create_encoded).
pub(super) async fn create_encoded(
    store: &SqliteStore,
    tenant: &str,
    task: &EncodedTask,
) -> Result<u64, StoreError> {
    task.body.whole()?;
    match store
        .writer
        .write(writer::WriteRequest::Create(row(tenant, task)))
        .await?
    {
        writer::WriteOutcome::Created => Ok(1),
        writer::WriteOutcome::IdTaken => Err(StoreError::AlreadyExists(task.id.clone())),
        writer::WriteOutcome::OriginTaken(id) => Err(StoreError::DuplicateMessage {
            task_id: String::from_utf8_lossy(&id).into_owned(),
        }),
        _ => Err(StoreError::Internal(
            "sqlite writer answered out of turn".into(),
        )),
    }
}

/// [`TaskStore::update_encoded`](crate::store::TaskStore::update_encoded).
pub(super) async fn update_encoded(
    store: &SqliteStore,
    tenant: &str,
    task: &EncodedTask,
    expected_version: u64,
) -> Result<u64, StoreError> {
    let write = writer::WriteRequest::Update {
        row: row(tenant, task),
        expected_version: expected_version as i64,
    };
    match store.writer.write(write).await? {
        writer::WriteOutcome::Updated(version) => Ok(version),
        writer::WriteOutcome::Stale(None) => Err(StoreError::NotFound(task.id.clone())),
        writer::WriteOutcome::Stale(Some(actual)) => Err(StoreError::Conflict {
            id: task.id.clone(),
            expected: expected_version,
            actual: actual as u64,
        }),
        _ => Err(StoreError::Internal(
            "sqlite writer answered out of turn".into(),
        )),
    }
}

/// [`TaskStore::purge_terminal_before`](crate::store::TaskStore::purge_terminal_before).
pub(super) async fn purge_terminal_before(
    store: &SqliteStore,
    before: &Timestamp,
) -> Result<u64, StoreError> {
    let write = writer::WriteRequest::Purge {
        before: time_key(before),
    };
    match store.writer.write(write).await? {
        writer::WriteOutcome::Purged(n) => Ok(n),
        _ => Err(StoreError::Internal(
            "sqlite writer answered out of turn".into(),
        )),
    }
}
