//! Durable tasks: restart after SIGKILL on SQLite, the restart-FAILED rule,
//! idempotent sends, task timeout, retention and store failures.

use crate::support;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use a2a_lifecycle::wkt::Timestamp;
use async_trait::async_trait;
use tonic::Code;

use a2a_lifecycle::agent::demo::demo_router;
use a2a_lifecycle::lifecycle::HistoryLength;
use a2a_lifecycle::proto::a2a_service_client::A2aServiceClient;
use a2a_lifecycle::proto::{
    CancelTaskRequest, ListTasksRequest, Task, TaskState, send_message_response,
    stream_response::Payload,
};
use a2a_lifecycle::runtime::{RESTART_FAILURE, RuntimeConfig};
use a2a_lifecycle::store::{
    Caller, EncodedTask, ListQuery, MemoryStore, Outbox, Owner, SqliteStore, StoreError,
    StoredTask, TaskPage, TaskStore,
};
use support::*;

fn scratch_db() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("durability")
        .join(uuid::Uuid::new_v4().to_string())
        .join("tasks.db")
}

/// `serve` on an ephemeral port over the SQLite file at `db`, with a
/// deployer whose approval never comes during the test.
fn serve(db: &std::path::Path) -> (Child, String) {
    let store = format!("sqlite:{}", db.display());
    spawn_serve(&["--deployer-approval-delay", "1h", "--store", &store])
}

