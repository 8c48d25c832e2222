//! GetTask (spec §3.1.3), ListTasks (§3.1.4), CancelTask (§3.1.5) and
//! SubscribeToTask (§3.1.6).

use super::pacing::Reader;
use super::{EventStream, validate};
use crate::error::A2aError;
use crate::proto::{
    CancelTaskRequest, GetTaskRequest, ListTasksRequest, ListTasksResponse, SubscribeToTaskRequest,
    Task,
};
use crate::runtime::TaskManager;
use crate::runtime::stream::CloseAt;
use crate::store::{Caller, Cursor, TaskRead, status_key};

/// Encoded tasks one ListTasks response may carry (the stores stop a page
/// at it).
pub use crate::store::MAX_PAGE_BYTES;

/// GetTask; with `transitions`, the task's transition log in its metadata
/// ([`crate::lifecycle::TRANSITIONS_EXTENSION`]). Without, the task as the
/// store keeps it ([`TaskRead`]).
pub async fn get_task(
    manager: &TaskManager,
    caller: &Caller,
    req: GetTaskRequest,
    transitions: bool,
) -> Result<TaskRead, A2aError> {
    validate::task_id(&req.tenant, &req.id)?;
    let history = validate::history_length(req.history_length)?;
    if !transitions {
        return manager
            .read_task(&req.tenant, caller, &req.id, history)
            .await;
    }
    let (mut task, log) = manager
        .get_task_logged(&req.tenant, caller, &req.id, history)
        .await?;
    crate::lifecycle::transitions::show_transitions(&mut task, &log);
    Ok(TaskRead::Decoded(task))
}

/// ListTasks calls one caller (a principal, or an address without
/// authentication) may have in progress at once; the next waits its turn. A page is up to [`MAX_PAGE_BYTES`] to read and encode:
/// a principal listing huge tasks in many loops would otherwise take every
/// core, and the other principals' calls would wait behind it.
pub const MAX_LISTS_PER_PRINCIPAL: usize = 1;

/// The ListTasks turns of each caller that has a call in progress.
#[derive(Default)]
pub struct Lists {
    turns:
        std::sync::Mutex<std::collections::HashMap<Reader, std::sync::Arc<tokio::sync::Semaphore>>>,
}

/// A principal's turn at ListTasks, given back when dropped.
pub struct ListTurn {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Lists {
    /// Waits for `reader`'s turn. A caller that is neither a principal nor
    /// an address (an embedded server called without a peer) is not held
    /// back.
    pub async fn turn(&self, reader: &Reader) -> ListTurn {
        if *reader == Reader::Unknown {
            return ListTurn { _permit: None };
        }
        let turns = {
            let mut map = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            // Callers with no call in progress are forgotten.
            map.retain(|_, s| std::sync::Arc::strong_count(s) > 1);
            map.entry(reader.clone())
                .or_insert_with(|| {
                    std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_LISTS_PER_PRINCIPAL))
                })
                .clone()
        };
        ListTurn {
            _permit: turns.acquire_owned().await.ok(),
        }
    }
}

pub async fn list_tasks(
    manager: &TaskManager,
    caller: &Caller,
    req: ListTasksRequest,
) -> Result<ListTasksResponse, A2aError> {
    let query = validate::list_request(&req)?;
    let mut page = manager.list_tasks(&req.tenant, caller, &query).await?;
    // A page must fit in one response: tasks are bounded (MAX_TASK_BYTES)
    // but a page of them is not, so a page ends early, with a token for the
    // rest, once it would pass the response limit.
    let mut bytes = 0;
    let fits = page
        .tasks
        .iter()
        .position(|t| {
            bytes += prost::Message::encoded_len(t) + 8;
            bytes > MAX_PAGE_BYTES
        })
        .map(|n| n.max(1));
    if let Some(keep) = fits
        && keep < page.tasks.len()
    {
        page.tasks.truncate(keep);
        let last = page.tasks.last().expect("at least one task");
        page.next = Some(Cursor {
            status: status_key(last),
            task_id: last.id.clone(),
        });
    }
    Ok(ListTasksResponse {
        tasks: page.tasks,
        // spec §3.1.4: always present, empty on the last page.
        next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
        page_size: query.page_size as i32,
        total_size: i32::try_from(page.total_size).unwrap_or(i32::MAX),
    })
}

pub async fn cancel_task(
    manager: &TaskManager,
    caller: &Caller,
    req: CancelTaskRequest,
) -> Result<Task, A2aError> {
    validate::task_id(&req.tenant, &req.id)?;
    manager
        .cancel_task(&req.tenant, caller, &req.id, req.metadata)
        .await
}

pub async fn subscribe_to_task(
    manager: &TaskManager,
    caller: &Caller,
    req: SubscribeToTaskRequest,
) -> Result<EventStream, A2aError> {
    validate::task_id(&req.tenant, &req.id)?;
    let handle = manager.subscribe(&req.tenant, caller, &req.id).await?;
    Ok(Box::pin(manager.event_stream(handle, CloseAt::Terminal)))
}
