//! The [`TaskStore`] contract: what every backend does with the tasks it
//! keeps ([`StoredTask`]), and where its outbox and its coordination
//! between replicas are found.

use crate::lifecycle::TaskRecord;
use crate::proto::TaskState;
use crate::wkt::Timestamp;
use async_trait::async_trait;

use super::{Coordination, EncodedTask, ListQuery, Outbox, Owner, StoreError, TaskPage, Waiting};

/// A stored task and its version.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTask {
    pub record: TaskRecord,
    pub version: u64,
}

/// A task as [`TaskStore::read_task`] hands it out: its protobuf
/// encoding, or the task decoded.
///
/// Passed by value once per call and never collected, so the variants'
/// sizes do not matter; boxing the task would cost an allocation per read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum TaskRead {
    /// The bytes of the task's encoding as the store keeps them: GetTask
    /// over gRPC answers with them as they are, neither decoded nor
    /// encoded again (issue 32).
    Encoded(bytes::Bytes),
    Decoded(crate::proto::Task),
}

impl TaskRead {
    /// The task itself.
    pub fn into_task(self) -> Result<crate::proto::Task, StoreError> {
        use prost::Message as _;
        match self {
            TaskRead::Decoded(task) => Ok(task),
            TaskRead::Encoded(bytes) => crate::proto::Task::decode(bytes)
                .map_err(|e| StoreError::Internal(format!("stored task does not decode: {e}"))),
        }
    }

    /// The size of the task's encoding: what answering with it sends.
    pub fn encoded_len(&self) -> usize {
        use prost::Message as _;
        match self {
            TaskRead::Decoded(task) => task.encoded_len(),
            TaskRead::Encoded(bytes) => bytes.len(),
        }
    }

    /// The task with its history trimmed to `history` (spec §3.1.3), the
    /// encoding trimmed as it is.
    pub fn with_history(
        self,
        history: crate::lifecycle::HistoryLength,
    ) -> Result<Self, StoreError> {
        use crate::lifecycle::HistoryLength;
        Ok(match (self, history) {
            (read, HistoryLength::All) => read,
            (TaskRead::Encoded(bytes), HistoryLength::Last(n)) => {
                match super::codec::trim_history(bytes.clone(), n) {
                    Some(trimmed) => TaskRead::Encoded(trimmed),
                    None => {
                        let mut task = TaskRead::Encoded(bytes).into_task()?;
                        history.apply(&mut task);
                        TaskRead::Decoded(task)
                    }
                }
            }
            (TaskRead::Decoded(mut task), history) => {
                history.apply(&mut task);
                TaskRead::Decoded(task)
            }
        })
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
    /// message's id; [`origin_key`](super::origin_key)). The runtime writes encoded records
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

    /// The task and its version, or `None`.
    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError>;

    /// The task and its version if `owner` created it, else `None`, as for
    /// a task that does not exist: the owner is part of the lookup, so
    /// another principal's task is never read (spec §13.1).
    async fn get_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<Option<StoredTask>, StoreError>;

    /// [`TaskStore::get_owned_by`] the principal named `owner`; `None` for
    /// the empty name, which owns nothing ([`Owner::new`]).
    async fn get_owned(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        match Owner::new(owner) {
            Some(owner) => self.get_owned_by(tenant, task_id, &owner).await,
            None => Ok(None),
        }
    }

    /// The task alone, if it exists and, given an `owner`, that principal
    /// created it (GetTask): [`TaskStore::get`] or [`TaskStore::get_owned`]
    /// without the rest of the record, which a store may leave unread.
    async fn get_task(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&str>,
    ) -> Result<Option<crate::proto::Task>, StoreError> {
        let stored = match owner {
            Some(owner) => self.get_owned(tenant, task_id, owner).await?,
            None => self.get(tenant, task_id).await?,
        };
        Ok(stored.map(|s| s.record.task))
    }

    /// [`TaskStore::get_task`] as the store keeps the task: a store that
    /// keeps it encoded may hand out the bytes ([`TaskRead::Encoded`]),
    /// which must decode to what `get_task` returns. The default decodes.
    async fn read_task(
        &self,
        tenant: &str,
        task_id: &str,
        owner: Option<&str>,
    ) -> Result<Option<TaskRead>, StoreError> {
        Ok(self
            .get_task(tenant, task_id, owner)
            .await?
            .map(TaskRead::Decoded))
    }

    /// Whether `owner` created the task: [`TaskStore::get_owned_by`]
    /// without reading the record, so the answer costs the same for
    /// another's task and a missing one.
    async fn is_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<bool, StoreError>;

    /// [`TaskStore::is_owned_by`] the principal named `owner`; `false` for
    /// the empty name, which owns nothing ([`Owner::new`]).
    async fn owns(&self, tenant: &str, task_id: &str, owner: &str) -> Result<bool, StoreError> {
        match Owner::new(owner) {
            Some(owner) => self.is_owned_by(tenant, task_id, &owner).await,
            None => Ok(false),
        }
    }

    /// Whether the store takes records without what repeats another
    /// field ([`codec::encode_compact`](super::codec::encode_compact)):
    /// only a store no other binary reads or writes (the memory store).
    /// A durable store gets every field, so an older binary sharing it (a
    /// replica in a rolling upgrade) or reading it after a downgrade reads
    /// and rewrites its records intact.
    fn compact_records(&self) -> bool {
        false
    }

    /// Whether the store takes writes of changes ([`Body::Changes`](super::Body::Changes));
    /// otherwise every write it gets is whole.
    fn keeps_changes(&self) -> bool {
        false
    }

    /// Replaces the task if its stored version is still `expected_version`;
    /// returns the new version. A write of [`Body::Changes`](super::Body::Changes) changes the
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

    /// Deletes terminal tasks whose status timestamp is before `before`;
    /// returns how many were deleted (retention).
    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError>;

    /// How many tasks `owner` has that have not ended, in every tenant,
    /// counting at most `at_most` (a quota's check need not count further).
    async fn count_open_owned_by(&self, owner: &Owner, at_most: usize)
    -> Result<usize, StoreError>;

    /// [`TaskStore::count_open_owned_by`] the principal named `owner`; 0
    /// for the empty name, which owns nothing ([`Owner::new`]).
    async fn count_open_owned(&self, owner: &str, at_most: usize) -> Result<usize, StoreError> {
        match Owner::new(owner) {
            Some(owner) => self.count_open_owned_by(&owner, at_most).await,
            None => Ok(0),
        }
    }

    /// Tasks waiting for input (INPUT_REQUIRED, AUTH_REQUIRED) since
    /// before `before`, oldest first, at most `limit`: what the input-wait
    /// quota looks at.
    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<Waiting>, StoreError>;

    /// The store's outbox of push notifications, written with the task
    /// changes they report ([`EncodedTask::outbox`]).
    fn outbox(&self) -> &dyn Outbox;

    /// The part by which replicas sharing the store take turns
    /// (idempotency keys, runs, roles, jobs), keep leases and follow each
    /// other's writes; `None` for a store of one process, whose runtime
    /// does all of that in memory. Only [`PostgresStore`](super::PostgresStore)
    /// has one.
    fn coordination(&self) -> Option<&dyn Coordination> {
        None
    }
}
