//! The runtime when a store write fails or runs queue behind each other:
//! a client's failed write never fails the agent's next run, leaves no gap
//! that strands a later blocking send, and a blocking follow-up answers at
//! its own run's stop even when a run queued behind it moves the task on.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use a2a_lifecycle::wkt::Timestamp;
use async_trait::async_trait;
use tonic::Code;

use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::lifecycle::HistoryLength;
use a2a_lifecycle::proto::{Task, TaskState};
use a2a_lifecycle::runtime::{MessageRequest, RuntimeConfig, SendOutcome, TaskHandle, TaskManager};
use a2a_lifecycle::store::{
    Caller, EncodedTask, ListQuery, MemoryStore, Outbox, Owner, StoreError, StoredTask, TaskPage,
    TaskStore,
};
use support::*;

/// `ask`: INPUT_REQUIRED. `slow`: WORKING, a pause, INPUT_REQUIRED.
/// Anything else: leaves the task as it is.
struct Asking;

#[async_trait]
impl AgentExecutor for Asking {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        match ctx.text().as_str() {
            "ask" => sink.status(TaskState::InputRequired, Some("more?")).await?,
            "slow" => {
                sink.status(TaskState::Working, Some("on it")).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                sink.status(TaskState::InputRequired, Some("more?")).await?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The memory store, with the next update refused when `fail` is set (a
/// full disk, a lost connection).
struct Flaky {
    inner: MemoryStore,
    /// While set, every create waits for a permit of `creates_gate` (a
    /// slow disk, a busy database); `creates_held` counts those held, and
    /// `held_created` is notified as each is stored.
    hold_creates: AtomicBool,
    creates_gate: tokio::sync::Semaphore,
    creates_held: AtomicUsize,
    held_created: tokio::sync::Notify,
    /// Notified as a held create starts waiting.
    create_waiting: tokio::sync::Notify,
    /// While set, every update waits for a permit of `updates_gate`;
    /// `update_waiting` is notified as one starts waiting, and
    /// `held_update_whole` says whether it wrote the whole record.
    hold_updates: AtomicBool,
    updates_gate: tokio::sync::Semaphore,
    update_waiting: tokio::sync::Notify,
    held_update_whole: AtomicBool,
    fail: AtomicBool,
    /// Every update is refused while set (the disk stays full).
    down: AtomicBool,
    /// Every read of a task is refused while set (the database restarts).
    unreadable: AtomicBool,
    /// Reads refused so far, and a signal at each.
    refused_reads: AtomicUsize,
    read_refused: tokio::sync::Notify,
}

impl Flaky {
    fn new() -> Arc<Self> {
        Arc::new(Flaky {
            inner: MemoryStore::new(),
            hold_creates: AtomicBool::new(false),
            creates_gate: tokio::sync::Semaphore::new(0),
            creates_held: AtomicUsize::new(0),
            held_created: tokio::sync::Notify::new(),
            create_waiting: tokio::sync::Notify::new(),
            hold_updates: AtomicBool::new(false),
            updates_gate: tokio::sync::Semaphore::new(0),
            update_waiting: tokio::sync::Notify::new(),
            held_update_whole: AtomicBool::new(false),
            fail: AtomicBool::new(false),
            down: AtomicBool::new(false),
            unreadable: AtomicBool::new(false),
            refused_reads: AtomicUsize::new(0),
            read_refused: tokio::sync::Notify::new(),
        })
    }
}

/// Waits for a permit of `gate` and spends it: one held write let go.
async fn through(gate: &tokio::sync::Semaphore) {
    gate.acquire().await.expect("the gate stays open").forget();
}

#[async_trait]
impl TaskStore for Flaky {
    async fn create_encoded(&self, t: &str, task: &EncodedTask) -> Result<u64, StoreError> {
        if !self.hold_creates.load(Ordering::SeqCst) {
            return self.inner.create_encoded(t, task).await;
        }
        self.creates_held.fetch_add(1, Ordering::SeqCst);
        self.create_waiting.notify_one();
        through(&self.creates_gate).await;
        let created = self.inner.create_encoded(t, task).await;
        self.held_created.notify_one();
        created
    }
    async fn find_by_origin(
        &self,
        t: &str,
        o: &str,
        m: &str,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.inner.find_by_origin(t, o, m).await
    }
    async fn get_owned_by(
        &self,
        t: &str,
        id: &str,
        o: &Owner,
    ) -> Result<Option<StoredTask>, StoreError> {
        self.inner.get_owned_by(t, id, o).await
    }
    async fn is_owned_by(&self, t: &str, id: &str, o: &Owner) -> Result<bool, StoreError> {
        self.inner.is_owned_by(t, id, o).await
    }
    fn outbox(&self) -> &dyn Outbox {
        self.inner.outbox()
    }
    // Writes of changes and compact records, as the memory store takes
    // them: the runtime writes to this store as it writes to that one.
    fn keeps_changes(&self) -> bool {
        self.inner.keeps_changes()
    }
    fn compact_records(&self) -> bool {
        self.inner.compact_records()
    }
    async fn get(&self, t: &str, id: &str) -> Result<Option<StoredTask>, StoreError> {
        if self.unreadable.load(Ordering::SeqCst) {
            self.refused_reads.fetch_add(1, Ordering::SeqCst);
            self.read_refused.notify_one();
            return Err(StoreError::Unavailable("early eof (injected)".into()));
        }
        self.inner.get(t, id).await
    }
    async fn update_encoded(&self, t: &str, task: &EncodedTask, v: u64) -> Result<u64, StoreError> {
        if self.down.load(Ordering::SeqCst) || self.fail.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Unavailable("disk full (injected)".into()));
        }
        if self.hold_updates.load(Ordering::SeqCst) {
            let whole = matches!(task.body, a2a_lifecycle::store::Body::Whole(_));
            self.held_update_whole.store(whole, Ordering::SeqCst);
            self.update_waiting.notify_one();
            through(&self.updates_gate).await;
        }
        self.inner.update_encoded(t, task, v).await
    }
    async fn list(&self, t: &str, q: &ListQuery) -> Result<TaskPage, StoreError> {
        self.inner.list(t, q).await
    }
    async fn active_tasks(&self) -> Result<Vec<(String, StoredTask)>, StoreError> {
        self.inner.active_tasks().await
    }
    async fn purge_terminal_before(&self, b: &Timestamp) -> Result<u64, StoreError> {
        self.inner.purge_terminal_before(b).await
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

async fn flaky_server() -> (TestServer, Arc<Flaky>) {
    flaky_server_with(Arc::new(Asking)).await
}

async fn flaky_server_with(agent: Arc<dyn AgentExecutor>) -> (TestServer, Arc<Flaky>) {
    let store = Flaky::new();
    let server = TestServer::start_full(
        store.clone(),
        AgentRouter::new().with("", agent),
        RuntimeConfig::default(),
    )
    .await;
    (server, store)
}

fn on(task: &Task, text: &str) -> a2a_lifecycle::proto::Message {
    let mut m = user_message(text);
    m.task_id = task.id.clone();
    m
}

/// A handle on the task held in-process: keeps its live state (and any
/// failure recorded there) in memory between the gRPC calls.
async fn hold(manager: &TaskManager, task: &Task) -> SendOutcome {
    manager
        .send_message(
            "",
            &Caller::ANONYMOUS,
            MessageRequest::from(on(task, "quiet")),
            HistoryLength::All,
            false,
        )
        .await
        .unwrap()
}

/// A task at INPUT_REQUIRED, held in memory, whose follow-up's write the
/// store refused (the client got UNAVAILABLE).
async fn a_follow_up_whose_write_failed() -> (TestServer, Client, Task, Box<TaskHandle>) {
    let (server, store) = flaky_server().await;
    let mut client = server.client().await;
    let task = within(
        "create",
        send_task(&mut client, request("", user_message("ask"), false)),
    )
    .await;
    let SendOutcome::Task(held) = hold(&server.manager, &task).await else {
        panic!("a task")
    };
    store.fail.store(true, Ordering::SeqCst);
    let err = within(
        "failed follow-up",
        client.send_message(request("", on(&task, "x"), false)),
    )
    .await
    .unwrap_err();
    assert_a2a_error(&err, Code::Unavailable, "UNAVAILABLE");
    (server, client, task, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_client_write_does_not_fail_the_next_run() {
    let (server, mut client, task, held) = a_follow_up_whose_write_failed().await;
    // The agent lost nothing: its next run is not told of a failure.
    let stream = within(
        "next run",
        client.send_streaming_message(request("", on(&task, "ask"), false)),
    )
    .await
    .unwrap()
    .into_inner();
    let events = within("next run's events", collect(stream)).await.unwrap();
    assert_eq!(
        describe_all(&events),
        [
            "task:TASK_STATE_INPUT_REQUIRED",
            "status:TASK_STATE_INPUT_REQUIRED"
        ]
    );
    let after = within("get", get_task(&mut client, "", &task.id))
        .await
        .unwrap();
    assert_eq!(state_of(&after), TaskState::InputRequired);
    drop(held);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_follow_up_leaves_no_gap_that_strands_a_later_blocking_send() {
    let (server, mut client, task, held) = a_follow_up_whose_write_failed().await;
    // A run that changes nothing: the blocking send returns when it ends.
    let after = within(
        "blocking send",
        send_task(&mut client, request("", on(&task, "quiet"), false)),
    )
    .await;
    assert_eq!(state_of(&after), TaskState::InputRequired);
    drop(held);
    server.stop().await;
}

/// Run A ends at INPUT_REQUIRED; run B, queued behind it, moves the task to
/// WORKING before A's waiter looks. A's blocking send answers with a task
/// at a stop (B's INPUT_REQUIRED), never UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_follow_up_answers_at_a_stop_when_a_queued_run_moves_on() {
    let server = TestServer::start_with(
        AgentRouter::new().with("", Arc::new(Asking)),
        RuntimeConfig::default(),
    )
    .await;
    let m = &server.manager;
    let mut client = server.client().await;
    let task = within(
        "create",
        send_task(&mut client, request("", user_message("ask"), false)),
    )
    .await;
    let anonymous = Caller::ANONYMOUS;
    let send = |text: &str| {
        m.send_message(
            "",
            &anonymous,
            MessageRequest::from(on(&task, text)),
            HistoryLength::All,
            false,
        )
    };
    let SendOutcome::Task(a) = within("a", send("ask")).await.unwrap() else {
        panic!("a task")
    };
    let SendOutcome::Task(b) = within("b", send("slow")).await.unwrap() else {
        panic!("a task")
    };
    // A handler slow to reach its wait (a loaded server): by then B runs.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let answered = within("a's wait", m.wait(*a)).await.unwrap();
    assert_eq!(state_of(&answered), TaskState::InputRequired);
    let b = within("b's wait", m.wait(*b)).await.unwrap();
    assert_eq!(state_of(&b), TaskState::InputRequired);
    server.stop().await;
}

/// A request dropped while its run waits for the store's write (its agent
/// done at once, the create held by a slow store) hands what is left of
/// the run to a task of its own, which takes over the wake-up the store
/// owes the request: the task is still created and its run ends. On one
/// thread, so that nothing else polls the run meanwhile.
#[tokio::test]
async fn a_request_dropped_while_its_run_waits_for_its_write_leaves_the_run_going() {
    let store = Flaky::new();
    store.hold_creates.store(true, Ordering::SeqCst);
    let manager = TaskManager::new(
        store.clone(),
        AgentRouter::new().with("", Arc::new(Asking)),
        RuntimeConfig::default(),
    );
    let message = user_message("ask");
    let first = support::answered_in_one_poll(&manager, message.clone()).await;
    assert!(!first, "the create is held, so nothing can answer yet");
    assert_eq!(
        store.creates_held.load(Ordering::SeqCst),
        1,
        "the run reached its write within the request's poll"
    );
    store.hold_creates.store(false, Ordering::SeqCst);
    store.creates_gate.add_permits(1);
    // The held create goes on without its request: a run dropped with the
    // request would have dropped it too, and nothing would store it.
    within("the held create, stored", store.held_created.notified()).await;
    // The repeat (spec §3.3.1) is answered with the dropped request's
    // task.
    let SendOutcome::Task(handle) = within(
        "repeat",
        manager.send_message(
            "",
            &Caller::ANONYMOUS,
            MessageRequest::from(message.clone()),
            HistoryLength::All,
            false,
        ),
    )
    .await
    .expect("sent") else {
        panic!("a task")
    };
    let task = within("wait", manager.wait(*handle))
        .await
        .expect("the run ends with the task waiting for input");
    assert_eq!(state_of(&task), TaskState::InputRequired);
    assert_eq!(task.history[0].message_id, message.message_id);
}

/// WORKING, then waits for `gate`, then reports progress (which fails while
/// the store is down, and the agent propagates the error).
struct Gated {
    gate: tokio::sync::Notify,
    working: tokio::sync::Notify,
}

#[async_trait]
impl AgentExecutor for Gated {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, None).await?;
        self.working.notify_one();
        self.gate.notified().await;
        sink.status(TaskState::Working, Some("50% done")).await?;
        sink.status(TaskState::Completed, None).await?;
        Ok(())
    }
}

/// A failed write never strands a task (issue "hardening", item 1): while
/// the store refuses every write, the task's stream ends at once with
/// UNAVAILABLE; once the store takes writes again the task is FAILED, its
/// status message naming the store's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_writes_fail_is_failed_once_the_store_recovers() {
    let agent = Arc::new(Gated {
        gate: tokio::sync::Notify::new(),
        working: tokio::sync::Notify::new(),
    });
    let (server, store) = flaky_server_with(agent.clone()).await;
    let mut client = server.client().await;
    let (task, mut stream) = support::subscribed_while_working(&mut client, &agent.working).await;
    store.down.store(true, Ordering::SeqCst);
    agent.gate.notify_one();
    // The stream ends with the store's error, not a hang.
    let err = support::stream_error(&mut stream).await;
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // Still WORKING in the store while it refuses writes.
    let stuck = within("get", get_task(&mut client, "", &task.id))
        .await
        .unwrap();
    assert_eq!(state_of(&stuck), TaskState::Working);
    store.down.store(false, Ordering::SeqCst);
    // The runtime fails it once the store takes writes again.
    let (events, failed) = settled(&mut client, "", &task.id).await;
    if let Some(last) = events.last() {
        assert_eq!(describe(last), "status:TASK_STATE_FAILED");
    }
    assert_eq!(state_of(&failed), TaskState::Failed);
    assert!(
        status_text(&failed).contains("disk full"),
        "{}",
        status_text(&failed)
    );
    server.stop().await;
}

/// Waits until `store` has refused `n` reads.
async fn refused_reads_reach(store: &Flaky, n: usize) {
    while store.refused_reads.load(Ordering::SeqCst) < n {
        within("a refused read", store.read_refused.notified()).await;
    }
}

/// Runs a task of `agent` (WORKING at `working`, its next events at
/// `gate`) with the store refusing every write and every read of the task
/// from `gate` on: its stream ends with the store's error, `stop` (if
/// any) is opened once the reload after the refused write was refused
/// too, and the store comes back after more reads than the run's end makes
/// by itself (at most four: the reload, the end's look at the task, the
/// dispatch of the queue). The task must then settle FAILED, its status
/// message containing `reason`.
async fn failed_after_the_store_was_unreadable(
    agent: Arc<dyn AgentExecutor>,
    working: &tokio::sync::Notify,
    gate: &tokio::sync::Notify,
    stop: Option<&tokio::sync::Notify>,
    reason: &str,
) {
    let (server, store) = flaky_server_with(agent).await;
    let mut client = server.client().await;
    let (task, mut stream) = support::subscribed_while_working(&mut client, working).await;
    store.down.store(true, Ordering::SeqCst);
    store.unreadable.store(true, Ordering::SeqCst);
    gate.notify_one();
    let err = support::stream_error(&mut stream).await;
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    if let Some(stop) = stop {
        refused_reads_reach(&store, 1).await;
        stop.notify_one();
    }
    // A run end that gives up on an unreadable task reads no more, and
    // this wait times out.
    refused_reads_reach(&store, 6).await;
    store.down.store(false, Ordering::SeqCst);
    store.unreadable.store(false, Ordering::SeqCst);
    let (_, failed) = settled(&mut client, "", &task.id).await;
    server.stop().await;
    assert_eq!(state_of(&failed), TaskState::Failed, "{failed:?}");
    assert!(
        status_text(&failed).contains(reason),
        "{}",
        status_text(&failed)
    );
}

/// As above, with the task unreadable too when its run ends (PostgreSQL
/// restarting under the replica: the fault harness left two tasks WORKING
/// on a live replica so): whether the task is still active is not known
/// then, and it is failed, if it still is, once the store answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_unreadable_when_its_run_ends_is_failed_once_the_store_recovers() {
    let agent = Arc::new(Gated {
        gate: tokio::sync::Notify::new(),
        working: tokio::sync::Notify::new(),
    });
    // The store refuses writes ("disk full") and reads ("early eof")
    // from the gate on: which of them the agent's next event meets first
    // (its write, or the reload of a working copy a refused write
    // dropped) depends on the schedule (2 runs in 30 met the read). The
    // reason names the store's error either way.
    failed_after_the_store_was_unreadable(
        agent.clone(),
        &agent.working,
        &agent.gate,
        None,
        "(injected)",
    )
    .await;
}

/// WORKING, then (at `gate`) progress, then (at `stop`) returns without a
/// final status.
struct StopsAfterProgress {
    gate: tokio::sync::Notify,
    stop: tokio::sync::Notify,
    working: tokio::sync::Notify,
}

#[async_trait]
impl AgentExecutor for StopsAfterProgress {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, None).await?;
        self.working.notify_one();
        self.gate.notified().await;
        sink.status(TaskState::Working, Some("50% done")).await?;
        self.stop.notified().await;
        Ok(())
    }
}

