//! The transition log (issue "console"; the seeds' audit trail): every
//! committed change of a task's state, with when, its status message and
//! its cause, shown through the server's extension (spec §4.6) on every
//! binding, and tasks unchanged for calls that do not activate it.

use crate::support;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::lifecycle::TRANSITIONS_EXTENSION;
use a2a_lifecycle::proto::{
    CancelTaskRequest, GetTaskRequest, TaskState, stream_response::Payload,
};
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::wkt::Timestamp;
use support::web::{Http, message};
use support::*;

/// The code-reviewer flow (spec §3.4.3): created by the client, asked for
/// input by the agent, resumed by the follow-up, completed by the agent;
/// each entry with its status message's id and its status's timestamp.
#[tokio::test(flavor = "multi_thread")]
async fn the_code_reviewer_flow_logs_each_state_with_its_cause() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let first = user_message("review my change");
    let first_id = first.message_id.clone();
    let task = send_task(&mut client, request("code-reviewer", first, false)).await;
    let (_, log) = transitions(&mut client, "code-reviewer", &task.id).await;
    assert_eq!(log, ["SUBMITTED client", "INPUT_REQUIRED agent"]);

    let mut follow_up = user_message("--- a/x\n+++ b/x\n@@\n-old\n+new");
    follow_up.task_id = task.id.clone();
    let done = send_task(&mut client, request("code-reviewer", follow_up, false)).await;
    assert_eq!(state_of(&done), TaskState::Completed);
    let (shown, log) = transitions(&mut client, "code-reviewer", &task.id).await;
    assert_eq!(
        log,
        [
            "SUBMITTED client",
            "INPUT_REQUIRED agent",
            "WORKING follow-up",
            "COMPLETED agent"
        ]
    );
    let json = serde_json::to_value(&shown).unwrap();
    let entries = json["metadata"][TRANSITIONS_EXTENSION]["transitions"]
        .as_array()
        .unwrap();
    assert_eq!(entries[0]["messageId"], first_id.as_str());
    // The agent's question: now in history, after the first message.
    assert_eq!(status_text(&task), "Please send the diff to review.");
    assert_eq!(
        entries[1]["messageId"],
        task.status
            .as_ref()
            .unwrap()
            .message
            .as_ref()
            .unwrap()
            .message_id
    );
    assert_eq!(entries[3]["timestamp"], json["status"]["timestamp"]);
    let times: Vec<Timestamp> = entries
        .iter()
        .map(|e| Timestamp::from_str(e["timestamp"].as_str().unwrap()).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");

    // Without the extension: the task as it is, no log, nothing named.
    let plain = within(
        "get",
        client.get_task(GetTaskRequest {
            tenant: "code-reviewer".into(),
            id: task.id.clone(),
            history_length: None,
        }),
    )
    .await
    .unwrap();
    assert!(plain.metadata().get("a2a-extensions").is_none());
    let plain = plain.into_inner();
    let mut without = shown.clone();
    let metadata = without.metadata.as_mut().unwrap();
    metadata.fields.remove(TRANSITIONS_EXTENSION);
    if metadata.fields.is_empty() {
        without.metadata = None;
    }
    assert_eq!(plain, without);
    server.stop().await;
}

/// Reads `stream` until the agent says WORKING.
async fn until_working(stream: &mut tonic::Streaming<a2a_lifecycle::proto::StreamResponse>) {
    loop {
        let event = within("an event", stream.message())
            .await
            .unwrap()
            .expect("the stream goes on until WORKING");
        if let Some(Payload::StatusUpdate(update)) = event.payload
            && update.status.unwrap().state == TaskState::Working as i32
        {
            return;
        }
    }
}

/// A client's cancel of a slow test-runner task.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_is_the_clients() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut stream = within(
        "stream",
        client.send_streaming_message(request("", user_message("slow tests"), false)),
    )
    .await
    .unwrap()
    .into_inner();
    let Some(Payload::Task(task)) = within("first event", stream.message())
        .await
        .unwrap()
        .unwrap()
        .payload
    else {
        panic!("a task first")
    };
    until_working(&mut stream).await;
    within(
        "cancel",
        client.cancel_task(CancelTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
            metadata: None,
        }),
    )
    .await
    .unwrap();
    let (_, log) = transitions(&mut client, "", &task.id).await;
    assert_eq!(
        log,
        ["SUBMITTED client", "WORKING agent", "CANCELED cancel"]
    );
    server.stop().await;
}

