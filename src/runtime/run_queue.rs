//! A live task's runs: at most one executor at a time, follow-up messages
//! queued behind it in history order (spec §3.2.2), and on a store shared
//! by replicas the claim on the task's runs that decides which replica
//! starts the next one.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Shared;
use super::live::{FAIL_RETRY_FIRST, FAIL_RETRY_MAX, LiveTask, Queued, RunClaim, RunRequest};
use super::loaded::{Loaded, Signal, StateGuard};
use crate::agent::RequestContext;
use crate::error::A2aError;

impl LiveTask {
    /// Claims the task's runs for the queued run waiting here
    /// ([`crate::store::Coordination::claim_run`]), then dispatches it. While
    /// another replica holds them, the run waits: its release is announced
    /// ([`super::TaskManager::follow_changes`]), and the claim is tried
    /// again at every look at followed tasks in any case.
    async fn claim_runs(self: Arc<Self>, shared: Arc<Shared>) {
        // Only spawned with replicas; a store of one process would hold
        // the runs already (one run per task at a time, in memory).
        let claimed = match shared.replicas() {
            Some(replicas) => replicas.claim_run(&self.key.tenant, &self.key.id).await,
            None => Ok(Some(0)),
        };
        self.runs().claim = match claimed {
            Ok(Some(_)) => RunClaim::Ready,
            _ => RunClaim::Free,
        };
        match claimed {
            // The previous holder's last writes may not be here yet: the
            // run starts from the task as it is now.
            Ok(Some(version)) if self.behind(version) => {
                self.catch_up(shared).await;
            }
            Ok(Some(_)) => {
                if let Ok(mut guard) = self.lock_loaded(&shared).await {
                    self.dispatch_locked(&shared, guard.as_mut().expect("loaded"));
                }
            }
            Ok(None) => {
                tracing::debug!(task_id = %self.key.id, "queued run waits for another replica's run");
                self.watch_if_followed(&shared);
            }
            Err(e) => {
                tracing::debug!(task_id = %self.key.id, error = %e, "claiming the task's runs failed; tried again at the next look");
            }
        }
    }

