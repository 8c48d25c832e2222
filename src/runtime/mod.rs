//! The task runtime: where requests, executors, the lifecycle core, the store
//! and subscribers meet.
//!
//! [`TaskManager`] owns the live tasks. Every change to a task goes through
//! one per-task lock (`live::LiveTask`): the event is applied by the
//! lifecycle core, committed to the store, and only then broadcast to the
//! task's subscribers and waiters. Because subscribing also takes that lock,
//! a subscriber's first item (a Task snapshot) and the live events after it
//! neither lose nor repeat an event (spec §3.1.6, §3.5.2).
//!
//! Executors run one at a time per task. A message for a task whose run is
//! still going is checked, committed to history and answered at once (spec
//! §3.2.2: a non-blocking send returns immediately), and its run is queued
//! behind the current one ([`live::MAX_QUEUED_MESSAGES`]); nothing a
//! request does waits for an executor.
//!
//! Every entry point takes the [`Caller`](crate::store::Caller): a `user` reaches only the tasks
//! it created. Whether it may see a task is asked of the store with the
//! owner in the lookup before anything else about the task is read, in
//! memory or not, so another principal's task answers, and costs, what a
//! missing one does (spec §13.1; `LiveTask::lock_visible`).
//!
//! A new message is deduplicated before any run starts (spec §3.3.1): the
//! first request for a (tenant, caller, message_id) claims it in memory, the store
//! is asked whether it already created a task, and concurrent repeats wait
//! for the first one's answer, so the agent runs once.
//!
//! # The parts
//!
//! This module holds the state every part shares ([`TaskManager`], the
//! live-task map, the handles a request gets back). Each part has one job:
//!
//! - `send`: SendMessage's path, top to bottom: a new message, a follow-up,
//!   a repeat, and the blocking wait; `tasks`: GetTask, ListTasks,
//!   CancelTask, SubscribeToTask; `configs`: push notification configs;
//!   `quotas`: the per-caller limits; `jobs`: the background jobs
//!   (recovery, drain, retention, following replicas, the lease);
//! - `origin`: the idempotency claims on new messages;
//!   `answer`: what a creating request is owed;
//! - one task in memory, one job per file, all `impl LiveTask`: `live` (its
//!   lock, accepting events, the handles read from it) on `loaded` (its
//!   cached copy and who wrote each event); `commit` (store writes and what
//!   follows them), `run_queue` (its runs, one at a time), `replica` (other
//!   replicas' writes), `fail` (the server's own FAILED);
//! - `sink` (a run's events) <- `run` (starting and supervising executors);
//!   `stream` (a subscriber's view of the broadcast).
//!
//! The parts depend on this module and on each other one way
//! (`tests/structure.rs` checks it): a request enters through `send` or
//! `tasks` and calls down, never back up into the file it came from.
//!
//! # Lock order
//!
//! A path that holds several takes them in this order, and never awaits
//! while holding a std mutex:
//!
//! 1. a run's sink mode (`sink::SinkInner::mode`, async): which phase the
//!    run is in (no event yet, live, replied, done);
//! 2. the task's state (`LiveTask::lock_loaded`, async): the working copy,
//!    its uncommitted events and the broadcast; held for microseconds, never
//!    across a store write (flushes commit outside it and re-lock to
//!    publish);
//! 3. the task's runs (`live::Runs`, std): the active flag, the queue of
//!    follow-ups, the cancel token;
//! 4. the live-task map and the idempotency claims (`Shared`, std), each
//!    alone, for a lookup or an insert.
//!
//! # The answer owed to a creating request
//!
//! A message without a task id is answered by what its run does first, so
//! the request waits on a `answer::NewMessageReply` that belongs to the run, not to
//! the request (a client that goes away still has its repeats answered):
//!
//! 1. the run's sink starts with the message and the reply, and no task;
//! 2. a direct reply from the agent answers at once (no task is created);
//! 3. the first status or artifact event installs the task (SUBMITTED,
//!    uncommitted) and takes a snapshot and subscription for the request;
//!    the answer (`answer::NewTaskAnswer`) rides with that event into the
//!    task's pending writes;
//! 4. the flush that commits it delivers the answer (the task with its
//!    snapshot); a create refused because the same message created a task
//!    meanwhile answers with that task instead; any other failure answers
//!    with the error, and the answer is never lost: if the event carrying
//!    it is refused, it stays in the sink for the next one, at worst the
//!    FAILED that ends the run.