/// `--task-timeout` failing a slow task.
#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_is_the_timeouts() {
    let config = RuntimeConfig {
        task_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let server = TestServer::start_with(demo_router(), config).await;
    let mut client = server.client().await;
    let stream = within(
        "stream",
        client.send_streaming_message(request("", user_message("slow tests"), false)),
    )
    .await
    .unwrap()
    .into_inner();
    let events = within("to the end", collect(stream)).await.unwrap();
    let Some(Payload::Task(task)) = &events[0].payload else {
        panic!("a task first")
    };
    assert_eq!(describe(events.last().unwrap()), "status:TASK_STATE_FAILED");
    let (_, log) = transitions(&mut client, "", &task.id).await;
    assert_eq!(log, ["SUBMITTED client", "WORKING agent", "FAILED timeout"]);
    server.stop().await;
}

/// Says WORKING, then returns without ending its task.
struct Quitter;

#[async_trait]
impl AgentExecutor for Quitter {
    async fn execute(&self, _: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, None).await?;
        Ok(())
    }
}

/// An agent that stops while its task is WORKING: the server fails it.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_its_agent_left_working_is_failed_by_the_server() {
    let server = TestServer::start_with(
        AgentRouter::new().with("", std::sync::Arc::new(Quitter)),
        RuntimeConfig::default(),
    )
    .await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "go").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    let (_, log) = transitions(&mut client, "", &task.id).await;
    assert_eq!(log, ["SUBMITTED client", "WORKING agent", "FAILED server"]);
    server.stop().await;
}

/// JSON-RPC and HTTP+JSON: activated by the `A2A-Extensions` header (and
/// 0.3's `X-A2A-Extensions`), named in the answer's; GetTask without it
/// answers the task unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn the_json_bindings_activate_it_by_header_and_name_it_in_the_answer() {
    let server = TestServer::start().await;
    let http = Http::new(server.addr);
    let sent = http
        .rest(
            "POST",
            "/message:send",
            Some(json!({"message": message("run the tests")})),
        )
        .await;
    assert_eq!(sent.status, 200, "{:?}", sent.body);
    let id = sent.body["task"]["id"].as_str().unwrap().to_owned();
    let expected = ["SUBMITTED client", "WORKING agent", "COMPLETED agent"];

    let plain = http.rest("GET", &format!("/tasks/{id}"), None).await;
    assert_eq!(plain.status, 200);
    assert!(plain.headers.get("a2a-extensions").is_none());
    assert!(plain.body["metadata"][TRANSITIONS_EXTENSION].is_null());
    let plain_rpc = http.rpc("GetTask", json!({"id": id})).await;
    assert!(plain_rpc.result()["metadata"][TRANSITIONS_EXTENSION].is_null());

    for header in ["A2A-Extensions", "X-A2A-Extensions"] {
        let with = Http::new(server.addr).with_header(header, TRANSITIONS_EXTENSION);
        let got = with.rest("GET", &format!("/tasks/{id}"), None).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.headers["a2a-extensions"], TRANSITIONS_EXTENSION);
        assert_eq!(transition_log(&got.body), expected, "{header}");
        let mut unchanged = got.body.clone();
        strip_log(&mut unchanged);
        assert_eq!(unchanged, plain.body);

        let rpc = with.rpc("GetTask", json!({"id": id})).await;
        assert_eq!(rpc.headers["a2a-extensions"], TRANSITIONS_EXTENSION);
        assert_eq!(transition_log(rpc.result()), expected, "{header}");
    }
    // An extension this server does not know is ignored (spec §4.6).
    let other = Http::new(server.addr).with_header("A2A-Extensions", "urn:example:unknown");
    let got = other.rest("GET", &format!("/tasks/{id}"), None).await;
    assert_eq!(got.status, 200);
    assert!(got.headers.get("a2a-extensions").is_none());
    assert_eq!(got.body, plain.body);
    server.stop().await;
}

/// Removes the log (and a metadata object it leaves empty) from a task's
/// JSON.
fn strip_log(task: &mut Value) {
    let metadata = task["metadata"].as_object_mut().expect("metadata");
    metadata.remove(TRANSITIONS_EXTENSION);
    if metadata.is_empty() {
        task.as_object_mut().unwrap().remove("metadata");
    }
}

/// Every agent's card declares the extension, not required (spec §4.6:
/// `capabilities.extensions`).
#[tokio::test(flavor = "multi_thread")]
async fn every_card_declares_the_extension() {
    let server = TestServer::start().await;
    for path in [
        "/.well-known/agent-card.json",
        "/code-reviewer/.well-known/agent-card.json",
        "/deployer/.well-known/agent-card.json",
    ] {
        let card = http_get(server.addr, path, &[]).await;
        assert_eq!(card.status, 200, "{path}");
        let card: Value = serde_json::from_str(&card.body).unwrap();
        let declared: Vec<&Value> = card["capabilities"]["extensions"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: no extensions in {card}"))
            .iter()
            .filter(|e| e["uri"] == TRANSITIONS_EXTENSION)
            .collect();
        assert_eq!(declared.len(), 1, "{path}: {card}");
        assert_ne!(declared[0]["required"], true, "{path}");
        assert!(
            declared[0]["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty())
        );
    }
    server.stop().await;
}
