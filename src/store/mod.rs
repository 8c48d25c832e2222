//! Task persistence: the [`TaskStore`] contract and its backends.
//!
//! A store keeps [`TaskRecord`]s keyed by (tenant, task id); tenants never
//! see each other's tasks. Within a tenant, a caller limited to its own
//! tasks ([`Caller`]) is served by reads that carry the owner in the key or
//! the filter ([`TaskStore::get_owned`], [`ListQuery::owner`]), never by a
//! read filtered afterwards (spec §13.1). Every stored task has a version that increases by
//! one on each write, and [`TaskStore::update`] refuses a write made from a
//! stale copy ([`StoreError::Conflict`]) instead of overwriting a newer state.
//! Listing follows spec §3.1.4: newest status timestamp first, ties broken by
//! task id, with opaque cursors ([`cursor`]).
//!
//! The store knows nothing of tonic or of agents; the lifecycle rules live in
//! [`crate::lifecycle`], not here.

pub mod codec;
pub mod cursor;
pub mod memory;
pub mod postgres;
pub mod sqlite;

use std::sync::Arc;

use crate::wkt::Timestamp;
use async_trait::async_trait;

pub use cursor::Cursor;
pub use memory::MemoryStore;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

use crate::lifecycle::{HistoryLength, TaskRecord};
use crate::proto::{Task, TaskState};

/// Default ListTasks page size (proto `ListTasksRequest.page_size`).
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// Largest ListTasks page size (proto `ListTasksRequest.page_size`).
pub const MAX_PAGE_SIZE: usize = 100;

/// A stored task and its version.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTask {
    pub record: TaskRecord,
    pub version: u64,
}

/// Who a request acts for within its tenant (spec §13.1): the name a task
/// it creates records as its owner and its idempotency keys are scoped to,
/// and whether it may see only the tasks it created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The principal's name; "" on a server without authentication.
    pub name: String,
    /// A `user`: only its own tasks. An `admin`, and every caller of a
    /// server without authentication, sees all of the tenant's tasks.
    pub own_tasks_only: bool,
    /// What the operator allows it (`--auth` file).
    pub quota: Quota,
}

/// What an operator allows one principal (`max_open_tasks`,
/// `max_input_wait` in the `--auth` file); nothing is limited by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Its tasks not yet ended (SUBMITTED, WORKING, INPUT_REQUIRED,
    /// AUTH_REQUIRED) at once, in every tenant: a message that would
    /// create one more is RESOURCE_EXHAUSTED.
    pub max_open_tasks: Option<u32>,
    /// How long one of its tasks may wait for input (INPUT_REQUIRED,
    /// AUTH_REQUIRED); past it the task fails.
    pub max_input_wait: Option<std::time::Duration>,
}

impl Quota {
    /// Nothing limited.
    pub const NONE: Quota = Quota {
        max_open_tasks: None,
        max_input_wait: None,
    };
}

/// A task waiting for input, as the quota sweep reads it
/// ([`TaskStore::waiting_before`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub tenant: String,
    pub task_id: String,
    pub owner: String,
    /// Since when: its status timestamp.
    pub since: TimeKey,
}

impl Caller {
    /// The caller of a server without authentication: no name, every task.
    pub const ANONYMOUS: Caller = Caller {
        name: String::new(),
        own_tasks_only: false,
        quota: Quota::NONE,
    };

    /// The owner a read must be limited to, if any.
    pub fn owner_filter(&self) -> Option<&str> {
        self.own_tasks_only.then_some(self.name.as_str())
    }
}

/// The idempotency key of a new task (spec §3.3.1), per principal so that
/// one cannot learn or replay another's message ids. For a task without
/// an owner (every task created before owners were recorded) it is the
/// message id's bytes, as it always was. An owned task's key starts with
/// the byte 0xFF, which no UTF-8 text holds, so it never equals an
/// unowned key whatever the message id; then the owner, length-prefixed so
/// that no two (owner, message id) pairs share a key, then the message id.
pub fn origin_key(owner: &str, message_id: &str) -> Vec<u8> {
    if owner.is_empty() {
        return message_id.as_bytes().to_vec();
    }
    let mut key = Vec::with_capacity(1 + 4 + owner.len() + message_id.len());
    key.push(OWNED_ORIGIN);
    key.extend_from_slice(format!("{}:", owner.len()).as_bytes());
    key.extend_from_slice(owner.as_bytes());
    key.extend_from_slice(message_id.as_bytes());
    key
}

