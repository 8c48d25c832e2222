//! The lifecycle core: the pure rules of the A2A task lifecycle.
//!
//! This module owns which states exist and how they are classified
//! ([`state`]), how states are named on the wire ([`names`]), which
//! transitions are allowed ([`transition`]), how events change a task's
//! status, history and artifacts ([`apply`]), how those changes are logged
//! and replayed ([`change`]), the log of a task's state transitions
//! ([`transitions`]) and how much history a reader sees ([`history`]).
//!
//! It performs no I/O and knows nothing of tonic or of storage, so every
//! backend and the service share one set of rules and the rules can be tested
//! alone.

pub mod apply;
pub mod change;
pub mod history;
pub mod names;
pub mod state;
pub mod transition;
pub mod transitions;

pub use apply::{
    ApplyError, ArtifactUpdate, MAX_PUSH_CONFIGS, Protocol, PushConfigChange, StatusUpdate,
    TaskEvent, TaskRecord,
};
pub use change::{Change, Changes, PushConfigList, ReplayError};
pub use history::{HistoryLength, HistoryLengthError};
pub use names::{StateNameError, parse_state_name, state_name, v03_state_name};
pub use state::{StateClass, StateError, classify, state_from_i32};
pub use transition::{TransitionError, TransitionPolicy};
pub use transitions::{Cause, MAX_TRANSITIONS, TRANSITIONS_EXTENSION, Transition};
