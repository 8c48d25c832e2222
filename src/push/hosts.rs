//! Webhook hosts: the attempts in flight to each (at most
//! [`MAX_IN_FLIGHT_PER_HOST`]), and the hosts left alone for a while after
//! they did not answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::deliver::{MAX_IN_FLIGHT_PER_HOST, MAX_RETRY};
use super::post::PostOutcome;
use super::retry::backoff;

/// Down hosts remembered; past this, those back up are forgotten.
const MAX_DOWN_HOSTS: usize = 100_000;

/// Attempts in flight per webhook host, and which hosts are down; shared
/// with the attempts, which take a host's slot once they know its URL.
#[derive(Default)]
pub(super) struct Hosts {
    per_host: HashMap<Arc<str>, usize>,
    /// Hosts that did not answer: consecutive failures, and until when no
    /// connection is tried.
    down: HashMap<Arc<str>, (u32, Instant)>,
}

/// Whether an attempt at a host may go ahead.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Gate {
    Go,
    /// [`MAX_IN_FLIGHT_PER_HOST`] attempts are in flight to it.
    Full,
    /// It failed to answer lately; tried again after this long.
    Down(Duration),
}

impl Hosts {
    pub(super) fn is_full(&self, host: &str) -> bool {
        self.in_use(host) >= MAX_IN_FLIGHT_PER_HOST
    }

    /// Slots of `host` taken.
    pub(super) fn in_use(&self, host: &str) -> usize {
        self.per_host.get(host).copied().unwrap_or(0)
    }

    /// Takes one of `host`'s slots, if it is up and has one free.
    pub(super) fn enter(&mut self, host: &Arc<str>, now: Instant) -> Gate {
        if let Some(&(_, until)) = self.down.get(host)
            && until > now
        {
            return Gate::Down(until - now);
        }
        let n = self.per_host.entry(host.clone()).or_default();
        if *n >= MAX_IN_FLIGHT_PER_HOST {
            return Gate::Full;
        }
        *n += 1;
        Gate::Go
    }

    /// Gives the slot back. A host that did not answer is down for
    /// [`backoff`] of its consecutive failures (counted once per down
    /// period, however many attempts were in flight); any answer brings
    /// it back up.
    pub(super) fn leave(&mut self, host: &Arc<str>, outcome: &PostOutcome, now: Instant) {
        if let Some(n) = self.per_host.get_mut(host) {
            *n -= 1;
            if *n == 0 {
                self.per_host.remove(host);
            }
        }
        if !matches!(outcome, PostOutcome::Unreachable(_)) {
            self.down.remove(host);
            return;
        }
        if self.down.len() >= MAX_DOWN_HOSTS {
            self.down.retain(|_, (_, until)| *until > now);
        }
        let (failures, until) = self.down.entry(host.clone()).or_insert((0, now));
        if *until <= now {
            // Failures long ago do not make a new one count double.
            if now.duration_since(*until) > MAX_RETRY {
                *failures = 0;
            }
            *failures += 1;
            *until = now + backoff(*failures);
        }
    }
}

pub(super) fn lock(hosts: &Mutex<Hosts>) -> std::sync::MutexGuard<'_, Hosts> {
    hosts.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`MAX_IN_FLIGHT_PER_HOST`] counts by: `scheme://host:port`.
pub(super) fn host_key(url: &str) -> Arc<str> {
    match super::egress::parse(url) {
        Ok(t) => format!(
            "{}://{}:{}",
            if t.https { "https" } else { "http" },
            t.host,
            t.port
        )
        .into(),
        Err(_) => url.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::deliver::FIRST_RETRY;

    #[test]
    fn a_host_that_does_not_answer_is_down_for_a_growing_while() {
        let mut hosts = Hosts::default();
        let host: Arc<str> = "http://dead:80".into();
        let now = Instant::now();
        let unreachable = PostOutcome::Unreachable("connect: refused".into());
        assert_eq!(hosts.enter(&host, now), Gate::Go);
        assert_eq!(hosts.enter(&host, now), Gate::Go);
        hosts.leave(&host, &unreachable, now);
        // The second failure of the same burst does not extend it.
        hosts.leave(&host, &unreachable, now);
        let Gate::Down(first) = hosts.enter(&host, now) else {
            panic!("down after failing")
        };
        assert!(first <= FIRST_RETRY, "{first:?}");
        // After it, an attempt goes; failing again doubles the wait.
        let later = now + first;
        assert_eq!(hosts.enter(&host, later), Gate::Go);
        hosts.leave(&host, &unreachable, later);
        let Gate::Down(second) = hosts.enter(&host, later) else {
            panic!("down again")
        };
        assert!(
            second >= FIRST_RETRY && second <= 2 * FIRST_RETRY,
            "{second:?}"
        );
        // Any answer, even a refusal, brings it back.
        let after = later + second;
        assert_eq!(hosts.enter(&host, after), Gate::Go);
        hosts.leave(&host, &PostOutcome::Final("answered 404".into()), after);
        assert_eq!(hosts.enter(&host, after), Gate::Go);
        assert!(!hosts.is_full(&host));
    }
}
