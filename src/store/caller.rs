//! Who a request acts for within its tenant (spec §13.1), and what an
//! operator allows it: its quota, and the waits the quota sweep reads.

use super::TimeKey;

/// Who a request acts for within its tenant (spec §13.1): the name a task
/// it creates records as its owner and its idempotency keys are scoped to,
/// and whether it may see only the tasks it created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The principal's name; "" on a server without authentication.
    pub name: String,
    /// A `user`: only its own tasks. An `admin`, and every caller of a
    /// server without authentication, sees all of the tenant's tasks.
    pub own_tasks_only: bool,
    /// What the operator allows it (`--auth` file).
    pub quota: Quota,
}

impl Caller {
    /// The caller of a server without authentication: no name, every task.
    pub const ANONYMOUS: Caller = Caller {
        name: String::new(),
        own_tasks_only: false,
        quota: Quota::NONE,
    };

    /// The owner a read must be limited to, if any.
    pub fn owner_filter(&self) -> Option<&str> {
        self.own_tasks_only.then_some(self.name.as_str())
    }
}

/// What an operator allows one principal (`max_open_tasks`,
/// `max_input_wait` in the `--auth` file); nothing is limited by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Its tasks not yet ended (SUBMITTED, WORKING, INPUT_REQUIRED,
    /// AUTH_REQUIRED) at once, in every tenant: a message that would
    /// create one more is RESOURCE_EXHAUSTED.
    pub max_open_tasks: Option<u32>,
    /// How long one of its tasks may wait for input (INPUT_REQUIRED,
    /// AUTH_REQUIRED); past it the task fails.
    pub max_input_wait: Option<std::time::Duration>,
}

impl Quota {
    /// Nothing limited.
    pub const NONE: Quota = Quota {
        max_open_tasks: None,
        max_input_wait: None,
    };
}

/// A task waiting for input, as the quota sweep reads it
/// ([`TaskStore::waiting_before`](super::TaskStore::waiting_before)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub tenant: String,
    pub task_id: String,
    pub owner: String,
    /// Since when: its status timestamp.
    pub since: TimeKey,
}
