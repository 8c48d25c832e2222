//! Push notifications in the transactional outbox: written with the task
//! change they report, read by delivery.

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
/// sharing a store ([`TaskStore::hold`](super::TaskStore::hold)).
pub const DELIVERY_ROLE: &str = "push-delivery";