/// As above, with the run ending after its refused write was dropped (the
/// task no longer in memory) and while the task cannot be read: it is
/// failed, if still active, once the store answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ending_while_its_task_is_unreadable_fails_it_once_the_store_recovers() {
    let agent = Arc::new(StopsAfterProgress {
        gate: tokio::sync::Notify::new(),
        stop: tokio::sync::Notify::new(),
        working: tokio::sync::Notify::new(),
    });
    failed_after_the_store_was_unreadable(
        agent.clone(),
        &agent.working,
        &agent.gate,
        Some(&agent.stop),
        "could not be read when the run ended",
    )
    .await;
}

/// Any text but `answer`: WORKING until the gate opens, then INPUT_REQUIRED, then (the
/// gate again) one more status, which the test has the store refuse.
/// `answer`: COMPLETED.
struct Interrupting {
    gate: tokio::sync::Notify,
    working: tokio::sync::Notify,
}

#[async_trait]
impl AgentExecutor for Interrupting {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        if ctx.text() == "answer" {
            sink.status(TaskState::Completed, Some("answered")).await?;
            return Ok(());
        }
        sink.status(TaskState::Working, None).await?;
        self.working.notify_one();
        self.gate.notified().await;
        sink.status(TaskState::InputRequired, Some("more?")).await?;
        self.gate.notified().await;
        sink.status(TaskState::InputRequired, Some("still there?"))
            .await?;
        Ok(())
    }
}

