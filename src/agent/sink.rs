//! The [`EventSink`]: how an executor tells the server what happened.
//!
//! An executor never touches its task. It emits events through the sink it
//! was given, and the server applies each one with the lifecycle rules
//! (status moves, artifact chunks, metadata), stores it and sends it to the
//! task's streams and subscribers, in the order emitted. Every method
//! answers once the event is accepted; an event the task cannot take is a
//! [`SinkError`], and the task is left as it was.
//!
//! The events of a run, as an executor emits them:
//! - a first event, which decides the answer to a new message: a status or
//!   artifact creates the task (SUBMITTED, then the event), a
//!   [`EventSink::reply`] answers with a message and no task;
//! - status changes ([`EventSink::status`]) and artifact chunks
//!   ([`EventSink::artifact`], [`EventSink::artifact_text`]);
//! - a last status: terminal (COMPLETED, FAILED, REJECTED) or interrupted
//!   (INPUT_REQUIRED, AUTH_REQUIRED, where the next message continues it).
//!
//! [`SinkError::TaskClosed`] is the one every long-running executor meets:
//! the task ended without it (a client canceled it, `--task-timeout` failed
//! it), and the executor should stop.

use std::sync::Arc;

use async_trait::async_trait;

use crate::lifecycle::{ApplyError, ArtifactUpdate, StatusUpdate, TaskEvent};
use crate::proto::{Artifact, Message, Part, Role, TaskState, part::Content};
use crate::store::StoreError;

/// Why the sink refused an event. The task is unchanged by a refused
/// event; an executor should stop on any of these, and may return it (as
/// [`super::AgentError::Sink`]) to fail the task with it.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The task has ended (canceled by a client, failed by the server's
    /// task timeout, or ended by an earlier event): it takes no more events.
    #[error("task {task_id:?} is closed ({}): it accepts no more events", .state.as_str_name())]
    TaskClosed { task_id: String, state: TaskState },
    /// The lifecycle rules refused the event (a sealed artifact, an append
    /// to an unknown artifact, an invalid state, ...).
    #[error("event refused: {0}")]
    Rejected(ApplyError),
    /// The task store failed; the runtime fails the task once it recovers.
    #[error("task store failed: {0}")]
    Store(#[from] StoreError),
    /// The event would make the task larger than `limit` bytes encoded.
    #[error("task {task_id:?} would grow to {size} bytes encoded, over the {limit}-byte limit")]
    TooLarge {
        task_id: String,
        size: usize,
        limit: usize,
    },
    #[error("the agent already replied with a message; this request has no task")]
    AlreadyReplied,
    #[error("a direct reply is only possible before a task exists")]
    ReplyOnTask,
    #[error("the run has ended")]
    RunEnded,
    /// The same message already created task `task_id`; this run's task was
    /// not created and the run should stop.
    #[error("the message already created task {task_id:?}")]
    Duplicate { task_id: String },
}

impl SinkError {
    /// The lifecycle core's refusal, with the one an executor acts on (a
    /// closed task) told apart.
    pub(crate) fn refused(task_id: &str, error: ApplyError) -> Self {
        match error {
            ApplyError::Terminal(state) => SinkError::TaskClosed {
                task_id: task_id.to_owned(),
                state,
            },
            other => SinkError::Rejected(other),
        }
    }
}

/// What the runtime provides behind an [`EventSink`]: the run's task and
/// the path its events take.
#[async_trait]
pub(crate) trait SinkTarget: Send + Sync {
    fn task_id(&self) -> &str;
    fn context_id(&self) -> &str;
    async fn emit(&self, event: TaskEvent) -> Result<(), SinkError>;
    async fn reply(&self, message: Message) -> Result<(), SinkError>;
}

/// Where an executor sends its events. Cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    target: Arc<dyn SinkTarget>,
}

impl EventSink {
    pub(crate) fn new(target: Arc<dyn SinkTarget>) -> Self {
        EventSink { target }
    }

    /// The task this run works on (new, or continued by the message).
    pub fn task_id(&self) -> &str {
        self.target.task_id()
    }

    pub fn context_id(&self) -> &str {
        self.target.context_id()
    }

    /// Moves the task to `state`, with an optional agent text message.
    pub async fn status(&self, state: TaskState, text: Option<&str>) -> Result<(), SinkError> {
        self.status_update(StatusUpdate {
            state,
            message: text.map(agent_text),
            metadata: None,
        })
        .await
    }

    /// Moves the task to a new status, with a message and metadata of the
    /// agent's choosing.
    pub async fn status_update(&self, update: StatusUpdate) -> Result<(), SinkError> {
        self.target.emit(TaskEvent::Status(update)).await
    }

    /// Sets keys of `Task.metadata` (spec §4.1.1): each key of `metadata`
    /// replaces the task's value for it; a null value removes the key. It is
    /// stored with the task and shown by every later read or snapshot; it
    /// is not a stream event.
    pub async fn task_metadata(&self, metadata: crate::wkt::Struct) -> Result<(), SinkError> {
        self.target.emit(TaskEvent::Metadata(metadata)).await
    }

    /// Emits an artifact chunk (spec §4.2.2): a new artifact, a replacement
    /// of one, or (`append`) more parts for it; `last_chunk` seals it.
    pub async fn artifact(&self, update: ArtifactUpdate) -> Result<(), SinkError> {
        self.target.emit(TaskEvent::Artifact(update)).await
    }

    /// Emits a one-part text artifact chunk.
    pub async fn artifact_text(
        &self,
        artifact_id: &str,
        name: &str,
        text: &str,
        append: bool,
        last_chunk: bool,
    ) -> Result<(), SinkError> {
        self.artifact(ArtifactUpdate {
            artifact: Artifact {
                artifact_id: artifact_id.to_owned(),
                name: name.to_owned(),
                parts: vec![Part {
                    content: Some(Content::Text(text.to_owned())),
                    media_type: "text/plain".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            append,
            last_chunk,
            metadata: None,
        })
        .await
    }

    /// Answers a new message with a direct agent message and no task
    /// (spec §3.1.1). Only possible as the first event of a new message.
    pub async fn reply(&self, message: Message) -> Result<(), SinkError> {
        self.target.reply(message).await
    }

    /// A text [`EventSink::reply`].
    pub async fn reply_text(&self, text: &str) -> Result<(), SinkError> {
        self.reply(agent_text(text)).await
    }
}

/// An agent text message, with a fresh id.
pub fn agent_text(text: impl Into<String>) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: Role::Agent as i32,
        parts: vec![Part {
            content: Some(Content::Text(text.into())),
            ..Default::default()
        }],
        ..Default::default()
    }
}
