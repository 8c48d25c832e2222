//! Delivering the outbox, its settings and limits: each queued notification
//! is POSTed to its config's webhook, in commit order per config, retried
//! until it is taken or given up.
//!
//! - The store's outbox is read once, in commit order, from where the last
//!   read ended ([`Outbox::pending`](crate::store::Outbox::pending));
//!   the [`Dispatcher`] keeps what it read as one queue per (tenant, task,
//!   config), at most [`MAX_LOADED`] entries and [`MAX_LOADED_BYTES`]. Only a queue's head is ever in
//!   flight, so a config sees its events in commit order (the terminal one
//!   last), and the queues run side by side, so one slow or dead webhook
//!   does not delay another's: at most [`MAX_IN_FLIGHT`] POSTs at once, of
//!   which at most [`MAX_IN_FLIGHT_PER_HOST`] to one webhook host however
//!   many tasks name it; a queue waiting for its host, or for a retry,
//!   holds no slot. (A backlog past [`MAX_LOADED`] for dead webhooks does
//!   hold up newer notifications until it is given up.)
//! - A 2xx answer finishes an entry. Connection errors, timeouts
//!   ([`Settings::timeout`]) and 408, 429 or 5xx answers are retried with
//!   exponential backoff and jitter ([`FIRST_RETRY`] doubling to
//!   [`MAX_RETRY`]), honouring `Retry-After`; after
//!   [`Settings::max_attempts`] the entry is given up and logged. Any other
//!   answer is final. Redirects are not followed. A host that does not
//!   answer is left alone for a doubling while, its notifications' attempts
//!   counted as failed meanwhile.
//! - The config is read from the task at each attempt: a deleted config (or
//!   a purged task) gets nothing more.
//! - Connections go only to addresses [`Egress`] permits, resolved for
//!   each new connection; connections are kept alive per host
//!   ([`IDLE_CONNECTION`]). Credentials and tokens are never logged.
//!
//! This file holds what the parts share: the limits, [`Settings`], and the
//! entry points. The parts, each in its file beside it: `dispatcher` (the
//! loop), `schedule` (the queues and shares), `attempt` (one attempt and
//! what the outbox records of it), `hosts` (per-host slots and down
//! hosts), `post` (the HTTP POST), `pool` (kept-alive connections),
//! `retry` (the waits before a retry) and `role` (delivering only while
//! this replica holds the role).

use std::time::Duration;

use super::egress::Egress;
use crate::proto::StreamResponse;

pub use super::dispatcher::Dispatcher;
pub use super::role::{DELIVERY_ROLE, Tenure, deliver_while_held};

/// Default time one POST may take, connection included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default attempts at one notification before it is given up.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// The wait before the first retry; each further one doubles it...
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// ... up to this (also the longest `Retry-After` honoured).
pub const MAX_RETRY: Duration = Duration::from_secs(300);
/// Outbox entries read per store call.
pub const READ_BATCH: usize = 1024;
/// Outbox entries held in memory at once (the queues' backlog); past this,
/// or past [`MAX_LOADED_BYTES`] of events, reading waits until deliveries
/// finish some.
pub const MAX_LOADED: usize = 65_536;
/// Event bytes held in memory at once.
pub const MAX_LOADED_BYTES: usize = 64 * 1024 * 1024;
/// POSTs in flight at once, over all webhooks.
pub const MAX_IN_FLIGHT: usize = 512;
/// POSTs in flight at once to one webhook host (`scheme://host:port`): a
/// slow or dead host holds at most this many of [`MAX_IN_FLIGHT`].
pub const MAX_IN_FLIGHT_PER_HOST: usize = 16;
/// POSTs in flight at once for the tasks of one principal (tenant and
/// owner): one whose webhooks are slow or dead, under however many host
/// names, holds at most this many of [`MAX_IN_FLIGHT`], and the others'
/// notifications go on.
pub const MAX_IN_FLIGHT_PER_PRINCIPAL: usize = 64;
/// Entries of one principal held while the backlog is full
/// ([`MAX_LOADED`]): past it, that principal's newest entries are given
/// up (counted as `shed`), so reading the outbox goes on for the others.
pub const MAX_LOADED_PER_PRINCIPAL: usize = MAX_LOADED / 8;
/// How long an idle connection to a webhook is kept for the next POST.
pub const IDLE_CONNECTION: Duration = Duration::from_secs(30);
/// The longest answer body read (and dropped) to keep a connection.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// How often the outbox is read without a signal (a safety net: commits
/// raise one), parked queues are looked at and idle connections closed;
/// also the wait after a store error.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// The media type of a notification's body (spec §4.3).
pub const CONTENT_TYPE: &str = "application/a2a+json";
/// A 0.3 notification's: 0.3 predates the A2A media type.
pub const CONTENT_TYPE_V0_3: &str = "application/json";
/// The header carrying the config's token.
pub const TOKEN_HEADER: &str = "x-a2a-notification-token";

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct Settings {
    pub egress: Egress,
    /// `--push-timeout`.
    pub timeout: Duration,
    /// `--push-max-attempts`.
    pub max_attempts: u32,
    /// Where outcomes, retries and the outbox backlog are counted (the
    /// server fills it in from its runtime's metrics when it is `None`).
    pub metrics: Option<crate::metrics::PushMetrics>,
    /// How the body for a protocol 0.3 client's webhook is written from
    /// its outbox event (the server sets `service::v0_3`'s, which owns the
    /// 0.3 shapes); `None`: such a webhook gets the 1.0 body.
    pub v0_3_body: Option<BodyWriter>,
}

/// Writes a notification's body from its event.
pub type BodyWriter = fn(StreamResponse) -> Result<String, String>;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            egress: Egress::default(),
            timeout: DEFAULT_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            metrics: None,
            v0_3_body: None,
        }
    }
}

/// Records in the push metrics, when there are any.
pub(super) fn count(settings: &Settings, record: impl FnOnce(&crate::metrics::PushMetrics)) {
    if let Some(metrics) = &settings.metrics {
        record(metrics);
    }
}
