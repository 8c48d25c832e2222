//! Runtime guarantees over real gRPC with custom executors: a failing,
//! panicking or silent executor leaves its task FAILED, never stuck; runs on
//! one task never overlap; hundreds of concurrent tasks; multi-turn context
//! rules (spec §3.4); ListTasks (spec §3.1.4) end to end.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use tonic::Code;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::proto::{ListTasksRequest, TaskState, stream_response::Payload};
use a2a_lifecycle::runtime::RuntimeConfig;
use support::*;

/// Misbehaves according to the message text.
struct Misbehaving;

#[async_trait]
impl AgentExecutor for Misbehaving {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        match ctx.text().as_str() {
            "error" => {
                sink.status(TaskState::Working, None).await?;
                Err(AgentError::Failed("database exploded".into()))
            }
            "panic" => {
                sink.status(TaskState::Working, None).await?;
                panic!("agent bug");
            }
            "panic-first" => panic!("agent bug before any event"),
            "return-working" => {
                sink.status(TaskState::Working, None).await?;
                Ok(())
            }
            "silent" => Ok(()),
            "seal" => {
                sink.status(TaskState::Working, None).await?;
                sink.artifact_text("a", "a", "1", false, true).await?;
                // Appending to a sealed artifact is refused; propagating the
                // error fails the task.
                sink.artifact_text("a", "a", "2", true, false).await?;
                Ok(())
            }
            "reply-twice" => {
                sink.reply_text("one").await?;
                sink.reply_text("two").await?;
                Ok(())
            }
            _ => Ok(sink.status(TaskState::Completed, None).await?),
        }
    }
}

async fn misbehaving_server() -> TestServer {
    TestServer::start_with(
        AgentRouter::new().with("", Arc::new(Misbehaving)),
        RuntimeConfig::default(),
    )
    .await
}

#[tokio::test]
async fn executor_error_fails_the_task_with_its_message() {
    let server = misbehaving_server().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "error").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(
        status_text(&task).contains("database exploded"),
        "{}",
        status_text(&task)
    );
    server.stop().await;
}

#[tokio::test]
async fn executor_panic_fails_the_task_and_the_server_lives_on() {
    let server = misbehaving_server().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "panic").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(status_text(&task).contains("agent panicked: agent bug"));
    // Panicking before any event still yields a FAILED task, not a hang.
    let task = send_text(&mut client, "", "panic-first").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(status_text(&task).contains("panicked"));
    let ok = send_text(&mut client, "", "fine").await;
    assert_eq!(state_of(&ok), TaskState::Completed);
    server.stop().await;
}

#[tokio::test]
async fn executor_returning_while_active_or_silent_fails_the_task() {
    let server = misbehaving_server().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "return-working").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(status_text(&task).contains("TASK_STATE_WORKING"));
    let task = send_text(&mut client, "", "silent").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(status_text(&task).contains("without responding"));
    server.stop().await;
}

#[tokio::test]
async fn append_to_sealed_artifact_is_an_agent_error_not_corruption() {
    let server = misbehaving_server().await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "seal").await;
    assert_eq!(state_of(&task), TaskState::Failed);
    assert!(
        status_text(&task).contains("sealed"),
        "{}",
        status_text(&task)
    );
    assert_eq!(task.artifacts.len(), 1);
    assert_eq!(
        task.artifacts[0].parts.len(),
        1,
        "the refused chunk was not applied"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_second_reply_is_refused_and_the_first_is_delivered() {
    let server = misbehaving_server().await;
    let mut client = server.client().await;
    let reply = client
        .send_message(request("", user_message("reply-twice"), false))
        .await
        .unwrap()
        .into_inner();
    let Some(a2a_lifecycle::proto::send_message_response::Payload::Message(m)) = reply.payload
    else {
        panic!("{reply:?}")
    };
    assert_eq!(a2a_lifecycle::agent::message_text(&m), "one");
    server.stop().await;
}

/// Counts overlapping runs on a task.
struct Overlap {
    running: AtomicUsize,
    max_seen: AtomicUsize,
}

#[async_trait]
impl AgentExecutor for Overlap {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_seen.fetch_max(now, Ordering::SeqCst);
        // Give any overlapping run the chance to start.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let state = if ctx.task.is_none() {
            TaskState::InputRequired
        } else {
            sink.status(TaskState::Working, None).await?;
            TaskState::InputRequired
        };
        self.running.fetch_sub(1, Ordering::SeqCst);
        sink.status(state, Some("next?")).await?;
        Ok(())
    }
}

