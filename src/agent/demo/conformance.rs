//! `conformance`: the system under test for the official A2A TCK
//! (Technology Compatibility Kit, <https://github.com/a2aproject/a2a-tck>).
//!
//! The kit has no side channel to the agent it tests: each of its tests
//! selects the behaviour it needs through the prefix of
//! `message.message_id` (the kit's `scenarios/*.feature` files), and it
//! never sets `tenant`, so this agent has to be the server's default
//! (empty tenant) agent while the kit runs.
//!
//! | message_id prefix | behaviour |
//! | --- | --- |
//! | `tck-complete-task` | COMPLETED, agent status message "Hello from TCK" |
//! | `tck-input-required` | INPUT_REQUIRED with an agent status message asking for input; a follow-up message on the task completes it |
//! | `tck-message-response` | a direct agent Message "Direct message response", no task |
//! | `tck-reject-task` | REJECTED |
//! | `tck-artifact-text` | a text artifact, then COMPLETED |
//! | `tck-artifact-file` | a raw-bytes artifact (media type, filename), then COMPLETED |
//! | `tck-artifact-file-url` | a url artifact (media type, filename), then COMPLETED |
//! | `tck-artifact-data` | a structured data artifact, then COMPLETED |
//! | `tck-stream-001`, `tck-stream-003`, `tck-stream-artifact-text` | WORKING, a text artifact, COMPLETED |
//! | `tck-stream-artifact-file` | WORKING, a raw-bytes artifact, COMPLETED |
//! | `tck-stream-002` | COMPLETED directly |
//! | `tck-stream-ordering-001` | WORKING, a text artifact "Ordered output", COMPLETED |
//! | `tck-stream-artifact-chunked` | WORKING, one artifact in two chunks (the second with `append` and `last_chunk`), COMPLETED |
//! | `test-resubscribe-message-id` | WORKING, non-terminal for [`RESUBSCRIBE_HOLD`] (4 s), COMPLETED |
//! | `tck-delayed-complete` | WORKING, non-terminal for [`DELAYED_COMPLETE_HOLD`] (1 s), COMPLETED "Done after delay" (the kit's execution-mode tests: a blocking send must wait for it, a non-blocking one must not) |
//! | anything else | an `echo` artifact holding the user's text, COMPLETED |
//!
//! Several prefixes extend others (`tck-artifact-file-url` starts with
//! `tck-artifact-file`), so the longest matching prefix wins, whatever the
//! order of the table.
//!
//! Cancel (spec §3.1.5): the runtime itself moves a canceled task to
//! CANCELED, so no `cancel` hook is needed; the one long run,
//! `test-resubscribe-message-id`, watches `ctx.cancelled` so that it stops
//! at once instead of holding its task for the rest of the 4 s.

use std::time::Duration;

use async_trait::async_trait;

use crate::agent::{
    AgentError, AgentExecutor, EventSink, RequestContext, SinkError, basic_card, skill,
};
use crate::lifecycle::ArtifactUpdate;
use crate::proto::{AgentCard, Artifact, Part, TaskState, part::Content};

/// How long a `test-resubscribe-message-id` task stays WORKING. The kit
/// subscribes to it after the send returns and needs it still open: its
/// requirements ask for at least twice its streaming timeout (2 s by
/// default).
pub const RESUBSCRIBE_HOLD: Duration = Duration::from_secs(4);

/// How long a `tck-delayed-complete` task stays WORKING: long enough that
/// a non-blocking send visibly returns first, short enough for a blocking
/// one to wait it out.
pub const DELAYED_COMPLETE_HOLD: Duration = Duration::from_secs(1);

/// The id of the single artifact most rows produce.
const ARTIFACT_ID: &str = "tck-artifact";
/// The id shared by both chunks of `tck-stream-artifact-chunked`.
const CHUNKED_ARTIFACT_ID: &str = "tck-chunked-artifact";
const ECHO_ARTIFACT_ID: &str = "echo";

const FILE_BYTES: &[u8] = b"tck";
const FILE_URL: &str = "https://example.com/output.txt";
const FILE_NAME: &str = "output.txt";
const FILE_MEDIA_TYPE: &str = "text/plain";

/// What a row of the table does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    CompleteTask,
    InputRequired,
    MessageResponse,
    RejectTask,
    /// One artifact, then COMPLETED, as the kit's artifact scenarios ask.
    CompleteWithArtifact(Output),
    /// WORKING, one artifact, COMPLETED: a stream then carries a status
    /// update, an artifact update and the terminal update, in that order.
    WorkWithArtifact(Output),
    CompleteDirectly,
    WorkWithChunkedArtifact,
    /// WORKING for a while, then COMPLETED with this status text, if any.
    WorkAndHold(Duration, Option<&'static str>),
}

