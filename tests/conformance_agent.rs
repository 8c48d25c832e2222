//! The `conformance` demo agent, the system under test for the A2A TCK
//! (https://github.com/a2aproject/a2a-tck), over real gRPC: one test per row
//! of its message id prefix table. Like the kit, the tests never set
//! `tenant`: the agent is the server's default agent.

use crate::support;

use std::sync::Arc;

use a2a_lifecycle::agent::demo::Conformance;
use a2a_lifecycle::agent::{AgentRouter, message_text};
use a2a_lifecycle::proto::{
    CancelTaskRequest, ListTasksRequest, Message, Part, Role, StreamResponse,
    SubscribeToTaskRequest, Task, TaskState, part::Content, send_message_response,
    stream_response::Payload,
};
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::wkt::value::Kind;
use support::*;

async fn conformance_server() -> TestServer {
    TestServer::start_with(
        AgentRouter::new().with("", Arc::new(Conformance)),
        RuntimeConfig::default(),
    )
    .await
}

/// A user message whose id starts with `prefix` and is unique, as the
/// kit's are (a repeated id would be an idempotent resend).
fn tck_message(prefix: &str, text: &str) -> Message {
    let mut message = user_message(text);
    message.message_id = format!("{prefix}-{}", message.message_id);
    message
}

/// Blocking SendMessage of a `prefix` message; must answer with a task.
async fn send_blocking(client: &mut Client, prefix: &str) -> Task {
    send_task(client, request("", tck_message(prefix, "hello"), false)).await
}

/// SendStreamingMessage of a `prefix` message, read to its end.
async fn stream(client: &mut Client, prefix: &str) -> Vec<StreamResponse> {
    let events = client
        .send_streaming_message(request("", tck_message(prefix, "hello"), false))
        .await
        .unwrap()
        .into_inner();
    collect(events).await.unwrap()
}

async fn cancel(client: &mut Client, id: &str) -> Task {
    client
        .cancel_task(CancelTaskRequest {
            tenant: "".into(),
            id: id.into(),
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner()
}

/// The part of the task's only artifact, which must have exactly one.
fn only_part(task: &Task) -> &Part {
    assert_eq!(task.artifacts.len(), 1, "{:?}", task.artifacts);
    let artifact = &task.artifacts[0];
    assert_eq!(artifact.artifact_id, "tck-artifact");
    assert_eq!(artifact.parts.len(), 1, "{:?}", artifact.parts);
    &artifact.parts[0]
}

fn status_role(task: &Task) -> i32 {
    task.status
        .as_ref()
        .and_then(|s| s.message.as_ref())
        .expect("a status message")
        .role
}

fn text_of(part: &Part) -> &str {
    match &part.content {
        Some(Content::Text(text)) => text,
        other => panic!("expected a text part, got {other:?}"),
    }
}

fn assert_file_part(part: &Part) {
    assert_eq!(part.content, Some(Content::Raw(b"tck".to_vec())));
    assert_eq!(part.media_type, "text/plain");
    assert_eq!(part.filename, "output.txt");
}

#[tokio::test]
async fn complete_task_completes_with_hello_from_the_agent() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-complete-task").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(status_text(&task), "Hello from TCK");
    assert_eq!(status_role(&task), Role::Agent as i32);
    assert!(task.artifacts.is_empty());
    // The task lives in the default tenant, where the kit looks it up.
    let stored = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&stored), TaskState::Completed);
    server.stop().await;
}

/// The kit's follow-up carries a message id that is itself a table prefix;
/// a message on an existing task completes it whatever its id.
#[tokio::test]
async fn input_required_asks_the_user_then_a_follow_up_completes() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-input-required").await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    assert_eq!(status_role(&task), Role::Agent as i32);
    assert!(
        status_text(&task).starts_with("Input required"),
        "{}",
        status_text(&task)
    );

    let mut follow_up = tck_message("tck-input-required", "more");
    follow_up.task_id = task.id.clone();
    let done = send_task(&mut client, request("", follow_up, false)).await;
    assert_eq!(done.id, task.id);
    assert_eq!(state_of(&done), TaskState::Completed);
    assert_eq!(status_text(&done), "Received: more");
    server.stop().await;
}

