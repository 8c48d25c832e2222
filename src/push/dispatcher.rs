//! The dispatcher: the loop that reads the outbox into the schedule,
//! starts an attempt at every due queue head, and hears attempts end.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::attempt::attempt;
use super::deliver::{MAX_LOADED, POLL_EVERY, READ_BATCH, Settings, count};
use super::hosts::Hosts;
use super::pool::Pool;
use super::role::Tenure;
use super::schedule::{DeliveryOutcome, Ended, Schedule, now_ms, queue_of};
use crate::store::TaskStore;

/// Delivers the store's outbox until shut down.
pub struct Dispatcher {
    store: Arc<dyn TaskStore>,
    settings: Arc<Settings>,
    /// Raised when a commit added to the outbox.
    signal: Arc<Notify>,
    /// How long this process certainly holds
    /// [`DELIVERY_ROLE`](crate::store::DELIVERY_ROLE): an attempt starts
    /// only if it would end within it.
    tenure: Arc<Tenure>,
    hosts: Arc<Mutex<Hosts>>,
    pool: Arc<Pool>,
}

impl Dispatcher {
    pub fn new(store: Arc<dyn TaskStore>, settings: Settings, signal: Arc<Notify>) -> Self {
        Self::holding(store, settings, signal, Arc::new(Tenure::for_ever()))
    }

    /// A dispatcher that delivers while `tenure` lasts.
    pub(super) fn holding(
        store: Arc<dyn TaskStore>,
        settings: Settings,
        signal: Arc<Notify>,
        tenure: Arc<Tenure>,
    ) -> Self {
        Dispatcher {
            store,
            settings: Arc::new(settings),
            signal,
            tenure,
            hosts: Default::default(),
            pool: Default::default(),
        }
    }

    /// Runs until `shutdown`: reads what was committed to the outbox since
    /// the last read (on a signal, each [`POLL_EVERY`], or at once while
    /// reads come back full), starts an attempt at every due queue head
    /// while slots are free, and hears attempts end. At shutdown it stops
    /// starting attempts; those in flight end with the runtime, and what
    /// they did not finish stays in the outbox for the next start.
    pub async fn run(self, shutdown: CancellationToken) {
        let attempts = tokio_util::task::TaskTracker::new();
        let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel::<Ended>();
        let mut schedule = Schedule::default();
        let mut read = true;
        // A steady tick, not a sleep restarted each turn: under load the
        // loop never idles for a whole POLL_EVERY.
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if read && schedule.can_read() {
                read = false;
                let limit = READ_BATCH.min(MAX_LOADED - schedule.loaded);
                match self
                    .store
                    .outbox()
                    .pending(schedule.read_up_to, limit)
                    .await
                {
                    Ok(batch) => {
                        read = batch.len() == limit;
                        let now = now_ms();
                        for delivery in batch {
                            schedule.add(delivery, now);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "push outbox unreadable; retrying"),
                }
            }
            let shed = schedule.shed();
            if !shed.is_empty() {
                tracing::warn!(
                    entries = shed.len(),
                    "push backlog full: gave up the newest notifications of the principals over their share"
                );
                read = true;
                let store = self.store.clone();
                let settings = self.settings.clone();
                attempts.spawn(async move {
                    for delivery in shed {
                        count(&settings, |m| m.ended("shed"));
                        if let Err(e) = store.outbox().finish_delivery(delivery.seq).await {
                            tracing::warn!(error = %e, "a shed push notification stays in the outbox");
                        }
                    }
                });
            }
            let next_timer = schedule.wake(now_ms());
            while let Some(delivery) = schedule.start_next() {
                let (store, settings, hosts, pool, ended, tenure) = (
                    self.store.clone(),
                    self.settings.clone(),
                    self.hosts.clone(),
                    self.pool.clone(),
                    ended_tx.clone(),
                    self.tenure.clone(),
                );
                attempts.spawn(async move {
                    use futures_util::FutureExt as _;
                    let key = queue_of(&delivery);
                    let attempt = attempt(&*store, &settings, &hosts, &pool, &tenure, delivery);
                    // A panic must not leave the queue in flight for good
                    // (the host's slot is given back by its guard).
                    let (done, freed) = std::panic::AssertUnwindSafe(attempt)
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|_| {
                            tracing::error!("push delivery attempt panicked; retrying");
                            (DeliveryOutcome::StoreFailed, None)
                        });
                    let _ = ended.send(Ended { key, done, freed });
                });
            }
            if let Some(metrics) = &self.settings.metrics {
                metrics.pending(schedule.loaded);
            }
            // Read on at once while reads come back full and there is room;
            // at the limit, only when deliveries have finished some.
            if read && schedule.can_read() {
                continue;
            }
            let wait = next_timer.unwrap_or(POLL_EVERY);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.signal.notified() => read = true,
                Some(ended) = ended_rx.recv() => {
                    let now = now_ms();
                    // An attempt that took no slot (its config gone, the
                    // store failing, its host down) lets no parked queue
                    // go by itself; then every host with room does.
                    let mut slotless = false;
                    for ended in std::iter::once(ended).chain(std::iter::from_fn(|| ended_rx.try_recv().ok())) {
                        slotless |= ended.freed.is_none() && !matches!(ended.done, DeliveryOutcome::Parked(_));
                        schedule.ended(ended, &self.hosts, now);
                    }
                    if slotless {
                        schedule.unpark_all(&self.hosts);
                    }
                }
                () = tokio::time::sleep(wait) => {}
                _ = tick.tick() => {
                    read = true;
                    schedule.unpark_all(&self.hosts);
                    self.pool.sweep();
                }
            }
        }
        attempts.close();
        // Among replicas, the attempts in flight end within their timeout
        // before the role is given up: the next holder must not deliver
        // beside them. (Alone, they end with the runtime.)
        if self.tenure.lease.is_some()
            && tokio::time::timeout(self.settings.timeout * 2, attempts.wait())
                .await
                .is_err()
        {
            tracing::warn!("push delivery attempts still in flight after twice their timeout");
        }
        // What is left is no longer this process's to deliver.
        if let Some(metrics) = &self.settings.metrics {
            metrics.pending(0);
        }
    }
}
