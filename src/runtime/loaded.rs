//! A live task's cached copy: the working record (every accepted event
//! applied), the committed one (what the store holds), the events between
//! them, and who wrote each.
//!
//! The working copy runs ahead of the store while events wait for their
//! commit (the `commit` part); readers and new subscribers see only the
//! committed copy, kept in step by replaying each commit's changes rather
//! than copying the task (issue "long-lived tasks").

use std::borrow::Cow;
use std::sync::Arc;

use tokio::sync::{MutexGuard, broadcast, oneshot};

use super::Shared;
use super::answer::{FollowUpAnswer, NewTaskAnswer};
use crate::error::A2aError;
use crate::lifecycle::{Cause, Change, TaskEvent, TaskRecord, TransitionPolicy};
use crate::proto::{StreamResponse, Task, TaskState};
use crate::store::{Caught, StoreError};

/// What a task's broadcast carries. Always behind an `Arc` (one allocation
/// per broadcast, shared by every subscriber), so the variants' sizes do not
/// matter. A stream holding the last reference takes it; others copy it.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
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

pub(crate) type StateGuard<'a> = MutexGuard<'a, Option<Loaded>>;

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
    pub(super) committed: Option<TaskRecord>,
    pub(super) version: u64,
    /// Accepted, not yet committed, in order.
    pub(super) pending: Vec<Pending>,
    /// A background flush is running.
    pub(super) flushing: bool,
    /// A commit failed and dropped accepted events; reported to the agent's
    /// next event.
    pub(super) failure: Option<StoreError>,
    pub(super) events: Option<broadcast::Sender<Broadcast>>,
    /// At least the encoded size of the working copy's task: exact after
    /// each whole write, grown by each accepted event's size in between
    /// (see [`MAX_TASK_BYTES`]).
    pub(super) bytes: usize,
    /// The encoded size of the task's last whole record in the store, and
    /// of the changes written since: what decides when a write is whole
    /// again ([`MIN_CHANGES_BEFORE_WHOLE`]).
    pub(super) whole_bytes: usize,
    pub(super) changes_bytes: usize,
}

/// A write of a task's changes ([`Body::Changes`](crate::store::Body::Changes)) is made whole instead
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
pub(super) fn event_bytes(event: &TaskEvent) -> usize {
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
pub(super) struct Pending {
    /// The event, kept to be applied again after a version conflict: only
    /// with a store shared by replicas ([`super::Shared::replicas`]), as
    /// nothing else moves a task under this process's lock.
    pub(super) event: Option<TaskEvent>,
    /// What applying it changed in the working copy; taken by the write
    /// that commits it.
    pub(super) changes: Vec<Change>,
    /// `changes` holds what it changed; false for an event applied before
    /// its task was stored (`LiveTask::submit_locked_from`): a write that
    /// carries it must be whole.
    pub(super) logged: bool,
    pub(super) author: Author,
    /// The run current when it was accepted.
    pub(super) run: u64,
    /// A follow-up message whose queued run waits for this commit.
    pub(super) follow_up: Option<u64>,
    pub(super) out: Option<StreamResponse>,
    pub(super) notify: Vec<oneshot::Sender<Result<(), StoreError>>>,
    /// The creating request's answer, when this event's write creates the
    /// task.
    pub(super) answer: Option<NewTaskAnswer>,
    /// The handle owed to the request that sent this follow-up message.
    pub(super) handle_to: Option<FollowUpAnswer>,
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
    pub(super) fn reload(&mut self, record: TaskRecord, version: u64) {
        *self = Loaded {
            pending: std::mem::take(&mut self.pending),
            flushing: self.flushing,
            failure: self.failure.take(),
            events: self.events.take(),
            ..Loaded::new(record, version)
        };
    }

    /// The committed record (see [`Loaded::committed`]).
    pub(super) fn committed_record(&self) -> &TaskRecord {
        match &self.committed {
            Some(committed) if !self.pending.is_empty() => committed,
            _ => &self.record,
        }
    }

    /// The committed task, taken (what [`Loaded::task`] shows), for the
    /// last holder of a task no one else can read from any more.
    pub(super) fn take_committed_task(&mut self) -> Task {
        let record = match &mut self.committed {
            Some(committed) if !self.pending.is_empty() => committed,
            _ => &mut self.record,
        };
        std::mem::take(&mut record.task)
    }

    /// The committed state.
    pub(super) fn committed_state(&self) -> TaskState {
        self.committed_record().state()
    }

    /// Takes in what other writers committed, up to `version`: the
    /// committed copy becomes the task as stored then. Without events
    /// pending the working copy is the committed one and moves with it;
    /// with events pending the caller re-applies them on it (a rebase).
    /// Changes are replayed, at the cost of what they changed, not of the
    /// task (issue "long-lived tasks"). False when they do not follow from
    /// the copy held (not expected): the caller reads the task whole.
    pub(super) fn take_committed(&mut self, caught: Caught, version: u64) -> bool {
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

impl Author {
    /// What the transition log records as the cause of a state this
    /// author writes ([`crate::lifecycle::transitions`]).
    pub(super) fn cause(self) -> Cause {
        match self {
            Author::Agent { follow_up: false } => Cause::Agent,
            Author::Agent { follow_up: true } => Cause::FollowUp,
            Author::Server(cause) => cause,
        }
    }

    pub(super) fn is_agent(self) -> bool {
        matches!(self, Author::Agent { .. })
    }
}

pub(super) fn policy(shared: &Shared, author: Author) -> TransitionPolicy {
    match author {
        Author::Agent { .. } => shared.config.policy,
        Author::Server(_) => TransitionPolicy::Permissive,
    }
}
