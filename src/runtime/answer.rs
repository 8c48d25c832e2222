//! The answer owed to the request that sent a new message, and how it is
//! paid.
//!
//! A new message is answered by what its run does first: a direct reply,
//! or a task. A task exists for the client only once its first write has
//! committed, so the answer ([`NewTaskAnswer`]) travels with the run's
//! first event into the live task and is delivered by the flush that
//! commits it (or reports its failure). The answer belongs to the run, not
//! to the request ([`NewMessageReply`]): a client that disconnects still has the
//! repeats of its message answered.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::origin::{MessageClaim, OriginOutcome};
use super::{SendOutcome, Shared, TaskHandle, TaskKey, store_error};
use crate::error::A2aError;
use crate::lifecycle::HistoryLength;
use crate::proto::Task;
use crate::store::StoreError;

/// Where the answer to a new message goes: the request that sent it, and
/// the repeats of the same message that wait on it (idempotent sends). It
/// belongs to the run, not to the request, so a client that goes away
/// still has its repeats answered.
pub(crate) struct NewMessageReply {
    tx: oneshot::Sender<Result<SendOutcome, A2aError>>,
    claim: Option<MessageClaim>,
}

impl NewMessageReply {
    pub(crate) fn new(
        tx: oneshot::Sender<Result<SendOutcome, A2aError>>,
        claim: Option<MessageClaim>,
    ) -> Self {
        NewMessageReply { tx, claim }
    }

    pub(crate) fn send(mut self, outcome: Result<SendOutcome, A2aError>) {
        if let Some(claim) = self.claim.take() {
            claim.resolve(match &outcome {
                Ok(SendOutcome::Task(handle)) => OriginOutcome::Task(handle.snapshot.id.clone()),
                Ok(SendOutcome::Message(m)) => OriginOutcome::Message(m.clone()),
                Err(e) => OriginOutcome::Failed(e.clone()),
            });
        }
        let _ = self.tx.send(outcome);
    }
}

/// The answer owed to the request that created a task, sent once the
/// task's first write commits. Its handle's snapshot is filled then.
pub(crate) struct NewTaskAnswer {
    tenant: String,
    handle: Box<TaskHandle>,
    history: HistoryLength,
    subscribe: bool,
    reply: Option<NewMessageReply>,
}

impl NewTaskAnswer {
    pub(crate) fn new(
        tenant: String,
        handle: TaskHandle,
        history: HistoryLength,
        subscribe: bool,
        reply: Option<NewMessageReply>,
    ) -> Self {
        NewTaskAnswer {
            tenant,
            handle: Box::new(handle),
            history,
            subscribe,
            reply,
        }
    }

    /// Answers the creating request with the outcome of the task's first
    /// write: committed, with the task as it was created (the handle's
    /// snapshot, trimmed to the request's history length); called by the
    /// flush that committed (or dropped) it, so no task of its own waits
    /// for the commit. A create refused as a repeat of the same message
    /// (idempotent sends) answers with the task that message created.
    pub(crate) fn deliver(self, result: Result<Task, &StoreError>, shared: &Arc<Shared>) {
        let Some(reply) = self.reply else {
            return;
        };
        match result {
            Ok(mut created) => {
                let mut handle = self.handle;
                self.history.apply(&mut created);
                handle.snapshot = created;
                reply.send(Ok(SendOutcome::Task(handle)))
            }
            Err(StoreError::DuplicateMessage { task_id }) => {
                let key = TaskKey {
                    tenant: self.tenant,
                    id: task_id.clone(),
                };
                shared.answer_repeat(key, self.history, self.subscribe, reply);
            }
            Err(e) => reply.send(Err(store_error(e.clone()))),
        }
    }
}

/// The handle owed to the request that sent a follow-up message (spec
/// §3.4.3): taken by the flush that commits the message, under the task's
/// lock and before the message's run is admitted, so that its snapshot is
/// the task as that commit leaves it and its subscription starts there.
/// Taken by the request once the commit is over instead, a run quick
/// enough to finish first would be in the snapshot and missing from the
/// stream.
pub(crate) struct FollowUpAnswer {
    pub(crate) history: HistoryLength,
    pub(crate) subscribe: bool,
    /// The message's run.
    pub(crate) run: u64,
    pub(crate) tx: oneshot::Sender<TaskHandle>,
}