/// The kit cancels an INPUT_REQUIRED task (its run is over) to test
/// CancelTask.
#[tokio::test]
async fn input_required_task_can_be_canceled() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-input-required").await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    assert_eq!(
        state_of(&cancel(&mut client, &task.id).await),
        TaskState::Canceled
    );
    let stored = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&stored), TaskState::Canceled);
    server.stop().await;
}

#[tokio::test]
async fn message_response_is_a_direct_agent_message_and_no_task() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let reply = client
        .send_message(request(
            "",
            tck_message("tck-message-response", "hello"),
            false,
        ))
        .await
        .unwrap()
        .into_inner();
    let Some(send_message_response::Payload::Message(message)) = reply.payload else {
        panic!("expected a message, got {reply:?}")
    };
    assert_eq!(message_text(&message), "Direct message response");
    assert_eq!(message.role, Role::Agent as i32);
    assert!(message.task_id.is_empty());
    let list = client
        .list_tasks(ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.total_size, 0, "no task was created");
    server.stop().await;
}

#[tokio::test]
async fn reject_task_is_rejected() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-reject-task").await;
    assert_eq!(state_of(&task), TaskState::Rejected);
    assert!(task.artifacts.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn artifact_text_completes_with_a_text_part() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-artifact-text").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(text_of(only_part(&task)), "Generated text content");
    server.stop().await;
}

#[tokio::test]
async fn artifact_file_completes_with_raw_bytes_a_media_type_and_a_filename() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-artifact-file").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_file_part(only_part(&task));
    server.stop().await;
}

/// `tck-artifact-file-url` starts with `tck-artifact-file`: the longer
/// prefix wins.
#[tokio::test]
async fn artifact_file_url_completes_with_a_url_a_media_type_and_a_filename() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-artifact-file-url").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    let part = only_part(&task);
    assert_eq!(
        part.content,
        Some(Content::Url("https://example.com/output.txt".into()))
    );
    assert_eq!(part.media_type, "text/plain");
    assert_eq!(part.filename, "output.txt");
    server.stop().await;
}

#[tokio::test]
async fn artifact_data_completes_with_a_structured_data_part() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_blocking(&mut client, "tck-artifact-data").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    let Some(Content::Data(value)) = &only_part(&task).content else {
        panic!("expected a data part, got {:?}", only_part(&task))
    };
    let Some(Kind::StructValue(object)) = &value.kind else {
        panic!("expected an object, got {value:?}")
    };
    assert_eq!(object.fields.len(), 2, "{object:?}");
    assert_eq!(
        object.fields["key"].kind,
        Some(Kind::StringValue("value".into()))
    );
    assert_eq!(object.fields["count"].kind, Some(Kind::NumberValue(42.0)));
    server.stop().await;
}

/// The text of a streamed artifact update's only part.
fn streamed_part(event: &StreamResponse) -> &Part {
    let Some(Payload::ArtifactUpdate(update)) = &event.payload else {
        panic!("expected an artifact update, got {event:?}")
    };
    let artifact = update.artifact.as_ref().expect("artifact");
    assert_eq!(artifact.parts.len(), 1, "{artifact:?}");
    &artifact.parts[0]
}

/// WORKING, one artifact, COMPLETED, in that order on the stream; the
/// stored task ends with the same artifact.
async fn assert_streams_working_artifact_completed(prefix: &str) -> Part {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let events = stream(&mut client, prefix).await;
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_WORKING",
            "artifact:tck-artifact+last",
            "status:TASK_STATE_COMPLETED",
        ],
        "{prefix}"
    );
    let Some(Payload::Task(first)) = &events[0].payload else {
        panic!()
    };
    let stored = get_task(&mut client, "", &first.id).await.unwrap();
    assert_eq!(state_of(&stored), TaskState::Completed, "{prefix}");
    assert_eq!(only_part(&stored), streamed_part(&events[2]), "{prefix}");
    let part = streamed_part(&events[2]).clone();
    server.stop().await;
    part
}

