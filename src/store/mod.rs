//! Task persistence: the [`TaskStore`] contract and its backends.
//!
//! A backend has three parts: the task store proper ([`TaskStore`]), the
//! outbox of push notifications written with the task changes they report
//! ([`Outbox`], [`TaskStore::outbox`]), and, only when several processes
//! share it, the coordination between them ([`Coordination`],
//! [`TaskStore::coordination`]): the memory and SQLite stores have none,
//! the PostgreSQL store has one.
//!
//! A store keeps [`TaskRecord`](crate::lifecycle::TaskRecord)s keyed by
//! (tenant, task id); tenants never see each other's tasks. Within a
//! tenant, a caller limited to its own tasks ([`Caller`]) is served by
//! reads that carry the owner in the key or the filter
//! ([`TaskStore::get_owned`], [`ListQuery::owner`]), never by a read
//! filtered afterwards (spec §13.1). Every stored task has a version that
//! increases by one on each write, and [`TaskStore::update`] refuses a
//! write made from a stale copy ([`StoreError::Conflict`]) instead of
//! overwriting a newer state. Listing follows spec §3.1.4: newest status
//! timestamp first, ties broken by task id, with opaque cursors
//! ([`cursor`]).
//!
//! The store knows nothing of tonic or of agents; the lifecycle rules live in
//! [`crate::lifecycle`], not here.

pub mod codec;
pub mod cursor;
pub mod memory;
pub mod postgres;
pub mod sqlite;

mod caller;
mod coordination;
mod encoded;
mod error;
mod list;
mod origin;
mod outbox;
mod owner;
mod sql;
mod task_store;

pub use caller::{Caller, Quota, Waiting};
pub use coordination::{CatchUp, Caught, Coordination, WriteNotice};
pub use cursor::Cursor;
pub use encoded::{Body, EncodedTask};
pub use error::StoreError;
pub(crate) use list::fitting;
pub use list::{
    DEFAULT_PAGE_SIZE, ListQuery, MAX_PAGE_BYTES, MAX_PAGE_SIZE, TaskPage, TimeKey, status_key,
    time_key,
};
pub use memory::MemoryStore;
pub use origin::{OriginState, origin_key, origin_message_id, origin_of};
pub use outbox::{DELIVERY_ROLE, Delivery, Outbox, OutboxEntry};
pub use owner::{Owner, OwnerFilter};
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
pub use task_store::{StoredTask, TaskRead, TaskStore};
