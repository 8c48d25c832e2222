//! Push notifications (spec §3.5.3, §4.3): webhooks a client registers on
//! a task, to which the server POSTs the task's updates.
//!
//! [`egress`] decides where a webhook may go (the SSRF guard): which URLs
//! are accepted when a config is created, and which addresses a delivery
//! may connect to once the host is resolved. [`deliver`] sends what the
//! store's outbox holds: the runtime writes each notification there in the
//! same write that commits its event; its connections write only within
//! their attempt's time (`fenced`). [`receiver`] is the other end, for
//! `a2a-lifecycle push listen` and the benchmark.

pub mod deliver;
pub mod egress;
mod fenced;
pub mod receiver;
