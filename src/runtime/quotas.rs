//! Per-principal quotas, as the operator sets them in the `--auth` file
//! ([`crate::store::Quota`]): how many of its tasks may be open at once
//! (checked when a message would create one), and how long one may wait
//! for input (swept: a task waiting longer fails). A store shared by
//! replicas counts and sweeps every replica's tasks.

use std::time::{Duration, SystemTime};

use super::{TaskKey, TaskManager, store_error};
use crate::error::A2aError;
use crate::lifecycle::Cause;
use crate::store::{Caller, status_key, time_key};
use crate::wkt::Timestamp;

/// Waiting tasks the sweep looks at per call, oldest first; the next
/// sweep takes the rest.
pub const SWEEP_BATCH: usize = 1000;

impl TaskManager {
    /// RESOURCE_EXHAUSTED (limit `MAX_OPEN_TASKS`) when `caller` already
    /// has its `max_open_tasks` tasks not yet ended, in every tenant.
    /// Checked before a message creates a task; concurrent messages may
    /// each pass it before either task exists.
    pub(crate) async fn check_open_tasks(&self, caller: &Caller) -> Result<(), A2aError> {
        let Some(max) = caller.quota.max_open_tasks else {
            return Ok(());
        };
        if caller.name.is_empty() {
            return Ok(());
        }
        let max = max as usize;
        let open = self
            .shared
            .store
            .count_open_owned(&caller.name, max)
            .await
            .map_err(store_error)?;
        if open < max {
            return Ok(());
        }
        Err(A2aError::ResourceExhausted {
            message: format!(
                "{:?} has {open} tasks not yet ended, its limit (max_open_tasks): \
                 one must end (complete, or be canceled) before another starts",
                crate::error::cut(&caller.name, crate::error::MAX_ECHO_BYTES)
            ),
            task_id: None,
            limit: "MAX_OPEN_TASKS",
        })
    }

    /// Fails each task that has waited for input (INPUT_REQUIRED,
    /// AUTH_REQUIRED) longer than its owner's `max_input_wait`
    /// (`wait_of(owner)`), as of `now`; returns how many. Only tasks
    /// waiting longer than `shortest` (the shortest limit set) are read,
    /// at most `SWEEP_BATCH`. A task that moved on meanwhile is left
    /// alone: the check is made again under its lock.
    pub async fn expire_input_waits(
        &self,
        now: SystemTime,
        shortest: Duration,
        wait_of: impl Fn(&str) -> Option<Duration>,
    ) -> Result<u64, A2aError> {
        let oldest = Timestamp::from(now - shortest);
        let waiting = self
            .shared
            .store
            .waiting_before(&oldest, SWEEP_BATCH)
            .await
            .map_err(store_error)?;
        let mut failed = 0;
        for task in waiting {
            let Some(limit) = wait_of(&task.owner) else {
                continue;
            };
            let cutoff = time_key(&Timestamp::from(now - limit));
            if task.since >= cutoff {
                continue;
            }
            let message = format!(
                "No input arrived within {}, the owner's max_input_wait.",
                humantime::format_duration(limit)
            );
            let live = self.shared.live_or_insert(TaskKey {
                tenant: task.tenant,
                id: task.task_id,
            });
            let expired = live
                .fail_when(&self.shared, &message, Cause::Timeout, |r| {
                    r.state().is_interrupted() && status_key(&r.task) < cutoff
                })
                .await?;
            failed += u64::from(expired);
        }
        if failed > 0 {
            tracing::info!(
                failed,
                "failed tasks that waited for input past their owner's limit"
            );
        }
        Ok(failed)
    }
}
