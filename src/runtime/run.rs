//! Starting and supervising executor runs.
//!
//! Each run is one future that polls the executor under `catch_unwind`, so
//! an executor that panics never unwinds into the server and its task is
//! FAILED by [`RunSink::finish`]. (A supervisor task awaiting a second
//! task's `JoinHandle` would do the same at the cost of another spawn and
//! wake-up per run.)
//!
//! A new message's run is driven by the request that sent it
//! ([`start_new`]) while the request waits for its answer; what is left
//! of the run once the request is answered, or dropped, is moved to a
//! task of its own. So a client that goes away never stops an agent, and
//! a slow agent never holds a request past its answer; but an agent that
//! is done at once (the bench agent, any agent that answers from what it
//! has) costs no task, with the memory store or a durable one whose
//! writer answers from its own thread (issue 32). The events an agent
//! emits while its run's driver polls it ([`Driven`], in the sink) leave
//! their flush to the driver: it starts the flush in a task of its own as
//! soon as the agent waits, which gathers every event of the poll into
//! one write as the flush's own turn did, or runs it itself at the run's
//! end ([`RunSink::finish`]), which with a store that answers at once
//! commits them without a task either.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;

use futures_util::FutureExt;
use tokio::sync::{Mutex, oneshot};
use tracing::Instrument;

use super::answer::NewMessageReply;
use super::live::RunRequest;
use super::origin::MessageClaim;
use super::sink::{Driven, RunSink, SinkInner, SinkMode};
use super::{LOST_MESSAGE_FAILURE, SendOutcome, Shared, TaskKey};
use crate::agent::{AgentExecutor, RequestContext};
use crate::error::A2aError;
use crate::lifecycle::HistoryLength;
use crate::telemetry::RunTrace;

/// Starts a run for a message without a task id and waits for the agent's
/// first event, which decides between a task and a direct reply. `claim`
/// (the message's idempotency claim) is resolved with that answer.
pub(super) async fn start_new(
    shared: &Arc<Shared>,
    tenant: &str,
    owner: &str,
    request: RunRequest,
    history: HistoryLength,
    subscribe: bool,
    claim: MessageClaim,
) -> Result<SendOutcome, A2aError> {
    let run = new_run(shared, tenant, owner, request, history, subscribe, claim);
    let mut execution = Driving(Some(prepare(
        shared, run.agent, run.ctx, run.mode, &run.trace,
    )));
    let mut answer = run.answer;
    // The request drives the run while it waits for its answer; what is
    // left of the run once the answer is in, or once the request is
    // dropped, goes on in a task of its own (`Driving`'s drop).
    let answered = std::future::poll_fn(|cx| {
        execution.poll_run(cx);
        Pin::new(&mut answer).poll(cx)
    })
    .await;
    drop(execution);
    unanswered_as_error(answered)
}

/// A run its request drives, until the run is over or the request is
/// done with it: then (the request answered, or dropped by a client that
/// went away) a run not yet over is spawned as it stands, so no client
/// stops an agent and no agent holds a request past its answer. A run
/// that only waits for its store's write (a durable store's writer
/// answers from another thread) costs no task and no second wake-up.
struct Driving(Option<Run>);

impl Driving {
    fn poll_run(&mut self, cx: &mut Context<'_>) {
        if let Some(run) = &mut self.0
            && run.as_mut().poll(cx).is_ready()
        {
            self.0 = None;
        }
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        let Some(run) = self.0.take() else { return };
        // Outside a runtime (it is shutting down and dropping the request
        // with it) the run is dropped too: nothing would poll it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // A spawned task is polled once at least, so the run takes
            // its wake-ups over from the request's.
            runtime.spawn(run);
        }
    }
}

