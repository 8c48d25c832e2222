//! ContentTypeNotSupportedError (spec §3.3.2, §5.4) over real gRPC: a
//! message part whose media type the agent's card does not list among its
//! input modes (the default ones and every skill's, spec §4.4.1, §4.4.5)
//! is refused with INVALID_ARGUMENT, reason CONTENT_TYPE_NOT_SUPPORTED and
//! a BadRequest naming the part, before the message reaches the agent.

use crate::support;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::timeout;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use a2a_lifecycle::agent::{
    AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext, basic_card, skill,
};
use a2a_lifecycle::proto::{
    AgentCard, ListTasksRequest, Message, Part, TaskState, part::Content, send_message_response,
};
use a2a_lifecycle::runtime::RuntimeConfig;

use support::*;

fn part(content: Content, media_type: &str) -> Part {
    Part {
        content: Some(content),
        media_type: media_type.into(),
        ..Default::default()
    }
}

fn text(text: &str) -> Content {
    Content::Text(text.into())
}

fn raw() -> Content {
    Content::Raw(b"tck".to_vec())
}

fn data() -> Content {
    Content::Data(a2a_lifecycle::wkt::Value::from(42.0))
}

/// A user message with `parts`.
fn message_with(parts: Vec<Part>) -> Message {
    let mut message = user_message("unused");
    message.parts = parts;
    message
}

async fn send(client: &mut Client, tenant: &str, message: Message) -> Result<(), Status> {
    timeout(WAIT, client.send_message(request(tenant, message, false)))
        .await
        .expect("SendMessage timed out")
        .map(|_| ())
}

async fn send_streaming(client: &mut Client, tenant: &str, message: Message) -> Result<(), Status> {
    let events = timeout(
        WAIT,
        client.send_streaming_message(request(tenant, message, false)),
    )
    .await
    .expect("SendStreamingMessage timed out")?
    .into_inner();
    collect(events).await.map(|_| ())
}

/// Asserts CONTENT_TYPE_NOT_SUPPORTED naming `field` and `media_type`.
fn assert_content_type_error(status: &Status, field: &str, media_type: &str) {
    assert_a2a_error(status, Code::InvalidArgument, "CONTENT_TYPE_NOT_SUPPORTED");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["field"], field, "{status:?}");
    assert_eq!(info.metadata["media_type"], media_type, "{status:?}");
    let bad = status.get_details_bad_request().expect("BadRequest detail");
    assert_eq!(bad.field_violations.len(), 1, "{status:?}");
    assert_eq!(bad.field_violations[0].field, field);
    assert!(
        bad.field_violations[0].description.contains(media_type),
        "{status:?}"
    );
}

async fn task_count(client: &mut Client, tenant: &str) -> usize {
    timeout(
        WAIT,
        client.list_tasks(ListTasksRequest {
            tenant: tenant.into(),
            ..Default::default()
        }),
    )
    .await
    .expect("ListTasks timed out")
    .unwrap()
    .into_inner()
    .tasks
    .len()
}

#[tokio::test]
async fn a_part_the_card_does_not_accept_is_refused_before_the_agent_runs() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // test-runner reads text only: raw bytes (application/octet-stream)
    // are refused, on the part itself since the type is implied.
    let message = message_with(vec![part(text("run the tests"), ""), part(raw(), "")]);
    let status = send(&mut client, "", message).await.unwrap_err();
    assert_content_type_error(&status, "message.parts[1]", "application/octet-stream");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["accepted_media_types"], "text/plain");
    // Nothing was done with the message: no task exists.
    assert_eq!(task_count(&mut client, "").await, 0);

    // A declared type is named on the part's `media_type` field.
    let message = message_with(vec![part(text("<p>run</p>"), "text/html")]);
    let status = send(&mut client, "test-runner", message).await.unwrap_err();
    assert_content_type_error(&status, "message.parts[0].media_type", "text/html");
    assert_eq!(task_count(&mut client, "test-runner").await, 0);

    // Data parts imply application/json.
    let status = send(
        &mut client,
        "deployer",
        message_with(vec![part(data(), "")]),
    )
    .await
    .unwrap_err();
    assert_content_type_error(&status, "message.parts[0]", "application/json");
    server.stop().await;
}

#[tokio::test]
async fn streaming_sends_are_refused_the_same_way() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let message = message_with(vec![part(
        Content::Url("https://x/y.png".into()),
        "image/png",
    )]);
    let status = send_streaming(&mut client, "deployer", message)
        .await
        .unwrap_err();
    assert_content_type_error(&status, "message.parts[0].media_type", "image/png");
    assert_eq!(task_count(&mut client, "deployer").await, 0);
    server.stop().await;
}