/// The content of an artifact's only part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Text(&'static str),
    File,
    FileUrl,
    Data,
}

use Behaviour::*;
use Output::*;

/// The kit's message id prefixes (see the module documentation), one row
/// per line like the table there.
#[rustfmt::skip]
const BEHAVIOURS: &[(&str, Behaviour)] = &[
    ("tck-complete-task",           CompleteTask),
    ("tck-input-required",          InputRequired),
    ("tck-message-response",        MessageResponse),
    ("tck-reject-task",             RejectTask),
    ("tck-artifact-text",           CompleteWithArtifact(Text("Generated text content"))),
    ("tck-artifact-file",           CompleteWithArtifact(File)),
    ("tck-artifact-file-url",       CompleteWithArtifact(FileUrl)),
    ("tck-artifact-data",           CompleteWithArtifact(Data)),
    ("tck-stream-001",              WorkWithArtifact(Text("Stream hello from TCK"))),
    ("tck-stream-003",              WorkWithArtifact(Text("Stream task lifecycle"))),
    ("tck-stream-artifact-text",    WorkWithArtifact(Text("Streamed text content"))),
    ("tck-stream-artifact-file",    WorkWithArtifact(File)),
    ("tck-stream-002",              CompleteDirectly),
    ("tck-stream-ordering-001",     WorkWithArtifact(Text("Ordered output"))),
    ("tck-stream-artifact-chunked", WorkWithChunkedArtifact),
    ("test-resubscribe-message-id", WorkAndHold(RESUBSCRIBE_HOLD, None)),
    ("tck-delayed-complete",        WorkAndHold(DELAYED_COMPLETE_HOLD, Some("Done after delay"))),
];

/// The behaviour of the longest prefix of `message_id` in [`BEHAVIOURS`].
fn behaviour(message_id: &str) -> Option<Behaviour> {
    BEHAVIOURS
        .iter()
        .filter(|(prefix, _)| message_id.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, behaviour)| behaviour)
}

fn part(output: Output) -> Part {
    match output {
        Text(text) => Part {
            content: Some(Content::Text(text.to_owned())),
            media_type: "text/plain".into(),
            ..Default::default()
        },
        File => Part {
            content: Some(Content::Raw(FILE_BYTES.to_vec())),
            media_type: FILE_MEDIA_TYPE.into(),
            filename: FILE_NAME.into(),
            ..Default::default()
        },
        FileUrl => Part {
            content: Some(Content::Url(FILE_URL.into())),
            media_type: FILE_MEDIA_TYPE.into(),
            filename: FILE_NAME.into(),
            ..Default::default()
        },
        Data => Part {
            // A JSON object, the kit's `{"key": "value", "count": 42}`.
            content: Some(Content::Data(crate::wkt::Value::from(
                std::collections::BTreeMap::from([
                    ("key".to_owned(), crate::wkt::Value::from("value")),
                    ("count".to_owned(), crate::wkt::Value::from(42.0)),
                ]),
            ))),
            media_type: "application/json".into(),
            ..Default::default()
        },
    }
}

/// A whole one-part artifact: the only update of it, so it is sealed.
async fn artifact(sink: &EventSink, output: Output) -> Result<(), SinkError> {
    sink.artifact(ArtifactUpdate {
        artifact: Artifact {
            artifact_id: ARTIFACT_ID.into(),
            name: ARTIFACT_ID.into(),
            parts: vec![part(output)],
            ..Default::default()
        },
        append: false,
        last_chunk: true,
        metadata: None,
    })
    .await
}

/// A sink error because the task was canceled meanwhile: the run simply
/// stops.
fn canceled(e: &SinkError) -> bool {
    matches!(e, SinkError::TaskClosed { .. })
}

/// The default agent for the A2A TCK; see the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conformance;

