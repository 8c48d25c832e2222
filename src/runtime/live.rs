//! One task while something uses it: its cached record, its lock, its
//! broadcast and its progress signal.
//!
//! A `LiveTask` exists while a run, a stream or a request holds it, and is
//! forgotten when the last holder drops it; the store stays the source of
//! truth and the cache is reloaded from it after any failed write.
//!
//! Events are accepted and committed in two steps. Accepting ([`submit`])
//! validates an event with the lifecycle core and applies it to the working
//! copy of the task, in order, under the task's lock. Committing happens in
//! the background, one store write at a time per task: each write carries
//! every event accepted since the previous one (so an agent that emits
//! faster than the store commits costs one write per batch, not per event).
//! Only after a write commits are its events broadcast, the committed copy
//! (what snapshots and reads see) advanced, and waiters told. Nothing is
//! told before it is committed; a client request that changes the task
//! (a message, a cancel) waits for its own commit before answering.
//!
//! [`submit`]: LiveTask::submit_locked

use std::borrow::Cow;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{MutexGuard, broadcast, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::sink::NewTaskAnswer;
use super::{Shared, TaskHandle, TaskKey, now, store_error};
use crate::error::A2aError;
use crate::lifecycle::history::task_view;
use crate::lifecycle::{ApplyError, HistoryLength, TaskEvent, TaskRecord, TransitionPolicy};
use crate::proto::{StreamResponse, Task, TaskState, stream_response::Payload};
use crate::store::{EncodedTask, StoreError};

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
    /// Every accepted event applied, committed or not.
    pub(crate) record: TaskRecord,
    /// What the store holds at `version` (what readers and new subscribers
    /// see), encoded: the bytes of the last write, which the store keeps
    /// too. While no event is pending it equals the working copy, and
    /// readers use that instead; `None` then means not encoded yet. With
    /// events pending it is always `Some`. Holding the committed copy
    /// encoded rather than as a second `TaskRecord` spares a deep copy of
    /// the task per write (measured: the largest cost of a commit).
    committed: Option<EncodedTask>,
    version: u64,
    /// Accepted, not yet committed, in order.
    pending: Vec<Pending>,
    /// A background flush is running.
    flushing: bool,
    /// A commit failed and dropped accepted events; reported to the agent's
    /// next event.
    failure: Option<StoreError>,
    events: Option<broadcast::Sender<Broadcast>>,
}

/// An accepted event waiting for its commit.
struct Pending {
    event: TaskEvent,
    origin: Origin,
    out: Option<StreamResponse>,
    notify: Vec<oneshot::Sender<Result<(), StoreError>>>,
    /// The creating request's answer, when this event's write creates the
    /// task.
    answer: Option<NewTaskAnswer>,
}

impl Loaded {
    pub(crate) fn new(record: TaskRecord, version: u64) -> Self {
        Loaded {
            committed: None,
            record,
            version,
            pending: Vec::new(),
            flushing: false,
            failure: None,
            events: None,
        }
    }

    /// A new task not yet in the store: its first flush creates it. Until
    /// then its committed copy is the task as created (SUBMITTED), which is
    /// what the creating request's snapshot shows.
    pub(crate) fn uncreated(record: TaskRecord) -> Self {
        Loaded::new(record, 0)
    }

    /// The committed task: what a reader may be shown.
    pub(crate) fn task(&self) -> Cow<'_, Task> {
        match &self.committed {
            Some(committed) if !self.pending.is_empty() => match committed.decode() {
                Ok(record) => Cow::Owned(record.task),
                // Bytes this process encoded itself; should they not decode,
                // the working copy is the closest truth there is.
                Err(_) => Cow::Borrowed(&self.record.task),
            },
            _ => Cow::Borrowed(&self.record.task),
        }
    }

    /// The committed state.
    fn committed_state(&self) -> TaskState {
        match &self.committed {
            Some(committed) if !self.pending.is_empty() => committed.state,
            _ => self.record.state(),
        }
    }
}

/// Resolves when an accepted event is committed, or fails with the store's
/// error when it was dropped.
pub(crate) struct Commit(oneshot::Receiver<Result<(), StoreError>>);

impl Commit {
    pub(crate) async fn wait(self) -> Result<(), StoreError> {
        self.0
            .await
            .unwrap_or_else(|_| Err(StoreError::Internal("commit abandoned".into())))
    }
}

/// Accepted events a task may hold uncommitted before an agent's next event
/// waits for its own commit (backpressure on an agent faster than the
/// store).
pub const MAX_PENDING_EVENTS: usize = 256;

