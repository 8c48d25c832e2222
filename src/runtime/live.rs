//! One task while something uses it: its lock, accepting its events, its
//! progress signal, and the handles requests read it through.
//!
//! A `LiveTask` exists while a run, a stream or a request holds it, and is
//! forgotten when the last holder drops it; the store stays the source of
//! truth and the cache is reloaded from it after any failed write.
//!
//! Events are accepted and committed in two steps. Accepting (`LiveTask::submit_locked`)
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
//! Its runs' state is held here (`Runs`; the `run_queue` part moves it):
//! at most one executor runs per task, and a client message accepted while one runs is committed to
//! history at once and queued; the flush that commits it marks it ready,
//! and the next run starts when the current one ends (or is dropped if the
//! task became terminal meanwhile: the message stays in history).
//!
//! The parts of a live task's work live beside this file, each an `impl
//! LiveTask` block: `loaded` (its cached copy), `commit` (store writes and
//! what follows them), `run_queue` (its runs), `replica` (other replicas'
//! writes), `fail` (the server's own FAILED).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{broadcast, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::answer::NewTaskAnswer;
use super::loaded::{Author, Broadcast, Loaded, Pending, Signal, StateGuard, event_bytes, policy};
pub use super::loaded::{MAX_TASK_BYTES, MIN_CHANGES_BEFORE_WHOLE};
use super::{Shared, TaskHandle, TaskKey, now, store_error};
use crate::agent::AgentExecutor;
use crate::error::A2aError;
use crate::lifecycle::history::task_view;
use crate::lifecycle::{ApplyError, HistoryLength, TaskEvent, TaskRecord};
use crate::proto::{Message, StreamResponse, Task, TaskState, stream_response::Payload};
use crate::store::{Caller, StoreError};

/// What blocking waiters watch: the committed state, how many status
/// events have been committed, and where the task's runs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub state: TaskState,
    pub status_seq: u64,
    /// The number of the run executing or last executed (runs are numbered
    /// from 1 on each live task; 0: none yet).
    pub runs_started: u64,
    /// `status_seq` when run `runs_started` began: a status committed after
    /// it belongs to that run or later.
    pub run_status_seq: u64,
    /// The highest run number that has ended, or that will never run (its
    /// task became terminal first). Runs go in order, so run `n` is over
    /// once this is `n` or more.
    pub runs_finished: u64,
    /// Writes the store refused (other than version conflicts).
    pub write_failures: u64,
}

/// First wait before retrying to fail a task the store refused.
pub const FAIL_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(50);
/// Longest wait between those retries.
pub const FAIL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Follow-up messages a task may hold queued behind its running executor
/// (spec §3.2.2: a non-blocking send returns at once, so the queue is where
/// they wait). One more is refused with RESOURCE_EXHAUSTED.
pub const MAX_QUEUED_MESSAGES: usize = 32;

/// What a run is started with: the agent and the request that asked for
/// it. The task itself is read when the run starts.
pub(crate) struct RunRequest {
    pub(crate) agent: Arc<dyn AgentExecutor>,
    pub(crate) message: Message,
    pub(crate) metadata: Option<crate::wkt::Struct>,
    pub(crate) accepted_output_modes: Vec<String>,
    /// The send's push notification config (see
    /// [`super::MessageRequest::push_config`]); taken before a run starts.
    pub(crate) push_config: Option<crate::proto::TaskPushNotificationConfig>,
    /// The protocol version of the client that sent it.
    pub(crate) protocol: crate::lifecycle::Protocol,
    /// Where the run was asked for: the span it is a child of, the
    /// caller's trace.
    pub(crate) trace: crate::telemetry::RunTrace,
}

/// A follow-up message waiting for its run.
pub(super) struct Queued {
    pub(super) seq: u64,
    pub(super) request: RunRequest,
    /// Its message is committed to history: the run may start.
    pub(super) committed: bool,
}

