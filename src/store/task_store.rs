//! The [`TaskStore`] contract: what every backend does with the tasks it
//! keeps ([`StoredTask`]).

use crate::lifecycle::TaskRecord;
use crate::proto::TaskState;
use crate::wkt::Timestamp;
use async_trait::async_trait;

use super::{
    CatchUp, Caught, Delivery, EncodedTask, ListQuery, OriginState, Owner, StoreError, TaskPage,
    Waiting, WriteNotice,
};

/// A stored task and its version.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTask {
    pub record: TaskRecord,
    pub version: u64,
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

    /// Claims the idempotency key of a new message `owner` sent in
    /// `tenant` before its run starts, so that one replica of several
    /// sharing a store runs it. A store with one process (memory, SQLite)
    /// only looks the task up: its runtime deduplicates in memory.
    async fn claim_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<OriginState, StoreError> {
        Ok(
            match self.find_by_origin(tenant, owner, message_id).await? {
                Some(task) => OriginState::Task(Box::new(task)),
                None => OriginState::First,
            },
        )
    }

    /// Releases a claim ([`OriginState::First`]) whose run created no task
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
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<WriteNotice>> {
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
    /// those sharing the store holds (push delivery, [`DELIVERY_ROLE`](super::DELIVERY_ROLE)):
    /// taken when free or when its holder has not renewed it for a lease,
    /// renewed by holding it again (call it every third of
    /// [`TaskStore::lease`]). Finishing and deferring outbox entries are
    /// done under [`DELIVERY_ROLE`](super::DELIVERY_ROLE) as last held, and do nothing once it
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