/// Events a commit waits for while its emitter is still producing them;
/// below [`MAX_PENDING_EVENTS`], so the emitter never waits for it.
pub const FLUSH_BATCH_EVENTS: usize = MAX_PENDING_EVENTS / 2;

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

fn policy(shared: &Shared, origin: Origin) -> TransitionPolicy {
    match origin {
        Origin::Agent => shared.config.policy,
        Origin::Server => TransitionPolicy::Permissive,
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

    /// Accepts `event` under the held lock: the lifecycle core validates it
    /// and applies it to the working copy; a background flush commits it.
    /// The returned [`Commit`] resolves once it is in the store. An agent's
    /// event is refused with the store's error if an earlier commit failed.
    pub(crate) fn submit_locked(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        guard: &mut StateGuard<'_>,
        event: TaskEvent,
        origin: Origin,
    ) -> Result<Commit, ApplyFailure> {
        let loaded = guard.as_mut().expect("submit on a loaded task");
        if origin == Origin::Agent
            && let Some(e) = loaded.failure.take()
        {
            return Err(ApplyFailure::Store(e));
        }
        if loaded.pending.is_empty() && loaded.committed.is_none() {
            // The working copy is about to move ahead of the store: keep
            // what readers must go on seeing until the commit.
            loaded.committed = Some(EncodedTask::new(&loaded.record));
        }
        let out = loaded
            .record
            .apply(event.clone(), now(), policy(shared, origin))?;
        let (tx, rx) = oneshot::channel();
        loaded.pending.push(Pending {
            event,
            origin,
            out,
            notify: vec![tx],
            answer: None,
        });
        if !loaded.flushing {
            loaded.flushing = true;
            tokio::spawn(self.clone().flush(shared.clone()));
        }
        Ok(Commit(rx))
    }

    /// Accepts `event` and waits for its commit (for client requests).
    pub(crate) async fn apply(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        mut guard: StateGuard<'_>,
        event: TaskEvent,
        origin: Origin,
    ) -> Result<(), ApplyFailure> {
        let commit = self.submit_locked(shared, &mut guard, event, origin)?;
        drop(guard);
        Ok(commit.wait().await?)
    }

    /// Answers the request that created the task when the event just
    /// submitted commits (or is dropped).
    pub(crate) fn answer_on_commit_locked(guard: &mut StateGuard<'_>, answer: NewTaskAnswer) {
        if let Some(last) = guard.as_mut().and_then(|l| l.pending.last_mut()) {
            last.answer = Some(answer);
        }
    }

    /// Resolves when everything accepted so far is committed (or dropped).
    pub(crate) fn barrier_locked(guard: &mut StateGuard<'_>) -> Commit {
        let (tx, rx) = oneshot::channel();
        match guard.as_mut().and_then(|l| l.pending.last_mut()) {
            Some(last) => last.notify.push(tx),
            None => {
                let _ = tx.send(Ok(()));
            }
        }
        Commit(rx)
    }

    /// Whether this task holds so many uncommitted events that an agent
    /// should wait for its own.
    pub(crate) fn backlogged(guard: &StateGuard<'_>) -> bool {
        guard
            .as_ref()
            .is_some_and(|l| l.pending.len() >= MAX_PENDING_EVENTS)
    }

    /// Commits accepted events in order, one store write per round, until
    /// none are left.
    async fn flush(self: Arc<Self>, shared: Arc<Shared>) {
        // Pending events seen at the last look, while the emitter was still
        // adding to them.
        let mut seen = 0;
        loop {
            // Let the emitter that started this flush go on first: events it
            // emits right away join this write instead of needing another.
            tokio::task::yield_now().await;
            let (write, version, count) = {
                let mut guard = self.state.lock().await;
                let Some(loaded) = guard.as_mut() else { return };
                if loaded.pending.is_empty() {
                    loaded.flushing = false;
                    return;
                }
                // Events arrived since the last look: the emitter is
                // producing as fast as it runs, so wait one more turn (up to
                // FLUSH_BATCH_EVENTS) and commit them together. Committing
                // each turn's one or two events instead made every
                // subscriber's stream wake, encode and write per event
                // (measured with 64 subscribers: 8 times the socket writes
                // of a plain broadcast, and 2.5 times its CPU per event).
                // An emitter that pauses is committed after one extra turn;
                // a task already terminal has nothing more coming.
                let n = loaded.pending.len();
                if n > seen && n < FLUSH_BATCH_EVENTS && !loaded.record.state().is_terminal() {
                    seen = n;
                    continue;
                }
                seen = 0;
                // Encoded under the lock: the write and the next committed
                // copy, with no copy of the task itself.
                (
                    EncodedTask::new(&loaded.record),
                    loaded.version,
                    loaded.pending.len(),
                )
            };
            // Version 0: the task is new, and this write creates it.
            let result = if version == 0 {
                shared.store.create_encoded(&self.key.tenant, &write).await
            } else {
                shared
                    .store
                    .update_encoded(&self.key.tenant, &write, version)
                    .await
            };
            let mut guard = self.state.lock().await;
            let Some(loaded) = guard.as_mut() else { return };
            match result {
                Ok(version) => {
                    loaded.version = version;
                    loaded.committed = Some(write);
                    let done: Vec<Pending> = loaded.pending.drain(..count).collect();
                    for p in done {
                        self.publish(loaded, p.out);
                        for n in p.notify {
                            let _ = n.send(Ok(()));
                        }
                        if let Some(answer) = p.answer {
                            answer.deliver(Ok(()), &shared);
                        }
                    }
                }
                Err(e) if version == 0 => {
                    // The create was refused (a repeat of the same message,
                    // or the store failed): the task never existed.
                    self.drop_pending(&shared, loaded, e);
                    *guard = None;
                    return;
                }
                Err(StoreError::Conflict { .. }) => {
                    // Another writer moved the task: rebase what is pending
                    // on the stored copy, or drop it all if it no longer
                    // applies.
                    if let Err(e) = self.rebase(&shared, loaded).await {
                        self.drop_pending(&shared, loaded, e);
                    }
                }
                Err(e) => {
                    tracing::error!(task_id = %self.key.id, error = %e, "task write failed");
                    self.drop_pending(&shared, loaded, e);
                    // The working copy held the dropped events: reload.
                    match shared.store.get(&self.key.tenant, &self.key.id).await {
                        Ok(Some(stored)) => {
                            loaded.record = stored.record;
                            loaded.committed = None;
                            loaded.version = stored.version;
                        }
                        _ => {
                            *guard = None;
                            return;
                        }
                    }
                }
            }
        }
    }

    /// After a version conflict: reloads the stored task and re-applies
    /// the pending events to it.
    async fn rebase(&self, shared: &Shared, loaded: &mut Loaded) -> Result<(), StoreError> {
        let stored = shared
            .store
            .get(&self.key.tenant, &self.key.id)
            .await?
            .ok_or_else(|| StoreError::NotFound(self.key.id.clone()))?;
        let mut record = stored.record.clone();
        let mut outs = Vec::with_capacity(loaded.pending.len());
        for p in &loaded.pending {
            let out = record
                .apply(p.event.clone(), now(), policy(shared, p.origin))
                .map_err(|e| StoreError::Conflict {
                    id: format!("{} ({e})", self.key.id),
                    expected: loaded.version,
                    actual: stored.version,
                })?;
            outs.push(out);
        }
        for (p, out) in loaded.pending.iter_mut().zip(outs) {
            p.out = out;
        }
        loaded.committed = Some(EncodedTask::new(&stored.record));
        loaded.version = stored.version;
        loaded.record = record;
        Ok(())
    }

    /// Drops every pending event after a failed commit: their waiters get
    /// the error, open streams end with it (they must not hang waiting for
    /// events that were never recorded), blocking waiters wake up, and the
    /// agent hears of it at its next event.
    fn drop_pending(&self, shared: &Arc<Shared>, loaded: &mut Loaded, e: StoreError) {
        for p in loaded.pending.drain(..) {
            for n in p.notify {
                let _ = n.send(Err(e.clone()));
            }
            if let Some(answer) = p.answer {
                answer.deliver(Err(&e), shared);
            }
        }
        if let Some(tx) = &loaded.events {
            let _ = tx.send(Arc::new(Err(store_error(e.clone()))));
        }
        // Back to the committed copy (always present while events were
        // pending); the flush reloads from the store if it cannot be read.
        if let Some(record) = loaded.committed.as_ref().and_then(|c| c.decode().ok()) {
            loaded.record = record;
        }
        loaded.failure = Some(e);
        self.progress.send_modify(|p| p.write_failures += 1);
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
            snapshot: task_view(&loaded.task(), history, true),
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
        let settled = loaded.committed_state().ends_blocking_wait();
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
        Ok((loaded.task().into_owned(), rx))
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
        Ok(task_view(&loaded.task(), history, include_artifacts))
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
