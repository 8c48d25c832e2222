//! An official A2A SDK client (the Rust SDK's, `a2a-client-lf`) drives
//! the server over JSON-RPC and over HTTP+JSON, as its users would: from
//! the agent card, through every operation.

use crate::support;

use std::collections::HashMap;

use a2a::{
    CancelTaskRequest, DeleteTaskPushNotificationConfigRequest, GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, ListTaskPushNotificationConfigsRequest,
    ListTasksRequest, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    SendMessageResponse, StreamResponse, SubscribeToTaskRequest, TaskPushNotificationConfig,
    TaskState,
};
use a2a_client::agent_card::AgentCardResolver;
use a2a_client::{A2AClient, A2AClientFactory, Transport};
use futures_util::StreamExt;

use support::{WAIT, within};

fn send(text: &str, return_immediately: bool) -> SendMessageRequest {
    SendMessageRequest {
        message: Message::new(Role::User, vec![Part::text(text)]),
        configuration: return_immediately.then_some(SendMessageConfiguration {
            accepted_output_modes: None,
            task_push_notification_config: None,
            history_length: None,
            return_immediately: Some(true),
        }),
        metadata: None,
        tenant: None,
    }
}

/// The client the SDK's factory makes from the server's card, preferring
/// `binding`; the interface it chose must be that binding's.
async fn client_for(
    addr: std::net::SocketAddr,
    tenant_path: &str,
    binding: &str,
) -> A2AClient<Box<dyn Transport>> {
    let card = within(
        "resolve the card",
        AgentCardResolver::new(None).resolve(&format!("http://{addr}{tenant_path}")),
    )
    .await
    .expect("the SDK reads the card");
    let factory = A2AClientFactory::builder()
        .preferred_bindings(vec![binding.to_owned()])
        .build();
    let (client, interface) = within("negotiate", factory.create_from_card_with_interface(&card))
        .await
        .expect("a client for the card");
    assert_eq!(interface.protocol_binding, binding);
    match interface.tenant.as_deref() {
        Some(tenant) if !tenant.is_empty() => client.with_tenant(tenant),
        _ => client,
    }
}