/// Concurrent messages to one task are applied one at a time: runs never
/// overlap, and every message lands in history.
#[tokio::test]
async fn concurrent_messages_to_one_task_run_one_at_a_time() {
    let agent = Arc::new(Overlap {
        running: AtomicUsize::new(0),
        max_seen: AtomicUsize::new(0),
    });
    let server = TestServer::start_with(
        AgentRouter::new().with("", agent.clone()),
        RuntimeConfig::default(),
    )
    .await;
    let mut client = server.client().await;
    let task = send_text(&mut client, "", "start").await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    let mut sends = Vec::new();
    for i in 0..20 {
        let mut c = client.clone();
        let mut m = user_message(&format!("turn {i}"));
        m.task_id = task.id.clone();
        sends.push(tokio::spawn(async move {
            send_task(&mut c, request("", m, false)).await
        }));
    }
    for s in sends {
        assert_eq!(state_of(&s.await.unwrap()), TaskState::InputRequired);
    }
    assert_eq!(agent.max_seen.load(Ordering::SeqCst), 1, "runs overlapped");
    let t = get_task(&mut client, "", &task.id).await.unwrap();
    let user_turns = t
        .history
        .iter()
        .filter(|m| a2a_lifecycle::agent::message_text(m).starts_with("turn "))
        .count();
    assert_eq!(user_turns, 20);
    // The transition log (issue "console"): every committed change of
    // state once, in order: the first run's question, then each
    // follow-up's run resuming the task and asking again.
    let (_, log) = transitions(&mut client, "", &task.id).await;
    let mut expected = vec!["SUBMITTED client", "INPUT_REQUIRED agent"];
    for _ in 0..20 {
        expected.extend(["WORKING follow-up", "INPUT_REQUIRED agent"]);
    }
    assert_eq!(log, expected);
    server.stop().await;
}

/// Hundreds of concurrent tasks, blocking and streaming, all complete; the
/// runtime forgets them afterwards (no leak of live tasks).
#[tokio::test]
async fn hundreds_of_concurrent_tasks_complete() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut jobs = Vec::new();
    for i in 0..300 {
        let mut c = client.clone();
        jobs.push(tokio::spawn(async move {
            if i % 3 == 0 {
                let events = collect(
                    c.send_streaming_message(request("", user_message("run"), false))
                        .await
                        .unwrap()
                        .into_inner(),
                )
                .await
                .unwrap();
                describe(events.last().unwrap())
            } else {
                let t = send_text(&mut c, "", "run").await;
                format!("status:{}", state_of(&t).as_str_name())
            }
        }));
    }
    for j in jobs {
        assert_eq!(j.await.unwrap(), "status:TASK_STATE_COMPLETED");
    }
    let mut c = client.clone();
    let page = c
        .list_tasks(ListTasksRequest {
            page_size: Some(100),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.total_size, 300);
    assert_eq!(page.tasks.len(), 100);
    for task in &page.tasks {
        let (_, log) = transitions(&mut c, "", &task.id).await;
        assert_eq!(
            log,
            ["SUBMITTED client", "WORKING agent", "COMPLETED agent"]
        );
    }
    assert!(!page.next_page_token.is_empty());
    // Runs end asynchronously just after the final event; wait on that.
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.manager.live_task_count() != 0 {
        assert!(tokio::time::Instant::now() < deadline, "live tasks leaked");
        tokio::task::yield_now().await;
    }
    server.stop().await;
}

