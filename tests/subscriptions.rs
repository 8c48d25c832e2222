//! Subscription guarantees (spec §3.1.6, §3.5.2): the first event is a Task
//! snapshot; every subscriber gets the same events in the same order with
//! nothing lost or repeated between snapshot and live events; streams close
//! right after the terminal event; a slow subscriber never blocks the agent
//! or the others; shutdown ends open streams cleanly.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;
use tonic::Code;

use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::lifecycle::StatusUpdate;
use a2a_lifecycle::proto::{SubscribeToTaskRequest, TaskState, stream_response::Payload};
use a2a_lifecycle::runtime::{RuntimeConfig, agent_text};
use a2a_lifecycle::store::Caller;
use support::*;

/// WORKING, then waits for the test to open the gate, then `updates`
/// WORKING status updates numbered 1..=updates, then COMPLETED.
struct GatedAgent {
    gate: Arc<Semaphore>,
    updates: usize,
    /// Bytes of padding per update, to fill transport buffers quickly.
    pad: usize,
}

#[async_trait]
impl AgentExecutor for GatedAgent {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, Some("started")).await?;
        let _permit = self.gate.acquire().await.expect("gate closed");
        for i in 1..=self.updates {
            // Padding travels in the event metadata, not in the text.
            let metadata = (self.pad > 0).then(|| a2a_lifecycle::wkt::Struct {
                fields: [(
                    "pad".to_string(),
                    a2a_lifecycle::wkt::Value::from(" ".repeat(self.pad)),
                )]
                .into(),
            });
            sink.status_update(StatusUpdate {
                state: TaskState::Working,
                message: Some(agent_text(format!("update {i}"))),
                metadata,
            })
            .await?;
        }
        sink.status(TaskState::Completed, Some("done")).await?;
        Ok(())
    }
}

async fn gated_server(updates: usize, buffer: usize) -> (TestServer, Arc<Semaphore>) {
    padded_gated_server(updates, buffer, 0).await
}

async fn padded_gated_server(
    updates: usize,
    buffer: usize,
    pad: usize,
) -> (TestServer, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let agent = Arc::new(GatedAgent {
        gate: gate.clone(),
        updates,
        pad,
    });
    let config = RuntimeConfig {
        subscriber_buffer: buffer,
        ..Default::default()
    };
    let server = TestServer::start_with(AgentRouter::new().with("", agent), config).await;
    (server, gate)
}

/// A client whose HTTP/2 stream and connection windows are `bytes`: a
/// small one stops the server's side of its streams draining the ring.
async fn windowed(server: &TestServer, bytes: u32) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(server.url())
        .unwrap()
        .initial_stream_window_size(bytes)
        .initial_connection_window_size(bytes)
        .connect()
        .await
        .unwrap();
    Client::new(channel)
}