#[tokio::test]
async fn media_types_compare_by_essence_ignoring_case_and_parameters() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for media_type in [
        "",
        "text/plain",
        "TEXT/Plain",
        "text/plain; charset=utf-8",
        "text/plain ;format=flowed",
    ] {
        let message = message_with(vec![part(text("run the tests"), media_type)]);
        send(&mut client, "", message)
            .await
            .unwrap_or_else(|e| panic!("{media_type:?}: {e:?}"));
    }
    let message = message_with(vec![part(text("run the tests"), "text/plain-ish")]);
    let status = send(&mut client, "", message).await.unwrap_err();
    assert_content_type_error(&status, "message.parts[0].media_type", "text/plain-ish");
    server.stop().await;
}

#[tokio::test]
async fn a_skill_input_mode_is_accepted_code_reviewer_takes_diffs() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "code-reviewer", "review my change").await;
    assert_eq!(state_of(&task), TaskState::InputRequired);

    // A follow-up is checked too: a PDF is refused and the task still waits.
    let mut pdf = message_with(vec![part(raw(), "application/pdf")]);
    pdf.task_id = task.id.clone();
    let status = send(&mut client, "code-reviewer", pdf).await.unwrap_err();
    assert_content_type_error(&status, "message.parts[0].media_type", "application/pdf");
    let waiting = get_task(&mut client, "code-reviewer", &task.id)
        .await
        .unwrap();
    assert_eq!(state_of(&waiting), TaskState::InputRequired);

    // The diff, labelled as one (the review skill's input mode).
    let mut diff = message_with(vec![part(text("--- a/x\n+++ b/x\n"), "text/x-diff")]);
    diff.task_id = task.id.clone();
    let reply = timeout(
        WAIT,
        client.send_message(request("code-reviewer", diff, false)),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    let Some(send_message_response::Payload::Task(done)) = reply.payload else {
        panic!("expected a task: {reply:?}");
    };
    assert_eq!(state_of(&done), TaskState::Completed);
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_tenant_keeps_its_own_error() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let status = send(&mut client, "nobody", message_with(vec![part(raw(), "")]))
        .await
        .unwrap_err();
    assert_bad_field(&status, "tenant");
    server.stop().await;
}

#[tokio::test]
async fn a_part_without_content_is_left_to_validation() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let message = message_with(vec![part(text("x"), ""), Part::default()]);
    let status = send(&mut client, "", message).await.unwrap_err();
    assert_bad_field(&status, "message.parts[1]");
    server.stop().await;
}

/// An agent that completes at once, whose card is `card`.
struct WithCard(AgentCard);

#[async_trait]
impl AgentExecutor for WithCard {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Completed, Some("done")).await?;
        Ok(())
    }

    fn card(&self) -> AgentCard {
        self.0.clone()
    }
}

fn card_accepting(defaults: &[&str], skill_modes: &[&str]) -> AgentCard {
    let mut the_skill = skill("s", "S", "A skill.", &[]);
    the_skill.input_modes = skill_modes.iter().map(|m| (*m).into()).collect();
    let mut card = basic_card("modes", "Accepts what its card says.", vec![the_skill]);
    card.default_input_modes = defaults.iter().map(|m| (*m).into()).collect();
    card
}

#[tokio::test]
async fn wildcards_accept_a_type_or_anything() {
    let agents = AgentRouter::new()
        .with(
            "images",
            Arc::new(WithCard(card_accepting(&["text/plain"], &["image/*"]))),
        )
        .with("any", Arc::new(WithCard(card_accepting(&["*/*"], &[]))));
    let server = TestServer::start_with(agents, RuntimeConfig::default()).await;
    let mut client = server.client().await;

    for media_type in ["image/png", "Image/SVG+XML; charset=utf-8"] {
        let message = message_with(vec![part(text("t"), ""), part(raw(), media_type)]);
        send(&mut client, "images", message)
            .await
            .unwrap_or_else(|e| panic!("{media_type:?}: {e:?}"));
    }
    for media_type in ["video/mp4", "image", "image/"] {
        let message = message_with(vec![part(raw(), media_type)]);
        let status = send(&mut client, "images", message).await.unwrap_err();
        assert_content_type_error(&status, "message.parts[0].media_type", media_type);
        let info = status.get_details_error_info().unwrap();
        assert_eq!(info.metadata["accepted_media_types"], "text/plain,image/*");
    }

    for content in [text("t"), raw(), data(), Content::Url("u://x".into())] {
        send(&mut client, "any", message_with(vec![part(content, "")]))
            .await
            .unwrap();
    }
    let message = message_with(vec![part(raw(), "application/x-anything")]);
    send(&mut client, "any", message).await.unwrap();
    server.stop().await;
}
