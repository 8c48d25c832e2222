//! A bounded soak across replicas (issue "scale out"): three replicas on
//! one PostgreSQL schema; workers send, follow up, cancel and subscribe at
//! random, each call to a replica picked at random. Afterwards: every
//! stream ended, every subscriber of a task saw the same sequence (a later
//! subscriber a suffix of an earlier one's), every acknowledged task is in
//! the database, and no task is left active: none without a live lease.
//!
//! It runs for `A2A_SOAK_SECS` seconds (default 15; a few minutes at
//! most is the intent), with the random seed printed so that a failure
//! can be replayed (`A2A_SOAK_SEED`). Skipped, saying so, when PostgreSQL
//! is not there and not required (see `support::postgres`).

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    CancelTaskRequest, StreamResponse, SubscribeToTaskRequest, TaskState, stream_response,
};
use support::{Client, state_of, within};
use tokio::sync::Mutex;
use tokio_postgres::NoTls;

/// xorshift64*: reproducible from its seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What the workers saw.
#[derive(Default)]
struct Log {
    /// (tenant, task id) of every acknowledged send.
    tasks: Vec<(String, String)>,
    /// Per task: each subscriber's events after its snapshot, and how its
    /// stream ended (`None`: normally).
    streams: HashMap<String, Vec<Seen>>,
}

/// One stream: its events after the snapshot, and how it ended (`None`:
/// normally).
type Seen = (Vec<StreamResponse>, Option<tonic::Code>);

async fn read_stream(
    mut stream: tonic::Streaming<StreamResponse>,
) -> (Vec<StreamResponse>, Option<tonic::Code>) {
    let mut events = Vec::new();
    let mut first = true;
    loop {
        match stream.message().await {
            Ok(Some(event)) => {
                if first {
                    first = false;
                    assert!(
                        matches!(event.payload, Some(stream_response::Payload::Task(_))),
                        "a stream starts with a Task snapshot"
                    );
                } else {
                    events.push(event);
                }
            }
            Ok(None) => return (events, None),
            Err(status) => return (events, Some(status.code())),
        }
    }
}

