//! The task runtime: where requests, executors, the lifecycle core, the store
//! and subscribers meet.
//!
//! [`TaskManager`] owns the live tasks. Every change to a task goes through
//! one per-task lock ([`live::LiveTask`]): the event is applied by the
//! lifecycle core, committed to the store, and only then broadcast to the
//! task's subscribers and waiters. Because subscribing also takes that lock,
//! a subscriber's first item (a Task snapshot) and the live events after it
//! neither lose nor repeat an event (spec §3.1.6, §3.5.2).
//!
//! Executors run one at a time per task (a per-task run lock): a message for
//! a task whose run is still going waits for it to finish.

pub mod live;
pub mod sink;
pub mod stream;

mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use prost_types::Timestamp;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::agent::{AgentRouter, RequestContext};
use crate::error::A2aError;
use crate::lifecycle::history::task_view;
use crate::lifecycle::{HistoryLength, StatusUpdate, TaskEvent, TransitionPolicy};
use crate::proto::{Message, Part, Role, Task, TaskState, part::Content};
use crate::store::{StoreError, TaskStore};
use live::{LiveTask, Origin, Progress};
use sink::SinkMode;

/// How many events a subscriber may fall behind before it is resynchronised
/// with a fresh Task snapshot (see [`stream`]). A slow subscriber never
/// blocks the agent or other subscribers: the per-task broadcast ring drops
/// its oldest events for that subscriber instead.
///
/// One commit publishes at most [`live::MAX_PENDING_EVENTS`] events at once,
/// so twice that lets a subscriber still reading one commit's events take
/// the whole next one. The ring is allocated in full for every streamed
/// task: 1024 slots cost a streamed request about 5% more CPU (measured).
pub const SUBSCRIBER_BUFFER: usize = 2 * live::MAX_PENDING_EVENTS;

/// Default retention of terminal tasks (`serve --retain`).
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// How often the retention sweep runs.
pub const RETENTION_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub policy: TransitionPolicy,
    pub subscriber_buffer: usize,
    /// A task still SUBMITTED or WORKING this long after a run started is
    /// FAILED (`serve --task-timeout`); `None`: no limit.
    pub task_timeout: Option<Duration>,
    /// Terminal tasks whose status is older are purged (`serve --retain`);
    /// `None`: kept forever.
    pub retain: Option<Duration>,
    /// Interval of the retention sweep.
    pub sweep_every: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            policy: TransitionPolicy::default(),
            subscriber_buffer: SUBSCRIBER_BUFFER,
            task_timeout: None,
            retain: Some(DEFAULT_RETAIN),
            sweep_every: RETENTION_SWEEP_INTERVAL,
        }
    }
}

/// A task's identity: tasks are keyed by (tenant, id), so tenants never see
/// each other's tasks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub tenant: String,
    pub id: String,
}

pub(crate) struct Shared {
    pub(crate) store: Arc<dyn TaskStore>,
    pub(crate) agents: AgentRouter,
    pub(crate) config: RuntimeConfig,
    /// foldhash, not SipHash: looked up on every request. An entry exists
    /// only while something holds its task (see the memory store's maps).
    live: Mutex<HashMap<TaskKey, Weak<LiveTask>, foldhash::fast::RandomState>>,
    pub(crate) shutdown: CancellationToken,
}

/// Cheap-to-clone handle over the runtime.
#[derive(Clone)]
pub struct TaskManager {
    shared: Arc<Shared>,
}

/// What a SendMessage produced.
pub enum SendOutcome {
    /// A direct agent reply; no task (spec §3.1.1).
    Message(Message),
    /// A task, new or continued.
    Task(Box<TaskHandle>),
}

/// A task a request is attached to: its snapshot when the request was
/// accepted, and (for streams) the events after that snapshot.
pub struct TaskHandle {
    pub(crate) live: Arc<LiveTask>,
    /// The task as the client should first see it, history trimmed.
    pub snapshot: Task,
    pub(crate) events: Option<broadcast::Receiver<live::Broadcast>>,
    pub(crate) baseline: Progress,
    pub(crate) history: HistoryLength,
    /// The request repeated one already applied and the task is not being
    /// worked on: answer with the snapshot, do not wait or stream further.
    pub(crate) settled: bool,
}

/// The server's clock for status timestamps, in whole microseconds: spec
/// §5.6.1 asks for millisecond precision in JSON, and some clients' ISO 8601
/// parsers stop at six fractional digits; microseconds keep tasks created
/// in the same millisecond in order for ListTasks.
pub fn now() -> Timestamp {
    let mut ts = Timestamp::from(SystemTime::now());
    ts.nanos -= ts.nanos % 1_000;
    ts
}