/// The first byte of an owned task's idempotency key: never in UTF-8.
const OWNED_ORIGIN: u8 = 0xFF;

/// A ListTasks query, already validated. A `page_size` of 0 is read as
/// [`DEFAULT_PAGE_SIZE`].
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only the tasks this principal created (a `user`'s listing; see
    /// [`Caller::owner_filter`]); `Some("")` matches nothing.
    pub owner: Option<String>,
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
/// ([`fitting`]) before reading the records past it: a principal with a
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("task {0:?} already exists")]
    AlreadyExists(String),
    /// A task created by the same message (tenant, message_id) exists:
    /// the create was a repeat (issue "idempotent sends").
    #[error("message already created task {task_id:?}")]
    DuplicateMessage { task_id: String },
    #[error("task {0:?} not found")]
    NotFound(String),
    #[error("task {id:?} changed since it was read (version {expected}, now {actual})")]
    Conflict {
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error("task store unavailable: {0}")]
    Unavailable(String),
    #[error("task store failure: {0}")]
    Internal(String),
}

/// A task write already encoded, with the fields the stores index. The
/// runtime encodes once per write, under the task's lock and without
/// copying the task.
#[derive(Debug, Clone)]
pub struct EncodedTask {
    /// What the write stores: the whole record, or what it changed.
    pub body: Body,
    pub id: String,
    pub context_id: String,
    pub state: TaskState,
    pub status: TimeKey,
    /// The principal that created the task ([`TaskRecord::owner`]).
    pub owner: String,
    /// The idempotency key ([`origin_key`] of the owner and the creating
    /// message's id); empty for a task without a creating message.
    pub origin: Vec<u8>,
    /// Push notifications this write makes due, stored by the same write
    /// (a transactional outbox): committed together or not at all.
    pub outbox: Vec<OutboxEntry>,
    /// The stream events this write commits, each an encoded
    /// `StreamResponse`, length-delimited: kept by a store shared by
    /// replicas for the other replicas' subscribers
    /// ([`TaskStore::catch_up`]); filled only for such a store.
    pub events: Vec<u8>,
    /// With a whole body, what the write changed ([`crate::lifecycle::Changes`],
    /// encoded), for a store shared by replicas to keep beside the record,
    /// so that a replica following the task catches up on this write by
    /// its changes as on any other, not by reading the task again
    /// ([`Caught::Changes`]). Set by the runtime for a whole write of a
    /// running task; `None` otherwise, and ignored by other stores.
    pub logged: Option<Arc<[u8]>>,
    /// The write carries an agent's events: a store shared by replicas
    /// records the writing replica as the one running the task (what
    /// recovery by lease looks at). A creating write always does.
    pub by_run: bool,
    /// Follow-up messages this write commits whose runs are still to
    /// start here: a store shared by replicas records that this replica
    /// owes the task that many runs, until [`TaskStore::claim_run`] before
    /// each settles one. A task owing a run to a replica declared dead is
    /// orphaned ([`TaskStore::orphaned_tasks`]).
    pub owes_runs: u16,
}

/// What a task write stores (issue "long-lived tasks"): a store keeps a
/// task as its last whole record and the changes of each write after it,
/// so that an update of a long task costs what it changed, not the task.
#[derive(Debug, Clone)]
pub enum Body {
    /// The whole record ([`codec::encode`]): a create, and the writes the
    /// runtime chooses to start the task's record afresh with (a terminal
    /// write, or once the changes since the last whole record outweigh
    /// it). The changes before it are no longer needed.
    Whole(Arc<[u8]>),
    /// What this write changed ([`crate::lifecycle::Changes`], encoded),
    /// replayed after the task's earlier writes when it is read. Only to a
    /// store that [keeps changes](TaskStore::keeps_changes).
    Changes(Arc<[u8]>),
}

