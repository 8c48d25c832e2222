//! Every lifecycle flow of the demo agents over real gRPC: blocking,
//! polling, streaming, input-required, auth-required, rejected, failed,
//! canceled and direct message replies.

use crate::support;

use tonic::Code;

use a2a_lifecycle::proto::{
    CancelTaskRequest, SendMessageConfiguration, SubscribeToTaskRequest, TaskState,
    send_message_response, stream_response::Payload,
};
use support::*;

/// spec §3.2.2: blocking SendMessage returns at a terminal state, with all
/// artifacts and status; the report arrived in two chunks (append,
/// last_chunk) and was assembled in order.
#[tokio::test]
async fn blocking_send_returns_completed_task_with_assembled_report() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "run the unit tests").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(status_text(&task), "All 12 tests passed.");
    assert_eq!(task.artifacts.len(), 1);
    let report = &task.artifacts[0];
    assert_eq!(report.artifact_id, "test-report");
    assert_eq!(
        report.parts.len(),
        2,
        "two chunks appended into one artifact"
    );
    // History: the user's message, then the superseded WORKING status message.
    assert_eq!(task.history.len(), 2);
    assert_eq!(
        a2a_lifecycle::agent::message_text(&task.history[0]),
        "run the unit tests"
    );
    assert_eq!(
        a2a_lifecycle::agent::message_text(&task.history[1]),
        "Running the test suite."
    );
    for m in &task.history {
        assert_eq!(m.task_id, task.id);
        assert_eq!(m.context_id, task.context_id);
    }
    assert!(
        !task.context_id.is_empty(),
        "spec §3.4.1: a generated context id is returned"
    );
    server.stop().await;
}

/// The tenant `test-runner` names the same agent as the empty tenant, but
/// its tasks live in its own tenant.
#[tokio::test]
async fn named_tenant_routes_to_its_agent_and_keeps_its_tasks() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "test-runner", "run").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    let other = get_task(&mut client, "", &task.id).await.unwrap_err();
    assert_a2a_error(&other, Code::NotFound, "TASK_NOT_FOUND");
    server.stop().await;
}

/// spec §3.2.2 non-blocking mode, then polling with GetTask (spec §3.5.1).
#[tokio::test]
async fn return_immediately_then_poll_until_completed() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("run"), true)).await;
    assert!(
        !state_of(&task).is_terminal(),
        "returned before the agent finished"
    );
    assert_eq!(state_of(&task), TaskState::Submitted);
    // Polling is the flow under test: GetTask until terminal, bounded.
    let deadline = tokio::time::Instant::now() + WAIT;
    let final_task = loop {
        let t = get_task(&mut client, "", &task.id).await.unwrap();
        if state_of(&t).is_terminal() {
            break t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task never completed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert_eq!(state_of(&final_task), TaskState::Completed);
    assert_eq!(final_task.artifacts[0].parts.len(), 2);
    server.stop().await;
}

/// spec §3.1.2: the stream begins with the Task, then every update in
/// order, and closes at the terminal state.
#[tokio::test]
async fn streaming_send_yields_task_then_updates_then_closes() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let stream = client
        .send_streaming_message(request("", user_message("run"), false))
        .await
        .unwrap()
        .into_inner();
    let events = collect(stream).await.unwrap();
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_WORKING",
            "artifact:test-report",
            "artifact:test-report+append+last",
            "status:TASK_STATE_COMPLETED",
        ]
    );
    let Some(Payload::Task(first)) = &events[0].payload else {
        panic!()
    };
    for ev in &events[1..] {
        match ev.payload.as_ref().unwrap() {
            Payload::StatusUpdate(u) => {
                assert_eq!(u.task_id, first.id);
                assert_eq!(u.context_id, first.context_id);
                assert!(
                    u.status.as_ref().unwrap().timestamp.is_some(),
                    "server stamps status time"
                );
            }
            Payload::ArtifactUpdate(a) => assert_eq!(a.task_id, first.id),
            other => panic!("unexpected {other:?}"),
        }
    }
    server.stop().await;
}

/// spec §3.1.1: the text `ping` gets a direct Message and no task.
#[tokio::test]
async fn ping_gets_a_direct_message_and_no_task() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut msg = user_message("ping");
    msg.context_id = "ctx-ping".into();
    let reply = client
        .send_message(request("", msg, false))
        .await
        .unwrap()
        .into_inner();
    let Some(send_message_response::Payload::Message(m)) = reply.payload else {
        panic!("expected a message, got {reply:?}")
    };
    assert_eq!(a2a_lifecycle::agent::message_text(&m), "pong");
    assert_eq!(m.role, a2a_lifecycle::proto::Role::Agent as i32);
    assert_eq!(m.context_id, "ctx-ping");
    assert!(m.task_id.is_empty());
    // No task was created.
    let list = client
        .list_tasks(a2a_lifecycle::proto::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.total_size, 0);
    server.stop().await;
}

