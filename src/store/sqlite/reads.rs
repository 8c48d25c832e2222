//! Reads of tasks on the reader connections: by key, by owner, by
//! creating message, ListTasks pages and the counts the metrics and quotas
//! ask for. A task's record and the changes kept after it are read in one
//! snapshot.

use rusqlite::{Connection, OptionalExtension};

use super::{SqliteStore, map_err, writer};
use crate::proto::TaskState;
use crate::store::sql::{self, Sql, Sqlite, counted, unfinished_counts};
use crate::store::{
    ListQuery, Owner, StoreError, StoredTask, TaskPage, codec, origin_key, time_key,
};
use crate::wkt::Timestamp;

pub(super) const GET: &str =
    "SELECT record, version, changes_bytes, id FROM tasks WHERE tenant = ?1 AND id = ?2";

/// A user's lookup, by the owned tasks' index (migration 0005): the owner
/// is part of the key, so another principal's task is a miss in the index
/// and its row is never read. The last term is the index's condition,
/// repeated so that SQLite may use it.
pub(super) const GET_OWNED: &str = "SELECT record, version, changes_bytes, id FROM tasks \
     INDEXED BY tasks_by_owner_id WHERE tenant = ?1 AND id = ?2 AND owner = ?3 AND owner <> x''";

/// [`GET_OWNED`] without the record: answered from the index alone.
pub(super) const OWNS: &str = "SELECT 1 FROM tasks INDEXED BY tasks_by_owner_id \
     WHERE tenant = ?1 AND id = ?2 AND owner = ?3 AND owner <> x''";

/// The task created by a message among the merged origins, by key; read
/// only when the merged origins' hashes in memory hold the pair. Recent
/// ones are in the origin log, which the writer keeps in memory and shares
/// ([`writer::WriterHandle::origin`]): the log table has no index (which is
/// what makes appending to it cheap) and is never read here. A test checks
/// that it reads by key.
pub(super) const FIND_BY_ORIGIN: &str = "SELECT record, version, changes_bytes, id FROM tasks \
     WHERE tenant = ?1 AND id = (SELECT task_id FROM origins WHERE tenant = ?1 AND message_id = ?2)";

/// What a task keeps in `task_changes` (migration 0009), in order.
const CHANGES: &str = "SELECT whole, body FROM task_changes WHERE tenant = ?1 AND task_id = ?2 \
     ORDER BY version";

/// The ListTasks page query ([`sql::page_query`]) in SQLite's dialect.
pub(super) fn page_query(
    select: &str,
    tenant: &str,
    query: &ListQuery,
    limit: usize,
) -> Sql<Sqlite> {
    sql::page_query(select, tenant, query, limit)
}

/// A task by key (`sql` selects its record, version, changes' size and
/// id), or `None`. A task with changes after its whole record is read
/// again with them in one read transaction, so the two are of one commit;
/// one without costs the one statement.
fn read_task(
    conn: &mut Connection,
    sql: &str,
    key: &[&[u8]],
) -> Result<Option<StoredTask>, StoreError> {
    // Its record, version, changes' size and id.
    type TaskRow = (Vec<u8>, i64, i64, Vec<u8>);
    let read =
        |conn: &Connection, sql: &str, key: &[&[u8]]| -> Result<Option<TaskRow>, StoreError> {
            conn.prepare_cached(sql)
                .and_then(|mut statement| {
                    statement
                        .query_row(rusqlite::params_from_iter(key), |r| {
                            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                        })
                        .optional()
                })
                .map_err(map_err)
        };
    let Some((record, version, changes_bytes, id)) = read(conn, sql, key)? else {
        return Ok(None);
    };
    if changes_bytes == 0 {
        return stored(record, version, Vec::new()).map(Some);
    }
    let tx = conn.transaction().map_err(map_err)?;
    let Some((record, version, _, _)) = read(&tx, GET, &[key[0], &id])? else {
        // Gone since the first look (purged).
        return Ok(None);
    };
    let changes = read_changes(&tx, key[0], &id)?;
    tx.commit().map_err(map_err)?;
    stored(record, version, changes).map(Some)
}

