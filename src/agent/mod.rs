//! Writing an agent: everything an agent author needs is in this module.
//!
//! An agent is an [`AgentExecutor`]. The server calls
//! [`AgentExecutor::execute`] once per message it accepts for the agent,
//! with the message and its task ([`RequestContext`]) and an [`EventSink`].
//! The executor never touches the task: it emits events through the sink,
//! and the server applies each one with the lifecycle rules, stores it and
//! sends it to the task's streams, in order. An executor that returns an
//! error or panics leaves its task FAILED with a status message, never
//! stuck; so does one that returns while its task is still SUBMITTED or
//! WORKING.
//!
//! # A first agent
//!
//! ```
//! use std::sync::Arc;
//!
//! use a2a_lifecycle::agent::{
//!     AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext, SinkError,
//!     basic_card, skill,
//! };
//! use a2a_lifecycle::proto::{AgentCard, TaskState};
//!
//! /// Shouts the message back; asks again when there is nothing to shout.
//! struct Shouter;
//!
//! #[async_trait::async_trait]
//! impl AgentExecutor for Shouter {
//!     async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
//!         let text = ctx.text();
//!         if text.is_empty() {
//!             // Interrupted: the task waits for the client's next message,
//!             // which starts another run on the same task.
//!             sink.status(TaskState::InputRequired, Some("What should I shout?")).await?;
//!             return Ok(());
//!         }
//!         // The first event creates the task (SUBMITTED, then WORKING).
//!         sink.status(TaskState::Working, None).await?;
//!         for (i, word) in text.split_whitespace().enumerate() {
//!             if ctx.cancelled.is_cancelled() {
//!                 return Ok(()); // the server has already ended the task
//!             }
//!             let chunk = format!("{} ", word.to_uppercase());
//!             match sink.artifact_text("shout", "shout", &chunk, i > 0, false).await {
//!                 Ok(()) => {}
//!                 // Canceled by a client, or failed by the task timeout:
//!                 // stop quietly.
//!                 Err(SinkError::TaskClosed { .. }) => return Ok(()),
//!                 Err(other) => return Err(other.into()),
//!             }
//!         }
//!         sink.artifact_text("shout", "shout", "!", true, true).await?;
//!         sink.status(TaskState::Completed, Some("Shouted.")).await?;
//!         Ok(())
//!     }
//!
//!     fn card(&self) -> AgentCard {
//!         basic_card("Shouter", "Shouts your message back.", vec![
//!             skill("shout", "Shout", "Upper-cases every word.", &["shout"]),
//!         ])
//!     }
//! }
//!
//! // Served for requests without a tenant, and under the tenant "shouter".
//! let agents = AgentRouter::new()
//!     .with("", Arc::new(Shouter))
//!     .with("shouter", Arc::new(Shouter));
//! # let _ = agents;
//! ```
//!
//! Serve it with `a2a_lifecycle::server::serve` (README, Embedding).
//!
//! # What to emit, and when
//!
//! - **The first event decides the answer to a new message.** A status or
//!   an artifact creates the task; [`EventSink::reply`] instead answers
//!   with a message and no task. A non-blocking SendMessage waits for this
//!   first event, so emit it promptly.
//! - **Statuses** move the task (spec §3.1.6): any state out of a
//!   non-terminal one, none out of a terminal one. End with a terminal
//!   state (COMPLETED, FAILED, REJECTED) or an interrupted one
//!   (INPUT_REQUIRED, AUTH_REQUIRED) and return.
//! - **Artifacts** arrive in chunks ([`lifecycle::ArtifactUpdate`](crate::lifecycle::ArtifactUpdate)):
//!   `append` adds parts to the artifact, `last_chunk` seals it.
//! - **Every sink call waits** until the event is accepted, in order; the
//!   server commits it (often batched with its neighbours) before any
//!   client sees it.
//!
//! # When the task ends without the agent
//!
//! A client may cancel the task (CancelTask), and `serve --task-timeout`
//! may fail it. Either way `ctx.cancelled` fires, and the next sink call
//! answers [`SinkError::TaskClosed`]: stop, and return `Ok(())` (the task
//! is already terminal). [`AgentExecutor::cancel`] is then called to free
//! what the agent holds.
//!
//! # One run at a time
//!
//! Runs on one task never overlap: a message sent while a run is going
//! joins the task's history at once and starts the next run when this one
//! ends, with `ctx.task` holding everything said so far.
//!
//! The [`demo`] agents (test-runner, code-reviewer, deployer) show every
//! flow: blocking, streaming, input-required, auth-required, rejected,
//! failed and canceled.