/// A message an earlier run of which ended without its task stored
/// ([`crate::store::MessageClaim::Lost`]: its replica declared dead, or the
/// store refusing the create): its task is created FAILED with
/// [`LOST_MESSAGE_FAILURE`], and the agent is not run. The earlier run's
/// agent may have acted (its side effects, if any, happened); running the
/// message again would run it twice. Every repeat of the message is then
/// answered with this task.
pub(super) async fn record_lost(
    shared: &Arc<Shared>,
    tenant: &str,
    owner: &str,
    request: RunRequest,
    history: HistoryLength,
    subscribe: bool,
    claim: MessageClaim,
) -> Result<SendOutcome, A2aError> {
    let run = new_run(shared, tenant, owner, request, history, subscribe, claim);
    let (span, carried) = run.trace.start(
        &run.ctx.tenant,
        &run.ctx.task_id,
        &run.ctx.context_id,
        shared.agent_label(&run.ctx.tenant),
    );
    tracing::warn!(parent: &span, task_id = %run.ctx.task_id, message_id = %run.ctx.message.message_id,
        "an earlier run of this message ended without its task stored: recorded FAILED, not run again");
    let sink = sink(shared, &run.ctx, run.mode, carried.map(|t| t.to_string()));
    sink.finish(Some(LOST_MESSAGE_FAILURE.to_owned()))
        .instrument(span)
        .await;
    answer(run.answer).await
}

/// A run for a message without a task id, ready to start: the task's ids
/// chosen, its sink waiting for the first event, and the request's answer
/// to come.
struct NewRun {
    agent: Arc<dyn AgentExecutor>,
    ctx: RequestContext,
    mode: SinkMode,
    trace: RunTrace,
    answer: oneshot::Receiver<Result<SendOutcome, A2aError>>,
}

fn new_run(
    shared: &Arc<Shared>,
    tenant: &str,
    owner: &str,
    request: RunRequest,
    history: HistoryLength,
    subscribe: bool,
    claim: MessageClaim,
) -> NewRun {
    let RunRequest {
        agent,
        mut message,
        metadata,
        accepted_output_modes,
        push_config,
        protocol,
        trace,
    } = request;
    // UUIDv7: unique like v4, but time-ordered, so new tasks sit together at
    // the end of the stores' key indexes instead of dirtying a random page
    // per write.
    let task_id = uuid::Uuid::now_v7().to_string();
    // spec §3.4.1: a client-chosen context_id is kept; otherwise one is made.
    if message.context_id.is_empty() {
        message.context_id = uuid::Uuid::now_v7().to_string();
    }
    message.task_id = task_id.clone();
    crate::telemetry::record_call("", &task_id, &message.context_id);
    let (tx, answer) = oneshot::channel();
    let ctx = RequestContext {
        tenant: tenant.to_owned(),
        task_id: task_id.clone(),
        context_id: message.context_id.clone(),
        message: message.clone(),
        task: None,
        metadata,
        accepted_output_modes,
        cancelled: shared.run_token(),
    };
    let mode = SinkMode::BeforeFirstEvent {
        message: Box::new(message),
        owner: owner.to_owned(),
        push_config: push_config.map(|c| (c, protocol)),
        history,
        subscribe,
        reply: Some(NewMessageReply::new(tx, Some(claim))),
    };
    NewRun {
        agent,
        ctx,
        mode,
        trace,
        answer,
    }
}

async fn answer(
    answer: oneshot::Receiver<Result<SendOutcome, A2aError>>,
) -> Result<SendOutcome, A2aError> {
    unanswered_as_error(answer.await)
}

/// A run's answer, or the error of a run that ended without one.
fn unanswered_as_error(
    answered: Result<Result<SendOutcome, A2aError>, oneshot::error::RecvError>,
) -> Result<SendOutcome, A2aError> {
    answered.unwrap_or_else(|_| {
        Err(A2aError::Internal(
            "the agent run ended without an answer".into(),
        ))
    })
}

/// Runs `agent` on `ctx` in the background with a sink in `mode`, in a
/// `run` span that continues `trace` ([`crate::telemetry`]).
pub(super) fn spawn(
    shared: &Arc<Shared>,
    agent: Arc<dyn AgentExecutor>,
    ctx: RequestContext,
    mode: SinkMode,
    trace: &RunTrace,
) {
    tokio::spawn(prepare(shared, agent, ctx, mode, trace));
}

