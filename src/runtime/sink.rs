//! The run's side of the [`EventSink`] (`RunSink`): how an executor's
//! events reach the task.
//!
//! For a new message the sink starts `BeforeFirstEvent`: the first event decides
//! between a direct reply (no task) and a task, which is then created in
//! SUBMITTED, committed, handed to the waiting request together with its
//! subscription, and only then changed by the event. After that every event
//! goes through `LiveTask::submit_locked`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Mutex;

use super::answer::{NewMessageReply, NewTaskAnswer};
use super::live::{ApplyFailure, LiveTask};
use super::loaded::{Author, Loaded};
use super::{SendOutcome, Shared, TaskKey, server_status};
use crate::agent::sink::SinkTarget;
use crate::agent::{EventSink, SinkError};
use crate::error::A2aError;
use crate::lifecycle::{Cause, HistoryLength, Protocol, TaskEvent, TaskRecord};
use crate::proto::{Message, Role, TaskState};
use crate::store::StoreError;

/// An event accepted into its task's pending writes.
struct Submitted {
    /// Resolves when it is committed.
    commit: super::live::Commit,
    /// The task held so many uncommitted events that the emitter waits.
    backlogged: bool,
    /// It carries the answer owed to the creating request (its write
    /// creates the task).
    creates: bool,
}

/// The agent-facing error for a refused event of the task `task_id`.
fn sink_error(task_id: &str, failure: ApplyFailure) -> SinkError {
    match failure {
        ApplyFailure::Rejected(e) => SinkError::refused(task_id, e),
        ApplyFailure::Store(e) => SinkError::Store(e),
        ApplyFailure::TooLarge { task_id, size } => SinkError::TooLarge {
            task_id,
            size,
            limit: super::live::MAX_TASK_BYTES,
        },
    }
}

pub(crate) enum SinkMode {
    /// No event yet: a new message, waiting for what its run does first.
    BeforeFirstEvent {
        message: Box<Message>,
        /// The principal sending it: the owner of the task it may create.
        owner: String,
        /// A push notification config sent with it: the task it may create
        /// starts with it, so even its first event is notified; with the
        /// protocol version of the client that sent it.
        push_config: Option<(crate::proto::TaskPushNotificationConfig, Protocol)>,
        history: HistoryLength,
        subscribe: bool,
        reply: Option<NewMessageReply>,
    },
    /// The task exists; this run is its active one (see `live::Runs`).
    Live {
        live: Arc<LiveTask>,
        /// Owed to the request that created the task until an event of
        /// this run commits (the first one may be refused).
        answer: Option<NewTaskAnswer>,
    },
    /// The agent answered with a direct message.
    Replied,
    /// The run is over.
    Done,
}

pub(crate) struct SinkInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: TaskKey,
    pub(crate) context_id: String,
    /// The run's cancellation token, registered on the task once it exists
    /// so CancelTask can reach the executor.
    pub(crate) cancel: tokio_util::sync::CancellationToken,
    pub(crate) mode: Mutex<SinkMode>,
    /// The run was started by a follow-up message (the transition log's
    /// cause when the agent resumes the task, [`Author::Agent`]).
    pub(crate) follow_up: bool,
    /// The `traceparent` the run's writes leave on its task, for its
    /// webhooks ([`crate::telemetry::RunTrace::start`]).
    pub(crate) trace: Option<String>,
    /// The flush the run's driver owes for events its agent emitted while
    /// it polled it ([`Driven`]): started as the poll ends, or run by
    /// the driver itself once the agent is done.
    pub(crate) owed_flush: std::sync::Mutex<Option<Arc<LiveTask>>>,
}

/// A run's sink: the [`SinkTarget`] behind the executor's [`EventSink`],
/// and what the runtime itself does to the run's task (time it out, finish
/// it). Cheap to clone.
#[derive(Clone)]
pub(crate) struct RunSink {
    pub(crate) inner: Arc<SinkInner>,
}

#[async_trait::async_trait]
impl SinkTarget for RunSink {
    fn task_id(&self) -> &str {
        &self.inner.key.id
    }

    fn context_id(&self) -> &str {
        &self.inner.context_id
    }