/// spec §3.1.2 pattern 1: a message-only stream holds exactly one Message.
#[tokio::test]
async fn streaming_ping_is_a_one_message_stream() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let stream = client
        .send_streaming_message(request("", user_message("ping"), false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        describe_all(&collect(stream).await.unwrap()),
        ["message:pong"]
    );
    server.stop().await;
}

/// Text containing `fail` ends FAILED with a status message.
#[tokio::test]
async fn failing_tests_end_failed_with_a_status_message() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "this will fail").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(status_text(&task).contains("tests failed"));
    server.stop().await;
}

/// spec §3.4.3: the code reviewer asks for input; a follow-up on the task
/// (context inferred from the task) completes it.
#[tokio::test]
async fn input_required_then_follow_up_completes() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "code-reviewer", "review my change").await;
    assert_eq!(
        state_of(&task),
        TaskState::InputRequired,
        "blocking returns at interrupted"
    );
    assert_eq!(status_text(&task), "Please send the diff to review.");

    let mut follow_up = user_message("--- a/x\n+++ b/x\n@@\n-old\n+new");
    follow_up.task_id = task.id.clone();
    let done = send_task(&mut client, request("code-reviewer", follow_up, false)).await;
    assert_eq!(state_of(&done), TaskState::Completed);
    assert_eq!(done.id, task.id);
    assert_eq!(done.context_id, task.context_id);
    assert_eq!(done.artifacts.len(), 1);
    assert_eq!(done.artifacts[0].artifact_id, "review");
    let texts: Vec<_> = done
        .history
        .iter()
        .map(a2a_lifecycle::agent::message_text)
        .collect();
    assert_eq!(texts[0], "review my change");
    assert_eq!(texts[1], "Please send the diff to review.");
    assert!(texts[2].starts_with("--- a/x"));
    assert_eq!(
        done.history[2].context_id, task.context_id,
        "context inferred from the task"
    );
    server.stop().await;
}

/// SendStreamingMessage closes when the agent asks this client for input;
/// the follow-up's stream starts from the task and runs to the end.
#[tokio::test]
async fn streaming_input_required_closes_and_follow_up_streams_to_completion() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let events = collect(
        client
            .send_streaming_message(request("code-reviewer", user_message("review"), false))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_INPUT_REQUIRED"
        ]
    );
    let Some(Payload::Task(task)) = &events[0].payload else {
        panic!()
    };
    let mut follow_up = user_message("diff");
    follow_up.task_id = task.id.clone();
    follow_up.context_id = task.context_id.clone();
    let events = collect(
        client
            .send_streaming_message(request("code-reviewer", follow_up, false))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_INPUT_REQUIRED",
            "status:TASK_STATE_WORKING",
            "artifact:review+last",
            "status:TASK_STATE_COMPLETED",
        ]
    );
    server.stop().await;
}

/// spec §7.6.1: AUTH_REQUIRED with a status message; the stream stays open
/// and the task resumes with no client message.
#[tokio::test]
async fn auth_required_resumes_by_itself_on_the_open_stream() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let events = collect(
        client
            .send_streaming_message(request(
                "deployer",
                user_message("deploy v2 to staging"),
                false,
            ))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_AUTH_REQUIRED",
            "status:TASK_STATE_WORKING",
            "artifact:deployment+last",
            "status:TASK_STATE_COMPLETED",
        ]
    );
    let Some(Payload::StatusUpdate(auth)) = &events[1].payload else {
        panic!()
    };
    let text =
        a2a_lifecycle::agent::message_text(auth.status.as_ref().unwrap().message.as_ref().unwrap());
    assert!(text.contains("Approval needed"), "{text}");
    server.stop().await;
}

/// Blocking SendMessage returns at AUTH_REQUIRED (interrupted); the task
/// later completes without any client message.
#[tokio::test]
async fn blocking_send_returns_at_auth_required_then_task_completes_alone() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "deployer", "deploy to prod").await;
    assert_eq!(state_of(&task), TaskState::AuthRequired);
    assert!(status_text(&task).contains("Approval needed to deploy to prod"));
    // Follow it to the end: subscribe if still open, else read it.
    let sub = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: "deployer".into(),
            id: task.id.clone(),
        })
        .await;
    if let Ok(stream) = sub {
        let events = collect(stream.into_inner()).await.unwrap();
        assert_eq!(
            describe(events.last().unwrap()),
            "status:TASK_STATE_COMPLETED"
        );
    } else {
        assert_a2a_error(
            &sub.unwrap_err(),
            Code::FailedPrecondition,
            "UNSUPPORTED_OPERATION",
        );
    }
    let final_task = get_task(&mut client, "deployer", &task.id).await.unwrap();
    assert_eq!(state_of(&final_task), TaskState::Completed);
    let user_messages = final_task
        .history
        .iter()
        .filter(|m| m.role == a2a_lifecycle::proto::Role::User as i32)
        .count();
    assert_eq!(user_messages, 1, "resumed with no client message");
    server.stop().await;
}

