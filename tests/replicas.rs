//! Several replicas of the server, real processes, on one PostgreSQL
//! schema (issue "scale out"): one task view, one run per message, and
//! recovery by lease. Skipped, saying so, when PostgreSQL is not there and
//! not required (see `support::postgres`).
//!
//! Nothing signals one process's state change to another test-visible
//! channel yet, so the tests that wait for a replica to act on another's
//! task poll GetTask, each poll bounded by [`support::WAIT`].

use crate::support;

use std::sync::mpsc::Receiver;
use std::time::Duration;

use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    CancelTaskRequest, ListTasksRequest, StreamResponse, SubscribeToTaskRequest, Task,
    TaskPushNotificationConfig, TaskState, stream_response,
};
use a2a_lifecycle::runtime::RESTART_FAILURE;
use support::{Client, state_of, status_text, within};

/// A replica: its process, its client, its log lines.
struct Replica {
    process: std::process::Child,
    grpc: Client,
    log: Receiver<String>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Starts a replica on `store` with the bench agent, logging the
/// runtime's debug lines.
async fn replica(store: &str, lease: &str) -> Replica {
    replica_with(store, lease, &[]).await
}

/// Two replicas on a fresh schema, or `None` when PostgreSQL is not
/// there (and not required).
async fn two_replicas(lease: &str) -> Option<(Replica, Replica)> {
    let store = support::postgres::fresh_schema().await?;
    Some((replica(&store, lease).await, replica(&store, lease).await))
}

/// [`replica`] with more `serve` arguments.
async fn replica_with(store: &str, lease: &str, more: &[&str]) -> Replica {
    let args = [
        &[
            "--store",
            store,
            "--lease",
            lease,
            "--default-agent",
            "bench",
        ],
        more,
    ]
    .concat();
    let (process, url, log) =
        support::spawn_serve_logging("info,a2a_lifecycle::runtime=debug", &args);
    let grpc = within("connect", A2aServiceClient::connect(url))
        .await
        .unwrap();
    Replica { process, grpc, log }
}

/// How many agent runs the replicas' logs show for these message ids:
/// each log read up to a marker message's run, so every run line written
/// before it has been read.
async fn runs_of(replicas: &[&Replica], ids: &[String]) -> usize {
    let mut runs = 0;
    // Each log read for at most WAIT in all, however many lines come.
    for r in replicas {
        let deadline = std::time::Instant::now() + support::WAIT;
        let marker = support::user_message("marker");
        let mut g = r.grpc.clone();
        within(
            "marker",
            support::send_task(&mut g, support::request("", marker.clone(), true)),
        )
        .await;
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the marker's run was not logged within {:?}",
                support::WAIT
            );
            let line = support::wait_for_line(&r.log, "agent run started");
            if line.contains(&marker.message_id) {
                break;
            }
            if ids.iter().any(|id| line.contains(id.as_str())) {
                runs += 1;
            }
        }
    }
    runs
}

