//! Following other replicas' writes to a live task (a store shared by
//! replicas, docs/replicas.md): watching it, catching up with what they
//! committed, and taking it in as this replica's committed copy.

use std::sync::Arc;

use super::Shared;
use super::live::LiveTask;
use super::loaded::{Loaded, Signal};
use crate::store::{CatchUp, Caught, StoreError};

impl LiveTask {
    /// The task as stored now and the events of each write after version
    /// `after` ([`Coordination::catch_up`](crate::store::Coordination::catch_up)).
    /// A store of one process keeps no events: the task whole and no
    /// events, complete only if it is still at `after` (its one writer is
    /// this process, so only a write from outside it gets here).
    pub(super) async fn stored_since(
        &self,
        shared: &Shared,
        after: u64,
    ) -> Result<Option<CatchUp>, StoreError> {
        let (tenant, id) = (&self.key.tenant, &self.key.id);
        match shared.replicas() {
            Some(replicas) => replicas.catch_up(tenant, id, after).await,
            None => Ok(shared.store.get(tenant, id).await?.map(|task| CatchUp {
                complete: task.version <= after,
                version: task.version,
                task: Caught::Whole(Box::new(task.record)),
                events: Vec::new(),
            })),
        }
    }

    /// Takes another writer's commits in (`up`): publishes their events to
    /// this replica's subscribers (or has them resynchronise when the
    /// store could not give them all), makes the stored task the committed
    /// copy ([`Loaded::take_committed`]), and stops the run here if the
    /// task ended elsewhere (a cancel on another replica).
    pub(super) async fn absorb_committed(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        loaded: &mut Loaded,
        up: CatchUp,
    ) -> Result<(), StoreError> {
        let run = self.current_run.load(std::sync::atomic::Ordering::Relaxed);
        let mut complete = up.complete;
        if complete {
            for event in up.events {
                self.publish(loaded, run, Some(event));
            }
        }
        tracing::debug!(
            task_id = %self.key.id,
            version = up.version,
            read = match &up.task {
                Caught::Whole(_) => "whole",
                Caught::Changes(_) => "changes",
            },
            "caught up with the task's writes elsewhere"
        );
        if !loaded.take_committed(up.task, up.version) {
            // Changes that do not follow from the copy held: whatever it
            // missed, the store's whole task is the truth.
            tracing::error!(task_id = %self.key.id, "a task's stored changes did not follow from the copy held; read whole");
            let stored = shared
                .store
                .get(&self.key.tenant, &self.key.id)
                .await?
                .ok_or_else(|| StoreError::NotFound(self.key.id.clone()))?;
            complete &= stored.version == up.version;
            loaded.take_committed(Caught::Whole(Box::new(stored.record)), stored.version);
        }
        if !complete
            && let Some(tx) = &loaded.events
            && tx.receiver_count() > 0
        {
            let _ = tx.send(Arc::new(Signal::Resync));
        }
        let state = loaded.committed_state();
        self.advance(|p| p.state = state);
        if state.is_terminal()
            && let Some(token) = self.runs().cancel.take()
        {
            token.cancel();
        }
        Ok(())
    }

    /// With a store shared by replicas, once this replica's run of the
    /// task has ended while something here still follows it (a stream, a
    /// waiting request): the next run may be another replica's, so the
    /// task is watched from now on, and caught up once the watch is in
    /// place (a write between the run's end and the watch is announced to
    /// nobody).
    pub(super) fn watch_if_followed(self: &Arc<Self>, shared: &Arc<Shared>) {
        use std::sync::atomic::Ordering::Relaxed;
        if shared.replicas().is_none() || self.watched.load(Relaxed) {
            return;
        }
        let followed = self.progress.receiver_count() > 0
            || self.state.try_lock().map_or(true, |g| {
                g.as_ref()
                    .and_then(|l| l.events.as_ref())
                    .is_some_and(|tx| tx.receiver_count() > 0)
            });
        if !followed {
            return;
        }
        let (live, shared) = (self.clone(), shared.clone());
        tokio::spawn(async move {
            let Some(replicas) = shared.replicas() else {
                return;
            };
            match replicas.watch(&live.key.tenant, &live.key.id, true).await {
                Ok(()) => {
                    live.watched.store(true, Relaxed);
                    live.catch_up(shared).await;
                }
                Err(e) => {
                    tracing::debug!(task_id = %live.key.id, error = %e, "could not watch a task; followed by the periodic look")
                }
            }
        });
    }

