//! One task while something uses it: its cached record, its lock, its
//! broadcast and its progress signal.
//!
//! A `LiveTask` exists while a run, a stream or a request holds it, and is
//! forgotten when the last holder drops it; the store stays the source of
//! truth and the cache is reloaded from it after any failed write.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{MutexGuard, broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::{Shared, TaskHandle, TaskKey, now, store_error};
use crate::error::A2aError;
use crate::lifecycle::history::task_view;
use crate::lifecycle::{ApplyError, HistoryLength, TaskEvent, TaskRecord, TransitionPolicy};
use crate::proto::{StreamResponse, Task, TaskState, stream_response::Payload};
use crate::store::StoreError;

/// What blocking waiters watch: the state, how many status events have been
/// applied, and how many runs have finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub state: TaskState,
    pub status_seq: u64,
    pub runs_finished: u64,
    /// Writes the store refused (other than version conflicts).
    pub write_failures: u64,
}

/// What a task's broadcast carries: an applied event, or the error that
/// ends every open stream when a change could not be committed.
pub(crate) type Broadcast = Arc<Result<StreamResponse, A2aError>>;

/// The cached task and the broadcast to its subscribers. The sender is
/// created on first subscription: most tasks are never streamed, and the
/// ring costs `subscriber_buffer` slots.
pub(crate) struct Loaded {
    pub(crate) record: TaskRecord,
    pub(crate) version: u64,
    events: Option<broadcast::Sender<Broadcast>>,
}

impl Loaded {
    pub(crate) fn new(record: TaskRecord, version: u64) -> Self {
        Loaded {
            record,
            version,
            events: None,
        }
    }
}

pub(crate) type StateGuard<'a> = MutexGuard<'a, Option<Loaded>>;

/// Why an event was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyFailure {
    #[error(transparent)]
    Rejected(#[from] ApplyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ApplyFailure> for A2aError {
    fn from(f: ApplyFailure) -> A2aError {
        match f {
            ApplyFailure::Rejected(e) => A2aError::Internal(e.to_string()),
            ApplyFailure::Store(e) => store_error(e),
        }
    }
}

pub(crate) struct LiveTask {
    key: TaskKey,
    shared: Weak<Shared>,
    /// `None` until loaded from the store (or after a failed write).
    state: tokio::sync::Mutex<Option<Loaded>>,
    pub(crate) progress: watch::Sender<Progress>,
    /// Held for the whole of an executor run.
    pub(crate) run_lock: Arc<tokio::sync::Mutex<()>>,
    run_cancel: Mutex<Option<CancellationToken>>,
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.forget(&self.key);
        }
    }
}

/// Who produced an event. The configured transition policy binds agents;
/// the server's own safety transitions (CANCELED on CancelTask, FAILED when
/// an executor fails) are checked only by the permissive rules (nothing out
/// of a terminal state), so a strict policy can never leave a task stuck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Agent,
    Server,
}

/// Conflicting concurrent writers (another replica) are retried this often
/// from the fresh copy before the write fails.
const MAX_CONFLICT_RETRIES: usize = 3;

impl LiveTask {
    pub(crate) fn new(key: TaskKey, shared: Weak<Shared>) -> Self {
        LiveTask {
            key,
            shared,
            state: tokio::sync::Mutex::new(None),
            progress: watch::Sender::new(Progress {
                state: TaskState::Unspecified,
                status_seq: 0,
                runs_finished: 0,
                write_failures: 0,
            }),
            run_lock: Arc::new(tokio::sync::Mutex::new(())),
            run_cancel: Mutex::new(None),
        }
    }

    pub(crate) fn key(&self) -> &TaskKey {
        &self.key
    }