mod answer;
mod commit;
mod configs;
mod fail;
mod jobs;
pub mod live;
mod loaded;
mod origin;
mod replica;
pub mod rings;
mod run_queue;
mod send;
pub mod sink;
pub mod stream;
mod tasks;

mod quotas;
mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use crate::wkt::{Struct, Timestamp};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::agent::AgentRouter;
use crate::error::A2aError;
use crate::lifecycle::{HistoryLength, StatusUpdate, TaskEvent, TransitionPolicy};
use crate::proto::{Message, Task, TaskState};
use crate::store::{StoreError, TaskStore};
use live::{LiveTask, Progress};

/// How many events a subscriber may fall behind before it is resynchronised
/// with a fresh Task snapshot (see [`stream`]). A slow subscriber never
/// blocks the agent or other subscribers: the per-task broadcast ring drops
/// its oldest events for that subscriber instead.
///
/// One commit publishes at most [`live::MAX_PENDING_EVENTS`] events at once,
/// so twice that lets a subscriber still reading one commit's events take
/// the whole next one. A ring is allocated in full (tokio builds and drops
/// every slot), so rings outlive their tasks and are used again
/// ([`rings`]): a streamed request no longer pays for the ring's size.
pub const SUBSCRIBER_BUFFER: usize = 2 * live::MAX_PENDING_EVENTS;

/// How often, with a store shared by replicas, the tasks followed here
/// are caught up from the store whether or not a notification came: the
/// longest a missed notification delays an event (and a cancel made on
/// another replica).
pub const CATCH_UP_EVERY: Duration = Duration::from_secs(1);

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
    /// Where tasks, runs and streams are counted (`GET /metrics`); on by
    /// default; `None`: not counted (`serve --no-metrics`), at no cost.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            policy: TransitionPolicy::default(),
            subscriber_buffer: SUBSCRIBER_BUFFER,
            task_timeout: None,
            retain: Some(DEFAULT_RETAIN),
            sweep_every: RETENTION_SWEEP_INTERVAL,
            metrics: Some(Arc::new(crate::metrics::Metrics::new())),
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
    /// New messages being answered, by (tenant, idempotency key: see
    /// [`origin_key`]), with the repeats waiting for that answer
    /// (idempotent sends).
    origins: Mutex<origin::OriginWaiters>,
    /// With a store shared by replicas, the live tasks holding follow-up
    /// runs that wait for another replica's run to end: kept here so that
    /// the run is still queued when the other replica releases the task,
    /// though nothing else here holds the task any more (a client that
    /// did not wait for its follow-up). Let go of once their queue is empty
    /// ([`TaskManager::follow_changes`]'s look).
    queued: Mutex<HashMap<TaskKey, Arc<LiveTask>, foldhash::fast::RandomState>>,
    /// Executor runs going on, by task (see `TaskManager::drain_runs`).
    pub(crate) running:
        tokio::sync::watch::Sender<HashMap<TaskKey, usize, foldhash::fast::RandomState>>,
    pub(crate) shutdown: CancellationToken,
    /// The parent of the cancellation token of every run started since
    /// this process last lost its lease ([`Coordination::lease_losses`](crate::store::Coordination::lease_losses)); a
    /// child of `shutdown`, replaced at each loss.
    runs: Mutex<CancellationToken>,
    /// Raised after a commit that added push notifications to the outbox
    /// (see [`TaskManager::outbox_signal`]).
    pub(crate) outbox: Arc<tokio::sync::Notify>,
    /// The store takes writes of changes ([`TaskStore::keeps_changes`]).
    pub(crate) keeps_changes: bool,
    /// Whole records are written compact ([`TaskStore::compact_records`]).
    pub(crate) compact_records: bool,
    /// The `agent` label of each served tenant's tasks (its card's name)
    /// and its task counters, made once: metrics label tasks by agent,
    /// never by free text.
    agents_by_tenant: HashMap<String, crate::metrics::AgentCounters, foldhash::fast::RandomState>,
    /// Those of a tenant not served.
    unknown_agent: crate::metrics::AgentCounters,
    /// The store's metrics, for its backend (when metrics are on).
    pub(crate) store_metrics: Option<crate::metrics::BackendMetrics>,
    /// Broadcast rings let go of by tasks no longer streamed, for the next
    /// task subscribed to ([`rings`]).
    pub(crate) rings: rings::IdleRings,
}

