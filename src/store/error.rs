//! What a store's operations fail with.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("task {0:?} already exists")]
    AlreadyExists(String),
    /// A task created by the same message (tenant, message_id) exists:
    /// the create was a repeat (issue "idempotent sends").
    #[error("message already created task {task_id:?}")]
    DuplicateMessage { task_id: String },
    #[error("task {0:?} not found")]
    NotFound(String),
    #[error("task {id:?} changed since it was read (version {expected}, now {actual})")]
    Conflict {
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error("task store unavailable: {0}")]
    Unavailable(String),
    #[error("task store failure: {0}")]
    Internal(String),
}
