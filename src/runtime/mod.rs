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
//! Every entry point takes the [`Caller`]: a `user` reaches only the tasks
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
//! live-task map, the idempotency claims) and the RPC entry points. The
//! parts depend on it and on each other one way (`tests/structure.rs`
//! checks it): `answer` (what a new message is owed) <- `live` (one task:
//! apply, commit, broadcast, its run queue) <- `sink` (a run's events) <-
//! `run` (starting and supervising executors); `stream` reads `live`.
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
//! the request waits on a `answer::Reply` that belongs to the run, not to
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
mod configs;
pub mod live;
pub mod sink;
pub mod stream;

mod quotas;
mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use crate::wkt::{Struct, Timestamp};
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

use crate::agent::{AgentRouter, RequestContext};
use crate::error::A2aError;
use crate::lifecycle::history::task_view;
use crate::lifecycle::{Cause, HistoryLength, StatusUpdate, TaskEvent, TransitionPolicy};
use crate::proto::{Message, Task, TaskState};
use crate::store::{
    Caller, ListQuery, OriginState as StoreClaim, StoreError, TaskPage, TaskStore, origin_key,
};
use live::{ApplyFailure, Author, LiveTask, MAX_QUEUED_MESSAGES, Progress, RunRequest};

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
    origins: Mutex<OriginWaiters>,
    /// With a store shared by replicas, the live tasks holding follow-up
    /// runs that wait for another replica's run to end: kept here so that
    /// the run is still queued when the other replica releases the task,
    /// though nothing else here holds the task any more (a client that
    /// did not wait for its follow-up). Let go of once their queue is empty
    /// ([`TaskManager::follow_changes`]'s look).
    queued: Mutex<HashMap<TaskKey, Arc<LiveTask>, foldhash::fast::RandomState>>,
    /// Executor runs going on, by task (see `TaskManager::drain_runs`).
    pub(crate) running: tokio::sync::watch::Sender<HashMap<TaskKey, usize>>,
    pub(crate) shutdown: CancellationToken,
    /// The parent of the cancellation token of every run started since
    /// this process last lost its lease ([`TaskStore::lease_losses`]); a
    /// child of `shutdown`, replaced at each loss.
    runs: Mutex<CancellationToken>,
    /// Raised after a commit that added push notifications to the outbox
    /// (see [`TaskManager::outbox_signal`]).
    pub(crate) outbox: Arc<tokio::sync::Notify>,
    /// The store is shared by replicas ([`TaskStore::lease`]): writes
    /// carry their events for the others, and a run starts only on a task
    /// no replica is running.
    pub(crate) replicated: bool,
    /// The store takes writes of changes ([`TaskStore::keeps_changes`]).
    pub(crate) keeps_changes: bool,
    /// The `agent` label of each served tenant's tasks (its card's name),
    /// made once: metrics label tasks by agent, never by free text.
    agent_labels: HashMap<String, Arc<str>>,
    /// The label of a tenant not served.
    unknown_agent: Arc<str>,
    /// The store's metrics, for its backend (when metrics are on).
    pub(crate) store_metrics: Option<crate::metrics::BackendMetrics>,
}

impl Shared {
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
        self.agent_labels.get(tenant).unwrap_or(&self.unknown_agent)
    }
}

/// Repeats waiting on the first request for (tenant, message_id).
type OriginWaiters =
    HashMap<(String, Vec<u8>), Vec<oneshot::Sender<OriginOutcome>>, foldhash::fast::RandomState>;

/// How a new message was answered, for its concurrent repeats.
#[derive(Clone)]
pub(crate) enum OriginOutcome {
    /// It created (or had created) this task.
    Task(String),
    /// A direct reply, no task.
    Message(Message),
    Failed(A2aError),
}

/// The first request for a new (tenant, message_id) holds this until the
/// message is answered. Dropped unanswered (the run ended without an
/// answer), its waiters are released to try again.
pub(crate) struct OriginClaim {
    shared: Arc<Shared>,
    key: Option<(String, Vec<u8>)>,
    /// The claim made in the store ([`TaskStore::claim_origin`]), released
    /// there unless the message created a task.
    stored: Option<StoredClaim>,
}

