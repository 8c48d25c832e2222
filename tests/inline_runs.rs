//! A new message's run is first polled inside the request that sent it,
//! and an agent that is done in that poll has its events committed there
//! too (issue 32: no task spawned for the run or its flush). What that
//! must not cost: a run that waits is moved to a task of its own, so a
//! slow agent never holds the request and a client that goes away never
//! stops the agent; events an agent emits from a task of its own, or past
//! the pending backlog in one poll, are still committed.

use crate::support;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use a2a_lifecycle::agent::{AgentError, AgentExecutor, AgentRouter, EventSink, RequestContext};
use a2a_lifecycle::lifecycle::HistoryLength;
use a2a_lifecycle::proto::{Task, TaskState};
use a2a_lifecycle::runtime::{MessageRequest, RuntimeConfig, SendOutcome, TaskHandle, TaskManager};
use a2a_lifecycle::store::{Caller, MemoryStore};
use support::*;

/// Past [`a2a_lifecycle::runtime::live::MAX_PENDING_EVENTS`]: the emitter waits
/// for a commit within its first poll.
const MANY: usize = 600;

/// `at-once`: an artifact and COMPLETED, nothing awaited in between.
/// `ask`: INPUT_REQUIRED at once.
/// `helper`: the same from a task the agent spawns and joins. `many`:
/// [`MANY`] artifact chunks, then COMPLETED. `wait`: WORKING, then waits
/// for `release`, then COMPLETED.
struct Inline {
    release: Arc<Notify>,
}

#[async_trait]
impl AgentExecutor for Inline {
    async fn execute(&self, ctx: RequestContext, sink: EventSink) -> Result<(), AgentError> {
        match ctx.text().as_str() {
            "helper" => {
                let helper = tokio::spawn(async move {
                    sink.artifact_text("r", "r", "ok", false, true).await?;
                    sink.status(TaskState::Completed, None).await
                });
                helper
                    .await
                    .map_err(|e| AgentError::Failed(e.to_string()))??;
            }
            "many" => {
                for i in 0..MANY {
                    sink.artifact_text("r", "r", &i.to_string(), i > 0, i + 1 == MANY)
                        .await?;
                }
                sink.status(TaskState::Completed, None).await?;
            }
            "ask" => sink.status(TaskState::InputRequired, Some("more?")).await?,
            "wait" => {
                sink.status(TaskState::Working, None).await?;
                self.release.notified().await;
                sink.status(TaskState::Completed, None).await?;
            }
            _ => {
                sink.artifact_text("r", "r", "ok", false, true).await?;
                sink.status(TaskState::Completed, None).await?;
            }
        }
        Ok(())
    }
}

fn agents(release: &Arc<Notify>) -> AgentRouter {
    AgentRouter::new().with(
        "",
        Arc::new(Inline {
            release: release.clone(),
        }),
    )
}

fn manager(release: &Arc<Notify>) -> TaskManager {
    TaskManager::new(
        Arc::new(MemoryStore::new()),
        agents(release),
        RuntimeConfig::default(),
    )
}

async fn send_request(
    manager: &TaskManager,
    message: a2a_lifecycle::proto::Message,
) -> Box<TaskHandle> {
    let outcome = within(
        "send",
        manager.send_message(
            "",
            &Caller::ANONYMOUS,
            MessageRequest::from(message),
            HistoryLength::All,
            false,
        ),
    )
    .await
    .expect("sent");
    match outcome {
        SendOutcome::Task(handle) => handle,
        SendOutcome::Message(m) => panic!("expected a task, got the message {m:?}"),
    }
}

async fn send(manager: &TaskManager, text: &str) -> Box<TaskHandle> {
    send_request(manager, user_message(text)).await
}

async fn stored(manager: &TaskManager, id: &str) -> Task {
    within(
        "get",
        manager.get_task("", &Caller::ANONYMOUS, id, HistoryLength::All),
    )
    .await
    .expect("the task is stored")
}

/// Waits, as a blocking send does, until the task is terminal (or its
/// run stopped), then reads it.
async fn settled(manager: &TaskManager, handle: Box<TaskHandle>) -> Task {
    let id = handle.snapshot.id.clone();
    within("settled", manager.wait(*handle))
        .await
        .expect("the run ends with the task terminal");
    stored(manager, &id).await
}

/// The tasks the runtime spawned over one send of `text` (its own count,
/// which needs `tokio_unstable`: `.cargo/config.toml`), and the task the
/// send answered with.
#[cfg(tokio_unstable)]
async fn spawns_of_a_send(manager: &TaskManager, text: &str) -> (u64, Task) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.spawned_tasks_count();
    let task = send(manager, text).await.snapshot;
    (metrics.spawned_tasks_count() - before, task)
}

/// The agent is done within its first poll: the request ran it and
/// committed its events itself, spawning no task (before: the run and
/// its flush, two tasks per send). The runtime's own count of spawned
/// tasks says so; it needs `tokio_unstable` (`.cargo/config.toml`).
#[cfg(tokio_unstable)]
#[tokio::test]
async fn a_run_done_in_its_first_poll_spawns_nothing() {
    let release = Arc::new(Notify::new());
    let manager = manager(&release);
    // A first send warms up whatever the runtime starts once.
    send(&manager, "at-once").await;
    let (spawned, task) = spawns_of_a_send(&manager, "at-once").await;
    assert_eq!(
        spawned, 0,
        "tasks spawned by a send whose agent is done at once"
    );
    // Answered with the task as created (spec §3.1.1), already completed
    // in the store by the time the answer is read.
    assert_eq!(state_of(&task), TaskState::Submitted);
    let task = stored(&manager, &task.id).await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(task.artifacts.len(), 1);
}