fn update_texts(events: &[a2a_lifecycle::proto::StreamResponse]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::StatusUpdate(u)) => Some(
                u.status
                    .as_ref()
                    .and_then(|s| s.message.as_ref())
                    .map(a2a_lifecycle::agent::message_text)
                    .unwrap_or_default(),
            ),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn every_subscriber_gets_snapshot_then_same_events_in_order_then_close() {
    let (server, gate) = gated_server(50, 1024).await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("go"), true)).await;

    let mut subscribers = Vec::new();
    for _ in 0..8 {
        let mut c = server.client().await;
        let stream = c
            .subscribe_to_task(SubscribeToTaskRequest {
                tenant: "".into(),
                id: task.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        subscribers.push(tokio::spawn(collect(stream)));
    }
    gate.add_permits(1);

    let mut sequences = Vec::new();
    for s in subscribers {
        let events = s.await.unwrap().unwrap();
        // First event: the Task snapshot (spec §3.1.6).
        let Some(Payload::Task(snapshot)) = &events[0].payload else {
            panic!("first event must be the task, got {:?}", events[0])
        };
        assert_eq!(snapshot.id, task.id);
        // The subscription was taken before the gate opened: the snapshot
        // is SUBMITTED or WORKING ("started"), and the live events continue
        // exactly from there.
        let mut texts = update_texts(&events);
        if state_of(snapshot) == TaskState::Submitted {
            assert_eq!(texts.remove(0), "started");
        } else {
            assert_eq!(status_text(snapshot), "started");
        }
        let expected: Vec<String> = (1..=50)
            .map(|i| format!("update {i}"))
            .chain(["done".to_string()])
            .collect();
        assert_eq!(texts, expected, "no event lost, repeated or reordered");
        assert_eq!(
            describe(events.last().unwrap()),
            "status:TASK_STATE_COMPLETED",
            "stream closes right after the terminal event"
        );
        sequences.push(texts);
    }
    assert!(sequences.windows(2).all(|w| w[0] == w[1]));
    server.stop().await;
}

/// A subscriber that stops reading falls behind; the agent and the other
/// subscribers are not held up, and when it resumes it is resynchronised
/// with a Task snapshot instead of silently missing events.
#[tokio::test]
async fn slow_subscriber_does_not_block_agent_or_others_and_is_resynchronised() {
    const UPDATES: usize = 200;
    // 4 KiB per update: the slow client's 4 KiB HTTP/2 window and the
    // server's send buffer fill after a few updates, so the subscriber
    // really stops draining the 8-event ring.
    let (server, gate) = padded_gated_server(UPDATES, 8, 4096).await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("go"), true)).await;
    let subscribe = |mut c: Client, id: String| async move {
        c.subscribe_to_task(SubscribeToTaskRequest {
            tenant: "".into(),
            id,
        })
        .await
        .unwrap()
        .into_inner()
    };
    // The slow one reads its snapshot, then nothing until the task is done.
    let mut slow = subscribe(windowed(&server, 4096).await, task.id.clone()).await;
    let first = slow.message().await.unwrap().unwrap();
    assert!(matches!(first.payload, Some(Payload::Task(_))));
    let fast = tokio::spawn(collect(
        subscribe(server.client().await, task.id.clone()).await,
    ));
    gate.add_permits(1);

    // The agent finishes although the slow subscriber reads nothing.
    let fast_events = fast.await.unwrap().unwrap();
    assert_eq!(
        describe(fast_events.last().unwrap()),
        "status:TASK_STATE_COMPLETED"
    );
    let done = client
        .get_task(a2a_lifecycle::proto::GetTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
            history_length: Some(0),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&done), TaskState::Completed);

    // The slow subscriber now drains: it ends with the terminal state, and
    // somewhere it received a resync snapshot rather than a silent gap.
    let rest = collect(slow).await.unwrap();
    let last = rest.last().unwrap();
    let last_state = match &last.payload {
        Some(Payload::Task(t)) => state_of(t),
        Some(Payload::StatusUpdate(u)) => {
            TaskState::try_from(u.status.as_ref().unwrap().state).unwrap()
        }
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(last_state, TaskState::Completed);
    // HTTP/2 and socket buffers absorb some events; 200 updates into a ring
    // of 8 cannot all fit, so a resync must have happened.
    assert!(
        rest.iter()
            .any(|e| matches!(e.payload, Some(Payload::Task(_)))),
        "a lagging subscriber gets a fresh snapshot"
    );
    assert!(
        rest.len() < UPDATES + 2,
        "missed events were replaced by the snapshot"
    );
    server.stop().await;
}

/// A task's broadcast ring outlives the task and serves the next task
/// streamed (issue 32: tokio builds and drops every slot of a ring). The
/// ring comes back with events a stopped subscriber never read; the next
/// task's stream carries exactly its own events, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_used_again_carries_only_the_next_tasks_events() {
    const UPDATES: usize = 20;
    // 4 KiB per update against a 4 KiB window: the stopped subscriber's
    // server side stops draining the ring (as in the slow subscriber test
    // above), which keeps the events it did not read. A ring of 64 holds
    // every event of one task, however the commits batch them, so the
    // second task's stream is never resynchronised. (Falling behind the
    // ring before a ring is kept: `rings::tests`.)
    let (server, gate) = padded_gated_server(UPDATES, 64, 4096).await;
    let mut client = server.client().await;
    assert_eq!(server.manager.idle_rings(), 0);

    let first = send_task(&mut client, request("", user_message("go"), true)).await;
    let mut stopped = within(
        "subscribe",
        windowed(&server, 4096)
            .await
            .subscribe_to_task(SubscribeToTaskRequest {
                tenant: "".into(),
                id: first.id.clone(),
            }),
    )
    .await
    .unwrap()
    .into_inner();
    let snapshot = within("snapshot", stopped.message())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(snapshot.payload, Some(Payload::Task(_))));
    gate.add_permits(1);
    let (_, done) = within("first task", settled(&mut client, "", &first.id)).await;
    assert_eq!(state_of(&done), TaskState::Completed);
    drop(stopped);
    // The gate closed again once the first agent gives its permit back.
    within("the first agent's permit", gate.acquire())
        .await
        .unwrap()
        .forget();
    // Let go of by everything: its ring is kept.
    within("first task let go", async {
        while server.manager.live_task_count() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        server.manager.idle_rings(),
        1,
        "the first task's ring is kept"
    );

    // Its stream read with room for every padded update, so that it keeps
    // up with the ring of 8.
    let mut stream = within(
        "second stream",
        windowed(&server, 1 << 20)
            .await
            .send_streaming_message(request("", user_message("again"), false)),
    )
    .await
    .unwrap()
    .into_inner();
    let mut events = vec![
        within("second snapshot", stream.message())
            .await
            .unwrap()
            .unwrap(),
    ];
    assert_eq!(server.manager.idle_rings(), 0, "the kept ring is taken");
    gate.add_permits(1);
    events.extend(
        within("second task's events", collect(stream))
            .await
            .unwrap(),
    );
    let Some(Payload::Task(second)) = &events[0].payload else {
        panic!("first event must be the task, got {:?}", events[0])
    };
    assert_ne!(second.id, first.id);
    for e in &events[1..] {
        let id = match &e.payload {
            Some(Payload::StatusUpdate(u)) => &u.task_id,
            _ => panic!(
                "only status updates follow the snapshot, got {}",
                describe(e)
            ),
        };
        assert_eq!(id, &second.id, "an event of another task: {}", describe(e));
    }
    let mut texts = update_texts(&events);
    if state_of(second) == TaskState::Submitted {
        assert_eq!(texts.remove(0), "started");
    }
    let expected: Vec<String> = (1..=UPDATES)
        .map(|i| format!("update {i}"))
        .chain(["done".to_string()])
        .collect();
    assert_eq!(texts, expected, "no event lost, repeated or reordered");
    server.stop().await;
}

