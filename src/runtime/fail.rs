//! The server's own FAILED for a live task (recovery, shutdown, a lost
//! follow-up, a store that refused a write): written when a condition
//! holds under the task's lock, or retried until the store takes it, so no
//! task is left active with nothing to move it on.

use std::sync::Arc;

use super::Shared;
use super::live::{FAIL_RETRY_FIRST, FAIL_RETRY_MAX, LiveTask};
use super::loaded::Author;
use crate::error::A2aError;
use crate::lifecycle::{Cause, TaskRecord};
use crate::proto::TaskState;

impl LiveTask {
    /// Makes a task the store would not let the runtime fail FAILED once
    /// the store takes it (a full disk, a lost database): retried in the
    /// background with backoff ([`FAIL_RETRY_FIRST`] doubling up to
    /// [`FAIL_RETRY_MAX`]) while the task is active, so no task is left
    /// SUBMITTED or WORKING with nothing to move it on. Its streams already
    /// ended with the store's error when the write failed.
    pub(crate) fn fail_until_stored(
        self: Arc<Self>,
        shared: Arc<Shared>,
        message: String,
        cause: Cause,
    ) {
        tokio::spawn(async move {
            let mut delay = FAIL_RETRY_FIRST;
            loop {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(FAIL_RETRY_MAX);
                match self.fail_if_active(&shared, &message, cause).await {
                    Ok(failed) => {
                        if failed {
                            tracing::info!(task_id = %self.key.id, "task failed after the store recovered");
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(task_id = %self.key.id, error = %e, retry_in = ?delay, "store still refuses the task's failure");
                    }
                }
            }
        });
    }

    /// The server's own FAILED, with `message` as the status message, for a
    /// task still SUBMITTED or WORKING (recovery, shutdown, a failed store):
    /// committed before this returns. `Ok(false)`: the task was not active.
    pub(crate) async fn fail_if_active(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        message: &str,
        cause: Cause,
    ) -> Result<bool, A2aError> {
        self.fail_when(shared, message, cause, |r| r.state().is_active())
            .await
    }

    /// FAILS the task with `message` if, under its lock, `now_due` holds
    /// of its record; whether it did. `cause` is why, for the transition
    /// log.
    pub(crate) async fn fail_when(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        message: &str,
        cause: Cause,
        now_due: impl FnOnce(&TaskRecord) -> bool,
    ) -> Result<bool, A2aError> {
        let state = self.lock_loaded(shared).await?;
        if !now_due(&state.as_ref().expect("loaded").record) {
            return Ok(false);
        }
        let event = super::server_status(TaskState::Failed, message);
        self.apply(shared, state, event, Author::Server(cause))
            .await?;
        Ok(true)
    }

    /// Fails the task, still interrupted, for a follow-up's run that a
    /// dead replica owed it, unless a run of this process has taken the
    /// task up: a run starts under the task's lock (`dispatch_locked`),
    /// so it cannot start between the look and the write.
    pub(crate) async fn fail_lost_follow_up(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        message: &str,
        cause: Cause,
    ) -> Result<bool, A2aError> {
        self.fail_when(shared, message, cause, |r| {
            r.state().is_interrupted() && !self.runs().active
        })
        .await
    }
}
