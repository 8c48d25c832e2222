//! Agents: the [`AgentExecutor`] contract, the context it runs in, and the
//! demo agents.
//!
//! An executor does the work behind a message. It never touches the task
//! directly: it emits status, artifact and message events through an
//! [`EventSink`], and the runtime applies them with the lifecycle core,
//! persists them and broadcasts them. An executor that returns an error or
//! panics leaves its task FAILED with a status message, never stuck.

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
    pub metadata: Option<prost_types::Struct>,
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
