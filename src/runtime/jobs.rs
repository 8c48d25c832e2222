//! The runtime's background jobs: start-up recovery of orphaned tasks,
//! draining runs at shutdown, retention, following other replicas' writes,
//! and stopping runs when this process loses its lease.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::wkt::Timestamp;

use crate::error::A2aError;
use crate::lifecycle::Cause;

use super::{CATCH_UP_EVERY, TaskKey, TaskManager, store_error};
use crate::store::StoreError;

/// The status message of tasks failed at start-up because the process that
/// ran them is gone.
pub const RESTART_FAILURE: &str =
    "The server restarted while this task was active; its run was lost. Send the request again.";

/// The status message of the task recorded for a new message whose run
/// ended without its task stored (its replica declared dead, or the store
/// refusing the create): the agent may have acted on it, so it is not run
/// again (`run::record_lost`).
pub const LOST_MESSAGE_FAILURE: &str = "An earlier run of this message ended before its \
     task was stored (the replica running it stopped, or could not write). Whether the agent \
     acted on the message is not known, so it was not run again. To run it, send it again \
     with a new messageId.";

/// The status message of an interrupted task failed because a follow-up
/// message in its history was committed by a replica that stopped before
/// its run started: no replica will run it, and the task would otherwise
/// wait for input its client already gave.
pub const LOST_FOLLOW_UP_FAILURE: &str = "A follow-up message to this task was accepted by \
     a replica that stopped before running it, so it was never run. The task cannot go on \
     without it; to go on, send the request again as a new task.";

impl TaskManager {
    /// Start-up recovery: tasks left SUBMITTED or WORKING by a previous
    /// process have no executor any more, so they move to FAILED with
    /// [`RESTART_FAILURE`]. Interrupted tasks stay as they are: they wait on
    /// the client, and a message resumes them. Returns how many failed.
    ///
    /// Run it before serving. With a store shared by replicas
    /// ([`crate::store::Coordination::lease`]) only the tasks of replicas whose lease has
    /// expired are orphaned, and [`TaskManager::run_maintenance`] looks
    /// for them again while serving; a live replica's tasks are never
    /// touched. There an interrupted task one of whose follow-ups such a
    /// replica was to run fails too, with [`LOST_FOLLOW_UP_FAILURE`].
    pub async fn fail_orphaned_tasks(&self) -> Result<usize, A2aError> {
        let replicas = self.shared.replicas();
        // A lone process runs every task it has, so at its start each
        // active one is left from the process before it.
        let orphaned = match replicas {
            Some(replicas) => replicas.orphaned_tasks().await,
            None => self.shared.store.active_tasks().await,
        }
        .map_err(store_error)?;
        // A replica failing a dead one's tasks takes them over; a lone
        // process cleans up after the one before it.
        let sweep = if replicas.is_some() {
            Cause::Takeover
        } else {
            Cause::OrphanSweep
        };
        let mut failed = 0;
        for (tenant, stored) in orphaned {
            let live = self.live_or_insert(&tenant, &stored.record.task.id);
            // Failed only if still in the class it was found in: an
            // interrupted task another replica's run has taken up since is
            // that run's to end.
            let done = if stored.record.state().is_interrupted() {
                // The task's runs first: the process that took the
                // follow-up may have rejoined under a new id and be
                // starting its run now (its claim settles what it owed
                // under the old id). Whichever of the two claims first
                // goes on; the other leaves the task alone.
                if let Some(replicas) = replicas
                    && !replicas
                        .take_runs(&tenant, &stored.record.task.id)
                        .await
                        .map_err(store_error)?
                {
                    continue;
                }
                let failed = live
                    .fail_lost_follow_up(&self.shared, LOST_FOLLOW_UP_FAILURE, sweep)
                    .await;
                if !matches!(failed, Ok(true)) {
                    live.give_back_taken_runs(&self.shared);
                }
                failed?
            } else {
                live.fail_if_active(&self.shared, RESTART_FAILURE, sweep)
                    .await?
            };
            if done {
                failed += 1;
            }
        }
        Ok(failed)
    }

