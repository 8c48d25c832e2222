//! Reads of tasks: by key, by owner, by creating message, ListTasks
//! pages and the counts the metrics and quotas ask for; each a statement
//! (or a read-only snapshot) on a pooled connection.

use tokio_postgres::types::ToSql;

use super::{PostgresStore, text, unavailable};
use crate::store::sql::{self, Postgres, counted, unfinished_counts};
use crate::store::{
    ListQuery, Owner, StoreError, StoredTask, TaskPage, codec, origin_key, time_key,
};
use crate::wkt::Timestamp;

/// A read of a task's changes after its record (migrations 0011, 0012),
/// in order, as one more column of a statement reading `tasks`: NULL (no
/// lookup) when it has none, so that the record and its changes are of one
/// snapshot. The changes kept at or before the record's version
/// (`whole_version`) are for followers (`feed::CATCH_UP`), not read here.
pub(super) const CHANGES: &str = "CASE WHEN tasks.changes_bytes > 0 THEN \
     (SELECT array_agg(c.changes ORDER BY c.version) FROM task_changes c \
     WHERE c.tenant = tasks.tenant AND c.task_id = tasks.id \
     AND c.version > tasks.whole_version) END";

pub(super) fn stored(
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

/// A read-only transaction whose reads all see one snapshot.
pub(super) async fn snapshot(
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

/// The task `sql` selects (its record, version and changes, in that
/// order), or `None`.
async fn one(
    store: &PostgresStore,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<StoredTask>, StoreError> {
    let client = store.client().await?;
    let row = client.query_opt(sql, params).await.map_err(unavailable)?;
    row.map(|r| stored(r.get(0), r.get(1), r.get(2)))
        .transpose()
}

/// [`TaskStore::get`](crate::store::TaskStore::get).
pub(super) async fn get(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
) -> Result<Option<StoredTask>, StoreError> {
    let key: [&(dyn ToSql + Sync); 2] = [&tenant.as_bytes(), &task_id.as_bytes()];
    if let Some(task) = one(
        store,
        &format!("SELECT record, version, {CHANGES} FROM tasks WHERE tenant = $1 AND id = $2"),
        &key,
    )
    .await?
    {
        return Ok(Some(task));
    }
    // Rare: a miss also looks among the records set aside.
    let client = store.client().await?;
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

/// [`TaskStore::get_owned_by`](crate::store::TaskStore::get_owned_by).
pub(super) async fn get_owned_by(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
    owner: &Owner,
) -> Result<Option<StoredTask>, StoreError> {
    one(
        store,
        &format!(
            "SELECT record, version, {CHANGES} FROM tasks WHERE tenant = $1 AND id = $2 \
             AND owner = $3"
        ),
        &[&tenant.as_bytes(), &task_id.as_bytes(), &owner.as_bytes()],
    )
    .await
}

/// [`TaskStore::is_owned_by`](crate::store::TaskStore::is_owned_by).
pub(super) async fn is_owned_by(
    store: &PostgresStore,
    tenant: &str,
    task_id: &str,
    owner: &Owner,
) -> Result<bool, StoreError> {
    let client = store.client().await?;
    let row = client
        .query_opt(
            "SELECT 1 FROM tasks WHERE tenant = $1 AND id = $2 AND owner = $3",
            &[&tenant.as_bytes(), &task_id.as_bytes(), &owner.as_bytes()],
        )
        .await
        .map_err(unavailable)?;
    Ok(row.is_some())
}

/// [`TaskStore::find_by_origin`](crate::store::TaskStore::find_by_origin).
pub(super) async fn find_by_origin(
    store: &PostgresStore,
    tenant: &str,
    owner: &str,
    message_id: &str,
) -> Result<Option<StoredTask>, StoreError> {
    let key = origin_key(owner, message_id);
    one(
        store,
        &format!(
            "SELECT record, version, {CHANGES} FROM tasks WHERE tenant = $1 AND origin = $2 \
             AND origin <> ''::bytea"
        ),
        &[&tenant.as_bytes(), &key],
    )
    .await
}

/// [`TaskStore::list`](crate::store::TaskStore::list).
pub(super) async fn list(
    store: &PostgresStore,
    tenant: &str,
    query: &ListQuery,
) -> Result<TaskPage, StoreError> {
    let page_size = query.effective_page_size();
    let count = sql::count_query::<Postgres>(tenant, query);
    let mut client = store.client().await?;
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

/// [`TaskStore::count_unfinished`](crate::store::TaskStore::count_unfinished).
pub(super) async fn count_unfinished(
    store: &PostgresStore,
) -> Result<Vec<(crate::proto::TaskState, u64)>, StoreError> {
    let client = store.client().await?;
    let rows = client
        .query(&unfinished_counts(), &[])
        .await
        .map_err(unavailable)?;
    Ok(counted(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
}

/// [`TaskStore::count_open_owned_by`](crate::store::TaskStore::count_open_owned_by).
pub(super) async fn count_open_owned_by(
    store: &PostgresStore,
    owner: &Owner,
    at_most: usize,
) -> Result<usize, StoreError> {
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE owner = $1 AND {} LIMIT $2) open",
        sql::OPEN_STATES_SQL
    );
    let client = store.client().await?;
    let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
    let row = client
        .query_one(&sql, &[&owner.as_bytes(), &at_most])
        .await
        .map_err(unavailable)?;
    Ok(row.get::<_, i64>(0) as usize)
}

/// [`TaskStore::waiting_before`](crate::store::TaskStore::waiting_before).
pub(super) async fn waiting_before(
    store: &PostgresStore,
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
    let client = store.client().await?;
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