impl Conformance {
    async fn run(&self, ctx: &RequestContext, sink: &EventSink) -> Result<(), SinkError> {
        if ctx.task.is_some() {
            // Only an INPUT_REQUIRED task outlives its run, so a message on
            // an existing task is the kit's answer to the question, whatever
            // its id says.
            return sink
                .status(
                    TaskState::Completed,
                    Some(&format!("Received: {}", ctx.text())),
                )
                .await;
        }
        let Some(behaviour) = behaviour(&ctx.message.message_id) else {
            sink.artifact_text(ECHO_ARTIFACT_ID, ECHO_ARTIFACT_ID, &ctx.text(), false, true)
                .await?;
            return sink.status(TaskState::Completed, None).await;
        };
        match behaviour {
            CompleteTask => {
                sink.status(TaskState::Completed, Some("Hello from TCK"))
                    .await
            }
            InputRequired => {
                sink.status(
                    TaskState::InputRequired,
                    Some("Input required: send a follow-up message on this task."),
                )
                .await
            }
            MessageResponse => sink.reply_text("Direct message response").await,
            RejectTask => {
                sink.status(TaskState::Rejected, Some("Task rejected."))
                    .await
            }
            CompleteWithArtifact(output) => {
                artifact(sink, output).await?;
                sink.status(TaskState::Completed, None).await
            }
            WorkWithArtifact(output) => {
                sink.status(TaskState::Working, None).await?;
                artifact(sink, output).await?;
                sink.status(TaskState::Completed, None).await
            }
            CompleteDirectly => sink.status(TaskState::Completed, None).await,
            WorkWithChunkedArtifact => {
                sink.status(TaskState::Working, None).await?;
                sink.artifact_text(
                    CHUNKED_ARTIFACT_ID,
                    CHUNKED_ARTIFACT_ID,
                    "chunk-1 ",
                    false,
                    false,
                )
                .await?;
                sink.artifact_text(
                    CHUNKED_ARTIFACT_ID,
                    CHUNKED_ARTIFACT_ID,
                    "chunk-2",
                    true,
                    true,
                )
                .await?;
                sink.status(TaskState::Completed, None).await
            }
            WorkAndHold(hold, done) => {
                sink.status(TaskState::Working, None).await?;
                tokio::select! {
                    _ = tokio::time::sleep(hold) => {}
                    // The runtime has already moved the task to CANCELED (or
                    // is shutting down and will fail it): nothing to emit.
                    _ = ctx.cancelled.cancelled() => return Ok(()),
                }
                sink.status(TaskState::Completed, done).await
            }
        }
    }
}

#[async_trait]
impl AgentExecutor for Conformance {
    fn card(&self) -> AgentCard {
        let mut card = basic_card(
            "conformance",
            "The system under test for the A2A TCK: the message id prefix selects the behaviour.",
            vec![skill(
                "tck",
                "A2A TCK scenarios",
                "Completes, rejects, asks for input, replies directly, streams artifacts \
                 (text, bytes, url, data, chunked) or holds a task open, by message id prefix; \
                 any other message is echoed in an artifact.",
                &["hello"],
            )],
        );
        // What the A2A TCK sends in message parts (a2aproject/a2a-tck,
        // v1.0 kit): text parts (no media type: text/plain) in every
        // scenario; and, from its operator fixtures and older suites, data
        // parts (application/json) and file parts (raw bytes or url, no
        // media type: application/octet-stream; or labelled text/plain).
        // No wildcard: requirement CORE-SEND-003 sends a raw part of
        // `application/x-unsupported-tck-type` and MUST get
        // ContentTypeNotSupportedError, which `*/*` would never give.
        card.default_input_modes = [
            crate::content::TEXT_MEDIA_TYPE,
            crate::content::DATA_MEDIA_TYPE,
            crate::content::FILE_MEDIA_TYPE,
        ]
        .map(String::from)
        .into();
        // Its artifacts: text, data (tck-artifact-data) and text files.
        card.default_output_modes = ["text/plain", "application/json"].map(String::from).into();
        card
    }

    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        match self.run(&ctx, &sink).await {
            Err(e) if canceled(&e) => Ok(()),
            other => Ok(other?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prefix_selects_its_own_row_even_when_another_prefix_matches() {
        for &(prefix, expected) in BEHAVIOURS {
            // The kit appends a suffix to the prefix (`tck-stream-001-…`).
            let id = format!("{prefix}-5b0f9e41");
            assert_eq!(behaviour(&id), Some(expected), "{id}");
            assert_eq!(behaviour(prefix), Some(expected), "{prefix}");
        }
        assert_eq!(
            behaviour("tck-artifact-file-url-001"),
            Some(CompleteWithArtifact(FileUrl))
        );
        assert_eq!(
            behaviour("tck-artifact-file-001"),
            Some(CompleteWithArtifact(File))
        );
        assert_eq!(
            behaviour("tck-stream-artifact-chunked"),
            Some(WorkWithChunkedArtifact)
        );
    }

    #[test]
    fn prefixes_are_distinct() {
        for (i, (a, _)) in BEHAVIOURS.iter().enumerate() {
            for (b, _) in &BEHAVIOURS[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn other_ids_and_partial_prefixes_fall_back_to_the_echo() {
        for id in [
            "",
            "m1",
            "tck-",
            "tck-stream-",
            "tck-artifact",
            "xtck-complete-task",
        ] {
            assert_eq!(behaviour(id), None, "{id:?}");
        }
    }
}