    /// Locks the task, loading it from the store first if needed.
    pub(crate) async fn lock_loaded(&self, shared: &Shared) -> Result<StateGuard<'_>, A2aError> {
        let mut guard = self.state.lock().await;
        if guard.is_none() {
            let stored = shared
                .store
                .get(&self.key.tenant, &self.key.id)
                .await
                .map_err(store_error)?
                .ok_or_else(|| A2aError::TaskNotFound {
                    task_id: self.key.id.clone(),
                })?;
            let state = stored.record.state();
            self.progress.send_modify(|p| p.state = state);
            *guard = Some(Loaded::new(stored.record, stored.version));
        }
        Ok(guard)
    }

    /// Installs a freshly created task (version from `TaskStore::create`).
    pub(crate) async fn install(&self, loaded: Loaded) -> StateGuard<'_> {
        let mut guard = self.state.lock().await;
        let state = loaded.record.state();
        self.progress.send_modify(|p| p.state = state);
        *guard = Some(loaded);
        guard
    }

    /// Applies `event` under the held lock: lifecycle core, then store, then
    /// broadcast and progress. Nothing is told before the store accepted it.
    pub(crate) async fn apply_locked(
        &self,
        shared: &Shared,
        guard: &mut StateGuard<'_>,
        event: TaskEvent,
        origin: Origin,
    ) -> Result<(), ApplyFailure> {
        let policy = match origin {
            Origin::Agent => shared.config.policy,
            Origin::Server => TransitionPolicy::Permissive,
        };
        let mut attempt = 0;
        loop {
            let loaded = guard.as_mut().expect("apply on a loaded task");
            let mut next = loaded.record.clone();
            let out = next.apply(event.clone(), now(), policy)?;
            match shared
                .store
                .update(&self.key.tenant, &next, loaded.version)
                .await
            {
                Ok(version) => {
                    loaded.record = next;
                    loaded.version = version;
                    self.publish(loaded, out);
                    return Ok(());
                }
                Err(StoreError::Conflict { .. }) if attempt < MAX_CONFLICT_RETRIES => {
                    attempt += 1;
                    self.reload(shared, guard).await?;
                }
                Err(e) => {
                    // Streams must not hang waiting for an event that was
                    // never recorded: they end with the store's error, and
                    // blocking waiters wake up. The cache may differ from the
                    // store now: reload it on next use.
                    tracing::error!(task_id = %self.key.id, error = %e, "task write failed");
                    if let Some(tx) = &loaded.events {
                        let _ = tx.send(Arc::new(Err(store_error(e.clone()))));
                    }
                    self.progress.send_modify(|p| p.write_failures += 1);
                    **guard = None;
                    return Err(e.into());
                }
            }
        }
    }

    async fn reload(&self, shared: &Shared, guard: &mut StateGuard<'_>) -> Result<(), StoreError> {
        let stored = shared
            .store
            .get(&self.key.tenant, &self.key.id)
            .await?
            .ok_or_else(|| StoreError::NotFound(self.key.id.clone()))?;
        let loaded = guard.as_mut().expect("reload a loaded task");
        loaded.record = stored.record;
        loaded.version = stored.version;
        Ok(())
    }

    fn publish(&self, loaded: &mut Loaded, out: Option<StreamResponse>) {
        let Some(out) = out else { return };
        if let Some(Payload::StatusUpdate(update)) = &out.payload {
            let state = update
                .status
                .as_ref()
                .and_then(|s| TaskState::try_from(s.state).ok())
                .unwrap_or(TaskState::Unspecified);
            self.progress.send_modify(|p| {
                p.state = state;
                p.status_seq += 1;
            });
        }
        if let Some(tx) = &loaded.events
            && tx.receiver_count() > 0
        {
            // Err only when every receiver is gone; nothing to do then.
            let _ = tx.send(Arc::new(Ok(out)));
        }
    }

    /// A request's handle on the task, taken under the lock so that the
    /// snapshot and the subscription start at the same point.
    pub(crate) fn handle(
        self: &Arc<Self>,
        loaded: &mut Loaded,
        history: HistoryLength,
        subscribe: bool,
    ) -> TaskHandle {
        let events = subscribe.then(|| self.subscribe_locked(loaded));
        TaskHandle {
            live: self.clone(),
            snapshot: task_view(&loaded.record.task, history, true),
            events,
            baseline: *self.progress.borrow(),
            history,
            settled: false,
        }
    }

    /// The handle for a repeated request: the task as it is. Settled (no
    /// waiting, no further events) unless a run is still working on it.
    pub(crate) async fn duplicate_handle(
        self: &Arc<Self>,
        shared: &Shared,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<super::SendOutcome, A2aError> {
        let mut guard = self.lock_loaded(shared).await?;
        let loaded = guard.as_mut().expect("loaded");
        let settled = loaded.record.state().ends_blocking_wait();
        let mut handle = self.handle(loaded, history, subscribe && !settled);
        handle.settled = settled;
        Ok(super::SendOutcome::Task(Box::new(handle)))
    }

    /// Whether the task's history holds a client message with this id.
    pub(crate) async fn holds_message(
        &self,
        shared: &Shared,
        message_id: &str,
    ) -> Result<bool, A2aError> {
        let guard = self.lock_loaded(shared).await?;
        let task = &guard.as_ref().expect("loaded").record.task;
        Ok(task
            .history
            .iter()
            .any(|m| m.message_id == message_id && m.role == crate::proto::Role::User as i32))
    }

    fn subscribe_locked(&self, loaded: &mut Loaded) -> broadcast::Receiver<Broadcast> {
        let capacity = self
            .shared
            .upgrade()
            .map(|s| s.config.subscriber_buffer)
            .unwrap_or(super::SUBSCRIBER_BUFFER);
        loaded
            .events
            .get_or_insert_with(|| broadcast::channel(capacity).0)
            .subscribe()
    }

    /// A fresh snapshot and a new subscription from the same point, for a
    /// subscriber that fell behind.
    pub(crate) async fn resubscribe(
        &self,
        shared: &Shared,
    ) -> Result<(Task, broadcast::Receiver<Broadcast>), A2aError> {
        let mut guard = self.lock_loaded(shared).await?;
        let loaded = guard.as_mut().expect("loaded");
        let rx = self.subscribe_locked(loaded);
        Ok((loaded.record.task.clone(), rx))
    }

    /// The current task as a reader asked for it.
    pub(crate) async fn view(
        &self,
        shared: &Shared,
        history: HistoryLength,
        include_artifacts: bool,
    ) -> Result<Task, A2aError> {
        let guard = self.lock_loaded(shared).await?;
        let loaded = guard.as_ref().expect("loaded");
        Ok(task_view(&loaded.record.task, history, include_artifacts))
    }

    pub(crate) fn set_run_cancel(&self, token: Option<CancellationToken>) {
        *self.run_cancel.lock().expect("run_cancel poisoned") = token;
    }

    pub(crate) fn take_run_cancel(&self) -> Option<CancellationToken> {
        self.run_cancel.lock().expect("run_cancel poisoned").take()
    }

    pub(crate) fn finish_run(&self) {
        self.set_run_cancel(None);
        self.progress.send_modify(|p| p.runs_finished += 1);
    }
}