/// A new task of the conformance agent on `replica`, waiting for input
/// (its follow-up completes it).
async fn input_required_task(replica: &mut Replica) -> Task {
    let mut first = support::user_message("deploy");
    first.message_id = format!("tck-input-required-{}", uuid::Uuid::new_v4());
    let request = support::request("conformance", first, false);
    let task = within(
        "the first message",
        support::send_task(&mut replica.grpc, request),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    task
}

/// Polls GetTask on `grpc` until `done` holds for the task.
async fn eventually(grpc: &mut Client, id: &str, what: &str, done: impl Fn(&Task) -> bool) -> Task {
    eventually_in(grpc, "", id, what, done).await
}

/// [`eventually`] for a task of `tenant`.
async fn eventually_in(
    grpc: &mut Client,
    tenant: &str,
    id: &str,
    what: &str,
    done: impl Fn(&Task) -> bool,
) -> Task {
    within(what, async {
        loop {
            let task = support::get_task(grpc, tenant, id).await.unwrap();
            if done(&task) {
                return task;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_sees_every_committed_task() {
    let Some((mut a, mut b)) = two_replicas("10s").await else {
        return;
    };
    let task = support::send_text(&mut a.grpc, "", "done at once").await;
    assert_eq!(state_of(&task), TaskState::Completed);
    let on_b = support::get_task(&mut b.grpc, "", &task.id).await.unwrap();
    assert_eq!(on_b, task);
    let listed = within("list on b", b.grpc.list_tasks(ListTasksRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_size, 1);
    assert_eq!(listed.tasks[0].id, task.id);
}

/// The same message_id sent to two replicas at once: one task, one run
/// (spec §3.3.1 across replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_message_sent_to_two_replicas_at_once_makes_one_task_and_one_run() {
    let Some((a, b)) = two_replicas("10s").await else {
        return;
    };
    const MESSAGES: usize = 20;
    let mut ids = Vec::new();
    for i in 0..MESSAGES {
        let message = support::user_message(&format!("message {i}"));
        ids.push(message.message_id.clone());
        let (mut ga, mut gb) = (a.grpc.clone(), b.grpc.clone());
        let (ra, rb) = (
            support::request("", message.clone(), true),
            support::request("", message, true),
        );
        let (ta, tb) = within(
            "both sends",
            futures_util::future::join(
                support::send_task(&mut ga, ra),
                support::send_task(&mut gb, rb),
            ),
        )
        .await;
        assert_eq!(ta.id, tb.id, "message {i}: one task");
    }
    let runs = runs_of(&[&a, &b], &ids).await;
    assert_eq!(runs, MESSAGES, "one run per message across both replicas");
}

/// A replica SIGKILLed while running a task: a survivor fails the task
/// with the restart message once the dead replica's lease has run out,
/// and never fails a live replica's task before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_task_is_failed_by_a_survivor_after_its_lease() {
    let Some((mut a, mut b)) = two_replicas("1s").await else {
        return;
    };
    // WORKING for a minute on a.
    let task = support::send_task(
        &mut a.grpc,
        support::request("", support::user_message("fanout:1:60000:0"), true),
    )
    .await;
    eventually(&mut b.grpc, &task.id, "WORKING", |t| {
        state_of(t) == TaskState::Working
    })
    .await;
    // Several looks for orphans, by either replica, over several leases:
    // a's task is left alone while a lives.
    let mut looks = 0;
    while looks < 4 {
        for r in [&a, &b] {
            if let Ok(line) = r.log.recv_timeout(Duration::from_millis(100))
                && line.contains("looked for orphaned tasks")
            {
                looks += 1;
            }
        }
    }
    let alive = support::get_task(&mut b.grpc, "", &task.id).await.unwrap();
    assert_eq!(
        state_of(&alive),
        TaskState::Working,
        "a live replica's task"
    );

    a.process.kill().unwrap(); // SIGKILL
    a.process.wait().unwrap();
    let failed = eventually(&mut b.grpc, &task.id, "FAILED by b", |t| {
        state_of(t) == TaskState::Failed
    })
    .await;
    assert_eq!(status_text(&failed), RESTART_FAILURE);
    // The log a wrote, and b's takeover after it.
    let (_, log) = support::transitions(&mut b.grpc, "", &task.id).await;
    assert_eq!(
        log,
        ["SUBMITTED client", "WORKING agent", "FAILED takeover"]
    );
}

/// Reads `stream` to its end: every event after the first (the snapshot).
async fn events_after_snapshot(
    mut stream: tonic::Streaming<StreamResponse>,
) -> (Task, Vec<StreamResponse>) {
    let first = within("snapshot", stream.message()).await.unwrap().unwrap();
    let Some(stream_response::Payload::Task(snapshot)) = first.payload else {
        panic!("expected a Task snapshot first, got {first:?}");
    };
    let mut events = Vec::new();
    while let Some(event) = within("the stream's next event", stream.message())
        .await
        .unwrap()
    {
        events.push(event);
    }
    (snapshot, events)
}

fn subscribe_request(id: &str) -> SubscribeToTaskRequest {
    SubscribeToTaskRequest {
        tenant: String::new(),
        id: id.to_owned(),
    }
}

fn final_state(events: &[StreamResponse]) -> Option<TaskState> {
    events.iter().rev().find_map(|e| match &e.payload {
        Some(stream_response::Payload::StatusUpdate(u)) => {
            TaskState::try_from(u.status.as_ref()?.state).ok()
        }
        _ => None,
    })
}

/// Subscribers of one task on three replicas, the run on the first: every
/// subscriber gets the same events in the same order, none lost or
/// repeated (the bench agent numbers its updates), whichever replica it
/// is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribers_on_other_replicas_get_the_same_events_in_the_same_order() {
    let Some(store) = support::postgres::fresh_schema().await else {
        return;
    };
    let mut a = replica(&store, "10s").await;
    let b = replica(&store, "10s").await;
    let c = replica(&store, "10s").await;
    // WORKING, 3 s for the subscribers to attach, then 100 updates 2 ms
    // apart, then COMPLETED.
    let task = support::send_task(
        &mut a.grpc,
        support::request("", support::user_message("fanout:100:3000:2000"), true),
    )
    .await;
    let mut streams = Vec::new();
    for r in [&a, &b, &c] {
        let mut g = r.grpc.clone();
        let stream = within(
            "subscribe",
            g.subscribe_to_task(subscribe_request(&task.id)),
        )
        .await
        .unwrap()
        .into_inner();
        streams.push(tokio::spawn(events_after_snapshot(stream)));
    }
    let mut seen = Vec::new();
    for s in streams {
        seen.push(within("a subscriber's stream", s).await.unwrap());
    }
    let (_, on_a) = &seen[0];
    assert_eq!(final_state(on_a), Some(TaskState::Completed));
    // 100 updates and COMPLETED, at least (the snapshot may have come
    // after WORKING).
    assert!(on_a.len() >= 101, "{} events on a", on_a.len());
    for (name, (_, events)) in ["b", "c"].iter().zip(&seen[1..]) {
        assert_eq!(events, on_a, "the events on {name} and on a");
    }
}

/// CancelTask on one replica for a task whose run is on another: the run
/// stops within a second and every replica's subscriber sees CANCELED,
/// whether the run is writing (its next write meets the cancel) or
/// waiting (only the change feed tells its replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_on_another_replica_stops_the_run_within_a_second() {
    // An update every 10 ms for a long while; a minute's wait.
    for text in ["fanout:100000:0:10000", "fanout:1:60000:0"] {
        cancel_on_another_replica(text).await;
    }
}

async fn cancel_on_another_replica(text: &str) {
    let Some((mut a, mut b)) = two_replicas("10s").await else {
        return;
    };
    let task = support::send_task(
        &mut a.grpc,
        support::request("", support::user_message(text), true),
    )
    .await;
    support::wait_for_line(&a.log, "agent run started");
    let mut streams = Vec::new();
    for r in [&a, &b] {
        let mut g = r.grpc.clone();
        let stream = within(
            "subscribe",
            g.subscribe_to_task(subscribe_request(&task.id)),
        )
        .await
        .unwrap()
        .into_inner();
        streams.push(tokio::spawn(events_after_snapshot(stream)));
    }
    let canceled = within(
        "cancel on b",
        b.grpc.cancel_task(CancelTaskRequest {
            tenant: String::new(),
            id: task.id.clone(),
            metadata: None,
        }),
    )
    .await
    .unwrap()
    .into_inner();
    assert_eq!(state_of(&canceled), TaskState::Canceled);
    let at = std::time::Instant::now();
    let ended = std::thread::spawn(move || {
        support::wait_for_line(&a.log, "agent run ended");
        a
    });
    let a = tokio::task::spawn_blocking(move || ended.join().unwrap());
    let mut a = within("a's run to end", a).await.unwrap();
    assert!(
        at.elapsed() < Duration::from_secs(1),
        "{text}: a's run ended {:?} after the cancel",
        at.elapsed()
    );
    for (name, s) in ["a", "b"].iter().zip(streams) {
        let (_, events) = within("a subscriber's stream", s).await.unwrap();
        assert_eq!(
            final_state(&events),
            Some(TaskState::Canceled),
            "{text}: on {name}"
        );
    }
    let on_a = support::get_task(&mut a.grpc, "", &task.id).await.unwrap();
    assert_eq!(state_of(&on_a), TaskState::Canceled);
}

/// A follow-up message on one replica for a task another replica ran to
/// INPUT_REQUIRED: accepted once, and its run happens once, on one
/// replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_on_another_replica_runs_once() {
    let Some((mut a, mut b)) = two_replicas("10s").await else {
        return;
    };
    let mut first = support::user_message("deploy");
    first.message_id = format!("tck-input-required-{}", uuid::Uuid::new_v4());
    let task = support::send_task(&mut a.grpc, support::request("conformance", first, false)).await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    let mut follow_up = support::user_message("here it is");
    follow_up.task_id = task.id.clone();
    follow_up.context_id = task.context_id.clone();
    let done = support::send_task(
        &mut b.grpc,
        support::request("conformance", follow_up.clone(), false),
    )
    .await;
    assert_eq!(state_of(&done), TaskState::Completed);
    let on_a = support::get_task(&mut a.grpc, "conformance", &task.id)
        .await
        .unwrap();
    assert_eq!(on_a, done, "a sees what b committed");
    let held = on_a
        .history
        .iter()
        .filter(|m| m.message_id == follow_up.message_id)
        .count();
    assert_eq!(held, 1, "the follow-up is in history once");
    let runs = runs_of(&[&a, &b], std::slice::from_ref(&follow_up.message_id)).await;
    assert_eq!(runs, 1, "one run of the follow-up");
}

/// Push notifications with two replicas: one of them delivers (the
/// delivery role), so every event of tasks run on either reaches the
/// webhook once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn push_notifications_from_every_replica_are_delivered_once() {
    let Some(store) = support::postgres::fresh_schema().await else {
        return;
    };
    let loopback = ["--push-allow-cidr", "127.0.0.0/8"];
    let a = replica_with(&store, "10s", &loopback).await;
    let b = replica_with(&store, "10s", &loopback).await;
    let (mut listen, url, printed) = support::spawn_push_listen(&[]);
    let send = |r: &Replica| {
        let mut request = support::request("", support::user_message("fanout:10:0:1000"), true);
        request
            .configuration
            .get_or_insert_with(Default::default)
            .task_push_notification_config = Some(TaskPushNotificationConfig {
            url: url.clone(),
            ..Default::default()
        });
        let mut g = r.grpc.clone();
        async move { support::send_task(&mut g, request).await.id }
    };
    let mut sent = Vec::new();
    for r in [&a, &b, &a, &b, &a, &b] {
        sent.push(send(r).await);
    }
    let mut lines: Vec<String> = Vec::new();
    let completed = |lines: &[String], id: &str| {
        lines
            .iter()
            .any(|l| l.contains(id) && l.contains("TASK_STATE_COMPLETED"))
    };
    let read_until = |lines: &mut Vec<String>, ids: &[String]| {
        while !ids.iter().all(|id| completed(lines, id)) {
            lines.push(printed.recv_timeout(support::WAIT).expect("a notification"));
        }
    };
    read_until(&mut lines, &sent);
    // A duplicate is an entry delivered again before it left the outbox
    // (another holder's attempt, or this one's after a lost finish): once
    // the outbox is empty, none can come that is not in flight now, and
    // one in flight arrives before a later task's last notification.
    let admin = outbox_reader(&store).await;
    within("the outbox to empty", async {
        loop {
            let left: i64 = admin
                .query_one("SELECT count(*) FROM push_outbox", &[])
                .await
                .expect("count the outbox")
                .get(0);
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let last = send(&b).await;
    read_until(&mut lines, std::slice::from_ref(&last));
    while let Ok(line) = printed.try_recv() {
        lines.push(line);
    }
    let _ = listen.kill();
    let _ = listen.wait();
    let distinct: std::collections::HashSet<&String> = lines.iter().collect();
    assert_eq!(distinct.len(), lines.len(), "no notification twice");
    for id in &sent {
        // WORKING, 10 updates, COMPLETED, in that order.
        let steps: Vec<u32> = lines
            .iter()
            .filter(|l| l.contains(id.as_str()))
            .map(|l| fanout_step(l))
            .collect();
        let expected: Vec<u32> = (0..=10).chain([u32::MAX]).collect();
        assert_eq!(steps, expected, "task {id}: its notifications in order");
    }
}

/// A plaintext connection to the schema `store` names, to read its tables.
async fn outbox_reader(store: &str) -> tokio_postgres::Client {
    let (client, connection) = within(
        "connect to the schema",
        tokio_postgres::connect(store, tokio_postgres::NoTls),
    )
    .await
    .expect("connect to the schema");
    tokio::spawn(connection);
    client
}

/// Where a notification of a `fanout` run comes in its order: its first
/// WORKING 0, each numbered update its number, COMPLETED last
/// (`u32::MAX`). Anything else fails the test.
fn fanout_step(line: &str) -> u32 {
    let start = line
        .find('{')
        .unwrap_or_else(|| panic!("not a JSON body: {line}"));
    let body: serde_json::Value =
        serde_json::from_str(&line[start..]).unwrap_or_else(|e| panic!("{e}: {line}"));
    let number = |text: &serde_json::Value| -> u32 {
        text.as_str()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a numbered update: {line}"))
    };
    if let Some(update) = body.get("statusUpdate") {
        let status = &update["status"];
        match status["state"].as_str() {
            Some("TASK_STATE_COMPLETED") => u32::MAX,
            Some("TASK_STATE_WORKING") => match status.get("message") {
                None => 0,
                Some(message) => number(&message["parts"][0]["text"]),
            },
            other => panic!("unexpected state {other:?}: {line}"),
        }
    } else if let Some(update) = body.get("artifactUpdate") {
        number(&update["artifact"]["parts"][0]["text"])
    } else {
        panic!("not a task update: {line}")
    }
}

/// A follow-up's stream on one replica, for a task whose run is on
/// another: it gets the running replica's events, the same as that
/// replica's own subscriber from the point it joined, to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_stream_on_another_replica_gets_the_running_replicas_events() {
    let Some((mut a, mut b)) = two_replicas("10s").await else {
        return;
    };
    // WORKING, a second's wait, then 50 updates 5 ms apart, COMPLETED.
    let task = support::send_task(
        &mut a.grpc,
        support::request("", support::user_message("fanout:50:1000:5000"), true),
    )
    .await;
    let on_a = within(
        "subscribe on a",
        a.grpc.subscribe_to_task(subscribe_request(&task.id)),
    )
    .await
    .unwrap()
    .into_inner();
    let on_a = tokio::spawn(events_after_snapshot(on_a));
    let mut follow_up = support::user_message("and one more thing");
    follow_up.task_id = task.id.clone();
    let on_b = within(
        "a follow-up stream on b",
        b.grpc
            .send_streaming_message(support::request("", follow_up, false)),
    )
    .await
    .unwrap()
    .into_inner();
    let (_, on_b) = events_after_snapshot(on_b).await;
    let (_, on_a) = within("a's subscriber", on_a).await.unwrap();
    assert_eq!(final_state(&on_b), Some(TaskState::Completed));
    assert!(on_b.len() >= 51, "{} events on b", on_b.len());
    assert_eq!(
        on_b.as_slice(),
        &on_a[on_a.len() - on_b.len()..],
        "b's events are a's from where b joined"
    );
}

/// The same follow-up sent to two replicas at once: added to history once,
/// run once, and both requests answered with the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_follow_up_sent_to_two_replicas_at_once_is_added_and_run_once() {
    let Some((mut a, b)) = two_replicas("10s").await else {
        return;
    };
    const TASKS: usize = 5;
    let mut follow_ups = Vec::new();
    for _ in 0..TASKS {
        let task = input_required_task(&mut a).await;
        let mut follow_up = support::user_message("here it is");
        follow_up.task_id = task.id.clone();
        let (mut ga, mut gb) = (a.grpc.clone(), b.grpc.clone());
        let (ta, tb) = within(
            "both follow-ups",
            futures_util::future::join(
                support::send_task(
                    &mut ga,
                    support::request("conformance", follow_up.clone(), true),
                ),
                support::send_task(
                    &mut gb,
                    support::request("conformance", follow_up.clone(), true),
                ),
            ),
        )
        .await;
        assert_eq!(
            (ta.id.as_str(), tb.id.as_str()),
            (task.id.as_str(), task.id.as_str())
        );
        let done = eventually_in(&mut a.grpc, "conformance", &task.id, "COMPLETED", |t| {
            state_of(t) == TaskState::Completed
        })
        .await;
        let held = done
            .history
            .iter()
            .filter(|m| m.message_id == follow_up.message_id)
            .count();
        assert_eq!(held, 1, "the follow-up is in history once");
        follow_ups.push(follow_up.message_id);
    }
    let runs = runs_of(&[&a, &b], &follow_ups).await;
    assert_eq!(runs, TASKS, "one run per follow-up");
}

/// Two different follow-ups for one interrupted task, sent to two replicas
/// at once: their runs never overlap. The first run completes the task
/// (the conformance agent's follow-up does), so the other message's run
/// never starts, or the message comes too late and is refused: one run per
/// task, as on one server (a terminal task runs nothing more). Each replica
/// saw the task not active when its own message was committed; without a
/// run claim in the database both started a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn different_follow_ups_sent_to_two_replicas_at_once_never_run_together() {
    let Some((mut a, b)) = two_replicas("10s").await else {
        return;
    };
    const TASKS: usize = 12;
    let mut follow_ups = Vec::new();
    let mut both_added = 0;
    for _ in 0..TASKS {
        let task = input_required_task(&mut a).await;
        let mut on_a = support::user_message("from a");
        on_a.task_id = task.id.clone();
        let mut on_b = support::user_message("from b");
        on_b.task_id = task.id.clone();
        let (mut ga, mut gb) = (a.grpc.clone(), b.grpc.clone());
        let (ra, rb) = within(
            "both follow-ups",
            futures_util::future::join(
                ga.send_message(support::request("conformance", on_a.clone(), true)),
                gb.send_message(support::request("conformance", on_b.clone(), true)),
            ),
        )
        .await;
        let mut added = Vec::new();
        for (m, r) in [(&on_a, ra), (&on_b, rb)] {
            match r {
                Ok(_) => added.push(m.message_id.clone()),
                // Too late: the other message's run completed the task.
                Err(s) => assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}"),
            }
        }
        assert!(!added.is_empty(), "one of the follow-ups is accepted");
        both_added += usize::from(added.len() == 2);
        let done = eventually_in(&mut a.grpc, "conformance", &task.id, "COMPLETED", |t| {
            state_of(t) == TaskState::Completed
        })
        .await;
        for id in &added {
            let held = done.history.iter().filter(|h| &h.message_id == id).count();
            assert_eq!(held, 1, "each accepted follow-up is in history once");
        }
        follow_ups.extend([on_a.message_id, on_b.message_id]);
    }
    let runs = runs_of(&[&a, &b], &follow_ups).await;
    println!("both follow-ups accepted for {both_added} of {TASKS} tasks");
    assert_eq!(
        runs, TASKS,
        "one run per task: a second follow-up's run never starts"
    );
}

