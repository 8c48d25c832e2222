//! One task while something uses it: its cached record, its lock, its
//! broadcast and its progress signal.
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
//! Runs are tracked here too (`Runs`): at most one executor runs per
//! task, and a client message accepted while one runs is committed to
//! history at once and queued; the flush that commits it marks it ready,
//! and the next run starts when the current one ends (or is dropped if the
//! task became terminal meanwhile: the message stays in history).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{MutexGuard, broadcast, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::answer::NewTaskAnswer;
use super::{Shared, TaskHandle, TaskKey, now, store_error};
use crate::agent::{AgentExecutor, RequestContext};
use crate::error::A2aError;
use crate::lifecycle::history::task_view;
use crate::lifecycle::{
    ApplyError, Cause, Change, Changes, HistoryLength, TaskEvent, TaskRecord, TransitionPolicy,
};
use crate::proto::{Message, StreamResponse, Task, TaskState, stream_response::Payload};
use crate::store::{Body, Caller, Caught, EncodedTask, OutboxEntry, StoreError};

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

/// What a task's broadcast carries. Always behind an `Arc` (one allocation
/// per broadcast, shared by every subscriber), so the variants' sizes do not
/// matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Signal {
    /// A committed event, with the number of the run that was current when
    /// it was accepted (a stream of a follow-up message closes at
    /// INPUT_REQUIRED only from its own run on).
    Event { run: u64, event: StreamResponse },
    /// No run is active or queued and the task is interrupted: nothing more
    /// happens without a client, so open streams end.
    Idle,
    /// A change could not be committed: every open stream ends with it.
    Failed(A2aError),
    /// Events committed by another replica could not be read in full (the
    /// store no longer keeps them): streams resynchronise with a fresh
    /// snapshot, as a subscriber that fell behind does.
    Resync,
}

pub(crate) type Broadcast = Arc<Signal>;

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
struct Queued {
    seq: u64,
    request: RunRequest,
    /// Its message is committed to history: the run may start.
    committed: bool,
}

/// A task's executor runs: at most one at a time, the rest queued in the
/// order their messages entered history.
#[derive(Default)]
pub(crate) struct Runs {
    active: bool,
    /// Runs started or queued: the number the next message's run gets,
    /// minus one.
    reserved: u64,
    queue: VecDeque<Queued>,
    /// The running executor's cancellation, for CancelTask.
    cancel: Option<CancellationToken>,
    /// On a store shared by replicas, this replica's claim on the task's
    /// runs ([`crate::store::TaskStore::claim_run`]): another replica may
    /// have queued a run of a message it got.
    claim: RunClaim,
}

/// Where this replica's claim on a task's runs stands. A claim being taken
/// or released dispatches again when that is done.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum RunClaim {
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
    fn idle(&self) -> bool {
        !self.active && self.queue.is_empty()
    }

    /// A queued run could start but none runs here.
    fn waiting(&self) -> bool {
        !self.active && self.queue.front().is_some_and(|q| q.committed)
    }
}

/// The cached task and the broadcast to its subscribers. The sender is
/// created on first subscription: most tasks are never streamed, and the
/// ring costs `subscriber_buffer` slots.
pub(crate) struct Loaded {
    /// Every accepted event applied, committed or not.
    pub(crate) record: TaskRecord,
    /// What the store holds at `version` (what readers and new subscribers
    /// see). Made when the first event after a load is accepted (a copy of
    /// the working copy), and from then on kept in step by replaying each
    /// commit's changes on it ([`Change`]): never copied whole per write,
    /// however long the task (issue "long-lived tasks"). While no event is
    /// pending it equals the working copy, and readers use that; `None`
    /// then means not made yet. With events pending it is always `Some`.
    committed: Option<TaskRecord>,
    version: u64,
    /// Accepted, not yet committed, in order.
    pending: Vec<Pending>,
    /// A background flush is running.
    flushing: bool,
    /// A commit failed and dropped accepted events; reported to the agent's
    /// next event.
    failure: Option<StoreError>,
    events: Option<broadcast::Sender<Broadcast>>,
    /// At least the encoded size of the working copy's task: exact after
    /// each whole write, grown by each accepted event's size in between
    /// (see [`MAX_TASK_BYTES`]).
    bytes: usize,
    /// The encoded size of the task's last whole record in the store, and
    /// of the changes written since: what decides when a write is whole
    /// again ([`MIN_CHANGES_BEFORE_WHOLE`]).
    whole_bytes: usize,
    changes_bytes: usize,
}

/// A write of a task's changes ([`Body::Changes`]) is made whole instead
/// once the changes written since the last whole record would reach that
/// record's size, and at least this many bytes: each whole write then
/// follows at least as many bytes of changes as it costs, so a long task
/// costs about what its updates changed, twice over at most, and a read
/// replays at most that much (issue "long-lived tasks").
pub const MIN_CHANGES_BEFORE_WHOLE: usize = 16 * 1024;

/// Largest encoded task a client message or an agent event may produce:
/// below [`crate::proto::MAX_MESSAGE_BYTES`], with room for the response
/// around it, so GetTask of any stored task can always be answered. The
/// server's own events (cancel, failure: a short status message) are never
/// refused, so a task at the limit can still end.
pub const MAX_TASK_BYTES: usize = 3 * 1024 * 1024;

/// What an event adds to a task's encoded size, at most.
fn event_bytes(event: &TaskEvent) -> usize {
    use prost::Message as _;
    // Field tags, lengths and the status wrapper around the payload.
    const OVERHEAD: usize = 32;
    OVERHEAD
        + match event {
            TaskEvent::Status(u) => u.message.as_ref().map_or(0, |m| m.encoded_len()),
            TaskEvent::Artifact(a) => a.artifact.encoded_len(),
            TaskEvent::UserMessage(m) => m.encoded_len(),
            TaskEvent::Metadata(m) => m.encoded_len(),
            TaskEvent::PushConfig(crate::lifecycle::PushConfigChange::Set(c, _)) => c.encoded_len(),
            TaskEvent::PushConfig(crate::lifecycle::PushConfigChange::Delete(_)) => 0,
        }
}

