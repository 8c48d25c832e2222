//! The delivery role among replicas sharing a store: delivering only while
//! this process holds [`DELIVERY_ROLE`], and for how long it certainly does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::deliver::Settings;
use super::dispatcher::Dispatcher;
use crate::store::TaskStore;

pub use crate::store::DELIVERY_ROLE;

/// How long this process certainly holds [`DELIVERY_ROLE`]: from the
/// moment its last successful hold was sent, the store's lease less a
/// tenth (the database dated the hold later, and another replica takes
/// the role only a whole lease after that), and no longer than this
/// process holds its own lease
/// ([`Coordination::held_for`](crate::store::Coordination::held_for)).
pub struct Tenure {
    base: Instant,
    /// Nanoseconds after `base`; 0: not held.
    until: std::sync::atomic::AtomicU64,
    pub(super) lease: Option<Duration>,
}

impl Tenure {
    fn new(lease: Option<Duration>) -> Self {
        Tenure {
            base: Instant::now(),
            until: std::sync::atomic::AtomicU64::new(0),
            lease,
        }
    }

    /// Held for ever: a store of one process.
    pub(super) fn for_ever() -> Self {
        let tenure = Tenure::new(None);
        tenure.record_hold(Instant::now());
        tenure
    }

    /// A hold sent at `sent` succeeded.
    fn record_hold(&self, sent: Instant) {
        let until = match self.lease {
            None => u64::MAX,
            Some(lease) => {
                let end = (sent + lease - lease / 10).saturating_duration_since(self.base);
                u64::try_from(end.as_nanos()).unwrap_or(u64::MAX).max(1)
            }
        };
        self.until
            .fetch_max(until, std::sync::atomic::Ordering::AcqRel);
    }

    fn end(&self) {
        self.until.store(0, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn held_for(&self, store: &dyn TaskStore) -> Duration {
        let until = self.until.load(std::sync::atomic::Ordering::Acquire);
        let now = Instant::now().saturating_duration_since(self.base);
        let now = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        // A store of one process has no lease to lose.
        let lease_held = store
            .coordination()
            .map_or(Duration::MAX, |replicas| replicas.held_for());
        Duration::from_nanos(until.saturating_sub(now)).min(lease_held)
    }
}

/// Delivers push notifications until `shutdown` while this process holds
/// [`DELIVERY_ROLE`], so that replicas sharing a store deliver each once
/// (at least once) and in order. The role is renewed every third of the
/// store's lease; an attempt starts only if it ends (its timeout, capped
/// at half the lease) while the role is certainly held, so no two
/// processes' attempts overlap: the next holder takes the role a lease
/// after the last renewal, when this one's attempts are over. A renewal
/// that fails is tried again while the role is still held; once it is
/// lost (taken, or run out), delivery stops, waits for the attempts in
/// flight, and starts again, from the outbox's start, once the role is
/// held again. What the old holder finishes or defers after the role
/// changed hands is refused by the store (the role's epoch). A store of
/// one process has no roles ([`TaskStore::coordination`]): this process
/// delivers until `shutdown`.
pub async fn deliver_while_held(
    store: Arc<dyn TaskStore>,
    mut settings: Settings,
    signal: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let Some(replicas) = store.coordination() else {
        let dispatcher = Dispatcher::holding(
            store.clone(),
            settings,
            signal,
            Arc::new(Tenure::for_ever()),
        );
        dispatcher.run(shutdown.child_token()).await;
        return;
    };
    let lease = replicas.lease();
    let every = lease / 3;
    if settings.timeout > lease / 2 {
        tracing::info!(
            timeout = ?lease / 2,
            "push delivery attempts time out after half the replicas' lease (less than --push-timeout)"
        );
        settings.timeout = lease / 2;
    }
    loop {
        let tenure = Arc::new(Tenure::new(Some(lease)));
        loop {
            let sent = Instant::now();
            match replicas.hold(DELIVERY_ROLE).await {
                Ok(true) => {
                    tenure.record_hold(sent);
                    break;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot tell who delivers push notifications"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
        tracing::info!("delivering push notifications");
        let held = shutdown.child_token();
        let dispatcher = Dispatcher::holding(
            store.clone(),
            settings.clone(),
            signal.clone(),
            tenure.clone(),
        );
        let mut running = tokio::spawn(dispatcher.run(held.clone()));
        loop {
            tokio::select! {
                _ = &mut running => return,
                () = tokio::time::sleep(every) => {}
            }
            let sent = Instant::now();
            match replicas.hold(DELIVERY_ROLE).await {
                Ok(true) => {
                    tenure.record_hold(sent);
                    continue;
                }
                Ok(false) => tracing::info!("another replica delivers push notifications now"),
                Err(e) if !tenure.held_for(&*store).is_zero() => {
                    tracing::warn!(error = %e, "cannot renew the push delivery role; trying again");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot renew the push delivery role; stopping")
                }
            }
            break;
        }
        tenure.end();
        held.cancel();
        // The dispatcher ends once its attempts in flight have.
        let _ = running.await;
    }
}