/// The number a `fanout` update carries (its status message's text or its
/// chunk's), `None` for any other event.
fn fanout_number(event: &StreamResponse) -> Option<u32> {
    use a2a_lifecycle::proto::part::Content;
    let text = match event.payload.as_ref()? {
        stream_response::Payload::StatusUpdate(u) => {
            a2a_lifecycle::agent::message_text(u.status.as_ref()?.message.as_ref()?)
        }
        stream_response::Payload::ArtifactUpdate(u) => match &u.artifact.as_ref()?.parts[..] {
            [part] => match &part.content {
                Some(Content::Text(t)) => t.clone(),
                _ => return None,
            },
            _ => return None,
        },
        _ => return None,
    };
    Some(text.parse().expect("a fanout update is numbered"))
}

/// A long task followed on another replica (issue "long-lived tasks"):
/// the follower catches up on each write by replaying what it changed, not
/// by reading the task again, through the whole writes the running replica
/// makes now and then. Its copy stays the stored task throughout: a
/// subscriber joining there at any point gets a snapshot of every update so
/// far and then each later update once, in order; at the end it reads as
/// the running replica's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_task_followed_on_another_replica_is_caught_up_by_its_changes() {
    const UPDATES: u32 = 2_000;
    let Some((mut a, mut b)) = two_replicas("10s").await else {
        return;
    };
    // WORKING, a second for b's subscriber to attach, then the updates
    // 1 ms apart (more than MIN_CHANGES_BEFORE_WHOLE of changes, many
    // times over: a's writes are whole now and then), then COMPLETED.
    let task = support::send_task(
        &mut a.grpc,
        support::request(
            "",
            support::user_message(&format!("fanout:{UPDATES}:1000:1000")),
            true,
        ),
    )
    .await;
    let mut first = within(
        "subscribe on b",
        b.grpc.subscribe_to_task(subscribe_request(&task.id)),
    )
    .await
    .unwrap()
    .into_inner();
    let first_snapshot = within("the snapshot", first.message())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        first_snapshot.payload,
        Some(stream_response::Payload::Task(_))
    ));
    // Each time b's first subscriber reaches another fifth of the updates,
    // one more subscriber joins on b.
    let mut joined = Vec::new();
    let mut last = 0;
    while let Some(event) = within("b's next event", first.message()).await.unwrap() {
        let Some(n) = fanout_number(&event) else {
            continue;
        };
        assert_eq!(n, last + 1, "b's first subscriber after update {last}");
        last = n;
        if n % (UPDATES / 5) == 0 && n < UPDATES {
            let stream = within(
                "subscribe on b again",
                b.grpc.subscribe_to_task(subscribe_request(&task.id)),
            )
            .await
            .unwrap()
            .into_inner();
            joined.push(tokio::spawn(events_after_snapshot(stream)));
        }
    }
    assert_eq!(last, UPDATES, "b's first subscriber saw every update");
    assert_eq!(joined.len(), 4);
    for stream in joined {
        let (snapshot, events) = within("a later subscriber", stream).await.unwrap();
        let held = support::fanout_updates_in(&snapshot);
        let after: Vec<u32> = events.iter().filter_map(fanout_number).collect();
        let expected: Vec<u32> = (held + 1..=UPDATES).collect();
        assert_eq!(after, expected, "the updates after a snapshot of {held}");
        assert_eq!(final_state(&events), Some(TaskState::Completed));
    }
    let on_a = support::get_task(&mut a.grpc, "", &task.id).await.unwrap();
    let on_b = support::get_task(&mut b.grpc, "", &task.id).await.unwrap();
    assert_eq!(on_b, on_a, "the task on b and on a");
    assert_eq!(support::fanout_updates_in(&on_b), UPDATES);
    // How b caught up: its log up to a marker message's run.
    let marker = support::user_message("marker");
    within(
        "marker",
        support::send_task(&mut b.grpc, support::request("", marker.clone(), true)),
    )
    .await;
    let (mut changes, mut whole) = (0, 0);
    let deadline = std::time::Instant::now() + support::WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = b
            .log
            .recv_timeout(left)
            .expect("the marker's run is logged");
        if line.contains("agent run started") && line.contains(&marker.message_id) {
            break;
        }
        if line.contains("caught up with the task's writes elsewhere") && line.contains(&task.id) {
            if line.contains("read=\"changes\"") {
                changes += 1;
            } else if line.contains("read=\"whole\"") {
                whole += 1;
            } else {
                panic!("a catch-up line says neither how: {line}");
            }
        }
    }
    eprintln!("b caught up {changes} times by changes, {whole} whole");
    // By changes throughout, across a's whole writes of the running task
    // (they log their changes too, migration 0012); whole only for the
    // terminal write (a finished task is one record), and once more per
    // whole write b fell more than a whole write behind, which it does not
    // on an idle machine (before the whole writes logged their changes:
    // 8 whole reads here, one per whole write).
    assert!(
        changes >= 100,
        "{changes} catch-ups by changes ({whole} whole)"
    );
    assert!(
        (1..=3).contains(&whole),
        "{whole} whole catch-ups against {changes} by changes"
    );
}