    async fn emit(&self, event: TaskEvent) -> Result<(), SinkError> {
        let author = Author::Agent {
            follow_up: self.inner.follow_up,
        };
        self.emit_as(event, author).await
    }

    async fn reply(&self, message: Message) -> Result<(), SinkError> {
        self.reply_directly(message).await
    }
}

impl RunSink {
    /// The handle the executor gets.
    pub(crate) fn handle(&self) -> EventSink {
        EventSink::new(Arc::new(self.clone()))
    }

    fn task_id(&self) -> &str {
        &self.inner.key.id
    }

    /// Answers a new message with a direct agent message and no task
    /// (spec §3.1.1). Only possible as the first event of a new message.
    async fn reply_directly(&self, mut message: Message) -> Result<(), SinkError> {
        let mut mode = self.inner.mode.lock().await;
        match &mut *mode {
            SinkMode::BeforeFirstEvent { reply, .. } => {
                message.role = Role::Agent as i32;
                if message.message_id.is_empty() {
                    message.message_id = uuid::Uuid::new_v4().to_string();
                }
                message.context_id = self.inner.context_id.clone();
                message.task_id.clear();
                if let Some(reply) = reply.take() {
                    reply.send(Ok(SendOutcome::Message(message)));
                }
                *mode = SinkMode::Replied;
                Ok(())
            }
            SinkMode::Live { .. } => Err(SinkError::ReplyOnTask),
            SinkMode::Replied => Err(SinkError::AlreadyReplied),
            SinkMode::Done => Err(SinkError::RunEnded),
        }
    }

    /// Applies one event to the run's task (creating the task on the first
    /// one), then waits for its commit when it must: for the server's own
    /// events, and when the task's backlog is full. An agent's event is
    /// otherwise accepted in order and committed in the background,
    /// batched with its neighbours.
    async fn emit_as(&self, event: TaskEvent, author: Author) -> Result<(), SinkError> {
        let mut mode = self.inner.mode.lock().await;
        let live = match &mut *mode {
            // Boxed: once per task, where every event's future would
            // otherwise carry its state (several kilobytes, copied as the
            // boxed emit is made).
            SinkMode::BeforeFirstEvent { .. } => Box::pin(self.create_task(&mut mode)).await,
            SinkMode::Live { live, .. } => live.clone(),
            SinkMode::Replied => return Err(SinkError::AlreadyReplied),
            SinkMode::Done => return Err(SinkError::RunEnded),
        };
        // On an error the answer is still owed, and still in the sink: a
        // later event (at worst the FAILED that ends the run) carries it.
        let submitted = self.submit(&live, &mut mode, event, author).await?;
        drop(mode);
        match submitted {
            Submitted {
                commit,
                creates: true,
                ..
            } if matches!(author, Author::Server(_)) => match commit.wait().await {
                Ok(()) => Ok(()),
                Err(StoreError::DuplicateMessage { task_id }) => {
                    Err(SinkError::Duplicate { task_id })
                }
                Err(e) => Err(SinkError::Store(e)),
            },
            Submitted { creates: true, .. } => Ok(()),
            Submitted {
                commit, backlogged, ..
            } => {
                if backlogged || matches!(author, Author::Server(_)) {
                    commit.wait().await?;
                }
                Ok(())
            }
        }
    }

