//! Idempotent new messages (spec §3.3.1): the first request for a
//! (tenant, caller, message_id) claims it here and in the store, and its
//! concurrent repeats wait for that request's answer, so the agent runs
//! once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::{Shared, TaskManager, store_error};
use crate::error::A2aError;
use crate::proto::Message;
use crate::store::{Caller, OriginState as StoreClaim};

/// Repeats waiting on the first request for (tenant, message_id).
pub(super) type OriginWaiters =
    HashMap<(String, Vec<u8>), Vec<oneshot::Sender<OriginOutcome>>, foldhash::fast::RandomState>;

/// How a new message was answered, for its concurrent repeats.
#[derive(Clone)]
pub(crate) enum OriginOutcome {
    /// It created (or had created) this task.
    Task(String),
    /// A direct reply, no task.
    Message(Message),
    Failed(A2aError),
}

/// The first request for a new (tenant, message_id) holds this until the
/// message is answered. Dropped unanswered (the run ended without an
/// answer), its waiters are released to try again.
pub(crate) struct MessageClaim {
    shared: Arc<Shared>,
    key: Option<(String, Vec<u8>)>,
    /// The claim made in the store ([`crate::store::Coordination::claim_origin`]), released
    /// there unless the message created a task.
    stored: Option<StoredClaim>,
}

/// What claiming a new message in the store came to.
pub(super) enum ClaimedInStore {
    /// This request runs it.
    Run(MessageClaim),
    /// A run of it ended without its task stored (its replica declared
    /// dead, or the store refusing the create): this request records its
    /// task as FAILED without running it ([`run::record_lost`]).
    Lost(MessageClaim),
    /// It already created this task.
    Task(String),
}

/// A new message's claim in the store.
struct StoredClaim {
    tenant: String,
    owner: String,
    message_id: String,
}

/// First wait before asking again for a message another replica answers.
pub const ORIGIN_RETRY_FIRST: Duration = Duration::from_millis(10);
/// Longest wait between those asks.
pub const ORIGIN_RETRY_MAX: Duration = Duration::from_millis(250);
/// How long a repeat waits for another replica's answer to the same
/// message before it is told UNAVAILABLE.
pub const MAX_ORIGIN_WAIT: Duration = Duration::from_secs(30);

impl MessageClaim {
    pub(crate) fn resolve(mut self, outcome: OriginOutcome) {
        // Only a direct reply gives the claim in the store back (the
        // message may run again). A task keeps it. So does a run whose
        // task was not stored: its agent may have acted on the message,
        // and a repeat, here or on another replica, then records the task
        // as lost instead of running the agent twice (`MessageClaim::Lost`).
        if !matches!(outcome, OriginOutcome::Message(_)) {
            self.stored = None;
        }
        for waiter in self.release() {
            let _ = waiter.send(outcome.clone());
        }
    }

    fn release(&mut self) -> Vec<oneshot::Sender<OriginOutcome>> {
        let Some(key) = self.key.take() else {
            return Vec::new();
        };
        let mut origins = self
            .shared
            .origins
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        origins.remove(&key).unwrap_or_default()
    }
}

impl Drop for MessageClaim {
    fn drop(&mut self) {
        // Waiters see their sender dropped and start over.
        drop(self.release());
        // A direct reply, or no run came of the claim: the message may
        // run again, here or on another replica.
        if let Some(claim) = self.stored.take() {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let StoredClaim {
                    tenant,
                    owner,
                    message_id,
                } = claim;
                // Only a claim made through the store's coordination is
                // stored (`claim_in_store`).
                let Some(replicas) = shared.replicas() else {
                    return;
                };
                if let Err(e) = replicas.release_origin(&tenant, &owner, &message_id).await {
                    tracing::warn!(error = %e, "could not release a message's claim");
                }
            });
        }
    }
}

pub(super) enum FirstOrRepeat {
    First(MessageClaim),
    Repeat(oneshot::Receiver<OriginOutcome>),
}

impl Shared {
    /// Claims a new message for this request, or joins the request that
    /// claimed it first.
    pub(super) fn claim_origin(self: &Arc<Self>, tenant: &str, origin: Vec<u8>) -> FirstOrRepeat {
        let key = (tenant.to_owned(), origin);
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(waiters) = origins.get_mut(&key) {
            let (tx, rx) = oneshot::channel();
            waiters.push(tx);
            return FirstOrRepeat::Repeat(rx);
        }
        origins.insert(key.clone(), Vec::new());
        FirstOrRepeat::First(MessageClaim {
            shared: self.clone(),
            key: Some(key),
            stored: None,
        })
    }
}

impl TaskManager {
    /// Claims a new message in the store, after this process's own claim.
    /// While another replica answers it (a store shared by replicas) this
    /// waits, and gives up after [`MAX_ORIGIN_WAIT`].
    pub(super) async fn claim_in_store(
        &self,
        tenant: &str,
        caller: &Caller,
        message_id: &str,
        mut claim: MessageClaim,
    ) -> Result<ClaimedInStore, A2aError> {
        let replicas = self.shared.replicas();
        let started = tokio::time::Instant::now();
        let mut delay = ORIGIN_RETRY_FIRST;
        loop {
            let found = match replicas {
                Some(replicas) => {
                    replicas
                        .claim_origin(tenant, &caller.name, message_id)
                        .await
                }
                // A store of one process: the claim in memory is the only
                // one, so the store is only asked for the task.
                None => self
                    .shared
                    .store
                    .find_by_origin(tenant, &caller.name, message_id)
                    .await
                    .map(|found| match found {
                        Some(task) => StoreClaim::Task(Box::new(task)),
                        None => StoreClaim::First,
                    }),
            };
            match found.map_err(store_error)? {
                first @ (StoreClaim::First | StoreClaim::Lost) => {
                    // Only a store shared by replicas holds claims to
                    // release; the others' answer was a lookup.
                    if replicas.is_some() {
                        claim.stored = Some(StoredClaim {
                            tenant: tenant.to_owned(),
                            owner: caller.name.clone(),
                            message_id: message_id.to_owned(),
                        });
                    }
                    return Ok(match first {
                        StoreClaim::Lost => ClaimedInStore::Lost(claim),
                        _ => ClaimedInStore::Run(claim),
                    });
                }
                StoreClaim::Task(stored) => {
                    let id = stored.record.task.id.clone();
                    claim.resolve(OriginOutcome::Task(id.clone()));
                    return Ok(ClaimedInStore::Task(id));
                }
                StoreClaim::Elsewhere if started.elapsed() >= MAX_ORIGIN_WAIT => {
                    return Err(A2aError::Unavailable(format!(
                        "message {message_id:?} is being answered by another replica; \
                         send it again to get its task"
                    )));
                }
                StoreClaim::Elsewhere => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(ORIGIN_RETRY_MAX);
                }
            }
        }
    }
}
