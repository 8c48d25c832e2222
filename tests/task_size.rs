//! A task never grows past what can be returned (issue "hardening", item
//! 4): a message that would push it over `MAX_TASK_BYTES` is refused
//! before commit with RESOURCE_EXHAUSTED and ErrorInfo, an agent event that
//! would is reported to the agent, and GetTask and ListTasks of every
//! stored task keep working (a ListTasks page ends early when the next task
//! would not fit in the response).

use crate::support;

use tonic::Code;
use tonic_types::StatusExt;

use a2a_lifecycle::proto::{ListTasksRequest, TaskState};
use a2a_lifecycle::runtime::live::MAX_TASK_BYTES;
use support::*;

fn big(bytes: usize) -> String {
    "d".repeat(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_that_would_outgrow_the_task_is_refused_and_the_task_stays_readable() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = within(
        "create",
        send_task(
            &mut client,
            request("code-reviewer", user_message(&big(2_000_000)), false),
        ),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    let mut follow_up = user_message(&big(2_000_000));
    follow_up.task_id = task.id.clone();
    let err = within(
        "follow-up",
        client.send_message(request("code-reviewer", follow_up, false)),
    )
    .await
    .unwrap_err();
    assert_a2a_error(&err, Code::ResourceExhausted, "RESOURCE_EXHAUSTED");
    let info = err.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata.get("limit").map(String::as_str),
        Some("MAX_TASK_BYTES")
    );
    // Unchanged, and readable.
    let read = within("get", get_task(&mut client, "code-reviewer", &task.id))
        .await
        .unwrap();
    assert_eq!(read.history.len(), task.history.len());
    // A follow-up that fits goes through.
    let mut small = user_message("the diff, shorter");
    small.task_id = task.id.clone();
    let done = within(
        "small follow-up",
        send_task(&mut client, request("code-reviewer", small, false)),
    )
    .await;
    assert_eq!(state_of(&done), TaskState::Completed);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_message_too_large_for_a_task_is_refused() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let err = within(
        "send",
        client.send_message(request(
            "code-reviewer",
            user_message(&big(MAX_TASK_BYTES)),
            false,
        )),
    )
    .await
    .unwrap_err();
    assert_a2a_error(&err, Code::ResourceExhausted, "RESOURCE_EXHAUSTED");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_end_early_when_the_next_task_would_not_fit() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let t = within(
            "create",
            send_task(
                &mut client,
                request("code-reviewer", user_message(&big(1_500_000)), false),
            ),
        )
        .await;
        ids.push(t.id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = within(
            "list",
            client.list_tasks(ListTasksRequest {
                tenant: "code-reviewer".into(),
                page_token: token.clone(),
                ..Default::default()
            }),
        )
        .await
        .unwrap()
        .into_inner();
        pages += 1;
        assert!(!page.tasks.is_empty());
        seen.extend(page.tasks.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids, "every task, once");
    assert!(pages >= 2, "three 1.5 MB tasks do not fit one response");
    server.stop().await;
}

/// Emits an artifact too large for the task, then reports what the sink
/// said in its status: the sink refuses it and the task is unchanged.
struct Oversized;

#[async_trait::async_trait]
impl a2a_lifecycle::agent::AgentExecutor for Oversized {
    async fn execute(
        &self,
        _ctx: a2a_lifecycle::agent::RequestContext,
        sink: a2a_lifecycle::agent::EventSink,
    ) -> Result<(), a2a_lifecycle::agent::AgentError> {
        sink.status(TaskState::Working, None).await?;
        let refused = sink
            .artifact_text("a", "a", &big(MAX_TASK_BYTES), false, true)
            .await;
        match refused {
            Err(a2a_lifecycle::agent::SinkError::TooLarge { .. }) => {
                sink.status(TaskState::Completed, Some("the artifact was refused"))
                    .await?;
                Ok(())
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_event_that_would_outgrow_the_task_is_reported_to_the_agent() {
    let server = TestServer::start_with(
        a2a_lifecycle::agent::AgentRouter::new().with("", std::sync::Arc::new(Oversized)),
        a2a_lifecycle::runtime::RuntimeConfig::default(),
    )
    .await;
    let mut client = server.client().await;
    let task = within(
        "send",
        send_task(&mut client, request("", user_message("go"), false)),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert!(task.artifacts.is_empty());
    assert_eq!(status_text(&task), "the artifact was refused");
    server.stop().await;
}