impl Shared {
    /// The store's coordination between replicas sharing it
    /// ([`TaskStore::coordination`]), `None` for a store of one process:
    /// with it, writes carry their events for the others, and a run starts
    /// only on a task no replica is running.
    pub(crate) fn replicas(&self) -> Option<&dyn crate::store::Coordination> {
        self.store.coordination()
    }

    /// The cancellation token of a run starting now: cancelled at
    /// shutdown, when its task is cancelled, and when this process loses
    /// its lease on a store shared by replicas.
    pub(crate) fn run_token(&self) -> CancellationToken {
        self.runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .child_token()
    }

    /// The `agent` label of the tasks of `tenant`: its agent's name, or
    /// `unknown` for a tenant no longer served (a task read back from an
    /// older configuration's store).
    pub(crate) fn agent_label(&self, tenant: &str) -> &Arc<str> {
        self.agent(tenant).agent()
    }

    /// The agent of `tenant`'s tasks, as metrics count them.
    pub(crate) fn agent(&self, tenant: &str) -> &crate::metrics::AgentCounters {
        self.agents_by_tenant
            .get(tenant)
            .unwrap_or(&self.unknown_agent)
    }
}

/// Cheap-to-clone handle over the runtime.
#[derive(Clone)]
pub struct TaskManager {
    shared: Arc<Shared>,
}

/// A client message and what came with it (spec §3.2.1), already
/// validated.
#[derive(Debug, Clone, Default)]
pub struct MessageRequest {
    pub message: Message,
    /// `SendMessageRequest.metadata`, handed to the agent.
    pub metadata: Option<Struct>,
    /// `SendMessageConfiguration.accepted_output_modes`, handed to the agent.
    pub accepted_output_modes: Vec<String>,
    /// `SendMessageConfiguration.task_push_notification_config`, checked
    /// and with its id: registered with a new task before its first event,
    /// or set on the task a follow-up continues before its message.
    pub push_config: Option<crate::proto::TaskPushNotificationConfig>,
    /// The protocol version the client speaks, which `push_config`'s
    /// payloads follow.
    pub protocol: crate::lifecycle::Protocol,
    /// The caller's W3C trace context (`traceparent`), which the run and
    /// its task's webhooks continue ([`crate::telemetry`]).
    pub trace: Option<crate::telemetry::TraceParent>,
}

impl From<Message> for MessageRequest {
    fn from(message: Message) -> Self {
        MessageRequest {
            message,
            ..Default::default()
        }
    }
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
    pub(crate) events: Option<broadcast::Receiver<loaded::Broadcast>>,
    pub(crate) baseline: Progress,
    pub(crate) history: HistoryLength,
    /// The request repeated one already applied and the task is not being
    /// worked on: answer with the snapshot, do not wait or stream further.
    pub(crate) settled: bool,
    /// The run this request is about: its message's (see `live::Runs`).
    pub(crate) run: u64,
    /// When the snapshot was taken: no run was active or queued.
    pub(crate) idle: bool,
    /// When the snapshot was taken: its status came from `run` or a later
    /// run.
    pub(crate) run_started: bool,
}

fn task_state(task: &Task) -> TaskState {
    task.status
        .as_ref()
        .and_then(|s| TaskState::try_from(s.state).ok())
        .unwrap_or(TaskState::Unspecified)
}