#[tokio::test]
async fn stream_001_streams_working_a_text_artifact_completed() {
    let part = assert_streams_working_artifact_completed("tck-stream-001").await;
    assert_eq!(text_of(&part), "Stream hello from TCK");
}

#[tokio::test]
async fn stream_003_streams_working_a_text_artifact_completed() {
    let part = assert_streams_working_artifact_completed("tck-stream-003").await;
    assert_eq!(text_of(&part), "Stream task lifecycle");
}

#[tokio::test]
async fn stream_artifact_text_streams_working_a_text_artifact_completed() {
    let part = assert_streams_working_artifact_completed("tck-stream-artifact-text").await;
    assert_eq!(text_of(&part), "Streamed text content");
}

#[tokio::test]
async fn stream_artifact_file_streams_working_a_file_artifact_completed() {
    let part = assert_streams_working_artifact_completed("tck-stream-artifact-file").await;
    assert_file_part(&part);
}

#[tokio::test]
async fn stream_ordering_streams_working_ordered_output_completed() {
    let part = assert_streams_working_artifact_completed("tck-stream-ordering-001").await;
    assert_eq!(text_of(&part), "Ordered output");
}

#[tokio::test]
async fn stream_002_completes_directly() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let events = stream(&mut client, "tck-stream-002").await;
    assert_eq!(
        describe_all(&events),
        ["task:TASK_STATE_SUBMITTED", "status:TASK_STATE_COMPLETED"]
    );
    server.stop().await;
}

/// The non-streaming rows stream too: the kit drives some of them over
/// SendStreamingMessage.
#[tokio::test]
async fn blocking_rows_stream_their_events_in_order() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let cases: [(&str, &[&str]); 4] = [
        (
            "tck-complete-task",
            &["task:TASK_STATE_SUBMITTED", "status:TASK_STATE_COMPLETED"],
        ),
        (
            "tck-input-required",
            &[
                "task:TASK_STATE_SUBMITTED",
                "status:TASK_STATE_INPUT_REQUIRED",
            ],
        ),
        (
            "tck-artifact-text",
            &[
                "task:TASK_STATE_SUBMITTED",
                "artifact:tck-artifact+last",
                "status:TASK_STATE_COMPLETED",
            ],
        ),
        ("tck-message-response", &["message:Direct message response"]),
    ];
    for (prefix, expected) in cases {
        assert_eq!(
            describe_all(&stream(&mut client, prefix).await),
            expected,
            "{prefix}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn chunked_artifact_streams_two_chunks_of_one_artifact_then_assembles_them() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let events = stream(&mut client, "tck-stream-artifact-chunked").await;
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_WORKING",
            "artifact:tck-chunked-artifact",
            "artifact:tck-chunked-artifact+append+last",
            "status:TASK_STATE_COMPLETED",
        ]
    );
    let chunks: Vec<_> = events[2..4]
        .iter()
        .map(|event| match &event.payload {
            Some(Payload::ArtifactUpdate(update)) => (
                text_of(streamed_part(event)).to_owned(),
                update.append,
                update.last_chunk,
            ),
            other => panic!("expected an artifact update, got {other:?}"),
        })
        .collect();
    assert_eq!(
        chunks,
        [
            ("chunk-1 ".to_owned(), false, false),
            ("chunk-2".to_owned(), true, true),
        ]
    );

    let Some(Payload::Task(first)) = &events[0].payload else {
        panic!()
    };
    let stored = get_task(&mut client, "", &first.id).await.unwrap();
    assert_eq!(state_of(&stored), TaskState::Completed);
    assert_eq!(stored.artifacts.len(), 1, "both chunks are one artifact");
    let artifact = &stored.artifacts[0];
    assert_eq!(artifact.artifact_id, "tck-chunked-artifact");
    let texts: Vec<_> = artifact.parts.iter().map(text_of).collect();
    assert_eq!(texts, ["chunk-1 ", "chunk-2"]);
    server.stop().await;
}