/// A follow-up queued behind a run is not dropped when the task cannot be
/// read as that run ends (the store restarting): it runs once the task can
/// be read again. (The fault harness saw an acknowledged follow-up never
/// run after PostgreSQL restarted: "queued runs dropped: task unreadable".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_follow_up_runs_after_the_store_could_not_be_read() {
    let agent = Arc::new(Interrupting {
        gate: tokio::sync::Notify::new(),
        working: tokio::sync::Notify::new(),
    });
    let (server, store) = flaky_server_with(agent.clone()).await;
    let mut client = server.client().await;
    let (task, mut stream) = support::subscribed_while_working(&mut client, &agent.working).await;
    // The follow-up: queued behind the running run, committed.
    let queued = within(
        "the follow-up",
        send_task(&mut client, request("", on(&task, "answer"), true)),
    )
    .await;
    assert_eq!(state_of(&queued), TaskState::Working);
    // The run asks for input (committed) ...
    agent.gate.notify_one();
    loop {
        let event = within("the question", stream.message())
            .await
            .unwrap()
            .expect("the stream ended before the question");
        if describe(&event) == "status:TASK_STATE_INPUT_REQUIRED" {
            break;
        }
    }
    // ... then the store goes away, the run's last status is refused, and
    // the run ends while the task cannot be read.
    store.down.store(true, Ordering::SeqCst);
    store.unreadable.store(true, Ordering::SeqCst);
    agent.gate.notify_one();
    // The run's end reads the task at most four times by itself (the
    // reload after the refused write, the end's checks, the dispatch of
    // the queue); more reads are the queued run's retries. A queue dropped
    // at the first refused read makes no more, and this wait times out.
    refused_reads_reach(&store, 6).await;
    store.down.store(false, Ordering::SeqCst);
    store.unreadable.store(false, Ordering::SeqCst);
    // The queued follow-up runs once the task can be read again.
    let (_, answered) = settled(&mut client, "", &task.id).await;
    assert_eq!(state_of(&answered), TaskState::Completed, "{answered:?}");
    assert_eq!(status_text(&answered), "answered");
}

