//! The lifecycle under concurrency, over real gRPC: follow-ups never wait
//! on a run (spec §3.2.2), a message to a terminal task is refused at once
//! whatever its executor does (spec §3.1.1), every stream ends, idempotent
//! repeats never run the agent twice (spec §3.3.1), blocking sends answer
//! honestly, and request metadata reaches the agent.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use a2a_lifecycle::wkt::{Struct, Value, value::Kind};
use async_trait::async_trait;
use tokio::sync::{Notify, Semaphore};
use tonic::Code;

use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::lifecycle::StatusUpdate;
use a2a_lifecycle::proto::{
    CancelTaskRequest, SendMessageConfiguration, SendMessageRequest, SubscribeToTaskRequest, Task,
    TaskState, stream_response::Payload,
};
use a2a_lifecycle::runtime::RuntimeConfig;
use a2a_lifecycle::runtime::live::MAX_QUEUED_MESSAGES;
use a2a_lifecycle::store::{SqliteStore, TaskStore};
use support::*;

fn follow_up(task: &Task, text: &str) -> a2a_lifecycle::proto::Message {
    let mut m = user_message(text);
    m.task_id = task.id.clone();
    m
}

fn string_struct(pairs: &[(&str, &str)]) -> Struct {
    Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value {
                        kind: Some(Kind::StringValue((*v).into())),
                    },
                )
            })
            .collect(),
    }
}

fn string_field(s: &Option<Struct>, key: &str) -> Option<String> {
    match s.as_ref()?.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(v) => Some(v.clone()),
        _ => None,
    }
}

fn user_ids(task: &Task) -> Vec<String> {
    task.history
        .iter()
        .filter(|m| m.role == a2a_lifecycle::proto::Role::User as i32)
        .map(|m| m.message_id.clone())
        .collect()
}

/// A scripted agent. The first word of the message decides:
/// - `hold`: WORKING, then waits for a permit of `gate`, then INPUT_REQUIRED.
/// - `deaf`: WORKING, then never returns and ignores cancellation.
/// - `auth`: AUTH_REQUIRED with a message, then returns (nothing more
///   happens without a client).
/// - anything else: WORKING, then COMPLETED.
///
/// Every run's message text and the user message ids its task held are
/// recorded in `runs`; `calls` counts executions.
struct Scripted {
    gate: Arc<Semaphore>,
    working: Arc<Notify>,
    calls: AtomicUsize,
    runs: Mutex<Vec<(String, Vec<String>)>>,
    cancel_metadata: Mutex<Option<Struct>>,
}

#[async_trait]
impl AgentExecutor for Scripted {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let text = ctx.text();
        let seen = ctx.task.as_ref().map(user_ids).unwrap_or_default();
        self.runs.lock().unwrap().push((text.clone(), seen));
        match text.split_whitespace().next().unwrap_or("") {
            "hold" => {
                sink.status(TaskState::Working, None).await?;
                self.working.notify_one();
                let permit = self.gate.acquire().await.expect("gate open");
                permit.forget();
                sink.status(TaskState::InputRequired, Some("more?")).await?;
            }
            "deaf" => {
                sink.status(TaskState::Working, None).await?;
                self.working.notify_one();
                std::future::pending::<()>().await;
            }
            "auth" => {
                sink.status(TaskState::AuthRequired, Some("approve it elsewhere"))
                    .await?;
            }
            "meta" => {
                // Echo what reached the agent into the task's metadata.
                let mut echo = vec![
                    (
                        "request".to_owned(),
                        string_field(&ctx.metadata, "trace").unwrap_or_default(),
                    ),
                    (
                        "message".to_owned(),
                        string_field(&ctx.message.metadata, "lang").unwrap_or_default(),
                    ),
                ];
                echo.push(("modes".to_owned(), ctx.accepted_output_modes.join(",")));
                let pairs: Vec<(&str, &str)> =
                    echo.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                sink.task_metadata(string_struct(&pairs)).await?;
                sink.status_update(StatusUpdate {
                    state: TaskState::Working,
                    message: None,
                    metadata: Some(string_struct(&[("step", "1")])),
                })
                .await?;
                sink.status(TaskState::InputRequired, Some("and?")).await?;
            }
            _ => {
                sink.status(TaskState::Working, None).await?;
                sink.status(TaskState::Completed, None).await?;
            }
        }
        Ok(())
    }

    async fn cancel(&self, ctx: RequestContext) -> Result<(), AgentError> {
        *self.cancel_metadata.lock().unwrap() = ctx.metadata;
        Ok(())
    }
}

