//! ListTasks queries and pages (spec §3.1.4): the query a store answers,
//! the page it returns, how much a page may carry, and the sort key.

use crate::lifecycle::{HistoryLength, TaskRecord};
use crate::proto::{Task, TaskState};
use crate::wkt::Timestamp;

use super::{Cursor, OwnerFilter, StoreError, codec};

/// Default ListTasks page size (proto `ListTasksRequest.page_size`).
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// Largest ListTasks page size (proto `ListTasksRequest.page_size`).
pub const MAX_PAGE_SIZE: usize = 100;

/// A ListTasks query, already validated. A `page_size` of 0 is read as
/// [`DEFAULT_PAGE_SIZE`].
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only the tasks this principal created (a `user`'s listing; see
    /// [`Caller::owner_filter`](super::Caller::owner_filter)), made from
    /// its name: `Some("alice".into())`. The empty name's lists nothing.
    pub owner: Option<OwnerFilter>,
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    /// Only tasks whose status timestamp is >= this (proto
    /// `status_timestamp_after`).
    pub status_after: Option<Timestamp>,
    pub page_size: usize,
    pub cursor: Option<Cursor>,
    pub history: HistoryLength,
    pub include_artifacts: bool,
}

impl ListQuery {
    /// The page size a store applies: 0 means the default, and never more
    /// than [`MAX_PAGE_SIZE`].
    pub fn effective_page_size(&self) -> usize {
        match self.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        }
    }
}

/// One page of ListTasks.
#[derive(Debug, Clone, Default)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
    /// Matching tasks in all pages.
    pub total_size: usize,
}

/// Encoded task records one ListTasks page may carry: the message limit,
/// less room for the response's other fields. A store stops a page at it
/// (`fitting`) before reading the records past it: a principal with a
/// hundred tasks of megabytes would otherwise make each list call read
/// hundreds of megabytes, holding a reader every tenant shares.
pub const MAX_PAGE_BYTES: usize = crate::proto::MAX_MESSAGE_BYTES - 64 * 1024;

/// How many of a page's candidates (their records' encoded sizes, in list
/// order, up to `page_size + 1`) the page takes, and whether more follow:
/// as many as fit in [`MAX_PAGE_BYTES`], at least one (a task is at most
/// `MAX_TASK_BYTES`, which fits), at most `page_size`.
pub(crate) fn fitting(sizes: impl IntoIterator<Item = usize>, page_size: usize) -> (usize, bool) {
    let mut bytes = 0usize;
    let mut taken = 0;
    for size in sizes {
        bytes = bytes.saturating_add(size);
        if taken == page_size || (taken > 0 && bytes > MAX_PAGE_BYTES) {
            return (taken, true);
        }
        taken += 1;
    }
    (taken, false)
}

impl TaskPage {
    /// A page from the SQL backends' rows: each task's whole record and the
    /// changes after it ([`codec::decode_with_changes`]), as many as the
    /// page takes ([`fitting`]), in list order, shown as `query` asks;
    /// `more` when another page follows; and the count of all matches.
    pub(crate) fn from_parts(
        rows: &[(Vec<u8>, Vec<Vec<u8>>)],
        more: bool,
        query: &ListQuery,
        total_size: usize,
    ) -> Result<Self, StoreError> {
        let records = rows
            .iter()
            .map(|(record, changes)| {
                codec::decode_with_changes(record, changes.iter().map(Vec::as_slice))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_records(records, more, query, total_size)
    }

    fn from_records(
        records: Vec<TaskRecord>,
        more: bool,
        query: &ListQuery,
        total_size: usize,
    ) -> Result<Self, StoreError> {
        let next = match (more, records.last()) {
            (true, Some(last)) => Some(Cursor {
                status: status_key(&last.task),
                task_id: last.task.id.clone(),
            }),
            _ => None,
        };
        Ok(TaskPage {
            tasks: records
                .iter()
                .map(|r| {
                    crate::lifecycle::history::task_view(
                        &r.task,
                        query.history,
                        query.include_artifacts,
                    )
                })
                .collect(),
            next,
            total_size,
        })
    }
}

/// The sort key of a task in ListTasks: its status timestamp as
/// (seconds, nanos), which covers the whole protobuf Timestamp range
/// (years 1..9999) at full precision. A task without one sorts first in
/// time (oldest).
pub fn status_key(task: &Task) -> TimeKey {
    task.status
        .as_ref()
        .and_then(|s| s.timestamp.as_ref())
        .map(time_key)
        .unwrap_or((i64::MIN, 0))
}

/// A timestamp as an ordered (seconds, nanos) pair.
pub type TimeKey = (i64, i32);

pub fn time_key(ts: &Timestamp) -> TimeKey {
    (ts.seconds, ts.nanos)
}
