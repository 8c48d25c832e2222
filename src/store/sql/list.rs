//! The ListTasks statements (spec §3.1.4) in either dialect: the filters
//! the page and the count share, the cursor's predicate, the page's order.

use super::{Dialect, Sql};
use crate::store::{Cursor, ListQuery, OwnerFilter, time_key};

/// The count of the tasks `query` matches, in every page.
pub(crate) fn count_query<D: Dialect>(tenant: &str, query: &ListQuery) -> Sql<D> {
    let mut count = Sql::new("SELECT COUNT(*) FROM tasks");
    push_filters(&mut count, tenant, query);
    count
}

/// The ListTasks page query: `select` (the columns and `FROM tasks`) of
/// the tasks `query` matches after its cursor, newest status first, ties
/// by id, at most `limit` (one more than a page tells whether another
/// follows).
pub(crate) fn page_query<D: Dialect>(
    select: &str,
    tenant: &str,
    query: &ListQuery,
    limit: usize,
) -> Sql<D> {
    let mut page = Sql::new(select);
    push_filters(&mut page, tenant, query);
    if let Some(cursor) = &query.cursor {
        push_after(&mut page, cursor);
    }
    page.push(" ORDER BY status_seconds DESC, status_nanos DESC, id ASC LIMIT ")
        .bind(limit as i64);
    page
}

/// Appends the WHERE clause shared by the page and the count.
fn push_filters<D: Dialect>(sql: &mut Sql<D>, tenant: &str, query: &ListQuery) {
    sql.push(" WHERE tenant = ")
        .bind(tenant.as_bytes().to_vec());
    match query.owner.as_ref().map(OwnerFilter::owner) {
        None => {}
        Some(Some(owner)) => {
            // The second term is the partial index's condition (SQLite's
            // migration 0005, PostgreSQL's 0001), repeated so the planner
            // may use it.
            sql.push(" AND owner = ")
                .bind(owner.as_bytes().to_vec())
                .push(" AND owner <> ")
                .push(D::EMPTY_BYTES);
        }
        // Limited to nobody's tasks: none.
        Some(None) => {
            sql.push(" AND FALSE");
        }
    }
    if let Some(context) = &query.context_id {
        sql.push(" AND context_id = ")
            .bind(context.as_bytes().to_vec());
    }
    if let Some(state) = query.state {
        sql.push(" AND state = ").bind(state as i32);
    }
    if let Some(after) = &query.status_after {
        // status timestamp >= after (inclusive), on (seconds, nanos).
        let (s, n) = time_key(after);
        if D::ROW_VALUES {
            sql.push(" AND (status_seconds, status_nanos) >= (")
                .bind(s)
                .push(", ")
                .bind(n)
                .push(")");
        } else {
            sql.push(" AND (status_seconds > ")
                .bind(s)
                .push(" OR (status_seconds = ")
                .bind(s)
                .push(" AND status_nanos >= ")
                .bind(n)
                .push("))");
        }
    }
}

/// Appends the cursor's predicate: strictly after it in (time desc, id
/// asc) order.
fn push_after<D: Dialect>(sql: &mut Sql<D>, cursor: &Cursor) {
    let (s, n) = cursor.status;
    let id = cursor.task_id.as_bytes().to_vec();
    if D::ROW_VALUES {
        sql.push(" AND ((status_seconds, status_nanos) < (")
            .bind(s)
            .push(", ")
            .bind(n)
            .push(") OR (status_seconds = ")
            .bind(s)
            .push(" AND status_nanos = ")
            .bind(n)
            .push(" AND id > ")
            .bind(id)
            .push("))");
    } else {
        // The redundant `status_seconds <=` bound lets the index seek to
        // the cursor instead of walking every newer task.
        sql.push(" AND status_seconds <= ")
            .bind(s)
            .push(" AND (status_seconds < ")
            .bind(s)
            .push(" OR (status_seconds = ")
            .bind(s)
            .push(" AND (status_nanos < ")
            .bind(n)
            .push(" OR (status_nanos = ")
            .bind(n)
            .push(" AND id > ")
            .bind(id)
            .push("))))");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TaskState;
    use crate::store::sql::{Postgres, Sqlite};
    use crate::wkt::Timestamp;

    /// A query with every filter and a cursor.
    fn everything() -> ListQuery {
        ListQuery {
            owner: Some("u".into()),
            context_id: Some("c".into()),
            state: Some(TaskState::Working),
            status_after: Some(Timestamp {
                seconds: 5,
                nanos: 6,
            }),
            cursor: Some(Cursor {
                status: (7, 8),
                task_id: "t9".into(),
            }),
            ..ListQuery::default()
        }
    }

    /// Each dialect's page query reads as each backend's did before they
    /// shared it: the indexes and query plans were chosen for these.
    #[test]
    fn each_dialect_writes_its_backends_page_query() {
        let pg = page_query::<Postgres>("SELECT record FROM tasks", "t", &everything(), 11);
        assert_eq!(
            pg.text,
            "SELECT record FROM tasks WHERE tenant = $1 AND owner = $2 \
             AND owner <> ''::bytea AND context_id = $3 AND state = $4 \
             AND (status_seconds, status_nanos) >= ($5, $6) \
             AND ((status_seconds, status_nanos) < ($7, $8) \
             OR (status_seconds = $9 AND status_nanos = $10 AND id > $11)) \
             ORDER BY status_seconds DESC, status_nanos DESC, id ASC LIMIT $12"
        );
        assert_eq!(pg.values.len(), 12);
        let lite = page_query::<Sqlite>("SELECT record FROM tasks", "t", &everything(), 11);
        assert_eq!(
            lite.text,
            "SELECT record FROM tasks WHERE tenant = ? AND owner = ? AND owner <> x'' \
             AND context_id = ? AND state = ? \
             AND (status_seconds > ? OR (status_seconds = ? AND status_nanos >= ?)) \
             AND status_seconds <= ? AND (status_seconds < ? OR (status_seconds = ? \
             AND (status_nanos < ? OR (status_nanos = ? AND id > ?)))) \
             ORDER BY status_seconds DESC, status_nanos DESC, id ASC LIMIT ?"
        );
        use rusqlite::types::Value;
        assert_eq!(
            lite.values,
            [
                Value::Blob(b"t".to_vec()),
                Value::Blob(b"u".to_vec()),
                Value::Blob(b"c".to_vec()),
                Value::Integer(TaskState::Working as i64),
                Value::Integer(5),
                Value::Integer(5),
                Value::Integer(6),
                Value::Integer(7),
                Value::Integer(7),
                Value::Integer(7),
                Value::Integer(8),
                Value::Integer(8),
                Value::Blob(b"t9".to_vec()),
                Value::Integer(11),
            ]
        );
        let count = count_query::<Postgres>("t", &ListQuery::default());
        assert_eq!(count.text, "SELECT COUNT(*) FROM tasks WHERE tenant = $1");
        let nobodys = ListQuery {
            owner: Some("".into()),
            ..ListQuery::default()
        };
        let count = count_query::<Sqlite>("t", &nobodys);
        assert_eq!(
            count.text,
            "SELECT COUNT(*) FROM tasks WHERE tenant = ? AND FALSE"
        );
    }
}
