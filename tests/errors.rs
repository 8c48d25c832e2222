//! Every error the service returns, over real gRPC: the gRPC code of
//! spec §5.4 (v1.0.1), a `google.rpc.ErrorInfo` (spec §10.6) and, for
//! validation, a `google.rpc.BadRequest` naming the field.

use crate::support;

use tonic::Code;

use a2a_lifecycle::proto::{
    CancelTaskRequest, DeleteTaskPushNotificationConfigRequest, GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest, GetTaskRequest, ListTaskPushNotificationConfigsRequest,
    ListTasksRequest, Message, Part, Role, SendMessageConfiguration, SendMessageRequest,
    SubscribeToTaskRequest, TaskPushNotificationConfig, part::Content,
};
use support::*;

async fn send_err(client: &mut Client, req: SendMessageRequest) -> tonic::Status {
    client.send_message(req).await.unwrap_err()
}

#[tokio::test]
async fn send_validation_errors_name_the_field() {
    let server = TestServer::start().await;
    let mut client = server.client().await;

    let no_message = SendMessageRequest::default();
    assert_bad_field(&send_err(&mut client, no_message).await, "message");

    let mut m = user_message("x");
    m.parts.clear();
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.parts",
    );

    let mut m = user_message("x");
    m.message_id.clear();
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.message_id",
    );

    let mut m = user_message("x");
    m.role = Role::Unspecified as i32;
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.role",
    );

    let mut m = user_message("x");
    m.role = Role::Agent as i32;
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.role",
    );

    let mut m = user_message("x");
    m.role = 42;
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.role",
    );

    let m = Message {
        message_id: "m".into(),
        role: Role::User as i32,
        parts: vec![Part::default()],
        ..Default::default()
    };
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.parts[0]",
    );

    let mut m = user_message("x");
    m.message_id = "x".repeat(257);
    assert_bad_field(
        &send_err(&mut client, request("", m, false)).await,
        "message.message_id",
    );

    let mut req = request("", user_message("x"), false);
    req.configuration = Some(SendMessageConfiguration {
        history_length: Some(-1),
        ..Default::default()
    });
    assert_bad_field(
        &send_err(&mut client, req).await,
        "configuration.history_length",
    );

    // The streaming RPC validates the same way.
    let err = client
        .send_streaming_message(SendMessageRequest::default())
        .await
        .unwrap_err();
    assert_bad_field(&err, "message");

    // Nothing was created by refused requests.
    let list = client
        .list_tasks(ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.total_size, 0);
    server.stop().await;
}

/// Several violations are reported together.
#[tokio::test]
async fn all_violations_are_reported_at_once() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let m = Message {
        role: Role::Unspecified as i32,
        ..Default::default()
    };
    let err = send_err(&mut client, request("", m, false)).await;
    let bad = tonic_types::StatusExt::get_details_bad_request(&err).unwrap();
    let fields: Vec<_> = bad
        .field_violations
        .iter()
        .map(|v| v.field.as_str())
        .collect();
    assert_eq!(
        fields,
        ["message.message_id", "message.role", "message.parts"]
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_tenant_is_invalid_for_send() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let err = send_err(
        &mut client,
        request("no-such-agent", user_message("x"), false),
    )
    .await;
    assert_bad_field(&err, "tenant");
    server.stop().await;
}