    /// Whether the cached task is older than `version` (and not being
    /// written here: a write of this replica's would see the conflict and
    /// catch up itself).
    pub(crate) fn behind(&self, version: u64) -> bool {
        match self.state.try_lock() {
            Ok(guard) => guard
                .as_ref()
                .is_some_and(|l| l.version < version && !l.flushing),
            // Busy: look again properly.
            Err(_) => true,
        }
    }

    /// Whether another replica may be changing this task while something
    /// here follows it: loaded, no run of its own going on here, and
    /// watched by a stream or a waiting request.
    pub(crate) fn followed_remotely(&self) -> bool {
        {
            let runs = self.runs();
            if runs.active {
                return false;
            }
            // Waiting for another replica's run to end (a claim refused).
            if runs.waiting() {
                return true;
            }
        }
        let Ok(guard) = self.state.try_lock() else {
            return false;
        };
        let Some(loaded) = guard.as_ref() else {
            return false;
        };
        !loaded.record.state().is_terminal()
            && (self.progress.receiver_count() > 0
                || loaded
                    .events
                    .as_ref()
                    .is_some_and(|tx| tx.receiver_count() > 0))
    }

    /// Brings the cached task up to the store after another replica wrote
    /// it ([`super::TaskManager::follow_changes`]). One at a time: asked
    /// for while one runs (a notification per write of a busy task), it
    /// only has the running one look once more when done. Concurrent
    /// catch-ups would each read the same writes from the same version,
    /// all but one for nothing, more of them the longer a read takes.
    pub(crate) async fn catch_up(self: Arc<Self>, shared: Arc<Shared>) {
        use std::sync::atomic::Ordering::AcqRel;
        if self.catching_up.fetch_add(1, AcqRel) > 0 {
            // One is running: it looks again after its read.
            return;
        }
        loop {
            let asked = self.catching_up.load(std::sync::atomic::Ordering::Acquire);
            self.catch_up_once(&shared).await;
            // Asked for again since this one began: one more look, which
            // reads from the version this one reached.
            if self
                .catching_up
                .compare_exchange(asked, 0, AcqRel, std::sync::atomic::Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }

    /// One catch-up ([`LiveTask::catch_up`]): read outside the lock, taken
    /// in only if nothing changed the cache meanwhile (else whatever did
    /// catches up, or the next look does).
    async fn catch_up_once(self: &Arc<Self>, shared: &Arc<Shared>) {
        let from = {
            let guard = self.state.lock().await;
            match guard.as_ref() {
                Some(l) if l.pending.is_empty() && !l.flushing => l.version,
                _ => return,
            }
        };
        let up = match self.stored_since(shared, from).await {
            Ok(Some(up)) if up.version > from => up,
            Ok(_) => {
                // Nothing new, but a queued run may wait for a claim
                // another replica has released since (or just taken).
                if self.runs().waiting()
                    && let Ok(mut guard) = self.lock_loaded(shared).await
                {
                    self.dispatch_locked(shared, guard.as_mut().expect("loaded"));
                }
                return;
            }
            Err(e) => {
                tracing::debug!(task_id = %self.key.id, error = %e, "catching up failed; retried at the next look");
                return;
            }
        };
        let mut guard = self.state.lock().await;
        let Some(loaded) = guard.as_mut() else { return };
        if loaded.version != from || !loaded.pending.is_empty() || loaded.flushing {
            return;
        }
        if let Err(e) = self.absorb_committed(shared, loaded, up).await {
            tracing::debug!(task_id = %self.key.id, error = %e, "catching up failed; retried at the next look");
            return;
        }
        self.dispatch_locked(shared, loaded);
    }
}
