//! Push notifications in the transactional outbox: written with the task
//! change they report, read by delivery through [`Outbox`].

use async_trait::async_trait;

use super::StoreError;

/// A push notification to send, written with the task change it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The task's config it goes to.
    pub config_id: String,
    /// The event: an encoded `StreamResponse`.
    pub event: Vec<u8>,
}

/// A push notification waiting in the outbox, as delivery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Outbox order: increasing in commit order, across all tasks.
    pub seq: u64,
    pub tenant: String,
    pub task_id: String,
    /// The principal that owns the task ("" for none): whose share of
    /// delivery's slots and backlog the notification uses.
    pub owner: String,
    pub config_id: String,
    pub event: Vec<u8>,
    /// Attempts made so far.
    pub attempts: u32,
    /// Not to be tried before this time (Unix milliseconds).
    pub not_before_ms: i64,
}

/// The role of the one process delivering push notifications among those
/// sharing a store ([`Coordination::hold`](super::Coordination::hold)).
pub const DELIVERY_ROLE: &str = "push-delivery";

/// A store's outbox as delivery reads it ([`TaskStore::outbox`](super::TaskStore::outbox)):
/// its entries are written with the task changes they report
/// ([`EncodedTask::outbox`](super::EncodedTask::outbox)), and leave it
/// when delivered or given up. Among replicas sharing a store, the
/// process holding [`DELIVERY_ROLE`] reads it; finishing and deferring
/// entries do nothing once the role has changed hands.
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Up to `limit` outbox entries with a `seq` above `after_seq`, in
    /// `seq` (commit) order, due or not: delivery reads the outbox once,
    /// from where it left off.
    async fn pending(&self, after_seq: u64, limit: usize) -> Result<Vec<Delivery>, StoreError>;

    /// Removes an outbox entry: delivered, or given up.
    async fn finish_delivery(&self, seq: u64) -> Result<(), StoreError>;

    /// Records a failed attempt: `attempts` made, next not before
    /// `not_before_ms`.
    async fn defer_delivery(
        &self,
        seq: u64,
        attempts: u32,
        not_before_ms: i64,
    ) -> Result<(), StoreError>;
}