fn ends_wait(task: &Task) -> bool {
    task_state(task).ends_blocking_wait()
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

pub use crate::agent::agent_text;
pub use jobs::{LOST_FOLLOW_UP_FAILURE, LOST_MESSAGE_FAILURE, RESTART_FAILURE};
pub use origin::{MAX_ORIGIN_WAIT, ORIGIN_RETRY_FIRST, ORIGIN_RETRY_MAX};

/// A status change the server makes itself (a cancel, a failure), with
/// `text` as the agent's status message. One builder, so every such event
/// has the same shape.
pub(crate) fn server_status(state: TaskState, text: impl Into<String>) -> TaskEvent {
    TaskEvent::Status(StatusUpdate {
        state,
        message: Some(agent_text(text)),
        metadata: None,
    })
}

pub(crate) fn store_error(err: StoreError) -> A2aError {
    match err {
        StoreError::NotFound(id) => A2aError::TaskNotFound { task_id: id },
        StoreError::Unavailable(m) => A2aError::Unavailable(m),
        other => A2aError::Internal(other.to_string()),
    }
}

/// Updates a watch channel's value, waking its watchers only when it has
/// any: tokio's watch channel otherwise wakes each of its eight notifier
/// shards under a lock on every update (callgrind: about 420 instructions
/// an update, nine a non-blocking send), for the runtime's watches that
/// are seldom watched (a task's progress, the running runs). A watcher
/// that comes later reads the value as it then is (`wait_for` looks at it
/// before waiting); one that subscribes while this runs is counted before
/// the value can be read (the update holds the channel's write lock), so
/// it is woken.
pub(crate) fn update_watched<T>(
    watch: &tokio::sync::watch::Sender<T>,
    update: impl FnOnce(&mut T),
) {
    watch.send_if_modified(|value| {
        update(value);
        watch.receiver_count() > 0
    });
}

impl TaskManager {
    pub fn new(store: Arc<dyn TaskStore>, agents: AgentRouter, config: RuntimeConfig) -> Self {
        let agents_by_tenant = agents
            .tenants()
            .into_iter()
            .filter_map(|tenant| {
                let name = agents.route(&tenant)?.card().name;
                Some((tenant, crate::metrics::AgentCounters::new(Arc::from(name))))
            })
            .collect();
        let store_metrics = config.metrics.as_ref().map(|m| {
            let backend = m.store.backend(store.backend());
            store.instrument(backend.writer.clone());
            backend
        });
        let shutdown = CancellationToken::new();
        TaskManager {
            shared: Arc::new(Shared {
                agents_by_tenant,
                unknown_agent: crate::metrics::AgentCounters::new(Arc::from("unknown")),
                store_metrics,
                agents,
                rings: rings::IdleRings::new(config.subscriber_buffer),
                config,
                live: Mutex::new(HashMap::default()),
                origins: Mutex::new(HashMap::default()),
                queued: Mutex::new(HashMap::default()),
                running: tokio::sync::watch::Sender::new(HashMap::default()),
                runs: Mutex::new(shutdown.child_token()),
                shutdown,
                outbox: Arc::new(tokio::sync::Notify::new()),
                keeps_changes: store.keeps_changes(),
                compact_records: store.compact_records(),
                store,
            }),
        }
    }

    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.shared.store
    }

    pub fn agents(&self) -> &AgentRouter {
        &self.shared.agents
    }

    /// Where this server counts what it does, when it does
    /// ([`RuntimeConfig::metrics`]).
    pub fn metrics(&self) -> Option<&Arc<crate::metrics::Metrics>> {
        self.shared.config.metrics.as_ref()
    }

    /// How many tasks are held in memory right now (running, streamed or
    /// in a request). Finished, unobserved tasks live only in the store.
    pub fn live_task_count(&self) -> usize {
        self.shared.live.lock().expect("live map poisoned").len()
    }

    /// How many broadcast rings are kept for the next task streamed
    /// ([`rings`]): at most [`rings::IDLE_RINGS`].
    pub fn idle_rings(&self) -> usize {
        self.shared.rings.len()
    }

    /// Raised after each commit that added push notifications to the
    /// store's outbox: what wakes delivery (`push::deliver::Dispatcher`).
    pub fn outbox_signal(&self) -> Arc<tokio::sync::Notify> {
        self.shared.outbox.clone()
    }

    /// Fired on graceful shutdown: open streams end, executors are cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// The live handle of a task, created (unloaded) if none exists. Two
    /// callers for the same key always get the same handle, so there is one
    /// lock per task.
    pub(crate) fn live_or_insert(&self, tenant: &str, id: &str) -> Arc<LiveTask> {
        self.shared.live_or_insert(TaskKey {
            tenant: tenant.to_owned(),
            id: id.to_owned(),
        })
    }
}

impl Shared {
    /// The live handle of a task if something holds one.
    fn find_live(&self, key: &TaskKey) -> Option<Arc<LiveTask>> {
        let map = self.live.lock().expect("live map poisoned");
        map.get(key).and_then(Weak::upgrade)
    }

    /// The live handles whose task another replica may be changing while
    /// something here follows it ([`LiveTask::followed_remotely`]), or
    /// with `every`, all of them.
    fn followed(&self, every: bool) -> Vec<Arc<LiveTask>> {
        let map = self.live.lock().expect("live map poisoned");
        map.values()
            .filter_map(Weak::upgrade)
            .filter(|l| every || l.followed_remotely())
            .collect()
    }

    /// The live handle of a task, inserted (unloaded) into the live-task
    /// map if none is there ([`TaskManager::live_or_insert`]).
    fn live_or_insert(self: &Arc<Self>, key: TaskKey) -> Arc<LiveTask> {
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