    /// Accepts `event` into the task's pending writes, with the answer
    /// owed to the creating request if the sink still holds it. The answer
    /// stays in the sink until an event carrying it is accepted (so an
    /// emit dropped while it waited for the lock loses nothing); the new
    /// task exists once that write commits, and only then is the client
    /// answered.
    async fn submit(
        &self,
        live: &Arc<LiveTask>,
        mode: &mut SinkMode,
        event: TaskEvent,
        author: Author,
    ) -> Result<Submitted, SinkError> {
        let shared = &self.inner.shared;
        let mut state = match live.lock_loaded(shared).await {
            Ok(state) => state,
            Err(A2aError::TaskNotFound { task_id }) => {
                return Err(SinkError::Store(StoreError::NotFound(task_id)));
            }
            Err(other) => return Err(SinkError::Store(StoreError::Internal(other.to_string()))),
        };
        let backlogged = LiveTask::backlogged(&state);
        if let (Some(trace), Some(loaded)) = (&self.inner.trace, state.as_mut())
            && loaded.record.trace != *trace
        {
            loaded.record.trace = trace.clone();
        }
        // Emitted from the poll of the run's own driver: the driver
        // starts the flush once the poll is over (with everything the
        // agent emits in it), or runs it itself when the agent is done.
        let driver = driving(&self.inner);
        let (commit, owed) = live
            .submit_locked_from(shared, &mut state, event, author, driver)
            .map_err(|f| sink_error(&self.inner.key.id, f))?;
        if owed {
            *self
                .inner
                .owed_flush
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
        }
        let answer = match mode {
            SinkMode::Live { answer, .. } => answer.take(),
            _ => None,
        };
        let creates = answer.is_some();
        if let Some(answer) = answer {
            LiveTask::answer_on_commit_locked(&mut state, answer);
        }
        Ok(Submitted {
            commit,
            backlogged,
            creates,
        })
    }

    /// BeforeFirstEvent -> Live: installs the new task (SUBMITTED) without writing
    /// it. Its first flush creates it in the store together with the
    /// agent's first events; the request is answered after that commit,
    /// with a snapshot and subscription taken before any event applied.
    async fn create_task(&self, mode: &mut SinkMode) -> Arc<LiveTask> {
        let SinkMode::BeforeFirstEvent {
            message,
            owner,
            push_config,
            history,
            subscribe,
            reply,
        } = std::mem::replace(mode, SinkMode::Done)
        else {
            unreachable!("create_task before the first event only")
        };
        let shared = &self.inner.shared;
        let key = &self.inner.key;
        let record = TaskRecord::submitted(
            key.id.clone(),
            self.inner.context_id.clone(),
            *message,
            super::now(),
        )
        .owned_by(owner);
        let mut record = record;
        if let Some((config, protocol)) = push_config {
            // Cannot fail: a new record has room, and a checked config
            // has an id.
            if let Err(e) = record.set_push_config(config, protocol) {
                tracing::error!(error = %e, "a send's push notification config was not kept");
            }
        }
        let live = shared.live_or_insert(key.clone());
        // A new id: no other run, no queue.
        live.begin_first_run(self.inner.cancel.clone());
        let mut state = live.install(Loaded::uncreated(record)).await;
        // The snapshot is the task as created, taken when its first write
        // commits (`LiveTask::committed`): no copy of it here.
        let handle = live.handle_of(
            state.as_mut().expect("installed"),
            crate::proto::Task::default(),
            history,
            subscribe,
            Some(1),
        );
        drop(state);
        let answer = NewTaskAnswer::new(key.tenant.clone(), handle, history, subscribe, reply);
        *mode = SinkMode::Live {
            live: live.clone(),
            answer: Some(answer),
        };
        live
    }