/// Sends `text` to the scripted agent without blocking and waits until its
/// run says WORKING.
async fn working(client: &mut Client, agent: &Scripted, text: &str) -> Task {
    let task = within(
        "send",
        send_task(client, request("", user_message(text), true)),
    )
    .await;
    within("working", agent.working.notified()).await;
    task
}

/// CancelTask, which must succeed.
async fn cancel(client: &mut Client, id: &str) -> Task {
    within(
        "cancel",
        client.cancel_task(CancelTaskRequest {
            tenant: String::new(),
            id: id.to_owned(),
            metadata: None,
        }),
    )
    .await
    .unwrap()
    .into_inner()
}

async fn scripted_server(config: RuntimeConfig) -> (TestServer, Arc<Scripted>) {
    let agent = Arc::new(Scripted {
        gate: Arc::new(Semaphore::new(0)),
        working: Arc::default(),
        calls: AtomicUsize::new(0),
        runs: Mutex::default(),
        cancel_metadata: Mutex::default(),
    });
    let server = TestServer::start_with(AgentRouter::new().with("", agent.clone()), config).await;
    (server, agent)
}

/// The grpcurl reproduction: a non-blocking follow-up to a task
/// whose 60 s "slow" run is going answers at once, with the message in the
/// task's history, while the run is still working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_blocking_follow_up_answers_while_the_run_goes_on() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let task = within(
        "first send",
        send_task(&mut client, request("", user_message("slow tests"), true)),
    )
    .await;
    let message = follow_up(&task, "also run the slow ones");
    let id = message.message_id.clone();
    let started = std::time::Instant::now();
    let answer = within(
        "follow-up",
        send_task(&mut client, request("", message, true)),
    )
    .await;
    eprintln!("follow-up answered in {:?}", started.elapsed());
    assert_eq!(answer.id, task.id);
    assert_eq!(
        state_of(&answer),
        TaskState::Working,
        "the run is still going"
    );
    assert_eq!(
        user_ids(&answer).last(),
        Some(&id),
        "the message is in history"
    );
    // The same holds for a streaming follow-up: its snapshot holds the
    // message and the stream carries the running task's events.
    let message = follow_up(&task, "and stream it");
    let id = message.message_id.clone();
    let mut stream = within(
        "streaming follow-up",
        client.send_streaming_message(request("", message, false)),
    )
    .await
    .unwrap()
    .into_inner();
    let first = within("snapshot", stream.message()).await.unwrap().unwrap();
    let Some(Payload::Task(snapshot)) = first.payload else {
        panic!("first item must be the task")
    };
    assert_eq!(user_ids(&snapshot).last(), Some(&id));
    let next = within("progress", stream.message()).await.unwrap().unwrap();
    assert_eq!(describe(&next), "status:TASK_STATE_WORKING");
    server.stop().await;
}