/// Issue "durable tasks", done-when: tasks in every state survive SIGKILL
/// with their last acknowledged state, history and artifacts; the WORKING
/// one is FAILED by the restart; new tasks work.
#[tokio::test]
async fn every_task_survives_sigkill_and_active_ones_fail_on_restart() {
    let db = scratch_db();
    let (mut first, url) = serve(&db);
    let mut client = A2aServiceClient::connect(url).await.unwrap();

    let mut tasks: Vec<(&str, Task)> = Vec::new();
    tasks.push(("", send_text(&mut client, "", "run the suite").await));
    tasks.push(("", send_text(&mut client, "", "this will fail").await));
    tasks.push((
        "deployer",
        send_text(&mut client, "deployer", "deploy to mars").await,
    ));
    tasks.push((
        "deployer",
        send_text(&mut client, "deployer", "deploy to staging").await,
    ));
    tasks.push((
        "code-reviewer",
        send_text(&mut client, "code-reviewer", "review").await,
    ));
    let to_cancel = send_task(
        &mut client,
        request("", user_message("slow, cancel me"), true),
    )
    .await;
    let canceled = client
        .cancel_task(CancelTaskRequest {
            tenant: "".into(),
            id: to_cancel.id.clone(),
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner();
    tasks.push(("", canceled));
    // A working task: stream until the agent reports progress.
    let mut stream = client
        .send_streaming_message(request("", user_message("slow suite"), false))
        .await
        .unwrap()
        .into_inner();
    let Some(Payload::Task(working)) = stream.message().await.unwrap().unwrap().payload else {
        panic!("first event is the task")
    };
    loop {
        let ev = stream.message().await.unwrap().unwrap();
        if let Some(Payload::StatusUpdate(u)) = ev.payload
            && u.status
                .as_ref()
                .and_then(|s| s.message.as_ref())
                .is_some_and(|m| a2a_lifecycle::agent::message_text(m).starts_with("Progress"))
        {
            break;
        }
    }

    let expected_states = [
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Rejected,
        TaskState::AuthRequired,
        TaskState::InputRequired,
        TaskState::Canceled,
    ];
    let mut before = Vec::new();
    for ((tenant, task), state) in tasks.iter().zip(expected_states) {
        let t = get_task(&mut client, tenant, &task.id).await.unwrap();
        assert_eq!(state_of(&t), state);
        before.push((*tenant, t));
    }
    let working_before = get_task(&mut client, "", &working.id).await.unwrap();
    assert_eq!(state_of(&working_before), TaskState::Working);

    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    drop(stream);

    let (mut second, url) = serve(&db);
    let mut client = A2aServiceClient::connect(url).await.unwrap();
    for (tenant, t) in &before {
        let after = get_task(&mut client, tenant, &t.id).await.unwrap();
        assert_eq!(&after, t, "task {} changed across the restart", t.id);
    }
    let after = get_task(&mut client, "", &working.id).await.unwrap();
    assert_eq!(state_of(&after), TaskState::Failed);
    assert_eq!(status_text(&after), RESTART_FAILURE);
    let (_, log) = transitions(&mut client, "", &working.id).await;
    assert_eq!(
        log,
        ["SUBMITTED client", "WORKING agent", "FAILED orphan-sweep"],
        "the transition log names the sweep"
    );
    // It kept reporting progress until the kill: what was acknowledged
    // before is a prefix of what survived, plus the last progress message
    // moved into history by the FAILED status.
    assert!(
        after.history.starts_with(&working_before.history),
        "acknowledged history survives"
    );
    assert!(after.history.len() > working_before.history.len());

    // Interrupted tasks wait on the client: the review resumes.
    let review = &before[4].1;
    let mut m = user_message("the diff");
    m.task_id = review.id.clone();
    let done = send_task(&mut client, request("code-reviewer", m, false)).await;
    assert_eq!(state_of(&done), TaskState::Completed);
    // New tasks work.
    let fresh = send_text(&mut client, "", "run").await;
    assert_eq!(state_of(&fresh), TaskState::Completed);
    let all = client
        .list_tasks(ListTasksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        all.total_size, 5,
        "default tenant: 4 before the restart, 1 after"
    );

    // Graceful stop; wait off the runtime thread so this test's client
    // connection can still answer the server's GOAWAY.
    Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    let exit = tokio::task::spawn_blocking(move || second.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "serve exited with {exit:?} on SIGTERM");
}

/// Idempotent sends: the same message_id for a new task returns the task
/// it created, concurrently too; a repeated follow-up is not applied twice.
#[tokio::test]
async fn repeated_messages_return_the_same_task() {
    for store in [
        Arc::new(MemoryStore::new()) as Arc<dyn TaskStore>,
        Arc::new(SqliteStore::open(scratch_db()).await.unwrap()),
    ] {
        let server = TestServer::start_full(store, demo_router(), RuntimeConfig::default()).await;
        let mut client = server.client().await;
        let m = user_message("run");
        let first = send_task(&mut client, request("", m.clone(), false)).await;
        let again = send_task(&mut client, request("", m.clone(), false)).await;
        assert_eq!(again, first, "same task, same final state");
        let streamed = collect(
            client
                .send_streaming_message(request("", m.clone(), false))
                .await
                .unwrap()
                .into_inner(),
        )
        .await
        .unwrap();
        assert_eq!(describe_all(&streamed), ["task:TASK_STATE_COMPLETED"]);

        // Concurrent repeats of a new message: one task.
        let m = user_message("run concurrently");
        let mut sends = Vec::new();
        for _ in 0..10 {
            let mut c = client.clone();
            let m = m.clone();
            sends.push(tokio::spawn(async move {
                send_task(&mut c, request("", m, false)).await
            }));
        }
        let mut ids = Vec::new();
        for s in sends {
            ids.push(s.await.unwrap().id);
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "one task for ten identical sends");

        // A repeated follow-up is applied once.
        let review = send_text(&mut client, "code-reviewer", "review").await;
        let mut follow = user_message("diff");
        follow.task_id = review.id.clone();
        let done = send_task(&mut client, request("code-reviewer", follow.clone(), false)).await;
        let repeat = send_task(&mut client, request("code-reviewer", follow, false)).await;
        assert_eq!(
            repeat, done,
            "repeat answered with the task, not refused as terminal"
        );
        let diffs = done
            .history
            .iter()
            .filter(|h| a2a_lifecycle::agent::message_text(h) == "diff")
            .count();
        assert_eq!(diffs, 1);

        // Ping has no task: each is answered.
        let ping = user_message("ping");
        for _ in 0..2 {
            let r = client
                .send_message(request("", ping.clone(), false))
                .await
                .unwrap()
                .into_inner();
            assert!(matches!(
                r.payload,
                Some(send_message_response::Payload::Message(_))
            ));
        }
        let list = client
            .list_tasks(ListTasksRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(list.total_size, 2);
        server.stop().await;
    }
}

/// `--task-timeout`: a task still active after the limit is FAILED and its
/// subscribers see the terminal event.
#[tokio::test]
async fn task_timeout_fails_active_tasks_and_subscribers_see_it() {
    let config = RuntimeConfig {
        task_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let server = TestServer::start_with(demo_router(), config).await;
    let mut client = server.client().await;
    let events = collect(
        client
            .send_streaming_message(request("", user_message("slow"), false))
            .await
            .unwrap()
            .into_inner(),
    )
    .await
    .unwrap();
    let Some(Payload::StatusUpdate(last)) = &events.last().unwrap().payload else {
        panic!("ends with a status update")
    };
    let status = last.status.as_ref().unwrap();
    assert_eq!(status.state, TaskState::Failed as i32);
    let text = a2a_lifecycle::agent::message_text(status.message.as_ref().unwrap());
    assert!(text.contains("timed out"), "{text}");
    // A quick task under the limit is unaffected; an interrupted one too.
    assert_eq!(
        state_of(&send_text(&mut client, "", "run").await),
        TaskState::Completed
    );
    let review = send_text(&mut client, "code-reviewer", "review").await;
    tokio::time::sleep(Duration::from_millis(400)).await; // past the limit, on purpose
    let still = get_task(&mut client, "code-reviewer", &review.id)
        .await
        .unwrap();
    assert_eq!(state_of(&still), TaskState::InputRequired);
    server.stop().await;
}

/// `--retain`: terminal tasks older than the retention are purged and are
/// TASK_NOT_FOUND; active and interrupted tasks stay.
#[tokio::test]
async fn retention_purges_old_terminal_tasks() {
    let config = RuntimeConfig {
        retain: Some(Duration::ZERO),
        sweep_every: Duration::from_secs(3600),
        ..Default::default()
    };
    let server = TestServer::start_with(demo_router(), config).await;
    let mut client = server.client().await;
    let done = send_text(&mut client, "", "run").await;
    let waiting = send_text(&mut client, "code-reviewer", "review").await;
    // A window in which a sweep at start (the interval's immediate first
    // tick) would purge the task first; the first background sweep is one
    // `sweep_every` after start, so only this call purges it.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let purged = server.manager.purge_expired().await.unwrap();
    assert_eq!(purged, 1, "the first background sweep ran at start");
    let err = get_task(&mut client, "", &done.id).await.unwrap_err();
    assert_a2a_error(&err, Code::NotFound, "TASK_NOT_FOUND");
    assert!(
        get_task(&mut client, "code-reviewer", &waiting.id)
            .await
            .is_ok()
    );
    server.stop().await;
}

/// The background sweep runs by itself.
#[tokio::test]
async fn retention_sweep_runs_in_the_background() {
    let config = RuntimeConfig {
        retain: Some(Duration::ZERO),
        sweep_every: Duration::from_millis(20),
        ..Default::default()
    };
    let server = TestServer::start_with(demo_router(), config).await;
    let mut client = server.client().await;
    let done = send_text(&mut client, "", "run").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while get_task(&mut client, "", &done.id).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "never purged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

/// A real store whose writes can be made to fail, to see what clients get.
struct FailingWrites {
    inner: MemoryStore,
    fail: AtomicBool,
}

impl FailingWrites {
    fn check(&self) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable("disk on fire (injected)".into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl TaskStore for FailingWrites {
    async fn create_encoded(&self, tenant: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        self.check()?;
        self.inner.create_encoded(tenant, task).await
    }
    async fn find_by_origin(
        &self,
        tenant: &str,
        owner: &str,
        message_id: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.inner.find_by_origin(tenant, owner, message_id).await
    }
    async fn get_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.inner.get_owned_by(tenant, task_id, owner).await
    }
    async fn is_owned_by(
        &self,
        tenant: &str,
        task_id: &str,
        owner: &Owner,
    ) -> Result<bool, StoreError> {
        self.inner.is_owned_by(tenant, task_id, owner).await
    }
    fn outbox(&self) -> &dyn Outbox {
        self.inner.outbox()
    }
    async fn get(&self, tenant: &str, task_id: &str) -> Result<Option<StoredTask>, StoreError> {
        self.inner.get(tenant, task_id).await
    }
    async fn update_encoded(
        &self,
        tenant: &str,
        task: &EncodedTask,
        expected: u64,
    ) -> Result<u64, StoreError> {
        self.check()?;
        self.inner.update_encoded(tenant, task, expected).await
    }
    async fn list(&self, tenant: &str, query: &ListQuery) -> Result<TaskPage, StoreError> {
        self.inner.list(tenant, query).await
    }
    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        self.inner.active_tasks().await
    }
    async fn purge_terminal_before(&self, before: &Timestamp) -> Result<u64, StoreError> {
        self.inner.purge_terminal_before(before).await
    }

    async fn count_open_owned_by(
        &self,
        owner: &Owner,
        at_most: usize,
    ) -> Result<usize, StoreError> {
        self.inner.count_open_owned_by(owner, at_most).await
    }

    async fn waiting_before(
        &self,
        before: &Timestamp,
        limit: usize,
    ) -> Result<Vec<a2a_lifecycle::store::Waiting>, StoreError> {
        self.inner.waiting_before(before, limit).await
    }
}

/// A failed write is UNAVAILABLE to the client, ends open streams with
/// the error, and never leaves a blocking call waiting.
#[tokio::test]
async fn store_failures_are_unavailable_and_never_hang() {
    let store = Arc::new(FailingWrites {
        inner: MemoryStore::new(),
        fail: AtomicBool::new(false),
    });
    let server =
        TestServer::start_full(store.clone(), demo_router(), RuntimeConfig::default()).await;
    let mut client = server.client().await;

    // A running slow task, watched by a stream and a blocking follower.
    let mut stream = client
        .send_streaming_message(request("", user_message("slow"), false))
        .await
        .unwrap()
        .into_inner();
    let Some(Payload::Task(task)) = stream.message().await.unwrap().unwrap().payload else {
        panic!()
    };
    // Wait for the agent's first write to have happened.
    let _working = stream.message().await.unwrap().unwrap();
    store.fail.store(true, Ordering::SeqCst);
    let end = loop {
        match tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("stream hung")
        {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    let status = end.expect_err("the stream ends with the store's error");
    assert_a2a_error(&status, Code::Unavailable, "UNAVAILABLE");
    assert!(status.message().contains("disk on fire"));

    // New tasks: creating fails with UNAVAILABLE, promptly.
    let err = tokio::time::timeout(
        WAIT,
        client.send_message(request("", user_message("run"), false)),
    )
    .await
    .expect("send hung")
    .unwrap_err();
    assert_a2a_error(&err, Code::Unavailable, "UNAVAILABLE");
    // Cancel cannot record CANCELED: UNAVAILABLE, not a hang.
    let err = tokio::time::timeout(
        WAIT,
        client.cancel_task(CancelTaskRequest {
            tenant: "".into(),
            id: task.id.clone(),
            metadata: None,
        }),
    )
    .await
    .expect("cancel hung")
    .unwrap_err();
    assert_a2a_error(&err, Code::Unavailable, "UNAVAILABLE");

    // Reads still work and show the last committed state.
    let t = get_task(&mut client, "", &task.id).await.unwrap();
    assert_eq!(state_of(&t), TaskState::Working);
    store.fail.store(false, Ordering::SeqCst);
    assert_eq!(
        state_of(&send_text(&mut client, "", "run").await),
        TaskState::Completed
    );
    let _ = server
        .manager
        .get_task("", &Caller::ANONYMOUS, &task.id, HistoryLength::All)
        .await
        .unwrap();
    server.stop().await;
}

/// The threads the process `pid` has now (`/proc/PID/status`).
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Reads wait for one of the SQLite store's reader connections as tasks,
/// not each on a thread of its own: a burst of concurrent GetTask calls
/// leaves the server with no more threads than at rest.
/// (Each waiting read once held a blocking thread, a stack and an
/// allocator heap: 256 reads at once, 230 threads and 160 MB of RSS; a
/// mixed soak, hundreds of MB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_do_not_each_hold_a_thread() {
    use a2a_lifecycle::proto::GetTaskRequest;
    let db = scratch_db();
    let (child, url) = serve(&db);
    let child = KillOnDrop(child);
    let pid = child.0.id();
    let mut client = within("connect", A2aServiceClient::connect(url.clone()))
        .await
        .unwrap();
    let task = send_text(&mut client, "", "run the suite").await;
    // One read first: what a read needs at all is at rest.
    let get = |client: &mut Client| {
        let mut client = client.clone();
        let id = task.id.clone();
        async move {
            client
                .get_task(GetTaskRequest {
                    id,
                    ..Default::default()
                })
                .await
        }
    };
    within("a read", get(&mut client)).await.unwrap();
    let at_rest = threads_of(pid);
    for _ in 0..4 {
        let burst: Vec<_> = (0..200).map(|_| get(&mut client)).collect();
        for answer in within("a burst of reads", futures_util::future::join_all(burst)).await {
            assert_eq!(answer.unwrap().into_inner().id, task.id);
        }
    }
    // Idle blocking threads live on for 10 s: the count now is the most
    // the burst needed.
    let after = threads_of(pid);
    assert!(
        after <= at_rest,
        "{at_rest} threads at rest, {after} after 800 concurrent reads"
    );
}