async fn every_operation(binding: &str) {
    let server = support::start_with_push().await;
    let client = client_for(server.addr, "", binding).await;

    // Blocking send: the finished task.
    let answer = within("send", client.send_message(&send("run the tests", false)))
        .await
        .expect("SendMessage");
    let SendMessageResponse::Task(done) = answer else {
        panic!("a task")
    };
    assert_eq!(done.status.state, TaskState::Completed);
    // A direct reply.
    let answer = within("ping", client.send_message(&send("ping", false)))
        .await
        .expect("SendMessage");
    assert!(matches!(answer, SendMessageResponse::Message(_)));

    // Streaming send: the task first, COMPLETED last.
    let mut stream = within(
        "stream",
        client.send_streaming_message(&send("run the tests", false)),
    )
    .await
    .expect("SendStreamingMessage");
    let mut states = Vec::new();
    while let Some(event) = within("an event", stream.next()).await {
        match event.expect("an event") {
            StreamResponse::Task(t) => states.push(format!("task {:?}", t.status.state)),
            StreamResponse::StatusUpdate(u) => states.push(format!("{:?}", u.status.state)),
            StreamResponse::ArtifactUpdate(_) => states.push("artifact".into()),
            StreamResponse::Message(_) => states.push("message".into()),
        }
    }
    assert_eq!(
        states.first().map(String::as_str),
        Some("task Submitted"),
        "{states:?}"
    );
    assert_eq!(
        states.last().map(String::as_str),
        Some("Completed"),
        "{states:?}"
    );

    // Get, list.
    let got = within(
        "get",
        client.get_task(&GetTaskRequest {
            id: done.id.clone(),
            history_length: Some(1),
            tenant: None,
        }),
    )
    .await
    .expect("GetTask");
    assert_eq!(got.id, done.id);
    let listed = within(
        "list",
        client.list_tasks(&ListTasksRequest {
            context_id: None,
            status: Some(TaskState::Completed),
            page_size: Some(10),
            page_token: None,
            history_length: None,
            status_timestamp_after: Some(chrono_hour_ago()),
            include_artifacts: None,
            tenant: None,
        }),
    )
    .await
    .expect("ListTasks");
    assert!(listed.tasks.iter().any(|t| t.id == done.id));

    // A slow task: subscribe, push configs, cancel.
    let SendMessageResponse::Task(slow) = within("slow", client.send_message(&send("slow", true)))
        .await
        .expect("SendMessage")
    else {
        panic!("a task")
    };
    let mut subscription = within(
        "subscribe",
        client.subscribe_to_task(&SubscribeToTaskRequest {
            id: slow.id.clone(),
            tenant: None,
        }),
    )
    .await
    .expect("SubscribeToTask");
    let first = within("the snapshot", subscription.next())
        .await
        .expect("an event")
        .expect("no error");
    assert!(matches!(first, StreamResponse::Task(_)));
    let config = within(
        "create push config",
        client.create_push_config(&TaskPushNotificationConfig {
            url: "http://127.0.0.1:9/hook".into(),
            id: Some("hook".into()),
            task_id: slow.id.clone(),
            token: None,
            authentication: None,
            tenant: None,
        }),
    )
    .await
    .expect("CreateTaskPushNotificationConfig");
    assert_eq!(config.id.as_deref(), Some("hook"));
    let fetched = within(
        "get push config",
        client.get_push_config(&GetTaskPushNotificationConfigRequest {
            task_id: slow.id.clone(),
            id: "hook".into(),
            tenant: None,
        }),
    )
    .await
    .expect("GetTaskPushNotificationConfig");
    assert_eq!(fetched.url, "http://127.0.0.1:9/hook");
    let configs = within(
        "list push configs",
        client.list_push_configs(&ListTaskPushNotificationConfigsRequest {
            task_id: slow.id.clone(),
            page_size: None,
            page_token: None,
            tenant: None,
        }),
    )
    .await
    .expect("ListTaskPushNotificationConfigs");
    assert_eq!(configs.configs.len(), 1);
    within(
        "delete push config",
        client.delete_push_config(&DeleteTaskPushNotificationConfigRequest {
            task_id: slow.id.clone(),
            id: "hook".into(),
            tenant: None,
        }),
    )
    .await
    .expect("DeleteTaskPushNotificationConfig");
    let canceled = within(
        "cancel",
        client.cancel_task(&CancelTaskRequest {
            id: slow.id.clone(),
            metadata: Some(HashMap::new()),
            tenant: None,
        }),
    )
    .await
    .expect("CancelTask");
    assert_eq!(canceled.status.state, TaskState::Canceled);
    let mut last = None;
    while let Some(event) = within("an event", subscription.next()).await {
        last = Some(event.expect("no error"));
    }
    match last {
        Some(StreamResponse::StatusUpdate(u)) => assert_eq!(u.status.state, TaskState::Canceled),
        other => panic!("the subscription ended with {other:?}"),
    }

    // Errors arrive typed: -32001 for a missing task, -32002 for a
    // cancel of a finished one, -32004 for a card with no extended one.
    let missing = within(
        "get a missing task",
        client.get_task(&GetTaskRequest {
            id: "no-such-task".into(),
            history_length: None,
            tenant: None,
        }),
    )
    .await
    .expect_err("TaskNotFound");
    assert_eq!(missing.code, -32001, "{missing:?}");
    let not_cancelable = within(
        "cancel a finished task",
        client.cancel_task(&CancelTaskRequest {
            id: done.id.clone(),
            metadata: None,
            tenant: None,
        }),
    )
    .await
    .expect_err("TaskNotCancelable");
    assert_eq!(not_cancelable.code, -32002, "{not_cancelable:?}");
    let no_card = within(
        "extended card",
        client.get_extended_agent_card(&GetExtendedAgentCardRequest { tenant: None }),
    )
    .await
    .expect_err("UnsupportedOperation");
    assert_eq!(no_card.code, -32004, "{no_card:?}");
    server.stop().await;
}

fn chrono_hour_ago() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() - chrono::Duration::hours(1)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_sdk_over_json_rpc() {
    tokio::time::timeout(WAIT * 3, every_operation("JSONRPC"))
        .await
        .expect("in time");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_sdk_over_http_json() {
    tokio::time::timeout(WAIT * 3, every_operation("HTTP+JSON"))
        .await
        .expect("in time");
}

/// A tenant's card names its tenant; the SDK sends it with every call.
#[tokio::test(flavor = "multi_thread")]
async fn the_rust_sdk_reaches_a_tenant_through_its_card() {
    let server = support::TestServer::start().await;
    for binding in ["JSONRPC", "HTTP+JSON"] {
        let client = client_for(server.addr, "/code-reviewer", binding).await;
        let answer = within("send", client.send_message(&send("review this", false)))
            .await
            .expect("SendMessage");
        let SendMessageResponse::Task(task) = answer else {
            panic!("a task")
        };
        assert_eq!(task.status.state, TaskState::InputRequired, "{binding}");
    }
    server.stop().await;
}