/// A run whose executor ignores cancellation must not hold later messages:
/// the canceled task refuses them with UNSUPPORTED_OPERATION at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_to_a_canceled_task_whose_executor_ignores_cancellation_is_refused() {
    let (server, agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let task = working(&mut client, &agent, "deaf").await;
    let canceled = within(
        "cancel",
        client.cancel_task(CancelTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
            metadata: Some(string_struct(&[("reason", "user")])),
        }),
    )
    .await
    .unwrap()
    .into_inner();
    assert_eq!(state_of(&canceled), TaskState::Canceled);
    let err = within(
        "follow-up to a canceled task",
        client.send_message(request("", follow_up(&task, "more"), false)),
    )
    .await
    .unwrap_err();
    assert_a2a_error(&err, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    // CancelTaskRequest.metadata reached the agent's cancel hook.
    let seen = within("cancel hook", async {
        loop {
            if let Some(m) = agent.cancel_metadata.lock().unwrap().clone() {
                return m;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(string_field(&Some(seen), "reason").as_deref(), Some("user"));
    server.stop().await;
}

/// The same after `--task-timeout` failed the task under an executor that
/// ignores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_to_a_timed_out_task_whose_executor_ignores_cancellation_is_refused() {
    let config = RuntimeConfig {
        task_timeout: Some(Duration::from_millis(100)),
        ..Default::default()
    };
    let (server, agent) = scripted_server(config).await;
    let mut client = server.client().await;
    let task = working(&mut client, &agent, "deaf").await;
    let events = within(
        "subscribe",
        client.subscribe_to_task(SubscribeToTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
        }),
    )
    .await;
    // Subscribed before or after the timeout: either way the task ends FAILED.
    if let Ok(stream) = events {
        let events = within("stream", collect(stream.into_inner()))
            .await
            .unwrap();
        assert_eq!(
            describe(events.last().unwrap()),
            "status:TASK_STATE_FAILED",
            "{:?}",
            describe_all(&events)
        );
    }
    let err = within(
        "follow-up to a failed task",
        client.send_message(request("", follow_up(&task, "more"), true)),
    )
    .await
    .unwrap_err();
    assert_a2a_error(&err, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    server.stop().await;
}

/// An executor that returns at AUTH_REQUIRED leaves nothing more to happen
/// without a client: the creating stream and later subscriptions end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_when_the_executor_returns_at_auth_required() {
    let (server, _agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let stream = within(
        "send",
        client.send_streaming_message(request("", user_message("auth"), false)),
    )
    .await
    .unwrap()
    .into_inner();
    let events = within("stream ends", collect(stream)).await.unwrap();
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_SUBMITTED",
            "status:TASK_STATE_AUTH_REQUIRED"
        ]
    );
    let Some(Payload::Task(task)) = &events[0].payload else {
        panic!()
    };
    let stream = within(
        "subscribe",
        client.subscribe_to_task(SubscribeToTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
        }),
    )
    .await
    .unwrap()
    .into_inner();
    let events = within("subscription ends", collect(stream)).await.unwrap();
    assert_eq!(describe_all(&events), ["task:TASK_STATE_AUTH_REQUIRED"]);
    // A blocking send on it returns at once too.
    let task = within(
        "blocking send",
        send_task(&mut client, request("", user_message("auth"), false)),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::AuthRequired);
    server.stop().await;
}

/// Counts executions; its first event comes late, which widens the window
/// in which repeats of the same message arrive before the task exists.
#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
}

#[async_trait]
impl AgentExecutor for Counting {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        sink.status(TaskState::Working, None).await?;
        sink.status(TaskState::Completed, None).await?;
        Ok(())
    }
}