/// What claiming a new message in the store came to.
enum Claimed {
    /// This request runs it.
    Run(OriginClaim),
    /// A run of it ended without its task stored (its replica declared
    /// dead, or the store refusing the create): this request records its
    /// task as FAILED without running it ([`run::record_lost`]).
    Lost(OriginClaim),
    /// It already created this task.
    Task(String),
}

/// A new message's claim in the store.
struct StoredClaim {
    tenant: String,
    owner: String,
    message_id: String,
}

/// First wait before asking again for a message another replica answers.
pub const ORIGIN_RETRY_FIRST: Duration = Duration::from_millis(10);
/// Longest wait between those asks.
pub const ORIGIN_RETRY_MAX: Duration = Duration::from_millis(250);
/// How long a repeat waits for another replica's answer to the same
/// message before it is told UNAVAILABLE.
pub const MAX_ORIGIN_WAIT: Duration = Duration::from_secs(30);

impl OriginClaim {
    pub(crate) fn resolve(mut self, outcome: OriginOutcome) {
        // Only a direct reply gives the claim in the store back (the
        // message may run again). A task keeps it. So does a run whose
        // task was not stored: its agent may have acted on the message,
        // and a repeat, here or on another replica, then records the task
        // as lost instead of running the agent twice (`OriginClaim::Lost`).
        if !matches!(outcome, OriginOutcome::Message(_)) {
            self.stored = None;
        }
        for waiter in self.release() {
            let _ = waiter.send(outcome.clone());
        }
    }

    fn release(&mut self) -> Vec<oneshot::Sender<OriginOutcome>> {
        let Some(key) = self.key.take() else {
            return Vec::new();
        };
        let mut origins = self
            .shared
            .origins
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        origins.remove(&key).unwrap_or_default()
    }
}

impl Drop for OriginClaim {
    fn drop(&mut self) {
        // Waiters see their sender dropped and start over.
        drop(self.release());
        // A direct reply, or no run came of the claim: the message may
        // run again, here or on another replica.
        if let Some(claim) = self.stored.take() {
            let store = self.shared.store.clone();
            tokio::spawn(async move {
                let StoredClaim {
                    tenant,
                    owner,
                    message_id,
                } = claim;
                if let Err(e) = store.release_origin(&tenant, &owner, &message_id).await {
                    tracing::warn!(error = %e, "could not release a message's claim");
                }
            });
        }
    }
}