pub mod demo;
pub mod router;
pub mod sink;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub use router::AgentRouter;
pub use sink::{EventSink, SinkError, agent_text};

use crate::proto::{AgentCapabilities, AgentCard, AgentSkill, Message, Task};

/// What an executor is asked to do.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The routing tenant of the request (spec §4.4.6, `AgentInterface.tenant`).
    pub tenant: String,
    /// The task this run works on: new, or continued by `message.task_id`.
    pub task_id: String,
    pub context_id: String,
    /// The client message that started this run, with task and context ids
    /// filled in.
    pub message: Message,
    /// The task as it was when the run started, the message already in its
    /// history (with any messages accepted after it while an earlier run
    /// was going); `None` for a message that may create a new task.
    pub task: Option<Task>,
    /// The request's own metadata (spec §3.2.5): `SendMessageRequest.metadata`
    /// for a run, `CancelTaskRequest.metadata` for the cancel hook. The
    /// message's metadata is `message.metadata`.
    pub metadata: Option<crate::wkt::Struct>,
    /// `SendMessageConfiguration.accepted_output_modes` (spec §3.2.2): the
    /// media types the client accepts in responses; empty means any.
    pub accepted_output_modes: Vec<String>,
    /// Cancelled when a client cancels the task or the server shuts down;
    /// long-running executors should watch it.
    pub cancelled: CancellationToken,
}

impl RequestContext {
    /// The concatenated text parts of the incoming message.
    pub fn text(&self) -> String {
        message_text(&self.message)
    }
}

/// The concatenated text parts of a message.
pub fn message_text(message: &Message) -> String {
    use crate::proto::part::Content;
    message
        .parts
        .iter()
        .filter_map(|p| match &p.content {
            Some(Content::Text(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Why an executor gave up; becomes the FAILED status message.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// The work behind an agent.
///
/// `execute` runs once per accepted message. For a new message its first
/// event decides what the client gets: [`EventSink::reply`] answers with a
/// direct `Message` and no task; any status or artifact event creates the
/// task (SUBMITTED) and applies the event to it. Emit that first event
/// promptly: a non-blocking SendMessage waits for it. `execute` may return
/// while the task is interrupted (INPUT_REQUIRED, AUTH_REQUIRED) or terminal;
/// returning while it is still SUBMITTED or WORKING fails the task.
///
/// Runs on one task never overlap (spec §3.4 multi-turn, one executor per
/// task): a message that arrives while a run is going is committed to the
/// task's history at once and starts the next run when the current one
/// ends; `ctx.task` then holds everything said so far. A task that became
/// terminal meanwhile starts no further run.
#[async_trait]
pub trait AgentExecutor: Send + Sync + 'static {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError>;

    /// Called when a client cancels the task (spec §3.1.5), after
    /// `ctx.cancelled` fired. The runtime moves the task to CANCELED itself;
    /// this hook is for releasing what the agent holds.
    async fn cancel(&self, _ctx: RequestContext) -> Result<(), AgentError> {
        Ok(())
    }

    /// What this agent says about itself (spec §4.4.1): name, skills,
    /// capabilities, extensions. The server fills in where it is reached
    /// (`supported_interfaces`), push support and the extended-card flag,
    /// and enforces what the card declares (spec §3.3.4): without
    /// `capabilities.streaming` the streaming RPCs are refused, and an
    /// extension marked `required` must be declared by each request.
    fn card(&self) -> AgentCard {
        basic_card("A2A agent", "An agent served by a2a-lifecycle.", Vec::new())
    }
}

/// A card with the defaults the demo agents share: this crate's version,
/// streaming on, text in and out.
pub fn basic_card(name: &str, description: &str, skills: Vec<AgentSkill>) -> AgentCard {
    AgentCard {
        name: name.into(),
        description: description.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        capabilities: Some(AgentCapabilities {
            streaming: Some(true),
            ..Default::default()
        }),
        default_input_modes: vec!["text/plain".into()],
        default_output_modes: vec!["text/plain".into()],
        skills,
        ..Default::default()
    }
}

/// A skill entry for a card (spec §4.4.5).
pub fn skill(id: &str, name: &str, description: &str, examples: &[&str]) -> AgentSkill {
    AgentSkill {
        id: id.into(),
        name: name.into(),
        description: description.into(),
        tags: vec![id.into()],
        examples: examples.iter().map(|e| (*e).into()).collect(),
        ..Default::default()
    }
}
