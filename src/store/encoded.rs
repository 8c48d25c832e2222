//! A task write as the stores take it: encoded once by the runtime, with
//! the fields the stores index and what the write commits beside it.

use std::sync::Arc;

use crate::lifecycle::TaskRecord;
use crate::proto::TaskState;

use super::{OutboxEntry, StoreError, TimeKey, codec, origin_of, status_key};

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
    /// The idempotency key ([`origin_key`](super::origin_key) of the owner and the creating
    /// message's id); empty for a task without a creating message.
    pub origin: Vec<u8>,
    /// Push notifications this write makes due, stored by the same write
    /// (a transactional outbox): committed together or not at all.
    pub outbox: Vec<OutboxEntry>,
    /// The stream events this write commits, each an encoded
    /// `StreamResponse`, length-delimited: kept by a store shared by
    /// replicas for the other replicas' subscribers
    /// ([`Coordination::catch_up`](super::Coordination::catch_up)); filled only for such a store.
    pub events: Vec<u8>,
    /// With a whole body, what the write changed ([`crate::lifecycle::Changes`],
    /// encoded), for a store shared by replicas to keep beside the record,
    /// so that a replica following the task catches up on this write by
    /// its changes as on any other, not by reading the task again
    /// ([`Caught::Changes`](super::Caught::Changes)). Set by the runtime for a whole write of a
    /// running task; `None` otherwise, and ignored by other stores.
    pub logged: Option<Arc<[u8]>>,
    /// The write carries an agent's events: a store shared by replicas
    /// records the writing replica as the one running the task (what
    /// recovery by lease looks at). A creating write always does.
    pub by_run: bool,
    /// Follow-up messages this write commits whose runs are still to start
    /// here: a store shared by replicas records that this replica owes the task
    /// that many runs, until
    /// [`Coordination::claim_run`](super::Coordination::claim_run) before each
    /// settles one. A task owing a run to a replica declared dead is orphaned
    /// ([`Coordination::orphaned_tasks`](super::Coordination::orphaned_tasks)).
    pub owes_runs: u16,
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
    /// store that [keeps changes](super::TaskStore::keeps_changes).
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