/// What a task keeps in `task_changes`, in order: (whole, body).
pub(super) fn read_changes(
    conn: &Connection,
    tenant: &[u8],
    id: &[u8],
) -> Result<Kept, StoreError> {
    conn.prepare_cached(CHANGES)
        .and_then(|mut s| {
            s.query_map([tenant, id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(map_err)
}

/// A task's rows in `task_changes`: (whole, body), in version order.
pub(super) type Kept = Vec<(bool, Vec<u8>)>;

/// A task's whole record and the changes after it, from its `tasks.record`
/// and its `task_changes` rows: the last whole row, if any, is the record
/// (what came before it is no longer read).
fn parts(record: Vec<u8>, kept: Kept) -> (Vec<u8>, Vec<Vec<u8>>) {
    let last_whole = kept.iter().rposition(|(whole, _)| *whole);
    let mut kept = kept.into_iter();
    let record = match last_whole {
        Some(at) => kept.nth(at).map(|(_, body)| body).unwrap_or(record),
        None => record,
    };
    (record, kept.map(|(_, body)| body).collect())
}

pub(super) fn stored(record: Vec<u8>, version: i64, kept: Kept) -> Result<StoredTask, StoreError> {
    let (record, changes) = parts(record, kept);
    Ok(StoredTask {
        record: codec::decode_with_changes(&record, changes.iter().map(Vec::as_slice))?,
        version: version as u64,
    })
}

/// [`TaskStore::get`](crate::store::TaskStore::get).
pub(super) async fn get(
    store: &SqliteStore,
    tenant: &str,
    task_id: &str,
) -> Result<Option<StoredTask>, StoreError> {
    let key = [tenant.as_bytes().to_vec(), task_id.as_bytes().to_vec()];
    let task_id = task_id.to_owned();
    store
        .read(move |conn| {
            if let Some(task) = read_task(conn, GET, &[&key[0], &key[1]])? {
                return Ok(Some(task));
            }
            // Rare: a miss also looks among the records set aside.
            let reason: Option<String> = conn
                .prepare_cached("SELECT reason FROM quarantine WHERE tenant = ?1 AND id = ?2")
                .and_then(|mut s| s.query_row([&key[0], &key[1]], |r| r.get(0)).optional())
                .map_err(map_err)?;
            match reason {
                Some(reason) => Err(StoreError::Internal(format!(
                    "task {task_id:?} was set aside at start because its stored record \
                 does not decode ({reason}); it is kept in the quarantine table"
                ))),
                None => Ok(None),
            }
        })
        .await
}

/// [`TaskStore::get_owned_by`](crate::store::TaskStore::get_owned_by).
pub(super) async fn get_owned_by(
    store: &SqliteStore,
    tenant: &str,
    task_id: &str,
    owner: &Owner,
) -> Result<Option<StoredTask>, StoreError> {
    let key = [
        tenant.as_bytes().to_vec(),
        task_id.as_bytes().to_vec(),
        owner.as_bytes().to_vec(),
    ];
    // No quarantine lookup: whose a set-aside record is cannot be read,
    // so for a user it is as absent as any other task not its own.
    store
        .read(move |conn| read_task(conn, GET_OWNED, &[&key[0], &key[1], &key[2]]))
        .await
}

/// [`TaskStore::is_owned_by`](crate::store::TaskStore::is_owned_by).
pub(super) async fn is_owned_by(
    store: &SqliteStore,
    tenant: &str,
    task_id: &str,
    owner: &Owner,
) -> Result<bool, StoreError> {
    let key = [
        tenant.as_bytes().to_vec(),
        task_id.as_bytes().to_vec(),
        owner.as_bytes().to_vec(),
    ];
    store
        .read(move |conn| {
            conn.prepare_cached(OWNS)
                .and_then(|mut s| s.exists(rusqlite::params_from_iter(&key)))
                .map_err(map_err)
        })
        .await
}

/// [`TaskStore::find_by_origin`](crate::store::TaskStore::find_by_origin).
pub(super) async fn find_by_origin(
    store: &SqliteStore,
    tenant: &str,
    owner: &str,
    message_id: &str,
) -> Result<Option<StoredTask>, StoreError> {
    if message_id.is_empty() {
        return Ok(None);
    }
    let origin = origin_key(owner, message_id);
    // Memory first: see `WriterHandle::origin`. A new message (the
    // common case: this runs for every one) is answered without a query.
    match store.writer.origin(tenant.as_bytes(), &origin) {
        writer::OriginLookup::Absent => return Ok(None),
        writer::OriginLookup::Logged(id) => {
            let id = String::from_utf8(id)
                .map_err(|_| StoreError::Internal("stored task id is not UTF-8".into()))?;
            return get(store, tenant, &id).await;
        }
        writer::OriginLookup::MaybeMerged => {}
    }
    let key = [tenant.as_bytes().to_vec(), origin];
    store
        .read(move |conn| read_task(conn, FIND_BY_ORIGIN, &[&key[0], &key[1]]))
        .await
}

/// [`TaskStore::list`](crate::store::TaskStore::list).
pub(super) async fn list(
    store: &SqliteStore,
    tenant: &str,
    query: &ListQuery,
) -> Result<TaskPage, StoreError> {
    let page_size = query.effective_page_size();
    let count = sql::count_query::<Sqlite>(tenant, query);
    // The candidates' sizes first (`length` of a blob reads its
    // header, not its pages), then only the records that fit.
    let sizes = page_query(
        "SELECT length(record) + changes_bytes FROM tasks",
        tenant,
        query,
        page_size + 1,
    );
    let tenant = tenant.to_owned();
    let query_for_page = query.clone();
    let (total, rows, more) = store
        .read(move |conn| {
            // One read transaction: the count and the page see the same
            // snapshot.
            let tx = conn.transaction().map_err(map_err)?;
            let total: i64 = tx
                .prepare_cached(&count.text)
                .and_then(|mut s| {
                    s.query_row(rusqlite::params_from_iter(&count.values), |r| r.get(0))
                })
                .map_err(map_err)?;
            let sizes = tx
                .prepare_cached(&sizes.text)
                .and_then(|mut s| {
                    s.query_map(rusqlite::params_from_iter(&sizes.values), |r| {
                        r.get::<_, i64>(0)
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(map_err)?;
            let (take, more) = crate::store::fitting(sizes.iter().map(|&n| n as usize), page_size);
            let page = page_query(
                "SELECT record, changes_bytes, id FROM tasks",
                &tenant,
                &query_for_page,
                take,
            );
            let rows = tx
                .prepare_cached(&page.text)
                .and_then(|mut s| {
                    s.query_map(rusqlite::params_from_iter(&page.values), |r| {
                        Ok((
                            r.get::<_, Vec<u8>>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, Vec<u8>>(2)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(map_err)?;
            // The changes of those that have some, in the same
            // snapshot.
            let rows = rows
                .into_iter()
                .map(|(record, changes_bytes, id)| {
                    let kept = if changes_bytes > 0 {
                        read_changes(&tx, tenant.as_bytes(), &id)?
                    } else {
                        Vec::new()
                    };
                    Ok(parts(record, kept))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            tx.commit().map_err(map_err)?;
            Ok((total, rows, more))
        })
        .await?;

    TaskPage::from_parts(&rows, more, query, total as usize)
}

/// [`TaskStore::count_unfinished`](crate::store::TaskStore::count_unfinished).
pub(super) async fn count_unfinished(
    store: &SqliteStore,
) -> Result<Vec<(TaskState, u64)>, StoreError> {
    let sql = unfinished_counts();
    let rows: Vec<(i32, i64)> = store
        .read(move |conn| {
            conn.prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(map_err)
        })
        .await?;
    Ok(counted(rows))
}

/// [`TaskStore::count_open_owned_by`](crate::store::TaskStore::count_open_owned_by).
pub(super) async fn count_open_owned_by(
    store: &SqliteStore,
    owner: &Owner,
    at_most: usize,
) -> Result<usize, StoreError> {
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM tasks INDEXED BY tasks_open_by_owner \
         WHERE owner = ?1 AND {} LIMIT ?2)",
        sql::OPEN_STATES_SQLITE
    );
    let owner = owner.as_bytes().to_vec();
    let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
    store
        .read(move |conn| {
            conn.prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_row(rusqlite::params![owner, at_most], |r| r.get::<_, i64>(0))
                })
                .map(|n| n as usize)
                .map_err(map_err)
        })
        .await
}

/// [`TaskStore::waiting_before`](crate::store::TaskStore::waiting_before).
pub(super) async fn waiting_before(
    store: &SqliteStore,
    before: &Timestamp,
    limit: usize,
) -> Result<Vec<crate::store::Waiting>, StoreError> {
    let (s, n) = time_key(before);
    let sql = format!(
        "SELECT tenant, id, owner, status_seconds, status_nanos FROM tasks \
         WHERE {} AND (status_seconds < ?1 OR (status_seconds = ?1 AND status_nanos < ?2)) \
         ORDER BY status_seconds, status_nanos LIMIT ?3",
        sql::WAITING_STATES_SQL
    );
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    store
        .read(move |conn| {
            let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
            conn.prepare_cached(&sql)
                .and_then(|mut st| {
                    st.query_map(rusqlite::params![s, n, limit], |r| {
                        Ok(crate::store::Waiting {
                            tenant: text(r.get(0)?),
                            task_id: text(r.get(1)?),
                            owner: text(r.get(2)?),
                            since: (r.get(3)?, r.get(4)?),
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(map_err)
        })
        .await
}