/// An accepted event waiting for its commit.
struct Pending {
    event: TaskEvent,
    /// What applying it changed in the working copy; taken by the write
    /// that commits it.
    changes: Vec<Change>,
    author: Author,
    /// The run current when it was accepted.
    run: u64,
    /// A follow-up message whose queued run waits for this commit.
    follow_up: Option<u64>,
    out: Option<StreamResponse>,
    notify: Vec<oneshot::Sender<Result<(), StoreError>>>,
    /// The creating request's answer, when this event's write creates the
    /// task.
    answer: Option<NewTaskAnswer>,
}

impl Loaded {
    pub(crate) fn new(record: TaskRecord, version: u64) -> Self {
        use prost::Message as _;
        let bytes = record.task.encoded_len();
        Loaded {
            committed: None,
            bytes,
            whole_bytes: bytes,
            changes_bytes: 0,
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
        Cow::Borrowed(&self.committed_record().task)
    }

    /// The committed push notification configs: what a reader may be shown.
    pub(crate) fn push_configs(&self) -> Cow<'_, [crate::proto::TaskPushNotificationConfig]> {
        Cow::Borrowed(self.committed_record().push_configs.as_slice())
    }

    /// The task as read from the store again, at `version`, nothing
    /// pending.
    fn reload(&mut self, record: TaskRecord, version: u64) {
        *self = Loaded {
            pending: std::mem::take(&mut self.pending),
            flushing: self.flushing,
            failure: self.failure.take(),
            events: self.events.take(),
            ..Loaded::new(record, version)
        };
    }

    /// The committed record (see [`Loaded::committed`]).
    fn committed_record(&self) -> &TaskRecord {
        match &self.committed {
            Some(committed) if !self.pending.is_empty() => committed,
            _ => &self.record,
        }
    }

    /// The committed state.
    fn committed_state(&self) -> TaskState {
        self.committed_record().state()
    }

    /// Takes in what other writers committed, up to `version`: the
    /// committed copy becomes the task as stored then. Without events
    /// pending the working copy is the committed one and moves with it;
    /// with events pending the caller re-applies them on it (a rebase).
    /// Changes are replayed, at the cost of what they changed, not of the
    /// task (issue "long-lived tasks"). False when they do not follow from
    /// the copy held (not expected): the caller reads the task whole.
    fn take_committed(&mut self, caught: Caught, version: u64) -> bool {
        use prost::Message as _;
        match caught {
            Caught::Whole(record) if self.pending.is_empty() => self.reload(*record, version),
            Caught::Whole(record) => {
                self.committed = Some(*record);
                self.version = version;
            }
            Caught::Changes(writes) => {
                for changes in writes {
                    let size = changes.encoded_len();
                    let replayed = if self.pending.is_empty() {
                        // A committed copy kept since this process's own
                        // last commit equals the working copy: both move.
                        self.committed
                            .as_mut()
                            .is_none_or(|c| c.replay_all(changes.clone()).is_ok())
                            && self.record.replay_all(changes).is_ok()
                    } else {
                        self.committed
                            .as_mut()
                            .is_some_and(|c| c.replay_all(changes).is_ok())
                    };
                    if !replayed {
                        return false;
                    }
                    // Another writer's changes grow the task and the
                    // store's changes after its whole record alike.
                    self.bytes += size;
                    self.changes_bytes += size;
                }
                self.version = version;
            }
        }
        true
    }
}

/// The push notifications a write of these pending events makes due: each
/// status and artifact update (spec §4.3: what a stream would carry), to
/// each of the task's configs, in order, written by the same store write
/// (the outbox). Nothing to do, and no encoding, for a task without
/// configs. A protocol 0.3 client's config gets the task instead, once
/// per write ([`crate::lifecycle::Protocol`]).
fn outbox_entries(record: &TaskRecord, pending: &[Pending]) -> Vec<OutboxEntry> {
    use crate::lifecycle::Protocol;
    use prost::Message as _;
    let configs = &record.push_configs;
    let mut events = pending.iter().filter_map(|p| p.out.as_ref()).peekable();
    if configs.is_empty() || events.peek().is_none() {
        return Vec::new();
    }
    let of = |protocol| {
        configs
            .iter()
            .filter(move |c| record.push_protocol(&c.id) == protocol)
    };
    let mut entries = Vec::new();
    // A 0.3 webhook gets the task as this write leaves it, once per write:
    // 0.3 notifications carry the task, not the event.
    if !record.v0_3_push_configs.is_empty() {
        let event = StreamResponse {
            payload: Some(Payload::Task(record.task.clone())),
        }
        .encode_to_vec();
        entries.extend(of(Protocol::V0_3).map(|c| OutboxEntry {
            config_id: c.id.clone(),
            event: event.clone(),
        }));
    }
    if record.v0_3_push_configs.len() < configs.len() {
        for out in events {
            let event = out.encode_to_vec();
            entries.extend(of(Protocol::V1_0).map(|c| OutboxEntry {
                config_id: c.id.clone(),
                event: event.clone(),
            }));
        }
    }
    entries
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
    key: TaskKey,
    shared: Weak<Shared>,
    /// `None` until loaded from the store (or after a failed write).
    state: tokio::sync::Mutex<Option<Loaded>>,
    pub(crate) progress: watch::Sender<Progress>,
    /// Locked after `state` when both are held, never across an await.
    runs: Mutex<Runs>,
    /// The run executing or last executed (numbered from 1; 0: none yet).
    /// An atomic beside `runs` rather than in it: every event is tagged
    /// with it and reads it without that lock.
    current_run: std::sync::atomic::AtomicU64,
    /// Marked as watched in a store shared by replicas
    /// ([`crate::store::TaskStore::watch`]): unmarked when dropped.
    watched: std::sync::atomic::AtomicBool,
    /// Catch-ups asked for and not yet begun by the one running
    /// ([`LiveTask::catch_up`]); one runs while this is above 0.
    catching_up: std::sync::atomic::AtomicU64,
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.forget(&self.key);
            if self.watched.load(std::sync::atomic::Ordering::Relaxed)
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                let (store, key) = (shared.store.clone(), self.key.clone());
                runtime.spawn(async move {
                    if let Err(e) = store.watch(&key.tenant, &key.id, false).await {
                        tracing::debug!(task_id = %key.id, error = %e, "could not stop watching a task");
                    }
                });
            }
        }
    }
}