/// An agent's last events, emitted in one poll after its earlier ones
/// were committed and their flush was over, are written by its run's end
/// (`sink::Driven`, issue 32). When that write fails, the task is failed
/// naming the store's error as the agent's last changes lost, not as an
/// agent that stopped while WORKING. (With the write made before the
/// run's end took its barrier, the lost changes went unreported.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_of_a_runs_last_events_names_the_store_error() {
    let agent = Arc::new(Gated {
        gate: tokio::sync::Notify::new(),
        working: tokio::sync::Notify::new(),
    });
    let (server, store) = flaky_server_with(agent.clone()).await;
    let mut client = server.client().await;
    let task = within(
        "send",
        send_task(&mut client, request("", user_message("go"), true)),
    )
    .await;
    within("working", agent.working.notified()).await;
    // WORKING committed (its flush ends under the lock of that write, so
    // it is over once the event is out): in the snapshot, or the next event.
    let (snapshot, mut stream) = support::subscribed(&mut client, "", &task.id).await;
    if describe(&snapshot) != "task:TASK_STATE_WORKING" {
        let next = within("working", stream.message()).await.unwrap().unwrap();
        assert_eq!(describe(&next), "status:TASK_STATE_WORKING");
    }
    store.fail.store(true, Ordering::SeqCst);
    agent.gate.notify_one();
    // A subscriber of the task as the write fails is told so (its stream
    // ends with the store's error); only then is the task's end read, by
    // a subscription made after the failure (one made before it would
    // end the same way instead of following the task to FAILED).
    let err = support::stream_error(&mut stream).await;
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let (_, failed) = settled(&mut client, "", &task.id).await;
    assert_eq!(state_of(&failed), TaskState::Failed);
    let text = status_text(&failed);
    assert!(
        text.contains("last changes could not be stored") && text.contains("(injected)"),
        "the status names the lost changes and the store's error: {text}"
    );
    server.stop().await;
}