/// spec §3.4.1, §3.4.3: a client-chosen context_id is kept; a message with
/// only a context_id starts a new task in that context.
#[tokio::test]
async fn context_ids_are_kept_and_shared_by_new_tasks() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut m = user_message("run");
    m.context_id = "ctx-planner-1".into();
    let first = send_task(&mut client, request("", m, false)).await;
    assert_eq!(first.context_id, "ctx-planner-1");
    let mut m = user_message("run again");
    m.context_id = "ctx-planner-1".into();
    let second = send_task(&mut client, request("", m, false)).await;
    assert_eq!(second.context_id, "ctx-planner-1");
    assert_ne!(second.id, first.id, "a new task in the same context");
    let other = send_text(&mut client, "", "run").await;
    assert_ne!(other.context_id, "ctx-planner-1");

    let listed = client
        .list_tasks(ListTasksRequest {
            context_id: "ctx-planner-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_size, 2);
    let ids: Vec<_> = listed.tasks.iter().map(|t| t.id.clone()).collect();
    assert_eq!(ids, [second.id.clone(), first.id.clone()], "newest first");
    server.stop().await;
}

/// spec §3.1.4 end to end: status filter, artifacts omitted unless asked,
/// history_length, pages that neither skip nor repeat.
#[tokio::test]
async fn list_tasks_filters_and_pages() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for _ in 0..5 {
        send_text(&mut client, "", "run").await;
    }
    for _ in 0..3 {
        send_text(&mut client, "", "fail").await;
    }
    let failed = client
        .list_tasks(ListTasksRequest {
            status: TaskState::Failed as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.total_size, 3);
    assert!(
        failed
            .tasks
            .iter()
            .all(|t| state_of(t) == TaskState::Failed)
    );
    assert_eq!(failed.page_size, 50, "unset page_size is 50");
    assert_eq!(failed.next_page_token, "");

    let all = client
        .list_tasks(ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        all.tasks.iter().all(|t| t.artifacts.is_empty()),
        "artifacts omitted by default"
    );
    let with = client
        .list_tasks(ListTasksRequest {
            include_artifacts: Some(true),
            status: TaskState::Completed as i32,
            history_length: Some(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        with.tasks
            .iter()
            .all(|t| t.artifacts.len() == 1 && t.history.is_empty())
    );

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut created = 0;
    loop {
        let page = client
            .list_tasks(ListTasksRequest {
                page_size: Some(3),
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            page.total_size,
            8 + created,
            "total_size counts all matches now"
        );
        seen.extend(page.tasks.iter().map(|t| t.id.clone()));
        // A task created between pages must not disturb the walk.
        send_text(&mut client, "", "run").await;
        created += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let all_ids: Vec<_> = all.tasks.iter().map(|t| t.id.clone()).collect();
    assert_eq!(
        seen, all_ids,
        "pages visit every original task once, in order"
    );
    server.stop().await;
}

/// The demo router serves the demo agents and the conformance agent;
/// anything else is refused, and the stream of a follow-up starts from the
/// continued task.
#[tokio::test]
async fn demo_router_serves_the_demo_tenants() {
    let tenants = demo_router().tenants();
    assert_eq!(
        tenants,
        [
            "",
            "bench",
            "code-reviewer",
            "conformance",
            "deployer",
            "test-runner"
        ]
    );
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let err = client
        .send_message(request("planner", user_message("x"), false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let task = send_text(&mut client, "code-reviewer", "review").await;
    let mut m = user_message("diff");
    m.task_id = task.id.clone();
    let events = collect(
        client
            .send_streaming_message(request("code-reviewer", m, false))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    let Some(Payload::Task(first)) = &events[0].payload else {
        panic!()
    };
    assert_eq!(first.id, task.id);
    server.stop().await;
}

/// `--strict-transitions` (seed 001's table): the normal test-runner flow
/// passes; the deployer's SUBMITTED -> AUTH_REQUIRED is refused and the
/// task ends FAILED rather than stuck, although SUBMITTED -> FAILED is not
/// in the strict table either (server transitions are exempt).
#[tokio::test]
async fn strict_policy_refuses_agent_transitions_but_never_strands_a_task() {
    let config = RuntimeConfig {
        policy: a2a_lifecycle::lifecycle::TransitionPolicy::Strict,
        ..Default::default()
    };
    let server = TestServer::start_with(demo_router(), config).await;
    let mut client = server.client().await;
    let ok = send_text(&mut client, "", "run").await;
    assert_eq!(state_of(&ok), TaskState::Completed);
    let refused = send_text(&mut client, "deployer", "deploy to prod").await;
    assert_eq!(state_of(&refused), TaskState::Failed);
    assert!(
        status_text(&refused).contains("strict policy"),
        "{}",
        status_text(&refused)
    );
    // Cancel is allowed from every non-terminal state.
    let slow = send_task(&mut client, request("", user_message("slow"), true)).await;
    let canceled = client
        .cancel_task(a2a_lifecycle::proto::CancelTaskRequest {
            tenant: "".into(),
            id: slow.id,
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&canceled), TaskState::Canceled);
    server.stop().await;
}

/// A new task's answer (spec §3.1.1, §3.2.2 non-blocking) is the task as
/// created: SUBMITTED, the message alone in its history (with the task's
/// ids), no artifact, trimmed to the request's history length; its run's
/// events come after it, though the agent completed in the same write.
#[tokio::test]
async fn a_new_tasks_answer_is_the_task_as_created() {
    let server = misbehaving_server().await;
    let mut client = server.client().await;
    for history_length in [None, Some(0), Some(1), Some(5)] {
        let message = user_message("complete");
        let mut req = request("", message.clone(), true);
        req.configuration.as_mut().unwrap().history_length = history_length;
        let task = within("non-blocking send", send_task(&mut client, req)).await;
        assert_eq!(state_of(&task), TaskState::Submitted, "{history_length:?}");
        assert!(task.artifacts.is_empty(), "{history_length:?}");
        if history_length == Some(0) {
            assert!(task.history.is_empty(), "{:?}", task.history);
        } else {
            assert_eq!(task.history.len(), 1, "{history_length:?}");
            let sent = &task.history[0];
            assert_eq!(sent.message_id, message.message_id);
            assert_eq!(sent.task_id, task.id);
            assert_eq!(sent.context_id, task.context_id);
            assert_eq!(sent.parts, message.parts);
        }
        // What the store holds moved on.
        let (_, stored) = within("settled", settled(&mut client, "", &task.id)).await;
        assert_eq!(state_of(&stored), TaskState::Completed);
        // GetTask over gRPC answers with the stored bytes: the history
        // message keeps the ids a compact record leaves out.
        assert_eq!(stored.history.len(), 1);
        assert_eq!(stored.history[0].task_id, task.id);
        assert_eq!(stored.history[0].context_id, task.context_id);
        assert_eq!(stored.history[0].message_id, message.message_id);
    }
    // Streamed: the task as created first, then the run's events.
    let events = within(
        "stream",
        collect(
            client
                .send_streaming_message(request("", user_message("complete"), false))
                .await
                .expect("stream")
                .into_inner(),
        ),
    )
    .await
    .expect("events");
    let Some(Payload::Task(first)) = &events[0].payload else {
        panic!("first event: {:?}", describe_all(&events));
    };
    assert_eq!(state_of(first), TaskState::Submitted);
    assert_eq!(first.history.len(), 1);
    assert!(
        matches!(events.last().and_then(|e| e.payload.as_ref()),
            Some(Payload::StatusUpdate(u)) if u.status.as_ref().map(|s| s.state) == Some(TaskState::Completed as i32)),
        "{:?}",
        describe_all(&events)
    );
    server.stop().await;
}