async fn repeats_run_the_agent_once(store: Arc<dyn TaskStore>) {
    let agent = Arc::new(Counting::default());
    let server = TestServer::start_full(
        store,
        AgentRouter::new().with("", agent.clone()),
        RuntimeConfig::default(),
    )
    .await;
    let channel = server.channel().await;
    let message = user_message("once");
    let sends = (0..20).map(|i| {
        let mut client =
            a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::new(channel.clone());
        let message = message.clone();
        tokio::spawn(async move {
            if i % 2 == 0 {
                send_task(&mut client, request("", message, i % 4 == 0)).await
            } else {
                let stream = client
                    .send_streaming_message(request("", message, false))
                    .await
                    .unwrap()
                    .into_inner();
                let events = collect(stream).await.unwrap();
                match &events[0].payload {
                    Some(Payload::Task(t)) => t.clone(),
                    other => panic!("{other:?}"),
                }
            }
        })
    });
    let tasks = within("repeats", futures_util::future::join_all(sends)).await;
    let ids: std::collections::HashSet<_> = tasks.into_iter().map(|t| t.unwrap().id).collect();
    assert_eq!(ids.len(), 1, "one task for one message: {ids:?}");
    // A later repeat, once the task is stored, is answered from the store.
    let mut client = server.client().await;
    let again = within(
        "later repeat",
        send_task(&mut client, request("", message, false)),
    )
    .await;
    assert!(ids.contains(&again.id));
    assert_eq!(state_of(&again), TaskState::Completed);
    assert_eq!(agent.calls.load(Ordering::SeqCst), 1, "the agent ran once");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_repeats_give_one_task_and_one_run() {
    repeats_run_the_agent_once(Arc::new(a2a_lifecycle::store::MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_repeats_give_one_task_and_one_run_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("a2a-concurrency-{}", uuid::Uuid::new_v4()));
    let store = SqliteStore::open(dir.join("tasks.db")).await.unwrap();
    repeats_run_the_agent_once(Arc::new(store)).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Spec §3.2.2: a blocking send that cannot reach a terminal or interrupted
/// state answers UNAVAILABLE, not OK with a WORKING task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_send_at_shutdown_answers_unavailable() {
    let (mut server, agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let call = tokio::spawn(async move {
        client
            .send_message(request("", user_message("deaf"), false))
            .await
    });
    within("working", agent.working.notified()).await;
    let stopped = server.begin_shutdown();
    let err = within("blocking send", call).await.unwrap().unwrap_err();
    assert_a2a_error(&err, Code::Unavailable, "UNAVAILABLE");
    within("shutdown", stopped).await.unwrap();
}

/// Request metadata, message metadata and accepted output modes reach the
/// agent; what it sets on the task is stored; event metadata reaches
/// streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_round_trips() {
    let (server, _agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let mut message = user_message("meta");
    message.metadata = Some(string_struct(&[("lang", "en")]));
    let req = SendMessageRequest {
        tenant: String::new(),
        message: Some(message),
        configuration: Some(SendMessageConfiguration {
            accepted_output_modes: vec!["text/plain".into(), "application/json".into()],
            ..Default::default()
        }),
        metadata: Some(string_struct(&[("trace", "t-42")])),
    };
    let stream = within("send", client.send_streaming_message(req))
        .await
        .unwrap()
        .into_inner();
    let events = within("stream", collect(stream)).await.unwrap();
    let working = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::StatusUpdate(u))
                if u.status.as_ref().unwrap().state == TaskState::Working as i32 =>
            {
                Some(u.clone())
            }
            _ => None,
        })
        .expect("a WORKING event");
    assert_eq!(
        string_field(&working.metadata, "step").as_deref(),
        Some("1")
    );
    let id = working.task_id.clone();
    let task = within("get", get_task(&mut client, "", &id)).await.unwrap();
    assert_eq!(
        string_field(&task.metadata, "request").as_deref(),
        Some("t-42")
    );
    assert_eq!(
        string_field(&task.metadata, "message").as_deref(),
        Some("en")
    );
    assert_eq!(
        string_field(&task.metadata, "modes").as_deref(),
        Some("text/plain,application/json")
    );
    assert_eq!(
        string_field(&task.history[0].metadata, "lang").as_deref(),
        Some("en"),
        "message metadata is kept in history"
    );
    server.stop().await;
}