enum Claim {
    First(OriginClaim),
    Repeat(oneshot::Receiver<OriginOutcome>),
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
    pub(crate) events: Option<broadcast::Receiver<live::Broadcast>>,
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

/// A terminal task accepts no more messages (spec §3.1.1).
fn accepts_messages(record: &crate::lifecycle::TaskRecord) -> Result<(), A2aError> {
    let current = record.state();
    if current.is_terminal() {
        return Err(A2aError::unsupported(
            format!(
                "task {:?} is in terminal state {} and accepts no more messages",
                record.task.id,
                current.as_str_name()
            ),
            Some(&record.task.id),
        ));
    }
    Ok(())
}

/// Whether a follow-up `message` may join the task `record` (its working
/// copy: a cancel accepted but not yet committed counts), with `queued`
/// messages already waiting for a run: not terminal, the same context, room
/// in the queue.
fn follow_up_admissible(
    record: &crate::lifecycle::TaskRecord,
    message: &Message,
    queued: usize,
) -> Result<(), A2aError> {
    let task = &record.task;
    accepts_messages(record)?;
    if !message.context_id.is_empty() && message.context_id != task.context_id {
        return Err(A2aError::invalid(
            "message.context_id",
            format!(
                "context_id {:?} does not match task {:?}, whose context_id is {:?}",
                message.context_id, task.id, task.context_id
            ),
        ));
    }
    if queued >= MAX_QUEUED_MESSAGES {
        return Err(A2aError::ResourceExhausted {
            message: format!(
                "task {:?} already has {MAX_QUEUED_MESSAGES} messages waiting for its \
                 running agent; retry once it has taken some",
                task.id
            ),
            task_id: Some(task.id.clone()),
            limit: "MAX_QUEUED_MESSAGES",
        });
    }
    Ok(())
}

impl TaskManager {
    pub fn new(store: Arc<dyn TaskStore>, agents: AgentRouter, config: RuntimeConfig) -> Self {
        let agent_labels = agents
            .tenants()
            .into_iter()
            .filter_map(|tenant| {
                let name = agents.route(&tenant)?.card().name;
                Some((tenant, Arc::from(name)))
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
                agent_labels,
                unknown_agent: Arc::from("unknown"),
                store_metrics,
                agents,
                config,
                live: Mutex::new(HashMap::default()),
                origins: Mutex::new(HashMap::default()),
                queued: Mutex::new(HashMap::default()),
                running: tokio::sync::watch::Sender::new(HashMap::new()),
                runs: Mutex::new(shutdown.child_token()),
                shutdown,
                outbox: Arc::new(tokio::sync::Notify::new()),
                replicated: store.lease().is_some(),
                keeps_changes: store.keeps_changes(),
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
    pub(crate) fn live(&self, tenant: &str, id: &str) -> Arc<LiveTask> {
        self.shared.live(TaskKey {
            tenant: tenant.to_owned(),
            id: id.to_owned(),
        })
    }

    /// Accepts a client message (already validated) for `tenant`.
    /// With a `task_id` it continues that task (one `caller` may see);
    /// otherwise the agent decides between a task, owned by `caller`, and a
    /// direct reply. `subscribe` attaches the event stream to the returned
    /// handle. Never waits for an executor run.
    pub async fn send_message(
        &self,
        tenant: &str,
        caller: &Caller,
        request: MessageRequest,
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
        crate::telemetry::record_agent(self.shared.agent_label(tenant));
        // A new task's ids are recorded once chosen (`run::start_new`).
        if !request.message.task_id.is_empty() {
            crate::telemetry::record_call(
                "",
                &request.message.task_id,
                &request.message.context_id,
            );
        }
        let mut push_config = request.push_config;
        // A config needs an id (the lifecycle refuses one without); the
        // service gives one, a library caller may not have.
        if let Some(config) = &mut push_config
            && config.id.is_empty()
        {
            config.id = uuid::Uuid::now_v7().to_string();
        }
        let request = RunRequest {
            agent,
            message: request.message,
            metadata: request.metadata,
            accepted_output_modes: request.accepted_output_modes,
            push_config,
            protocol: request.protocol,
            trace: crate::telemetry::RunTrace::here(request.trace),
        };
        if request.message.task_id.is_empty() {
            self.send_new(tenant, caller, request, history, subscribe)
                .await
        } else {
            self.send_follow_up(tenant, caller, request, history, subscribe)
                .await
        }
    }

    /// A message without a task id. A repeat of one that already created a
    /// task (same tenant, caller and message_id, spec §3.3.1) is answered
    /// with that task before any run starts; concurrent repeats wait for the
    /// first one's answer. The store refusing a second task for the same
    /// message stays the last word (see `RunSink::create_task`). Keys are
    /// per caller ([`origin_key`]): another principal's message id is
    /// neither found nor replayed.
    async fn send_new(
        &self,
        tenant: &str,
        caller: &Caller,
        request: RunRequest,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<SendOutcome, A2aError> {
        self.check_open_tasks(caller).await?;
        let message_id = request.message.message_id.clone();
        let origin = origin_key(&caller.name, &message_id);
        loop {
            let claim = match self.shared.claim_origin(tenant, origin.clone()) {
                Claim::First(claim) => claim,
                Claim::Repeat(answer) => match answer.await {
                    Ok(OriginOutcome::Task(id)) => {
                        return self
                            .live(tenant, &id)
                            .duplicate_handle(&self.shared, history, subscribe)
                            .await;
                    }
                    Ok(OriginOutcome::Message(m)) => return Ok(SendOutcome::Message(m)),
                    Ok(OriginOutcome::Failed(e)) => return Err(e),
                    // The first request's run ended without an answer.
                    Err(_) => continue,
                },
            };
            let (claim, lost) = match self
                .claim_in_store(tenant, caller, &message_id, claim)
                .await?
            {
                Claimed::Run(claim) => (claim, false),
                Claimed::Lost(claim) => (claim, true),
                Claimed::Task(id) => {
                    return self
                        .live(tenant, &id)
                        .duplicate_handle(&self.shared, history, subscribe)
                        .await;
                }
            };
            if lost {
                // Boxed: a rare path whose future would otherwise make every
                // send's future larger (copied as it is moved).
                return Box::pin(run::record_lost(
                    &self.shared,
                    tenant,
                    &caller.name,
                    request,
                    history,
                    subscribe,
                    claim,
                ))
                .await;
            }
            return run::start_new(
                &self.shared,
                tenant,
                &caller.name,
                request,
                history,
                subscribe,
                claim,
            )
            .await;
        }
    }

    /// Claims a new message in the store, after this process's own claim.
    /// While another replica answers it (a store shared by replicas) this
    /// waits, and gives up after [`MAX_ORIGIN_WAIT`].
    async fn claim_in_store(
        &self,
        tenant: &str,
        caller: &Caller,
        message_id: &str,
        mut claim: OriginClaim,
    ) -> Result<Claimed, A2aError> {
        let store = &self.shared.store;
        let started = tokio::time::Instant::now();
        let mut delay = ORIGIN_RETRY_FIRST;
        loop {
            match store
                .claim_origin(tenant, &caller.name, message_id)
                .await
                .map_err(store_error)?
            {
                first @ (StoreClaim::First | StoreClaim::Lost) => {
                    // Only a store shared by replicas holds claims to
                    // release; the others' answer was a lookup.
                    if self.shared.replicated {
                        claim.stored = Some(StoredClaim {
                            tenant: tenant.to_owned(),
                            owner: caller.name.clone(),
                            message_id: message_id.to_owned(),
                        });
                    }
                    return Ok(match first {
                        StoreClaim::Lost => Claimed::Lost(claim),
                        _ => Claimed::Run(claim),
                    });
                }
                StoreClaim::Task(stored) => {
                    let id = stored.record.task.id.clone();
                    claim.resolve(OriginOutcome::Task(id.clone()));
                    return Ok(Claimed::Task(id));
                }
                StoreClaim::Elsewhere if started.elapsed() >= MAX_ORIGIN_WAIT => {
                    return Err(A2aError::Unavailable(format!(
                        "message {message_id:?} is being answered by another replica; \
                         send it again to get its task"
                    )));
                }
                StoreClaim::Elsewhere => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(ORIGIN_RETRY_MAX);
                }
            }
        }
    }

    /// A message continuing a task (spec §3.4.3): checked and committed to
    /// history at once, its run queued behind the current one.
    async fn send_follow_up(
        &self,
        tenant: &str,
        caller: &Caller,
        request: RunRequest,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<SendOutcome, A2aError> {
        let mut request = request;
        let push_config = request.push_config.take();
        let message_id = request.message.message_id.clone();
        let message = &mut request.message;
        let live = self.live(tenant, &message.task_id);
        let mut state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_mut().expect("loaded");
        // A repeat of a message the task already holds is answered with the
        // task, whatever its state, without a second run.
        if LiveTask::holds_message_locked(loaded, &message.message_id) {
            drop(state);
            return live
                .duplicate_handle(&self.shared, history, subscribe)
                .await;
        }
        follow_up_admissible(&loaded.record, message, live.queued())?;
        message.context_id = loaded.record.task.context_id.clone();
        // The config first, in the same flush: the message's run and its
        // events are already notified.
        if let Some(config) = push_config {
            let configs = &loaded.record.push_configs;
            if configs.len() >= crate::lifecycle::MAX_PUSH_CONFIGS
                && !configs.iter().any(|c| c.id == config.id)
            {
                return Err(A2aError::invalid(
                    "configuration.task_push_notification_config",
                    format!(
                        "the task already has {} push notification configs",
                        crate::lifecycle::MAX_PUSH_CONFIGS
                    ),
                ));
            }
            // Its commit is awaited through the message's, which follows
            // it in the same task's order.
            drop(live.submit_locked(
                &self.shared,
                &mut state,
                TaskEvent::PushConfig(crate::lifecycle::PushConfigChange::Set(
                    config,
                    request.protocol,
                )),
                Author::Server(Cause::Client),
            )?);
        }
        // Applied again by the lifecycle core, which refuses a terminal task.
        let commit = live.submit_locked(
            &self.shared,
            &mut state,
            TaskEvent::UserMessage(message.clone()),
            Author::Server(Cause::FollowUp),
        )?;
        let run = live.queue_run_locked(&mut state, request);
        if self.shared.replicated {
            self.shared
                .queued
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(live.key().clone(), live.clone());
        }
        drop(state);
        // The client is told (snapshot, stream) only once the message is
        // committed; the flush that commits it admits its run.
        match commit.wait().await {
            Ok(()) => {}
            // Another writer (a replica) moved the task first and the
            // message no longer applies: why, as if it had come after.
            Err(StoreError::Conflict { .. }) => {
                let state = live.lock_loaded(&self.shared).await?;
                let loaded = state.as_ref().expect("loaded");
                // The same message reached another replica first: a
                // repeat, answered with the task.
                if LiveTask::holds_message_locked(loaded, &message_id) {
                    drop(state);
                    return live
                        .duplicate_handle(&self.shared, history, subscribe)
                        .await;
                }
                accepts_messages(&loaded.record)?;
                return Err(A2aError::Unavailable(format!(
                    "task {:?} changed while the message was being added; send it again",
                    loaded.record.task.id
                )));
            }
            Err(e) => return Err(store_error(e)),
        }
        let mut state = live.lock_loaded(&self.shared).await?;
        let loaded = state.as_mut().expect("loaded");
        Ok(SendOutcome::Task(Box::new(live.handle(
            loaded,
            history,
            subscribe,
            Some(run),
        ))))
    }

    /// Waits until the task reaches a terminal state, or an interrupted
    /// state during or after the request's own run, or that run ends (spec
    /// §3.2.2 blocking mode); returns the task then. When that cannot be
    /// reached (shutdown, a failed store write, a run that ended with its
    /// task still active because failing it failed too) the answer is
    /// UNAVAILABLE, not a task in an active state.
    pub async fn wait(&self, handle: TaskHandle) -> Result<Task, A2aError> {
        if handle.settled {
            return Ok(handle.snapshot);
        }
        let (run, base) = (handle.run, handle.baseline);
        let mut progress = handle.live.progress.subscribe();
        let shutdown = self.shared.shutdown.clone();
        let failed = |p: &Progress| p.write_failures > base.write_failures;
        let reached = tokio::select! {
            biased;
            _ = progress.wait_for(|p| {
                p.state.is_terminal()
                    || p.runs_finished >= run
                    || (p.runs_started == run
                        && p.state.is_interrupted()
                        && p.status_seq > p.run_status_seq)
                    || failed(p)
            }) => true,
            _ = shutdown.cancelled() => false,
        };
        let mut task = handle.live.view(&self.shared, handle.history, true).await?;
        if reached && !failed(&progress.borrow()) && !ends_wait(&task) {
            // The request's own run ended where it should, but a run queued
            // behind it has moved the task on since: answer at that run's
            // next stop instead of with a task in motion.
            let settled = tokio::select! {
                biased;
                _ = progress.wait_for(|p| p.state.ends_blocking_wait() || failed(p)) => true,
                _ = shutdown.cancelled() => false,
            };
            if settled {
                task = handle.live.view(&self.shared, handle.history, true).await?;
            }
        }
        let state = task_state(&task);
        if state.is_terminal() || (reached && state.is_interrupted()) {
            return Ok(task);
        }
        let why = if shutdown.is_cancelled() {
            "the server is shutting down"
        } else {
            "a change to it could not be stored"
        };
        Err(A2aError::Unavailable(format!(
            "task {:?} is still {} and will not finish for this request: {why}; \
             read it later with GetTask",
            task.id,
            state.as_str_name()
        )))
    }

    /// GetTask (spec §3.1.3); a task `caller` may not see is not found.
    pub async fn get_task(
        &self,
        tenant: &str,
        caller: &Caller,
        id: &str,
        history: HistoryLength,
    ) -> Result<Task, A2aError> {
        let (task, _) = self.get_task_logged(tenant, caller, id, history).await?;
        Ok(task)
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
        let task = task_view(&stored.record.task, history, true);
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
        let live = self.live(tenant, id);
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
        let live = self.live(tenant, id);
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

/// The status message of tasks failed at start-up because the process that
/// ran them is gone.
pub const RESTART_FAILURE: &str =
    "The server restarted while this task was active; its run was lost. Send the request again.";

/// The status message of the task recorded for a new message whose run
/// ended without its task stored (its replica declared dead, or the store
/// refusing the create): the agent may have acted on it, so it is not run
/// again (`run::record_lost`).
pub const LOST_MESSAGE_FAILURE: &str = "An earlier run of this message ended before its \
     task was stored (the replica running it stopped, or could not write). Whether the agent \
     acted on the message is not known, so it was not run again. To run it, send it again \
     with a new messageId.";

/// The status message of an interrupted task failed because a follow-up
/// message in its history was committed by a replica that stopped before
/// its run started: no replica will run it, and the task would otherwise
/// wait for input its client already gave.
pub const LOST_FOLLOW_UP_FAILURE: &str = "A follow-up message to this task was accepted by \
     a replica that stopped before running it, so it was never run. The task cannot go on \
     without it; to go on, send the request again as a new task.";

impl TaskManager {
    /// Start-up recovery: tasks left SUBMITTED or WORKING by a previous
    /// process have no executor any more, so they move to FAILED with
    /// [`RESTART_FAILURE`]. Interrupted tasks stay as they are: they wait on
    /// the client, and a message resumes them. Returns how many failed.
    ///
    /// Run it before serving. With a store shared by replicas
    /// ([`TaskStore::lease`]) only the tasks of replicas whose lease has
    /// expired are orphaned, and [`TaskManager::run_maintenance`] looks
    /// for them again while serving; a live replica's tasks are never
    /// touched. There an interrupted task one of whose follow-ups such a
    /// replica was to run fails too, with [`LOST_FOLLOW_UP_FAILURE`].
    pub async fn fail_orphaned_tasks(&self) -> Result<usize, A2aError> {
        let orphaned = self
            .shared
            .store
            .orphaned_tasks()
            .await
            .map_err(store_error)?;
        // A replica failing a dead one's tasks takes them over; a lone
        // process cleans up after the one before it.
        let sweep = if self.shared.replicated {
            Cause::Takeover
        } else {
            Cause::OrphanSweep
        };
        let mut failed = 0;
        for (tenant, stored) in orphaned {
            let live = self.live(&tenant, &stored.record.task.id);
            // Failed only if still in the class it was found in: an
            // interrupted task another replica's run has taken up since is
            // that run's to end.
            let done = if stored.record.state().is_interrupted() {
                // The task's runs first: the process that took the
                // follow-up may have rejoined under a new id and be
                // starting its run now (its claim settles what it owed
                // under the old id). Whichever of the two claims first
                // goes on; the other leaves the task alone.
                if !self
                    .shared
                    .store
                    .take_runs(&tenant, &stored.record.task.id)
                    .await
                    .map_err(store_error)?
                {
                    continue;
                }
                let failed = live
                    .fail_lost_follow_up(&self.shared, LOST_FOLLOW_UP_FAILURE, sweep)
                    .await;
                if !matches!(failed, Ok(true)) {
                    live.give_back_taken_runs(&self.shared);
                }
                failed?
            } else {
                live.fail_if_active(&self.shared, RESTART_FAILURE, sweep)
                    .await?
            };
            if done {
                failed += 1;
            }
        }
        Ok(failed)
    }

    /// After shutdown: waits up to `grace` for the cancelled runs to end
    /// (each fails its task with the shutdown message as it ends), then
    /// fails every task whose executor ignored the cancellation itself, so
    /// no task is left active in the store when the process exits. Returns
    /// how many tasks were failed here.
    pub async fn drain_runs(&self, grace: Duration) -> usize {
        self.shared.shutdown.cancel();
        let mut running = self.shared.running.subscribe();
        let drained = tokio::time::timeout(grace, running.wait_for(HashMap::is_empty))
            .await
            .is_ok();
        if drained {
            return 0;
        }
        let left: Vec<TaskKey> = self.shared.running.borrow().keys().cloned().collect();
        let message = format!(
            "the server shut down while the task was running; its agent did not stop within {}",
            humantime::format_duration(grace)
        );
        let mut failed = 0;
        for key in left {
            let live = self.shared.live(key.clone());
            match live
                .fail_if_active(&self.shared, &message, Cause::Server)
                .await
            {
                Ok(true) => failed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(task_id = %key.id, error = %e, "could not fail task at shutdown")
                }
            }
        }
        if failed > 0 {
            tracing::warn!(failed, "failed tasks whose agents ignored the shutdown");
        }
        failed
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

    /// With a store shared by replicas ([`TaskStore::changes`]), until
    /// shutdown: follows the other replicas' writes to the tasks held
    /// here, so that their subscribers and waiters get those events in
    /// order ([`LiveTask::catch_up`]). A notification is only a wake-up:
    /// after a gap in them, and every [`CATCH_UP_EVERY`] whatever comes,
    /// every followed task is caught up from the store by version.
    pub async fn follow_changes(self) {
        use crate::store::WriteNotice;
        use tokio::sync::broadcast::error::RecvError;
        let Some(mut changes) = self.shared.store.changes() else {
            return;
        };
        let shutdown = self.shared.shutdown.clone();
        let mut ticks = tokio::time::interval(CATCH_UP_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Some(true): every loaded task (after a gap, a run here may
            // have missed a cancel); Some(false): the followed ones.
            let all = tokio::select! {
                change = changes.recv() => match change {
                    Ok(WriteNotice::Task { tenant, task_id, version }) => {
                        let key = TaskKey { tenant, id: task_id };
                        // Behind, or a queued run waits for the claim
                        // this may be the release of.
                        if let Some(live) = self.shared.find_live(&key)
                            && (live.behind(version) || live.waits_to_run())
                        {
                            tokio::spawn(live.catch_up(self.shared.clone()));
                        }
                        None
                    }
                    Ok(WriteNotice::Outbox) => {
                        self.shared.outbox.notify_one();
                        None
                    }
                    Ok(WriteNotice::Gap) | Err(RecvError::Lagged(_)) => {
                        self.shared.outbox.notify_one();
                        Some(true)
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = ticks.tick() => {
                    // Queued runs that started or were dropped no longer
                    // need their task kept.
                    self.shared
                        .queued
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|_, live| live.queued() > 0);
                    Some(false)
                }
                _ = shutdown.cancelled() => return,
            };
            if let Some(every) = all {
                for live in self.shared.followed(every) {
                    tokio::spawn(live.catch_up(self.shared.clone()));
                }
            }
        }
    }

    /// With a store shared by replicas, until shutdown: each time this
    /// process loses its lease ([`TaskStore::lease_losses`]), stops every
    /// run started before. Its store refuses their writes already; their
    /// tasks may be taken over by another replica once it is declared
    /// dead, and an agent told to stop does nothing more for them. Each
    /// stopped run fails its task when the store takes writes again (or
    /// the replica that takes it over does).
    pub async fn stop_runs_when_lease_lost(self) {
        let Some(mut losses) = self.shared.store.lease_losses() else {
            return;
        };
        let shutdown = self.shared.shutdown.clone();
        loop {
            tokio::select! {
                changed = losses.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
            let stopped = std::mem::replace(
                &mut *self.shared.runs.lock().unwrap_or_else(|e| e.into_inner()),
                shutdown.child_token(),
            );
            stopped.cancel();
            let runs: usize = self.shared.running.borrow().values().sum();
            tracing::warn!(runs, "this replica lost its lease: its runs were stopped");
        }
    }

    /// Background upkeep until shutdown: the retention sweep every
    /// `RuntimeConfig::sweep_every`, run by one process of those sharing
    /// the store ([`TaskStore::take_turn`]); with replicas, the tasks of
    /// replicas whose lease ran out are failed, looked for every half
    /// lease by one of them.
    pub async fn run_maintenance(self) {
        let shutdown = self.shared.shutdown.clone();
        let sweep = self.shared.config.sweep_every;
        let lease = self.shared.store.lease();
        let tick = lease.map_or(sweep, |l| sweep.min(l / 2));
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first retention sweep is one interval after start, not at the
        // interval's immediate first tick: a purge racing the first requests
        // would make `--retain` depend on how fast a process starts, and the
        // policy only promises a purge within one interval of expiry.
        let started = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let store = &self.shared.store;
            // Slightly less than the interval, so that one replica's tick
            // a little early does not skip a turn.
            let due = |every: Duration| every.mul_f64(0.9);
            let retention_turn = if started.elapsed() < due(sweep) {
                Ok(false)
            } else {
                store.take_turn("retention", due(sweep)).await
            };
            match retention_turn {
                Ok(true) => {
                    if let Err(e) = self.purge_expired().await {
                        tracing::warn!(error = %e, "retention sweep failed");
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
            }
            let Some(lease) = lease else { continue };
            match store.take_turn("orphans", due(lease / 2)).await {
                Ok(true) => match self.fail_orphaned_tasks().await {
                    Ok(0) => tracing::debug!("looked for orphaned tasks: none"),
                    Ok(failed) => tracing::warn!(
                        failed,
                        "failed the active tasks of replicas whose lease ran out"
                    ),
                    Err(e) => tracing::warn!(error = %e, "looking for orphaned tasks failed"),
                },
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "looking for orphaned tasks failed"),
            }
        }
    }
}

impl Shared {
    /// Claims a new message for this request, or joins the request that
    /// claimed it first.
    fn claim_origin(self: &Arc<Self>, tenant: &str, origin: Vec<u8>) -> Claim {
        let key = (tenant.to_owned(), origin);
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(waiters) = origins.get_mut(&key) {
            let (tx, rx) = oneshot::channel();
            waiters.push(tx);
            return Claim::Repeat(rx);
        }
        origins.insert(key.clone(), Vec::new());
        Claim::First(OriginClaim {
            shared: self.clone(),
            key: Some(key),
            stored: None,
        })
    }

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

    fn live(self: &Arc<Self>, key: TaskKey) -> Arc<LiveTask> {
        let mut map = self.live.lock().expect("live map poisoned");
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let live = Arc::new(LiveTask::new(key.clone(), Arc::downgrade(self)));
        map.insert(key, Arc::downgrade(&live));
        live
    }

    /// Starts the run of a follow-up message that `live` admitted from its
    /// queue (the task exists, so the run's sink starts live).
    pub(crate) fn start_follow_up(
        self: &Arc<Self>,
        live: Arc<LiveTask>,
        agent: Arc<dyn crate::agent::AgentExecutor>,
        ctx: RequestContext,
        trace: &crate::telemetry::RunTrace,
    ) {
        let mode = sink::SinkMode::Live { live, answer: None };
        run::spawn(self, agent, ctx, mode, trace);
    }

    /// Answers a repeat of a message that already created task `key` with
    /// that task, off the caller (it may have to load the task).
    pub(crate) fn answer_repeat(
        self: &Arc<Self>,
        key: TaskKey,
        history: HistoryLength,
        subscribe: bool,
        reply: answer::Reply,
    ) {
        let shared = self.clone();
        tokio::spawn(async move {
            let existing = shared.live(key);
            let outcome = existing.duplicate_handle(&shared, history, subscribe).await;
            reply.send(outcome);
        });
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