/// spec §3.4.2: an unknown task_id is TASK_NOT_FOUND, never a new task.
#[tokio::test]
async fn unknown_task_is_task_not_found_everywhere() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let id = "no-such-task".to_string();

    let mut m = user_message("x");
    m.task_id = id.clone();
    let err = send_err(&mut client, request("", m.clone(), false)).await;
    assert_a2a_error(&err, Code::NotFound, "TASK_NOT_FOUND");
    let info = tonic_types::StatusExt::get_details_error_info(&err).unwrap();
    assert_eq!(info.metadata.get("task_id"), Some(&id));

    let err = client
        .send_streaming_message(request("", m, false))
        .await
        .unwrap_err();
    assert_a2a_error(&err, Code::NotFound, "TASK_NOT_FOUND");

    let err = client
        .get_task(GetTaskRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_a2a_error(&err, Code::NotFound, "TASK_NOT_FOUND");

    let err = client
        .cancel_task(CancelTaskRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_a2a_error(&err, Code::NotFound, "TASK_NOT_FOUND");

    let err = client
        .subscribe_to_task(SubscribeToTaskRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_a2a_error(&err, Code::NotFound, "TASK_NOT_FOUND");
    server.stop().await;
}

#[tokio::test]
async fn empty_task_ids_and_bad_history_length_are_invalid() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let err = client
        .get_task(GetTaskRequest::default())
        .await
        .unwrap_err();
    assert_bad_field(&err, "id");
    let err = client
        .cancel_task(CancelTaskRequest::default())
        .await
        .unwrap_err();
    assert_bad_field(&err, "id");
    let err = client
        .subscribe_to_task(SubscribeToTaskRequest::default())
        .await
        .unwrap_err();
    assert_bad_field(&err, "id");

    let task = send_text(&mut client, "", "run").await;
    let err = client
        .get_task(GetTaskRequest {
            id: task.id.clone(),
            history_length: Some(-3),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_bad_field(&err, "history_length");
    server.stop().await;
}

/// spec §3.1.4 validation: page_size 1..=100, a real status, our own tokens.
#[tokio::test]
async fn list_validation_errors() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for bad in [0, -1, 101] {
        let err = client
            .list_tasks(ListTasksRequest {
                page_size: Some(bad),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_bad_field(&err, "page_size");
    }
    let err = client
        .list_tasks(ListTasksRequest {
            status: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_bad_field(&err, "status");
    let err = client
        .list_tasks(ListTasksRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_bad_field(&err, "page_token");
    let err = client
        .list_tasks(ListTasksRequest {
            history_length: Some(-1),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_bad_field(&err, "history_length");
    // 1 and 100 are fine.
    for ok in [1, 100] {
        let page = client
            .list_tasks(ListTasksRequest {
                page_size: Some(ok),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.page_size, ok);
    }
    server.stop().await;
}

/// spec §3.3.4: an agent without push notifications answers every push
/// config RPC, and a SendMessage carrying a push config, with
/// PUSH_NOTIFICATION_NOT_SUPPORTED.
#[tokio::test]
async fn push_config_rpcs_are_not_supported() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let reason = "PUSH_NOTIFICATION_NOT_SUPPORTED";
    let fp = Code::FailedPrecondition;
    let err = client
        .create_task_push_notification_config(TaskPushNotificationConfig {
            task_id: "t".into(),
            url: "https://example.com/hook".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_a2a_error(&err, fp, reason);
    let err = client
        .get_task_push_notification_config(GetTaskPushNotificationConfigRequest::default())
        .await
        .unwrap_err();
    assert_a2a_error(&err, fp, reason);
    let err = client
        .list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest::default())
        .await
        .unwrap_err();
    assert_a2a_error(&err, fp, reason);
    let err = client
        .delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest::default())
        .await
        .unwrap_err();
    assert_a2a_error(&err, fp, reason);

    let mut req = request("", user_message("run"), false);
    req.configuration = Some(SendMessageConfiguration {
        task_push_notification_config: Some(TaskPushNotificationConfig {
            url: "https://example.com/hook".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_a2a_error(&send_err(&mut client, req).await, fp, reason);
    server.stop().await;
}

/// spec §3.1.11, §3.3.4: no extendedAgentCard capability ->
/// UNSUPPORTED_OPERATION.
#[tokio::test]
async fn extended_agent_card_is_unsupported() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let err = client
        .get_extended_agent_card(GetExtendedAgentCardRequest::default())
        .await
        .unwrap_err();
    assert_a2a_error(&err, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    server.stop().await;
}

/// spec §3.4.3: a context_id that differs from the task's is rejected.
#[tokio::test]
async fn mismatching_context_id_is_rejected() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "code-reviewer", "review").await;
    let mut m = user_message("diff");
    m.task_id = task.id.clone();
    m.context_id = "some-other-context".into();
    let err = send_err(&mut client, request("code-reviewer", m, false)).await;
    assert_bad_field(&err, "message.context_id");
    // The task did not change.
    let t = get_task(&mut client, "code-reviewer", &task.id)
        .await
        .unwrap();
    assert_eq!(t, task);
    server.stop().await;
}

/// A message larger than the named transport limit is refused by gRPC,
/// not processed.
#[tokio::test]
async fn oversized_message_is_refused() {
    let server = TestServer::start().await;
    let mut client = server
        .client()
        .await
        .max_encoding_message_size(64 * 1024 * 1024);
    let big = "x".repeat(a2a_lifecycle::server::MAX_MESSAGE_BYTES + 1);
    let m = Message {
        message_id: "big".into(),
        role: Role::User as i32,
        parts: vec![Part {
            content: Some(Content::Text(big)),
            ..Default::default()
        }],
        ..Default::default()
    };
    let err = send_err(&mut client, request("", m, false)).await;
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    server.stop().await;
}

/// A tenant no agent serves gets the same answer on every RPC:
/// INVALID_ARGUMENT naming `tenant` (not an empty list, not NOT_FOUND).
#[tokio::test]
async fn an_unknown_tenant_is_the_same_error_on_every_rpc() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let t = "no-such-tenant".to_owned();
    let mut errors = vec![
        send_err(&mut client, request(&t, user_message("x"), false)).await,
        client
            .send_streaming_message(request(&t, user_message("x"), false))
            .await
            .unwrap_err(),
        client
            .get_task(GetTaskRequest {
                tenant: t.clone(),
                id: "x".into(),
                history_length: None,
            })
            .await
            .unwrap_err(),
        client
            .list_tasks(ListTasksRequest {
                tenant: t.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        client
            .cancel_task(CancelTaskRequest {
                tenant: t.clone(),
                id: "x".into(),
                metadata: None,
            })
            .await
            .unwrap_err(),
        client
            .subscribe_to_task(SubscribeToTaskRequest {
                tenant: t.clone(),
                id: "x".into(),
            })
            .await
            .unwrap_err(),
    ];
    errors.push(
        client
            .get_extended_agent_card(GetExtendedAgentCardRequest { tenant: t.clone() })
            .await
            .unwrap_err(),
    );
    for status in &errors {
        assert_bad_field(status, "tenant");
    }
    server.stop().await;
}

/// `a2a-version` is exactly `1.0` or `1.0.N` (spec §3.6.2).
#[tokio::test]
async fn the_version_is_parsed_exactly() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for bad in [" 1.0", "01.0", "1.00", "1.0.01"] {
        let mut req = tonic::Request::new(ListTasksRequest::default());
        req.metadata_mut()
            .insert("a2a-version", bad.parse().unwrap());
        let status = client.list_tasks(req).await.unwrap_err();
        assert_a2a_error(&status, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
    }
    for ok in ["1.0", "1.0.3"] {
        let mut req = tonic::Request::new(ListTasksRequest::default());
        req.metadata_mut()
            .insert("a2a-version", ok.parse().unwrap());
        assert!(client.list_tasks(req).await.is_ok(), "{ok}");
    }
    server.stop().await;
}

/// A request over the message limit is refused by the transport before any
/// handler; it still carries ErrorInfo (domain a2a-protocol.org), naming
/// the limit.
#[tokio::test]
async fn a_message_over_the_limit_is_out_of_range_with_error_info() {
    use tonic_types::StatusExt;
    let server = TestServer::start().await;
    let mut client =
        a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::new(server.channel().await)
            .max_encoding_message_size(16 * 1024 * 1024);
    let big = "x".repeat(a2a_lifecycle::server::MAX_MESSAGE_BYTES + 1);
    let status = send_err(&mut client, request("", user_message(&big), false)).await;
    assert_a2a_error(&status, Code::OutOfRange, "OUT_OF_RANGE");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata.get("max_bytes").map(String::as_str),
        Some(
            a2a_lifecycle::server::MAX_MESSAGE_BYTES
                .to_string()
                .as_str()
        )
    );
    // The connection and the server go on.
    let ok = send_task(
        &mut client,
        request("", user_message("run the tests"), false),
    )
    .await;
    assert_eq!(state_of(&ok), a2a_lifecycle::proto::TaskState::Completed);
    server.stop().await;
}