    /// After shutdown: waits up to `grace` for the cancelled runs to end
    /// (each fails its task with the shutdown message as it ends), then
    /// fails every task whose executor ignored the cancellation itself, so
    /// no task is left active in the store when the process exits. Returns
    /// how many tasks were failed here.
    pub async fn drain_runs(&self, grace: Duration) -> usize {
        self.shared.shutdown.cancel();
        let mut running = self.shared.running.subscribe();
        let drained = tokio::time::timeout(grace, running.wait_for(HashMap::is_empty))
            .await
            .is_ok();
        if drained {
            return 0;
        }
        let left: Vec<TaskKey> = self.shared.running.borrow().keys().cloned().collect();
        let message = format!(
            "the server shut down while the task was running; its agent did not stop within {}",
            humantime::format_duration(grace)
        );
        let mut failed = 0;
        for key in left {
            let live = self.shared.live_or_insert(key.clone());
            match live
                .fail_if_active(&self.shared, &message, Cause::Server)
                .await
            {
                Ok(true) => failed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(task_id = %key.id, error = %e, "could not fail task at shutdown")
                }
            }
        }
        if failed > 0 {
            tracing::warn!(failed, "failed tasks whose agents ignored the shutdown");
        }
        failed
    }

    /// Retention: deletes terminal tasks whose status is older than
    /// `RuntimeConfig::retain`; returns how many. Purged tasks are
    /// TASK_NOT_FOUND from then on.
    pub async fn purge_expired(&self) -> Result<u64, A2aError> {
        let Some(retain) = self.shared.config.retain else {
            return Ok(0);
        };
        let cutoff = Timestamp::from(SystemTime::now() - retain);
        let purged = self
            .shared
            .store
            .purge_terminal_before(&cutoff)
            .await
            .map_err(store_error)?;
        if purged > 0 {
            tracing::info!(purged, "retention: purged terminal tasks");
        }
        Ok(purged)
    }

    /// With a store shared by replicas ([`crate::store::Coordination::changes`]), until
    /// shutdown: follows the other replicas' writes to the tasks held
    /// here, so that their subscribers and waiters get those events in
    /// order (`LiveTask::catch_up`). A notification is only a wake-up:
    /// after a gap in them, and every [`CATCH_UP_EVERY`] whatever comes,
    /// every followed task is caught up from the store by version.
    pub async fn follow_changes(self) {
        use crate::store::WriteNotice;
        use tokio::sync::broadcast::error::RecvError;
        let Some(mut changes) = self.shared.replicas().map(|r| r.changes()) else {
            return;
        };
        let shutdown = self.shared.shutdown.clone();
        let mut ticks = tokio::time::interval(CATCH_UP_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Some(true): every loaded task (after a gap, a run here may
            // have missed a cancel); Some(false): the followed ones.
            let all = tokio::select! {
                change = changes.recv() => match change {
                    Ok(WriteNotice::Task { tenant, task_id, version }) => {
                        let key = TaskKey { tenant, id: task_id };
                        // Behind, or a queued run waits for the claim
                        // this may be the release of.
                        if let Some(live) = self.shared.find_live(&key)
                            && (live.behind(version) || live.waits_to_run())
                        {
                            tokio::spawn(live.catch_up(self.shared.clone()));
                        }
                        None
                    }
                    Ok(WriteNotice::Outbox) => {
                        self.shared.outbox.notify_one();
                        None
                    }
                    Ok(WriteNotice::Gap) | Err(RecvError::Lagged(_)) => {
                        self.shared.outbox.notify_one();
                        Some(true)
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = ticks.tick() => {
                    // Queued runs that started or were dropped no longer
                    // need their task kept.
                    self.shared
                        .queued
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|_, live| live.queued() > 0);
                    Some(false)
                }
                _ = shutdown.cancelled() => return,
            };
            if let Some(every) = all {
                for live in self.shared.followed(every) {
                    tokio::spawn(live.catch_up(self.shared.clone()));
                }
            }
        }
    }

    /// With a store shared by replicas, until shutdown: each time this
    /// process loses its lease ([`crate::store::Coordination::lease_losses`]), stops every
    /// run started before. Its store refuses their writes already; their
    /// tasks may be taken over by another replica once it is declared
    /// dead, and an agent told to stop does nothing more for them. Each
    /// stopped run fails its task when the store takes writes again (or
    /// the replica that takes it over does).
    pub async fn stop_runs_when_lease_lost(self) {
        let Some(mut losses) = self.shared.replicas().map(|r| r.lease_losses()) else {
            return;
        };
        let shutdown = self.shared.shutdown.clone();
        loop {
            tokio::select! {
                changed = losses.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
            let stopped = std::mem::replace(
                &mut *self.shared.runs.lock().unwrap_or_else(|e| e.into_inner()),
                shutdown.child_token(),
            );
            stopped.cancel();
            let runs: usize = self.shared.running.borrow().values().sum();
            tracing::warn!(runs, "this replica lost its lease: its runs were stopped");
        }
    }

    /// Whether this process runs the periodic job `job` now, at most once
    /// per `every` across the processes sharing the store
    /// ([`Coordination::take_turn`](crate::store::Coordination::take_turn));
    /// always, for a store of one process.
    pub async fn take_turn(&self, job: &str, every: Duration) -> Result<bool, StoreError> {
        match self.shared.replicas() {
            Some(replicas) => replicas.take_turn(job, every).await,
            None => Ok(true),
        }
    }

    /// Background upkeep until shutdown: the retention sweep every
    /// `RuntimeConfig::sweep_every`, run by one process of those sharing
    /// the store ([`crate::store::Coordination::take_turn`]); with replicas, the tasks of
    /// replicas whose lease ran out are failed, looked for every half
    /// lease by one of them.
    pub async fn run_maintenance(self) {
        let shutdown = self.shared.shutdown.clone();
        let sweep = self.shared.config.sweep_every;
        let lease = self.shared.replicas().map(|r| r.lease());
        let tick = lease.map_or(sweep, |l| sweep.min(l / 2));
        let mut ticks = tokio::time::interval(tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first retention sweep is one interval after start, not at the
        // interval's immediate first tick: a purge racing the first requests
        // would make `--retain` depend on how fast a process starts, and the
        // policy only promises a purge within one interval of expiry.
        let started = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            // Slightly less than the interval, so that one replica's tick
            // a little early does not skip a turn.
            let due = |every: Duration| every.mul_f64(0.9);
            let retention_turn = if started.elapsed() < due(sweep) {
                Ok(false)
            } else {
                self.take_turn("retention", due(sweep)).await
            };
            match retention_turn {
                Ok(true) => {
                    if let Err(e) = self.purge_expired().await {
                        tracing::warn!(error = %e, "retention sweep failed");
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
            }
            let Some(lease) = lease else { continue };
            match self.take_turn("orphans", due(lease / 2)).await {
                Ok(true) => match self.fail_orphaned_tasks().await {
                    Ok(0) => tracing::debug!("looked for orphaned tasks: none"),
                    Ok(failed) => tracing::warn!(
                        failed,
                        "failed the active tasks of replicas whose lease ran out"
                    ),
                    Err(e) => tracing::warn!(error = %e, "looking for orphaned tasks failed"),
                },
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "looking for orphaned tasks failed"),
            }
        }
    }
}