impl Body {
    /// The whole record, for a store that does not keep changes (the
    /// runtime sends it no other), or a create.
    pub fn whole(&self) -> Result<&Arc<[u8]>, StoreError> {
        match self {
            Body::Whole(bytes) => Ok(bytes),
            Body::Changes(_) => Err(StoreError::Internal(
                "this store keeps whole records only, and was sent changes".into(),
            )),
        }
    }

    /// The encoded bytes, whichever they are.
    pub fn bytes(&self) -> &Arc<[u8]> {
        match self {
            Body::Whole(b) | Body::Changes(b) => b,
        }
    }
}

/// The role of the one process delivering push notifications among those
/// sharing a store ([`TaskStore::hold`]).
pub const DELIVERY_ROLE: &str = "push-delivery";

/// A task write another replica committed, as a store shared by replicas
/// reports it ([`TaskStore::changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The task is at `version` now.
    Task {
        tenant: String,
        task_id: String,
        version: u64,
    },
    /// Changes may have been missed (the feed reconnected): whoever
    /// follows tasks catches up on all of them.
    Gap,
    /// Push notifications were added to the outbox.
    Outbox,
}

/// A task as stored now and the events committed since a version
/// ([`TaskStore::catch_up`]).
#[derive(Debug, Clone)]
pub struct CatchUp {
    /// The task's version now.
    pub version: u64,
    /// The task at `version`, whole or as what changed since the version
    /// asked for.
    pub task: Caught,
    /// Each write's events after the version asked for, in version order.
    pub events: Vec<crate::proto::StreamResponse>,
    /// Whether `events` holds every write's since that version (the
    /// store keeps them for a while only).
    pub complete: bool,
}

/// How [`TaskStore::catch_up`] gives the task as it is now.
#[derive(Debug, Clone)]
pub enum Caught {
    /// The whole task.
    Whole(Box<TaskRecord>),
    /// What each write after the version asked for changed, in version
    /// order: replayed ([`TaskRecord::replay_all`]) on the task as it was
    /// at that version, they give it as it is now. A store shared by
    /// replicas answers so while it still has every write's since then
    /// (PostgreSQL keeps them back to the whole write before the task's
    /// last), so that a replica following a long task reads what each
    /// write changed, not the task again (issue "long-lived tasks").
    Changes(Vec<crate::lifecycle::Changes>),
}

/// What claiming a new message's idempotency key found (spec §3.3.1;
/// [`TaskStore::claim_origin`]).
#[derive(Debug, Clone, PartialEq)]
pub enum OriginClaim {
    /// Nobody has answered the message or is answering it: the caller runs
    /// it, and releases the claim ([`TaskStore::release_origin`]) if the
    /// run creates no task.
    First,
    /// The message already created this task.
    Task(Box<StoredTask>),
    /// Another replica is answering the message now: ask again shortly.
    Elsewhere,
    /// A run of the message ended without its task stored: on a replica
    /// declared dead, or on this one (a create the store refused). Whether
    /// its agent acted on the message is not known. The caller holds the
    /// claim now, and must not run the message again (an agent's run for
    /// a message id happens at most once); it records the message's task
    /// as FAILED instead. Only a store shared by replicas answers this.
    Lost,
}

/// A push notification to send, written with the task change it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The task's config it goes to.
    pub config_id: String,
    /// The event: an encoded `StreamResponse`.
    pub event: Vec<u8>,
}

/// A push notification waiting in the outbox, as delivery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Outbox order: increasing in commit order, across all tasks.
    pub seq: u64,
    pub tenant: String,
    pub task_id: String,
    /// The principal that owns the task ("" for none): whose share of
    /// delivery's slots and backlog the notification uses.
    pub owner: String,
    pub config_id: String,
    pub event: Vec<u8>,
    /// Attempts made so far.
    pub attempts: u32,
    /// Not to be tried before this time (Unix milliseconds).
    pub not_before_ms: i64,
}

