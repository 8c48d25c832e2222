//! The part of a store that replicas sharing it coordinate through
//! ([`Coordination`]): who runs what, leases, roles and jobs, and each
//! other's writes. Only a store that several processes share has it
//! ([`PostgresStore`](super::PostgresStore)); for a store of one process
//! ([`TaskStore::coordination`] is `None`) the runtime does each of these
//! in memory.

use async_trait::async_trait;

#[cfg(doc)]
use super::{EncodedTask, TaskStore};
use super::{OriginState, StoreError, StoredTask};
use crate::lifecycle::TaskRecord;

/// How replicas sharing a store take turns and follow each other
/// ([`TaskStore::coordination`]). Without it, for a store of one process,
/// the runtime:
/// - deduplicates new messages in memory and looks their task up by
///   [`TaskStore::find_by_origin`] (no claims to take or release);
/// - runs one run per task at a time in memory (no run claims);
/// - at start-up fails every active task ([`TaskStore::active_tasks`]),
///   and never sweeps again: nobody else's runs can end unseen;
/// - keeps no lease: its writes are never refused for one;
/// - has no other writer to follow, so nothing to watch or catch up on;
/// - holds every role and runs every periodic job itself.
#[async_trait]
pub trait Coordination: Send + Sync {
    /// Claims the idempotency key of a new message `owner` sent in
    /// `tenant` before its run starts, so that one replica of several
    /// sharing a store runs it: [`OriginState::First`] to the one that
    /// claims it first, [`OriginState::Elsewhere`] to the others while it
    /// runs, then its task.
    async fn claim_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<OriginState, StoreError>;

    /// Releases a claim ([`OriginState::First`]) whose run created no task
    /// (a direct reply, a failure): the message may be sent again.
    async fn release_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<(), StoreError>;

    /// Claims task `task_id` for the run of a follow-up message queued
    /// here, so that of the replicas sharing a store, one at a time runs
    /// the task: `Some(version)` (the task's version now) when this process
    /// holds it, `None` while another live one does. A create holds its
    /// task for the first run. Called before each follow-up's run starts,
    /// held or not: a claim settles one of the runs this process owes the
    /// task ([`EncodedTask::owes_runs`]).
    async fn claim_run(&self, tenant: &str, task_id: &str) -> Result<Option<u64>, StoreError>;

    /// Holds the task's runs, free, this process's already, or taken from
    /// a replica declared dead, without starting a run or settling one
    /// owed: `true` when this process holds them (it releases them,
    /// [`Coordination::release_run`], unless the task ends), `false` while
    /// another live one does. The orphan sweep takes them before it fails
    /// an interrupted task owing a dead replica's run: a process that
    /// rejoined under a new id may be starting that very run (its claim
    /// settles what it owed under its old id), and one of the two then
    /// finds the runs held.
    async fn take_runs(&self, tenant: &str, task_id: &str) -> Result<bool, StoreError>;

    /// Releases this process's claim on the task's runs
    /// ([`Coordination::claim_run`]) after a run that left it interrupted,
    /// and wakes the replicas whose queued runs wait for it
    /// ([`Coordination::changes`]).
    async fn release_run(&self, tenant: &str, task_id: &str) -> Result<(), StoreError>;

    /// The tasks nothing runs any more, in all tenants: the active ones
    /// whose runner's lease has expired, and the interrupted ones owing a
    /// run to such a replica
    /// ([`EncodedTask::owes_runs`]): a follow-up nothing will run.
    async fn orphaned_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError>;

    /// How long the lease is that each replica renews: orphaned tasks
    /// ([`Coordination::orphaned_tasks`]) are looked for while serving, not
    /// only at start-up, and roles and jobs are timed by it.
    fn lease(&self) -> std::time::Duration;

    /// How long this process's lease is certainly still held
    /// ([`Coordination::lease`]): zero while it is not (renewals late or
    /// failing, the process paused), and then the store refuses writes.
    fn held_for(&self) -> std::time::Duration;

    /// Counts the times this process lost its lease: each time, the runs
    /// started before are stopped (their tasks may be taken over by
    /// another replica).
    fn lease_losses(&self) -> tokio::sync::watch::Receiver<u64>;

    /// Committed task writes as they happen, from every replica. Only a
    /// wake-up: a change missed is caught up by version
    /// ([`Coordination::catch_up`]).
    fn changes(&self) -> tokio::sync::broadcast::Receiver<WriteNotice>;

    /// Marks (`on`) or unmarks the task as followed by this process
    /// without its run here, so that the store announces the run's writes
    /// to it ([`Coordination::changes`]); a client's writes are announced
    /// anyway.
    async fn watch(&self, tenant: &str, task_id: &str, on: bool) -> Result<(), StoreError>;

    /// The task as stored now and the events of each write after version
    /// `after` ([`Coordination::changes`]); `None` when the task is gone. The
    /// task comes whole, or as the changes after `after` from a store that
    /// has them all ([`Caught`]).
    async fn catch_up(
        &self,
        tenant: &str,
        task_id: &str,
        after: u64,
    ) -> Result<Option<CatchUp>, StoreError>;

    /// Whether this process holds `role`, which one process at a time of
    /// those sharing the store holds (push delivery, [`DELIVERY_ROLE`](super::DELIVERY_ROLE)):
    /// taken when free or when its holder has not renewed it for a lease,
    /// renewed by holding it again (call it every third of
    /// [`Coordination::lease`]). Finishing and deferring outbox entries are
    /// done under [`DELIVERY_ROLE`](super::DELIVERY_ROLE) as last held, and do nothing once it
    /// changed hands.
    async fn hold(&self, role: &str) -> Result<bool, StoreError>;

    /// Whether this process should run the periodic job `job` now, at most
    /// once per `every` across every process sharing the store.
    async fn take_turn(&self, job: &str, every: std::time::Duration) -> Result<bool, StoreError>;
}

/// A task write another replica committed, as a store shared by replicas
/// reports it ([`Coordination::changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteNotice {
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
/// ([`Coordination::catch_up`]).
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

/// How [`Coordination::catch_up`] gives the task as it is now.
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