/// A stream's events in short: each one's kind and state or artifact.
fn outline(events: &[StreamResponse]) -> String {
    events
        .iter()
        .map(|e| match &e.payload {
            Some(stream_response::Payload::StatusUpdate(u)) => format!(
                "status {:?}",
                u.status
                    .as_ref()
                    .and_then(|s| TaskState::try_from(s.state).ok())
            ),
            Some(stream_response::Payload::ArtifactUpdate(u)) => {
                format!("artifact {:?}", u.artifact.as_ref().map(|a| a.parts.len()))
            }
            Some(stream_response::Payload::Task(_)) => "task snapshot".into(),
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One of the most recent tasks (likelier still running), if any.
fn recent(log: &Log, rng: &mut Rng) -> Option<(String, String)> {
    let n = log.tasks.len().min(16);
    (n > 0).then(|| log.tasks[log.tasks.len() - 1 - rng.below(n)].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_soak() {
    let Some(store) = support::postgres::fresh_schema().await else {
        return;
    };
    let secs: u64 = std::env::var("A2A_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let seed: u64 = std::env::var("A2A_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("soak: {secs} s, A2A_SOAK_SEED={seed}");
    let mut processes = Vec::new();
    let mut clients: Vec<Client> = Vec::new();
    for _ in 0..3 {
        let (process, url) = support::postgres::spawn_bench_replica(&store);
        processes.push(process);
        clients.push(
            within("connect", A2aServiceClient::connect(url))
                .await
                .unwrap(),
        );
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut workers = Vec::new();
    for w in 0..6u64 {
        let (clients, log) = (clients.clone(), log.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = Rng(seed.wrapping_add(w.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
            let mut readers = Vec::new();
            while Instant::now() < deadline {
                let mut g = clients[rng.below(clients.len())].clone();
                match rng.below(4) {
                    // A task that works a while.
                    0 => {
                        let text =
                            format!("fanout:{}:100:{}", 5 + rng.below(25), rng.below(10_000));
                        let task = within(
                            "send",
                            support::send_task(
                                &mut g,
                                support::request("", support::user_message(&text), true),
                            ),
                        )
                        .await;
                        log.lock().await.tasks.push((String::new(), task.id));
                    }
                    // A subscriber of a known task.
                    1 => {
                        let known = recent(&*log.lock().await, &mut rng);
                        let Some((tenant, id)) = known else { continue };
                        let answer = within(
                            "subscribe",
                            g.subscribe_to_task(SubscribeToTaskRequest {
                                tenant,
                                id: id.clone(),
                            }),
                        )
                        .await;
                        match answer {
                            Ok(stream) => {
                                let log = log.clone();
                                readers.push(tokio::spawn(async move {
                                    let seen =
                                        within("a stream to end", read_stream(stream.into_inner()))
                                            .await;
                                    log.lock().await.streams.entry(id).or_default().push(seen);
                                }));
                            }
                            // The task ended first: nothing to subscribe to.
                            Err(status) => assert_eq!(
                                status.code(),
                                tonic::Code::FailedPrecondition,
                                "subscribe: {status:?}"
                            ),
                        }
                    }
                    // A cancel of a known task.
                    2 => {
                        let known = recent(&*log.lock().await, &mut rng);
                        let Some((tenant, id)) = known else { continue };
                        let answer = within(
                            "cancel",
                            g.cancel_task(CancelTaskRequest {
                                tenant,
                                id,
                                metadata: None,
                            }),
                        )
                        .await;
                        match answer {
                            Ok(task) => {
                                assert_eq!(state_of(&task.into_inner()), TaskState::Canceled)
                            }
                            Err(status) => assert_eq!(
                                status.code(),
                                tonic::Code::FailedPrecondition,
                                "cancel: {status:?}"
                            ),
                        }
                    }
                    // INPUT_REQUIRED on one replica, its follow-up on another.
                    _ => {
                        let mut first = support::user_message("start");
                        first.message_id = format!("tck-input-required-{}", uuid::Uuid::new_v4());
                        let task = within(
                            "input-required",
                            support::send_task(
                                &mut g,
                                support::request("conformance", first, false),
                            ),
                        )
                        .await;
                        log.lock()
                            .await
                            .tasks
                            .push(("conformance".into(), task.id.clone()));
                        if state_of(&task) != TaskState::InputRequired {
                            // Canceled by another worker meanwhile.
                            continue;
                        }
                        let mut other = clients[rng.below(clients.len())].clone();
                        let mut follow_up = support::user_message("more");
                        follow_up.task_id = task.id.clone();
                        let answer = within(
                            "follow-up",
                            other.send_message(support::request("conformance", follow_up, false)),
                        )
                        .await;
                        match answer {
                            Ok(r) => match r.into_inner().payload {
                                Some(
                                    a2a_lifecycle::proto::send_message_response::Payload::Task(t),
                                ) => {
                                    let state = state_of(&t);
                                    assert!(
                                        matches!(state, TaskState::Completed | TaskState::Canceled),
                                        "follow-up ended {state:?}"
                                    );
                                }
                                other => panic!("follow-up answered {other:?}"),
                            },
                            // Canceled by another worker first.
                            Err(status) => assert!(
                                matches!(
                                    status.code(),
                                    tonic::Code::FailedPrecondition | tonic::Code::Unimplemented
                                ),
                                "follow-up: {status:?}"
                            ),
                        }
                    }
                }
            }
            for r in readers {
                r.await.unwrap();
            }
        }));
    }
    tokio::time::sleep_until(deadline.into()).await;
    for w in workers {
        within("a worker", w).await.unwrap();
    }
    let log = log.lock().await;
    eprintln!(
        "soak: {} tasks, {} streams",
        log.tasks.len(),
        log.streams.values().map(Vec::len).sum::<usize>()
    );
    assert!(!log.tasks.is_empty());
    for (id, streams) in &log.streams {
        for (_, ended) in streams {
            assert_eq!(*ended, None, "a stream of task {id} ended with an error");
        }
        // Every pair: the shorter is a suffix of the longer.
        let longest = streams
            .iter()
            .map(|(e, _)| e)
            .max_by_key(|e| e.len())
            .unwrap();
        for (events, _) in streams {
            assert!(
                events.as_slice() == &longest[longest.len() - events.len()..],
                "task {id}: subscribers saw different sequences:\n{}\n{}",
                outline(longest),
                outline(events)
            );
        }
    }
    // Every acknowledged task is stored, each read on a replica at random.
    let mut rng = Rng(seed);
    for (tenant, id) in &log.tasks {
        let mut g = clients[rng.below(clients.len())].clone();
        support::get_task(&mut g, tenant, id).await.unwrap();
    }
    // Nothing stays active: every run ends within a second or so.
    let (db, connection) = tokio_postgres::connect(&store, NoTls).await.unwrap();
    tokio::spawn(connection);
    within("no task left active", async {
        loop {
            let active: i64 = db
                .query_one("SELECT COUNT(*) FROM tasks WHERE state IN (1, 2)", &[])
                .await
                .unwrap()
                .get(0);
            if active == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop(processes);
}