    fn owed_flush(&self) -> Option<Arc<LiveTask>> {
        self.inner
            .owed_flush
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Starts the flush the driver owes, in a task of its own: the agent
    /// waits for something, and its events must not wait with it.
    pub(crate) fn start_owed_flush(&self) {
        if let Some(live) = self.owed_flush() {
            tokio::spawn(live.flush(self.inner.shared.clone()));
        }
    }

    /// Runs the flush the driver owes, the agent being done: with a store
    /// that answers at once, its events are committed (and a creating
    /// request answered) before this returns.
    async fn flush_owed_now(&self) {
        if let Some(live) = self.owed_flush() {
            live.flush_now(self.inner.shared.clone()).await;
        }
    }

    /// `--task-timeout` expired: a task still active is FAILED with
    /// `reason` (its subscribers see the terminal event) and the executor is
    /// cancelled. An interrupted task is left alone: it waits on the client,
    /// not on the agent.
    pub(crate) async fn time_out(&self, reason: String) {
        let event = server_status(TaskState::Failed, reason.clone());
        let mode = self.inner.mode.lock().await;
        let failed = match &*mode {
            SinkMode::BeforeFirstEvent { .. } => {
                drop(mode);
                self.emit_as(event, Author::Server(Cause::Timeout))
                    .await
                    .is_ok()
            }
            SinkMode::Live { live, .. } => {
                let live = live.clone();
                drop(mode);
                let shared = &self.inner.shared;
                let active = match live.lock_loaded(shared).await {
                    Ok(state) => state.as_ref().expect("loaded").record.state().is_active(),
                    Err(_) => false,
                };
                active
                    && match self.emit_as(event, Author::Server(Cause::Timeout)).await {
                        Ok(()) => true,
                        Err(e) => {
                            // The timeout still applies when the store
                            // fails: the task is failed once it takes it.
                            live.fail_until_stored(
                                shared.clone(),
                                format!("{reason}; a store write failed: {e}"),
                                Cause::Timeout,
                            );
                            true
                        }
                    }
            }
            SinkMode::Replied | SinkMode::Done => false,
        };
        if failed {
            self.inner.cancel.cancel();
        }
    }

    /// Ends the run: a task left active (or any task, when the executor
    /// failed) moves to FAILED with `failure` as its status message, so no
    /// task is left stuck; once everything the agent emitted is committed,
    /// waiters are told the run is over.
    pub(crate) async fn finish(&self, failure: Option<String>) {
        let (live, no_event) = match &*self.inner.mode.lock().await {
            SinkMode::Live { live, .. } => (Some(live.clone()), false),
            SinkMode::BeforeFirstEvent { .. } => (None, true),
            _ => (None, false),
        };
        let (reason, flushed) = match &live {
            None if no_event => (
                Some(
                    failure
                        .clone()
                        .unwrap_or_else(|| "the agent ended without responding".to_owned()),
                ),
                None,
            ),
            None => (None, None),
            Some(live) => self.what_the_end_calls_for(live, &failure).await,
        };
        // The agent's last events, when its last poll left their flush to
        // the run (`Driven`): written only now, after the barrier above was
        // taken on them, so that a write that fails is reported as this
        // run's last changes lost (`settle_last_events`), and before any
        // event of the end waits for its commit.
        self.flush_owed_now().await;
        match reason {
            // The agent never answered, failed, or left its task active.
            Some(reason) => self.fail_at_end(live.as_ref(), reason).await,
            None => {
                if let (Some(flushed), Some(live)) = (flushed, &live) {
                    self.settle_last_events(live, flushed).await;
                }
            }
        }
        self.close_run().await;
    }

    /// Why the run's task must fail at the end of the run, if it must, and
    /// a barrier on the agent's events (all committed before waiters hear
    /// the run is over).
    async fn what_the_end_calls_for(
        &self,
        live: &Arc<LiveTask>,
        failure: &Option<String>,
    ) -> (Option<String>, Option<super::live::Commit>) {
        let shared = &self.inner.shared;
        let mut state = match live.lock_loaded(shared).await {
            Ok(state) => state,
            Err(A2aError::TaskNotFound { .. }) => return (None, None),
            Err(e) => {
                // The store could not be read (a write of the run's failed
                // the same way, and the working copy went with it): whether
                // the task is still active is not known here. It is failed
                // once the store answers, if it still is, so that no task
                // is left WORKING on a live replica with no run.
                let reason = failure.as_deref().unwrap_or("the agent's run ended");
                live.clone().fail_until_stored(
                    shared.clone(),
                    format!("{reason}; the task could not be read when the run ended: {e}"),
                    Cause::Server,
                );
                return (None, None);
            }
        };
        let current = state.as_ref().expect("loaded").record.state();
        let flushed = LiveTask::barrier_locked(&mut state);
        let reason = match (failure, current) {
            (_, s) if s.is_terminal() => None,
            (Some(f), _) => Some(f.clone()),
            (None, s) if s.is_active() && shared.shutdown.is_cancelled() => Some(format!(
                "the server shut down while the task was {}",
                s.as_str_name()
            )),
            // Neither shut down nor cancelled (a cancelled task is
            // terminal): the run was stopped because this replica lost its
            // lease on the shared store.
            (None, s) if s.is_active() && self.inner.cancel.is_cancelled() => Some(format!(
                "this replica lost its lease on the shared store and stopped the run while \
                 the task was {}",
                s.as_str_name()
            )),
            (None, s) if s.is_active() => Some(format!(
                "the agent stopped while the task was {}",
                s.as_str_name()
            )),
            (None, _) => None,
        };
        (reason, Some(flushed))
    }

    /// FAILED with `reason`, so no task is left stuck (and a creating
    /// request still gets its task); retried until the store takes it.
    async fn fail_at_end(&self, live: Option<&Arc<LiveTask>>, reason: String) {
        let event = server_status(TaskState::Failed, reason.clone());
        if let Err(e) = self.emit_as(event, Author::Server(Cause::Server)).await {
            tracing::error!(task_id = %self.task_id(), error = %e, "could not fail task; retrying until the store takes it");
            if let Some(live) = live {
                live.clone().fail_until_stored(
                    self.inner.shared.clone(),
                    format!("{reason}; a store write failed: {e}"),
                    Cause::Server,
                );
            }
        }
    }

    /// Waits for the agent's last events to commit. If they were dropped
    /// (streams and waiters were told), the task is back where the store
    /// has it, which may be active with no run left to move it on: it is
    /// failed, naming the store's error, once the store takes writes.
    async fn settle_last_events(&self, live: &Arc<LiveTask>, flushed: super::live::Commit) {
        let Err(e) = flushed.wait().await else {
            return;
        };
        let shared = &self.inner.shared;
        // Unreadable (the store that refused the write is still away):
        // maybe active, which the failure looks at again once it can.
        let maybe_active = match live.lock_loaded(shared).await {
            Ok(state) => state.as_ref().expect("loaded").record.state().is_active(),
            Err(A2aError::TaskNotFound { .. }) => false,
            Err(_) => true,
        };
        if maybe_active {
            live.clone().fail_until_stored(
                shared.clone(),
                format!("the agent's last changes could not be stored: {e}"),
                Cause::Server,
            );
        }
    }

    /// The run is over: the next queued run may start, and a request still
    /// owed an answer (the agent emitted nothing) gets an error.
    async fn close_run(&self) {
        let mut mode = self.inner.mode.lock().await;
        if let SinkMode::Live { live, .. } = &*mode {
            // Admits the next queued run, if any.
            live.finish_run(&self.inner.shared).await;
        }
        if let SinkMode::BeforeFirstEvent { reply, .. } = &mut *mode
            && let Some(reply) = reply.take()
        {
            reply.send(Err(A2aError::Internal(
                "the agent ended without responding".into(),
            )));
        }
        *mode = SinkMode::Done;
    }
}

thread_local! {
    /// The sink whose agent a run's driver is polling on this thread now
    /// ([`Driven`]), null when none: its events' flush is the driver's to
    /// start. A thread-local, not a field: an agent may hand its sink to a
    /// task of its own, whose events no driver is there to flush.
    static DRIVING: Cell<*const SinkInner> = const { Cell::new(std::ptr::null()) };
}

/// Whether the run of `sink` is being polled by its driver on this thread
/// now ([`RunSink`]'s emits ask).
fn driving(sink: &SinkInner) -> bool {
    DRIVING.with(|d| std::ptr::eq(d.get(), sink))
}

/// A run's agent, polled with its sink marked as driven: the events it
/// emits in a poll leave their flush to this driver, which starts it in a
/// task of its own once the poll ends with the agent waiting (so they are
/// committed however long it waits), and leaves it to the run's end
/// ([`RunSink::flush_owed_now`]) when the poll ends the agent.
pub(crate) struct Driven<'a, F> {
    pub(crate) sink: &'a RunSink,
    pub(crate) agent: F,
}

impl<F: Future + Unpin> Future for Driven<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Puts back the sink driven before (an agent may run another
        /// agent's request inline, through the library), even if the poll
        /// unwinds.
        struct Restore(*const SinkInner);
        impl Drop for Restore {
            fn drop(&mut self) {
                DRIVING.with(|d| d.set(self.0));
            }
        }
        let this = &mut *self;
        let restore = Restore(DRIVING.with(|d| d.replace(Arc::as_ptr(&this.sink.inner))));
        let poll = Pin::new(&mut this.agent).poll(cx);
        drop(restore);
        if poll.is_pending() {
            this.sink.start_owed_flush();
        }
        poll
    }
}
