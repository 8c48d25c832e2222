//! What a store shared by replicas tells a replica of the others' writes:
//! notices as they commit, and a task caught up since a version.

use crate::lifecycle::TaskRecord;

/// A task write another replica committed, as a store shared by replicas
/// reports it ([`TaskStore::changes`](super::TaskStore::changes)).
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
/// ([`TaskStore::catch_up`](super::TaskStore::catch_up)).
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

/// How [`TaskStore::catch_up`](super::TaskStore::catch_up) gives the task as it is now.
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
