//! One attempt at an outbox entry: its config read from the task, its
//! host's slot taken, the POST made, and what came of it recorded in the
//! outbox.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::deliver::{MAX_RETRY, Settings, count};
use super::hosts::{Gate, Hosts, host_key, lock};
use super::pool::Pool;
use super::post::{PostOutcome, Webhook, post};
use super::retry::backoff;
use super::role::Tenure;
use super::schedule::{DeliveryOutcome, now_ms};
use crate::proto::TaskPushNotificationConfig;
use crate::store::{Delivery, TaskStore};

/// One attempt at `delivery`, and what the outbox records of it; the host
/// whose slot it took and gave back, if it took one.
pub(super) async fn attempt(
    store: &dyn TaskStore,
    settings: &Settings,
    hosts: &Mutex<Hosts>,
    pool: &Pool,
    tenure: &Tenure,
    delivery: Delivery,
) -> (DeliveryOutcome, Option<Arc<str>>) {
    // The config, the version of the client that set it, and the trace of
    // the run that last wrote the task.
    let found = match store.get(&delivery.tenant, &delivery.task_id).await {
        Ok(stored) => stored.and_then(|s| {
            let protocol = s.record.push_protocol(&delivery.config_id);
            let trace = s.record.trace;
            s.record
                .push_configs
                .into_iter()
                .find(|c| c.id == delivery.config_id)
                .map(|config| (config, protocol, trace))
        }),
        Err(e) => {
            tracing::warn!(error = %e, "push delivery: task unreadable; retrying");
            return (DeliveryOutcome::StoreFailed, None);
        }
    };
    // Deleted (or the task purged): nothing more goes to it.
    let Some((config, protocol, trace)) = found else {
        count(settings, |m| m.ended("dropped"));
        return (finish(store, &delivery).await, None);
    };
    let host = host_key(&config.url);
    // Only an attempt that ends while the role is certainly held: another
    // holder must never deliver beside it (tried again after POLL_EVERY,
    // by this process if it renews the role, else by the next holder).
    if tenure.held_for(store) < settings.timeout {
        return (DeliveryOutcome::StoreFailed, None);
    }
    // Its connection writes nothing after this (a pause mid-attempt must
    // not put a stale request on the wire once another holder may exist).
    let deadline = Instant::now() + settings.timeout;
    let gate = lock(hosts).enter(&host, Instant::now());
    let (outcome, freed) = match gate {
        Gate::Full => return (DeliveryOutcome::Parked(host), None),
        // Counted as an attempt, so a dead host's backlog is given up in
        // time without a connection per notification.
        Gate::Down(left) => (
            PostOutcome::Retry {
                why: "the host did not answer lately".into(),
                after: Some(left),
            },
            None,
        ),
        Gate::Go => {
            let slot = HostSlot {
                hosts,
                host: host.clone(),
                left: false,
            };
            let start = Instant::now();
            let webhook = Webhook {
                config: &config,
                protocol,
                v0_3_body: settings.v0_3_body.is_some(),
                trace: &trace,
            };
            let outcome = post(settings, pool, &host, webhook, &delivery.event, deadline).await;
            count(settings, |m| m.attempted(start.elapsed()));
            slot.leave(&outcome);
            (outcome, Some(host))
        }
    };
    (
        record(store, settings, &delivery, &config, outcome).await,
        freed,
    )
}

/// A host slot taken by an attempt: given back with the outcome, or, if
/// the attempt unwinds, as if the host had answered.
struct HostSlot<'a> {
    hosts: &'a Mutex<Hosts>,
    host: Arc<str>,
    left: bool,
}

impl HostSlot<'_> {
    fn leave(mut self, outcome: &PostOutcome) {
        self.left = true;
        lock(self.hosts).leave(&self.host, outcome, Instant::now());
    }
}

impl Drop for HostSlot<'_> {
    fn drop(&mut self) {
        if !self.left {
            let unwound = PostOutcome::Final(String::new());
            lock(self.hosts).leave(&self.host, &unwound, Instant::now());
        }
    }
}

/// Removes a finished entry. If the store fails, the entry stays at the
/// head of its queue and is tried again (POSTed again: a duplicate) before
/// anything after it: a queue that went on past an entry still in the
/// outbox would have it sent again after the task's later events, the
/// terminal one included, by whoever delivers next (measured by the fault
/// harness: a stale WORKING after COMPLETED, after a 0.6 s cut from the
/// database).
async fn finish(store: &dyn TaskStore, delivery: &Delivery) -> DeliveryOutcome {
    match store.outbox().finish_delivery(delivery.seq).await {
        Ok(()) => DeliveryOutcome::Finished,
        Err(e) => {
            tracing::warn!(error = %e, seq = delivery.seq, "push outbox entry not removed; it is sent again before the next");
            DeliveryOutcome::StoreFailed
        }
    }
}

/// Records an attempt's outcome in the outbox (and the metrics).
async fn record(
    store: &dyn TaskStore,
    settings: &Settings,
    delivery: &Delivery,
    config: &TaskPushNotificationConfig,
    outcome: PostOutcome,
) -> DeliveryOutcome {
    let host = super::egress::parse(&config.url)
        .map(|t| t.host)
        .unwrap_or_default();
    let attempts = delivery.attempts + 1;
    let (why, after) = match outcome {
        PostOutcome::Delivered => {
            count(settings, |m| m.ended("delivered"));
            return finish(store, delivery).await;
        }
        PostOutcome::Final(why) => {
            tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, "push notification refused; not retried");
            count(settings, |m| m.ended("refused"));
            return finish(store, delivery).await;
        }
        PostOutcome::Retry { why, after } => (why, after),
        PostOutcome::Unreachable(why) => (why, None),
    };
    if attempts >= settings.max_attempts {
        tracing::warn!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, "push notification given up");
        count(settings, |m| m.ended("given_up"));
        return finish(store, delivery).await;
    }
    count(settings, |m| m.retried());
    let wait = after.unwrap_or_else(|| backoff(attempts)).min(MAX_RETRY);
    tracing::debug!(task = %delivery.task_id, config = %config.id, %host, %why, attempts, ?wait, "push notification to be retried");
    // Rounded up: a wait under a millisecond is still a wait.
    let not_before_ms = now_ms() + wait.as_micros().div_ceil(1000) as i64;
    // The schedule keeps the attempt count and the wait even when the
    // store does not take them (a restart then counts from the last ones
    // stored).
    if let Err(e) = store
        .outbox()
        .defer_delivery(delivery.seq, attempts, not_before_ms)
        .await
    {
        tracing::warn!(error = %e, seq = delivery.seq, "push outbox retry not recorded");
    }
    DeliveryOutcome::Deferred {
        attempts,
        not_before_ms,
    }
}