/// The kit's resubscribe test: send without waiting, subscribe while the
/// task is still WORKING, and see it complete on the subscription.
#[tokio::test]
async fn resubscribe_task_stays_working_and_a_subscriber_sees_it_complete() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_task(
        &mut client,
        request("", tck_message("test-resubscribe-message-id", "hi"), true),
    )
    .await;
    assert!(!state_of(&task).is_terminal(), "{task:?}");
    // Right after creation the task is held WORKING, not finished.
    let now = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&now), TaskState::Working);

    let subscription = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let events = collect(subscription).await.unwrap();
    assert_eq!(
        describe_all(&events),
        ["task:TASK_STATE_WORKING", "status:TASK_STATE_COMPLETED"]
    );
    let done = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&done), TaskState::Completed);
    server.stop().await;
}

/// Cancel ends the held run at once. `clock` is a second resubscribe task
/// started first: had the canceled run ignored its cancellation it would
/// end after `clock`'s hold, so `clock` is still WORKING once the canceled
/// run is over only if that run stopped early.
#[tokio::test]
async fn canceling_a_resubscribe_task_cancels_it_and_ends_its_run() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let clock = send_task(
        &mut client,
        request(
            "",
            tck_message("test-resubscribe-message-id", "clock"),
            true,
        ),
    )
    .await;
    let task = send_task(
        &mut client,
        request("", tck_message("test-resubscribe-message-id", "hi"), true),
    )
    .await;
    let subscription = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let subscriber = tokio::spawn(collect(subscription));

    let canceled = cancel(&mut client, &task.id).await;
    assert_eq!(state_of(&canceled), TaskState::Canceled);
    let events = subscriber.await.unwrap().unwrap();
    assert_eq!(
        describe_all(&events),
        ["task:TASK_STATE_WORKING", "status:TASK_STATE_CANCELED"]
    );

    // Only `clock`'s run still holds a task in memory once the canceled
    // run is over.
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.manager.live_task_count() > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the canceled run never ended"
        );
        tokio::task::yield_now().await;
    }
    let still = get_task(&mut client, "", &clock.id).await.unwrap();
    assert_eq!(
        state_of(&still),
        TaskState::Working,
        "the canceled run ended only when its hold did"
    );
    let after = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&after), TaskState::Canceled);
    assert_eq!(
        status_text(&after),
        "Task canceled at the client's request."
    );

    assert_eq!(
        state_of(&cancel(&mut client, &clock.id).await),
        TaskState::Canceled
    );
    server.stop().await;
}

#[tokio::test]
async fn any_other_message_id_completes_with_an_echo_artifact() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let task = send_task(
        &mut client,
        request("", tck_message("m", "echo this back"), false),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(task.artifacts.len(), 1, "{:?}", task.artifacts);
    let artifact = &task.artifacts[0];
    assert_eq!(artifact.artifact_id, "echo");
    let texts: Vec<_> = artifact.parts.iter().map(text_of).collect();
    assert_eq!(texts, ["echo this back"]);
    server.stop().await;
}

/// The kit's execution-mode tests: a blocking send waits for the delayed
/// task to complete, a non-blocking one returns while it still works.
#[tokio::test]
async fn delayed_complete_tells_blocking_from_non_blocking_sends() {
    let server = conformance_server().await;
    let mut client = server.client().await;

    let task = send_blocking(&mut client, "tck-delayed-complete").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(status_text(&task), "Done after delay");

    let task = send_task(
        &mut client,
        request("", tck_message("tck-delayed-complete", "hello"), true),
    )
    .await;
    assert!(
        matches!(state_of(&task), TaskState::Submitted | TaskState::Working),
        "{:?}",
        state_of(&task)
    );
    server.stop().await;
}