/// A task's executor runs: at most one at a time, the rest queued in the
/// order their messages entered history.
#[derive(Default)]
pub(crate) struct Runs {
    pub(super) active: bool,
    /// Runs started or queued: the number the next message's run gets,
    /// minus one.
    pub(super) reserved: u64,
    pub(super) queue: VecDeque<Queued>,
    /// The running executor's cancellation, for CancelTask.
    pub(super) cancel: Option<CancellationToken>,
    /// On a store shared by replicas, this replica's claim on the task's
    /// runs ([`crate::store::Coordination::claim_run`]): another replica may
    /// have queued a run of a message it got.
    pub(super) claim: RunClaim,
}

/// Where this replica's claim on a task's runs stands. A claim being taken
/// or released dispatches again when that is done.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum RunClaim {
    #[default]
    Free,
    Claiming,
    Held,
    /// Held, and claimed for the queued run about to start: the claim
    /// settled one of the runs this replica owes the task
    /// ([`crate::store::EncodedTask::owes_runs`]). Each run starts from
    /// here, so a replica that stops between a follow-up's commit and its
    /// run leaves the run owed, for the sweep to find.
    Ready,
    Releasing,
}

impl Runs {
    pub(super) fn idle(&self) -> bool {
        !self.active && self.queue.is_empty()
    }