/// `WORKING`, then, once `go` is notified, an artifact and INPUT_REQUIRED
/// without waiting for their commits; `emitted` is notified after them.
struct Stepwise {
    go: tokio::sync::Notify,
    emitted: tokio::sync::Notify,
}

#[async_trait]
impl AgentExecutor for Stepwise {
    async fn execute(&self, _ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        sink.status(TaskState::Working, None).await?;
        self.go.notified().await;
        sink.artifact_text("a1", "result", "done", false, true)
            .await?;
        sink.status(TaskState::InputRequired, Some("more?")).await?;
        self.emitted.notify_one();
        Ok(())
    }
}

/// Events emitted while their task's create is still being written are
/// applied before the task is stored, and log no changes: the write that
/// carries them after the create is whole, readers meanwhile see the task
/// exactly as the create stored it, and the store ends with every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_emitted_while_their_tasks_create_is_written_are_stored_whole() {
    let agent = Arc::new(Stepwise {
        go: tokio::sync::Notify::new(),
        emitted: tokio::sync::Notify::new(),
    });
    let (server, store) = flaky_server_with(agent.clone()).await;
    store.hold_creates.store(true, Ordering::SeqCst);
    store.hold_updates.store(true, Ordering::SeqCst);
    let mut client = server.client().await;
    let mut streamer = client.clone();
    let opened = tokio::spawn(async move {
        streamer
            .send_streaming_message(request("", user_message("go"), false))
            .await
    });
    // The create (SUBMITTED, then WORKING) is in the store's hands ...
    within("the create, held", store.create_waiting.notified()).await;
    // ... when the agent emits the rest.
    agent.go.notify_one();
    within("the agent's other events", agent.emitted.notified()).await;
    store.hold_creates.store(false, Ordering::SeqCst);
    store.creates_gate.add_permits(1);
    let mut stream = within("the stream", opened)
        .await
        .unwrap()
        .unwrap()
        .into_inner();
    let first = within("the snapshot", stream.message())
        .await
        .unwrap()
        .unwrap();
    let Some(a2a_lifecycle::proto::stream_response::Payload::Task(snapshot)) = first.payload else {
        panic!("a task first: {first:?}")
    };
    let id = snapshot.id;
    // The next write carries the events applied before the create was
    // stored: it is the whole record.
    within("the next write, held", store.update_waiting.notified()).await;
    assert!(
        store.held_update_whole.load(Ordering::SeqCst),
        "a write of events that logged no changes must store the whole record"
    );
    // Meanwhile a reader sees what the create stored, nothing after it.
    let read = within("get, during the write", get_task(&mut client, "", &id))
        .await
        .unwrap();
    assert_eq!(state_of(&read), TaskState::Working);
    assert!(read.artifacts.is_empty(), "{read:?}");
    let stored = store.inner.get("", &id).await.unwrap().unwrap();
    assert_eq!(stored.version, 1);
    assert_eq!(read, stored.record.task, "a reader sees the stored task");
    // So does a subscriber's snapshot, taken from the task kept in memory.
    let (first, watcher) = subscribed(&mut client, "", &id).await;
    let Some(a2a_lifecycle::proto::stream_response::Payload::Task(watched)) = first.payload else {
        panic!("a task first: {first:?}")
    };
    assert_eq!(
        watched, stored.record.task,
        "a subscriber sees the stored task"
    );
    store.hold_updates.store(false, Ordering::SeqCst);
    store.updates_gate.add_permits(1);
    // The stream ends once the task waits for input (spec §3.1.2).
    let rest = within("the rest of the stream", collect(stream))
        .await
        .unwrap();
    assert_eq!(
        describe_all(&rest),
        [
            "status:TASK_STATE_WORKING",
            "artifact:a1+last",
            "status:TASK_STATE_INPUT_REQUIRED"
        ]
    );
    let watched = within("the subscription's events", collect(watcher))
        .await
        .unwrap();
    assert_eq!(
        describe_all(&watched),
        ["artifact:a1+last", "status:TASK_STATE_INPUT_REQUIRED"]
    );
    let done = within("get, after", get_task(&mut client, "", &id))
        .await
        .unwrap();
    assert_eq!(state_of(&done), TaskState::InputRequired);
    assert_eq!(done.artifacts.len(), 1, "{done:?}");
    let stored = store.inner.get("", &id).await.unwrap().unwrap();
    assert_eq!(stored.version, 2);
    assert_eq!(done, stored.record.task, "the store holds every event");
    server.stop().await;
}