/// A run of `agent` on `ctx`, as a future to poll or spawn: boxed, since
/// tokio copies a future whole on its way into a task and as the task
/// ends, and a run's holds the agent's request and its sink.
type Run = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The run of `agent` on `ctx` with a sink in `mode`, in a `run` span that
/// continues `trace`; its run counted from now.
fn prepare(
    shared: &Arc<Shared>,
    agent: Arc<dyn AgentExecutor>,
    ctx: RequestContext,
    mode: SinkMode,
    trace: &RunTrace,
) -> Run {
    let (span, carried) = trace.start(
        &ctx.tenant,
        &ctx.task_id,
        &ctx.context_id,
        shared.agent_label(&ctx.tenant),
    );
    // The task named here too: text lines leave the span out by default.
    tracing::debug!(parent: &span, task_id = %ctx.task_id, message_id = %ctx.message.message_id, "agent run started");
    let sink = sink(shared, &ctx, mode, carried.map(|t| t.to_string()));
    let timeout = shared.config.task_timeout;
    let running = RunningGuard::new(shared, &sink.inner.key);
    let counted = shared.config.metrics.as_ref().map(|m| m.tasks.run());
    Box::pin(
        async move {
            let _running = running;
            let _counted = counted;
            // The executor's future is polled only here; a panic in it leaves
            // nothing half-updated that this task reads afterwards (the sink's
            // state is behind its own locks).
            let mut execution = Driven {
                sink: &sink,
                agent: std::panic::AssertUnwindSafe(agent.execute(ctx, sink.handle()))
                    .catch_unwind(),
            };
            let result = match timeout {
                None => execution.await,
                Some(limit) => tokio::select! {
                    result = &mut execution => result,
                    _ = tokio::time::sleep(limit) => {
                        sink.time_out(format!(
                            "The task timed out: still active {} after its run started.",
                            humantime::format_duration(limit)
                        ))
                        .await;
                        execution.await
                    }
                },
            };
            let failure = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("agent failed: {e}")),
                Err(payload) => {
                    let text = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    tracing::error!(task_id = %sink.inner.key.id, panic = %text, "agent panicked");
                    Some(format!("agent panicked: {text}"))
                }
            };
            tracing::debug!(task_id = %sink.inner.key.id, "agent run ended");
            // What the agent emitted in its last poll is written by the
            // run's end, once it has its barrier on it.
            sink.finish(failure).await;
        }
        .instrument(span),
    )
}

/// The sink of a run on `ctx`, starting in `mode`.
fn sink(
    shared: &Arc<Shared>,
    ctx: &RequestContext,
    mode: SinkMode,
    trace: Option<String>,
) -> RunSink {
    RunSink {
        inner: Arc::new(SinkInner {
            shared: shared.clone(),
            key: TaskKey {
                tenant: ctx.tenant.clone(),
                id: ctx.task_id.clone(),
            },
            context_id: ctx.context_id.clone(),
            cancel: ctx.cancelled.clone(),
            // A run whose task already exists is a follow-up's.
            follow_up: matches!(mode, SinkMode::Live { .. }),
            mode: Mutex::new(mode),
            trace,
            owed_flush: Default::default(),
        }),
    }
}

/// Counts a run among the server's running ones until its task ends (see
/// [`super::TaskManager::drain_runs`]).
struct RunningGuard {
    shared: Arc<Shared>,
    key: TaskKey,
}

impl RunningGuard {
    fn new(shared: &Arc<Shared>, key: &TaskKey) -> Self {
        // Watched only while the server drains.
        super::update_watched(&shared.running, |r| {
            *r.entry(key.clone()).or_default() += 1;
        });
        RunningGuard {
            shared: shared.clone(),
            key: key.clone(),
        }
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        super::update_watched(&self.shared.running, |r| {
            if let Some(n) = r.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    r.remove(&self.key);
                }
            }
        });
    }
}

impl Shared {
    /// Starts the run of a follow-up message that `live` admitted from its
    /// queue (the task exists, so the run's sink starts live).
    pub(crate) fn start_follow_up(
        self: &Arc<Self>,
        live: Arc<super::live::LiveTask>,
        agent: Arc<dyn crate::agent::AgentExecutor>,
        ctx: RequestContext,
        trace: &crate::telemetry::RunTrace,
    ) {
        let mode = SinkMode::Live { live, answer: None };
        spawn(self, agent, ctx, mode, trace);
    }
}