/// The agent is done within its first poll and its run then waits only
/// for the store's write (SQLite's writer thread): the request goes on
/// driving the run while it waits for its answer, so the run needs no
/// task of its own (before: one per send, woken by the writer and then
/// waking the request in turn).
#[cfg(tokio_unstable)]
#[tokio::test]
async fn a_run_waiting_for_its_write_is_driven_by_its_request() {
    let release = Arc::new(Notify::new());
    let dir = support::certs::scratch_dir("inline-runs-sqlite");
    let store = a2a_lifecycle::store::SqliteStore::open(dir.join("tasks.db"))
        .await
        .expect("the database opens");
    let manager = TaskManager::new(Arc::new(store), agents(&release), RuntimeConfig::default());
    send(&manager, "at-once").await;
    let (spawned, task) = spawns_of_a_send(&manager, "at-once").await;
    assert_eq!(
        spawned, 0,
        "tasks spawned by a send whose run waits only for its write"
    );
    let task = stored(&manager, &task.id).await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(task.artifacts.len(), 1);
}

/// An agent whose events come from a task it spawned (not from the poll
/// that runs it inline) still has them committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_from_the_agents_own_task_are_committed() {
    let release = Arc::new(Notify::new());
    let manager = manager(&release);
    let task = settled(&manager, send(&manager, "helper").await).await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(task.artifacts.len(), 1);
}

/// The same on one thread, where the agent's own task runs between the
/// polls of the request.
#[tokio::test]
async fn events_from_the_agents_own_task_are_committed_on_one_thread() {
    let release = Arc::new(Notify::new());
    let manager = manager(&release);
    let task = settled(&manager, send(&manager, "helper").await).await;
    assert_eq!(state_of(&task), TaskState::Completed);
}

/// An agent that emits more than the pending backlog without awaiting
/// anything else waits for a commit in the middle of its first poll: the
/// commit it waits for must still happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_past_the_backlog_in_one_poll_completes() {
    let release = Arc::new(Notify::new());
    let manager = manager(&release);
    let task = settled(&manager, send(&manager, "many").await).await;
    assert_eq!(state_of(&task), TaskState::Completed);
    let parts = &task.artifacts[0].parts;
    assert_eq!(parts.len(), MANY, "every chunk is kept");
}

/// A non-blocking send is answered while its agent still waits, and the
/// agent goes on after the answer (its run moved to a task of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_agent_does_not_hold_the_answer() {
    let release = Arc::new(Notify::new());
    let manager = manager(&release);
    let handle = send(&manager, "wait").await;
    assert_eq!(state_of(&handle.snapshot), TaskState::Submitted);
    assert_eq!(
        state_of(&stored(&manager, &handle.snapshot.id).await),
        TaskState::Working
    );
    release.notify_one();
    let task = settled(&manager, handle).await;
    assert_eq!(state_of(&task), TaskState::Completed);
}

/// A request dropped after its first poll (a client that went away) does
/// not take the agent's run with it. On one thread, so that nothing (the
/// flush of the agent's first event) can answer the request during that
/// poll.
#[tokio::test]
async fn a_request_dropped_after_its_first_poll_leaves_the_run_going() {
    let release = Arc::new(Notify::new());
    let manager = manager(&release);
    let message = user_message("wait");
    let message_id = message.message_id.clone();
    let first = answered_in_one_poll(&manager, message.clone()).await;
    assert!(
        !first,
        "the agent waits, so the request cannot be answered yet"
    );
    // A repeat of the message (spec §3.3.1) finds the task the dropped
    // request's run created, and waits for it with the agent released.
    let handle = send_request(&manager, message).await;
    release.notify_one();
    let task = settled(&manager, handle).await;
    assert_eq!(state_of(&task), TaskState::Completed);
    assert_eq!(task.history[0].message_id, message_id);
}

/// The same over gRPC with the server's own runtime: every flow above,
/// answered to a real client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_grpc_each_kind_of_run_completes() {
    let release = Arc::new(Notify::new());
    let server = TestServer::start_with(agents(&release), RuntimeConfig::default()).await;
    let mut client = server.client().await;
    for text in ["at-once", "helper", "many"] {
        let task = within(
            text,
            send_task(&mut client, request("", user_message(text), false)),
        )
        .await;
        assert_eq!(state_of(&task), TaskState::Completed, "{text}");
    }
    server.stop().await;
}

/// A streamed follow-up's run can be over before its request looks again
/// (it needs no task of its own now): the stream still opens with the
/// task as the message's commit left it and then carries the run's
/// events, because the handle is taken by that commit, before the run is
/// admitted. Repeated, since it is a race that the old order lost only
/// sometimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_follow_up_sees_its_quick_runs_events() {
    let release = Arc::new(Notify::new());
    let server = TestServer::start_with(agents(&release), RuntimeConfig::default()).await;
    let mut client = server.client().await;
    let task = within(
        "ask",
        send_task(&mut client, request("", user_message("ask"), false)),
    )
    .await;
    assert_eq!(state_of(&task), TaskState::InputRequired);
    for round in 0..40 {
        let mut follow_up = user_message("ask");
        follow_up.task_id = task.id.clone();
        let stream = within(
            "follow-up",
            client.send_streaming_message(request("", follow_up, false)),
        )
        .await
        .expect("streamed")
        .into_inner();
        let events = within("its events", collect(stream)).await.expect("events");
        assert_eq!(
            describe_all(&events),
            [
                "task:TASK_STATE_INPUT_REQUIRED",
                "status:TASK_STATE_INPUT_REQUIRED"
            ],
            "round {round}"
        );
    }
    server.stop().await;
}

const _: () = assert!(MANY > 2 * a2a_lifecycle::runtime::live::MAX_PENDING_EVENTS);