impl EncodedTask {
    /// A whole write of `record`.
    pub fn new(record: &TaskRecord) -> Self {
        Self::of(record, Body::Whole(codec::encode(record).into()))
    }

    /// A write of `record` storing `body`.
    pub fn of(record: &TaskRecord, body: Body) -> Self {
        EncodedTask {
            body,
            id: record.task.id.clone(),
            context_id: record.task.context_id.clone(),
            state: record.state(),
            status: status_key(&record.task),
            owner: record.owner.clone(),
            origin: origin_of(record),
            outbox: Vec::new(),
            events: Vec::new(),
            logged: None,
            by_run: false,
            owes_runs: 0,
        }
    }

    /// The whole record this write stores; an error for a write of
    /// changes.
    pub fn decode(&self) -> Result<TaskRecord, StoreError> {
        match &self.body {
            Body::Whole(bytes) => codec::decode(bytes),
            Body::Changes(_) => Err(StoreError::Internal(
                "a write of changes holds no whole record".into(),
            )),
        }
    }
}

/// Durable home of tasks. Implementations must make a write visible to
/// every later `get`/`list` once it returns `Ok`: the runtime tells clients
/// and subscribers about a change only after that.
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Stores a new task at version 1. Fails with `AlreadyExists` if the id
    /// is taken, and with `DuplicateMessage` if the tenant already has a task
    /// that the same owner created with the same message (its first history
    /// message's id; [`origin_key`]). The runtime writes encoded records
    /// (see [`EncodedTask`]).
    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError>;

    /// [`create_encoded`](Self::create_encoded) from a record.
    async fn create(&self, tenant: &str, record: &TaskRecord) -> Result<u64, StoreError> {
        self.create_encoded(tenant, &EncodedTask::new(record)).await
    }

    /// The task that `owner` created in `tenant` with `message_id`, if any.
    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError>;

    /// Claims the idempotency key of a new message `owner` sent in
    /// `tenant` before its run starts, so that one replica of several
    /// sharing a store runs it. A store with one process (memory, SQLite)
    /// only looks the task up: its runtime deduplicates in memory.
    async fn claim_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<OriginClaim, StoreError> {
        Ok(
            match self.find_by_origin(tenant, owner, message_id).await? {
                Some(task) => OriginClaim::Task(Box::new(task)),
                None => OriginClaim::First,
            },
        )
    }

    /// Releases a claim ([`OriginClaim::First`]) whose run created no task
    /// (a direct reply, a failure): the message may be sent again.
    async fn release_origin(
        &self,
        _tenant: &str,
        _owner: &str,
        _message_id: &str,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// The task and its version, or `None`.
    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError>;

    /// The task and its version if `owner` created it, else `None`, as for
    /// a task that does not exist: the owner is part of the lookup, so
    /// another principal's task is never read (spec §13.1). The empty name
    /// owns nothing (tasks created without authentication are no user's).
    async fn get_owned(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &str,
    ) -> Result<Option<StoredTask>, StoreError>;

    /// Whether `owner` created the task: [`TaskStore::get_owned`] without
    /// reading the record, so the answer costs the same for another's task
    /// and a missing one.
    async fn owns(&self, tenant: &str, task_id: &str, owner: &str) -> Result<bool, StoreError>;

    /// Whether the store takes writes of changes ([`Body::Changes`]);
    /// otherwise every write it gets is whole.
    fn keeps_changes(&self) -> bool {
        false
    }

    /// Replaces the task if its stored version is still `expected_version`;
    /// returns the new version. A write of [`Body::Changes`] changes the
    /// stored task by them; a whole one replaces it.
    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected_version: u64,
    ) -> Result<u64, StoreError>;

    /// [`update_encoded`](Self::update_encoded) from a record.
    async fn update(
        &self,
        tenant: &str,
        record: &TaskRecord,
        expected_version: u64,
    ) -> Result<u64, StoreError> {
        self.update_encoded(tenant, &EncodedTask::new(record), expected_version)
            .await
    }

    /// One page of the tenant's tasks (spec §3.1.4).
    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError>;

    /// Every task in an active state (SUBMITTED, WORKING), in all tenants,
    /// with its tenant: what recovery after a restart looks at.
    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError>;

    /// How many tasks are in each state that has not ended (SUBMITTED,
    /// WORKING, INPUT_REQUIRED, AUTH_REQUIRED), across every tenant and
    /// every replica sharing the store: the `a2a_tasks` gauge. States
    /// with none may be left out; a backend that cannot count returns
    /// nothing.
    async fn count_unfinished(&self) -> Result<Vec<(TaskState, u64)>, StoreError> {
        Ok(Vec::new())
    }

    /// Whether the store answers: the readiness probe (a read of a task
    /// that does not exist). A backend with a cheaper check overrides it.
    async fn ping(&self) -> Result<(), StoreError> {
        self.get("", "").await.map(|_| ())
    }

    /// The backend's name, as the `backend` label of the store metrics
    /// shows it.
    fn backend(&self) -> &'static str {
        "custom"
    }

    /// Hands the store's writer its metrics (batch sizes, queue depth),
    /// for a backend that groups writes; once, when the server starts.
    fn instrument(&self, _writer: crate::metrics::WriterMetrics) {}

    /// Claims task `task_id` for the run of a follow-up message queued
    /// here, so that of the replicas sharing a store, one at a time runs
    /// the task: `Some(version)` (the task's version now) when this process
    /// holds it, `None` while another live one does. A create holds its
    /// task for the first run. Called before each follow-up's run starts,
    /// held or not: a claim settles one of the runs this process owes the
    /// task ([`EncodedTask::owes_runs`]). A store of one process: always
    /// held (its runtime runs one run per task at a time in memory).
    async fn claim_run(&self, _tenant: &str, _task_id: &str) -> Result<Option<u64>, StoreError> {
        Ok(Some(0))
    }

    /// Holds the task's runs, free, this process's already, or taken from
    /// a replica declared dead, without starting a run or settling one
    /// owed: `true` when this process holds them (it releases them,
    /// [`TaskStore::release_run`], unless the task ends), `false` while
    /// another live one does. The orphan sweep takes them before it fails
    /// an interrupted task owing a dead replica's run: a process that
    /// rejoined under a new id may be starting that very run (its claim
    /// settles what it owed under its old id), and one of the two then
    /// finds the runs held. A store of one process: always `true`.
    async fn take_runs(&self, _tenant: &str, _task_id: &str) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Releases this process's claim on the task's runs
    /// ([`TaskStore::claim_run`]) after a run that left it interrupted,
    /// and wakes the replicas whose queued runs wait for it
    /// ([`TaskStore::changes`]).
    async fn release_run(&self, _tenant: &str, _task_id: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// The active tasks nothing runs any more, in all tenants: for a store
    /// of one process, every active task (run it at start-up); for one
    /// shared by replicas, those whose runner's lease has expired, and the
    /// interrupted ones owing a run to such a replica
    /// ([`EncodedTask::owes_runs`]): a follow-up nothing will run.
    async fn orphaned_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        self.active_tasks().await
    }

    /// `Some(lease)` when replicas share the store, each renewing a lease
    /// this long: orphaned tasks are then looked for while serving, not
    /// only at start-up.
    fn lease(&self) -> Option<std::time::Duration> {
        None
    }

    /// How long this process's lease is certainly still held
    /// ([`TaskStore::lease`]): zero while it is not (renewals late or
    /// failing, the process paused), and then the store refuses writes. A
    /// store of one process: for ever.
    fn held_for(&self) -> std::time::Duration {
        std::time::Duration::MAX
    }

    /// Counts the times this process lost its lease, for a store shared
    /// by replicas: each time, the runs started before are stopped (their
    /// tasks may be taken over by another replica).
    fn lease_losses(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Committed task writes as they happen, from every replica, when the
    /// store is shared by replicas; `None` for a store of one process.
    /// Only a wake-up: a change missed is caught up by version.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        None
    }

    /// Marks (`on`) or unmarks the task as followed by this process
    /// without its run here, so that a store shared by replicas announces
    /// the run's writes to it ([`TaskStore::changes`]); a client's writes
    /// are announced anyway. A store of one process: nothing to do.
    async fn watch(&self, _tenant: &str, _task_id: &str, _on: bool) -> Result<(), StoreError> {
        Ok(())
    }

    /// The task as stored now and the events of each write after version
    /// `after` ([`TaskStore::changes`]); `None` when the task is gone. The
    /// task comes whole, or as the changes after `after` from a store that
    /// has them all ([`Caught`]).
    /// A store of one process keeps no events: it answers with the task
    /// and no events, incomplete unless the task is still at `after`.
    async fn catch_up(
        &self,
        tenant: &str,
        task_id: &str,
        after: u64,
    ) -> Result<Option<CatchUp>, StoreError> {
        Ok(self.get(tenant, task_id).await?.map(|task| CatchUp {
            complete: task.version <= after,
            version: task.version,
            task: Caught::Whole(Box::new(task.record)),
            events: Vec::new(),
        }))
    }

    /// Whether this process holds `role`, which one process at a time of
    /// those sharing the store holds (push delivery, [`DELIVERY_ROLE`]):
    /// taken when free or when its holder has not renewed it for a lease,
    /// renewed by holding it again (call it every third of
    /// [`TaskStore::lease`]). Finishing and deferring outbox entries are
    /// done under [`DELIVERY_ROLE`] as last held, and do nothing once it
    /// changed hands. A store of one process: always.
    async fn hold(&self, _role: &str) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Whether this process should run the periodic job `job` now, at most
    /// once per `every` across every process sharing the store.
    async fn take_turn(&self, _job: &str, _every: std::time::Duration) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Deletes terminal tasks whose status timestamp is before `before`;
    /// returns how many were deleted (retention).
    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError>;

    /// How many tasks `owner` (not "") has that have not ended, in every
    /// tenant, counting at most `at_most` (a quota's check need not count
    /// further).
    async fn count_open_owned(&self, owner: &str, at_most: usize) -> Result<usize, StoreError>;

    /// Tasks waiting for input (INPUT_REQUIRED, AUTH_REQUIRED) since
    /// before `before`, oldest first, at most `limit`: what the input-wait
    /// quota looks at.
    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<Waiting>, StoreError>;

    /// Up to `limit` outbox entries with a `seq` above `after_seq`, in
    /// `seq` (commit) order, due or not: delivery reads the outbox once,
    /// from where it left off.
    async fn outbox(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError>;

    /// Removes an outbox entry: delivered, or given up.
    async fn finish_delivery(&self, seq: u64) -> Result<(), StoreError>;

    /// Records a failed attempt: `attempts` made, next not before
    /// `not_before_ms`.
    async fn defer_delivery(
        &self,
        seq: u64,
        attempts: u32,
        not_before_ms: i64,
    ) -> Result<(), StoreError>;
}

/// The id of the message that created a task: the first of its history
/// (see [`TaskRecord::submitted`]).
pub fn origin_message_id(record: &TaskRecord) -> &str {
    record
        .task
        .history
        .first()
        .map(|m| m.message_id.as_str())
        .unwrap_or("")
}

/// A task's idempotency key ([`origin_key`]); empty when it has no
/// creating message.
pub fn origin_of(record: &TaskRecord) -> Vec<u8> {
    match origin_message_id(record) {
        "" => Vec::new(),
        message_id => origin_key(&record.owner, message_id),
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

/// The SQL backends' condition for a task that has not ended: the same
/// terms as their `tasks_open_by_owner` index's (migration 0008), which a
/// query must repeat for the index to serve it.
pub(crate) const OPEN_STATES_SQL: &str = "state IN (1, 2, 6, 8)";
/// ... and for a task waiting for input.
pub(crate) const WAITING_STATES_SQL: &str = "state IN (6, 8)";

pub fn time_key(ts: &Timestamp) -> TimeKey {
    (ts.seconds, ts.nanos)
}