/// The media types the card accepts are what the kit sends (see the
/// conformance agent's `card`): every part kind of its scenarios, and not
/// the type its CORE-SEND-003 requirement sends to be refused.
#[tokio::test]
async fn the_card_accepts_every_part_kind_the_kit_sends() {
    let server = conformance_server().await;
    let response = http_get(server.addr, "/.well-known/agent-card.json", &[]).await;
    assert_eq!(response.status, 200, "{}", response.body);
    let card = support::card_1_0(&response.body);
    assert_eq!(
        card.default_input_modes,
        ["text/plain", "application/json", "application/octet-stream"]
    );

    let mut client = server.client().await;
    let data = a2a_lifecycle::wkt::Value::from(std::collections::BTreeMap::from([(
        "key".to_owned(),
        a2a_lifecycle::wkt::Value::from("value"),
    )]));
    let parts = [
        (Content::Text("Hello from TCK".into()), ""),
        (Content::Data(data.clone()), ""),
        (Content::Data(data), "application/json"),
        (Content::Raw(b"tck".to_vec()), ""),
        (Content::Raw(b"tck".to_vec()), "text/plain"),
        (
            Content::Url("https://example.com/test.txt".into()),
            "text/plain",
        ),
        (Content::Url("https://example.com/blob".into()), ""),
    ];
    for (content, media_type) in parts {
        let mut message = tck_message("tck-complete-task", "unused");
        message.parts = vec![Part {
            content: Some(content.clone()),
            media_type: media_type.into(),
            ..Default::default()
        }];
        let reply = tokio::time::timeout(WAIT, client.send_message(request("", message, false)))
            .await
            .expect("SendMessage timed out")
            .unwrap_or_else(|e| panic!("{content:?} {media_type:?}: {e:?}"))
            .into_inner();
        let Some(send_message_response::Payload::Task(task)) = reply.payload else {
            panic!("expected a task: {reply:?}");
        };
        assert_eq!(state_of(&task), TaskState::Completed);
    }
    server.stop().await;
}

/// The kit's CORE-SEND-003 (a MUST): a raw part of a media type the agent
/// does not accept gets ContentTypeNotSupportedError, INVALID_ARGUMENT on
/// gRPC, on both send RPCs, and creates no task.
#[tokio::test]
async fn the_kits_unsupported_media_type_is_content_type_not_supported() {
    let server = conformance_server().await;
    let mut client = server.client().await;
    let unsupported = || {
        let mut message = tck_message("tck-send-003", "unused");
        message.parts = vec![Part {
            content: Some(Content::Raw(b"tck".to_vec())),
            media_type: "application/x-unsupported-tck-type".into(),
            ..Default::default()
        }];
        request("", message, false)
    };
    let status = tokio::time::timeout(WAIT, client.send_message(unsupported()))
        .await
        .expect("SendMessage timed out")
        .unwrap_err();
    assert_a2a_error(
        &status,
        tonic::Code::InvalidArgument,
        "CONTENT_TYPE_NOT_SUPPORTED",
    );
    let status = tokio::time::timeout(WAIT, client.send_streaming_message(unsupported()))
        .await
        .expect("SendStreamingMessage timed out")
        .map(|_| ())
        .unwrap_err();
    assert_a2a_error(
        &status,
        tonic::Code::InvalidArgument,
        "CONTENT_TYPE_NOT_SUPPORTED",
    );
    let tasks = tokio::time::timeout(WAIT, client.list_tasks(ListTasksRequest::default()))
        .await
        .expect("ListTasks timed out")
        .unwrap()
        .into_inner()
        .tasks;
    assert!(tasks.is_empty(), "{tasks:?}");
    server.stop().await;
}