/// A message sent during a run is committed at once and starts the next
/// run, which sees it; a blocking follow-up returns after its own run, not
/// at the state the current run reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_during_a_run_is_seen_by_the_next_run() {
    let (server, agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let task = working(&mut client, &agent, "hold").await;
    let message = follow_up(&task, "finish");
    let id = message.message_id.clone();
    let mut blocking = server.client().await;
    let call =
        tokio::spawn(async move { send_task(&mut blocking, request("", message, false)).await });
    // The follow-up is in history while the first run still holds.
    let seen = within("follow-up committed", async {
        loop {
            let t = get_task(&mut client, "", &task.id).await.unwrap();
            if user_ids(&t).contains(&id) {
                return t;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(state_of(&seen), TaskState::Working);
    agent.gate.add_permits(1);
    let done = within("blocking follow-up", call).await.unwrap();
    // Not the INPUT_REQUIRED the first run ended at: its own run's end.
    assert_eq!(state_of(&done), TaskState::Completed);
    let runs = agent.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1].0, "finish");
    assert!(
        runs[1].1.contains(&id),
        "the next run's task holds the message"
    );
    server.stop().await;
}

/// The queue behind a run is bounded; its messages run in history order;
/// a task that becomes terminal meanwhile runs none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_follow_ups_are_bounded_ordered_and_dropped_when_terminal() {
    let (server, agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let task = working(&mut client, &agent, "hold").await;
    let mut queued = Vec::new();
    for i in 0..MAX_QUEUED_MESSAGES {
        let m = follow_up(&task, &format!("q{i}"));
        queued.push(m.message_id.clone());
        within("queue", send_task(&mut client, request("", m, true))).await;
    }
    let err = within(
        "one too many",
        client.send_message(request("", follow_up(&task, "overflow"), true)),
    )
    .await
    .unwrap_err();
    assert_a2a_error(&err, Code::ResourceExhausted, "RESOURCE_EXHAUSTED");
    // Every queued message is in history, in order; the refused one is not.
    let t = within("get", get_task(&mut client, "", &task.id))
        .await
        .unwrap();
    assert_eq!(user_ids(&t)[1..], queued[..]);
    // Cancel while the run holds: the queued messages get no run.
    let canceled = cancel(&mut client, &task.id).await;
    assert_eq!(state_of(&canceled), TaskState::Canceled);
    assert_eq!(user_ids(&canceled)[1..], queued[..], "still in history");
    agent.gate.add_permits(1);
    // Nothing left to start: the only run was the first.
    let task2 = working(&mut client, &agent, "hold").await;
    // Ordered runs: queue two behind a held run, then let it go. Each
    // returns at AUTH_REQUIRED, so the next one still runs.
    let a = follow_up(&task2, "auth a");
    let b = follow_up(&task2, "auth b");
    within("a", send_task(&mut client, request("", a, true))).await;
    let mut blocking = server.client().await;
    let call = tokio::spawn(async move { send_task(&mut blocking, request("", b, false)).await });
    // b is committed (and queued) before the held run is let go.
    within("b queued", async {
        while user_ids(&get_task(&mut client, "", &task2.id).await.unwrap()).len() < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    agent.gate.add_permits(1);
    let done = within("b's run", call).await.unwrap();
    assert_eq!(state_of(&done), TaskState::AuthRequired);
    let runs: Vec<String> = agent
        .runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(
        runs,
        ["hold", "hold", "auth a", "auth b"],
        "one run for the canceled task, then a before b"
    );
    server.stop().await;
}

/// A busy agent for the stress test: every run says WORKING and emits a
/// uniquely named artifact, then (chosen by its message id) completes,
/// asks for input, returns at AUTH_REQUIRED, or asks for authorization
/// and resumes by itself before asking for input. It stops when cancelled.
#[derive(Default)]
struct Chaos {
    /// Runs going on per task: more than one is an overlap.
    active: Mutex<std::collections::HashMap<String, usize>>,
    overlapped: AtomicBool,
    /// The message id of every run, in order.
    ran: Mutex<Vec<String>>,
}

#[async_trait]
impl AgentExecutor for Chaos {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        self.ran
            .lock()
            .unwrap()
            .push(ctx.message.message_id.clone());
        {
            let mut active = self.active.lock().unwrap();
            let n = active.entry(ctx.task_id.clone()).or_default();
            *n += 1;
            if *n > 1 {
                self.overlapped.store(true, Ordering::SeqCst);
            }
        }
        let result = self.steps(&ctx, &sink).await;
        *self.active.lock().unwrap().get_mut(&ctx.task_id).unwrap() -= 1;
        result
    }
}

impl Chaos {
    async fn steps(&self, ctx: &RequestContext, sink: &EventSink) -> Result<(), AgentError> {
        let steps = async {
            sink.status(TaskState::Working, Some("working")).await?;
            tokio::task::yield_now().await;
            let id = uuid::Uuid::new_v4().to_string();
            sink.artifact_text(&id, "out", "x", false, true).await?;
            tokio::time::sleep(Duration::from_millis(1)).await;
            match ctx
                .message
                .message_id
                .as_bytes()
                .last()
                .copied()
                .unwrap_or(0)
                % 4
            {
                0 => sink.status(TaskState::Completed, Some("done")).await?,
                1 => sink.status(TaskState::InputRequired, Some("more?")).await?,
                2 => {
                    sink.status(TaskState::AuthRequired, Some("approve"))
                        .await?
                }
                _ => {
                    sink.status(TaskState::AuthRequired, Some("approve"))
                        .await?;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    sink.status(TaskState::Working, Some("approved")).await?;
                    sink.status(TaskState::InputRequired, Some("more?")).await?;
                }
            }
            Ok::<(), AgentError>(())
        };
        tokio::select! {
            r = steps => r,
            _ = ctx.cancelled.cancelled() => Ok(()),
        }
    }
}

/// A key naming one event: the status message's id, or the artifact id.
fn event_key(ev: &a2a_lifecycle::proto::StreamResponse) -> Option<String> {
    match ev.payload.as_ref()? {
        Payload::StatusUpdate(u) => Some(format!(
            "status:{}",
            u.status.as_ref()?.message.as_ref()?.message_id
        )),
        Payload::ArtifactUpdate(a) => {
            Some(format!("artifact:{}", a.artifact.as_ref()?.artifact_id))
        }
        _ => None,
    }
}

#[derive(Default)]
struct Observed {
    /// Per task: the event keys each stream saw after its snapshot.
    streams: Mutex<std::collections::HashMap<String, Vec<Vec<String>>>>,
    /// Per task: message ids whose send was acknowledged.
    acked: Mutex<std::collections::HashMap<String, Vec<String>>>,
    tasks: Mutex<Vec<String>>,
}

impl Observed {
    fn ack(&self, task: &str, message_id: &str) {
        self.acked
            .lock()
            .unwrap()
            .entry(task.to_owned())
            .or_default()
            .push(message_id.to_owned());
    }

    /// One of the newest few tasks: the clients crowd on the same ones.
    fn pick(&self, n: u64) -> Option<String> {
        let tasks = self.tasks.lock().unwrap();
        let recent = &tasks[tasks.len().saturating_sub(6)..];
        (!recent.is_empty()).then(|| recent[(n as usize) % recent.len()].clone())
    }

    /// Reads a stream to its end (it must end), recording what it saw.
    async fn follow(&self, stream: tonic::Streaming<a2a_lifecycle::proto::StreamResponse>) {
        let events = collect(stream).await;
        let events = match events {
            Ok(events) => events,
            Err(status) => panic!("stream failed: {status:?}"),
        };
        let Some(Payload::Task(task)) = events.first().and_then(|e| e.payload.clone()) else {
            panic!(
                "a task stream starts with the task: {:?}",
                describe_all(&events)
            );
        };
        // It ended where nothing more happens without a client.
        let last = events.last().map(describe).unwrap_or_default();
        assert!(
            [
                "COMPLETED",
                "FAILED",
                "CANCELED",
                "REJECTED",
                "INPUT_REQUIRED",
                "AUTH_REQUIRED"
            ]
            .iter()
            .any(|s| last.ends_with(&format!("TASK_STATE_{s}"))),
            "a stream ended at {last}: {:?}",
            describe_all(&events)
        );
        let keys = events[1..].iter().filter_map(event_key).collect();
        self.streams
            .lock()
            .unwrap()
            .entry(task.id.clone())
            .or_default()
            .push(keys);
    }
}

fn allowed(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    let reason = status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default();
    matches!(
        reason.as_str(),
        "UNSUPPORTED_OPERATION" | "TASK_NOT_CANCELABLE" | "RESOURCE_EXHAUSTED"
    )
}

/// Many clients sending, following up, cancelling and subscribing on the
/// same tasks at once, for a bounded time. Afterwards: every stream ended,
/// subscribers of a task saw the same events in the same order, no task is
/// left active without a run, and every acknowledged message is in its
/// task's history exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_on_the_same_tasks_keep_every_invariant() {
    let chaos = Arc::new(Chaos::default());
    let server = TestServer::start_with(
        AgentRouter::new().with("", chaos.clone()),
        RuntimeConfig::default(),
    )
    .await;
    let observed = Arc::new(Observed::default());
    let channel = server.channel().await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    let workers = (0..16u64).map(|w| {
        let observed = observed.clone();
        let mut client =
            a2a_lifecycle::proto::a2a_service_client::A2aServiceClient::new(channel.clone());
        tokio::spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1);
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut actions = 0;
            let mut last_new: Option<(a2a_lifecycle::proto::Message, String)> = None;
            while tokio::time::Instant::now() < deadline {
                actions += 1;
                let r = next();
                let target = observed.pick(next());
                match (r % 16, target) {
                    (0, _) | (_, None) if r % 5 == 0 && last_new.is_some() => {
                        // An idempotent repeat: the same task, no new run.
                        let (m, id) = last_new.clone().unwrap();
                        let task = send_task(&mut client, request("", m, true)).await;
                        assert_eq!(task.id, id, "a repeat answered with another task");
                    }
                    (0, _) | (_, None) => {
                        let m = user_message("new");
                        let id = m.message_id.clone();
                        if r % 3 == 0 {
                            let stream = client
                                .send_streaming_message(request("", m, false))
                                .await
                                .unwrap()
                                .into_inner();
                            observed.follow(stream).await;
                        } else {
                            let task =
                                send_task(&mut client, request("", m.clone(), r % 2 == 0)).await;
                            observed.ack(&task.id, &id);
                            last_new = Some((m, task.id.clone()));
                            observed.tasks.lock().unwrap().push(task.id);
                        }
                    }
                    (1..=6, Some(task)) => {
                        let mut m = user_message("follow");
                        m.task_id = task.clone();
                        let id = m.message_id.clone();
                        let result = if r % 3 == 0 {
                            match client.send_streaming_message(request("", m, false)).await {
                                Ok(stream) => {
                                    observed.follow(stream.into_inner()).await;
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        } else {
                            client
                                .send_message(request("", m, r % 2 == 0))
                                .await
                                .map(|_| ())
                        };
                        match result {
                            Ok(()) => observed.ack(&task, &id),
                            Err(e) => assert!(allowed(&e), "follow-up: {e:?}"),
                        }
                    }
                    (7, Some(task)) => {
                        let result = client
                            .cancel_task(CancelTaskRequest {
                                tenant: String::new(),
                                id: task,
                                metadata: None,
                            })
                            .await;
                        if let Err(e) = result {
                            assert!(allowed(&e), "cancel: {e:?}");
                        }
                    }
                    (_, Some(task)) => {
                        let result = client
                            .subscribe_to_task(SubscribeToTaskRequest {
                                tenant: String::new(),
                                id: task,
                            })
                            .await;
                        match result {
                            Ok(stream) => observed.follow(stream.into_inner()).await,
                            Err(e) => assert!(allowed(&e), "subscribe: {e:?}"),
                        }
                    }
                }
            }
            actions
        })
    });
    let actions: usize = within("clients", futures_util::future::join_all(workers))
        .await
        .into_iter()
        .map(|r| r.expect("a client failed"))
        .sum();
    let mut client = server.client().await;
    // Streams that created tasks: their ids are known from the snapshots.
    let mut tasks: std::collections::HashSet<String> =
        observed.tasks.lock().unwrap().iter().cloned().collect();
    tasks.extend(observed.streams.lock().unwrap().keys().cloned());
    for id in &tasks {
        // Whatever was running or queued ends: a subscription on a task
        // that is not terminal must end too (it ends only once the task is
        // terminal, or interrupted with nothing running or queued).
        match client
            .subscribe_to_task(SubscribeToTaskRequest {
                tenant: String::new(),
                id: id.clone(),
            })
            .await
        {
            Ok(stream) => {
                within("final subscription", collect(stream.into_inner()))
                    .await
                    .unwrap();
            }
            Err(e) => assert_a2a_error(&e, Code::FailedPrecondition, "UNSUPPORTED_OPERATION"),
        }
        let task = within("get", get_task(&mut client, "", id)).await.unwrap();
        let state = state_of(&task);
        assert!(
            state.is_terminal() || state.is_interrupted(),
            "task {id} left {state:?}"
        );
        let history = user_ids(&task);
        for acked in observed.acked.lock().unwrap().get(id).into_iter().flatten() {
            let n = history.iter().filter(|h| *h == acked).count();
            assert_eq!(n, 1, "message {acked} in task {id}'s history {n} times");
        }
    }
    // Same events in the same order: where two streams of a task overlap,
    // they agree event for event.
    let streams = observed.streams.lock().unwrap().clone();
    let mut compared = 0;
    for (id, seen) in streams.iter() {
        for (i, a) in seen.iter().enumerate() {
            for (j, b) in seen.iter().enumerate() {
                if i == j {
                    continue;
                }
                let Some(first) = b.first() else { continue };
                let Some(start) = a.iter().position(|k| k == first) else {
                    continue;
                };
                let overlap = a[start..].len().min(b.len());
                assert_eq!(
                    a[start..start + overlap],
                    b[..overlap],
                    "task {id}: two streams disagree"
                );
                compared += 1;
            }
        }
    }
    // One executor at a time per task, and no message run twice.
    assert!(!chaos.overlapped.load(Ordering::SeqCst), "runs overlapped");
    let ran = chaos.ran.lock().unwrap().clone();
    let distinct: std::collections::HashSet<_> = ran.iter().collect();
    assert_eq!(distinct.len(), ran.len(), "a message ran twice");
    eprintln!(
        "{actions} actions on {} tasks, {} streams, {compared} stream pairs compared",
        tasks.len(),
        streams.values().map(Vec::len).sum::<usize>()
    );
    assert!(
        tasks.len() > 10 && compared > tasks.len(),
        "the load was real"
    );
    drop(streams);
    server.stop().await;
}

/// A cancel racing a streaming follow-up: whichever the stream's snapshot
/// shows, the stream ends (a terminal snapshot closes it at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_stream_opening_never_leaves_it_open() {
    let (server, agent) = scripted_server(RuntimeConfig::default()).await;
    let mut client = server.client().await;
    for _ in 0..40 {
        let task = working(&mut client, &agent, "hold").await;
        let mut streaming = server.client().await;
        let message = follow_up(&task, "finish");
        let stream = tokio::spawn(async move {
            match streaming
                .send_streaming_message(request("", message, false))
                .await
            {
                Ok(stream) => Some(collect(stream.into_inner()).await.unwrap()),
                Err(e) => {
                    assert_a2a_error(&e, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
                    None
                }
            }
        });
        let canceled = cancel(&mut client, &task.id).await;
        assert_eq!(state_of(&canceled), TaskState::Canceled);
        if let Some(events) = within("stream ends", stream).await.unwrap() {
            assert_eq!(
                describe(events.last().unwrap()).as_str(),
                if events.len() == 1 {
                    "task:TASK_STATE_CANCELED"
                } else {
                    "status:TASK_STATE_CANCELED"
                },
                "{:?}",
                describe_all(&events)
            );
        }
        // The held run is let go; it finds its task canceled.
        agent.gate.add_permits(1);
    }
    server.stop().await;
}