    /// Releases the task's runs ([`crate::store::Coordination::release_run`]),
    /// retried with backoff while the store refuses (a replica holding
    /// them would keep every other from running the task), then dispatches
    /// whatever was queued here meanwhile.
    async fn release_runs(self: Arc<Self>, shared: Arc<Shared>) {
        let mut delay = FAIL_RETRY_FIRST;
        while let Some(replicas) = shared.replicas()
            && let Err(e) = replicas.release_run(&self.key.tenant, &self.key.id).await
        {
            tracing::warn!(task_id = %self.key.id, error = %e, retry_in = ?delay, "releasing the task's runs failed");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                // The lease ends with the process; so does the claim.
                _ = shared.shutdown.cancelled() => break,
            }
            delay = (delay * 2).min(FAIL_RETRY_MAX);
        }
        self.runs().claim = RunClaim::Free;
        if let Ok(mut guard) = self.lock_loaded(&shared).await {
            self.dispatch_locked(&shared, guard.as_mut().expect("loaded"));
        }
    }

    /// Gives back the task's runs the orphan sweep took
    /// ([`crate::store::Coordination::take_runs`]) without ending the task,
    /// as after a run, unless a run of this process claims them
    /// meanwhile (it releases them itself).
    pub(crate) fn give_back_taken_runs(self: &Arc<Self>, shared: &Arc<Shared>) {
        let mut runs = self.runs();
        if runs.claim == RunClaim::Free {
            runs.claim = RunClaim::Releasing;
            drop(runs);
            tokio::spawn(self.clone().release_runs(shared.clone()));
        }
    }

    /// How many follow-up messages wait for a run.
    pub(crate) fn queued(&self) -> usize {
        self.runs().queue.len()
    }

    /// Whether a queued run here waits for the claim on the task's runs,
    /// which another replica holds: worth trying again after any change.
    pub(crate) fn waits_to_run(&self) -> bool {
        let runs = self.runs();
        runs.waiting() && runs.claim == RunClaim::Free
    }

    /// The first run of a new task, started by its creating message.
    pub(crate) fn begin_first_run(&self, cancel: CancellationToken) {
        let mut runs = self.runs();
        runs.active = true;
        // A create holds its task for the first run (on a store of one
        // process the claim is never looked at).
        runs.claim = RunClaim::Held;
        self.current_run
            .store(1, std::sync::atomic::Ordering::Relaxed);
        runs.reserved = 1;
        runs.cancel = Some(cancel);
        drop(runs);
        self.advance(|p| {
            p.runs_started = 1;
            p.run_status_seq = p.status_seq;
        });
    }

    /// Reserves the run of the follow-up message just submitted under
    /// `guard` (so runs are numbered in history order); it starts once that
    /// message is committed and every earlier run has ended. Returns the
    /// run's number.
    pub(crate) fn queue_run_locked(&self, guard: &mut StateGuard<'_>, request: RunRequest) -> u64 {
        let mut runs = self.runs();
        runs.reserved += 1;
        let seq = runs.reserved;
        runs.queue.push_back(Queued {
            seq,
            request,
            committed: false,
        });
        drop(runs);
        if let Some(last) = guard.as_mut().and_then(|l| l.pending.last_mut()) {
            last.follow_up = Some(seq);
        }
        seq
    }

    /// The current run ended: starts the next queued one, if any may run.
    pub(crate) async fn finish_run(self: &Arc<Self>, shared: &Arc<Shared>) {
        let ended = {
            let mut runs = self.runs();
            runs.active = false;
            runs.cancel = None;
            self.current_run.load(std::sync::atomic::Ordering::Relaxed)
        };
        self.advance(|p| p.runs_finished = p.runs_finished.max(ended));
        self.watch_if_followed(shared);
        if let Err(e) = self.try_dispatch(shared).await {
            // Read again with backoff, off the run that ended.
            tracing::warn!(task_id = %self.key.id, error = %e, "queued runs wait: task unreadable; reading it again");
            tokio::spawn(self.clone().dispatch_when_readable(shared.clone()));
        }
    }

    /// Starts the next queued run if the task can be read; the store's
    /// error when it cannot and a queued run waits. A task that no longer
    /// exists (purged, or never stored) drops its queue: its waiters are
    /// told their runs ended.
    async fn try_dispatch(self: &Arc<Self>, shared: &Arc<Shared>) -> Result<(), A2aError> {
        match self.lock_loaded(shared).await {
            Ok(mut guard) => {
                let loaded = guard.as_mut().expect("loaded");
                self.dispatch_locked(shared, loaded);
                Ok(())
            }
            Err(e) if self.runs().queue.is_empty() => {
                tracing::debug!(task_id = %self.key.id, error = %e, "task unreadable after its run; nothing queued");
                Ok(())
            }
            Err(e @ A2aError::TaskNotFound { .. }) => {
                tracing::error!(task_id = %self.key.id, error = %e, "queued runs dropped: task not found");
                self.drop_queue();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the task again, with backoff, until its queued runs can be
    /// dispatched. Its queued messages are committed and acknowledged:
    /// dropping them because the store could not be read for a moment (a
    /// restart, a cut, this replica's lease lapsed) would leave them in
    /// history unanswered for good (measured by the fault harness: an
    /// acknowledged follow-up never ran after "early eof" from a
    /// restarting PostgreSQL). Shutdown drops them, as it ends every run.
    async fn dispatch_when_readable(self: Arc<Self>, shared: Arc<Shared>) {
        let mut delay = FAIL_RETRY_FIRST;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shared.shutdown.cancelled() => {
                    self.drop_queue();
                    return;
                }
            }
            match self.try_dispatch(&shared).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(task_id = %self.key.id, error = %e, retry_in = ?delay, "queued runs still wait: task unreadable");
                }
            }
            delay = (delay * 2).min(FAIL_RETRY_MAX);
        }
    }

    /// Drops every queued run; their waiters are told they ended.
    fn drop_queue(&self) {
        let dropped = {
            let mut runs = self.runs();
            runs.queue.clear();
            runs.reserved
        };
        self.advance(|p| p.runs_finished = p.runs_finished.max(dropped));
    }

    /// Starts the next queued run when none is active and its message is
    /// committed. A terminal task starts none: its queued messages stay in
    /// history, unanswered; one about to be terminal starts none either. When
    /// nothing runs or waits and the task is interrupted, open streams are
    /// told the task is idle.
    pub(super) fn dispatch_locked(self: &Arc<Self>, shared: &Arc<Shared>, loaded: &mut Loaded) {
        let mut runs = self.runs();
        if runs.active {
            return;
        }
        if loaded.committed_state().is_terminal() {
            if !runs.queue.is_empty() {
                runs.queue.clear();
                let dropped = runs.reserved;
                drop(runs);
                self.advance(|p| p.runs_finished = p.runs_finished.max(dropped));
            }
            return;
        }
        if loaded.record.state().is_terminal() {
            // About to be terminal (a cancel not yet committed): start
            // nothing, and keep the queue until the commit decides. The
            // flush dispatches again after it, and so does a failed write.
            return;
        }
        let replicated = shared.replicas().is_some();
        if replicated && loaded.committed_state().is_active() {
            // Another replica's run has the task (this one has none):
            // the next run starts once that one has ended, caught up.
            return;
        }
        if replicated && runs.claim != RunClaim::Ready {
            // Another replica may hold the task for a run of a message it
            // got: claim the runs first (each replica saw the task not
            // active, so the state alone would let both start one). Held
            // already, the claim still settles the run it starts.
            if runs.waiting() && matches!(runs.claim, RunClaim::Free | RunClaim::Held) {
                runs.claim = RunClaim::Claiming;
                drop(runs);
                tokio::spawn(self.clone().claim_runs(shared.clone()));
                return;
            }
            if runs.claim != RunClaim::Held {
                return;
            }
        }
        if runs.queue.front().is_some_and(|q| q.committed) {
            if runs.claim == RunClaim::Ready {
                runs.claim = RunClaim::Held;
            }
            let Queued { seq, request, .. } = runs.queue.pop_front().expect("front");
            let cancelled = shared.run_token();
            runs.active = true;
            self.current_run
                .store(seq, std::sync::atomic::Ordering::Relaxed);
            runs.cancel = Some(cancelled.clone());
            drop(runs);
            self.advance(|p| {
                p.runs_started = seq;
                p.run_status_seq = p.status_seq;
            });
            let task = loaded.task().into_owned();
            let ctx = RequestContext {
                tenant: self.key.tenant.clone(),
                task_id: task.id.clone(),
                context_id: task.context_id.clone(),
                message: request.message,
                task: Some(task),
                metadata: request.metadata,
                accepted_output_modes: request.accepted_output_modes,
                cancelled,
            };
            shared.start_follow_up(self.clone(), request.agent, ctx, &request.trace);
            return;
        }
        if replicated && matches!(runs.claim, RunClaim::Held | RunClaim::Ready) && !runs.active {
            // Nothing to run here and the task interrupted: another
            // replica may run the next message.
            runs.claim = RunClaim::Releasing;
            tokio::spawn(self.clone().release_runs(shared.clone()));
        }
        if runs.idle()
            && loaded.committed_state().is_interrupted()
            && let Some(tx) = &loaded.events
            && tx.receiver_count() > 0
        {
            let _ = tx.send(Arc::new(Signal::Idle));
        }
    }
}
