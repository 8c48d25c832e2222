//! The requests about one task (spec §3.1.3-§3.1.6): GetTask, ListTasks,
//! CancelTask and SubscribeToTask, each checked against what the caller
//! may see before anything else about the task is read.

use crate::wkt::Struct;
use tokio_util::sync::CancellationToken;

use super::live::ApplyFailure;
use super::loaded::Author;
use super::{TaskHandle, TaskManager, server_status, store_error, task_state};
use crate::agent::RequestContext;
use crate::error::A2aError;
use crate::lifecycle::{Cause, HistoryLength};
use crate::proto::{Task, TaskState};
use crate::store::{Caller, ListQuery, StoreError, TaskPage, TaskRead};

impl TaskManager {
    /// GetTask (spec §3.1.3); a task `caller` may not see is not found.
    pub async fn get_task(
        &self,
        tenant: &str,
        caller: &Caller,
        id: &str,
        history: HistoryLength,
    ) -> Result<Task, A2aError> {
        self.read_task(tenant, caller, id, history)
            .await?
            .into_task()
            .map_err(store_error)
    }

    /// [`TaskManager::get_task`] as the store keeps the task: its encoding
    /// when the store has it ([`TaskRead::Encoded`], history trimmed in the
    /// bytes), for an answer that sends the task as it is.
    pub async fn read_task(
        &self,
        tenant: &str,
        caller: &Caller,
        id: &str,
        history: HistoryLength,
    ) -> Result<TaskRead, A2aError> {
        // The task alone: a store may leave the rest of the record unread.
        self.shared
            .store
            .read_task(tenant, id, caller.owner_filter())
            .await
            .map_err(store_error)?
            .ok_or_else(|| A2aError::TaskNotFound {
                task_id: id.to_owned(),
            })?
            .with_history(history)
            .map_err(store_error)
    }

    /// [`TaskManager::get_task`] with the task's transition log, oldest
    /// first ([`crate::lifecycle::transitions`]).
    pub async fn get_task_logged(
        &self,
        tenant: &str,
        caller: &Caller,
        id: &str,
        history: HistoryLength,
    ) -> Result<(Task, Vec<crate::lifecycle::Transition>), A2aError> {
        let store = &self.shared.store;
        let stored = match caller.owner_filter() {
            Some(owner) => store.get_owned(tenant, id, owner).await,
            None => store.get(tenant, id).await,
        }
        .map_err(store_error)?
        .ok_or_else(|| A2aError::TaskNotFound {
            task_id: id.to_owned(),
        })?;
        // The task was read for this call alone: trimmed in place, not
        // copied (`task_view`).
        let mut task = stored.record.task;
        history.apply(&mut task);
        Ok((task, stored.record.transitions))
    }

    /// ListTasks (spec §3.1.4): one page of the tenant's committed tasks
    /// that `caller` may see; a user's query carries its name as the owner
    /// filter, whatever the query said, so pages and `total_size` count
    /// only its tasks.
    pub async fn list_tasks(
        &self,
        tenant: &str,
        caller: &Caller,
        query: &ListQuery,
    ) -> Result<TaskPage, A2aError> {
        let scoped;
        let query = match caller.owner_filter() {
            Some(owner) => {
                scoped = ListQuery {
                    owner: Some(owner.into()),
                    ..query.clone()
                };
                &scoped
            }
            None => query,
        };
        self.shared
            .store
            .list(tenant, query)
            .await
            .map_err(store_error)
    }

    /// CancelTask (spec §3.1.5): a terminal task is TASK_NOT_CANCELABLE;
    /// otherwise the running executor is cancelled and the task moves to
    /// CANCELED, committed before this returns.
    pub async fn cancel_task(
        &self,
        tenant: &str,
        caller: &Caller,
        id: &str,
        metadata: Option<Struct>,
    ) -> Result<Task, A2aError> {
        let live = self.live_or_insert(tenant, id);
        let state = live.lock_visible(&self.shared, caller).await?;
        let current = state.as_ref().expect("loaded").record.state();
        if current.is_terminal() {
            return Err(A2aError::TaskNotCancelable {
                task_id: id.to_owned(),
                state: current.as_str_name(),
            });
        }
        let token = live.take_run_cancel();
        if let Some(token) = &token {
            token.cancel();
        }
        let event = server_status(
            TaskState::Canceled,
            "Task canceled at the client's request.",
        );
        match live
            .apply(&self.shared, state, event, Author::Server(Cause::Cancel))
            .await
        {
            Ok(()) => {}
            // Another writer (a replica) ended the task first: the cancel
            // no longer applies to what is stored.
            Err(ApplyFailure::Store(StoreError::Conflict { .. })) => {
                let task = live
                    .view(&self.shared, HistoryLength::Last(0), false)
                    .await?;
                let state = task_state(&task);
                return Err(if state.is_terminal() {
                    A2aError::TaskNotCancelable {
                        task_id: id.to_owned(),
                        state: state.as_str_name(),
                    }
                } else {
                    A2aError::Unavailable(format!(
                        "task {id:?} changed while it was being canceled; try again"
                    ))
                });
            }
            Err(e) => return Err(e.into()),
        }
        let task = live.view(&self.shared, HistoryLength::All, true).await?;
        if let Some(agent) = self.shared.agents.route(tenant) {
            let ctx = RequestContext {
                tenant: tenant.to_owned(),
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                message: task.history.first().cloned().unwrap_or_default(),
                task: Some(task.clone()),
                metadata,
                accepted_output_modes: Vec::new(),
                cancelled: token.unwrap_or_else(|| {
                    let t = CancellationToken::new();
                    t.cancel();
                    t
                }),
            };
            tokio::spawn(async move {
                if let Err(e) = agent.cancel(ctx).await {
                    tracing::warn!(error = %e, "agent cancel hook failed");
                }
            });
        }
        Ok(task)
    }

    /// SubscribeToTask (spec §3.1.6): refused for a terminal task; otherwise
    /// a handle whose snapshot and events join without gap or repeat.
    pub async fn subscribe(
        &self,
        tenant: &str,
        caller: &Caller,
        id: &str,
    ) -> Result<TaskHandle, A2aError> {
        let live = self.live_or_insert(tenant, id);
        let mut state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_mut().expect("loaded");
        let current = loaded.record.state();
        if current.is_terminal() {
            return Err(A2aError::unsupported(
                format!(
                    "task {id:?} is in terminal state {}; there is nothing to subscribe to",
                    current.as_str_name()
                ),
                Some(id),
            ));
        }
        Ok(live.handle(loaded, HistoryLength::All, true, None))
    }
}