fn policy(shared: &Shared, author: Author) -> TransitionPolicy {
    match author {
        Author::Agent { .. } => shared.config.policy,
        Author::Server(_) => TransitionPolicy::Permissive,
    }
}

impl Author {
    /// What the transition log records as the cause of a state this
    /// author writes ([`crate::lifecycle::transitions`]).
    fn cause(self) -> Cause {
        match self {
            Author::Agent { follow_up: false } => Cause::Agent,
            Author::Agent { follow_up: true } => Cause::FollowUp,
            Author::Server(cause) => cause,
        }
    }

    fn is_agent(self) -> bool {
        matches!(self, Author::Agent { .. })
    }
}

/// Who produced an event (its author; "origin" is kept for the message
/// that created a task). The configured transition policy binds agents;
/// the server's own safety transitions (CANCELED on CancelTask, FAILED when
/// an executor fails) are checked only by the permissive rules (nothing out
/// of a terminal state), so a strict policy can never leave a task stuck.
/// The server says why it writes (the transition log's cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Author {
    /// The agent, in a run; `follow_up`: a run a follow-up message started.
    Agent {
        follow_up: bool,
    },
    Server(Cause),
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
            if shared.replicated && !self.watched.load(std::sync::atomic::Ordering::Relaxed) {
                shared
                    .store
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
            self.progress.send_modify(|p| p.state = state);
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
        author: Author,
    ) -> Result<Commit, ApplyFailure> {
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
        let out = loaded.record.apply_logged(
            event.clone(),
            now(),
            policy(shared, author),
            author.cause(),
            &mut changes,
        )?;
        loaded.bytes += added;
        let (tx, rx) = oneshot::channel();
        // Read without the runs lock: set only under this task's lock
        // (held here), on every event.
        let run = self.current_run.load(std::sync::atomic::Ordering::Relaxed);
        loaded.pending.push(Pending {
            event,
            changes,
            author,
            run,
            follow_up: None,
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

    /// Commits accepted events in order, one store write per round, until
    /// none are left: take the next write under the lock, write it without
    /// the lock, then publish what it committed (or handle its failure)
    /// under the lock again.
    async fn flush(self: Arc<Self>, shared: Arc<Shared>) {
        // Pending events seen at the last look, while the emitter was still
        // adding to them.
        let mut seen = 0;
        loop {
            // Let the emitter that started this flush go on first: events it
            // emits right away join this write instead of needing another.
            tokio::task::yield_now().await;
            let (write, version, count, changes) = match self.next_write(&mut seen, &shared).await {
                NextWrite::Done => return,
                NextWrite::Gather => continue,
                NextWrite::Write {
                    write,
                    version,
                    count,
                    changes,
                } => (write, version, count, changes),
            };
            // Version 0: the task is new, and this write creates it.
            // Timed only when counted (a clock read per write otherwise).
            let started = shared.store_metrics.is_some().then(std::time::Instant::now);
            let result = if version == 0 {
                shared.store.create_encoded(&self.key.tenant, &write).await
            } else {
                shared
                    .store
                    .update_encoded(&self.key.tenant, &write, version)
                    .await
            };
            if let (Some(metrics), Some(started)) = (&shared.store_metrics, started) {
                metrics.written(started.elapsed(), result.is_ok());
            }
            let mut guard = self.state.lock().await;
            let Some(loaded) = guard.as_mut() else { return };
            let go_on = match result {
                Ok(version) => {
                    self.committed(&shared, loaded, &write, version, count, changes);
                    true
                }
                Err(e) => self.write_failed(&shared, loaded, version, e).await,
            };
            if !go_on {
                *guard = None;
                return;
            }
        }
    }

    /// What the flush writes next: nothing (and the flush ends), nothing
    /// yet (events are still arriving), or the task with its pending
    /// events, encoded under the lock (no copy of the task itself): what
    /// they changed, or the whole task (a create, a terminal write, or
    /// once the changes since the last whole write outweigh it, see
    /// [`MIN_CHANGES_BEFORE_WHOLE`]); with a store shared by replicas,
    /// their stream events too.
    async fn next_write(&self, seen: &mut usize, shared: &Shared) -> NextWrite {
        use prost::Message as _;
        let mut guard = self.state.lock().await;
        let Some(loaded) = guard.as_mut() else {
            return NextWrite::Done;
        };
        if loaded.pending.is_empty() {
            loaded.flushing = false;
            return NextWrite::Done;
        }
        // Events arrived since the last look: the emitter is producing as
        // fast as it runs, so wait one more turn (up to FLUSH_BATCH_EVENTS)
        // and commit them together. Committing each turn's one or two
        // events instead made every subscriber's stream wake, encode and
        // write per event (measured with 64 subscribers: 8 times the socket
        // writes of a plain broadcast, and 2.5 times its CPU per event). An
        // emitter that pauses is committed after one extra turn; a task
        // already terminal has nothing more coming.
        let n = loaded.pending.len();
        if n > *seen && n < FLUSH_BATCH_EVENTS && !loaded.record.state().is_terminal() {
            *seen = n;
            return NextWrite::Gather;
        }
        *seen = 0;
        let mut changes: Vec<Change> = loaded
            .pending
            .iter_mut()
            .flat_map(|p| std::mem::take(&mut p.changes))
            .collect();
        // The trace is set on the working copy, not through an event.
        let committed = loaded.committed.as_ref().unwrap_or(&loaded.record);
        if committed.trace != loaded.record.trace {
            changes.push(Change::Trace(loaded.record.trace.clone()));
        }
        let changes = Changes::new(changes);
        let changed = changes.encoded_len();
        let whole = loaded.version == 0
            || !shared.keeps_changes
            || loaded.record.state().is_terminal()
            || loaded.changes_bytes + changed >= loaded.whole_bytes.max(MIN_CHANGES_BEFORE_WHOLE);
        let body = if whole {
            Body::Whole(crate::store::codec::encode(&loaded.record).into())
        } else {
            Body::Changes(changes.encode_to_vec().into())
        };
        // A whole write of a running task logs its changes too, for the
        // replicas following it ([`EncodedTask::logged`]); a terminal one
        // does not: a finished task is kept as one record.
        let logged = (whole
            && shared.replicated
            && shared.keeps_changes
            && loaded.version > 0
            && !loaded.record.state().is_terminal())
        .then(|| changes.encode_to_vec().into());
        let mut write = EncodedTask::of(&loaded.record, body);
        write.logged = logged;
        write.outbox = outbox_entries(&loaded.record, &loaded.pending);
        write.by_run = loaded.pending.iter().any(|p| p.author.is_agent());
        // At most MAX_QUEUED_MESSAGES of them.
        let follow_ups = loaded.pending.iter().filter(|p| p.follow_up.is_some());
        write.owes_runs = u16::try_from(follow_ups.count()).unwrap_or(u16::MAX);
        if shared.replicated {
            write.events = crate::store::codec::encode_events(
                loaded.pending.iter().filter_map(|p| p.out.as_ref()),
            );
        }
        NextWrite::Write {
            write: Box::new(write),
            version: loaded.version,
            count: loaded.pending.len(),
            changes,
        }
    }

    /// The first `count` pending events are committed at `version`:
    /// broadcast them, tell their waiters, answer a creating request, and
    /// admit the follow-up runs they carried.
    fn committed(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
        write: &EncodedTask,
        version: u64,
        count: usize,
        changes: Changes,
    ) {
        loaded.version = version;
        match &write.body {
            Body::Whole(record) => {
                loaded.bytes = record.len();
                loaded.whole_bytes = record.len();
                loaded.changes_bytes = 0;
            }
            Body::Changes(changed) => loaded.changes_bytes += changed.len(),
        }
        if !write.outbox.is_empty() {
            shared.outbox.notify_one();
        }
        // The committed copy takes the write's changes (present while
        // events were pending).
        if let Some(committed) = &mut loaded.committed
            && let Err(e) = committed.replay_all(changes)
        {
            // Changes this process logged itself: not expected. The
            // working copy is the closest truth there is.
            tracing::error!(task_id = %self.key.id, error = %e, "the committed copy could not take a write's changes");
            loaded.committed = None;
        }
        let done: Vec<Pending> = loaded.pending.drain(..count).collect();
        if let Some(metrics) = &shared.config.metrics {
            count_committed(
                metrics,
                shared.agent_label(&self.key.tenant),
                version,
                &done,
            );
        }
        let mut follow_ups = false;
        for p in done {
            self.publish(loaded, p.run, p.out);
            for n in p.notify {
                let _ = n.send(Ok(()));
            }
            if let Some(answer) = p.answer {
                answer.deliver(Ok(()), shared);
            }
            if let Some(seq) = p.follow_up {
                follow_ups = true;
                self.runs().mark_committed(seq);
            }
        }
        // A follow-up became ready, or a queue waits on a state just
        // committed (terminal: it is dropped).
        if follow_ups || (loaded.record.state().is_terminal() && !self.runs().queue.is_empty()) {
            self.dispatch_locked(shared, loaded);
        }
    }

    /// A write made from `version` failed with `e`: the pending events are
    /// rebased (another writer moved the task) or dropped, and their
    /// waiters told. False when the task is gone from memory (a create that
    /// failed, or a reload that did), which ends the flush.
    async fn write_failed(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
        version: u64,
        e: StoreError,
    ) -> bool {
        match e {
            e if version == 0 => {
                // The create was refused (a repeat of the same message, or
                // the store failed): the task never existed.
                self.drop_pending(shared, loaded, e);
                false
            }
            StoreError::Conflict { .. } => {
                // Another writer moved the task: rebase what is pending on
                // the stored copy, or drop it all if it no longer applies.
                if let Err(e) = self.rebase(shared, loaded).await {
                    let restorable = loaded.committed.is_some();
                    self.drop_pending(shared, loaded, e);
                    // Nothing to restore the working copy from: forgotten,
                    // read again at its next use.
                    return restorable;
                }
                true
            }
            e => {
                tracing::error!(task_id = %self.key.id, error = %e, "task write failed");
                self.drop_pending(shared, loaded, e);
                // The working copy held the dropped events: reload.
                match shared.store.get(&self.key.tenant, &self.key.id).await {
                    Ok(Some(stored)) => {
                        loaded.reload(stored.record, stored.version);
                        true
                    }
                    _ => false,
                }
            }
        }
    }

    /// After a version conflict: catches up with the stored task (its
    /// writers' events reach this replica's subscribers first, as they
    /// were committed first) and re-applies the pending events to it.
    async fn rebase(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
    ) -> Result<(), StoreError> {
        let up = shared
            .store
            .catch_up(&self.key.tenant, &self.key.id, loaded.version)
            .await?
            .ok_or_else(|| StoreError::NotFound(self.key.id.clone()))?;
        let (expected, actual) = (loaded.version, up.version);
        self.absorb_committed(shared, loaded, up).await?;
        // A copy to re-apply the pending events on: a whole task, but only
        // after a conflict (two writers of one task at once), not per write.
        let mut record = loaded.committed_record().clone();
        let mut outs = Vec::with_capacity(loaded.pending.len());
        for p in &mut loaded.pending {
            // A client message another replica took first (the same
            // message sent to both): it is not added twice, and the
            // request is answered as a repeat (`send_follow_up`).
            if let TaskEvent::UserMessage(m) = &p.event
                && Self::holds_message_in(&record, &m.message_id)
            {
                return Err(StoreError::Conflict {
                    id: format!(
                        "{} (message {:?} is already in its history)",
                        self.key.id, m.message_id
                    ),
                    expected,
                    actual,
                });
            }
            p.changes.clear();
            let out = record
                .apply_logged(
                    p.event.clone(),
                    now(),
                    policy(shared, p.author),
                    p.author.cause(),
                    &mut p.changes,
                )
                .map_err(|e| StoreError::Conflict {
                    id: format!("{} ({e})", self.key.id),
                    expected,
                    actual,
                })?;
            outs.push(out);
        }
        for (p, out) in loaded.pending.iter_mut().zip(outs) {
            p.out = out;
        }
        loaded.record = record;
        Ok(())
    }

    /// Takes another writer's commits in (`up`): publishes their events to
    /// this replica's subscribers (or has them resynchronise when the
    /// store could not give them all), makes the stored task the committed
    /// copy ([`Loaded::take_committed`]), and stops the run here if the
    /// task ended elsewhere (a cancel on another replica).
    async fn absorb_committed(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
        up: crate::store::CatchUp,
    ) -> Result<(), StoreError> {
        let run = self.current_run.load(std::sync::atomic::Ordering::Relaxed);
        let mut complete = up.complete;
        if complete {
            for event in up.events {
                self.publish(loaded, run, Some(event));
            }
        }
        tracing::debug!(
            task_id = %self.key.id,
            version = up.version,
            read = match &up.task {
                Caught::Whole(_) => "whole",
                Caught::Changes(_) => "changes",
            },
            "caught up with the task's writes elsewhere"
        );
        if !loaded.take_committed(up.task, up.version) {
            // Changes that do not follow from the copy held: whatever it
            // missed, the store's whole task is the truth.
            tracing::error!(task_id = %self.key.id, "a task's stored changes did not follow from the copy held; read whole");
            let stored = shared
                .store
                .get(&self.key.tenant, &self.key.id)
                .await?
                .ok_or_else(|| StoreError::NotFound(self.key.id.clone()))?;
            complete &= stored.version == up.version;
            loaded.take_committed(Caught::Whole(Box::new(stored.record)), stored.version);
        }
        if !complete
            && let Some(tx) = &loaded.events
            && tx.receiver_count() > 0
        {
            let _ = tx.send(Arc::new(Signal::Resync));
        }
        let state = loaded.committed_state();
        self.progress.send_modify(|p| p.state = state);
        if state.is_terminal()
            && let Some(token) = self.runs().cancel.take()
        {
            token.cancel();
        }
        Ok(())
    }

    /// With a store shared by replicas, once this replica's run of the
    /// task has ended while something here still follows it (a stream, a
    /// waiting request): the next run may be another replica's, so the
    /// task is watched from now on, and caught up once the watch is in
    /// place (a write between the run's end and the watch is announced to
    /// nobody).
    fn watch_if_followed(self: &Arc<Self>, shared: &Arc<Shared>) {
        use std::sync::atomic::Ordering::Relaxed;
        if !shared.replicated || self.watched.load(Relaxed) {
            return;
        }
        let followed = self.progress.receiver_count() > 0
            || self.state.try_lock().map_or(true, |g| {
                g.as_ref()
                    .and_then(|l| l.events.as_ref())
                    .is_some_and(|tx| tx.receiver_count() > 0)
            });
        if !followed {
            return;
        }
        let (live, shared) = (self.clone(), shared.clone());
        tokio::spawn(async move {
            match shared
                .store
                .watch(&live.key.tenant, &live.key.id, true)
                .await
            {
                Ok(()) => {
                    live.watched.store(true, Relaxed);
                    live.catch_up(shared).await;
                }
                Err(e) => {
                    tracing::debug!(task_id = %live.key.id, error = %e, "could not watch a task; followed by the periodic look")
                }
            }
        });
    }

    /// Whether the cached task is older than `version` (and not being
    /// written here: a write of this replica's would see the conflict and
    /// catch up itself).
    pub(crate) fn behind(&self, version: u64) -> bool {
        match self.state.try_lock() {
            Ok(guard) => guard
                .as_ref()
                .is_some_and(|l| l.version < version && !l.flushing),
            // Busy: look again properly.
            Err(_) => true,
        }
    }

    /// Whether another replica may be changing this task while something
    /// here follows it: loaded, no run of its own going on here, and
    /// watched by a stream or a waiting request.
    pub(crate) fn followed_remotely(&self) -> bool {
        {
            let runs = self.runs();
            if runs.active {
                return false;
            }
            // Waiting for another replica's run to end (a claim refused).
            if runs.waiting() {
                return true;
            }
        }
        let Ok(guard) = self.state.try_lock() else {
            return false;
        };
        let Some(loaded) = guard.as_ref() else {
            return false;
        };
        !loaded.record.state().is_terminal()
            && (self.progress.receiver_count() > 0
                || loaded
                    .events
                    .as_ref()
                    .is_some_and(|tx| tx.receiver_count() > 0))
    }

    /// Brings the cached task up to the store after another replica wrote
    /// it ([`super::TaskManager::follow_changes`]). One at a time: asked
    /// for while one runs (a notification per write of a busy task), it
    /// only has the running one look once more when done. Concurrent
    /// catch-ups would each read the same writes from the same version,
    /// all but one for nothing, more of them the longer a read takes.
    pub(crate) async fn catch_up(self: Arc<Self>, shared: Arc<Shared>) {
        use std::sync::atomic::Ordering::AcqRel;
        if self.catching_up.fetch_add(1, AcqRel) > 0 {
            // One is running: it looks again after its read.
            return;
        }
        loop {
            let asked = self.catching_up.load(std::sync::atomic::Ordering::Acquire);
            self.catch_up_once(&shared).await;
            // Asked for again since this one began: one more look, which
            // reads from the version this one reached.
            if self
                .catching_up
                .compare_exchange(asked, 0, AcqRel, std::sync::atomic::Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }

    /// One catch-up ([`LiveTask::catch_up`]): read outside the lock, taken
    /// in only if nothing changed the cache meanwhile (else whatever did
    /// catches up, or the next look does).
    async fn catch_up_once(self: &Arc<Self>, shared: &Arc<Shared>) {
        let from = {
            let guard = self.state.lock().await;
            match guard.as_ref() {
                Some(l) if l.pending.is_empty() && !l.flushing => l.version,
                _ => return,
            }
        };
        let up = match shared
            .store
            .catch_up(&self.key.tenant, &self.key.id, from)
            .await
        {
            Ok(Some(up)) if up.version > from => up,
            Ok(_) => {
                // Nothing new, but a queued run may wait for a claim
                // another replica has released since (or just taken).
                if self.runs().waiting()
                    && let Ok(mut guard) = self.lock_loaded(shared).await
                {
                    self.dispatch_locked(shared, guard.as_mut().expect("loaded"));
                }
                return;
            }
            Err(e) => {
                tracing::debug!(task_id = %self.key.id, error = %e, "catching up failed; retried at the next look");
                return;
            }
        };
        let mut guard = self.state.lock().await;
        let Some(loaded) = guard.as_mut() else { return };
        if loaded.version != from || !loaded.pending.is_empty() || loaded.flushing {
            return;
        }
        if let Err(e) = self.absorb_committed(shared, loaded, up).await {
            tracing::debug!(task_id = %self.key.id, error = %e, "catching up failed; retried at the next look");
            return;
        }
        self.dispatch_locked(shared, loaded);
    }

    /// Drops every pending event after a failed commit: their waiters get
    /// the error, open streams end with it (they must not hang waiting for
    /// events that were never recorded), blocking waiters wake up, and the
    /// agent hears of it at its next event.
    fn drop_pending(self: &Arc<Self>, shared: &Arc<Shared>, loaded: &mut Loaded, e: StoreError) {
        // Only an agent that lost events must hear of it; a client whose
        // message was dropped is told by its own request.
        let agent_lost = loaded.pending.iter().any(|p| p.author.is_agent());
        for p in loaded.pending.drain(..) {
            for n in p.notify {
                let _ = n.send(Err(e.clone()));
            }
            if let Some(answer) = p.answer {
                answer.deliver(Err(&e), shared);
            }
            if let Some(seq) = p.follow_up {
                // Its message never reached history (or another replica
                // took it): no run for it here. With nothing before it
                // still to run, waiters may count it as over.
                let mut runs = self.runs();
                runs.queue.retain(|q| q.seq != seq);
                if !runs.active && runs.queue.iter().all(|q| q.seq > seq) {
                    drop(runs);
                    self.progress
                        .send_modify(|p| p.runs_finished = p.runs_finished.max(seq));
                }
            }
        }
        if let Some(tx) = &loaded.events {
            let _ = tx.send(Arc::new(Signal::Failed(store_error(e.clone()))));
        }
        // Back to the committed copy (always present while events were
        // pending).
        if let Some(record) = &loaded.committed {
            loaded.record = record.clone();
        }
        if agent_lost {
            loaded.failure = Some(e);
        }
        // The working copy held the dropped events: it is the committed
        // copy again (the task as stored at `version`), so that nothing
        // here answers from or builds on events never recorded (the fault
        // harness met a retried follow-up answered as already taken, from
        // a copy that held it after its write was dropped). Without a
        // committed copy (it could not be kept in step) the caller reads
        // the store again or forgets the task.
        if let Some(committed) = loaded.committed.take() {
            let version = loaded.version;
            loaded.reload(committed, version);
        }
        self.progress.send_modify(|p| p.write_failures += 1);
        // The queue may now start (its head was dropped, or a terminal
        // state that held it back was).
        self.dispatch_locked(shared, loaded);
    }

    fn publish(&self, loaded: &mut Loaded, run: u64, out: Option<StreamResponse>) {
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
        let events = subscribe.then(|| self.subscribe_locked(loaded));
        let (run, idle) = {
            let runs = self.runs();
            (run.unwrap_or(runs.reserved), runs.idle())
        };
        let run_started = self.status_from_run(run);
        TaskHandle {
            live: self.clone(),
            snapshot: task_view(&loaded.task(), history, true),
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

    /// Claims the task's runs for the queued run waiting here
    /// ([`crate::store::TaskStore::claim_run`]), then dispatches it. While
    /// another replica holds them, the run waits: its release is announced
    /// ([`super::TaskManager::follow_changes`]), and the claim is tried
    /// again at every look at followed tasks in any case.
    async fn claim_runs(self: Arc<Self>, shared: Arc<Shared>) {
        let claimed = shared.store.claim_run(&self.key.tenant, &self.key.id).await;
        self.runs().claim = match claimed {
            Ok(Some(_)) => RunClaim::Ready,
            _ => RunClaim::Free,
        };
        match claimed {
            // The previous holder's last writes may not be here yet: the
            // run starts from the task as it is now.
            Ok(Some(version)) if self.behind(version) => {
                self.catch_up(shared).await;
            }
            Ok(Some(_)) => {
                if let Ok(mut guard) = self.lock_loaded(&shared).await {
                    self.dispatch_locked(&shared, guard.as_mut().expect("loaded"));
                }
            }
            Ok(None) => {
                tracing::debug!(task_id = %self.key.id, "queued run waits for another replica's run");
                self.watch_if_followed(&shared);
            }
            Err(e) => {
                tracing::debug!(task_id = %self.key.id, error = %e, "claiming the task's runs failed; tried again at the next look");
            }
        }
    }

    /// Releases the task's runs ([`crate::store::TaskStore::release_run`]),
    /// retried with backoff while the store refuses (a replica holding
    /// them would keep every other from running the task), then dispatches
    /// whatever was queued here meanwhile.
    async fn release_runs(self: Arc<Self>, shared: Arc<Shared>) {
        let mut delay = FAIL_RETRY_FIRST;
        while let Err(e) = shared
            .store
            .release_run(&self.key.tenant, &self.key.id)
            .await
        {
            tracing::warn!(task_id = %self.key.id, error = %e, retry_in = ?delay, "releasing the task's runs failed");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                // The lease ends with the process; so does the claim.
                _ = shared.shutdown.cancelled() => break,
            }
            delay = (delay * 2).min(FAIL_RETRY_MAX);
        }
        self.runs().claim = RunClaim::Free;
        if let Ok(mut guard) = self.lock_loaded(&shared).await {
            self.dispatch_locked(&shared, guard.as_mut().expect("loaded"));
        }
    }

    /// Gives back the task's runs the orphan sweep took
    /// ([`crate::store::TaskStore::take_runs`]) without ending the task,
    /// as after a run, unless a run of this process claims them
    /// meanwhile (it releases them itself).
    pub(crate) fn give_back_taken_runs(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut runs = self.runs();
        if runs.claim == RunClaim::Free {
            runs.claim = RunClaim::Releasing;
            drop(runs);
            tokio::spawn(self.clone().release_runs(shared.clone()));
        }
    }

    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
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

    fn holds_message_in(record: &TaskRecord, message_id: &str) -> bool {
        record
            .task
            .history
            .iter()
            .any(|m| m.message_id == message_id && m.role == crate::proto::Role::User as i32)
    }

    /// How many follow-up messages wait for a run.
    pub(crate) fn queued(&self) -> usize {
        self.runs().queue.len()
    }

    /// Whether a queued run here waits for the claim on the task's runs,
    /// which another replica holds: worth trying again after any change.
    pub(crate) fn waits_to_run(&self) -> bool {
        let runs = self.runs();
        runs.waiting() && runs.claim == RunClaim::Free
    }

    /// The first run of a new task, started by its creating message.
    pub(crate) fn begin_first_run(&self, cancel: CancellationToken) {
        let mut runs = self.runs();
        runs.active = true;
        // A create holds its task for the first run (on a store of one
        // process the claim is never looked at).
        runs.claim = RunClaim::Held;
        self.current_run
            .store(1, std::sync::atomic::Ordering::Relaxed);
        runs.reserved = 1;
        runs.cancel = Some(cancel);
        drop(runs);
        self.progress.send_modify(|p| {
            p.runs_started = 1;
            p.run_status_seq = p.status_seq;
        });
    }

    /// Reserves the run of the follow-up message just submitted under
    /// `guard` (so runs are numbered in history order); it starts once that
    /// message is committed and every earlier run has ended. Returns the
    /// run's number.
    pub(crate) fn queue_run_locked(&self, guard: &mut StateGuard<'_>, request: RunRequest) -> u64 {
        let mut runs = self.runs();
        runs.reserved += 1;
        let seq = runs.reserved;
        runs.queue.push_back(Queued {
            seq,
            request,
            committed: false,
        });
        drop(runs);
        if let Some(last) = guard.as_mut().and_then(|l| l.pending.last_mut()) {
            last.follow_up = Some(seq);
        }
        seq
    }

    /// Makes a task the store would not let the runtime fail FAILED once
    /// the store takes it (a full disk, a lost database): retried in the
    /// background with backoff ([`FAIL_RETRY_FIRST`] doubling up to
    /// [`FAIL_RETRY_MAX`]) while the task is active, so no task is left
    /// SUBMITTED or WORKING with nothing to move it on. Its streams already
    /// ended with the store's error when the write failed.
    pub(crate) fn fail_until_stored(
        self: Arc<Self>,
        shared: Arc<Shared>,
        message: String,
        cause: Cause,
    ) {
        tokio::spawn(async move {
            let mut delay = FAIL_RETRY_FIRST;
            loop {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(FAIL_RETRY_MAX);
                match self.fail_if_active(&shared, &message, cause).await {
                    Ok(failed) => {
                        if failed {
                            tracing::info!(task_id = %self.key.id, "task failed after the store recovered");
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(task_id = %self.key.id, error = %e, retry_in = ?delay, "store still refuses the task's failure");
                    }
                }
            }
        });
    }

    /// The server's own FAILED, with `message` as the status message, for a
    /// task still SUBMITTED or WORKING (recovery, shutdown, a failed store):
    /// committed before this returns. `Ok(false)`: the task was not active.
    pub(crate) async fn fail_if_active(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        message: &str,
        cause: Cause,
    ) -> Result<bool, A2aError> {
        self.fail_when(shared, message, cause, |r| r.state().is_active())
            .await
    }

    /// FAILS the task with `message` if, under its lock, `now_due` holds
    /// of its record; whether it did. `cause` is why, for the transition
    /// log.
    pub(crate) async fn fail_when(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        message: &str,
        cause: Cause,
        now_due: impl FnOnce(&TaskRecord) -> bool,
    ) -> Result<bool, A2aError> {
        let state = self.lock_loaded(shared).await?;
        if !now_due(&state.as_ref().expect("loaded").record) {
            return Ok(false);
        }
        let event = super::server_status(TaskState::Failed, message);
        self.apply(shared, state, event, Author::Server(cause))
            .await?;
        Ok(true)
    }

    /// Fails the task, still interrupted, for a follow-up's run that a
    /// dead replica owed it, unless a run of this process has taken the
    /// task up: a run starts under the task's lock (`dispatch_locked`),
    /// so it cannot start between the look and the write.
    pub(crate) async fn fail_lost_follow_up(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        message: &str,
        cause: Cause,
    ) -> Result<bool, A2aError> {
        self.fail_when(shared, message, cause, |r| {
            r.state().is_interrupted() && !self.runs().active
        })
        .await
    }

    /// The current run ended: starts the next queued one, if any may run.
    pub(crate) async fn finish_run(self: &Arc<Self>, shared: &Arc<Shared>) {
        let ended = {
            let mut runs = self.runs();
            runs.active = false;
            runs.cancel = None;
            self.current_run.load(std::sync::atomic::Ordering::Relaxed)
        };
        self.progress
            .send_modify(|p| p.runs_finished = p.runs_finished.max(ended));
        self.watch_if_followed(shared);
        if let Err(e) = self.try_dispatch(shared).await {
            // Read again with backoff, off the run that ended.
            tracing::warn!(task_id = %self.key.id, error = %e, "queued runs wait: task unreadable; reading it again");
            tokio::spawn(self.clone().dispatch_when_readable(shared.clone()));
        }
    }

    /// Starts the next queued run if the task can be read; the store's
    /// error when it cannot and a queued run waits. A task that no longer
    /// exists (purged, or never stored) drops its queue: its waiters are
    /// told their runs ended.
    async fn try_dispatch(self: &Arc<Self>, shared: &Arc<Shared>) -> Result<(), A2aError> {
        match self.lock_loaded(shared).await {
            Ok(mut guard) => {
                let loaded = guard.as_mut().expect("loaded");
                self.dispatch_locked(shared, loaded);
                Ok(())
            }
            Err(e) if self.runs().queue.is_empty() => {
                tracing::debug!(task_id = %self.key.id, error = %e, "task unreadable after its run; nothing queued");
                Ok(())
            }
            Err(e @ A2aError::TaskNotFound { .. }) => {
                tracing::error!(task_id = %self.key.id, error = %e, "queued runs dropped: task not found");
                self.drop_queue();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the task again, with backoff, until its queued runs can be
    /// dispatched. Its queued messages are committed and acknowledged:
    /// dropping them because the store could not be read for a moment (a
    /// restart, a cut, this replica's lease lapsed) would leave them in
    /// history unanswered for good (measured by the fault harness: an
    /// acknowledged follow-up never ran after "early eof" from a
    /// restarting PostgreSQL). Shutdown drops them, as it ends every run.
    async fn dispatch_when_readable(self: Arc<Self>, shared: Arc<Shared>) {
        let mut delay = FAIL_RETRY_FIRST;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shared.shutdown.cancelled() => {
                    self.drop_queue();
                    return;
                }
            }
            match self.try_dispatch(&shared).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(task_id = %self.key.id, error = %e, retry_in = ?delay, "queued runs still wait: task unreadable");
                }
            }
            delay = (delay * 2).min(FAIL_RETRY_MAX);
        }
    }

    /// Drops every queued run; their waiters are told they ended.
    fn drop_queue(&self) {
        let dropped = {
            let mut runs = self.runs();
            runs.queue.clear();
            runs.reserved
        };
        self.progress
            .send_modify(|p| p.runs_finished = p.runs_finished.max(dropped));
    }

    /// Starts the next queued run when none is active and its message is
    /// committed. A terminal task starts none: its queued messages stay in
    /// history, unanswered; one about to be terminal starts none either. When
    /// nothing runs or waits and the task is interrupted, open streams are
    /// told the task is idle.
    fn dispatch_locked(self: &Arc<Self>, shared: &Arc<Shared>, loaded: &mut Loaded) {
        let mut runs = self.runs();
        if runs.active {
            return;
        }
        if loaded.committed_state().is_terminal() {
            if !runs.queue.is_empty() {
                runs.queue.clear();
                let dropped = runs.reserved;
                drop(runs);
                self.progress
                    .send_modify(|p| p.runs_finished = p.runs_finished.max(dropped));
            }
            return;
        }
        if loaded.record.state().is_terminal() {
            // About to be terminal (a cancel not yet committed): start
            // nothing, and keep the queue until the commit decides. The
            // flush dispatches again after it, and so does a failed write.
            return;
        }
        if shared.replicated && loaded.committed_state().is_active() {
            // Another replica's run has the task (this one has none):
            // the next run starts once that one has ended, caught up.
            return;
        }
        if shared.replicated && runs.claim != RunClaim::Ready {
            // Another replica may hold the task for a run of a message it
            // got: claim the runs first (each replica saw the task not
            // active, so the state alone would let both start one). Held
            // already, the claim still settles the run it starts.
            if runs.waiting() && matches!(runs.claim, RunClaim::Free | RunClaim::Held) {
                runs.claim = RunClaim::Claiming;
                drop(runs);
                tokio::spawn(self.clone().claim_runs(shared.clone()));
                return;
            }
            if runs.claim != RunClaim::Held {
                return;
            }
        }
        if runs.queue.front().is_some_and(|q| q.committed) {
            if runs.claim == RunClaim::Ready {
                runs.claim = RunClaim::Held;
            }
            let Queued { seq, request, .. } = runs.queue.pop_front().expect("front");
            let cancelled = shared.run_token();
            runs.active = true;
            self.current_run
                .store(seq, std::sync::atomic::Ordering::Relaxed);
            runs.cancel = Some(cancelled.clone());
            drop(runs);
            self.progress.send_modify(|p| {
                p.runs_started = seq;
                p.run_status_seq = p.status_seq;
            });
            let task = loaded.task().into_owned();
            let ctx = RequestContext {
                tenant: self.key.tenant.clone(),
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                message: request.message,
                task: Some(task),
                metadata: request.metadata,
                accepted_output_modes: request.accepted_output_modes,
                cancelled,
            };
            shared.start_follow_up(self.clone(), request.agent, ctx, &request.trace);
            return;
        }
        if shared.replicated
            && matches!(runs.claim, RunClaim::Held | RunClaim::Ready)
            && !runs.active
        {
            // Nothing to run here and the task interrupted: another
            // replica may run the next message.
            runs.claim = RunClaim::Releasing;
            tokio::spawn(self.clone().release_runs(shared.clone()));
        }
        if runs.idle()
            && loaded.committed_state().is_interrupted()
            && let Some(tx) = &loaded.events
            && tx.receiver_count() > 0
        {
            let _ = tx.send(Arc::new(Signal::Idle));
        }
    }
}

/// Counts a commit at `version` of the events `done`: a task created
/// (version 1), and each state it reached (the created task's, and each
/// status update's).
fn count_committed(
    metrics: &crate::metrics::Metrics,
    agent: &Arc<str>,
    version: u64,
    done: &[Pending],
) {
    if version == 1 {
        metrics.tasks.created(agent);
    }
    for p in done {
        let status = match p.out.as_ref().and_then(|o| o.payload.as_ref()) {
            Some(Payload::Task(t)) => t.status.as_ref(),
            Some(Payload::StatusUpdate(u)) => u.status.as_ref(),
            _ => None,
        };
        if let Some(state) = status.and_then(|s| TaskState::try_from(s.state).ok()) {
            metrics.tasks.reached(agent, state.as_str_name());
        }
    }
}

/// What a flush does next ([`LiveTask::next_write`]).
enum NextWrite {
    /// Nothing is pending: the flush ends.
    Done,
    /// Events are still arriving: look again after a turn.
    Gather,
    /// Write the task, made from `version`, committing `count` events,
    /// which made `changes`.
    Write {
        write: Box<EncodedTask>,
        version: u64,
        count: usize,
        changes: Changes,
    },
}

impl Runs {
    fn mark_committed(&mut self, seq: u64) {
        if let Some(q) = self.queue.iter_mut().find(|q| q.seq == seq) {
            q.committed = true;
        }
    }
}
