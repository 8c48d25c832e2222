//! SendMessage's path through the runtime (spec §3.1.1, §3.1.2): a new
//! message, a follow-up to a task, a repeat of either, and waiting for a
//! blocking answer. Each step calls down (origin claims, the live task's
//! commit and run queue, the store) and never back up into this file.

use std::sync::Arc;

use super::live::{LiveTask, MAX_QUEUED_MESSAGES, Progress, RunRequest};
use super::loaded::Author;
use super::origin::{ClaimedInStore, FirstOrRepeat, OriginOutcome};
use super::{
    MessageRequest, SendOutcome, Shared, TaskHandle, TaskKey, TaskManager, answer, ends_wait, run,
    store_error, task_state,
};
use crate::error::A2aError;
use crate::lifecycle::{Cause, HistoryLength, TaskEvent};
use crate::proto::{Message, Task};
use crate::store::{Caller, StoreError, origin_key};

impl TaskManager {
    /// Accepts a client message (already validated) for `tenant`.
    /// With a `task_id` it continues that task (one `caller` may see);
    /// otherwise the agent decides between a task, owned by `caller`, and a
    /// direct reply. `subscribe` attaches the event stream to the returned
    /// handle. Never waits for an executor run.
    pub async fn send_message(
        &self,
        tenant: &str,
        caller: &Caller,
        request: MessageRequest,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<SendOutcome, A2aError> {
        let agent = self.shared.agents.route(tenant).ok_or_else(|| {
            A2aError::invalid(
                "tenant",
                format!(
                    "no agent is served under tenant {tenant:?}; served tenants: {:?}",
                    self.shared.agents.tenants()
                ),
            )
        })?;
        crate::telemetry::record_agent(self.shared.agent_label(tenant));
        // A new task's ids are recorded once chosen (`run::start_new`).
        if !request.message.task_id.is_empty() {
            crate::telemetry::record_call(
                "",
                &request.message.task_id,
                &request.message.context_id,
            );
        }
        let mut push_config = request.push_config;
        // A config needs an id (the lifecycle refuses one without); the
        // service gives one, a library caller may not have.
        if let Some(config) = &mut push_config
            && config.id.is_empty()
        {
            config.id = uuid::Uuid::now_v7().to_string();
        }
        let request = RunRequest {
            agent,
            message: request.message,
            metadata: request.metadata,
            accepted_output_modes: request.accepted_output_modes,
            push_config,
            protocol: request.protocol,
            trace: crate::telemetry::RunTrace::here(request.trace),
        };
        if request.message.task_id.is_empty() {
            self.send_new(tenant, caller, request, history, subscribe)
                .await
        } else {
            self.send_follow_up(tenant, caller, request, history, subscribe)
                .await
        }
    }

    /// A message without a task id. A repeat of one that already created a
    /// task (same tenant, caller and message_id, spec §3.3.1) is answered
    /// with that task before any run starts; concurrent repeats wait for the
    /// first one's answer. The store refusing a second task for the same
    /// message stays the last word (see `RunSink::create_task`). Keys are
    /// per caller ([`origin_key`]): another principal's message id is
    /// neither found nor replayed.
    async fn send_new(
        &self,
        tenant: &str,
        caller: &Caller,
        request: RunRequest,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<SendOutcome, A2aError> {
        self.check_open_tasks(caller).await?;
        let message_id = request.message.message_id.clone();
        let origin = origin_key(&caller.name, &message_id);
        loop {
            let claim = match self.shared.claim_origin(tenant, origin.clone()) {
                FirstOrRepeat::First(claim) => claim,
                FirstOrRepeat::Repeat(answer) => match answer.await {
                    Ok(OriginOutcome::Task(id)) => {
                        return self
                            .live_or_insert(tenant, &id)
                            .duplicate_handle(&self.shared, history, subscribe)
                            .await;
                    }
                    Ok(OriginOutcome::Message(m)) => return Ok(SendOutcome::Message(m)),
                    Ok(OriginOutcome::Failed(e)) => return Err(e),
                    // The first request's run ended without an answer.
                    Err(_) => continue,
                },
            };
            let (claim, lost) = match self
                .claim_in_store(tenant, caller, &message_id, claim)
                .await?
            {
                ClaimedInStore::Run(claim) => (claim, false),
                ClaimedInStore::Lost(claim) => (claim, true),
                ClaimedInStore::Task(id) => {
                    return self
                        .live_or_insert(tenant, &id)
                        .duplicate_handle(&self.shared, history, subscribe)
                        .await;
                }
            };
            if lost {
                // Boxed: a rare path whose future would otherwise make every
                // send's future larger (copied as it is moved).
                return Box::pin(run::record_lost(
                    &self.shared,
                    tenant,
                    &caller.name,
                    request,
                    history,
                    subscribe,
                    claim,
                ))
                .await;
            }
            return run::start_new(
                &self.shared,
                tenant,
                &caller.name,
                request,
                history,
                subscribe,
                claim,
            )
            .await;
        }
    }

    /// A message continuing a task (spec §3.4.3): checked and committed to
    /// history at once, its run queued behind the current one.
    async fn send_follow_up(
        &self,
        tenant: &str,
        caller: &Caller,
        request: RunRequest,
        history: HistoryLength,
        subscribe: bool,
    ) -> Result<SendOutcome, A2aError> {
        let mut request = request;
        let push_config = request.push_config.take();
        let message_id = request.message.message_id.clone();
        let message = &mut request.message;
        let live = self.live_or_insert(tenant, &message.task_id);
        let mut state = live.lock_visible(&self.shared, caller).await?;
        let loaded = state.as_mut().expect("loaded");
        // A repeat of a message the task already holds is answered with the
        // task, whatever its state, without a second run.
        if LiveTask::holds_message_locked(loaded, &message.message_id) {
            drop(state);
            return live
                .duplicate_handle(&self.shared, history, subscribe)
                .await;
        }
        follow_up_admissible(&loaded.record, message, live.queued())?;
        message.context_id = loaded.record.task.context_id.clone();
        // The config first, in the same flush: the message's run and its
        // events are already notified.
        if let Some(config) = push_config {
            let configs = &loaded.record.push_configs;
            if configs.len() >= crate::lifecycle::MAX_PUSH_CONFIGS
                && !configs.iter().any(|c| c.id == config.id)
            {
                return Err(A2aError::invalid(
                    "configuration.task_push_notification_config",
                    format!(
                        "the task already has {} push notification configs",
                        crate::lifecycle::MAX_PUSH_CONFIGS
                    ),
                ));
            }
            // Its commit is awaited through the message's, which follows
            // it in the same task's order.
            drop(live.submit_locked(
                &self.shared,
                &mut state,
                TaskEvent::PushConfig(crate::lifecycle::PushConfigChange::Set(
                    config,
                    request.protocol,
                )),
                Author::Server(Cause::Client),
            )?);
        }
        // Applied again by the lifecycle core, which refuses a terminal task.
        let commit = live.submit_locked(
            &self.shared,
            &mut state,
            TaskEvent::UserMessage(message.clone()),
            Author::Server(Cause::FollowUp),
        )?;
        let run = live.queue_run_locked(&mut state, request);
        let (tx, handle) = tokio::sync::oneshot::channel();
        if let Some(last) = state.as_mut().and_then(|l| l.pending.last_mut()) {
            last.handle_to = Some(answer::FollowUpAnswer {
                history,
                subscribe,
                run,
                tx,
            });
        }
        if self.shared.replicas().is_some() {
            self.shared
                .queued
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(live.key().clone(), live.clone());
        }
        drop(state);
        // The client is told (snapshot, stream) only once the message is
        // committed; the flush that commits it admits its run.
        match commit.wait().await {
            Ok(()) => {}
            // Another writer (a replica) moved the task first and the
            // message no longer applies: why, as if it had come after.
            Err(StoreError::Conflict { .. }) => {
                let state = live.lock_loaded(&self.shared).await?;
                let loaded = state.as_ref().expect("loaded");
                // The same message reached another replica first: a
                // repeat, answered with the task.
                if LiveTask::holds_message_locked(loaded, &message_id) {
                    drop(state);
                    return live
                        .duplicate_handle(&self.shared, history, subscribe)
                        .await;
                }
                accepts_messages(&loaded.record)?;
                return Err(A2aError::Unavailable(format!(
                    "task {:?} changed while the message was being added; send it again",
                    loaded.record.task.id
                )));
            }
            Err(e) => return Err(store_error(e)),
        }
        // Sent by the flush that committed the message, under the lock it
        // committed it under.
        let handle = handle.await.map_err(|_| {
            A2aError::Internal("a committed follow-up's handle was not sent".into())
        })?;
        Ok(SendOutcome::Task(Box::new(handle)))
    }

    /// Waits until the task reaches a terminal state, or an interrupted
    /// state during or after the request's own run, or that run ends (spec
    /// §3.2.2 blocking mode); returns the task then. When that cannot be
    /// reached (shutdown, a failed store write, a run that ended with its
    /// task still active because failing it failed too) the answer is
    /// UNAVAILABLE, not a task in an active state.
    pub async fn wait(&self, handle: TaskHandle) -> Result<Task, A2aError> {
        if handle.settled {
            return Ok(handle.snapshot);
        }
        let (run, base) = (handle.run, handle.baseline);
        let mut progress = handle.live.progress.subscribe();
        let shutdown = self.shared.shutdown.clone();
        let failed = |p: &Progress| p.write_failures > base.write_failures;
        let reached = tokio::select! {
            biased;
            _ = progress.wait_for(|p| {
                p.state.is_terminal()
                    || p.runs_finished >= run
                    || (p.runs_started == run
                        && p.state.is_interrupted()
                        && p.status_seq > p.run_status_seq)
                    || failed(p)
            }) => true,
            _ = shutdown.cancelled() => false,
        };
        let task = match handle.live.take_if_last(&self.shared, handle.history) {
            // Nothing else holds the task, so no run is queued behind the
            // request's own: the task as it is now is the answer.
            Ok(task) => task,
            Err(live) => {
                let mut task = live.view(&self.shared, handle.history, true).await?;
                if reached && !failed(&progress.borrow()) && !ends_wait(&task) {
                    // The request's own run ended where it should, but a run
                    // queued behind it has moved the task on since: answer at
                    // that run's next stop instead of with a task in motion.
                    let settled = tokio::select! {
                        biased;
                        _ = progress.wait_for(|p| p.state.ends_blocking_wait() || failed(p)) => true,
                        _ = shutdown.cancelled() => false,
                    };
                    if settled {
                        task = live.view(&self.shared, handle.history, true).await?;
                    }
                }
                task
            }
        };
        let state = task_state(&task);
        if state.is_terminal() || (reached && state.is_interrupted()) {
            return Ok(task);
        }
        let why = if shutdown.is_cancelled() {
            "the server is shutting down"
        } else {
            "a change to it could not be stored"
        };
        Err(A2aError::Unavailable(format!(
            "task {:?} is still {} and will not finish for this request: {why}; \
             read it later with GetTask",
            task.id,
            state.as_str_name()
        )))
    }
}

impl Shared {
    /// Answers a repeat of a message that already created task `key` with
    /// that task, off the caller (it may have to load the task).
    pub(crate) fn answer_repeat(
        self: &Arc<Self>,
        key: TaskKey,
        history: HistoryLength,
        subscribe: bool,
        reply: answer::NewMessageReply,
    ) {
        let shared = self.clone();
        tokio::spawn(async move {
            let existing = shared.live_or_insert(key);
            let outcome = existing.duplicate_handle(&shared, history, subscribe).await;
            reply.send(outcome);
        });
    }
}

/// A terminal task accepts no more messages (spec §3.1.1).
fn accepts_messages(record: &crate::lifecycle::TaskRecord) -> Result<(), A2aError> {
    let current = record.state();
    if current.is_terminal() {
        return Err(A2aError::unsupported(
            format!(
                "task {:?} is in terminal state {} and accepts no more messages",
                record.task.id,
                current.as_str_name()
            ),
            Some(&record.task.id),
        ));
    }
    Ok(())
}

/// Whether a follow-up `message` may join the task `record` (its working
/// copy: a cancel accepted but not yet committed counts), with `queued`
/// messages already waiting for a run: not terminal, the same context, room
/// in the queue.
fn follow_up_admissible(
    record: &crate::lifecycle::TaskRecord,
    message: &Message,
    queued: usize,
) -> Result<(), A2aError> {
    let task = &record.task;
    accepts_messages(record)?;
    if !message.context_id.is_empty() && message.context_id != task.context_id {
        return Err(A2aError::invalid(
            "message.context_id",
            format!(
                "context_id {:?} does not match task {:?}, whose context_id is {:?}",
                message.context_id, task.id, task.context_id
            ),
        ));
    }
    if queued >= MAX_QUEUED_MESSAGES {
        return Err(A2aError::ResourceExhausted {
            message: format!(
                "task {:?} already has {MAX_QUEUED_MESSAGES} messages waiting for its \
                 running agent; retry once it has taken some",
                task.id
            ),
            task_id: Some(task.id.clone()),
            limit: "MAX_QUEUED_MESSAGES",
        });
    }
    Ok(())
}