/// An agent text message, with a fresh id.
pub fn agent_text(text: impl Into<String>) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: Role::Agent as i32,
        parts: vec![Part {
            content: Some(Content::Text(text.into())),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub(crate) fn store_error(err: StoreError) -> A2aError {
    match err {
        StoreError::NotFound(id) => A2aError::TaskNotFound { task_id: id },
        StoreError::Unavailable(m) => A2aError::Unavailable(m),
        other => A2aError::Internal(other.to_string()),
    }
}

impl TaskManager {
    pub fn new(store: Arc<dyn TaskStore>, agents: AgentRouter, config: RuntimeConfig) -> Self {
        TaskManager {
            shared: Arc::new(Shared {
                store,
                agents,
                config,
                live: Mutex::new(HashMap::default()),
                shutdown: CancellationToken::new(),
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.shared.store
    }

    pub fn agents(&self) -> &AgentRouter {
        &self.shared.agents
    }

    /// How many tasks are held in memory right now (running, streamed or
    /// in a request). Finished, unobserved tasks live only in the store.
    pub fn live_task_count(&self) -> usize {
        self.shared.live.lock().expect("live map poisoned").len()
    }

    /// Fired on graceful shutdown: open streams end, executors are cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// The live handle of a task, created (unloaded) if none exists. Two
    /// callers for the same key always get the same handle, so there is one
    /// lock per task.
    pub(crate) fn live(&self, tenant: &str, id: &str) -> Arc<LiveTask> {
        self.shared.live(TaskKey {
            tenant: tenant.to_owned(),
            id: id.to_owned(),
        })
    }

    /// Accepts a client message (already validated) for `tenant`.
    /// With a `task_id` it continues that task; otherwise the agent decides
    /// between a task and a direct reply. `subscribe` attaches the event
    /// stream to the returned handle.
    pub async fn send_message(
        &self,
        tenant: &str,
        message: Message,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<SendOutcome, A2aError> {
        let agent = self.shared.agents.route(tenant).ok_or_else(|| {
            A2aError::invalid(
                "tenant",
                format!(
                    "no agent is served under tenant {tenant:?}; served tenants: {:?}",
                    self.shared.agents.tenants()
                ),
            )
        })?;
        if message.task_id.is_empty() {
            // Idempotent sends: the store refuses a second task created by
            // the same (tenant, message_id), and the run then answers with
            // the first task (see `EventSink::create_task`). Checking at
            // creation rather than before costs nothing on the common path
            // and also settles concurrent repeats.
            return run::start_new(&self.shared, agent, tenant, message, history, subscribe).await;
        }

        // Continue an existing task (spec §3.4.3).
        let live = self.live(tenant, &message.task_id);
        // A repeat of a message the task already holds is answered with the
        // task, whatever its state, without a second run.
        if live
            .holds_message(&self.shared, &message.message_id)
            .await?
        {
            return live
                .duplicate_handle(&self.shared, history, subscribe)
                .await;
        }
        // One run at a time per task: wait for the previous run to end.
        let run_guard = live.run_lock.clone().lock_owned().await;
        if live
            .holds_message(&self.shared, &message.message_id)
            .await?
        {
            return live
                .duplicate_handle(&self.shared, history, subscribe)
                .await;
        }
        let mut state = live.lock_loaded(&self.shared).await?;
        let loaded = state.as_mut().expect("loaded");
        let task = &loaded.record.task;
        let current = loaded.record.state();
        if current.is_terminal() {
            return Err(A2aError::unsupported(
                format!(
                    "task {:?} is in terminal state {} and accepts no more messages",
                    task.id,
                    current.as_str_name()
                ),
                Some(&task.id),
            ));
        }
        if !message.context_id.is_empty() && message.context_id != task.context_id {
            return Err(A2aError::invalid(
                "message.context_id",
                format!(
                    "context_id {:?} does not match task {:?}, whose context_id is {:?}",
                    message.context_id, task.id, task.context_id
                ),
            ));
        }
        let mut message = message;
        message.context_id = task.context_id.clone();
        // The client is told (snapshot, stream) only once the message is
        // committed.
        live.apply(
            &self.shared,
            state,
            TaskEvent::UserMessage(message.clone()),
            Origin::Server,
        )
        .await?;
        let mut state = live.lock_loaded(&self.shared).await?;
        let loaded = state.as_mut().expect("loaded");
        let handle = live.handle(loaded, history, subscribe);
        let ctx = RequestContext {
            tenant: tenant.to_owned(),
            task_id: loaded.task().id.clone(),
            context_id: loaded.task().context_id.clone(),
            message,
            task: Some(loaded.task().into_owned()),
            cancelled: self.shared.shutdown.child_token(),
        };
        live.set_run_cancel(Some(ctx.cancelled.clone()));
        drop(state);
        let mode = SinkMode::Live {
            live: live.clone(),
            _run_guard: Some(run_guard),
            answer: None,
        };
        run::spawn(&self.shared, agent, ctx, mode);
        Ok(SendOutcome::Task(Box::new(handle)))
    }

    /// Waits until the task reaches a terminal state, or an interrupted state
    /// set after the request was accepted, or the run ends (spec §3.2.2
    /// blocking mode); returns the task then.
    pub async fn wait(&self, handle: TaskHandle) -> Result<Task, A2aError> {
        if handle.settled {
            return Ok(handle.snapshot);
        }
        let base = handle.baseline;
        let mut progress = handle.live.progress.subscribe();
        let shutdown = self.shared.shutdown.clone();
        tokio::select! {
            _ = progress.wait_for(|p| {
                p.state.is_terminal()
                    || (p.state.is_interrupted() && p.status_seq > base.status_seq)
                    || p.runs_finished > base.runs_finished
                    || p.write_failures > base.write_failures
            }) => {}
            _ = shutdown.cancelled() => {}
        }
        handle.live.view(&self.shared, handle.history, true).await
    }

    /// GetTask (spec §3.1.3).
    pub async fn get_task(
        &self,
        tenant: &str,
        id: &str,
        history: HistoryLength,
    ) -> Result<Task, A2aError> {
        let stored = self
            .shared
            .store
            .get(tenant, id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| A2aError::TaskNotFound {
                task_id: id.to_owned(),
            })?;
        Ok(task_view(&stored.record.task, history, true))
    }

    /// CancelTask (spec §3.1.5): a terminal task is TASK_NOT_CANCELABLE;
    /// otherwise the running executor is cancelled and the task moves to
    /// CANCELED, committed before this returns.
    pub async fn cancel_task(&self, tenant: &str, id: &str) -> Result<Task, A2aError> {
        let live = self.live(tenant, id);
        let state = live.lock_loaded(&self.shared).await?;
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
        let event = TaskEvent::Status(StatusUpdate {
            state: TaskState::Canceled,
            message: Some(agent_text("Task canceled at the client's request.")),
            metadata: None,
        });
        live.apply(&self.shared, state, event, Origin::Server)
            .await?;
        let task = live.view(&self.shared, HistoryLength::All, true).await?;
        if let Some(agent) = self.shared.agents.route(tenant) {
            let ctx = RequestContext {
                tenant: tenant.to_owned(),
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                message: task.history.first().cloned().unwrap_or_default(),
                task: Some(task.clone()),
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
    pub async fn subscribe(&self, tenant: &str, id: &str) -> Result<TaskHandle, A2aError> {
        let live = self.live(tenant, id);
        let mut state = live.lock_loaded(&self.shared).await?;
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
        Ok(live.handle(loaded, HistoryLength::All, true))
    }
}

/// The status message of tasks failed at start-up because the process that
/// ran them is gone.
pub const RESTART_FAILURE: &str =
    "The server restarted while this task was active; its run was lost. Send the request again.";

impl TaskManager {
    /// Start-up recovery: tasks left SUBMITTED or WORKING by a previous
    /// process have no executor any more, so they move to FAILED with
    /// [`RESTART_FAILURE`]. Interrupted tasks stay as they are: they wait on
    /// the client, and a message resumes them. Returns how many failed.
    ///
    /// Run it before serving, and only when this process is the store's
    /// only writer (a shared database needs run leases instead).
    pub async fn fail_orphaned_tasks(&self) -> Result<usize, A2aError> {
        let active = self
            .shared
            .store
            .active_tasks()
            .await
            .map_err(store_error)?;
        let mut failed = 0;
        for (tenant, stored) in active {
            let live = self.live(&tenant, &stored.record.task.id);
            let state = live.lock_loaded(&self.shared).await?;
            if !state.as_ref().expect("loaded").record.state().is_active() {
                continue;
            }
            let event = TaskEvent::Status(StatusUpdate {
                state: TaskState::Failed,
                message: Some(agent_text(RESTART_FAILURE)),
                metadata: None,
            });
            live.apply(&self.shared, state, event, Origin::Server)
                .await?;
            failed += 1;
        }
        Ok(failed)
    }

    /// Retention: deletes terminal tasks whose status is older than
    /// `RuntimeConfig::retain`; returns how many. Purged tasks are
    /// TASK_NOT_FOUND from then on.
    pub async fn purge_expired(&self) -> Result<u64, A2aError> {
        let Some(retain) = self.shared.config.retain else {
            return Ok(0);
        };
        let cutoff = Timestamp::from(SystemTime::now() - retain);
        let purged = self
            .shared
            .store
            .purge_terminal_before(&cutoff)
            .await
            .map_err(store_error)?;
        if purged > 0 {
            tracing::info!(purged, "retention: purged terminal tasks");
        }
        Ok(purged)
    }

    /// Background upkeep until shutdown: the retention sweep every
    /// `RuntimeConfig::sweep_every`.
    pub async fn run_maintenance(self) {
        let shutdown = self.shared.shutdown.clone();
        let mut ticks = tokio::time::interval(self.shared.config.sweep_every);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            if let Err(e) = self.purge_expired().await {
                tracing::warn!(error = %e, "retention sweep failed");
            }
        }
    }
}

impl Shared {
    fn live(self: &Arc<Self>, key: TaskKey) -> Arc<LiveTask> {
        let mut map = self.live.lock().expect("live map poisoned");
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let live = Arc::new(LiveTask::new(key.clone(), Arc::downgrade(self)));
        map.insert(key, Arc::downgrade(&live));
        live
    }

    /// Called from `LiveTask::drop`: forgets the entry unless a newer handle
    /// for the same key has replaced it.
    pub(crate) fn forget(&self, key: &TaskKey) {
        if let Ok(mut map) = self.live.lock()
            && map.get(key).is_some_and(|w| w.strong_count() == 0)
        {
            map.remove(key);
        }
    }
}