    /// A queued run could start but none runs here.
    pub(super) fn waiting(&self) -> bool {
        !self.active && self.queue.front().is_some_and(|q| q.committed)
    }
    pub(super) fn mark_committed(&mut self, seq: u64) {
        if let Some(q) = self.queue.iter_mut().find(|q| q.seq == seq) {
            q.committed = true;
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

/// Why an event was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyFailure {
    #[error(transparent)]
    Rejected(#[from] ApplyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The event would make the task larger than [`MAX_TASK_BYTES`].
    #[error(
        "task {task_id:?} would grow to {size} bytes encoded, over the {MAX_TASK_BYTES}-byte limit"
    )]
    TooLarge { task_id: String, size: usize },
}

impl From<ApplyFailure> for A2aError {
    fn from(f: ApplyFailure) -> A2aError {
        match f {
            ApplyFailure::Rejected(e) => A2aError::Internal(e.to_string()),
            ApplyFailure::Store(e) => store_error(e),
            ApplyFailure::TooLarge { ref task_id, .. } => A2aError::ResourceExhausted {
                message: f.to_string(),
                task_id: Some(task_id.clone()),
                limit: "MAX_TASK_BYTES",
            },
        }
    }
}

pub(crate) struct LiveTask {
    pub(super) key: TaskKey,
    pub(super) shared: Weak<Shared>,
    /// `None` until loaded from the store (or after a failed write).
    pub(super) state: tokio::sync::Mutex<Option<Loaded>>,
    pub(crate) progress: watch::Sender<Progress>,
    /// Locked after `state` when both are held, never across an await.
    pub(super) runs: Mutex<Runs>,
    /// The run executing or last executed (numbered from 1; 0: none yet).
    /// An atomic beside `runs` rather than in it: every event is tagged
    /// with it and reads it without that lock.
    pub(super) current_run: std::sync::atomic::AtomicU64,
    /// Marked as watched in a store shared by replicas
    /// ([`crate::store::Coordination::watch`]): unmarked when dropped.
    pub(super) watched: std::sync::atomic::AtomicBool,
    /// Catch-ups asked for and not yet begun by the one running
    /// ([`LiveTask::catch_up`]); one runs while this is above 0.
    pub(super) catching_up: std::sync::atomic::AtomicU64,
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.forget(&self.key);
            // Its ring serves the next task streamed, unless something can
            // still read from it (`IdleRings::give`).
            if let Some(ring) = self.state.get_mut().as_mut().and_then(|l| l.events.take()) {
                shared.rings.give(ring);
            }
            if self.watched.load(std::sync::atomic::Ordering::Relaxed)
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                // Marked only through the store's coordination.
                let key = self.key.clone();
                runtime.spawn(async move {
                    let Some(replicas) = shared.replicas() else {
                        return;
                    };
                    if let Err(e) = replicas.watch(&key.tenant, &key.id, false).await {
                        tracing::debug!(task_id = %key.id, error = %e, "could not stop watching a task");
                    }
                });
            }
        }
    }
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
                runs_started: 0,
                run_status_seq: 0,
                runs_finished: 0,
                write_failures: 0,
            }),
            runs: Mutex::new(Runs::default()),
            current_run: std::sync::atomic::AtomicU64::new(0),
            watched: std::sync::atomic::AtomicBool::new(false),
            catching_up: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn key(&self) -> &TaskKey {
        &self.key
    }

    /// Locks the task, loading it from the store first if needed.
    pub(crate) async fn lock_loaded(&self, shared: &Shared) -> Result<StateGuard<'_>, A2aError> {
        let mut guard = self.state.lock().await;
        if guard.is_none() {
            // Loaded here, so run elsewhere (a task this process creates is
            // installed, not loaded) or nowhere: watched before it is read,
            // so that no write after the read goes unannounced.
            if let Some(replicas) = shared.replicas()
                && !self.watched.load(std::sync::atomic::Ordering::Relaxed)
            {
                replicas
                    .watch(&self.key.tenant, &self.key.id, true)
                    .await
                    .map_err(store_error)?;
                self.watched
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            let stored = shared
                .store
                .get(&self.key.tenant, &self.key.id)
                .await
                .map_err(store_error)?
                .ok_or_else(|| A2aError::TaskNotFound {
                    task_id: self.key.id.clone(),
                })?;
            let state = stored.record.state();
            self.advance(|p| p.state = state);
            *guard = Some(Loaded::new(stored.record, stored.version));
        }
        Ok(guard)
    }

    /// [`LiveTask::lock_loaded`] for `caller`. A user's access is asked of
    /// the store first, with its name in the lookup (`TaskStore::owns`),
    /// before anything about the task is looked at, in memory or not, and
    /// before its lock is waited for: another principal's task is
    /// TASK_NOT_FOUND after the same index lookup a missing task costs
    /// (spec §13.1). The owner never changes, so the answer holds when the
    /// lock is then taken.
    pub(crate) async fn lock_visible(
        &self,
        shared: &Shared,
        caller: &Caller,
    ) -> Result<StateGuard<'_>, A2aError> {
        if let Some(owner) = caller.owner_filter() {
            let owns = shared
                .store
                .owns(&self.key.tenant, &self.key.id, owner)
                .await
                .map_err(store_error)?;
            if !owns {
                return Err(A2aError::TaskNotFound {
                    task_id: self.key.id.clone(),
                });
            }
        }
        self.lock_loaded(shared).await
    }

    /// Updates the task's [`Progress`] ([`super::update_watched`]): only a
    /// blocking send or a replica following the task ever watches it.
    pub(crate) fn advance(&self, update: impl FnOnce(&mut Progress)) {
        super::update_watched(&self.progress, update);
    }

    /// Installs a freshly created task (version from `TaskStore::create`).
    pub(crate) async fn install(&self, loaded: Loaded) -> StateGuard<'_> {
        let mut guard = self.state.lock().await;
        let state = loaded.record.state();
        self.advance(|p| p.state = state);
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
        author: Author,
    ) -> Result<Commit, ApplyFailure> {
        let (commit, _) = self.submit_locked_from(shared, guard, event, author, false)?;
        Ok(commit)
    }

    /// [`Self::submit_locked`], for an emitter that may start the flush
    /// itself (`driver`: a run's driver polling its agent,
    /// `sink::Driven`): then no flush is spawned, and true says the
    /// emitter owes one ([`Self::flush`] or [`Self::flush_now`]), which
    /// it must start before it next waits.
    pub(crate) fn submit_locked_from(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        guard: &mut StateGuard<'_>,
        event: TaskEvent,
        author: Author,
        driver: bool,
    ) -> Result<(Commit, bool), ApplyFailure> {
        let loaded = guard.as_mut().expect("submit on a loaded task");
        if author.is_agent()
            && let Some(e) = loaded.failure.take()
        {
            return Err(ApplyFailure::Store(e));
        }
        let added = event_bytes(&event);
        if author.is_agent() || matches!(event, TaskEvent::UserMessage(_)) {
            let exact = || {
                use prost::Message as _;
                loaded.record.task.encoded_len()
            };
            if loaded.bytes + added > MAX_TASK_BYTES && exact() + added > MAX_TASK_BYTES {
                return Err(ApplyFailure::TooLarge {
                    task_id: self.key.id.clone(),
                    size: exact() + added,
                });
            }
        }
        if loaded.committed.is_none() {
            // The working copy is about to move ahead of the store: keep
            // what readers must go on seeing until the commit, from now
            // on kept in step by each commit's changes.
            loaded.committed = Some(loaded.record.clone());
        }
        let mut changes = Vec::new();
        // A task not yet stored is created by a write of its whole record,
        // which reads no changes: none are built for its events (an
        // artifact's copy, a status's). One left pending past the create
        // makes the next write whole too (`Pending::logged`). A replica
        // set logs them all: its whole writes of a running task carry them
        // to the replicas following it.
        let replicated = shared.replicas().is_some();
        let logged = loaded.version > 0 || replicated;
        // Only another writer of a shared store makes an event apply
        // again (`rebase`); otherwise it is moved into the task, not copied.
        let kept = replicated.then(|| event.clone());
        let (at, rule, cause) = (now(), policy(shared, author), author.cause());
        let out = if logged {
            loaded
                .record
                .apply_logged(event, at, rule, cause, &mut changes)?
        } else {
            loaded.record.apply_unlogged(event, at, rule, cause)?
        };
        loaded.bytes += added;
        let (tx, rx) = oneshot::channel();
        // Read without the runs lock: set only under this task's lock
        // (held here), on every event.
        let run = self.current_run.load(std::sync::atomic::Ordering::Relaxed);
        loaded.pending.push(Pending {
            event: kept,
            changes,
            logged,
            author,
            run,
            follow_up: None,
            out,
            notify: vec![tx],
            answer: None,
            handle_to: None,
        });
        let mut owed = false;
        if !loaded.flushing {
            loaded.flushing = true;
            if driver {
                owed = true;
            } else {
                tokio::spawn(self.clone().flush(shared.clone()));
            }
        }
        Ok((Commit(rx), owed))
    }

    /// Accepts `event` and waits for its commit (for client requests).
    pub(crate) async fn apply(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        mut guard: StateGuard<'_>,
        event: TaskEvent,
        author: Author,
    ) -> Result<(), ApplyFailure> {
        let commit = self.submit_locked(shared, &mut guard, event, author)?;
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

    pub(super) fn publish(&self, loaded: &mut Loaded, run: u64, out: Option<StreamResponse>) {
        let Some(out) = out else { return };
        if let Some(Payload::StatusUpdate(update)) = &out.payload {
            let state = update
                .status
                .as_ref()
                .and_then(|s| TaskState::try_from(s.state).ok())
                .unwrap_or(TaskState::Unspecified);
            self.advance(|p| {
                p.state = state;
                p.status_seq += 1;
            });
        }
        if let Some(tx) = &loaded.events
            && tx.receiver_count() > 0
        {
            // Err only when every receiver is gone; nothing to do then.
            let _ = tx.send(Arc::new(Signal::Event { run, event: out }));
        }
    }

    /// A request's handle on the task, taken under the lock so that the
    /// snapshot and the subscription start at the same point.
    /// `run` is the run the request is about (its message's, or for a
    /// subscriber the latest reserved one: `None`).
    pub(crate) fn handle(
        self: &Arc<Self>,
        loaded: &mut Loaded,
        history: HistoryLength,
        subscribe: bool,
        run: Option<u64>,
    ) -> TaskHandle {
        let snapshot = task_view(&loaded.task(), history, true);
        self.handle_of(loaded, snapshot, history, subscribe, run)
    }

    /// [`LiveTask::handle`] with the snapshot given: the default task for a
    /// handle whose snapshot is filled once its task is created
    /// ([`super::answer::NewTaskAnswer`]).
    pub(crate) fn handle_of(
        self: &Arc<Self>,
        loaded: &mut Loaded,
        snapshot: Task,
        history: HistoryLength,
        subscribe: bool,
        run: Option<u64>,
    ) -> TaskHandle {
        let events = subscribe.then(|| self.subscribe_locked(loaded));
        let (run, idle) = {
            let runs = self.runs();
            (run.unwrap_or(runs.reserved), runs.idle())
        };
        let run_started = self.status_from_run(run);
        TaskHandle {
            live: self.clone(),
            snapshot,
            events,
            baseline: *self.progress.borrow(),
            history,
            settled: false,
            run,
            idle,
            run_started,
        }
    }

    /// The handle for a repeated request: the task as it is. Settled (no
    /// waiting, no further events) when nothing more can happen to it
    /// without a client: terminal, or interrupted with no run active or
    /// queued. Otherwise it follows the runs reserved so far.
    pub(crate) async fn duplicate_handle(
        self: &Arc<Self>,
        shared: &Shared,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<super::SendOutcome, A2aError> {
        let mut guard = self.lock_loaded(shared).await?;
        let loaded = guard.as_mut().expect("loaded");
        let state = loaded.committed_state();
        let settled = state.is_terminal() || (state.is_interrupted() && self.runs().idle());
        let mut handle = self.handle(loaded, history, subscribe && !settled, None);
        handle.settled = settled;
        Ok(super::SendOutcome::Task(Box::new(handle)))
    }

    fn subscribe_locked(&self, loaded: &mut Loaded) -> broadcast::Receiver<Broadcast> {
        loaded
            .events
            .get_or_insert_with(|| match self.shared.upgrade() {
                Some(shared) => shared.rings.take(),
                None => broadcast::channel(super::SUBSCRIBER_BUFFER).0,
            })
            .subscribe()
    }

    /// A fresh snapshot and a new subscription from the same point, for a
    /// subscriber that fell behind; with whether the task's runs are idle
    /// then, and whether its status comes from run `run` or a later one.
    pub(crate) async fn resubscribe(
        &self,
        shared: &Shared,
        run: u64,
    ) -> Result<(Task, broadcast::Receiver<Broadcast>, bool, bool), A2aError> {
        let mut guard = self.lock_loaded(shared).await?;
        let loaded = guard.as_mut().expect("loaded");
        let rx = self.subscribe_locked(loaded);
        let idle = self.runs().idle();
        Ok((
            loaded.task().into_owned(),
            rx,
            idle,
            self.status_from_run(run),
        ))
    }

    /// Whether the committed status was set during run `run` or a later
    /// one (read under the task's lock, with the committed copy).
    fn status_from_run(&self, run: u64) -> bool {
        let p = *self.progress.borrow();
        p.runs_started > run || (p.runs_started == run && p.status_seq > p.run_status_seq)
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

    /// The task as [`Self::view`] shows it, taken rather than copied when
    /// this is its last holder (a blocking send's answer, issue 32); else
    /// the handle back. Nothing else can read the task then: the live
    /// tasks' map holds only weak references, which no longer upgrade once
    /// the last strong one is given up, so a reader arriving now loads the
    /// task from the store, and no run of this process holds it (a queued
    /// run holds its task).
    pub(crate) fn take_if_last(
        self: Arc<Self>,
        shared: &Arc<Shared>,
        history: HistoryLength,
    ) -> Result<Task, Arc<Self>> {
        let mut live = Arc::try_unwrap(self)?;
        // Taken out of the cache in place; the rest (its ring among it)
        // goes as the handle is dropped.
        if let Some(loaded) = live.state.get_mut().as_mut() {
            let mut task = loaded.take_committed_task();
            history.apply(&mut task);
            return Ok(task);
        }
        // Not loaded (a failed write let it go): the task's registered
        // handle, which reads it from the store as GetTask would.
        let key = live.key.clone();
        drop(live);
        Err(shared.live_or_insert(key))
    }

    pub(super) fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        // Poisoning would need a panic while it is held, and nothing held
        // under it panics; recover the data rather than spread the panic.
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running executor's cancellation, taken (CancelTask).
    pub(crate) fn take_run_cancel(&self) -> Option<CancellationToken> {
        self.runs().cancel.take()
    }

    /// Whether the history (committed or pending) holds a client message
    /// with this id.
    pub(crate) fn holds_message_locked(loaded: &Loaded, message_id: &str) -> bool {
        Self::holds_message_in(&loaded.record, message_id)
    }

    pub(super) fn holds_message_in(record: &TaskRecord, message_id: &str) -> bool {
        record
            .task
            .history
            .iter()
            .any(|m| m.message_id == message_id && m.role == crate::proto::Role::User as i32)
    }
}