/// Proto TaskState: an agent may reject at creation. SUBMITTED -> REJECTED
/// with nothing between.
#[tokio::test]
async fn unknown_deploy_target_is_rejected_straight_from_submitted() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let events = collect(
        client
            .send_streaming_message(request("deployer", user_message("deploy to mars"), false))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    assert_eq!(
        describe_all(&events),
        ["task:TASK_STATE_SUBMITTED", "status:TASK_STATE_REJECTED"]
    );
    let task = send_text(&mut client, "deployer", "deploy to the moon").await;
    assert_eq!(state_of(&task), TaskState::Rejected);
    assert!(status_text(&task).contains("only deploys to staging or prod"));
    server.stop().await;
}

/// spec §3.1.5: cancel a working task; its subscribers see CANCELED and
/// their streams close; the task then refuses everything (seed 000).
#[tokio::test]
async fn cancel_working_task_then_terminal_task_refuses_everything() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("slow tests"), true)).await;
    let sub = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let subscriber = tokio::spawn(collect(sub));

    let canceled = client
        .cancel_task(CancelTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&canceled), TaskState::Canceled);

    let events = subscriber.await.unwrap().unwrap();
    assert_eq!(describe(&events[0]).split(':').next(), Some("task"));
    assert_eq!(
        describe(events.last().unwrap()),
        "status:TASK_STATE_CANCELED"
    );

    // Terminal: cancel again, subscribe, send.
    let again = client
        .cancel_task(CancelTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
            metadata: None,
        })
        .await
        .unwrap_err();
    assert_a2a_error(&again, Code::FailedPrecondition, "TASK_NOT_CANCELABLE");
    let info = tonic_types::StatusExt::get_details_error_info(&again).unwrap();
    assert_eq!(info.metadata.get("task_id"), Some(&task.id));

    let sub = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
        })
        .await
        .unwrap_err();
    assert_a2a_error(&sub, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");

    let mut msg = user_message("more");
    msg.task_id = task.id.clone();
    let send = client
        .send_message(request("", msg, false))
        .await
        .unwrap_err();
    assert_a2a_error(&send, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");

    // The slow agent stopped: the task stays CANCELED.
    let t = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&t), TaskState::Canceled);
    server.stop().await;
}

/// The slow agent reports progress while WORKING (status updates with
/// messages), observed live on a subscription.
#[tokio::test]
async fn slow_task_streams_progress_updates() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut stream = client
        .send_streaming_message(request("", user_message("slow please"), false))
        .await
        .unwrap()
        .into_inner();
    let mut progress = 0;
    while progress < 3 {
        let ev = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(Payload::StatusUpdate(u)) = &ev.payload {
            let st = u.status.as_ref().unwrap();
            assert_eq!(st.state, TaskState::Working as i32);
            let text = st
                .message
                .as_ref()
                .map(a2a_lifecycle::agent::message_text)
                .unwrap_or_default();
            if text.starts_with("Progress") {
                progress += 1;
            }
        }
    }
    let task_id = match client
        .list_tasks(a2a_lifecycle::proto::ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tasks
        .first()
    {
        Some(t) => t.id.clone(),
        None => panic!("task listed"),
    };
    client
        .cancel_task(CancelTaskRequest {
            tenant: "".into(),
            id: task_id,
            metadata: None,
        })
        .await
        .unwrap();
    let rest = collect(stream).await.unwrap();
    assert_eq!(describe(rest.last().unwrap()), "status:TASK_STATE_CANCELED");
    server.stop().await;
}

/// spec §3.2.4 on SendMessage: configuration.history_length trims the
/// returned task's history.
#[tokio::test]
async fn send_history_length_trims_returned_history() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut req = request("", user_message("run"), false);
    req.configuration = Some(SendMessageConfiguration {
        history_length: Some(1),
        ..Default::default()
    });
    let task = send_task(&mut client, req).await;
    assert_eq!(task.history.len(), 1);
    assert_eq!(
        a2a_lifecycle::agent::message_text(&task.history[0]),
        "Running the test suite."
    );
    server.stop().await;
}
