//! Idempotency keys (spec §3.3.1): the key of a new task's creating
//! message, per owner, and what claiming one found.

use crate::lifecycle::TaskRecord;

use super::{Owner, StoredTask};

/// The idempotency key of a new task (spec §3.3.1), per principal so that
/// one cannot learn or replay another's message ids. For a task without
/// an owner (every task created before owners were recorded) it is the
/// message id's bytes, as it always was. An owned task's key starts with
/// the byte 0xFF, which no UTF-8 text holds, so it never equals an
/// unowned key whatever the message id; then the owner, length-prefixed so
/// that no two (owner, message id) pairs share a key, then the message id.
pub fn origin_key(owner: &str, message_id: &str) -> Vec<u8> {
    if !Owner::can_own(owner) {
        return message_id.as_bytes().to_vec();
    }
    let mut key = Vec::with_capacity(1 + 4 + owner.len() + message_id.len());
    key.push(OWNED_ORIGIN);
    key.extend_from_slice(format!("{}:", owner.len()).as_bytes());
    key.extend_from_slice(owner.as_bytes());
    key.extend_from_slice(message_id.as_bytes());
    key
}

/// The first byte of an owned task's idempotency key: never in UTF-8.
const OWNED_ORIGIN: u8 = 0xFF;

/// The id of the message that created a task: the first of its history
/// (see [`TaskRecord::submitted`]).
pub fn origin_message_id(record: &TaskRecord) -> &str {
    record
        .task
        .history
        .first()
        .map(|m| m.message_id.as_str())
        .unwrap_or("")
}

/// A task's idempotency key ([`origin_key`]); empty when it has no
/// creating message.
pub fn origin_of(record: &TaskRecord) -> Vec<u8> {
    match origin_message_id(record) {
        "" => Vec::new(),
        message_id => origin_key(&record.owner, message_id),
    }
}

/// What claiming a new message's idempotency key found (spec §3.3.1;
/// [`Coordination::claim_origin`](super::Coordination::claim_origin)).
#[derive(Debug, Clone, PartialEq)]
pub enum OriginState {
    /// Nobody has answered the message or is answering it: the caller runs
    /// it, and releases the claim
    /// ([`Coordination::release_origin`](super::Coordination::release_origin)) if
    /// the run creates no task.
    First,
    /// The message already created this task.
    Task(Box<StoredTask>),
    /// Another replica is answering the message now: ask again shortly.
    Elsewhere,
    /// A run of the message ended without its task stored: on a replica
    /// declared dead, or on this one (a create the store refused). Whether
    /// its agent acted on the message is not known. The caller holds the
    /// claim now, and must not run the message again (an agent's run for
    /// a message id happens at most once); it records the message's task
    /// as FAILED instead. Only a store shared by replicas answers this.
    Lost,
}