/// Closing one stream does not affect the others (spec §3.5.2).
#[tokio::test]
async fn dropping_one_subscriber_leaves_the_others_intact() {
    let (server, gate) = gated_server(10, 1024).await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("go"), true)).await;
    let req = SubscribeToTaskRequest {
        tenant: "".into(),
        id: task.id.clone(),
    };
    let dropped = server
        .client()
        .await
        .subscribe_to_task(req.clone())
        .await
        .unwrap();
    let kept = server
        .client()
        .await
        .subscribe_to_task(req)
        .await
        .unwrap()
        .into_inner();
    drop(dropped);
    gate.add_permits(1);
    let events = collect(kept).await.unwrap();
    let texts = update_texts(&events);
    assert_eq!(texts.last().map(String::as_str), Some("done"));
    assert!(texts.contains(&"update 10".to_string()));
    server.stop().await;
}

/// Graceful shutdown ends an open stream with UNAVAILABLE (a clean gRPC
/// status, not a reset), and the server future completes.
#[tokio::test]
async fn shutdown_ends_open_streams_cleanly() {
    let (mut server, _gate) = gated_server(1, 16).await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("go"), true)).await;
    let mut stream = client
        .subscribe_to_task(SubscribeToTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.payload, Some(Payload::Task(_))));
    let done = server.begin_shutdown();
    let end = loop {
        match tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("stream hung")
        {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    let status = end.expect_err("stream ends with a status");
    assert_eq!(status.code(), Code::Unavailable);
    tokio::time::timeout(WAIT, done)
        .await
        .expect("server did not stop")
        .unwrap();
}

/// A blocking SendMessage waits through many updates and returns the final
/// task; a non-blocking one returns at once even though the agent is held.
#[tokio::test]
async fn blocking_waits_and_non_blocking_does_not() {
    let (server, gate) = gated_server(3, 16).await;
    let mut client = server.client().await;
    let quick = tokio::time::timeout(
        Duration::from_secs(5),
        send_task(&mut client, request("", user_message("go"), true)),
    )
    .await
    .expect("non-blocking send returned while the agent waits");
    assert!(!state_of(&quick).is_terminal());
    let mut c2 = server.client().await;
    let blocking = tokio::spawn(async move { send_text(&mut c2, "", "go").await });
    gate.add_permits(2);
    let task = blocking.await.unwrap();
    assert_eq!(state_of(&task), TaskState::Completed);
    server.stop().await;
}

/// On graceful shutdown a running executor is cancelled and its task is
/// FAILED with a message saying why, never left WORKING.
#[tokio::test]
async fn shutdown_fails_running_tasks_with_a_reason() {
    let mut server = TestServer::start().await;
    let mut client = server.client().await;
    let task = send_task(&mut client, request("", user_message("slow"), true)).await;
    let manager = server.manager.clone();
    let done = server.begin_shutdown();
    tokio::time::timeout(WAIT, done)
        .await
        .expect("server did not stop")
        .unwrap();
    // The run's supervisor records the failure just after cancellation.
    let deadline = tokio::time::Instant::now() + WAIT;
    let final_task = loop {
        let t = manager
            .get_task(
                "",
                &Caller::ANONYMOUS,
                &task.id,
                a2a_lifecycle::lifecycle::HistoryLength::All,
            )
            .await
            .unwrap();
        if state_of(&t).is_terminal() {
            break t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task left active after shutdown"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(state_of(&final_task), TaskState::Failed);
    assert!(
        status_text(&final_task).contains("server shut down"),
        "{}",
        status_text(&final_task)
    );
}
