//! Push notifications (spec §3.5.3, §4.3): webhooks a client registers on
//! a task, to which the server POSTs the task's updates.
//!
//! [`egress`] decides where a webhook may go (the SSRF guard): which URLs
//! are accepted when a config is created, and which addresses a delivery
//! may connect to once the host is resolved. [`deliver`] sends what the
//! store's outbox holds: the runtime writes each notification there in the
//! same write that commits its event; its connections write only within
//! their attempt's time (`fenced`). The parts of delivery are the private
//! modules beside it, each named for its job (`dispatcher`, `schedule`,
//! `attempt`, `hosts`, `post`, `pool`, `retry`, `role`). [`receiver`] is
//! the other end, for `a2a-lifecycle push listen` and the benchmark.

mod attempt;
pub mod deliver;
mod dispatcher;
pub mod egress;
mod fenced;
mod hosts;
mod pool;
mod post;
pub mod receiver;
mod retry;
mod role;
mod schedule;
